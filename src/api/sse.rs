//! `GET /api/v1/events/stream`: a Server-Sent Events live tail of the event log. Each SSE event has
//! `id:` = the event id and `data:` = the event as JSON (the `/api/v1/events` item); a reconnecting
//! client sends `Last-Event-ID` and gets every matching event after it, without gaps. Wakes on every
//! commit; a comment line keeps idle connections alive.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::Stream;
use serde::Deserialize;
use utoipa::IntoParams;

use super::ApiState;
use super::error::ApiError;
use super::events::{EventCause, EventDto, EventQuery, EventType};
use super::extract::Query;
use crate::store::EventFilter;

/// Events read per query while catching up.
const BATCH: i64 = 500;

/// Query of the stream.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct StreamQuery {
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
    /// Start after this id (default: only events committed from now on). `Last-Event-ID` wins.
    #[param(minimum = 0)]
    pub after_id: Option<u64>,
}

fn start_after(headers: &HeaderMap, q: &StreamQuery) -> Result<Option<i64>, ApiError> {
    if let Some(v) = headers.get("last-event-id") {
        let id = v.to_str().ok().and_then(|s| s.trim().parse::<i64>().ok()).filter(|id| *id >= 0);
        return id.map(Some).ok_or_else(|| ApiError::InvalidHeader("Last-Event-ID: not an event id".into()));
    }
    Ok(q.after_id.map(|v| i64::try_from(v).unwrap_or(i64::MAX)))
}

/// Live tail of the event log (Server-Sent Events), resumable with `Last-Event-ID`.
#[utoipa::path(get, path = "/api/v1/events/stream", tag = "events",
    params(StreamQuery, ("Last-Event-ID" = Option<String>, Header, description = "Resume after this event id")),
    responses((status = 200, description = "`text/event-stream`: `id: <event id>`, `data: <event JSON>` per event",
        content_type = "text/event-stream", body = String)))]
pub async fn stream_events(
    State(state): State<ApiState>,
    Query(q): Query<StreamQuery>,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let query = EventQuery {
        namespace: q.namespace.clone(),
        name: q.name.clone(),
        event_type: q.event_type,
        cause: q.cause,
        ..EventQuery::default()
    };
    let filter = query.filter()?;
    let after = match start_after(&headers, &q)? {
        Some(id) => id,
        None => state.store.max_event_id().await?,
    };
    let stream = tail(state, filter, after);
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}

fn tail(state: ApiState, filter: EventFilter, mut after: i64) -> impl Stream<Item = Result<Event, Infallible>> {
    let mut committed = state.committed.clone();
    async_stream::stream! {
        loop {
            let seen = *committed.borrow_and_update();
            let page = EventFilter { after_id: Some(after), limit: Some(BATCH), ..filter.clone() };
            let rows = match state.store.events(&page).await {
                Ok(rows) => rows,
                Err(e) => {
                    tracing::warn!(error = %e, "event stream: cannot read events");
                    break;
                }
            };
            let full = rows.len() as i64 == BATCH;
            for row in rows {
                after = row.id;
                let event = Event::default().id(row.id.to_string()).json_data(EventDto::from(row));
                yield Ok(event.unwrap_or_default());
            }
            if full {
                continue;
            }
            // Every event up to `seen` was committed before the query, so none of them is still to come.
            after = after.max(seen);
            tokio::select! {
                _ = state.cancel.cancelled() => break,
                changed = committed.changed() => if changed.is_err() { break },
            }
        }
    }
}
