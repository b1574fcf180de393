//! `GET /api/v1/webhooks[/{name}]` (configured endpoints, secrets and header values redacted, with
//! health), `POST /api/v1/webhooks/{name}/resync`, `POST /api/v1/webhooks/{name}/enable` and
//! `POST /api/v1/webhooks/{name}/confirm-removal` (the full-state removal guard).

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
use crate::config::{WebhookConfig, redact_url};
use crate::route::{self, RouteError};
use crate::store::CircuitState;
use crate::store::now_ms;

/// What replaces every secret value.
const REDACTED: &str = "<redacted>";

/// One configured endpoint and its health.
#[derive(Debug, Serialize, ToSchema)]
pub struct WebhookDto {
    /// Endpoint name.
    pub name: String,
    /// Target URL; a password and query values are replaced by `REDACTED`.
    pub url: String,
    /// Event types sent.
    pub events: Vec<String>,
    /// Only Services in these namespaces (empty: all).
    pub namespaces: Vec<String>,
    /// Only Services whose labels match.
    pub label_selector: String,
    /// Always `<redacted>`.
    pub secret: String,
    /// Extra header names, each value `<redacted>`.
    pub headers: BTreeMap<String, String>,
    /// The appliance this endpoint is one host of (`appliance` in its config; `null`: an appliance of
    /// its own). Its hosts each get every delivery; `pending` and `oldest_pending_age_seconds` say
    /// which host is behind and by how much.
    pub appliance: Option<String>,
    /// Whether deliveries are sent: enabled in the config and not disabled by a 410.
    pub enabled: bool,
    /// Why not: `config` (`enabled = false`) or the reason recorded on a 410; `null` when enabled.
    pub disabled_reason: Option<String>,
    /// When it was disabled by a 410 (RFC 3339).
    #[schema(format = DateTime)]
    pub disabled_at: Option<String>,
    /// Pending deliveries.
    pub pending: i64,
    /// Age of the oldest pending delivery in seconds (`null` when none is pending).
    pub oldest_pending_age_seconds: Option<f64>,
    /// Start of the newest 2xx attempt (RFC 3339).
    #[schema(format = DateTime)]
    pub last_success_at: Option<String>,
    /// Start of the newest failed attempt (RFC 3339).
    #[schema(format = DateTime)]
    pub last_failure_at: Option<String>,
    /// The circuit breaker: `closed` (deliveries go out), `open` (the endpoint is down: deliveries
    /// wait, one probe goes out at `next_probe_at`) or `half_open` (the probe is in flight).
    pub circuit: CircuitDto,
    /// Attempts in a row that found the endpoint down (no answer, redirect, 5xx, 401, 403, 408, 429);
    /// `relay.circuit_failures` of them open the circuit. Reset by any other answer.
    pub consecutive_failures: u32,
    /// When the circuit opened (RFC 3339; `null` while closed).
    #[schema(format = DateTime)]
    pub open_since: Option<String>,
    /// When the next probe may go out (RFC 3339; `null` while closed or while the probe is in flight).
    #[schema(format = DateTime)]
    pub next_probe_at: Option<String>,
    /// Until when the endpoint asked not to be sent anything (a 429 or 503 with `Retry-After`, clamped
    /// to its `retry.max_delay`): no delivery to it starts before then (RFC 3339; `null` unless that
    /// time is still to come).
    #[schema(format = DateTime)]
    pub throttled_until: Option<String>,
}

/// State of an endpoint's circuit breaker.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CircuitDto {
    /// Deliveries go out as usual.
    Closed,
    /// The endpoint is down: deliveries wait; one probe goes out at `next_probe_at`.
    Open,
    /// The probe is in flight; nothing else goes out.
    HalfOpen,
}

impl From<CircuitState> for CircuitDto {
    fn from(s: CircuitState) -> Self {
        match s {
            CircuitState::Closed => Self::Closed,
            CircuitState::Open => Self::Open,
            CircuitState::HalfOpen => Self::HalfOpen,
        }
    }
}

page!(WebhookPage, WebhookDto, "A page of endpoints, by name.");

/// Query of `GET /api/v1/webhooks`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct WebhookQuery {
    /// Page size, 1 to 1000.
    #[param(minimum = 1, maximum = 1000, default = 100)]
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

async fn health(state: &ApiState, w: &WebhookConfig) -> Result<WebhookDto, ApiError> {
    let disabled = state.store.webhook_state(&w.name).await?.filter(|s| s.disabled_reason.is_some());
    let depth = state.store.outbox_depth().await?.into_iter().find(|(name, _, _)| *name == w.name);
    let activity = state.store.webhook_activity(&w.name).await?;
    let now = now_ms();
    let circuit = state.circuits.get(&w.name);
    Ok(WebhookDto {
        name: w.name.clone(),
        url: redact_url(&w.url),
        events: w.events.clone(),
        namespaces: w.namespaces.clone(),
        label_selector: w.label_selector.clone(),
        secret: REDACTED.to_owned(),
        headers: w.headers.keys().map(|k| (k.clone(), REDACTED.to_owned())).collect(),
        appliance: w.appliance.clone(),
        enabled: w.enabled && disabled.is_none(),
        disabled_reason: if w.enabled {
            disabled.as_ref().and_then(|s| s.disabled_reason.clone())
        } else {
            Some("config".into())
        },
        disabled_at: disabled.and_then(|s| s.disabled_at).map(rfc3339),
        pending: depth.as_ref().map_or(0, |d| d.1),
        oldest_pending_age_seconds: depth.map(|d| (now - d.2).max(0) as f64 / 1000.0),
        last_success_at: activity.last_success_at.map(rfc3339),
        last_failure_at: activity.last_failure_at.map(rfc3339),
        circuit: circuit.state.into(),
        consecutive_failures: circuit.consecutive_failures,
        open_since: circuit.open_since.map(rfc3339),
        next_probe_at: circuit.next_probe_at.map(rfc3339),
        throttled_until: circuit.throttled_until.filter(|until| *until > now).map(rfc3339),
    })
}

fn configured<'a>(state: &'a ApiState, name: &str) -> Result<&'a WebhookConfig, ApiError> {
    state.config.webhooks.iter().find(|w| w.name == name).ok_or_else(|| ApiError::NotFound(format!("webhook `{name}`")))
}

/// The configured endpoints with their health, by name.
#[utoipa::path(get, path = "/api/v1/webhooks", tag = "webhooks", params(WebhookQuery),
    responses((status = 200, description = "A page of endpoints", body = WebhookPage)))]
pub async fn list_webhooks(
    State(state): State<ApiState>,
    Query(q): Query<WebhookQuery>,
) -> Result<Json<WebhookPage>, ApiError> {
    let limit = pagination::limit(q.limit)?;
    let after: Option<String> = pagination::after("webhooks", q.cursor.as_deref())?;
    let mut names: Vec<&WebhookConfig> = state.config.webhooks.iter().collect();
    names.sort_by(|a, b| a.name.cmp(&b.name));
    let rows: Vec<&WebhookConfig> =
        names.into_iter().filter(|w| after.as_ref().is_none_or(|a| w.name > *a)).take(limit + 1).collect();
    let (rows, next_cursor) = pagination::cut(rows, limit, "webhooks", |w| w.name.clone());
    let mut items = Vec::with_capacity(rows.len());
    for w in rows {
        items.push(health(&state, w).await?);
    }
    Ok(Json(WebhookPage { items, next_cursor }))
}

/// One configured endpoint with its health.
#[utoipa::path(get, path = "/api/v1/webhooks/{name}", tag = "webhooks",
    params(("name" = String, Path, description = "Endpoint name")),
    responses((status = 200, description = "The endpoint", body = WebhookDto),
        (status = 404, description = "No such endpoint in the configuration", body = Problem, content_type = "application/problem+json")))]
pub async fn get_webhook(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Json<WebhookDto>, ApiError> {
    let w = configured(&state, &name)?;
    Ok(Json(health(&state, w).await?))
}

/// Result of a resync.
#[derive(Debug, Serialize, ToSchema)]
pub struct Resynced {
    /// Endpoint name.
    pub webhook: String,
    /// `service.synced` deliveries enqueued (one per in-scope Service the endpoint accepts).
    pub enqueued: u64,
}

/// Enqueue a `service.synced` delivery with the current view of every in-scope Service.
#[utoipa::path(post, path = "/api/v1/webhooks/{name}/resync", tag = "webhooks",
    params(("name" = String, Path, description = "Endpoint name")), security(("bearer" = [])),
    responses((status = 202, description = "Enqueued", body = Resynced),
        (status = 404, description = "No such endpoint", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The endpoint is disabled in the configuration", body = Problem, content_type = "application/problem+json")))]
pub async fn resync(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<(StatusCode, Json<Resynced>), ApiError> {
    if !configured(&state, &name)?.enabled {
        return Err(ApiError::WebhookDisabled(name));
    }
    let done = route::resync(&state.store, &state.config, Some(&name)).await.map_err(|e| match e {
        RouteError::Store(e) => ApiError::Store(e),
        RouteError::UnknownWebhook(n) => ApiError::NotFound(format!("webhook `{n}`")),
        RouteError::Endpoint { name, .. } => ApiError::WebhookDisabled(name),
    })?;
    let enqueued = done.into_iter().map(|(_, n)| n as u64).sum();
    Ok((StatusCode::ACCEPTED, Json(Resynced { webhook: name, enqueued })))
}

/// Result of re-enabling an endpoint.
#[derive(Debug, Serialize, ToSchema)]
pub struct Enabled {
    /// Endpoint name.
    pub webhook: String,
    /// Whether it had been disabled by a 410 (`false`: it was already enabled).
    pub was_disabled: bool,
}

/// Re-enable an endpoint disabled by a 410 Gone; its pending deliveries are sent again.
#[utoipa::path(post, path = "/api/v1/webhooks/{name}/enable", tag = "webhooks",
    params(("name" = String, Path, description = "Endpoint name")), security(("bearer" = [])),
    responses((status = 200, description = "Enabled", body = Enabled),
        (status = 404, description = "No such endpoint", body = Problem, content_type = "application/problem+json")))]
pub async fn enable(State(state): State<ApiState>, Path(name): Path<String>) -> Result<Json<Enabled>, ApiError> {
    configured(&state, &name)?;
    let was_disabled = state.store.enable_webhook(&name).await?;
    Ok(Json(Enabled { webhook: name, was_disabled }))
}

/// Result of confirming a held full-state declaration.
#[derive(Debug, Serialize, ToSchema)]
pub struct RemovalConfirmed {
    /// Endpoint name.
    pub webhook: String,
    /// Services the confirmed declaration removes from the appliance.
    pub removed: i64,
    /// Services the appliance was last told.
    pub of: i64,
}

/// Confirm the declaration a full-state endpoint's removal guard holds (it removes more than
/// `max_removal` of what the appliance was last told): it goes out at once. Only that exact set of
/// Services is confirmed; a different one is judged again.
#[utoipa::path(post, path = "/api/v1/webhooks/{name}/confirm-removal", tag = "webhooks",
    params(("name" = String, Path, description = "Endpoint name")), security(("bearer" = [])),
    responses((status = 200, description = "Confirmed; the declaration is due now", body = RemovalConfirmed),
        (status = 404, description = "No such endpoint", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Nothing is held for this endpoint", body = Problem, content_type = "application/problem+json")))]
pub async fn confirm_removal(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Json<RemovalConfirmed>, ApiError> {
    configured(&state, &name)?;
    match state.store.full_state_confirm(&name).await? {
        Some((removed, of)) => {
            tracing::warn!(webhook = %name, removed, of, "held full-state declaration confirmed through the API");
            Ok(Json(RemovalConfirmed { webhook: name, removed, of }))
        }
        None => Err(ApiError::NothingHeld(name)),
    }
}
