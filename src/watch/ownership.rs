//! What vipwatch adds to each recorded change of a Service it owns: the VIP allocation (pools or
//! appliance), whether its deliveries wait for the finalizer, the cleanup after a DELETED, and the
//! Kubernetes Events to publish. Used by the [`super::Recorder`]; no I/O.

use std::net::IpAddr;

use crate::ipam::Allocator;
use crate::model::{
    Allocation, Assignment, ChangeKind, FINALIZER, Notice, Observed, Reason, Recorded, ServiceKey, ServiceView,
    Tracked, VipSource,
};
use crate::store::Cleanup;

/// The allocator and the write-back switches.
pub struct Ownership {
    /// Address book of the configured pools.
    pub allocator: Allocator,
    /// `kubernetes.finalizer`.
    pub finalizer: bool,
}

impl Ownership {
    /// Fills in `obs.view.allocation` for an in-scope observation: an appliance-assigned address of the
    /// same object is kept while it is a LoadBalancer; otherwise the allocator decides (when it manages
    /// the Service). A Service of another type gets none, so its VIPs are withdrawn (see
    /// `ServiceView::vip_sources`).
    pub fn allocate(&mut self, current: Option<&Tracked>, obs: &mut Observed) {
        if !obs.in_scope {
            return;
        }
        let current = current.filter(|t| t.uid == obs.uid).and_then(|t| t.view.allocation.as_ref());
        if let Some(a) = current.filter(|a| a.source == VipSource::Appliance && obs.view.is_load_balancer()) {
            std::sync::Arc::make_mut(&mut obs.view).allocation = Some(a.clone());
        } else if self.allocator.manages(&obs.view) {
            let assigned = self.allocator.assign(&obs.key, &obs.view, &[]);
            std::sync::Arc::make_mut(&mut obs.view).allocation = Some(assigned);
        }
    }

    /// At start, before anything else is allocated: Services without a stored allocation take the
    /// pool addresses their `status.loadBalancer.ingress` already shows, so a lost database never
    /// re-numbers a VIP.
    pub fn adopt(&mut self, current: Option<&Tracked>, obs: &Observed) {
        let stored = current.and_then(|t| t.view.allocation.as_ref()).is_some_and(|a| !a.addresses.is_empty());
        if stored || !obs.in_scope || !self.allocator.manages(&obs.view) {
            return;
        }
        let published: Vec<IpAddr> = obs
            .view
            .ingress
            .iter()
            .filter_map(|i| i.ip.as_ref()?.parse().ok())
            .filter(|ip| self.allocator.in_pools(ip))
            .collect();
        if published.is_empty() {
            return;
        }
        let got = self.allocator.assign(&obs.key, &obs.view, &published);
        let adopted = got.addresses.iter().all(|a| published.iter().any(|p| p.to_string() == *a));
        if got.addresses.is_empty() || !adopted {
            // Not what it shows (taken, or no longer requested): the regular pass decides, after the
            // other adoptions and the explicit requests.
            self.allocator.release(&obs.key);
        }
    }

    /// At start, after [`Self::adopt`] and before auto-assignment: Services that request explicit
    /// addresses take them, so a Service without a request cannot grab them first.
    pub fn reserve_requested(&mut self, current: Option<&Tracked>, obs: &Observed) {
        let stored = current.and_then(|t| t.view.allocation.as_ref()).is_some_and(|a| !a.addresses.is_empty());
        if stored || !obs.in_scope || !self.allocator.manages(&obs.view) || self.allocator.uses_addresses(&obs.key) {
            return;
        }
        if crate::ipam::request::read(&obs.view).is_ok_and(|r| !r.ips.is_empty()) {
            self.allocator.assign(&obs.key, &obs.view, &[]);
        }
    }

    /// The view of `t` with the appliance's addresses, as an observation to decide on.
    pub fn assigned(t: &Tracked, a: Assignment) -> Observed {
        let mut view = (*t.view).clone();
        view.allocation = Some(Allocation::from_appliance(a.addresses, a.hostname));
        let (uid, resource_version, backends) = (t.uid.clone(), t.resource_version.clone(), t.backends.clone());
        Observed { key: a.key, uid, resource_version, view: view.into(), in_scope: true, backends }
    }

    /// Whether the deliveries of `e` wait for the finalizer: it is on, the event is not a DELETED, and
    /// the object does not carry the finalizer yet (the store's `awaits_finalizer` flag of the event).
    pub fn waits_for_finalizer(&self, e: &Recorded) -> bool {
        self.finalizer && e.kind != ChangeKind::Deleted && !e.view.finalizers.iter().any(|f| f == FINALIZER)
    }

    /// For a DELETED of an object that still exists (`live` is its current view; same uid): remove our
    /// finalizer if it carries it, clear the status we published unless it is being deleted anyway.
    pub fn cleanup(e: &Recorded, live: Option<&Observed>) -> Option<Cleanup> {
        let live = live.filter(|o| e.kind == ChangeKind::Deleted && o.uid == e.uid)?;
        let remove_finalizer = live.view.finalizers.iter().any(|f| f == FINALIZER);
        let published = e.view.allocation.as_ref().map(Allocation::ingress).unwrap_or_default();
        let clear_ingress = if live.view.deleting { Vec::new() } else { published };
        (remove_finalizer || !clear_ingress.is_empty()).then_some(Cleanup { remove_finalizer, clear_ingress })
    }

    /// Kubernetes Events for a recorded change of a Service whose addresses vipwatch assigns:
    /// `IPAllocated` when it got new addresses, `AllocationFailed` when it has none and the reason is
    /// new, `EnsuringLoadBalancer` for an ADDED and for a MODIFIED of what the load balancer is made of
    /// ([`ensures`]).
    pub fn notices(key: &ServiceKey, e: &Recorded, before: Option<&ServiceView>) -> Vec<Notice> {
        let Some(now) = e.view.allocation.as_ref().filter(|_| e.kind != ChangeKind::Deleted) else {
            return Vec::new();
        };
        let was = before.and_then(|v| v.allocation.as_ref());
        let notice = |reason, note| Notice { key: key.clone(), uid: e.uid.clone(), reason, note };
        let mut out = Vec::new();
        if let Some(reason) = &now.reason {
            if was.and_then(|a| a.reason.as_ref()) != Some(reason) {
                out.push(notice(Reason::AllocationFailed, reason.clone()));
            }
        } else if was.map(|a| (&a.addresses, &a.hostname)) != Some((&now.addresses, &now.hostname)) {
            out.push(notice(Reason::IPAllocated, allocated_note(now)));
        }
        if ensures(e.kind, &e.changed) {
            out.push(notice(Reason::EnsuringLoadBalancer, "Ensuring load balancer".into()));
        }
        out
    }
}

/// The note of an `IPAllocated` Event: the addresses and where they come from. `Assigned 192.0.2.5,
/// 2001:db8::5 from pool lab` when one pool gave them all, `Assigned 192.0.2.5 from pool v4,
/// 2001:db8::51 from pool v6` when each comes from another, `… by the appliance` for an appliance's.
fn allocated_note(a: &Allocation) -> String {
    let pools: Vec<Option<&str>> = a.addresses.iter().map(|ip| a.pool_of(ip)).collect();
    let from = |pool: Option<&str>| pool.map_or_else(|| " by the appliance".to_owned(), |p| format!(" from pool {p}"));
    if pools.windows(2).all(|w| w[0] == w[1]) {
        let what: Vec<&str> = a.addresses.iter().chain(&a.hostname).map(String::as_str).collect();
        return format!("Assigned {}{}", what.join(", "), from(pools.first().copied().flatten()));
    }
    let each: Vec<String> = a.addresses.iter().zip(pools).map(|(ip, pool)| format!("{ip}{}", from(pool))).collect();
    format!("Assigned {}", each.join(", "))
}

/// Whether a recorded change makes the appliance ensure the load balancer anew, which
/// `EnsuringLoadBalancer` announces: an ADDED, or a MODIFIED of anything but the labels and the
/// members. The upstream service controller (Kubernetes' cloud-provider library) leaves labels out
/// of its `needsUpdate` the same way; members changing are its node sync, which announces nothing per
/// Service either. A Service relabelled in a loop would otherwise write an Event to the apiserver for
/// every change.
fn ensures(kind: ChangeKind, changed: &[&str]) -> bool {
    match kind {
        ChangeKind::Added => true,
        ChangeKind::Modified => changed.iter().any(|f| !matches!(*f, "labels" | "backends")),
        ChangeKind::Deleted => false,
    }
}

#[cfg(test)]
mod tests {
    use super::ensures;
    use crate::model::ChangeKind::{Added, Deleted, Modified};

    #[test]
    fn ensuring_is_announced_for_what_the_load_balancer_is_made_of_and_not_for_labels_or_members() {
        let cases: [(_, &[&str], bool); 8] = [
            (Added, &[], true),
            (Modified, &["labels"], false),
            (Modified, &["backends"], false),
            (Modified, &["labels", "backends"], false),
            (Modified, &["ports"], true),
            (Modified, &["allocation"], true),
            (Modified, &["labels", "annotations"], true),
            (Deleted, &[], false),
        ];
        for (kind, changed, want) in cases {
            assert_eq!(ensures(kind, changed), want, "{kind:?} {changed:?}");
        }
    }
}
