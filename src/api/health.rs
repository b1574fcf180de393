//! `GET /healthz`, `GET /readyz`, `GET /metrics` and `GET /openapi.json`.

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;

use std::sync::atomic::Ordering;

use super::ApiState;
use super::error::{ApiError, Problem};
use crate::leader::Role;
use crate::store::now_ms;

/// Process alive: always 200 `ok`.
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, description = "The process is alive", body = String, content_type = "text/plain")))]
pub async fn healthz() -> &'static str {
    "ok"
}

/// Ready: 200 only when every readiness check passes, else 503 `not_ready`, the `detail` naming each
/// failing check and its reason (`check: reason; check: reason`), e.g.
/// `not ready: database: not writable: database or disk is full (since 12 s)`.
///
/// - `watch`, on the instance that leads (SQLite's one instance; on PostgreSQL the leader): the first
///   full list of every watch scope is stored, and no watch scope is out of sync for longer than
///   `kubernetes.stale_after` nor refused 3 times in a row with 401/403. A PostgreSQL leader just
///   elected serves what the previous leader stored until its own first lists are stored, and is
///   ready meanwhile as a follower is (unless its scopes are refused).
/// - `watch`, on a PostgreSQL follower (it does not watch): some leader has stored its first full
///   lists in this database, so what it serves is a complete picture. Until then (a new database
///   whose first leader is still listing, or cannot reach Kubernetes) it is not ready.
/// - `database`: on the instance that leads, the database can be written; on a follower, which
///   writes nothing of its own, it can be read.
///
/// Answers within about a second in every state: the watch checks answer from memory (a follower's
/// reads one row until it has seen the lists) and the database probe never waits on a lock longer
/// than 800 ms.
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
    &[("watch", |s| Box::pin(watch_healthy(s))), ("database", |s| Box::pin(database_ready(s)))];

/// Why `/readyz`'s watch check fails, `None` when it passes (see [`readyz`]). Answers from memory,
/// except on PostgreSQL before this replica has seen that a leader's first lists are stored (one
/// read).
pub(super) async fn watch_healthy(state: &ApiState) -> Option<String> {
    let role = *state.role.borrow();
    let ready = *state.ready.borrow();
    match role {
        Role::Follower => lists_stored(state).await,
        // Just elected: what it serves is what the last leader stored, as when it followed.
        Role::Leader { .. } if !ready => match lists_stored(state).await {
            Some(_) => Some(WAITING.to_owned()),
            None => state.watch.not_ready(),
        },
        Role::Leader { .. } | Role::Single if ready => state.watch.not_ready(),
        Role::Leader { .. } | Role::Single => Some(WAITING.to_owned()),
    }
}

/// The watch check's reason before the first full lists are stored.
const WAITING: &str = "waiting for the first full list";

/// Why no leader's lists can be served yet, `None` once some leader has stored its first full lists
/// in the database ([`crate::store::Store::lists_stored`]); remembered once seen (they stay stored).
async fn lists_stored(state: &ApiState) -> Option<String> {
    if state.lists_stored.load(Ordering::Relaxed) {
        return None;
    }
    match state.store.lists_stored().await {
        Ok(true) => {
            state.lists_stored.store(true, Ordering::Relaxed);
            None
        }
        Ok(false) => Some("no leader has stored its first full lists in this database yet".to_owned()),
        Err(e) => Some(format!("cannot read whether a leader stored its first full lists: {}", e.reason())),
    }
}

/// The database check: on the instance that leads, the database can be written (the writers' last
/// outcome plus a short probe); on a follower, which serves reads and writes nothing of its own, it
/// can be read (a writer's fault, a connection the server ended, is not the follower's).
async fn database_ready(state: &ApiState) -> Option<String> {
    if state.role.borrow().leads() {
        state.store.check_writable().await.map(|u| u.to_string())
    } else {
        state.store.check_readable().await
    }
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
