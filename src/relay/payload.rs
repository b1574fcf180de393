//! Builds the webhook body (the contract's [`WebhookPayload`], documented in the README and as the
//! `WebhookPayload` schema of the OpenAPI document), serialized once at enqueue time so every retry
//! sends (and signs) the same bytes.

use vipwatch_contract::{Cause, EventKind, WebhookPayload, WebhookPayloadData, WebhookService};

use crate::model::{ServiceKey, ServiceView};

/// Everything a payload is built from.
pub struct PayloadInput<'a> {
    /// Event id, if any.
    pub event_id: Option<i64>,
    /// `ADDED` / `MODIFIED` / `DELETED` / `SYNCED`.
    pub event: EventKind,
    /// The cause.
    pub cause: Cause,
    /// Observed at (Unix ms).
    pub observed_at: i64,
    /// The Service.
    pub key: &'a ServiceKey,
    /// uid.
    pub uid: &'a str,
    /// resourceVersion.
    pub resource_version: &'a str,
    /// The view.
    pub view: &'a ServiceView,
    /// MODIFIED: the previous view.
    pub previous: Option<&'a ServiceView>,
    /// MODIFIED: changed fields.
    pub changed: &'a [&'a str],
}

/// Serializes the body (compact JSON).
pub fn render(input: &PayloadInput<'_>) -> String {
    serde_json::to_string(&payload(input)).expect("payload serializes")
}

/// The body as a value.
pub fn payload(input: &PayloadInput<'_>) -> WebhookPayload {
    let service = |view: &ServiceView| WebhookService {
        namespace: input.key.namespace.clone(),
        name: input.key.name.clone(),
        uid: input.uid.to_owned(),
        resource_version: input.resource_version.to_owned(),
        vips: view.vips(),
        view: view.clone(),
        backends: None,
    };
    WebhookPayload {
        kind: input.event.payload_type(),
        timestamp: rfc3339(input.observed_at),
        data: WebhookPayloadData {
            event_id: input.event_id,
            event: input.event,
            cause: input.cause,
            service: Some(service(input.view)),
            previous: input.previous.map(service),
            changed: input.changed.iter().map(|c| (*c).to_owned()).collect(),
            backends_diff: None,
            sync: None,
        },
    }
}

/// Unix ms → RFC 3339 UTC with milliseconds (`2026-11-29T23:05:00.123Z`).
pub fn rfc3339(ms: i64) -> String {
    let ts = jiff::Timestamp::from_millisecond(ms).unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    format!("{ts:.3}")
}
