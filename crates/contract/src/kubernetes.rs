//! Normalizing a Kubernetes Service (k8s-openapi) into a [`ServiceView`] (feature `kubernetes`): absent
//! fields take Kubernetes' defaults, so that equal Services compare equal.

use k8s_openapi::api::core::v1::{Service, ServicePort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use compact_str::{CompactString, ToCompactString};

use crate::view::{IngressView, PortView, ServiceView, StringMap, requested_ip_entries, string_map};

impl ServiceView {
    /// Normalizes a Kubernetes Service. Never fails: absent fields take Kubernetes' defaults (type
    /// `ClusterIP`, protocol `TCP`, `targetPort` = `port`, `sessionAffinity` `None`); `allocation` is
    /// left `None` (the controller fills it in).
    pub fn from_service(svc: &Service) -> Self {
        Self::from_owned(svc.clone())
    }

    /// As [`Self::from_service`], consuming the object (no copy of its fields; the watch path uses it).
    pub fn from_owned(svc: Service) -> Self {
        let ingress = ingress_views(&svc);
        let spec = svc.spec.unwrap_or_default();
        let meta = svc.metadata;
        let annotations = string_map(meta.annotations.unwrap_or_default());
        let mut view = Self {
            service_type: spec.type_.map_or_else(|| "ClusterIP".into(), CompactString::from),
            load_balancer_class: spec.load_balancer_class.map(CompactString::from),
            ports: spec.ports.unwrap_or_default().iter().map(port_view).collect(),
            selector: string_map(spec.selector.unwrap_or_default()),
            external_traffic_policy: spec.external_traffic_policy.map(CompactString::from),
            health_check_node_port: spec.health_check_node_port,
            session_affinity: spec.session_affinity.map_or_else(|| "None".into(), CompactString::from),
            session_affinity_timeout_seconds: spec
                .session_affinity_config
                .and_then(|c| c.client_ip)
                .and_then(|c| c.timeout_seconds),
            load_balancer_source_ranges: spec.load_balancer_source_ranges.unwrap_or_default(),
            external_ips: spec.external_ips.unwrap_or_default(),
            ip_families: compact(spec.ip_families.unwrap_or_default()),
            ip_family_policy: spec.ip_family_policy.map(CompactString::from),
            allocate_load_balancer_node_ports: spec.allocate_load_balancer_node_ports,
            load_balancer_ip: spec.load_balancer_ip.as_deref().and_then(canonical),
            requested_ips: requested_ips(&annotations),
            ingress,
            labels: string_map(meta.labels.unwrap_or_default()),
            annotations,
            allocation: None,
            finalizers: compact(meta.finalizers.unwrap_or_default()),
            deleting: meta.deletion_timestamp.is_some(),
        };
        // The object's own vectors (finalizers, ipFamilies, ...) were read from JSON with room to spare.
        view.shrink_to_fit();
        view
    }
}

fn port_view(p: &ServicePort) -> PortView {
    let target_port = match &p.target_port {
        Some(IntOrString::Int(n)) => n.to_compact_string(),
        Some(IntOrString::String(s)) => s.into(),
        None => p.port.to_compact_string(),
    };
    PortView {
        name: p.name.as_deref().filter(|n| !n.is_empty()).map(CompactString::from),
        protocol: p.protocol.as_deref().unwrap_or("TCP").into(),
        port: p.port,
        target_port,
        node_port: p.node_port,
        app_protocol: p.app_protocol.as_deref().map(CompactString::from),
    }
}

/// `strings` as [`CompactString`]s: the short ones inline, the long ones keeping their buffer.
fn compact(strings: Vec<String>) -> Vec<CompactString> {
    strings.into_iter().map(CompactString::from).collect()
}

/// The requested IPs of [`requested_ip_entries`], normalized by [`canonical`].
fn requested_ips(annotations: &StringMap) -> Vec<String> {
    requested_ip_entries(annotations)
        .map(|(_, entries)| entries.into_iter().filter_map(canonical).collect())
        .unwrap_or_default()
}

/// `s` (trimmed) in the canonical form of its IP address (`2001:DB8:0::1` → `2001:db8::1`, the form
/// the allocation and the status use, so the same address compares equal wherever it shows), or `None`
/// when it is not an IPv4 or IPv6 address: anything else in `spec.loadBalancerIP` or a requested-IP
/// annotation is not an address an appliance can bind, and is left out of the view.
fn canonical(s: &str) -> Option<String> {
    s.trim().parse::<std::net::IpAddr>().ok().map(|ip| ip.to_string())
}

fn ingress_views(svc: &Service) -> Vec<IngressView> {
    let ingress = svc.status.as_ref().and_then(|s| s.load_balancer.as_ref()).and_then(|lb| lb.ingress.as_ref());
    ingress
        .map(|list| {
            list.iter()
                .map(|i| IngressView { ip: i.ip.clone(), hostname: i.hostname.clone(), ip_mode: i.ip_mode.clone() })
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(json: serde_json::Value) -> ServiceView {
        ServiceView::from_service(&serde_json::from_value(json).unwrap())
    }

    /// A view holds no spare room: the mirror keeps one per Service.
    #[test]
    fn views_hold_exactly_their_entries() {
        let v = view(serde_json::json!({"metadata": {"name": "a", "labels": {"app": "a", "rev": "1"},
            "finalizers": ["vipwatch.io/finalizer"]},
            "spec": {"type": "LoadBalancer", "selector": {"app": "a"}, "ipFamilies": ["IPv4"],
                     "ports": [{"port": 80}]}}));
        let json = serde_json::to_string(&v).unwrap();
        // Moved out, not cloned: a clone would have exactly its length whatever the original held.
        let capacities = (
            v.labels.into_tuple_vec().capacity(),
            v.selector.into_tuple_vec().capacity(),
            v.annotations.into_tuple_vec().capacity(),
            v.finalizers.capacity(),
            v.ip_families.capacity(),
        );
        assert_eq!(capacities, (2, 1, 0, 1, 1));
        let mut read: ServiceView = serde_json::from_str(&json).unwrap();
        read.shrink_to_fit();
        assert_eq!((read.labels.into_tuple_vec().capacity(), read.finalizers.capacity()), (2, 1));
    }

    #[test]
    fn defaults_are_filled_in() {
        let v = view(serde_json::json!({"metadata": {"name": "a"}, "spec": {"ports": [{"port": 53}]}}));
        assert_eq!(v.service_type, "ClusterIP");
        assert_eq!(v.session_affinity, "None");
        assert_eq!(
            v.ports,
            vec![PortView {
                name: None,
                protocol: "TCP".into(),
                port: 53,
                target_port: "53".into(),
                node_port: None,
                app_protocol: None
            }]
        );
    }

    #[test]
    fn requested_ips_take_the_first_annotation_present_and_vips_dedupe() {
        let v = view(serde_json::json!({"metadata": {"name": "a", "annotations": {
            "metallb.io/loadBalancerIPs": "198.51.100.1", "vipwatch.io/loadBalancerIPs": " 192.0.2.1, 2001:db8::1 ,bogus,,999.1.1.1"}},
            "spec": {"type": "LoadBalancer", "loadBalancerIP": "192.0.2.1"},
            "status": {"loadBalancer": {"ingress": [{"hostname": "lb.example.net"}]}}}));
        assert_eq!(v.requested_ips, vec!["192.0.2.1", "2001:db8::1"]);
        assert_eq!(
            v.vip_sources(),
            vec![
                ("lb.example.net".to_owned(), "status"),
                ("192.0.2.1".to_owned(), "annotation"),
                ("2001:db8::1".to_owned(), "annotation")
            ]
        );
    }

    /// Whichever of the requested-IP annotations carries the request (the first present), the view
    /// shows it normalized: trimmed, canonical, without the entries that are not addresses; as it
    /// shows `spec.loadBalancerIP`.
    #[test]
    fn requested_ips_are_normalized_whichever_annotation_carries_them() {
        for key in crate::REQUESTED_IP_ANNOTATIONS {
            let v = view(serde_json::json!({"metadata": {"name": "a", "annotations": {
                key: " 2001:DB8:0:0::51 ,, 192.0.2.7/32, 192.000.2.8, 192.0.2.9 ", "other": "2001:db8::1"}},
                "spec": {"type": "LoadBalancer", "loadBalancerIP": " 2001:DB8::0:52"}}));
            assert_eq!(v.requested_ips, vec!["2001:db8::51", "192.0.2.9"], "{key}");
            assert_eq!(v.load_balancer_ip.as_deref(), Some("2001:db8::52"), "{key}");
        }
    }

    /// A Service that changed type away from LoadBalancer keeps the status it had until someone
    /// clears it: it names no VIP, and vipwatch is to clear it. A LoadBalancer whose addresses
    /// vipwatch does not assign keeps its status, which is not vipwatch's to write.
    #[test]
    fn only_a_load_balancer_has_vips_and_a_stale_status_of_another_type_is_to_be_cleared() {
        let with = |ty: &str| {
            view(
                serde_json::json!({"metadata": {"name": "a", "annotations": {"vipwatch.io/loadBalancerIPs": "192.0.2.2"}},
                "spec": {"type": ty, "loadBalancerIP": "192.0.2.3"},
                "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}}}),
            )
        };
        for ty in ["ClusterIP", "NodePort", "ExternalName"] {
            assert_eq!((with(ty).vip_sources(), with(ty).status_to_publish()), (vec![], Some(vec![])), "{ty}");
        }
        let lb = with("LoadBalancer");
        let sources = ["192.0.2.1", "192.0.2.2", "192.0.2.3"].into_iter().zip(["status", "annotation", "spec"]);
        assert_eq!(lb.vip_sources(), sources.map(|(a, s)| (a.to_owned(), s)).collect::<Vec<_>>());
        assert_eq!(lb.status_to_publish(), None);
    }
}
