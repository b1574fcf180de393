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

    /// 404 `NotFound`: `{resource} "{name}" not found`. `resource` is the plural, qualified by its group
    /// outside the core API (`services`, `endpointslices.discovery.k8s.io`); see [`details`].
    pub(crate) fn not_found(resource: &str, name: &str) -> ApiError {
        let mut e = ApiError::new(404, "NotFound", format!("{resource} \"{name}\" not found"));
        e.details = Some(details(resource, name));
        e
    }

    /// 409 `AlreadyExists`: `{resource} "{name}" already exists` (`resource` as for [`ApiError::not_found`]).
    pub(crate) fn already_exists(resource: &str, name: &str) -> ApiError {
        let mut e = ApiError::new(409, "AlreadyExists", format!("{resource} \"{name}\" already exists"));
        e.details = Some(details(resource, name));
        e
    }

    /// 409 `Conflict`: `Operation cannot be fulfilled on {resource} "{name}": {why}` (`resource` as for
    /// [`ApiError::not_found`]).
    pub(crate) fn conflict(resource: &str, name: &str, why: &str) -> ApiError {
        let mut e =
            ApiError::new(409, "Conflict", format!("Operation cannot be fulfilled on {resource} \"{name}\": {why}"));
        e.details = Some(details(resource, name));
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

    /// 422 `Invalid` with one cause: `{Kind} "{name}" is invalid: {field}: {detail}`. `kind` is qualified
    /// by its group outside the core API (`Service`, `EndpointSlice.discovery.k8s.io`); `cause` is the
    /// cause's reason, e.g. `FieldValueForbidden` or `FieldValueRequired`.
    pub(crate) fn invalid(kind: &str, name: &str, field: &str, cause: &str, detail: &str) -> ApiError {
        let mut e = ApiError::new(422, "Invalid", format!("{kind} \"{name}\" is invalid: {field}: {detail}"));
        let mut d = details(kind, name);
        d["causes"] = json!([{ "reason": cause, "message": detail, "field": field }]);
        e.details = Some(d);
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

/// `Status.details` for a (possibly group-qualified) resource or kind: `{"name", "kind"}`, plus `group`
/// when qualified (`endpointslices.discovery.k8s.io` → kind `endpointslices`, group `discovery.k8s.io`).
fn details(qualified: &str, name: &str) -> Value {
    match qualified.split_once('.') {
        Some((kind, group)) => json!({ "name": name, "group": group, "kind": kind }),
        None => json!({ "name": name, "kind": qualified }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn details_split_the_group_off() {
        let e = ApiError::not_found("endpointslices.discovery.k8s.io", "web-abc");
        assert_eq!(e.message, "endpointslices.discovery.k8s.io \"web-abc\" not found");
        assert_eq!(e.details, Some(json!({"name": "web-abc", "group": "discovery.k8s.io", "kind": "endpointslices"})));
        assert_eq!(ApiError::not_found("nodes", "w1").details, Some(json!({"name": "w1", "kind": "nodes"})));
    }
}
