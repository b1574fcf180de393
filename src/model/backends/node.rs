//! A Node as the load balancer sees it: its InternalIP/ExternalIP addresses, its zone, and whether it
//! may carry load-balancer traffic at all. Everything else a Node carries (conditions, heartbeats,
//! images, capacity) is left out, so a status-only update projects to the same [`NodeView`] and
//! changes nothing. Eligibility follows the upstream service controller since Kubernetes 1.27
//! (`stableNodeSetPredicates` of the upstream service controller): readiness does not count, the
//! appliance's health check handles liveness.

use k8s_openapi::api::core::v1::Node;
use serde::{Deserialize, Serialize};

/// A Node carrying this label (with a value that does not parse as `false`) is in no load balancer.
pub const EXCLUDE_LABEL: &str = "node.kubernetes.io/exclude-from-external-load-balancers";
/// The taint the cluster autoscaler puts on a Node it is about to remove.
pub const AUTOSCALER_TAINT: &str = "ToBeDeletedByClusterAutoscaler";
/// The Node label naming its zone.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// The address types a member address may come from, in the default order of preference.
pub const ADDRESS_TYPES: [&str; 2] = ["InternalIP", "ExternalIP"];

/// One `status.addresses[]` entry of an address type in [`ADDRESS_TYPES`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAddressView {
    /// `InternalIP` or `ExternalIP`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The address, as the Node reports it.
    pub address: String,
}

/// The projection of a Node that decides its members. Serialized in camelCase (the `nodes` table and
/// `GET /api/v1/nodes`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeView {
    /// Its `InternalIP` and `ExternalIP` addresses, in `status.addresses` order (the first of each
    /// family is the primary one).
    pub addresses: Vec<NodeAddressView>,
    /// `topology.kubernetes.io/zone`.
    pub zone: Option<String>,
    /// Why the Node carries no load-balancer traffic (being deleted, excluded by label, tainted by the
    /// cluster autoscaler); `None` when it is eligible.
    pub excluded_by: Option<String>,
}

/// A Node as the apiserver just reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedNode {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.resourceVersion`.
    pub resource_version: String,
    /// The projection.
    pub view: NodeView,
}

impl ObservedNode {
    /// Projects a Node. Never fails: a Node without addresses is kept (it just yields no member).
    pub fn from_node(node: &Node) -> Self {
        let meta = &node.metadata;
        let labels = meta.labels.as_ref();
        let addresses = node
            .status
            .as_ref()
            .and_then(|s| s.addresses.as_ref())
            .into_iter()
            .flatten()
            .filter(|a| ADDRESS_TYPES.contains(&a.type_.as_str()))
            .map(|a| NodeAddressView { kind: a.type_.clone(), address: a.address.clone() })
            .collect();
        let tainted = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|taints| taints.iter().any(|t| t.key == AUTOSCALER_TAINT));
        let excluded_by = if meta.deletion_timestamp.is_some() {
            Some("being deleted".to_owned())
        } else if let Some(value) =
            labels.and_then(|l| l.get(EXCLUDE_LABEL)).filter(|v| parse_go_bool(v) != Some(false))
        {
            Some(format!("labelled {EXCLUDE_LABEL}={value}"))
        } else {
            tainted.then(|| format!("tainted {AUTOSCALER_TAINT} (the cluster autoscaler is removing it)"))
        };
        Self {
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
            resource_version: meta.resource_version.clone().unwrap_or_default(),
            view: NodeView { addresses, zone: labels.and_then(|l| l.get(ZONE_LABEL)).cloned(), excluded_by },
        }
    }
}

impl NodeView {
    /// Whether the Node may carry load-balancer traffic.
    pub fn eligible(&self) -> bool {
        self.excluded_by.is_none()
    }

    /// The primary address of `family` (`IPv4` or `IPv6`): the first address of that family of the
    /// first type in `types` that has one. `None` when the Node has none.
    pub fn primary(&self, family: &str, types: &[String]) -> Option<std::net::IpAddr> {
        types.iter().find_map(|t| {
            self.addresses
                .iter()
                .filter(|a| a.kind == *t)
                .filter_map(|a| a.address.parse::<std::net::IpAddr>().ok())
                .find(|ip| family_of(ip) == family)
        })
    }
}

/// `IPv4` or `IPv6`.
pub fn family_of(ip: &std::net::IpAddr) -> &'static str {
    if ip.is_ipv4() { "IPv4" } else { "IPv6" }
}

/// Go's `strconv.ParseBool`, which upstream uses on the exclusion label's value: an unparsable value
/// excludes the Node, `"false"` (and `0`, `f`, `F`, `FALSE`, `False`) keeps it (commit e0d9f9a, 2025).
fn parse_go_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(json: serde_json::Value) -> NodeView {
        ObservedNode::from_node(&serde_json::from_value(json).unwrap()).view
    }

    #[test]
    fn readiness_and_heartbeats_are_not_part_of_the_projection() {
        let a = node(
            serde_json::json!({"metadata": {"name": "w1"}, "status": {"conditions": [{"type": "Ready", "status": "True"}],
            "addresses": [{"type": "Hostname", "address": "w1"}, {"type": "InternalIP", "address": "10.0.0.1"}]}}),
        );
        let b = node(
            serde_json::json!({"metadata": {"name": "w1"}, "status": {"conditions": [{"type": "Ready", "status": "False"}],
            "addresses": [{"type": "Hostname", "address": "w1"}, {"type": "InternalIP", "address": "10.0.0.1"}]}}),
        );
        assert_eq!(a, b);
        assert!(a.eligible());
        assert_eq!(a.addresses, vec![NodeAddressView { kind: "InternalIP".into(), address: "10.0.0.1".into() }]);
    }

    #[test]
    fn the_exclusion_label_takes_a_node_out_unless_it_says_false() {
        let with =
            |value: &str| node(serde_json::json!({"metadata": {"name": "w1", "labels": {EXCLUDE_LABEL: value}}}));
        assert_eq!(with("false").excluded_by, None);
        assert_eq!(with("").excluded_by, Some(format!("labelled {EXCLUDE_LABEL}=")));
        assert_eq!(with("true").excluded_by, Some(format!("labelled {EXCLUDE_LABEL}=true")));
        assert_eq!(with("yes please").excluded_by, Some(format!("labelled {EXCLUDE_LABEL}=yes please")));
    }

    #[test]
    fn deletion_and_the_autoscaler_taint_take_a_node_out() {
        let deleting =
            node(serde_json::json!({"metadata": {"name": "w1", "deletionTimestamp": "2026-01-01T00:00:00Z"}}));
        assert_eq!(deleting.excluded_by.as_deref(), Some("being deleted"));
        let tainted = node(serde_json::json!({"metadata": {"name": "w1"},
            "spec": {"taints": [{"key": AUTOSCALER_TAINT, "value": "1700000000", "effect": "NoSchedule"}]}}));
        assert!(!tainted.eligible());
        let cordoned = node(serde_json::json!({"metadata": {"name": "w1"}, "spec": {"unschedulable": true}}));
        assert!(cordoned.eligible(), "cordoned Nodes stay in the set (upstream since 2020)");
    }

    #[test]
    fn the_primary_address_follows_the_type_preference_per_family() {
        let n = node(serde_json::json!({"metadata": {"name": "w1"}, "status": {"addresses": [
            {"type": "ExternalIP", "address": "203.0.113.1"}, {"type": "InternalIP", "address": "10.0.0.1"},
            {"type": "InternalIP", "address": "10.0.0.2"}, {"type": "InternalIP", "address": "fd00::1"}]}}));
        let types: Vec<String> = ADDRESS_TYPES.iter().map(|t| t.to_string()).collect();
        assert_eq!(n.primary("IPv4", &types), Some("10.0.0.1".parse().unwrap()));
        assert_eq!(n.primary("IPv6", &types), Some("fd00::1".parse().unwrap()));
        let external_first = vec!["ExternalIP".to_owned(), "InternalIP".to_owned()];
        assert_eq!(n.primary("IPv4", &external_first), Some("203.0.113.1".parse().unwrap()));
        assert_eq!(n.primary("IPv6", &["ExternalIP".to_owned()]), None);
    }
}
