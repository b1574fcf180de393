//! Computing a Service's members in one mode from the [`BackendIndex`]: one pure function per mode,
//! re-run whenever an input changes. Rules: docs/how-to/backends.md.
//!
//! - `nodePort`: every eligible Node (readiness ignored) × each port's `nodePort`, at the Node's
//!   primary address of each family the Service uses. `externalTrafficPolicy: Local` adds the health
//!   check `healthCheckNodePort /healthz` (scope `service`) and, with `local_endpoints_only`, keeps only
//!   Nodes hosting a ready endpoint (a Node with only terminating-but-serving endpoints is `draining`);
//!   `Cluster` hints kube-proxy's `/healthz` (scope `node`). No nodePort at all: no members, and
//!   `reason` says why.
//! - `pod`: the endpoints of the Service's slices of its families, per Service port matched by name and
//!   protocol, with the slice's port number; duplicates across slices are one member (the most alive
//!   copy wins).
//!
//! Members are sorted by address (numerically, IPv4 first) and port, so the hash only depends on the
//! set.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use sha2::{Digest, Sha256};
use vipwatch_contract::{BackendMode, BackendPort, Backends, HealthCheck, HealthCheckScope, Member, MemberState};
use vipwatch_contract::{CompactString, ToCompactString};

use super::index::BackendIndex;
use crate::model::{ServiceKey, ServiceView};

/// The settings the computation takes from `[backends]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberRules {
    /// Node address types by preference (`InternalIP`, `ExternalIP`).
    pub address_types: Vec<String>,
    /// `externalTrafficPolicy: Local` in mode `nodePort`: only Nodes hosting a ready endpoint.
    pub local_endpoints_only: bool,
    /// kube-proxy's health port hinted for `externalTrafficPolicy: Cluster` (0 = no hint).
    pub kube_proxy_health_port: u16,
}

/// The members of `key` (with `view`) in `mode`, at revision 0 (the caller numbers revisions).
pub fn compute(
    key: &ServiceKey,
    view: &ServiceView,
    mode: BackendMode,
    rules: &MemberRules,
    index: &BackendIndex,
) -> Backends {
    let (health_check, reason, ports) = match mode {
        BackendMode::NodePort => node_ports(key, view, rules, index),
        BackendMode::Pod => (None, None, pod_ports(key, view, index)),
    };
    let hash = hash(mode, health_check.as_ref(), reason.as_deref(), &ports);
    Backends { mode, revision: 0, hash, health_check, reason, ports }
}

type Computed = (Option<HealthCheck>, Option<String>, Vec<BackendPort>);

fn node_ports(key: &ServiceKey, view: &ServiceView, rules: &MemberRules, index: &BackendIndex) -> Computed {
    let local = view.external_traffic_policy.as_deref() == Some("Local");
    let check = |port: i32, scope| HealthCheck { protocol: "HTTP".into(), port, path: "/healthz".into(), scope };
    let health_check = if local {
        view.health_check_node_port.map(|p| check(p, HealthCheckScope::Service))
    } else {
        (rules.kube_proxy_health_port != 0)
            .then(|| check(i32::from(rules.kube_proxy_health_port), HealthCheckScope::Node))
    };
    let reason = view.ports.iter().all(|p| p.node_port.is_none()).then(|| {
        if view.allocate_load_balancer_node_ports == Some(false) {
            "allocateLoadBalancerNodePorts is false: the Service has no nodePort to send traffic to".to_owned()
        } else {
            format!("the Service has no nodePort (type {})", view.service_type)
        }
    });
    let local_states = (local && rules.local_endpoints_only).then(|| local_states(key, index));
    // (address, state, node, zone) of every member a nodePort gets.
    let mut hosts: Vec<(IpAddr, MemberState, &str, Option<&String>)> = Vec::new();
    for (name, node) in index.nodes().iter().filter(|(_, n)| n.eligible()) {
        let state = match &local_states {
            None => MemberState::Active,
            Some(states) => match states.get(name.as_str()) {
                Some(s) => *s,
                None => continue,
            },
        };
        for family in view.families() {
            if let Some(ip) = node.primary(family, &rules.address_types) {
                hosts.push((ip, state, name, node.zone.as_ref()));
            }
        }
    }
    let ports = view
        .ports
        .iter()
        .map(|p| {
            let members = p.node_port.into_iter().flat_map(|node_port| {
                hosts.iter().map(move |&(ip, state, name, zone)| {
                    (ip, member(ip, node_port, state, Some(name.into()), zone.map(|z| z.as_str().into())))
                })
            });
            port(p, members)
        })
        .collect();
    (health_check, reason, ports)
}

/// Per Node, the best state of the Service's endpoints on it (`active` if one is ready).
fn local_states<'a>(key: &ServiceKey, index: &'a BackendIndex) -> HashMap<&'a str, MemberState> {
    let mut states: HashMap<&str, MemberState> = HashMap::new();
    for e in index.slices(key).flat_map(|s| &s.endpoints) {
        if let Some(node) = e.node.as_deref() {
            let best = states.entry(node).or_insert(e.state);
            *best = (*best).min(e.state);
        }
    }
    states
}

fn pod_ports(key: &ServiceKey, view: &ServiceView, index: &BackendIndex) -> Vec<BackendPort> {
    let families = view.families();
    view.ports
        .iter()
        .map(|p| {
            let name = p.name.as_deref().unwrap_or("");
            let mut best: BTreeMap<(IpAddr, i32), Member> = BTreeMap::new();
            let slices = index.slices(key).filter(|s| families.contains(&if s.ipv6 { "IPv6" } else { "IPv4" }));
            for slice in slices {
                for sp in slice.ports.iter().filter(|sp| sp.name == name && sp.protocol == p.protocol) {
                    for e in &slice.endpoints {
                        let candidate = member(
                            e.address,
                            sp.port,
                            e.state,
                            e.node.as_deref().map(CompactString::from),
                            e.zone.as_deref().map(CompactString::from),
                        );
                        best.entry((e.address, sp.port))
                            .and_modify(|m| {
                                if candidate.state < m.state {
                                    *m = candidate.clone();
                                }
                            })
                            .or_insert(candidate);
                    }
                }
            }
            BackendPort {
                name: p.name.clone(),
                protocol: p.protocol.clone(),
                port: p.port,
                members: best.into_values().collect(),
            }
        })
        .collect()
}

fn member(
    ip: IpAddr,
    port: i32,
    state: MemberState,
    node_name: Option<CompactString>,
    zone: Option<CompactString>,
) -> Member {
    Member { address: ip.to_compact_string(), port, state, node_name, zone }
}

/// A [`BackendPort`] of the Service port `p` with `members` in canonical order.
fn port(p: &crate::model::PortView, members: impl Iterator<Item = (IpAddr, Member)>) -> BackendPort {
    let sorted: BTreeMap<(IpAddr, i32, CompactString), Member> =
        members.map(|(ip, m)| ((ip, m.port, m.node_name.clone().unwrap_or_default()), m)).collect();
    BackendPort {
        name: p.name.clone(),
        protocol: p.protocol.clone(),
        port: p.port,
        members: sorted.into_values().collect(),
    }
}

/// What the hash covers: everything of a [`Backends`] but its revision and the hash itself.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct Canonical<'a> {
    mode: BackendMode,
    health_check: Option<&'a HealthCheck>,
    reason: Option<&'a str>,
    ports: &'a [BackendPort],
}

/// `sha256:` + hex of the canonical JSON of everything but the revision.
fn hash(mode: BackendMode, health_check: Option<&HealthCheck>, reason: Option<&str>, ports: &[BackendPort]) -> String {
    let canonical = Canonical { mode, health_check, reason, ports };
    let digest = Sha256::digest(serde_json::to_vec(&canonical).expect("members serialize"));
    // One allocation: the digest's own lower-hex formatting (a `format!` per byte made 32 more).
    format!("sha256:{digest:x}")
}
