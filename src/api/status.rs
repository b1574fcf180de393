//! `GET /api/v1/status`: how current the served state is, per watch scope; and the middleware that
//! puts `X-Vipwatch-Last-Synced` on every API response. The API keeps serving the last known state
//! through an apiserver outage; these say how stale it is.

use axum::Json;
use axum::extract::{Request, State};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use serde::Serialize;
use utoipa::ToSchema;

use super::ApiState;
use crate::model::rfc3339;
use crate::watch::{ScopeStatus, WatchHealth};

/// The header on every API response: the oldest `synced_at` over every watch scope (RFC 3339, UTC,
/// ms). Absent until every scope has synced once.
pub const LAST_SYNCED: &str = "x-vipwatch-last-synced";

/// The answer of `GET /api/v1/status`.
#[derive(Debug, Serialize, ToSchema)]
pub struct StatusDto {
    /// The cluster this vipwatch serves (`cluster.name`, or the name it derived: see the
    /// configuration reference); every delivery carries it as `data.cluster`.
    #[schema(example = "prod-eu1")]
    pub cluster: String,
    /// The oldest `synced_at` over every scope (the `X-Vipwatch-Last-Synced` header); `null` until
    /// every scope has synced once.
    #[schema(format = DateTime)]
    pub last_synced_at: Option<String>,
    /// Why `/readyz` reports the watch not ready, `null` when it is ready as far as the watch goes.
    pub not_ready: Option<String>,
    /// Every list/watch scope, ordered by resource then namespace (this replica's watch: empty scopes
    /// on a follower, which does not watch).
    pub scopes: Vec<ScopeStatus>,
    /// Which replica leads and which one answered.
    pub leader: LeaderDto,
}

/// Leadership as one replica sees it.
#[derive(Debug, Serialize, ToSchema)]
pub struct LeaderDto {
    /// The replica that answered (`database.replica`; `single` on SQLite).
    pub replica: String,
    /// What it does: `single` (SQLite: the only instance, always leading), `leader` or `follower`.
    #[schema(example = "follower")]
    pub role: String,
    /// PostgreSQL: the replica holding the lease, `null` before any ever led (or on SQLite).
    pub holder: Option<String>,
    /// PostgreSQL: the lease's epoch, one more at every change of leader.
    pub epoch: Option<i64>,
    /// PostgreSQL: milliseconds until the lease expires without renewal (negative: expired).
    pub expires_in_ms: Option<i64>,
}

/// Which cluster this vipwatch serves, and how current the served state is: per watch scope, its state (`listing`, `watching`, `stalled`,
/// `failing`), when the apiserver last sent something, up to when its data is known current, and its
/// last error; and which replica leads (`leader`). Errors: 503 `database_unavailable` when the
/// lease cannot be read.
#[utoipa::path(get, path = "/api/v1/status", tag = "operations",
    responses((status = 200, description = "The watch's health per scope and the leader", body = StatusDto),
        (status = 503, description = "The database cannot be read", body = super::error::Problem, content_type = "application/problem+json")))]
pub async fn get_status(State(state): State<ApiState>) -> Result<Json<StatusDto>, super::error::ApiError> {
    let health = &state.watch;
    let lease = state.store.lease().await?;
    let role = *state.role.borrow();
    Ok(Json(StatusDto {
        cluster: state.config.cluster.name.clone().unwrap_or_default(),
        last_synced_at: health.last_synced_ms().map(rfc3339),
        not_ready: super::health::watch_healthy(&state).await,
        scopes: health.statuses(),
        leader: LeaderDto {
            replica: state.replica.to_string(),
            role: role.as_str().to_owned(),
            holder: lease.as_ref().map(|l| l.holder.clone()),
            epoch: lease.as_ref().map(|l| l.epoch),
            expires_in_ms: lease.map(|l| l.expires_in_ms),
        },
    }))
}

/// Middleware: sets [`LAST_SYNCED`] on every response (errors included).
pub async fn last_synced_header(State(health): State<WatchHealth>, request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    if let Some(value) = health.last_synced_ms().and_then(|ms| HeaderValue::from_str(&rfc3339(ms)).ok()) {
        response.headers_mut().insert(LAST_SYNCED, value);
    }
    response
}
