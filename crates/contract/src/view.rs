//! The normalized view of a Kubernetes Service: exactly the fields an external load balancer needs,
//! with Kubernetes defaults filled in so that equal Services compare equal. Serialized in camelCase,
//! as Kubernetes spells the fields.

use std::net::IpAddr;

use compact_str::CompactString;
use serde::{Deserialize, Serialize};

/// Annotations read as requested VIPs, in precedence order: the first one present wins. `vipwatch.io/`
/// is vipwatch's own; the MetalLB and Cilium keys are honoured so Services migrated from those
/// controllers keep their addresses. Values are comma-separated IP lists.
pub const REQUESTED_IP_ANNOTATIONS: [&str; 4] = [
    "vipwatch.io/loadBalancerIPs",
    "metallb.io/loadBalancerIPs",
    "metallb.universe.tf/loadBalancerIPs",
    "lbipam.cilium.io/ips",
];

/// The requested-IP annotation that counts in `annotations` — the first of [`REQUESTED_IP_ANNOTATIONS`]
/// present — and its entries: comma-separated, trimmed, empty ones left out. One reading for the view's
/// `requestedIPs` and for the allocator, so both follow the same annotation.
pub fn requested_ip_entries(annotations: &StringMap) -> Option<(&'static str, Vec<&str>)> {
    let (key, value) = REQUESTED_IP_ANNOTATIONS.iter().find_map(|k| annotations.get(*k).map(|v| (*k, v)))?;
    Some((key, value.split(',').map(str::trim).filter(|s| !s.is_empty()).collect()))
}

/// One Service port as the load balancer sees it (`spec.ports[]`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct PortView {
    /// Port name; required by Kubernetes only when a Service has several ports.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub name: Option<CompactString>,
    /// `TCP`, `UDP` or `SCTP`; Kubernetes' default `TCP` when absent.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub protocol: CompactString,
    /// The Service port the VIP listens on.
    pub port: i32,
    /// Target port on the Pods, as a string (a number or a named port); defaults to `port`.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub target_port: CompactString,
    /// NodePort on every Node, when allocated.
    pub node_port: Option<i32>,
    /// `appProtocol` hint (e.g. `http`, `kubernetes.io/h2c`).
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub app_protocol: Option<CompactString>,
}

/// One `status.loadBalancer.ingress[]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum VipSource {
    /// Allocated by vipwatch from a configured `[[pools]]` entry.
    Pool,
    /// Returned by a webhook endpoint configured with `assigns_vip = true`.
    Appliance,
}

impl VipSource {
    /// `pool` or `appliance`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pool => "pool",
            Self::Appliance => "appliance",
        }
    }
}

/// An IP address family, spelt as `spec.ipFamilies` spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum IpFamily {
    /// IPv4.
    IPv4,
    /// IPv6.
    IPv6,
}

impl IpFamily {
    /// The family of `ip`.
    pub fn of(ip: &IpAddr) -> Self {
        if ip.is_ipv4() { Self::IPv4 } else { Self::IPv6 }
    }

    /// The family of `address` when it is an IP address (`None` for a DNS name or anything else).
    pub fn of_address(address: &str) -> Option<Self> {
        address.parse().ok().map(|ip| Self::of(&ip))
    }

    /// `IPv4` or `IPv6`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::IPv4 => "IPv4",
            Self::IPv6 => "IPv6",
        }
    }
}

/// One address of an allocation, with its family and the pool it comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AllocatedAddress {
    /// The address, as in `addresses`.
    pub address: String,
    /// Its family.
    pub family: IpFamily,
    /// The pool it comes from (`source = pool`); `null` for an appliance-assigned address.
    pub pool: Option<String>,
}

/// The addresses vipwatch assigned to a Service (or why it has none yet). Part of the view, so a
/// change of allocation is a MODIFIED (`changed: ["allocation"]`) and reaches the appliance.
///
/// A Service may hold addresses of two pools: addresses it requested explicitly (an IPv4 in one pool,
/// an IPv6 in another) are each taken from the pool that contains them, while an allocation vipwatch
/// chooses takes every address from one pool. `pool` names the first address's pool, as it always
/// did; `perAddress` says which pool each address comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Allocation {
    /// `pool` or `appliance`.
    pub source: VipSource,
    /// The pool of the first address (`source = pool`); `null` while pending and for `appliance`. The
    /// pool of every address when they all come from one; otherwise see `perAddress`.
    pub pool: Option<String>,
    /// The VIPs, primary family first; empty while pending.
    pub addresses: Vec<String>,
    /// Each of `addresses`, in the same order, with its family and pool. Empty only in an allocation
    /// stored by a vipwatch before this field (completed at the first start after the upgrade).
    #[serde(default)]
    pub per_address: Vec<AllocatedAddress>,
    /// A DNS name instead of addresses (`source = appliance` only).
    pub hostname: Option<String>,
    /// Why there is no address (impossible request, pool exhausted); `None` once allocated.
    pub reason: Option<String>,
}

impl Allocation {
    /// A pool allocation with no address, for `reason`.
    pub fn pending(reason: String) -> Self {
        Self {
            source: VipSource::Pool,
            pool: None,
            addresses: Vec::new(),
            per_address: Vec::new(),
            hostname: None,
            reason: Some(reason),
        }
    }

    /// A pool allocation of `addresses`, each with the name of the pool it comes from, primary family
    /// first. `pool` is the first one's.
    pub fn from_pools(addresses: Vec<(IpAddr, String)>) -> Self {
        let pool = addresses.first().map(|(_, p)| p.clone());
        let per_address: Vec<AllocatedAddress> = addresses
            .into_iter()
            .map(|(ip, pool)| AllocatedAddress { address: ip.to_string(), family: IpFamily::of(&ip), pool: Some(pool) })
            .collect();
        let addresses = per_address.iter().map(|a| a.address.clone()).collect();
        Self { source: VipSource::Pool, pool, addresses, per_address, hostname: None, reason: None }
    }

    /// The addresses or DNS name an appliance returned (`source = appliance`). `addresses` that are not
    /// IP addresses have no `perAddress` entry (the relay accepts only IP addresses).
    pub fn from_appliance(addresses: Vec<String>, hostname: Option<String>) -> Self {
        let per_address = addresses
            .iter()
            .filter_map(|a| Some(AllocatedAddress { address: a.clone(), family: IpFamily::of_address(a)?, pool: None }))
            .collect();
        Self { source: VipSource::Appliance, pool: None, addresses, per_address, hostname, reason: None }
    }

    /// The pool `address` (one of `addresses`) comes from: its `perAddress` entry's, or `pool` for an
    /// allocation stored without `perAddress`; `None` for an appliance's address or one not allocated.
    pub fn pool_of(&self, address: &str) -> Option<&str> {
        if self.source != VipSource::Pool || !self.addresses.iter().any(|a| a == address) {
            return None;
        }
        if self.per_address.is_empty() {
            return self.pool.as_deref();
        }
        self.per_address.iter().find(|a| a.address == address).and_then(|a| a.pool.as_deref())
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

/// A string-to-string map of a Service (labels, annotations, the selector): a vector sorted by key
/// ([`litemap::LiteMap`]). A Service's few entries take one allocation of their own size, where a
/// `BTreeMap` allocates a node with room for 11 (megabytes for many Services). Serialized as a JSON
/// object with its keys in order, as the `BTreeMap` was.
/// Written with [`object`]: litemap itself writes an empty map as `[]` to human-readable formats.
pub type StringMap = litemap::LiteMap<CompactString, CompactString>;

/// A [`StringMap`] from a `BTreeMap` (k8s-openapi's type for labels, annotations and selectors), in
/// one allocation of exactly its entries: collecting would start its vector at room for 4 (48 bytes
/// an entry), and a Service's two labels and one-entry selector then took 384 bytes where 144 do.
pub fn string_map(map: std::collections::BTreeMap<String, String>) -> StringMap {
    let mut entries = Vec::with_capacity(map.len());
    entries.extend(map.into_iter().map(|(k, v)| (CompactString::from(k), CompactString::from(v))));
    // A BTreeMap iterates in key order without repeats: what LiteMap's store requires.
    litemap::LiteMap::from_sorted_store_unchecked(entries)
}

/// `map` in an allocation of exactly its entries (none when empty): maps read from JSON grow their
/// vector like [`string_map`]'s collect would.
pub fn compact_map(map: StringMap) -> StringMap {
    let mut entries = map.into_tuple_vec();
    entries.shrink_to_fit();
    litemap::LiteMap::from_sorted_store_unchecked(entries)
}

/// Serializes any [`litemap::LiteMap`] — a [`StringMap`], the controller's members per mode — as a
/// JSON object (`{}` when empty), keys in order (serde `serialize_with`): litemap itself writes an
/// empty map as `[]` to human-readable formats. Reading takes litemap's own `Deserialize`, which
/// accepts an object in any key order.
///
/// # Errors
/// Whatever `serializer` returns for a key or value it cannot write (JSON: a key that is not a string).
pub fn object<K, V, S>(map: &litemap::LiteMap<K, V>, serializer: S) -> Result<S::Ok, S::Error>
where
    K: Serialize + Ord,
    V: Serialize,
    S: serde::Serializer,
{
    serializer.collect_map(map.iter())
}

/// The normalized, LB-relevant view of one Service. Every field except `ingress`, `finalizers` and
/// `deleting` takes part in the controller's MODIFIED decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ServiceView {
    /// `spec.type`; Kubernetes' default `ClusterIP` when absent.
    #[serde(rename = "type")]
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub service_type: CompactString,
    /// `spec.loadBalancerClass`.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub load_balancer_class: Option<CompactString>,
    /// `spec.ports`, in the order given.
    pub ports: Vec<PortView>,
    /// `spec.selector` (empty for Services without a selector).
    #[cfg_attr(feature = "openapi", schema(value_type = std::collections::BTreeMap<String, String>))]
    #[serde(serialize_with = "object")]
    pub selector: StringMap,
    /// `spec.externalTrafficPolicy` (`Cluster` or `Local`).
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub external_traffic_policy: Option<CompactString>,
    /// `spec.healthCheckNodePort` (only with `externalTrafficPolicy: Local`).
    pub health_check_node_port: Option<i32>,
    /// `spec.sessionAffinity`; Kubernetes' default `None` when absent.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub session_affinity: CompactString,
    /// `spec.sessionAffinityConfig.clientIP.timeoutSeconds`, in seconds.
    pub session_affinity_timeout_seconds: Option<i32>,
    /// `spec.loadBalancerSourceRanges` (CIDRs allowed to reach the VIP).
    pub load_balancer_source_ranges: Vec<String>,
    /// `spec.externalIPs`. JSON `externalIPs`, Kubernetes' spelling and the name `changed` uses
    /// (`externalIps` is still read: rows stored before 0.1 spelt it so).
    #[serde(rename = "externalIPs", alias = "externalIps")]
    pub external_ips: Vec<String>,
    /// `spec.ipFamilies` (`IPv4`, `IPv6`), in order of preference.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>))]
    pub ip_families: Vec<CompactString>,
    /// `spec.ipFamilyPolicy` (`SingleStack`, `PreferDualStack`, `RequireDualStack`).
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub ip_family_policy: Option<CompactString>,
    /// `spec.allocateLoadBalancerNodePorts`.
    pub allocate_load_balancer_node_ports: Option<bool>,
    /// `spec.loadBalancerIP` (deprecated upstream, still honoured), in the canonical form of its address
    /// (as `requestedIPs`); `None` unless it is an IP address. JSON `loadBalancerIP`, as in Kubernetes and `changed` (`loadBalancerIp` is still read).
    #[serde(rename = "loadBalancerIP", alias = "loadBalancerIp")]
    pub load_balancer_ip: Option<String>,
    /// IPs requested by annotation (the first present of `vipwatch.io/loadBalancerIPs`,
    /// `metallb.io/loadBalancerIPs`, `metallb.universe.tf/loadBalancerIPs`, `lbipam.cilium.io/ips`),
    /// in order, normalized: trimmed and written in the canonical form (`2001:DB8:0::1` becomes
    /// `2001:db8::1`, the form the allocation and the status use); entries that are not IP addresses
    /// are dropped (the allocation's `reason` names them). The deprecated `spec.loadBalancerIP` is not
    /// repeated here: it is `loadBalancerIP`. JSON `requestedIPs`, the name `changed` uses
    /// (`requestedIps` is still read).
    #[serde(rename = "requestedIPs", alias = "requestedIps")]
    pub requested_ips: Vec<String>,
    /// `status.loadBalancer.ingress`: the addresses currently published. Status only: a change here
    /// alone is not a MODIFIED.
    pub ingress: Vec<IngressView>,
    /// `metadata.labels`.
    #[cfg_attr(feature = "openapi", schema(value_type = std::collections::BTreeMap<String, String>))]
    #[serde(serialize_with = "object")]
    pub labels: StringMap,
    /// `metadata.annotations`.
    #[cfg_attr(feature = "openapi", schema(value_type = std::collections::BTreeMap<String, String>))]
    #[serde(serialize_with = "object")]
    pub annotations: StringMap,
    /// The VIPs vipwatch assigned (pools, or an appliance with `assigns_vip`), or why none yet; `None`
    /// when vipwatch does not assign this Service's addresses.
    #[serde(default)]
    pub allocation: Option<Allocation>,
    /// `metadata.finalizers`. Metadata only: a change here alone is not a MODIFIED.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>))]
    pub finalizers: Vec<CompactString>,
    /// Whether `metadata.deletionTimestamp` is set: the object is being deleted and waits for its
    /// finalizers.
    #[serde(default)]
    pub deleting: bool,
}

impl ServiceView {
    /// Gives back the spare capacity of every vector and map in the view. A view is kept for each
    /// Service the controller tracks (its in-memory mirror), and vectors built by pushing or read
    /// from JSON keep room for 4 entries where Services mostly have one or two: megabytes of the
    /// controller's heap with many Services.
    pub fn shrink_to_fit(&mut self) {
        self.ports.shrink_to_fit();
        self.load_balancer_source_ranges.shrink_to_fit();
        self.external_ips.shrink_to_fit();
        self.ip_families.shrink_to_fit();
        self.requested_ips.shrink_to_fit();
        self.ingress.shrink_to_fit();
        self.finalizers.shrink_to_fit();
        for map in [&mut self.selector, &mut self.labels, &mut self.annotations] {
            *map = compact_map(std::mem::take(map));
        }
        if let Some(a) = &mut self.allocation {
            a.addresses.shrink_to_fit();
            a.per_address.shrink_to_fit();
        }
    }

    /// Whether this is a Service of type `LoadBalancer`: the only type with a load balancer, so the
    /// only one with VIPs ([`Self::vip_sources`]) and a `status.loadBalancer` of its own.
    pub fn is_load_balancer(&self) -> bool {
        self.service_type == "LoadBalancer"
    }

    /// The VIPs of this Service with where each comes from. When vipwatch assigns this Service's
    /// addresses ([`Self::allocation`] is set), exactly the allocated ones, with source `pool` or
    /// `appliance` (none while pending). Otherwise, in this order and without repeats: `status`
    /// (published ingress IPs and hostnames), then `annotation` (requested IPs), then `spec`
    /// (`spec.loadBalancerIP`). None for a Service of another type (in scope with
    /// `kubernetes.service_types`): all three are load-balancer fields, and a status left from before
    /// a type change away from `LoadBalancer` names an address the appliance must stop serving for it,
    /// which a pool may give to another Service. Returns `(address, source)` pairs.
    pub fn vip_sources(&self) -> Vec<(String, &'static str)> {
        if let Some(a) = &self.allocation {
            let source = a.source.as_str();
            return a.addresses.iter().chain(&a.hostname).map(|v| (v.clone(), source)).collect();
        }
        if !self.is_load_balancer() {
            return Vec::new();
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

    /// The VIP addresses only, as in [`Self::vip_sources`].
    pub fn vips(&self) -> Vec<String> {
        self.vip_sources().into_iter().map(|(a, _)| a).collect()
    }

    /// The `status.loadBalancer.ingress` vipwatch should publish, when it differs from what the Service
    /// shows: `Some(list)` (possibly empty, to clear) for a Service whose addresses vipwatch assigns,
    /// `Some(empty)` for a Service of another type than `LoadBalancer` that still shows one (left from
    /// before a type change: cleared once the change is acknowledged, as the upstream service
    /// controller clears it once the load balancer is gone), `None` when the status is right or not
    /// vipwatch's to write.
    pub fn status_to_publish(&self) -> Option<Vec<IngressView>> {
        let want = match &self.allocation {
            Some(a) => a.ingress(),
            None if !self.is_load_balancer() => Vec::new(),
            None => return None,
        };
        (want != self.ingress).then_some(want)
    }

    /// The IP families the Service uses, primary first: `spec.ipFamilies`, or `["IPv4"]` when the
    /// apiserver left it out (single-stack IPv4 clusters before 1.20).
    pub fn families(&self) -> Vec<&str> {
        if self.ip_families.is_empty() {
            vec!["IPv4"]
        } else {
            self.ip_families.iter().map(CompactString::as_str).collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{CompactString, ServiceView, StringMap};

    /// Labels, annotations and selectors read and write as the `BTreeMap` they replaced: a JSON object
    /// (`{}` when empty) with its keys in order, whatever order a row, a payload or a user wrote them
    /// in; a repeated key keeps its last value, as serde_json's `BTreeMap` did.
    #[test]
    fn string_maps_are_json_objects_in_key_order_and_the_last_of_a_repeated_key_wins() {
        let row = r#"{"type": "LoadBalancer", "loadBalancerClass": null, "ports": [], "selector": {"tier": "web", "app": "shop"},
            "externalTrafficPolicy": null, "healthCheckNodePort": null, "sessionAffinity": "None",
            "sessionAffinityTimeoutSeconds": null, "loadBalancerSourceRanges": [], "externalIPs": [],
            "ipFamilies": [], "ipFamilyPolicy": null, "allocateLoadBalancerNodePorts": null,
            "loadBalancerIP": null, "requestedIPs": [], "ingress": [], "labels": {"env": "a", "app": "shop", "env": "b"},
            "annotations": {}}"#;
        let view: ServiceView = serde_json::from_str(row).unwrap();
        assert_eq!((view.labels.get("env").map(CompactString::as_str), view.labels.len()), (Some("b"), 2));
        let json = serde_json::to_value(&view).unwrap();
        assert_eq!(json["selector"].to_string(), r#"{"app":"shop","tier":"web"}"#);
        assert_eq!(json["labels"].to_string(), r#"{"app":"shop","env":"b"}"#);
        assert_eq!(json["annotations"].to_string(), "{}");
        let empty = ServiceView { labels: StringMap::new(), ..view };
        assert_eq!(serde_json::to_value(&empty).unwrap()["labels"].to_string(), "{}");
    }

    #[test]
    fn ip_fields_are_spelt_as_in_kubernetes_and_in_changed_and_old_rows_still_read() {
        let old = serde_json::json!({"type": "LoadBalancer", "loadBalancerClass": null, "ports": [], "selector": {},
            "externalTrafficPolicy": null, "healthCheckNodePort": null, "sessionAffinity": "None",
            "sessionAffinityTimeoutSeconds": null, "loadBalancerSourceRanges": [], "externalIps": ["198.51.100.7"],
            "ipFamilies": [], "ipFamilyPolicy": null, "allocateLoadBalancerNodePorts": null,
            "loadBalancerIp": "192.0.2.9", "requestedIps": ["192.0.2.10"], "ingress": [], "labels": {}, "annotations": {}});
        let view: ServiceView = serde_json::from_value(old).unwrap();
        assert_eq!((view.external_ips.len(), view.load_balancer_ip.as_deref()), (1, Some("192.0.2.9")));
        let new = serde_json::to_value(&view).unwrap();
        assert_eq!(new["externalIPs"], serde_json::json!(["198.51.100.7"]));
        assert_eq!(new["loadBalancerIP"], "192.0.2.9");
        assert_eq!(new["requestedIPs"], serde_json::json!(["192.0.2.10"]));
        assert!(new.get("externalIps").is_none());
    }
}
