//! The API layer's one error type, rendered as RFC 9457 `application/problem+json` with a stable
//! machine-readable `code`; and the middleware that turns every other 4xx/5xx (axum's plain-text
//! 404/405, tower-http's 408/413) into the same shape.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use crate::store::StoreError;

/// The media type of every error body.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// Everything a handler can fail with. Each variant has one status and one stable `code`.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// A query parameter is missing, malformed or out of range (400 `invalid_query`).
    #[error("invalid query parameter: {0}")]
    InvalidQuery(String),
    /// A path parameter does not parse (400 `invalid_path`).
    #[error("invalid path parameter: {0}")]
    InvalidPath(String),
    /// A `cursor` that this server did not issue, was altered, or belongs to another list (400
    /// `invalid_cursor`).
    #[error("the cursor is not one this list issued")]
    InvalidCursor,
    /// A header is malformed, e.g. `Last-Event-ID` (400 `invalid_header`).
    #[error("invalid header: {0}")]
    InvalidHeader(String),
    /// No or a wrong bearer token (401 `unauthorized`).
    #[error("a valid `Authorization: Bearer <token>` header is required")]
    Unauthorized,
    /// No `server.api_token` is configured, so writes are refused (403 `writes_disabled`).
    #[error("writes are disabled: no API token is configured (server.api_token or VIPWATCH_API_TOKEN)")]
    WritesDisabled,
    /// The named resource does not exist (404 `not_found`).
    #[error("{0} not found")]
    NotFound(String),
    /// No route has this path (404 `no_route`).
    #[error("no such path")]
    NoRoute,
    /// The path exists but not with this method (405 `method_not_allowed`).
    #[error("method not allowed on this path")]
    MethodNotAllowed,
    /// The request took longer than `server.request_timeout` (408 `request_timeout`).
    #[error("the request took longer than the server's timeout")]
    Timeout,
    /// The endpoint exists but is disabled in the configuration (409 `webhook_disabled`).
    #[error("webhook `{0}` is disabled in the configuration")]
    WebhookDisabled(String),
    /// The full-state endpoint holds no declaration to confirm (409 `nothing_held`).
    #[error("webhook `{0}` holds no full-state declaration to confirm")]
    NothingHeld(String),
    /// The body is larger than `server.body_limit` (413 `payload_too_large`).
    #[error("the request body is larger than the server accepts")]
    PayloadTooLarge,
    /// The database failed: 503 `database_unavailable` for a storage fault that clears by itself
    /// (unreachable, timed out, full, locked, read-only: [`StoreError::fault`]), naming its kind;
    /// otherwise 500 `internal`. The error itself is logged, not returned (it may name the server).
    #[error("{}", store_detail(.0))]
    Store(#[from] StoreError),
    /// Not ready: each failing readiness check and its reason (503 `not_ready`).
    #[error("not ready: {0}")]
    NotReady(std::borrow::Cow<'static, str>),
    /// Any other status produced below the handlers (`code` derived from the status).
    #[error("{1}")]
    Other(StatusCode, &'static str),
}

/// An RFC 9457 problem document.
#[derive(Debug, Clone, Serialize, serde::Deserialize, ToSchema)]
pub struct Problem {
    /// `urn:vipwatch:problem:<code>`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Short summary (the HTTP reason phrase).
    pub title: String,
    /// The HTTP status code.
    pub status: u16,
    /// Human-readable explanation of this occurrence.
    pub detail: String,
    /// Stable machine-readable code, e.g. `invalid_cursor`.
    pub code: String,
}

impl ApiError {
    /// The HTTP status of this error.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::InvalidQuery(_) | Self::InvalidPath(_) | Self::InvalidCursor | Self::InvalidHeader(_) => {
                StatusCode::BAD_REQUEST
            }
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::WritesDisabled => StatusCode::FORBIDDEN,
            Self::NotFound(_) | Self::NoRoute => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::Timeout => StatusCode::REQUEST_TIMEOUT,
            Self::WebhookDisabled(_) | Self::NothingHeld(_) => StatusCode::CONFLICT,
            Self::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Store(e) if unavailable(e) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Self::NotReady(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Other(status, _) => *status,
        }
    }

    /// The stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            Self::InvalidQuery(_) => "invalid_query",
            Self::InvalidPath(_) => "invalid_path",
            Self::InvalidCursor => "invalid_cursor",
            Self::InvalidHeader(_) => "invalid_header",
            Self::Unauthorized => "unauthorized",
            Self::WritesDisabled => "writes_disabled",
            Self::NotFound(_) => "not_found",
            Self::NoRoute => "no_route",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::Timeout => "request_timeout",
            Self::WebhookDisabled(_) => "webhook_disabled",
            Self::NothingHeld(_) => "nothing_held",
            Self::PayloadTooLarge => "payload_too_large",
            Self::Store(e) if unavailable(e) => "database_unavailable",
            Self::Store(_) => "internal",
            Self::NotReady(_) => "not_ready",
            Self::Other(status, _) if status.is_server_error() => "internal",
            Self::Other(..) => "bad_request",
        }
    }

    /// The problem document of this error.
    pub fn problem(&self) -> Problem {
        let status = self.status();
        Problem {
            kind: format!("urn:vipwatch:problem:{}", self.code()),
            title: status.canonical_reason().unwrap_or("Error").to_owned(),
            status: status.as_u16(),
            detail: clip(self.to_string()),
            code: self.code().to_owned(),
        }
    }

    /// The error for a status produced below the handlers (routing, timeouts, body limits).
    fn from_status(status: StatusCode) -> Self {
        match status {
            StatusCode::NOT_FOUND => Self::NoRoute,
            StatusCode::METHOD_NOT_ALLOWED => Self::MethodNotAllowed,
            StatusCode::REQUEST_TIMEOUT => Self::Timeout,
            StatusCode::PAYLOAD_TOO_LARGE => Self::PayloadTooLarge,
            s if s.is_server_error() => Self::Other(s, "internal error"),
            s => Self::Other(s, "the request was not accepted"),
        }
    }
}

/// Longest `detail` of a problem document, in characters. Details echo what the client sent (a
/// path segment, a query value); a URI may be tens of KiB, and the answer need not repeat it all.
pub const DETAIL_MAX_CHARS: usize = 512;

/// `detail` cut to [`DETAIL_MAX_CHARS`] characters, the cut marked with `…`.
fn clip(mut detail: String) -> String {
    if let Some((at, _)) = detail.char_indices().nth(DETAIL_MAX_CHARS) {
        detail.truncate(at);
        detail.push('…');
    }
    detail
}

/// Whether `e` is a storage fault that clears by itself: the database is unavailable, not broken.
fn unavailable(e: &StoreError) -> bool {
    e.fault().is_some_and(|k| k.is_transient())
}

/// The detail of [`ApiError::Store`]: the fault's kind, never the error's text.
fn store_detail(e: &StoreError) -> String {
    match e.fault() {
        Some(kind) if kind.is_transient() => format!("the database is unavailable ({}); retry later", kind.as_str()),
        _ => "internal error".to_owned(),
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if let Self::Store(e) = &self {
            tracing::error!(error = %e, "API request failed");
        }
        let body = serde_json::to_vec(&self.problem()).unwrap_or_default();
        let mut response = (self.status(), body).into_response();
        response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if matches!(self, Self::Unauthorized) {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// Middleware: any 4xx/5xx response whose body is not already a problem document (axum's routing
/// 404/405, a 408 from the timeout layer, a 413 from the body limit) is replaced by one, keeping its
/// status and headers (`Allow` of a 405 among them).
pub async fn problem_for_every_error(request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    let status = response.status();
    let is_problem =
        response.headers().get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes() == PROBLEM_JSON.as_bytes());
    if !(status.is_client_error() || status.is_server_error()) || is_problem {
        return response;
    }
    let (mut parts, _) = response.into_parts();
    let problem = ApiError::from_status(status).problem();
    parts.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(serde_json::to_vec(&problem).unwrap_or_default()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_maps_to_a_stable_code() {
        let p = ApiError::InvalidCursor.problem();
        assert_eq!(
            (p.kind.as_str(), p.title.as_str(), p.status, p.code.as_str()),
            ("urn:vipwatch:problem:invalid_cursor", "Bad Request", 400, "invalid_cursor")
        );
        assert_eq!(ApiError::from_status(StatusCode::METHOD_NOT_ALLOWED).code(), "method_not_allowed");
        assert_eq!(ApiError::from_status(StatusCode::BAD_GATEWAY).code(), "internal");
        assert_eq!(ApiError::from_status(StatusCode::UNSUPPORTED_MEDIA_TYPE).code(), "bad_request");
    }
}
