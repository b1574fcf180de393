//! Builds the webhook body (the contract's [`WebhookPayload`], documented in docs/reference/webhook.md and as the
//! `WebhookPayload` schema of the OpenAPI document), serialized once at enqueue time so every retry
//! sends (and signs) the same bytes.

use std::sync::Arc;

use vipwatch_contract::{
    Backends, BackendsDiff, Cause, EventKind, PayloadType, SyncMarker, WebhookPayload, WebhookPayloadData,
    WebhookService,
};

use crate::model::{ServiceKey, ServiceView, rfc3339};

/// Everything a payload is built from.
pub struct PayloadInput<'a> {
    /// Event id, if any.
    pub event_id: Option<i64>,
    /// The event log's identity ([`crate::store::Store::log_id`]).
    pub log_id: &'a str,
    /// The cluster (`cluster.name`, resolved at start).
    pub cluster: Option<&'a str>,
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
    /// The view (shared into the payload, not copied).
    pub view: &'a Arc<ServiceView>,
    /// MODIFIED: the previous view.
    pub previous: Option<&'a Arc<ServiceView>>,
    /// MODIFIED: changed fields.
    pub changed: &'a [&'a str],
    /// The members in the endpoint's mode (`None`: mode `none`).
    pub backends: Option<&'a Backends>,
    /// MODIFIED whose members changed in the endpoint's mode: what changed.
    pub backends_diff: Option<&'a BackendsDiff>,
    /// A resync's delivery: which resync, and where in it.
    pub sync: Option<SyncMarker>,
}

/// Serializes the body (compact JSON).
pub fn render(input: &PayloadInput<'_>) -> String {
    serde_json::to_string(&payload(input)).expect("payload serializes")
}

/// The body as a value.
pub fn payload(input: &PayloadInput<'_>) -> WebhookPayload {
    let service = |view: &Arc<ServiceView>, backends: Option<&Backends>| WebhookService {
        namespace: input.key.namespace.to_string(),
        name: input.key.name.to_string(),
        uid: input.uid.to_owned(),
        resource_version: input.resource_version.to_owned(),
        vips: view.vips(),
        view: view.clone(),
        backends: backends.cloned(),
    };
    WebhookPayload {
        kind: input.event.payload_type(),
        timestamp: rfc3339(input.observed_at),
        data: WebhookPayloadData {
            event_id: input.event_id,
            log_id: Some(input.log_id.to_owned()),
            cluster: input.cluster.map(str::to_owned),
            event: input.event,
            cause: input.cause,
            service: Some(service(input.view, input.backends)),
            previous: input.previous.map(|p| service(p, None)),
            changed: input.changed.iter().map(|c| (*c).to_owned()).collect(),
            backends_diff: input.backends_diff.cloned(),
            sync: input.sync.clone(),
        },
    }
}

/// The `sync.completed` body closing a resync (no Service).
pub fn render_completed(observed_at: i64, log_id: &str, cluster: Option<&str>, sync: SyncMarker) -> String {
    let payload = WebhookPayload {
        kind: PayloadType::SyncCompleted,
        timestamp: rfc3339(observed_at),
        data: WebhookPayloadData {
            event_id: None,
            log_id: Some(log_id.to_owned()),
            cluster: cluster.map(str::to_owned),
            event: EventKind::Synced,
            cause: Cause::Resync,
            service: None,
            previous: None,
            changed: Vec::new(),
            backends_diff: None,
            sync: Some(sync),
        },
    };
    serde_json::to_string(&payload).expect("payload serializes")
}
