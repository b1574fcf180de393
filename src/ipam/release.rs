//! Which pool addresses a recorded change takes away from the appliance. Such an address stays
//! reserved for the object that held it (see [`super::Allocator::withdraw`]) until every subscribed
//! endpoint acknowledged that change: the store writes one `releases` row per withdrawing event, and
//! the publisher reports it once acknowledged. So no other Service is announced with an address the
//! appliance may still serve for the first one.

use std::net::IpAddr;

use crate::model::{ChangeKind, Recorded, ServiceView, VipSource};

/// The pool addresses `view` holds (its allocation, when it comes from a pool).
pub fn pool_addresses(view: &ServiceView) -> Vec<IpAddr> {
    let allocation = view.allocation.as_ref().filter(|a| a.source == VipSource::Pool);
    allocation.map(|a| a.addresses.iter().filter_map(|s| s.parse().ok()).collect()).unwrap_or_default()
}

/// The pool addresses event `e` withdraws: for a DELETED every pool address of its (last) view; for a
/// MODIFIED the pool addresses of the view before that the view after no longer holds (type changed
/// away from `LoadBalancer`, another requested address, a pool that shrank, allocation now pending),
/// and every one it keeps when it stops serving one of its ports (port number or protocol changed or
/// removed): the appliance serves that port until the change is acknowledged, so a Service sharing
/// the address must not take it meanwhile (the reservation shares as the view before did, see
/// [`super::Allocator::withdraw`]); none for an ADDED.
pub fn withdrawn(e: &Recorded) -> Vec<IpAddr> {
    match e.kind {
        ChangeKind::Added => Vec::new(),
        ChangeKind::Deleted => pool_addresses(&e.view),
        ChangeKind::Modified => {
            let Some(previous) = e.previous.as_deref() else { return Vec::new() };
            let now = pool_addresses(&e.view);
            let ports_dropped = served(previous).any(|p| !served(&e.view).any(|q| q == p));
            pool_addresses(previous).into_iter().filter(|ip| ports_dropped || !now.contains(ip)).collect()
        }
    }
}

/// The ports `view` serves on its VIPs: `(port, protocol)`.
fn served(view: &ServiceView) -> impl Iterator<Item = (i32, &str)> {
    view.ports.iter().map(|p| (p.port, p.protocol.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Allocation;

    fn view(addresses: &[&str], source: VipSource) -> ServiceView {
        let json = serde_json::json!({"metadata": {"name": "a"}, "spec": {"type": "LoadBalancer"}});
        let mut v = ServiceView::from_service(&serde_json::from_value(json).unwrap());
        v.allocation = Some(Allocation {
            source,
            pool: None,
            addresses: addresses.iter().map(|s| s.to_string()).collect(),
            per_address: Vec::new(),
            hostname: None,
            reason: None,
        });
        v
    }

    fn event(kind: ChangeKind, before: Option<ServiceView>, after: ServiceView) -> Recorded {
        Recorded {
            kind,
            uid: "u".into(),
            resource_version: "1".into(),
            view: after.into(),
            previous: before.map(Into::into),
            changed: vec!["allocation"],
            backends: Default::default(),
            backends_diff: Default::default(),
            previous_backends: None,
        }
    }

    fn ips(list: &[&str]) -> Vec<IpAddr> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn deleted_withdraws_its_pool_addresses_and_modified_only_the_dropped_ones() {
        let two = view(&["192.0.2.1", "2001:db8::1"], VipSource::Pool);
        assert_eq!(withdrawn(&event(ChangeKind::Deleted, None, two.clone())), ips(&["192.0.2.1", "2001:db8::1"]));
        assert_eq!(withdrawn(&event(ChangeKind::Added, None, two.clone())), ips(&[]));
        let one = view(&["2001:db8::1"], VipSource::Pool);
        assert_eq!(withdrawn(&event(ChangeKind::Modified, Some(two.clone()), one)), ips(&["192.0.2.1"]));
        let mut plain = two.clone();
        plain.allocation = None;
        assert_eq!(
            withdrawn(&event(ChangeKind::Modified, Some(two), plain)),
            ips(&["192.0.2.1", "2001:db8::1"]),
            "type changed away from LoadBalancer"
        );
        let appliance = view(&["192.0.2.9"], VipSource::Appliance);
        assert_eq!(withdrawn(&event(ChangeKind::Deleted, None, appliance)), ips(&[]), "not ours to reserve");
    }

    /// A MODIFIED that keeps its addresses but stops serving one of its ports withdraws them all (the
    /// appliance still serves that port until it is acknowledged); one that only adds a port does not.
    #[test]
    fn a_modified_that_stops_serving_a_port_withdraws_the_addresses_it_keeps() {
        let with_ports = |ports: &[(i32, &str)]| {
            let mut v = view(&["192.0.2.1"], VipSource::Pool);
            v.ports = ports
                .iter()
                .map(|&(port, protocol)| crate::model::PortView {
                    name: None,
                    protocol: protocol.into(),
                    port,
                    target_port: port.to_string().into(),
                    node_port: None,
                    app_protocol: None,
                })
                .collect();
            v
        };
        let modified = |before: &[(i32, &str)], after: &[(i32, &str)]| {
            withdrawn(&event(ChangeKind::Modified, Some(with_ports(before)), with_ports(after)))
        };
        assert_eq!(modified(&[(443, "TCP")], &[(8443, "TCP")]), ips(&["192.0.2.1"]), "port changed");
        assert_eq!(modified(&[(53, "TCP")], &[(53, "UDP")]), ips(&["192.0.2.1"]), "protocol changed");
        assert_eq!(modified(&[(80, "TCP"), (443, "TCP")], &[(80, "TCP")]), ips(&["192.0.2.1"]), "port removed");
        assert_eq!(modified(&[(80, "TCP")], &[(80, "TCP"), (443, "TCP")]), ips(&[]), "port added");
        assert_eq!(modified(&[(80, "TCP")], &[(80, "TCP")]), ips(&[]), "ports unchanged");
    }
}
