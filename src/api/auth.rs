//! Bearer-token authorization (checked before routing): every POST needs `Authorization: Bearer <server.api_token>`; reads
//! (`/api/v1/**` and `/metrics`) too when `server.require_auth_for_reads` is set. With no token
//! configured, guarded requests are refused (403), never let through.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::error::ApiError;
use crate::config::ServerConfig;

/// What the auth middleware checks against.
#[derive(Clone)]
pub struct AuthPolicy {
    /// SHA-256 of the configured token (`None`: writes disabled).
    token_digest: Option<[u8; 32]>,
    /// Whether reads need the token too.
    reads: bool,
}

impl AuthPolicy {
    /// The policy of the `[server]` table.
    pub fn new(server: &ServerConfig) -> Arc<Self> {
        let token_digest = server.api_token.as_ref().map(|t| digest(t.expose().as_bytes()));
        Arc::new(Self { token_digest, reads: server.require_auth_for_reads })
    }

    fn guards(&self, method: &Method, path: &str) -> bool {
        let read = *method == Method::GET || *method == Method::HEAD;
        *method == Method::POST || (read && self.reads && (path.starts_with("/api/") || path == "/metrics"))
    }

    /// Checks a request's `Authorization` header. Errors: [`ApiError::WritesDisabled`] when no token
    /// is configured, [`ApiError::Unauthorized`] when the header is absent or the token differs.
    fn check(&self, authorization: Option<&[u8]>) -> Result<(), ApiError> {
        let expected = self.token_digest.as_ref().ok_or(ApiError::WritesDisabled)?;
        // The scheme is case-insensitive (RFC 9110 §11.1): `bearer`, `BEARER` and `Bearer` all count.
        let given = authorization
            .and_then(|h| h.split_at_checked(7))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case(b"Bearer "))
            .map(|(_, token)| token)
            .ok_or(ApiError::Unauthorized)?;
        // Comparing fixed-length digests keeps the time independent of the token's length too.
        if bool::from(digest(given).ct_eq(expected)) { Ok(()) } else { Err(ApiError::Unauthorized) }
    }
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// Middleware enforcing [`AuthPolicy`] before routing.
pub async fn require_token(State(policy): State<Arc<AuthPolicy>>, request: Request, next: Next) -> Response {
    if policy.guards(request.method(), request.uri().path()) {
        let header = request.headers().get(header::AUTHORIZATION).map(|v| v.as_bytes());
        if let Err(e) = policy.check(header) {
            return e.into_response();
        }
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Secret;

    fn policy(token: Option<&str>, reads: bool) -> AuthPolicy {
        let server = ServerConfig {
            api_token: token.map(Secret::new),
            require_auth_for_reads: reads,
            ..ServerConfig::default()
        };
        AuthPolicy::new(&server).as_ref().clone()
    }

    #[test]
    fn tokens_are_checked_exactly() {
        let p = policy(Some("s3cret"), false);
        assert!(p.check(Some(b"Bearer s3cret")).is_ok());
        assert!(p.check(Some(b"bearer s3cret")).is_ok(), "the scheme is case-insensitive");
        assert!(matches!(p.check(Some(b"Basic s3cret")), Err(ApiError::Unauthorized)));
        assert!(matches!(p.check(Some(b"Bear")), Err(ApiError::Unauthorized)));
        assert!(matches!(p.check(Some(b"Bearer s3cre")), Err(ApiError::Unauthorized)));
        assert!(matches!(p.check(None), Err(ApiError::Unauthorized)));
        assert!(matches!(policy(None, false).check(Some(b"Bearer x")), Err(ApiError::WritesDisabled)));
    }

    #[test]
    fn reads_are_open_unless_configured() {
        let open = policy(Some("t"), false);
        assert!(!open.guards(&Method::GET, "/api/v1/events"));
        assert!(open.guards(&Method::POST, "/api/v1/deliveries/1/retry"));
        let closed = policy(Some("t"), true);
        assert!(closed.guards(&Method::GET, "/api/v1/events") && closed.guards(&Method::GET, "/metrics"));
        assert!(!closed.guards(&Method::GET, "/healthz") && !closed.guards(&Method::GET, "/docs/"));
    }
}
