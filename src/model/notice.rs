//! Messages between the parts that write back to Kubernetes: Kubernetes Events to publish
//! ([`Notice`]) and addresses an appliance chose ([`Assignment`]).

use super::ServiceKey;

/// The finalizer vipwatch puts on the Services it announces: the object stays until every subscribed
/// endpoint acknowledged its DELETED.
pub const FINALIZER: &str = "vipwatch.io/cleanup";

/// Capacity of the queue of Kubernetes Events waiting to be published (notices): a writer that finds
/// it full drops the Event and says so, so a batch never holds more than this many either (see
/// `watch::recorder::Notices::note`). client-go's event broadcasters queue at most 1,000 too
/// (`maxQueuedEvents`, tools/record and tools/events) and drop the rest. A larger queue would let a
/// first list of many Services without members publish thousands of Warnings, one request each,
/// while the same Services' first deliveries and finalizer patches go out.
pub const NOTICE_QUEUE: usize = 1000;

/// Why a Kubernetes Event about a Service is published: its `reason`, which fixes its type and
/// `action`. The first four are the upstream service controller's reasons, used as it uses them;
/// [`Reason::meaning`] says when each is published.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The change is on its way to the appliance.
    EnsuringLoadBalancer,
    /// The appliance has it; the status is written.
    EnsuredLoadBalancer,
    /// A delivery failed.
    SyncLoadBalancerFailed,
    /// The appliance acknowledged the DELETED.
    DeletedLoadBalancer,
    /// Addresses allocated from a pool.
    IPAllocated,
    /// No VIP could be allocated.
    AllocationFailed,
    /// The mass-deletion guard holds the deletion.
    DeletionHeld,
    /// A mode's pool members became empty.
    UnAvailableLoadBalancer,
    /// The backend-mode annotation has an unknown value.
    InvalidBackendMode,
}

impl Reason {
    /// Every reason, in the order the reference lists them.
    pub const ALL: [Reason; 9] = [
        Self::EnsuringLoadBalancer,
        Self::EnsuredLoadBalancer,
        Self::SyncLoadBalancerFailed,
        Self::DeletedLoadBalancer,
        Self::IPAllocated,
        Self::AllocationFailed,
        Self::DeletionHeld,
        Self::UnAvailableLoadBalancer,
        Self::InvalidBackendMode,
    ];

    /// The Event's `reason` (CamelCase).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::EnsuringLoadBalancer => "EnsuringLoadBalancer",
            Self::EnsuredLoadBalancer => "EnsuredLoadBalancer",
            Self::SyncLoadBalancerFailed => "SyncLoadBalancerFailed",
            Self::DeletedLoadBalancer => "DeletedLoadBalancer",
            Self::IPAllocated => "IPAllocated",
            Self::AllocationFailed => "AllocationFailed",
            Self::DeletionHeld => "DeletionHeld",
            Self::UnAvailableLoadBalancer => "UnAvailableLoadBalancer",
            Self::InvalidBackendMode => "InvalidBackendMode",
        }
    }

    /// Whether the Event is a `Warning` (else `Normal`).
    pub fn warning(self) -> bool {
        matches!(
            self,
            Self::SyncLoadBalancerFailed
                | Self::AllocationFailed
                | Self::DeletionHeld
                | Self::UnAvailableLoadBalancer
                | Self::InvalidBackendMode
        )
    }

    /// When it is published and what follows, for the reference.
    pub fn meaning(self) -> &'static str {
        match self {
            Self::EnsuringLoadBalancer => {
                "A new Service, or a change of what its load balancer is made of (not of its labels alone nor of \
                 its members alone), is on its way to the appliance."
            }
            Self::EnsuredLoadBalancer => {
                "Every subscribed endpoint acknowledged the change, and the address is written into \
                 `status.loadBalancer.ingress` (the note names it)."
            }
            Self::SyncLoadBalancerFailed => {
                "A delivery to an endpoint failed (for good, or its last attempt); the note names the endpoint, \
                 the delivery and the error. The status stays as it was."
            }
            Self::DeletedLoadBalancer => {
                "Every subscribed endpoint acknowledged the Service's DELETED; vipwatch's finalizer is removed."
            }
            Self::IPAllocated => {
                "The Service got new addresses (the note names them and where each comes from: `Assigned \
                 192.0.2.10 from pool lab`, or `Assigned 192.0.2.5 from pool v4, 2001:db8::51 from pool v6` \
                 when requested addresses come from two pools, or `by the appliance`)."
            }
            Self::AllocationFailed => {
                "The Service gets no VIP; the note says why: an address outside every pool or taken by another \
                 Service, an unknown pool, a pool that does not accept the namespace, an exhausted pool. It gets \
                 one as soon as one frees up."
            }
            Self::DeletionHeld => {
                "The mass-deletion guard holds the Service's deletion (one list would have deleted too many \
                 Services at once); nothing is sent until a later list confirms it or it is released through \
                 the API."
            }
            Self::UnAvailableLoadBalancer => {
                "A backend mode's pool members became empty (no eligible Node, no ready endpoint, no \
                 nodePort); the note says why."
            }
            Self::InvalidBackendMode => {
                "The `vipwatch.io/backend-mode` annotation has a value other than `nodePort`, `pod` or `none`; \
                 it is ignored and the configured mode applies."
            }
        }
    }

    /// The Event's `action`: what vipwatch was doing (`Allocate`, `Delete`, `Hold`, `Sync`).
    pub fn action(self) -> &'static str {
        match self {
            Self::IPAllocated | Self::AllocationFailed => "Allocate",
            Self::DeletedLoadBalancer => "Delete",
            Self::DeletionHeld => "Hold",
            _ => "Sync",
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A Kubernetes Event to publish about a Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    /// The Service.
    pub key: ServiceKey,
    /// Its `metadata.uid`.
    pub uid: String,
    /// Why: the reason, hence the type and action.
    pub reason: Reason,
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
