//! The webhook body (documented in the README and as the `WebhookPayload` schema of the OpenAPI
//! document): `{"type", "timestamp", "data": {"event_id", "event", "cause", "service", "previous",
//! "changed"}}`, serialized once at enqueue time so every retry sends (and signs) the same bytes.

use serde::Serialize;

use crate::model::{ServiceKey, ServiceView};

/// The Service as sent: identity, the normalized view (camelCase) and its VIPs.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServicePayload<'a> {
    /// Namespace.
    pub namespace: &'a str,
    /// Name.
    pub name: &'a str,
    /// `metadata.uid`.
    pub uid: &'a str,
    /// `metadata.resourceVersion` of the change.
    pub resource_version: &'a str,
    /// VIP addresses (published ingress first, then requested), see `ServiceView::vips`.
    pub vips: Vec<String>,
    /// The rest of the normalized view.
    #[serde(flatten)]
    pub view: &'a ServiceView,
}

/// `data` of the body.
#[derive(Debug, Clone, Serialize)]
pub struct Data<'a> {
    /// Event-log id (`null` for `service.synced`).
    pub event_id: Option<i64>,
    /// `ADDED`, `MODIFIED`, `DELETED` or `SYNCED`.
    pub event: &'a str,
    /// `watch`, `relist`, `startup` or `resync`.
    pub cause: &'a str,
    /// The Service after the change (the last view for DELETED).
    pub service: ServicePayload<'a>,
    /// MODIFIED: the Service before (its own `vips` included); otherwise `null`.
    pub previous: Option<ServicePayload<'a>>,
    /// MODIFIED: changed field names; otherwise empty.
    pub changed: &'a [&'a str],
}

/// The whole body.
#[derive(Debug, Clone, Serialize)]
pub struct Payload<'a> {
    /// `service.added`, `service.modified`, `service.deleted` or `service.synced`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// When the change was observed, RFC 3339 UTC with milliseconds.
    pub timestamp: String,
    /// The change.
    pub data: Data<'a>,
}

/// Everything a payload is built from.
pub struct PayloadInput<'a> {
    /// Event id, if any.
    pub event_id: Option<i64>,
    /// `ADDED` / `MODIFIED` / `DELETED` / `SYNCED`.
    pub event: &'a str,
    /// The cause.
    pub cause: &'a str,
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

/// The `type` for an event kind.
pub fn type_for(event: &str) -> &'static str {
    match event {
        "ADDED" => "service.added",
        "MODIFIED" => "service.modified",
        "DELETED" => "service.deleted",
        _ => "service.synced",
    }
}

/// Serializes the body (compact JSON).
pub fn render(input: &PayloadInput<'_>) -> String {
    fn service<'a>(input: &'a PayloadInput<'a>, view: &'a ServiceView) -> ServicePayload<'a> {
        ServicePayload {
            namespace: &input.key.namespace,
            name: &input.key.name,
            uid: input.uid,
            resource_version: input.resource_version,
            vips: view.vips(),
            view,
        }
    }
    let payload = Payload {
        kind: type_for(input.event),
        timestamp: rfc3339(input.observed_at),
        data: Data {
            event_id: input.event_id,
            event: input.event,
            cause: input.cause,
            service: service(input, input.view),
            previous: input.previous.map(|p| service(input, p)),
            changed: input.changed,
        },
    };
    serde_json::to_string(&payload).expect("payload serializes")
}

/// Unix ms → RFC 3339 UTC with milliseconds (`2026-11-29T23:05:00.123Z`).
pub fn rfc3339(ms: i64) -> String {
    let ts = jiff::Timestamp::from_millisecond(ms).unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    format!("{ts:.3}")
}
