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

/// Ready: 200 only when every readiness check passes: the first full list of every watch scope is
/// stored; no watch scope is out of sync for longer than `kubernetes.stale_after` nor refused 3 times
/// in a row with 401/403; the database can be written. Otherwise 503 `not_ready`, the `detail` naming
/// each failing check and its reason (`check: reason; check: reason`), e.g.
/// `not ready: database: not writable: database or disk is full (since 12 s)`. Answers within about a
/// second in every state: the watch checks answer from memory and the database probe never waits on a
/// lock longer than 800 ms.
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses((status = 200, description = "Ready", body = String, content_type = "text/plain"),
        (status = 503, description = "Not ready; `detail` says why", body = Problem, content_type = "application/problem+json")))]
pub async fn readyz(State(state): State<ApiState>) -> Result<&'static str, ApiError> {
    let mut failing = Vec::new();
    for (name, check) in READINESS_CHECKS {
        if let Some(reason) = check(&state).await {
            failing.push(format!("{name}: {reason}"));
        }
    }
    if failing.is_empty() { Ok("ready") } else { Err(ApiError::NotReady(failing.join("; ").into())) }
}

/// One readiness check: `Some(reason)` when not ready.
type ReadinessCheck = for<'a> fn(&'a ApiState) -> futures::future::BoxFuture<'a, Option<String>>;

/// The checks of `/readyz`, in order, by name; every failing one is named in the answer.
const READINESS_CHECKS: &[(&str, ReadinessCheck)] =
    &[("watch", |s| Box::pin(watch_healthy(s))), ("database", |s| Box::pin(database_writable(s)))];

/// The watch checks: the first full list of every scope stored, then each scope's health
/// ([`crate::watch::WatchHealth::not_ready`]). Answers from memory, at once.
pub(super) async fn watch_healthy(state: &ApiState) -> Option<String> {
    if !state.role.borrow().leads() {
        // A follower does not watch: it serves what the leader stored.
        return None;
    }
    if !*state.ready.borrow() {
        return Some("waiting for the first full list".to_owned());
    }
    state.watch.not_ready()
}

/// Ready only while the database can be written (the writers' last outcome plus a short probe).
async fn database_writable(state: &ApiState) -> Option<String> {
    state.store.check_writable().await.map(|u| u.to_string())
}

/// Every metric in the Prometheus text format (`vipwatch_` prefix). The outbox gauges are refreshed
/// from the database and the watch's sync times from memory on each scrape.
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
    state.watch.refresh_metrics();
    if state.store.unwritable().is_some() {
        // Probes the faulted database, so `vipwatch_store_writable` recovers even when nothing else
        // writes and nobody polls /readyz.
        state.store.check_writable().await;
    }
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], state.metrics.render())
}

/// This API's OpenAPI 3.1 document (also committed as `openapi/openapi.json`).
#[utoipa::path(get, path = "/openapi.json", tag = "operations",
    responses((status = 200, description = "The OpenAPI document", body = Object)))]
pub async fn openapi_json(State(state): State<ApiState>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], state.openapi.clone())
}
