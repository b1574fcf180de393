//! The normalized view of a Kubernetes Service (its type lives in the webhook contract,
//! `vipwatch-contract`, since it is what every delivery carries), the key of the current-state table,
//! and the LB-relevant diff.

use std::fmt;

use serde::{Deserialize, Serialize};
use vipwatch_contract::CompactString;

pub use vipwatch_contract::{Allocation, IngressView, PortView, REQUESTED_IP_ANNOTATIONS, ServiceView, VipSource};

/// `namespace/name` of a Service: the key of the current-state table. Both parts are inline up to 24
/// bytes: the key is held by every per-Service map (the mirror, the members index, the allocator,
/// the relay's queues), and two allocations per copy would be a measurable part of the heap with
/// many Services.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ServiceKey {
    /// `metadata.namespace` (`"default"` when the object carries none).
    pub namespace: CompactString,
    /// `metadata.name`.
    pub name: CompactString,
}

impl ServiceKey {
    /// Builds a key from its two parts.
    pub fn new(namespace: impl Into<CompactString>, name: impl Into<CompactString>) -> Self {
        Self { namespace: namespace.into(), name: name.into() }
    }
}

impl fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The names (camelCase, as serialized) of the LB-relevant fields that differ between two views, in
/// declaration order. `finalizers` and `deleting` (metadata bookkeeping) are never listed, nor is
/// `ingress` (status): as for the upstream service controller, status-only writes are not changes.
/// Empty = no MODIFIED.
pub fn changed_fields(old: &ServiceView, new: &ServiceView) -> Vec<&'static str> {
    let mut out = Vec::new();
    let mut check = |differs: bool, name: &'static str| {
        if differs {
            out.push(name);
        }
    };
    check(old.service_type != new.service_type, "type");
    check(old.load_balancer_class != new.load_balancer_class, "loadBalancerClass");
    check(old.ports != new.ports, "ports");
    check(old.selector != new.selector, "selector");
    check(old.external_traffic_policy != new.external_traffic_policy, "externalTrafficPolicy");
    check(old.health_check_node_port != new.health_check_node_port, "healthCheckNodePort");
    check(old.session_affinity != new.session_affinity, "sessionAffinity");
    check(
        old.session_affinity_timeout_seconds != new.session_affinity_timeout_seconds,
        "sessionAffinityTimeoutSeconds",
    );
    check(old.load_balancer_source_ranges != new.load_balancer_source_ranges, "loadBalancerSourceRanges");
    check(old.external_ips != new.external_ips, "externalIPs");
    check(old.ip_families != new.ip_families, "ipFamilies");
    check(old.ip_family_policy != new.ip_family_policy, "ipFamilyPolicy");
    check(
        old.allocate_load_balancer_node_ports != new.allocate_load_balancer_node_ports,
        "allocateLoadBalancerNodePorts",
    );
    check(old.load_balancer_ip != new.load_balancer_ip, "loadBalancerIP");
    check(old.requested_ips != new.requested_ips, "requestedIPs");
    check(old.labels != new.labels, "labels");
    check(old.annotations != new.annotations, "annotations");
    check(allocation_differs(old.allocation.as_ref(), new.allocation.as_ref()), "allocation");
    out
}

/// Whether the allocation changed. One stored before allocations listed each address's family and
/// pool (`perAddress` empty, addresses set) is the same as the new one when all else is equal: the
/// Service holds the same addresses from the same pools, so the first start after the upgrade
/// rewrites its row (no event) instead of re-announcing every Service with a pool address.
fn allocation_differs(old: Option<&Allocation>, new: Option<&Allocation>) -> bool {
    match (old, new) {
        (Some(o), Some(n)) if o.per_address.is_empty() && !o.addresses.is_empty() => {
            Allocation { per_address: n.per_address.clone(), ..o.clone() } != *n
        }
        _ => old != new,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(json: serde_json::Value) -> ServiceView {
        ServiceView::from_service(&serde_json::from_value(json).unwrap())
    }

    #[test]
    fn status_only_change_lists_no_field() {
        let a = view(serde_json::json!({"metadata": {"name": "a"}, "spec": {"type": "LoadBalancer"}}));
        let b = view(serde_json::json!({"metadata": {"name": "a"}, "spec": {"type": "LoadBalancer"},
            "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}}}));
        assert_ne!(a, b);
        assert_eq!(changed_fields(&a, &b), Vec::<&str>::new());
    }

    /// An allocation stored before `perAddress` existed is not a change by itself (the upgrade
    /// rewrites the row without an event); any other difference still is.
    #[test]
    fn an_allocation_stored_without_per_address_changes_only_when_something_else_does() {
        let lb = || view(serde_json::json!({"metadata": {"name": "a"}, "spec": {"type": "LoadBalancer"}}));
        let with = |allocation: Allocation| ServiceView { allocation: Some(allocation), ..lb() };
        let now = Allocation::from_pools(vec![("192.0.2.1".parse().unwrap(), "lab".into())]);
        let stored = Allocation { per_address: Vec::new(), ..now.clone() };
        assert_eq!(changed_fields(&with(stored.clone()), &with(now.clone())), Vec::<&str>::new());
        assert_ne!(with(stored.clone()), with(now.clone()), "the row is rewritten");
        let moved = Allocation::from_pools(vec![("192.0.2.2".parse().unwrap(), "lab".into())]);
        assert_eq!(changed_fields(&with(stored.clone()), &with(moved)), vec!["allocation"]);
        let renamed = Allocation::from_pools(vec![("192.0.2.1".parse().unwrap(), "other".into())]);
        assert_eq!(changed_fields(&with(stored), &with(renamed.clone())), vec!["allocation"]);
        assert_eq!(changed_fields(&with(now), &with(renamed)), vec!["allocation"]);
    }

    #[test]
    fn annotation_change_is_listed_alone() {
        let a = view(serde_json::json!({"metadata": {"name": "a", "annotations": {"x": "1"}}}));
        let b = view(serde_json::json!({"metadata": {"name": "a", "annotations": {"x": "2"}}}));
        assert_eq!(changed_fields(&a, &b), vec!["annotations"]);
    }
}
