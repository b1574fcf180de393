//! `GET /healthz`, `GET /readyz`, `GET /metrics` and `GET /openapi.json`.

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;

use super::ApiState;
use super::error::{ApiError, Problem};
use crate::store::now_ms;

/// Process alive: always 200 `ok`.
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, description = "The process is alive", body = String, content_type = "text/plain")))]
pub async fn healthz() -> &'static str {
    "ok"
}

/// Ready: 200 when every readiness check passes, else 503 `not_ready` naming the first failing one.
///
/// The checks, in order: the first full list of every watch scope has been stored; the database can
/// be written (`detail` e.g. `not ready: database not writable: database or disk is full (since 12 s)`).
/// Answers within about a second in every state: the database probe never waits on a lock longer
/// than 800 ms.
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses((status = 200, description = "Ready", body = String, content_type = "text/plain"),
        (status = 503, description = "Not ready; `detail` says why", body = Problem, content_type = "application/problem+json")))]
pub async fn readyz(State(state): State<ApiState>) -> Result<&'static str, ApiError> {
    for (_name, check) in READINESS_CHECKS {
        if let Some(reason) = check(&state).await {
            return Err(ApiError::NotReady(reason.into()));
        }
    }
    Ok("ready")
}

/// One readiness check: `Some(reason)` when not ready.
type ReadinessCheck = for<'a> fn(&'a ApiState) -> futures::future::BoxFuture<'a, Option<String>>;

/// The checks of `/readyz`, in order, by name; the first failing one answers.
const READINESS_CHECKS: &[(&str, ReadinessCheck)] =
    &[("first_list", |s| Box::pin(first_list(s))), ("database", |s| Box::pin(database_writable(s)))];

/// Ready only after the first full list of every watch scope was stored.
async fn first_list(state: &ApiState) -> Option<String> {
    (!*state.ready.borrow()).then(|| "waiting for the first full list".to_owned())
}

/// Ready only while the database can be written (the writers' last outcome plus a short probe).
async fn database_writable(state: &ApiState) -> Option<String> {
    state.store.check_writable().await.map(|u| u.to_string())
}

/// Every metric in the Prometheus text format (`vipwatch_` prefix). The outbox gauges are refreshed
/// from the database on each scrape.
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses((status = 200, description = "OpenMetrics text exposition (Prometheus scrapes it natively)", body = String,
        content_type = "application/openmetrics-text")))]
pub async fn metrics(State(state): State<ApiState>) -> impl IntoResponse {
    match state.store.outbox_depth().await {
        Ok(depth) => {
            let now = now_ms();
            for w in state.config.webhooks.iter().filter(|w| w.enabled) {
                let (pending, oldest) = depth.iter().find(|d| d.0 == w.name).map_or((0, now), |d| (d.1, d.2));
                state.metrics.outbox(&w.name, pending, (now - oldest).max(0) as f64 / 1000.0);
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot refresh the outbox gauges"),
    }
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], state.metrics.render())
}

/// This API's OpenAPI 3.1 document (also committed as `openapi/openapi.json`).
#[utoipa::path(get, path = "/openapi.json", tag = "operations",
    responses((status = 200, description = "The OpenAPI document", body = Object)))]
pub async fn openapi_json(State(state): State<ApiState>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], state.openapi.clone())
}
