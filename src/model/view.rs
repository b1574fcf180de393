//! The normalized view of a Kubernetes Service: exactly the fields an external load balancer needs,
//! with Kubernetes defaults filled in so that equal Services compare equal.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::{Service, ServicePort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::{Deserialize, Serialize};

/// Annotations read as requested VIPs, in precedence order: the first one present wins. `vipwatch.io/`
/// is ours; the MetalLB and Cilium keys are honoured so Services migrated from those controllers keep
/// their addresses. Values are comma-separated IP lists.
pub const REQUESTED_IP_ANNOTATIONS: [&str; 4] = [
    "vipwatch.io/loadBalancerIPs",
    "metallb.io/loadBalancerIPs",
    "metallb.universe.tf/loadBalancerIPs",
    "lbipam.cilium.io/ips",
];

/// `namespace/name` of a Service: the key of the current-state table.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ServiceKey {
    /// `metadata.namespace` (`"default"` when the object carries none).
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
}

impl ServiceKey {
    /// Builds a key from its two parts.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self { namespace: namespace.into(), name: name.into() }
    }
}

impl fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// One Service port as the load balancer sees it (`spec.ports[]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortView {
    /// Port name; required by Kubernetes only when a Service has several ports.
    pub name: Option<String>,
    /// `TCP`, `UDP` or `SCTP`; Kubernetes' default `TCP` when absent.
    pub protocol: String,
    /// The Service port the VIP listens on.
    pub port: i32,
    /// Target port on the Pods, as a string (a number or a named port); defaults to `port`.
    pub target_port: String,
    /// NodePort on every Node, when allocated.
    pub node_port: Option<i32>,
    /// `appProtocol` hint (e.g. `http`, `kubernetes.io/h2c`).
    pub app_protocol: Option<String>,
}

/// One `status.loadBalancer.ingress[]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IngressView {
    /// IP address, when the load balancer is reached by IP.
    pub ip: Option<String>,
    /// DNS name, when the load balancer is reached by name.
    pub hostname: Option<String>,
    /// `VIP` or `Proxy` (Kubernetes 1.30+), when set.
    pub ip_mode: Option<String>,
}

/// Who chose a Service's VIPs when vipwatch assigns them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VipSource {
    /// Allocated by vipwatch from a configured `[[pools]]` entry.
    Pool,
    /// Returned by a webhook endpoint configured with `assigns_vip = true`.
    Appliance,
}

/// The addresses vipwatch assigned to a Service (or why it has none yet). Part of the view, so a
/// change of allocation is a MODIFIED (`changed: ["allocation"]`) and reaches the appliance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Allocation {
    /// `pool` or `appliance`.
    pub source: VipSource,
    /// The pool the addresses come from (`source = pool`).
    pub pool: Option<String>,
    /// The VIPs, primary family first; empty while pending.
    pub addresses: Vec<String>,
    /// A DNS name instead of addresses (`source = appliance` only).
    pub hostname: Option<String>,
    /// Why there is no address (impossible request, pool exhausted); `None` once allocated.
    pub reason: Option<String>,
}

impl Allocation {
    /// A pool allocation with no address, for `reason`.
    pub fn pending(reason: String) -> Self {
        Self { source: VipSource::Pool, pool: None, addresses: Vec::new(), hostname: None, reason: Some(reason) }
    }

    /// The `status.loadBalancer.ingress` this allocation publishes: one `{ip, ipMode: "VIP"}` per
    /// address, or one `{hostname}`; empty while pending.
    pub fn ingress(&self) -> Vec<IngressView> {
        let ips = self.addresses.iter().map(|ip| IngressView {
            ip: Some(ip.clone()),
            hostname: None,
            ip_mode: Some("VIP".into()),
        });
        let host = self.hostname.iter().map(|h| IngressView { ip: None, hostname: Some(h.clone()), ip_mode: None });
        ips.chain(host).collect()
    }
}

/// The normalized, LB-relevant view of one Service. Serialized in camelCase, as Kubernetes spells the
/// fields. Every field except `ingress` takes part in the MODIFIED decision (see [`changed_fields`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceView {
    /// `spec.type`; Kubernetes' default `ClusterIP` when absent.
    #[serde(rename = "type")]
    pub service_type: String,
    /// `spec.loadBalancerClass`.
    pub load_balancer_class: Option<String>,
    /// `spec.ports`, in the order given.
    pub ports: Vec<PortView>,
    /// `spec.selector` (empty for Services without a selector).
    pub selector: BTreeMap<String, String>,
    /// `spec.externalTrafficPolicy` (`Cluster` or `Local`).
    pub external_traffic_policy: Option<String>,
    /// `spec.healthCheckNodePort` (only with `externalTrafficPolicy: Local`).
    pub health_check_node_port: Option<i32>,
    /// `spec.sessionAffinity`; Kubernetes' default `None` when absent.
    pub session_affinity: String,
    /// `spec.sessionAffinityConfig.clientIP.timeoutSeconds`, in seconds.
    pub session_affinity_timeout_seconds: Option<i32>,
    /// `spec.loadBalancerSourceRanges` (CIDRs allowed to reach the VIP).
    pub load_balancer_source_ranges: Vec<String>,
    /// `spec.externalIPs`.
    pub external_ips: Vec<String>,
    /// `spec.ipFamilies` (`IPv4`, `IPv6`), in order of preference.
    pub ip_families: Vec<String>,
    /// `spec.ipFamilyPolicy` (`SingleStack`, `PreferDualStack`, `RequireDualStack`).
    pub ip_family_policy: Option<String>,
    /// `spec.allocateLoadBalancerNodePorts`.
    pub allocate_load_balancer_node_ports: Option<bool>,
    /// `spec.loadBalancerIP` (deprecated upstream, still honoured); `None` unless it is an IP address.
    pub load_balancer_ip: Option<String>,
    /// IPs requested by annotation (first of [`REQUESTED_IP_ANNOTATIONS`] present), trimmed, in order;
    /// entries that are not IP addresses are dropped.
    pub requested_ips: Vec<String>,
    /// `status.loadBalancer.ingress`: the addresses currently published. Status only: a change here
    /// alone is not a MODIFIED.
    pub ingress: Vec<IngressView>,
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
    /// `metadata.annotations`.
    pub annotations: BTreeMap<String, String>,
    /// The VIPs vipwatch assigned (pools, or an appliance with `assigns_vip`); `None` when vipwatch
    /// does not assign addresses to this Service. Filled in by the recorder, never by
    /// [`Self::from_owned`].
    #[serde(default)]
    pub allocation: Option<Allocation>,
    /// `metadata.finalizers`. Metadata only: a change here alone is not a MODIFIED.
    #[serde(default)]
    pub finalizers: Vec<String>,
    /// Whether `metadata.deletionTimestamp` is set: the object is being deleted and waits for its
    /// finalizers. Such a Service is out of scope (its DELETED is recorded at once).
    #[serde(default)]
    pub deleting: bool,
}

impl ServiceView {
    /// Normalizes a Kubernetes Service. Never fails: absent fields take Kubernetes' defaults.
    pub fn from_service(svc: &Service) -> Self {
        Self::from_owned(svc.clone())
    }

    /// As [`Self::from_service`], consuming the object (no copy of its fields; the watch path uses it).
    pub fn from_owned(svc: Service) -> Self {
        let ingress = ingress_views(&svc);
        let spec = svc.spec.unwrap_or_default();
        let meta = svc.metadata;
        let annotations: BTreeMap<String, String> = meta.annotations.unwrap_or_default();
        Self {
            service_type: spec.type_.unwrap_or_else(|| "ClusterIP".to_owned()),
            load_balancer_class: spec.load_balancer_class,
            ports: spec.ports.unwrap_or_default().iter().map(port_view).collect(),
            selector: spec.selector.unwrap_or_default(),
            external_traffic_policy: spec.external_traffic_policy,
            health_check_node_port: spec.health_check_node_port,
            session_affinity: spec.session_affinity.unwrap_or_else(|| "None".to_owned()),
            session_affinity_timeout_seconds: spec
                .session_affinity_config
                .and_then(|c| c.client_ip)
                .and_then(|c| c.timeout_seconds),
            load_balancer_source_ranges: spec.load_balancer_source_ranges.unwrap_or_default(),
            external_ips: spec.external_ips.unwrap_or_default(),
            ip_families: spec.ip_families.unwrap_or_default(),
            ip_family_policy: spec.ip_family_policy,
            allocate_load_balancer_node_ports: spec.allocate_load_balancer_node_ports,
            load_balancer_ip: spec.load_balancer_ip.filter(|ip| is_ip(ip)),
            requested_ips: requested_ips(&annotations),
            ingress,
            labels: meta.labels.unwrap_or_default(),
            annotations,
            allocation: None,
            finalizers: meta.finalizers.unwrap_or_default(),
            deleting: meta.deletion_timestamp.is_some(),
        }
    }

    /// The VIPs of this Service with where each comes from. When vipwatch assigns this Service's
    /// addresses ([`Self::allocation`] is set), exactly the allocated ones, with source `pool` or
    /// `appliance` (none while pending). Otherwise, in this order and without repeats: `status`
    /// (published ingress IPs and hostnames), then `annotation` (requested IPs), then `spec`
    /// (`spec.loadBalancerIP`). Returns `(address, source)` pairs.
    pub fn vip_sources(&self) -> Vec<(String, &'static str)> {
        if let Some(a) = &self.allocation {
            let source = match a.source {
                VipSource::Pool => "pool",
                VipSource::Appliance => "appliance",
            };
            return a.addresses.iter().chain(&a.hostname).map(|v| (v.clone(), source)).collect();
        }
        let status = self.ingress.iter().filter_map(|i| i.ip.clone().or_else(|| i.hostname.clone()));
        let status = status.map(|a| (a, "status"));
        let annotation = self.requested_ips.iter().map(|a| (a.clone(), "annotation"));
        let spec = self.load_balancer_ip.iter().map(|a| (a.clone(), "spec"));
        let mut out: Vec<(String, &'static str)> = Vec::new();
        for (addr, source) in status.chain(annotation).chain(spec) {
            if !out.iter().any(|(a, _)| *a == addr) {
                out.push((addr, source));
            }
        }
        out
    }

    /// The `status.loadBalancer.ingress` vipwatch should publish, when it differs from what the Service
    /// shows: `Some(list)` (possibly empty, to clear) for a Service whose addresses vipwatch assigns,
    /// `None` when the status is right or not vipwatch's to write.
    pub fn status_to_publish(&self) -> Option<Vec<IngressView>> {
        let want = self.allocation.as_ref()?.ingress();
        (want != self.ingress).then_some(want)
    }

    /// The VIP addresses only, as in [`Self::vip_sources`].
    pub fn vips(&self) -> Vec<String> {
        self.vip_sources().into_iter().map(|(a, _)| a).collect()
    }
}

fn port_view(p: &ServicePort) -> PortView {
    let target_port = match &p.target_port {
        Some(IntOrString::Int(n)) => n.to_string(),
        Some(IntOrString::String(s)) => s.clone(),
        None => p.port.to_string(),
    };
    PortView {
        name: p.name.clone().filter(|n| !n.is_empty()),
        protocol: p.protocol.clone().unwrap_or_else(|| "TCP".to_owned()),
        port: p.port,
        target_port,
        node_port: p.node_port,
        app_protocol: p.app_protocol.clone(),
    }
}

fn requested_ips(annotations: &BTreeMap<String, String>) -> Vec<String> {
    let Some(value) = REQUESTED_IP_ANNOTATIONS.iter().find_map(|k| annotations.get(*k)) else {
        return Vec::new();
    };
    value.split(',').map(str::trim).filter(|s| is_ip(s)).map(str::to_owned).collect()
}

/// Whether `s` is an IPv4 or IPv6 address. Anything else in `spec.loadBalancerIP` or a requested-IP
/// annotation is not an address an appliance can bind, and is left out of the view.
fn is_ip(s: &str) -> bool {
    s.parse::<std::net::IpAddr>().is_ok()
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

/// The names (camelCase, as serialized) of the LB-relevant fields that differ between two views, in
/// declaration order. `finalizers` and `deleting` (metadata bookkeeping) are never listed, nor is
/// `ingress` (status): per the upstream service controller and
/// shared/reference/kubernetes-list-watch.md, status-only writes are not changes. Empty = no MODIFIED.
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
    check(old.allocation != new.allocation, "allocation");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(json: serde_json::Value) -> ServiceView {
        ServiceView::from_service(&serde_json::from_value(json).unwrap())
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
    fn status_only_change_lists_no_field() {
        let a = view(serde_json::json!({"metadata": {"name": "a"}, "spec": {"type": "LoadBalancer"}}));
        let b = view(serde_json::json!({"metadata": {"name": "a"}, "spec": {"type": "LoadBalancer"},
            "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}}}));
        assert_ne!(a, b);
        assert_eq!(changed_fields(&a, &b), Vec::<&str>::new());
    }

    #[test]
    fn annotation_change_is_listed_alone() {
        let a = view(serde_json::json!({"metadata": {"name": "a", "annotations": {"x": "1"}}}));
        let b = view(serde_json::json!({"metadata": {"name": "a", "annotations": {"x": "2"}}}));
        assert_eq!(changed_fields(&a, &b), vec!["annotations"]);
    }

    #[test]
    fn requested_ips_take_the_first_annotation_present_and_vips_dedupe() {
        let v = view(serde_json::json!({"metadata": {"name": "a", "annotations": {
            "metallb.io/loadBalancerIPs": "198.51.100.1", "vipwatch.io/loadBalancerIPs": " 192.0.2.1, 2001:db8::1 ,bogus,,999.1.1.1"}},
            "spec": {"loadBalancerIP": "192.0.2.1"},
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
}
