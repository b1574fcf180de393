//! The body of a delivery: `{"type", "timestamp", "data"}` (Standard Webhooks' recommended shape),
//! serialized once when the delivery is enqueued, so every retry sends and signs the same bytes.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::backends::{Backends, BackendsDiff};
use crate::view::ServiceView;

/// `type` of a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum PayloadType {
    /// A Service entered scope.
    #[serde(rename = "service.added")]
    ServiceAdded,
    /// A Service changed (see `data.changed`).
    #[serde(rename = "service.modified")]
    ServiceModified,
    /// A Service left scope: remove its VIPs.
    #[serde(rename = "service.deleted")]
    ServiceDeleted,
    /// Part of a full resync: the current state of one Service (`data.sync` says which resync).
    #[serde(rename = "service.synced")]
    ServiceSynced,
    /// The end of a full resync: `data.sync.total` Services were re-sent under `data.sync.id`; once a
    /// receiver has all of them it may remove whatever that resync did not include. Carries no
    /// `data.service`.
    #[serde(rename = "sync.completed")]
    SyncCompleted,
}

impl PayloadType {
    /// The wire name, e.g. `service.added`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ServiceAdded => "service.added",
            Self::ServiceModified => "service.modified",
            Self::ServiceDeleted => "service.deleted",
            Self::ServiceSynced => "service.synced",
            Self::SyncCompleted => "sync.completed",
        }
    }
}

/// `data.event`: the event-log type of the change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "UPPERCASE")]
pub enum EventKind {
    /// The Service entered scope (created, or its type/class moved into scope).
    Added,
    /// An LB-relevant field, a label, an annotation, the VIP allocation or the members changed.
    Modified,
    /// The Service left scope (deleted, or its type/class moved out).
    Deleted,
    /// A full resync (no event behind it).
    Synced,
}

impl EventKind {
    /// `ADDED`, `MODIFIED`, `DELETED` or `SYNCED`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
            Self::Synced => "SYNCED",
        }
    }

    /// The payload `type` of this kind (`sync.completed` has no kind of its own).
    pub fn payload_type(self) -> PayloadType {
        match self {
            Self::Added => PayloadType::ServiceAdded,
            Self::Modified => PayloadType::ServiceModified,
            Self::Deleted => PayloadType::ServiceDeleted,
            Self::Synced => PayloadType::ServiceSynced,
        }
    }
}

/// Why a change was recorded (`data.cause`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Cause {
    /// A watch event.
    Watch,
    /// The difference found by a re-list (after a `410 Gone`, a broken stream, or periodically).
    Relist,
    /// The difference found by the first list after vipwatch started (changes made while it was down).
    Startup,
    /// An address freed up for a Service that was waiting for one.
    Allocation,
    /// An endpoint with `assigns_vip` returned the Service's address.
    Appliance,
    /// The Service's members changed (EndpointSlices or Nodes), coalesced over a short window.
    Backends,
    /// A full resync asked for through the API or `vipwatch resync`.
    Resync,
}

impl Cause {
    /// The wire and event-log spelling, e.g. `watch`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Watch => "watch",
            Self::Relist => "relist",
            Self::Startup => "startup",
            Self::Allocation => "allocation",
            Self::Appliance => "appliance",
            Self::Backends => "backends",
            Self::Resync => "resync",
        }
    }

    /// The inverse of [`Self::as_str`].
    pub fn parse(s: &str) -> Option<Self> {
        [Self::Watch, Self::Relist, Self::Startup, Self::Allocation, Self::Appliance, Self::Backends, Self::Resync]
            .into_iter()
            .find(|c| c.as_str() == s)
    }
}

/// Which full resync a `service.synced` or `sync.completed` delivery belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SyncMarker {
    /// `sync_` + 32 hex digits, the same on every delivery of one resync to one endpoint.
    pub id: String,
    /// 1-based position of this Service in the resync; `null` on `sync.completed`.
    pub index: Option<u64>,
    /// How many Services the resync sends.
    pub total: u64,
    /// The newest event-log id the resync's snapshot includes: a Service whose last change came with a
    /// higher event id was added after it, and must not be removed for missing from the resync.
    #[serde(default)]
    pub as_of_event_id: Option<i64>,
}

/// The Service in a delivery: identity, VIPs, the normalized view's fields and the members.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct WebhookService {
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.resourceVersion` of the change.
    pub resource_version: String,
    /// The VIP addresses (see `ServiceView::vips`): what the appliance binds.
    pub vips: Vec<String>,
    /// The normalized view's fields.
    // Shared (`Arc`, serialized and deserialized as the view itself): the controller renders each
    // delivery from the view its event already holds, without a deep copy per delivery.
    #[serde(flatten)]
    #[cfg_attr(feature = "openapi", schema(value_type = ServiceView))]
    pub view: Arc<ServiceView>,
    /// The pool members in the endpoint's backend mode; `null` when members are not computed (mode
    /// `none`) and always `null` in `data.previous`.
    #[serde(default)]
    pub backends: Option<Backends>,
}

/// `data` of a delivery.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WebhookPayloadData {
    /// Event-log id; `null` for `service.synced` and `sync.completed`.
    pub event_id: Option<i64>,
    /// The identity of the event log `event_id` and `sync.as_of_event_id` belong to: a UUID made
    /// with vipwatch's database. Event ids compare only between deliveries with the same `log_id`
    /// (a replaced database counts from 1 again, under a new one). Absent from vipwatch before 0.1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_id: Option<String>,
    /// The cluster the Service lives in: vipwatch's `cluster.name`, a DNS-1123 label. A Service is
    /// identified by cluster, namespace and name: an appliance serving several clusters keys its
    /// objects by all three. Absent from vipwatch before 0.2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// `ADDED`, `MODIFIED`, `DELETED` or `SYNCED`.
    pub event: EventKind,
    /// Why it was recorded.
    pub cause: Cause,
    /// The Service after the change (the last view for DELETED); absent on `sync.completed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<WebhookService>,
    /// MODIFIED: the Service before (without `backends`); otherwise `null`.
    pub previous: Option<WebhookService>,
    /// MODIFIED: the changed field names (e.g. `["ports"]`, `["backends"]`); otherwise empty.
    pub changed: Vec<String>,
    /// MODIFIED with `backends` in `changed`: the members added, removed and changed since the
    /// previous revision; otherwise absent.
    #[serde(rename = "backendsDiff", default, skip_serializing_if = "Option::is_none")]
    pub backends_diff: Option<BackendsDiff>,
    /// `service.synced` and `sync.completed`: the resync this delivery belongs to; otherwise absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync: Option<SyncMarker>,
}

/// The body vipwatch POSTs to each webhook endpoint (Standard Webhooks; signed with the `webhook-id`,
/// `webhook-timestamp` and `webhook-signature` headers).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WebhookPayload {
    /// `service.added`, `service.modified`, `service.deleted`, `service.synced` or `sync.completed`.
    #[serde(rename = "type")]
    pub kind: PayloadType,
    /// When the change was observed, RFC 3339 UTC with milliseconds.
    #[cfg_attr(feature = "openapi", schema(format = DateTime))]
    pub timestamp: String,
    /// The change.
    pub data: WebhookPayloadData,
}
