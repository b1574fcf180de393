//! `Status` error bodies as the apiserver writes them, and [`ApiError`], the error the stores and write
//! handlers return (turned into a `Status` response by [`ApiError::response`]).

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// A `Status` error response: `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
/// "message":…,"reason":…,"code":…}` with the same HTTP status code.
pub(crate) fn status(code: u16, reason: &str, message: impl Into<String>) -> Response {
    ApiError::new(code, reason, message).response()
}

/// A JSON body with `Content-Type: application/json`.
pub(crate) fn json_response(code: StatusCode, body: &Value) -> Response {
    (code, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

/// A 400 `Status` with reason `BadRequest`.
pub(crate) fn bad_request(message: impl Into<String>) -> Response {
    status(400, "BadRequest", message)
}

/// A failed API request: HTTP code, `Status.reason`, message and optional `Status.details`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ApiError {
    /// HTTP status code, also written as `Status.code`, e.g. `409`.
    pub code: u16,
    /// `Status.reason`, e.g. `"Conflict"`.
    pub reason: String,
    /// `Status.message`, human-readable.
    pub message: String,
    /// `Status.details` (`name`, `kind`, `causes`), if any.
    pub details: Option<Value>,
}

impl ApiError {
    /// An error without details.
    pub(crate) fn new(code: u16, reason: &str, message: impl Into<String>) -> ApiError {
        ApiError { code, reason: reason.to_string(), message: message.into(), details: None }
    }

    /// 400 `BadRequest`.
    pub(crate) fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "BadRequest", message)
    }

    /// 404 `NotFound`: `{resource} "{name}" not found`, e.g. resource `services`.
    pub(crate) fn not_found(resource: &str, name: &str) -> ApiError {
        let mut e = ApiError::new(404, "NotFound", format!("{resource} \"{name}\" not found"));
        e.details = Some(json!({ "name": name, "kind": resource }));
        e
    }

    /// 409 `AlreadyExists`: `{resource} "{name}" already exists`.
    pub(crate) fn already_exists(resource: &str, name: &str) -> ApiError {
        let mut e = ApiError::new(409, "AlreadyExists", format!("{resource} \"{name}\" already exists"));
        e.details = Some(json!({ "name": name, "kind": resource }));
        e
    }

    /// 409 `Conflict`: `Operation cannot be fulfilled on {resource} "{name}": {why}`.
    pub(crate) fn conflict(resource: &str, name: &str, why: &str) -> ApiError {
        let mut e =
            ApiError::new(409, "Conflict", format!("Operation cannot be fulfilled on {resource} \"{name}\": {why}"));
        e.details = Some(json!({ "name": name, "kind": resource }));
        e
    }

    /// The 409 for a stale `metadata.resourceVersion`.
    pub(crate) fn stale(resource: &str, name: &str) -> ApiError {
        ApiError::conflict(
            resource,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 422 `Invalid` with one cause: `{Kind} "{name}" is invalid: {field}: {detail}`. `cause` is the
    /// cause's reason, e.g. `FieldValueForbidden` or `FieldValueRequired`.
    pub(crate) fn invalid(kind: &str, name: &str, field: &str, cause: &str, detail: &str) -> ApiError {
        let mut e = ApiError::new(422, "Invalid", format!("{kind} \"{name}\" is invalid: {field}: {detail}"));
        e.details = Some(json!({
            "name": name, "kind": kind,
            "causes": [{ "reason": cause, "message": detail, "field": field }],
        }));
        e
    }

    /// The `Status` response with this error's HTTP code.
    pub(crate) fn response(&self) -> Response {
        let mut body = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": self.message, "reason": self.reason, "code": self.code,
        });
        if let Some(d) = &self.details {
            body["details"] = d.clone();
        }
        json_response(StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), &body)
    }
}
