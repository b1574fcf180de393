//! What a Service asks for, read from its annotations and spec: explicit addresses, a pool, a sharing
//! key, the address families (`spec.ipFamilies` / `spec.ipFamilyPolicy`) and its ports.

use std::net::IpAddr;

use vipwatch_contract::CompactString;

use super::pool::Family;
use crate::model::ServiceView;
use crate::model::bounded::{QUOTE, bounded};
use vipwatch_contract::requested_ip_entries;

pub use crate::model::annotations::{POOL_ANNOTATION, SHARED_IP_ANNOTATION};

/// Which families to allocate, primary first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Families {
    /// One address of this family (`SingleStack`, or no policy).
    Single(Family),
    /// One of each, both required (`RequireDualStack`).
    Require([Family; 2]),
    /// One of each where a pool has it, at least one (`PreferDualStack`).
    Prefer([Family; 2]),
}

impl Families {
    /// The families in order of preference.
    pub fn list(&self) -> &[Family] {
        match self {
            Self::Single(f) => std::slice::from_ref(f),
            Self::Require(fs) | Self::Prefer(fs) => fs,
        }
    }

    /// Whether an allocation must include `family`.
    pub fn requires(&self, family: Family) -> bool {
        match self {
            Self::Single(f) => *f == family,
            Self::Require(_) => true,
            Self::Prefer(_) => false,
        }
    }
}

/// A Service's allocation request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Explicit addresses (`vipwatch.io/loadBalancerIPs` or a compatible annotation, else the
    /// deprecated `spec.loadBalancerIP`); empty = any address.
    pub ips: Vec<IpAddr>,
    /// `vipwatch.io/address-pool`.
    pub pool: Option<String>,
    /// `vipwatch.io/allow-shared-ip`.
    pub sharing_key: Option<String>,
    /// Families to allocate when `ips` is empty.
    pub families: Families,
    /// `(port, protocol)` pairs, for the sharing rule.
    pub ports: Vec<(i32, CompactString)>,
    /// `metadata.labels`, for the pools' `service_selector`.
    pub labels: vipwatch_contract::StringMap,
}

/// Reads the request of `view`. Errors: a message for the `AllocationFailed` Event when the request
/// is impossible as written (an entry that is not an IP address, two addresses of one family,
/// `RequireDualStack` with a single requested address).
pub fn read(view: &ServiceView) -> Result<Request, String> {
    let ips = requested_ips(view)?;
    let families = families(view);
    if matches!(families, Families::Require(_)) && ips.len() == 1 {
        return Err("ipFamilyPolicy RequireDualStack needs one IPv4 and one IPv6 address, one was requested".into());
    }
    let annotation = |k: &str| view.annotations.get(k).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
    Ok(Request {
        ips,
        pool: annotation(POOL_ANNOTATION),
        sharing_key: annotation(SHARED_IP_ANNOTATION),
        families,
        ports: view.ports.iter().map(|p| (p.port, p.protocol.clone())).collect(),
        labels: view.labels.clone(),
    })
}

/// The addresses of the requested-IP annotation that counts (read as the view's `requestedIPs` is,
/// [`requested_ip_entries`], but refusing an entry that is not an address), else `spec.loadBalancerIP`.
fn requested_ips(view: &ServiceView) -> Result<Vec<IpAddr>, String> {
    let ips: Vec<IpAddr> = match requested_ip_entries(&view.annotations) {
        Some((key, entries)) => entries
            .into_iter()
            .map(|s| {
                s.parse().map_err(|_| format!("`{}` in annotation {key} is not an IP address", bounded(s, QUOTE)))
            })
            .collect::<Result<_, _>>()?,
        None => view.load_balancer_ip.iter().filter_map(|s| s.parse().ok()).collect(),
    };
    if ips.len() > 2 || (ips.len() == 2 && Family::of(&ips[0]) == Family::of(&ips[1])) {
        let list: Vec<String> = ips.iter().map(IpAddr::to_string).collect();
        let got = list.join(", ");
        return Err(format!("at most one IPv4 and one IPv6 address can be requested, got {}", bounded(&got, QUOTE)));
    }
    Ok(ips)
}

/// Families from `spec.ipFamilies` (apiserver-defaulted; `IPv4` when absent) and `spec.ipFamilyPolicy`.
fn families(view: &ServiceView) -> Families {
    let parse = |s: &CompactString| if s == "IPv6" { Family::V6 } else { Family::V4 };
    let primary = view.ip_families.first().map(parse).unwrap_or(Family::V4);
    let other = if primary == Family::V4 { Family::V6 } else { Family::V4 };
    match view.ip_family_policy.as_deref() {
        Some("RequireDualStack") => Families::Require([primary, other]),
        Some("PreferDualStack") => Families::Prefer([primary, other]),
        _ => Families::Single(primary),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(json: serde_json::Value) -> ServiceView {
        ServiceView::from_service(&serde_json::from_value(json).unwrap())
    }

    #[test]
    fn reads_annotations_spec_and_families() {
        let v = view(serde_json::json!({"metadata": {"name": "a", "annotations": {
            "vipwatch.io/loadBalancerIPs": "192.0.2.7, 2001:db8::7", POOL_ANNOTATION: "lab", SHARED_IP_ANNOTATION: "k"}},
            "spec": {"ipFamilyPolicy": "RequireDualStack", "ipFamilies": ["IPv6", "IPv4"], "ports": [{"port": 53, "protocol": "UDP"}]}}));
        let r = read(&v).unwrap();
        assert_eq!(r.ips, vec!["192.0.2.7".parse::<IpAddr>().unwrap(), "2001:db8::7".parse().unwrap()]);
        assert_eq!((r.pool.as_deref(), r.sharing_key.as_deref()), (Some("lab"), Some("k")));
        assert_eq!(r.families, Families::Require([Family::V6, Family::V4]));
        assert_eq!(r.ports, vec![(53, "UDP".into())]);
        let legacy = view(serde_json::json!({"metadata": {"name": "a"}, "spec": {"loadBalancerIP": "198.51.100.1"}}));
        assert_eq!(read(&legacy).unwrap().ips, vec!["198.51.100.1".parse::<IpAddr>().unwrap()]);
        assert_eq!(read(&legacy).unwrap().families, Families::Single(Family::V4));
    }

    #[test]
    fn impossible_requests_say_why() {
        let bad = view(
            serde_json::json!({"metadata": {"name": "a", "annotations": {"vipwatch.io/loadBalancerIPs": "192.0.2.1,bogus"}}}),
        );
        assert_eq!(read(&bad).unwrap_err(), "`bogus` in annotation vipwatch.io/loadBalancerIPs is not an IP address");
        let two = view(
            serde_json::json!({"metadata": {"name": "a", "annotations": {"vipwatch.io/loadBalancerIPs": "192.0.2.1,192.0.2.2"}}}),
        );
        assert_eq!(
            read(&two).unwrap_err(),
            "at most one IPv4 and one IPv6 address can be requested, got 192.0.2.1, 192.0.2.2"
        );
    }
}
