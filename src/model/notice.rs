//! Messages between the parts that write back to Kubernetes: Kubernetes Events to publish
//! ([`Notice`]) and addresses an appliance chose ([`Assignment`]).

use super::ServiceKey;

/// The finalizer vipwatch puts on the Services it announces: the object stays until every subscribed
/// endpoint acknowledged its DELETED.
pub const FINALIZER: &str = "vipwatch.io/cleanup";

/// Capacity of the queue of Kubernetes Events waiting to be published (notices): a writer that finds
/// it full drops the Event and says so, so a batch never holds more than this many either (see
/// `watch::writer::Plan::note`). client-go's event broadcasters queue at most 1,000 too
/// (`maxQueuedEvents`, tools/record and tools/events) and drop the rest. At 4,096, a first list of
/// 10,000 Services without members published 4,096 `UnAvailableLoadBalancer` Warnings, one request
/// each, while the same Services' first deliveries and finalizer patches were going out (issue 13).
pub const NOTICE_QUEUE: usize = 1000;

/// A Kubernetes Event to publish about a Service (type `Normal` or `Warning`), with the reasons the
/// upstream service controller uses (`EnsuringLoadBalancer`, `EnsuredLoadBalancer`,
/// `SyncLoadBalancerFailed`, `DeletedLoadBalancer`) plus `IPAllocated` / `AllocationFailed`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    /// The Service.
    pub key: ServiceKey,
    /// Its `metadata.uid`.
    pub uid: String,
    /// `Warning` when true, else `Normal`.
    pub warning: bool,
    /// CamelCase reason, e.g. `AllocationFailed`.
    pub reason: &'static str,
    /// Human-readable message.
    pub note: String,
}

/// Addresses returned by an endpoint with `assigns_vip = true` in its 2xx response body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    /// The Service.
    pub key: ServiceKey,
    /// `metadata.uid` of the object the delivery was about.
    pub uid: String,
    /// `{"vips": [...]}`: IP addresses (validated).
    pub addresses: Vec<String>,
    /// `{"hostname": "..."}`.
    pub hostname: Option<String>,
}

/// What the parts downstream of the recorder tell it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Feedback {
    /// An appliance chose a Service's address (relay).
    Assigned(Assignment),
    /// Every subscribed endpoint acknowledged the change that withdrew these pool addresses of this
    /// object (its DELETED, or a MODIFIED that dropped them): they may go to other Services now
    /// (publish).
    Released {
        /// The Service.
        key: ServiceKey,
        /// `metadata.uid` of the object.
        uid: String,
        /// The addresses the change withdrew.
        addresses: Vec<std::net::IpAddr>,
    },
    /// An operator asked to record every deletion the mass-deletion guard holds (API).
    ReleaseHeld,
}
