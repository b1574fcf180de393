//! The webhook contract of vipwatch: exactly what a receiver of its deliveries gets, defined once.
//! The controller serializes these types, the agents (`vipwatch-haproxy`) deserialize them, and the
//! controller's OpenAPI document takes their schemas from here (feature `openapi`).
//!
//! A delivery is a Standard Webhooks POST whose body is a [`WebhookPayload`]:
//! `{"type": "service.modified", "timestamp": "…", "data": {"event_id", "event", "cause", "service",
//! "previous", "changed", "backendsDiff"}}`. `data.service` is a [`WebhookService`]: identity, VIPs,
//! the normalized [`ServiceView`] (camelCase, Kubernetes defaults filled in) and its [`Backends`]
//! (the pool members the appliance sends traffic to).
//!
//! Receivers should acknowledge (2xx) a `type` they do not know: new types are added without a new
//! version (`sync.completed` is one).
//!
//! A receiver that keeps state answers with its identity ([`receiver`]): a new generation means it
//! lost its state, `caught-up: false` that it needs a full resync before it may carry traffic.

mod backends;
#[cfg(feature = "kubernetes")]
mod kubernetes;
mod payload;
pub mod receiver;
mod view;

pub use backends::{
    BackendMode, BackendPort, Backends, BackendsDiff, HealthCheck, HealthCheckScope, Member, MemberChange, MemberState,
};
/// A string of up to 24 bytes stored inline (no allocation), longer ones on the heap: the type of the
/// short, repetitive strings of a [`ServiceView`] and its [`Backends`]. Serialized as a JSON string.
pub use compact_str::{CompactString, ToCompactString};
pub use payload::{Cause, EventKind, PayloadType, SyncMarker, WebhookPayload, WebhookPayloadData, WebhookService};
pub use receiver::{ReceiverIdentity, ReceiverState};
pub use view::{
    AllocatedAddress, Allocation, IngressView, IpFamily, PortView, REQUESTED_IP_ANNOTATIONS, ServiceView, StringMap,
    VipSource, compact_map, object, requested_ip_entries, string_map,
};
