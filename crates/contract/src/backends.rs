//! Pool members: where the appliance sends a Service's traffic (`data.service.backends`), and what
//! changed since the previous revision (`data.backendsDiff`). Rules in docs/how-to/backends.md.

use compact_str::CompactString;
use serde::{Deserialize, Serialize};

/// How a Service's members are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub enum BackendMode {
    /// The eligible Nodes' primary addresses × each port's `nodePort` (kube-proxy forwards).
    NodePort,
    /// The ready (and draining) endpoints of the Service's EndpointSlices: Pod addresses and target
    /// ports (the appliance must route to Pods).
    Pod,
}

impl BackendMode {
    /// `nodePort` or `pod`: the config and annotation spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NodePort => "nodePort",
            Self::Pod => "pod",
        }
    }

    /// Parses `nodePort` or `pod` (exact spelling); `None` for anything else.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "nodePort" => Some(Self::NodePort),
            "pod" => Some(Self::Pod),
            _ => None,
        }
    }
}

/// Whether a member takes new connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum MemberState {
    /// Ready: send it traffic.
    Active,
    /// Terminating but still serving: finish its connections, send it no new ones (AS3 `adminState:
    /// disable`, NetScaler graceful disable, HAProxy `state drain`).
    Draining,
}

/// One pool member.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Member {
    /// IPv4 or IPv6 address: the Node's (mode `nodePort`) or the Pod's (mode `pod`).
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub address: CompactString,
    /// Where to connect on `address`: the `nodePort`, or the Pod's target port (from its
    /// EndpointSlice, so a named `targetPort` can differ from Pod to Pod).
    pub port: i32,
    /// `active` or `draining`.
    pub state: MemberState,
    /// The Node it runs on, when known.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub node_name: Option<CompactString>,
    /// Its zone (`topology.kubernetes.io/zone` of the Node, or the endpoint's `zone`), when known.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub zone: Option<CompactString>,
}

/// The members behind one Service port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct BackendPort {
    /// The Service port's name (`None` for a single unnamed port).
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub name: Option<CompactString>,
    /// `TCP`, `UDP` or `SCTP`.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub protocol: CompactString,
    /// The Service port (what the VIP listens on).
    pub port: i32,
    /// The members, in canonical order: by address (IPv4 before IPv6, numerically), then port.
    pub members: Vec<Member>,
}

/// Whose health an appliance probe measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum HealthCheckScope {
    /// `healthCheckNodePort` (`externalTrafficPolicy: Local`): 200 only on Nodes with a ready local
    /// endpoint of this Service.
    Service,
    /// kube-proxy's own `/healthz` (`externalTrafficPolicy: Cluster`): the Node can forward.
    Node,
}

/// The health check the appliance should run against every member's address (mode `nodePort`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct HealthCheck {
    /// Always `HTTP` (a GET expecting 200).
    pub protocol: String,
    /// The port to probe on the member's address.
    pub port: i32,
    /// The path to GET, `/healthz`.
    pub path: String,
    /// `service` or `node`.
    pub scope: HealthCheckScope,
}

/// A Service's pool members in one mode, at one revision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Backends {
    /// `nodePort` or `pod`.
    pub mode: BackendMode,
    /// Bumped by one whenever `hash` changes (starts at 1); a receiver that sees a gap missed a change.
    pub revision: u64,
    /// `sha256:` + 64 hex digits over the canonical member set (mode, health check, reason, ports and
    /// their members): equal sets have equal hashes, so a receiver can skip what it already applied.
    pub hash: String,
    /// What the appliance should probe (mode `nodePort`), else `null`.
    pub health_check: Option<HealthCheck>,
    /// Why there are no members, when that is by design (e.g. `allocateLoadBalancerNodePorts: false`
    /// in mode `nodePort`), else `null`.
    pub reason: Option<String>,
    /// One entry per Service port, in the Service's order.
    pub ports: Vec<BackendPort>,
}

impl Backends {
    /// Every member of every port, with its port.
    pub fn members(&self) -> impl Iterator<Item = (&BackendPort, &Member)> {
        self.ports.iter().flat_map(|p| p.members.iter().map(move |m| (p, m)))
    }
}

/// One member in a [`BackendsDiff`].
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct MemberChange {
    /// The Service port it is behind.
    pub service_port: i32,
    /// That port's protocol.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub protocol: CompactString,
    /// The member's address.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub address: CompactString,
    /// The member's port.
    pub port: i32,
    /// Its state now (for `removed`: the state it had).
    pub state: MemberState,
}

/// What changed between two revisions of a Service's members (`data.backendsDiff` of a MODIFIED
/// whose `changed` lists `backends`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct BackendsDiff {
    /// The revision the diff starts from (0: there were none).
    pub from_revision: u64,
    /// The revision it leads to (`data.service.backends.revision`).
    pub to_revision: u64,
    /// Members that are new.
    pub added: Vec<MemberChange>,
    /// Members that are gone.
    pub removed: Vec<MemberChange>,
    /// Members whose state (or Node, or zone) changed, with their new state.
    pub changed: Vec<MemberChange>,
}
