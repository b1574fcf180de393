//! `GET /api/v1/deliveries[/{id}]` (the delivery log with attempts) and
//! `POST /api/v1/deliveries/{id}/retry` (replay one delivery, any state).

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::ApiState;
use super::error::{ApiError, Problem};
use super::extract::{Path, Query};
use super::pagination::{self, page, rfc3339};
use crate::store::{AttemptRow, DeliveryFilter, DeliveryRow};
use vipwatch_contract::WebhookPayload;

/// One attempt to deliver.
#[derive(Debug, Serialize, ToSchema)]
pub struct AttemptDto {
    /// When it started (RFC 3339).
    #[schema(format = DateTime)]
    pub started_at: String,
    /// How long it took, in milliseconds.
    pub duration_ms: i64,
    /// HTTP status, when a response arrived.
    pub status_code: Option<i64>,
    /// `timeout`, `connect`, `tls`, `forbidden_address`, `redirect`, `http` (non-2xx, or a template's
    /// response check failed), `template` (a template did not render) or `held` (the full-state
    /// removal guard holds the declaration); `null` on success.
    pub error_class: Option<String>,
    /// Error text.
    pub error: Option<String>,
    /// `Location` of a 3xx answer.
    pub location: Option<String>,
    /// At most 4 KiB of the response body (a templated endpoint: the last request's).
    pub response_body: Option<String>,
    /// Templated endpoints (docs/reference/templates.md): every HTTP request of the attempt in order,
    /// as rendered and sent (secrets redacted), with its status and response; `null` for plain
    /// webhooks, whose request is the delivery's `payload`.
    #[schema(value_type = Option<Vec<TemplateRequestDto>>)]
    pub request: Option<serde_json::Value>,
}

/// One HTTP request a request template sent within an attempt.
#[derive(Debug, Serialize, ToSchema)]
pub struct TemplateRequestDto {
    /// Which request: `on.ADDED[0]`, `full_state`, `full_state.poll`.
    pub name: String,
    /// HTTP method.
    pub method: String,
    /// URL (secret values redacted).
    pub url: String,
    /// Headers sent; `Authorization` and secret values are `<redacted>`.
    pub headers: BTreeMap<String, String>,
    /// The body sent (secret values redacted).
    pub body: Option<String>,
    /// HTTP status, when a response arrived.
    pub status: Option<u16>,
    /// At most 4 KiB of the response body.
    pub response: Option<String>,
    /// Transport error, when no response arrived.
    pub error: Option<String>,
}

impl From<AttemptRow> for AttemptDto {
    fn from(a: AttemptRow) -> Self {
        Self {
            started_at: rfc3339(a.started_at),
            duration_ms: a.duration_ms,
            status_code: a.status_code,
            error_class: a.error_class,
            error: a.error,
            location: a.location,
            response_body: a.response_body,
            request: a.request.and_then(|r| serde_json::from_str(&r).ok()),
        }
    }
}

/// One delivery (an event, or a `service.synced`, for one endpoint).
#[derive(Debug, Serialize, ToSchema)]
pub struct DeliveryDto {
    /// Delivery id.
    pub id: i64,
    /// Endpoint name.
    pub webhook: String,
    /// The event carried (`null` for `service.synced`).
    pub event_id: Option<i64>,
    /// Namespace of the Service.
    pub namespace: String,
    /// Name of the Service.
    pub name: String,
    /// `ADDED`, `MODIFIED`, `DELETED` or `SYNCED`.
    pub kind: String,
    /// The `webhook-id` header (stable across retries).
    pub msg_id: String,
    /// `pending`, `succeeded`, `failed` or `superseded`.
    #[schema(value_type = DeliveryState)]
    pub state: String,
    /// When it was enqueued (RFC 3339).
    #[schema(format = DateTime)]
    pub created_at: String,
    /// When the next attempt is due (RFC 3339), which is also the delivery's place in the claim order;
    /// `null` unless pending. A `MODIFIED` that superseded older ones keeps the earliest of theirs, so
    /// it may be before `created_at`; one that took a newer change in place (its `event_id` is that
    /// change's) keeps its own.
    #[schema(format = DateTime)]
    pub next_attempt_at: Option<String>,
    /// When it finished (RFC 3339).
    #[schema(format = DateTime)]
    pub finished_at: Option<String>,
    /// Status code of the last attempt.
    pub last_status: Option<i64>,
    /// Error of the last attempt.
    pub last_error: Option<String>,
    /// Every attempt, oldest first.
    pub attempts: Vec<AttemptDto>,
}

fn dto(d: DeliveryRow, attempts: Vec<AttemptDto>) -> DeliveryDto {
    DeliveryDto {
        next_attempt_at: (d.state == "pending").then(|| rfc3339(d.next_attempt_at)),
        id: d.id,
        webhook: d.webhook,
        event_id: d.event_id,
        namespace: d.key.namespace.into(),
        name: d.key.name.into(),
        kind: d.kind,
        msg_id: d.msg_id,
        state: d.state,
        created_at: rfc3339(d.created_at),
        finished_at: d.finished_at.map(rfc3339),
        last_status: d.last_status,
        last_error: d.last_error,
        attempts,
    }
}

/// One delivery with the exact body sent.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeliveryDetail {
    /// The delivery.
    #[serde(flatten)]
    pub delivery: DeliveryDto,
    /// The body sent (and signed), as JSON. For a templated endpoint, the data its templates render
    /// (the requests sent are in each attempt's `request`); a full-state declaration carries only
    /// `{"full_state": true, "reason": …, "event_id": …}`.
    #[schema(value_type = WebhookPayload)]
    pub payload: serde_json::Value,
}

page!(DeliveryPage, DeliveryDto, "A page of deliveries, by id ascending.");

/// Delivery states.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum DeliveryState {
    /// Waiting for (another) attempt.
    Pending,
    /// A 2xx answered.
    Succeeded,
    /// Given up (`max_attempts` / `max_age`); replayable.
    Failed,
    /// Replaced by a newer pending MODIFIED of the same Service.
    Superseded,
}

/// Query of `GET /api/v1/deliveries`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeliveryQuery {
    /// Only this endpoint.
    pub webhook: Option<String>,
    /// Only this state.
    #[param(inline)]
    pub state: Option<DeliveryState>,
    /// Only deliveries of this event (an event id, 0 or more; a negative one is a 400, as
    /// `after_id` of `GET /api/v1/events`).
    pub event_id: Option<u64>,
    /// Only Services in this namespace.
    pub namespace: Option<String>,
    /// Only Services with this name.
    pub name: Option<String>,
    /// Page size, 1 to 1000.
    #[param(minimum = 1, maximum = 1000, default = 100)]
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

/// The delivery log, filtered, by id ascending, each with its attempts.
#[utoipa::path(get, path = "/api/v1/deliveries", tag = "deliveries", params(DeliveryQuery),
    responses((status = 200, description = "A page of deliveries", body = DeliveryPage)))]
pub async fn list_deliveries(
    State(state): State<ApiState>,
    Query(q): Query<DeliveryQuery>,
) -> Result<Json<DeliveryPage>, ApiError> {
    let limit = pagination::limit(q.limit)?;
    let filter = DeliveryFilter {
        after_id: pagination::after("deliveries", q.cursor.as_deref())?,
        webhook: q.webhook,
        state: q.state.map(|s| format!("{s:?}").to_lowercase()),
        event_id: q.event_id.map(|v| i64::try_from(v).unwrap_or(i64::MAX)),
        namespace: q.namespace,
        name: q.name,
        limit: Some(i64::try_from(limit + 1).unwrap_or(i64::MAX)),
    };
    let rows = state.store.deliveries(&filter).await?;
    let (rows, next_cursor) = pagination::cut(rows, limit, "deliveries", |d| d.id);
    let ids: Vec<i64> = rows.iter().map(|d| d.id).collect();
    let mut attempts = state.store.attempts_of(&ids).await?.into_iter().peekable();
    let mut items = Vec::with_capacity(rows.len());
    for d in rows {
        let mut own = Vec::new();
        while let Some((_, a)) = attempts.next_if(|(id, _)| *id == d.id) {
            own.push(a.into());
        }
        items.push(dto(d, own));
    }
    Ok(Json(DeliveryPage { items, next_cursor }))
}

/// One delivery with its attempts and the exact body sent.
#[utoipa::path(get, path = "/api/v1/deliveries/{id}", tag = "deliveries",
    params(("id" = i64, Path, description = "Delivery id")),
    responses((status = 200, description = "The delivery", body = DeliveryDetail),
        (status = 404, description = "No such delivery", body = Problem, content_type = "application/problem+json")))]
pub async fn get_delivery(
    State(state): State<ApiState>,
    Path(id): Path<i64>,
) -> Result<Json<DeliveryDetail>, ApiError> {
    let d = state.store.delivery(id).await?.ok_or_else(|| ApiError::NotFound(format!("delivery {id}")))?;
    let attempts = state.store.attempts(id).await?.into_iter().map(AttemptDto::from).collect();
    let payload = serde_json::from_str(&d.payload).unwrap_or(serde_json::Value::Null);
    Ok(Json(DeliveryDetail { delivery: dto(d, attempts), payload }))
}

/// Result of a replay.
#[derive(Debug, Serialize, ToSchema)]
pub struct Replayed {
    /// The delivery replayed.
    pub replayed: i64,
    /// The new delivery: same body, new `webhook-id`, at the end of its Service's queue.
    pub delivery_id: i64,
}

/// Replay one delivery (any state): a copy with the same body and a new `webhook-id` is enqueued at the
/// end of its Service's queue.
#[utoipa::path(post, path = "/api/v1/deliveries/{id}/retry", tag = "deliveries",
    params(("id" = i64, Path, description = "Delivery id")), security(("bearer" = [])),
    responses((status = 202, description = "Enqueued", body = Replayed),
        (status = 404, description = "No such delivery", body = Problem, content_type = "application/problem+json")))]
pub async fn retry(
    State(state): State<ApiState>,
    Path(id): Path<i64>,
) -> Result<(StatusCode, Json<Replayed>), ApiError> {
    let new_id = state.store.replay(id, &crate::store::new_msg_id()).await?;
    let new_id = new_id.ok_or_else(|| ApiError::NotFound(format!("delivery {id}")))?;
    Ok((StatusCode::ACCEPTED, Json(Replayed { replayed: id, delivery_id: new_id })))
}
