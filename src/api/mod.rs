//! The HTTP API (axum). Reads the store; never writes Kubernetes state.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::sync::watch;

use crate::metrics::Metrics;
use crate::store::Store;

/// Shared state of every handler.
#[derive(Clone)]
pub struct ApiState {
    /// The database.
    pub store: Store,
    /// Every metric, rendered by `/metrics`.
    pub metrics: Arc<Metrics>,
    /// `true` once the first full list of every watch scope is stored.
    pub ready: watch::Receiver<bool>,
}

/// The router: `/healthz`, `/readyz`, `/metrics`.
pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state)
}

/// Process alive: always 200 `ok`.
async fn healthz() -> &'static str {
    "ok"
}

/// 200 only when the database is writable and the first full list has been stored; 503 otherwise.
async fn readyz(State(state): State<ApiState>) -> (StatusCode, &'static str) {
    if !*state.ready.borrow() {
        return (StatusCode::SERVICE_UNAVAILABLE, "waiting for the first full list");
    }
    if !state.store.is_writable().await {
        return (StatusCode::SERVICE_UNAVAILABLE, "database not writable");
    }
    (StatusCode::OK, "ready")
}

/// Prometheus text format.
async fn metrics(State(state): State<ApiState>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], state.metrics.render())
}
