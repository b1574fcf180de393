//! Which pool addresses a recorded change takes away from the appliance. Such an address stays
//! reserved for the object that held it (see [`super::Allocator::withdraw`]) until every subscribed
//! endpoint acknowledged that change: the store writes one `releases` row per withdrawing event, and
//! the publisher reports it once acknowledged. So no other Service is announced with an address the
//! appliance may still serve for the first one (issue 12).

use std::net::IpAddr;

use crate::model::{ChangeKind, Recorded, ServiceView, VipSource};

/// The pool addresses `view` holds (its allocation, when it comes from a pool).
pub fn pool_addresses(view: &ServiceView) -> Vec<IpAddr> {
    let allocation = view.allocation.as_ref().filter(|a| a.source == VipSource::Pool);
    allocation.map(|a| a.addresses.iter().filter_map(|s| s.parse().ok()).collect()).unwrap_or_default()
}

/// The pool addresses event `e` withdraws: for a DELETED every pool address of its (last) view; for a
/// MODIFIED the pool addresses of the view before that the view after no longer holds (type changed
/// away from `LoadBalancer`, another requested address, a pool that shrank, allocation now pending);
/// none for an ADDED.
pub fn withdrawn(e: &Recorded) -> Vec<IpAddr> {
    match e.kind {
        ChangeKind::Added => Vec::new(),
        ChangeKind::Deleted => pool_addresses(&e.view),
        ChangeKind::Modified => {
            let now = pool_addresses(&e.view);
            let before = e.previous.as_deref().map(pool_addresses).unwrap_or_default();
            before.into_iter().filter(|ip| !now.contains(ip)).collect()
        }
    }
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
}
