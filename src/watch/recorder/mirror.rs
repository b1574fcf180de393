//! The recorder's mirror of the current-state table, with the counts derived from it kept up to date
//! as rows change: the use count of each VIP, the members per mode and state, and the Services
//! waiting for an address.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use vipwatch_contract::{BackendMode, MemberState};

use crate::model::{ServiceKey, Tracked};

/// The tracked Services by key, and what is counted over them.
#[derive(Debug, Default)]
pub(super) struct Mirror {
    services: HashMap<ServiceKey, Tracked>,
    /// How many tracked Services use each VIP (`vipwatch_vips_in_use` is its length).
    vip_refs: HashMap<String, usize>,
    /// Members over the tracked Services, per mode and state (`vipwatch_backend_members`).
    member_counts: BTreeMap<(BackendMode, MemberState), i64>,
    /// Services whose allocation has a reason and no address: retried, in namespace/name order, when
    /// an address frees up.
    waiting_for_address: BTreeSet<ServiceKey>,
}

impl Mirror {
    /// A mirror of `services` (the current-state table as loaded).
    pub fn new(services: HashMap<ServiceKey, Tracked>) -> Self {
        let mut mirror = Self { services: HashMap::with_capacity(services.len()), ..Self::default() };
        for (key, t) in services {
            mirror.insert(key, t);
        }
        mirror
    }

    /// The tracked state of `key`.
    pub fn get(&self, key: &ServiceKey) -> Option<&Tracked> {
        self.services.get(key)
    }

    /// Whether `key` is tracked.
    pub fn contains(&self, key: &ServiceKey) -> bool {
        self.services.contains_key(key)
    }

    /// Every tracked Service, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&ServiceKey, &Tracked)> {
        self.services.iter()
    }

    /// Every tracked key, in no particular order.
    pub fn keys(&self) -> impl Iterator<Item = &ServiceKey> {
        self.services.keys()
    }

    /// How many Services are tracked.
    pub fn len(&self) -> usize {
        self.services.len()
    }

    /// Distinct VIPs in use.
    pub fn vips_in_use(&self) -> usize {
        self.vip_refs.len()
    }

    /// Members per (mode, state), over every tracked Service.
    pub fn member_counts(&self) -> Vec<((BackendMode, MemberState), i64)> {
        self.member_counts.iter().map(|(k, n)| (*k, *n)).collect()
    }

    /// The Services waiting for an address, in namespace/name order.
    pub fn waiting_for_address(&self) -> &BTreeSet<ServiceKey> {
        &self.waiting_for_address
    }

    /// Tracks `tracked` as `key`; returns what it replaces.
    pub fn insert(&mut self, key: ServiceKey, tracked: Tracked) -> Option<Tracked> {
        self.count(&tracked, 1);
        if waits_for_address(&tracked) {
            self.waiting_for_address.insert(key.clone());
        } else {
            self.waiting_for_address.remove(&key);
        }
        let old = self.services.insert(key, tracked)?;
        self.count(&old, -1);
        Some(old)
    }

    /// Stops tracking `key`; returns what it was.
    pub fn remove(&mut self, key: &ServiceKey) -> Option<Tracked> {
        let old = self.services.remove(key)?;
        self.count(&old, -1);
        self.waiting_for_address.remove(key);
        Some(old)
    }

    /// Adds `delta` (+1 / -1) times `t` to the VIP use counts (dropping addresses no longer used)
    /// and to the member counts.
    fn count(&mut self, t: &Tracked, delta: isize) {
        for vip in t.view.vips() {
            let n = self.vip_refs.entry(vip.clone()).or_default();
            *n = n.saturating_add_signed(delta);
            if *n == 0 {
                self.vip_refs.remove(&vip);
            }
        }
        for (mode, b) in t.backends.iter() {
            for (_, m) in b.members() {
                *self.member_counts.entry((*mode, m.state)).or_default() += delta as i64;
            }
        }
    }
}

/// Whether `t` waits for an address (its allocation has a reason and no address).
fn waits_for_address(t: &Tracked) -> bool {
    t.view.allocation.as_ref().is_some_and(|a| a.reason.is_some())
}
