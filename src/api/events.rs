//! `GET /api/v1/events` (the event log, by id ascending) and `GET /api/v1/events/{id}`.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use vipwatch_contract::{BackendMode, BackendsDiff};

use super::ApiState;
use super::error::{ApiError, Problem};
use super::extract::{Path, Query};
use super::pagination::{self, page, parse_time, rfc3339};
use crate::model::ServiceView;
use crate::store::{EventFilter, EventRow};

/// One event of the log.
#[derive(Debug, Serialize, ToSchema)]
pub struct EventDto {
    /// Monotonic id (never reused).
    pub id: i64,
    /// When vipwatch observed the change (RFC 3339).
    #[schema(format = DateTime)]
    pub observed_at: String,
    /// `ADDED`, `MODIFIED` or `DELETED`.
    #[serde(rename = "type")]
    #[schema(value_type = EventType)]
    pub event_type: String,
    /// Why it was recorded: `watch`, `relist`, `startup`, `allocation`, `appliance` or `backends`.
    #[schema(value_type = EventCause)]
    pub cause: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.resourceVersion` at the change.
    pub resource_version: String,
    /// MODIFIED: the changed fields (view names, e.g. `ports`); otherwise empty.
    pub changed: Vec<String>,
    /// The view after the change (the last view for DELETED).
    pub view: ServiceView,
}

impl From<EventRow> for EventDto {
    fn from(e: EventRow) -> Self {
        Self {
            id: e.id,
            observed_at: rfc3339(e.observed_at),
            event_type: e.event_type,
            cause: e.cause,
            namespace: e.key.namespace.into(),
            name: e.key.name.into(),
            uid: e.uid,
            resource_version: e.resource_version,
            changed: e.changed,
            view: e.view,
        }
    }
}

/// One event with the view before it and the members it carried.
#[derive(Debug, Serialize, ToSchema)]
pub struct EventDetail {
    /// The event.
    #[serde(flatten)]
    pub event: EventDto,
    /// MODIFIED: the view before the change; otherwise `null`.
    pub previous: Option<ServiceView>,
    /// ADDED and DELETED: the members per backend mode (keys `nodePort`, `pod`), as the payloads
    /// carried them; otherwise `{}`.
    #[schema(value_type = BTreeMap<BackendMode, vipwatch_contract::Backends>)]
    #[serde(serialize_with = "vipwatch_contract::object")]
    pub backends: crate::model::backends::BackendSets,
    /// MODIFIED whose members changed: what changed, per backend mode (the payload's
    /// `backendsDiff`); otherwise `{}`.
    pub backends_diff: BTreeMap<BackendMode, BackendsDiff>,
}

page!(EventPage, EventDto, "A page of the event log, by id ascending.");

/// Event types.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[allow(clippy::upper_case_acronyms)]
pub enum EventType {
    /// The Service entered scope.
    ADDED,
    /// An LB-relevant field changed.
    MODIFIED,
    /// The Service left scope.
    DELETED,
}

/// Why an event was recorded.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum EventCause {
    /// Seen on the watch.
    Watch,
    /// Found by a re-list.
    Relist,
    /// Found by the first list after vipwatch started.
    Startup,
    /// An address freed up for a Service that was waiting for one.
    Allocation,
    /// An endpoint with `assigns_vip` returned the Service's address.
    Appliance,
    /// The Service's members changed (EndpointSlices or Nodes), coalesced over `backends.window`.
    Backends,
}

/// Filters of the event log (list and stream).
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventQuery {
    /// Only this namespace.
    pub namespace: Option<String>,
    /// Only this Service name.
    pub name: Option<String>,
    /// Only this type.
    #[serde(rename = "type")]
    #[param(rename = "type", inline)]
    pub event_type: Option<EventType>,
    /// Only this cause.
    #[param(inline)]
    pub cause: Option<EventCause>,
    /// Only events observed at or after this time (RFC 3339).
    #[param(format = DateTime)]
    pub since: Option<String>,
    /// Only events observed before this time (RFC 3339).
    #[param(format = DateTime)]
    pub until: Option<String>,
    /// Only ids greater than this.
    #[param(minimum = 0)]
    pub after_id: Option<u64>,
    /// Page size, 1 to 1000.
    #[param(minimum = 1, maximum = 1000, default = 100)]
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

impl EventQuery {
    /// The store filter of these parameters (without paging). Errors: [`ApiError::InvalidQuery`].
    pub fn filter(&self) -> Result<EventFilter, ApiError> {
        Ok(EventFilter {
            after_id: self.after_id.map(|v| i64::try_from(v).unwrap_or(i64::MAX)),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            event_type: self.event_type.map(|t| format!("{t:?}")),
            cause: self.cause.map(|c| format!("{c:?}").to_lowercase()),
            since_ms: self.since.as_deref().map(|v| parse_time("since", v)).transpose()?,
            until_ms: self.until.as_deref().map(|v| parse_time("until", v)).transpose()?,
            limit: None,
        })
    }
}

/// The event log, filtered, by id ascending.
#[utoipa::path(get, path = "/api/v1/events", tag = "events", params(EventQuery),
    responses((status = 200, description = "A page of events", body = EventPage)))]
pub async fn list_events(
    State(state): State<ApiState>,
    Query(q): Query<EventQuery>,
) -> Result<Json<EventPage>, ApiError> {
    let limit = pagination::limit(q.limit)?;
    let mut filter = q.filter()?;
    if let Some(after) = pagination::after::<i64>("events", q.cursor.as_deref())? {
        filter.after_id = Some(filter.after_id.map_or(after, |a| a.max(after)));
    }
    filter.limit = Some(i64::try_from(limit + 1).unwrap_or(i64::MAX));
    let rows = state.store.events(&filter).await?;
    let (rows, next_cursor) = pagination::cut(rows, limit, "events", |e| e.id);
    Ok(Json(EventPage { items: rows.into_iter().map(EventDto::from).collect(), next_cursor }))
}

/// One event, with the view before it and the changed fields.
#[utoipa::path(get, path = "/api/v1/events/{id}", tag = "events",
    params(("id" = i64, Path, description = "Event id")),
    responses((status = 200, description = "The event", body = EventDetail),
        (status = 404, description = "No such event (or pruned)", body = Problem, content_type = "application/problem+json")))]
pub async fn get_event(State(state): State<ApiState>, Path(id): Path<i64>) -> Result<Json<EventDetail>, ApiError> {
    let mut row = state.store.event(id).await?.ok_or_else(|| ApiError::NotFound(format!("event {id}")))?;
    let (previous, backends, backends_diff) =
        (row.previous.take(), std::mem::take(&mut row.backends), std::mem::take(&mut row.backends_diff));
    Ok(Json(EventDetail { event: row.into(), previous, backends, backends_diff }))
}
