//! Extractors whose rejections are [`ApiError`]s (so a bad query or path value is a problem+json 400,
//! never axum's plain-text default).

use axum::extract::FromRequestParts;
use axum::extract::rejection::{PathRejection, QueryRejection};

use super::error::ApiError;

/// `axum::extract::Query`, rejecting with [`ApiError::InvalidQuery`].
#[derive(Debug, FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(ApiError))]
pub struct Query<T>(pub T);

/// `axum::extract::Path`, rejecting with [`ApiError::InvalidPath`].
#[derive(Debug, FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiError))]
pub struct Path<T>(pub T);

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> Self {
        Self::InvalidQuery(rejection.body_text())
    }
}

impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> Self {
        Self::InvalidPath(rejection.body_text())
    }
}
