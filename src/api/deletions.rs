//! `GET /api/v1/deletions/held` (the deletions the mass-deletion guard holds) and
//! `POST /api/v1/deletions/held/release` (record them now). See docs/explanation/recording.md.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::ApiState;
use super::error::{ApiError, Problem};
use super::extract::Query;
use super::pagination::{self, page, rfc3339};
use crate::model::Feedback;
use crate::store::HeldDeletion;

/// One Service whose deletion is held: a list missed it together with too many others.
#[derive(Debug, Serialize, ToSchema)]
pub struct HeldDeletionDto {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `metadata.uid` of the object last seen.
    pub uid: String,
    /// The watch scope whose list missed it (`*` or a namespace), or `unwatched`: no configured
    /// namespace covers it any more (`kubernetes.namespaces` changed).
    pub scope: String,
    /// Cause its DELETED will carry once released: `startup` or `relist`.
    #[schema(pattern = "^(startup|relist)$")]
    pub cause: String,
    /// Why it is held (how many of how many tracked Services vanished at once).
    pub reason: String,
    /// When it was held (RFC 3339).
    #[schema(format = DateTime)]
    pub held_since: String,
    /// From when a list that still misses it records its DELETED by itself (`held_since` +
    /// `guard.confirm_after`, RFC 3339).
    #[schema(format = DateTime)]
    pub confirmable_at: String,
}

page!(HeldDeletionPage, HeldDeletionDto, "A page of held deletions, by namespace and name.");

/// Query of `GET /api/v1/deletions/held`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct HeldQuery {
    /// Page size, 1 to 1000.
    #[param(minimum = 1, maximum = 1000, default = 100)]
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

/// List the Service deletions the mass-deletion guard holds: their Services stay in the state table
/// with their VIPs, and nothing was relayed for them.
#[utoipa::path(get, path = "/api/v1/deletions/held", tag = "services", params(HeldQuery),
    responses((status = 200, description = "A page of held deletions", body = HeldDeletionPage)))]
pub async fn list_held(
    State(state): State<ApiState>,
    Query(q): Query<HeldQuery>,
) -> Result<Json<HeldDeletionPage>, ApiError> {
    let limit = pagination::limit(q.limit)?;
    let after: Option<(String, String)> = pagination::after("held", q.cursor.as_deref())?;
    let rows: Vec<HeldDeletion> = state
        .store
        .held_deletions()
        .await?
        .into_iter()
        .filter(|h| {
            after
                .as_ref()
                .is_none_or(|(ns, n)| (h.key.namespace.as_str(), h.key.name.as_str()) > (ns.as_str(), n.as_str()))
        })
        .take(limit + 1)
        .collect();
    let confirm_ms = i64::try_from(state.config.guard.confirm_after.as_millis()).unwrap_or(i64::MAX);
    let (rows, next_cursor) = pagination::cut(rows, limit, "held", |h| (h.key.namespace.clone(), h.key.name.clone()));
    let items = rows
        .into_iter()
        .map(|h| HeldDeletionDto {
            namespace: h.key.namespace.into(),
            name: h.key.name.into(),
            uid: h.uid,
            scope: h.scope,
            cause: h.cause.as_str().to_owned(),
            reason: h.reason,
            held_since: rfc3339(h.held_at),
            confirmable_at: rfc3339(h.held_at.saturating_add(confirm_ms)),
        })
        .collect();
    Ok(Json(HeldDeletionPage { items, next_cursor }))
}

/// Result of a release request.
#[derive(Debug, Serialize, ToSchema)]
pub struct Releasing {
    /// Held deletions when the request was made: their DELETED events are recorded (and relayed)
    /// next, with the cause they were held with.
    pub releasing: u64,
}

/// Record every held deletion now: one DELETED per Service (cause `startup` or `relist`, as held),
/// relayed to the endpoints; their pool addresses are freed once acknowledged.
#[utoipa::path(post, path = "/api/v1/deletions/held/release", tag = "services", security(("bearer" = [])),
    responses((status = 202, description = "The recorder records the held deletions next", body = Releasing),
        (status = 503, description = "The watch is not running, or this replica follows (`not_ready`; send it to the leader `GET /api/v1/status` names)", body = Problem, content_type = "application/problem+json")))]
pub async fn release_held(State(state): State<ApiState>) -> Result<(StatusCode, Json<Releasing>), ApiError> {
    if !state.role.borrow().leads() {
        let why = "this replica follows: send it to the leader (GET /api/v1/status names it)";
        return Err(ApiError::NotReady(why.into()));
    }
    let releasing = state.store.held_deletions().await?.len() as u64;
    let tx = state.feedback.as_ref().ok_or(ApiError::NotReady("the watch is not running".into()))?;
    tx.send(Feedback::ReleaseHeld).await.map_err(|_| ApiError::NotReady("the watch is not running".into()))?;
    Ok((StatusCode::ACCEPTED, Json(Releasing { releasing })))
}
