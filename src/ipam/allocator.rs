//! The allocator: which Service holds which address. Deterministic — a Service keeps the addresses it
//! holds (or is told to prefer) while they still satisfy its request; otherwise it gets the lowest free
//! address of the first pool (config order) that accepts it — and it never looks at the clock or at
//! randomness, so the same inputs in the same order give the same addresses.

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::IpAddr;

use vipwatch_contract::CompactString;

use super::pool::{Family, Pool, Pools, lowest};
use super::request::{self, Families, Request};
use crate::model::bounded::{QUOTE, bounded};
use crate::model::{Allocation, ServiceKey, ServiceView, VipSource};

/// Who uses an address.
#[derive(Debug, Clone)]
struct Holder {
    key: ServiceKey,
    sharing_key: Option<String>,
    ports: Vec<(i32, CompactString)>,
    /// `Some(uid)`: the Service gave the address up (its DELETED, or a MODIFIED that withdrew it) and
    /// the appliance has not acknowledged that yet; the address stays reserved, shared as the view
    /// that used it shared it (`sharing_key`, `ports`; see [`Allocator::withdraw`]).
    draining: Option<String>,
}

/// The sharing key and ports a holder with `view` shares an address by (none without a view, or with
/// one whose request does not read).
fn sharing(view: Option<&ServiceView>) -> (Option<String>, Vec<(i32, CompactString)>) {
    match view.map(request::read) {
        Some(Ok(req)) => (req.sharing_key, req.ports),
        _ => (None, Vec::new()),
    }
}

/// Addresses in use and free in one pool, for metrics and the API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolUsage {
    /// Pool name.
    pub pool: String,
    /// Distinct addresses used by at least one Service.
    pub in_use: u64,
    /// Usable addresses nobody holds (saturating for large IPv6 pools).
    pub free: u128,
    /// Of `in_use`: addresses only kept for a change the appliance has not acknowledged yet (a
    /// DELETED, or a MODIFIED that withdrew them; see [`Allocator::withdraw`]).
    pub reserved: u64,
}

/// The address book of every configured pool. Not thread-safe: the recorder owns it.
#[derive(Debug, Default)]
pub struct Allocator {
    pools: Vec<Pool>,
    used: HashMap<IpAddr, Vec<Holder>>,
    by_service: HashMap<ServiceKey, Vec<IpAddr>>,
    /// Per name: the addresses reserved for its withdrawals not acknowledged yet, once per
    /// reservation in the order they were made ([`Self::withdraw`], [`Self::finish_drain`]), so
    /// [`Self::assign`] prefers them without walking every address in use for each Service change.
    reserved_for: HashMap<ServiceKey, Vec<IpAddr>>,
    /// Per (pool index, family): every usable address below it is in use (where a scan starts).
    hints: RefCell<HashMap<(usize, Family), IpAddr>>,
    /// Per pool (config order): its addresses in use, and of those the ones only reserved (every holder
    /// draining); kept as addresses are taken and dropped, so [`Self::usage`] does not walk every
    /// address in use (the recorder reads it with every plan: in an initial sync with a pool, every status
    /// write-back would walk every address in use, a cost quadratic in the number of Services).
    counts: Vec<Counts>,
    /// Per pool (config order): its usable addresses ([`Pool::size`]).
    sizes: Vec<u128>,
}

/// What [`Allocator::usage`] reports of one pool, kept up to date.
#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    in_use: u64,
    reserved: u64,
}

/// Of one address: whether somebody holds it, and whether every holder is draining.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Usage {
    in_use: bool,
    reserved: bool,
}

impl Allocator {
    /// An allocator over `pools` with nothing in use.
    pub fn new(pools: Pools) -> Self {
        let sizes = pools.0.iter().map(Pool::size).collect();
        Self { counts: vec![Counts::default(); pools.0.len()], sizes, pools: pools.0, ..Self::default() }
    }

    /// Whether vipwatch allocates for `view`: pools are configured and it is a `LoadBalancer`.
    pub fn manages(&self, view: &ServiceView) -> bool {
        !self.pools.is_empty() && view.is_load_balancer()
    }

    /// Whether `ip` is a usable address of some pool.
    pub fn in_pools(&self, ip: &IpAddr) -> bool {
        self.pools.iter().any(|p| p.contains(ip))
    }

    /// Whether `key` uses any address (reserved ones not counted).
    pub fn uses_addresses(&self, key: &ServiceKey) -> bool {
        self.by_service.contains_key(key)
    }

    /// Records that `key` uses what `view.allocation` says (from the database, or after an event),
    /// instead of what it used before. Appliance-assigned or pending allocations use no pool address.
    pub fn use_addresses(&mut self, key: &ServiceKey, view: &ServiceView) {
        self.release(key);
        let Some(a) = view.allocation.as_ref().filter(|a| a.source == VipSource::Pool) else { return };
        let ips: Vec<IpAddr> = a.addresses.iter().filter_map(|s| s.parse().ok()).collect();
        let (sharing_key, ports) = sharing(Some(view));
        self.take(&Holder { key: key.clone(), sharing_key, ports, draining: None }, &ips);
    }

    /// Drops everything `key` holds (not what a deleted object of that name still drains).
    pub fn release(&mut self, key: &ServiceKey) {
        let ips = self.by_service.remove(key).unwrap_or_default();
        self.drop_holders(&ips, |h| h.key == *key && h.draining.is_none());
    }

    /// `key` (object `uid`) was DELETED or left scope: what it holds live is dropped, and `addresses`
    /// (what the DELETED announced, used by `from`) stay reserved until [`Self::finish_drain`].
    pub fn drain(&mut self, key: &ServiceKey, uid: &str, addresses: &[IpAddr], from: Option<&ServiceView>) {
        self.release(key);
        self.withdraw(key, uid, addresses, from);
    }

    /// `addresses` of object `uid` of `key` wait for the appliance: a recorded change withdrew them
    /// (a DELETED, or a MODIFIED that dropped them), and that change is not acknowledged yet. They stay
    /// reserved until [`Self::finish_drain`] with the same addresses: a Service of the same name may
    /// reuse them (its queue orders the two), and one sharing them with `from` (the view that used
    /// them: same sharing key, none of its ports) keeps or takes them, since the appliance serves other
    /// ports of the address for it; everyone else waits. Without `from` (the event that withdrew them
    /// is pruned) nobody else may take them. Also used at start for the `releases` rows and for the
    /// addresses a terminating Service unknown to a lost database still shows.
    pub fn withdraw(&mut self, key: &ServiceKey, uid: &str, addresses: &[IpAddr], from: Option<&ServiceView>) {
        let (sharing_key, ports) = sharing(from);
        let holder = Holder { key: key.clone(), sharing_key, ports, draining: Some(uid.to_owned()) };
        for ip in addresses {
            let before = self.use_of(ip);
            self.used.entry(*ip).or_default().push(holder.clone());
            self.count(*ip, before);
        }
        if !addresses.is_empty() {
            self.reserved_for.entry(key.clone()).or_default().extend_from_slice(addresses);
        }
    }

    /// Every endpoint acknowledged the change of `key`/`uid` that withdrew `addresses`: one reservation
    /// per address (of those [`Self::withdraw`] made) ends, the oldest: an object's changes are
    /// acknowledged in the order they were made, the order its reservations were made in. An address
    /// nobody else holds is then free. Returns whether anything was released.
    pub fn finish_drain(&mut self, key: &ServiceKey, uid: &str, addresses: &[IpAddr]) -> bool {
        let mut released = false;
        for ip in addresses {
            let before = self.use_of(ip);
            let Some(holders) = self.used.get_mut(ip) else { continue };
            let Some(i) = holders.iter().position(|h| h.key == *key && h.draining.as_deref() == Some(uid)) else {
                continue;
            };
            holders.remove(i);
            released = true;
            if holders.is_empty() {
                self.used.remove(ip);
                self.lower_hint(*ip);
            }
            self.count(*ip, before);
            self.unreserve(key, ip);
        }
        released
    }

    /// Drops one entry of `ip` from what [`Self::reserved_for`] lists for `key`.
    fn unreserve(&mut self, key: &ServiceKey, ip: &IpAddr) {
        let Some(ips) = self.reserved_for.get_mut(key) else { return };
        if let Some(i) = ips.iter().position(|r| r == ip) {
            ips.remove(i);
        }
        if ips.is_empty() {
            self.reserved_for.remove(key);
        }
    }

    /// The pool allocation a Service shows in `status.loadBalancer.ingress`: its IPs that lie in a pool,
    /// each with its own pool, or `None` when it shows none. For a terminating Service a lost database
    /// knows nothing about: what its DELETED withdraws.
    pub fn published(&self, view: &ServiceView) -> Option<Allocation> {
        let ips: Vec<(IpAddr, String)> = view
            .ingress
            .iter()
            .filter_map(|i| i.ip.as_ref()?.parse().ok())
            .filter_map(|ip| Some((ip, self.pool_of(&ip)?.name.clone())))
            .collect();
        (!ips.is_empty()).then(|| Allocation::from_pools(ips))
    }

    /// The pool `ip` is a usable address of.
    fn pool_of(&self, ip: &IpAddr) -> Option<&Pool> {
        self.pools.iter().find(|p| p.contains(ip))
    }

    fn drop_holders(&mut self, ips: &[IpAddr], gone: impl Fn(&Holder) -> bool) {
        for ip in ips {
            let before = self.use_of(ip);
            if let Some(holders) = self.used.get_mut(ip) {
                holders.retain(|h| !gone(h));
                if holders.is_empty() {
                    self.used.remove(ip);
                    self.lower_hint(*ip);
                }
            }
            self.count(*ip, before);
        }
    }

    /// Decides the allocation of `key` for `view` and holds it. Tries, in order: the explicit request;
    /// else per family the addresses in `prefer` (e.g. adopted from `status.loadBalancer.ingress`),
    /// then what `key` holds now, then an address shared under the same `allow-shared-ip` key, then the
    /// lowest free address. Never fails: an impossible request or exhausted pools give an allocation
    /// with no addresses and `reason` set.
    pub fn assign(&mut self, key: &ServiceKey, view: &ServiceView, prefer: &[IpAddr]) -> Allocation {
        let mut prefer = prefer.to_vec();
        prefer.extend(self.by_service.get(key).cloned().unwrap_or_default());
        // What this name gave up and the appliance has not let go of yet: taking it back keeps the VIP
        // (its deliveries are ordered) rather than renumbering it.
        prefer.extend(self.reserved_for.get(key).into_iter().flatten());
        self.release(key);
        let outcome = request::read(view).and_then(|req| {
            let assigned = self.solve(key, &req, &prefer)?;
            let holder =
                Holder { key: key.clone(), sharing_key: req.sharing_key.clone(), ports: req.ports, draining: None };
            let ips: Vec<IpAddr> = assigned.iter().map(|(ip, _)| *ip).collect();
            self.take(&holder, &ips);
            Ok(assigned)
        });
        match outcome {
            Ok(assigned) => Allocation::from_pools(assigned),
            Err(reason) => Allocation::pending(reason),
        }
    }

    /// Usage of every pool, in config order: O(pools), from counts kept as addresses change hands.
    pub fn usage(&self) -> Vec<PoolUsage> {
        let per_pool = self.pools.iter().zip(&self.counts).zip(&self.sizes);
        per_pool
            .map(|((p, c), size)| PoolUsage {
                pool: p.name.clone(),
                in_use: c.in_use,
                free: size.saturating_sub(u128::from(c.in_use)),
                reserved: c.reserved,
            })
            .collect()
    }

    /// Whether `ip` is in use, and only by draining reservations.
    fn use_of(&self, ip: &IpAddr) -> Usage {
        match self.used.get(ip) {
            Some(holders) if !holders.is_empty() => {
                Usage { in_use: true, reserved: holders.iter().all(|h| h.draining.is_some()) }
            }
            _ => Usage { in_use: false, reserved: false },
        }
    }

    /// Moves the counts of every pool holding `ip` from `before` to what `ip` is now.
    fn count(&mut self, ip: IpAddr, before: Usage) {
        let after = self.use_of(&ip);
        if before == after {
            return;
        }
        let step = |n: &mut u64, was: bool, is: bool| *n = *n + u64::from(is) - u64::from(was);
        for (pool, c) in self.pools.iter().zip(&mut self.counts) {
            if pool.contains(&ip) {
                step(&mut c.in_use, before.in_use, after.in_use);
                step(&mut c.reserved, before.reserved, after.reserved);
            }
        }
    }

    /// The addresses for `req`, each with the name of its pool: the requested ones (each from the pool
    /// that contains it), else all from the first candidate pool that can serve the request. Errors: why
    /// nothing can be allocated.
    fn solve(&self, key: &ServiceKey, req: &Request, prefer: &[IpAddr]) -> Result<Vec<(IpAddr, String)>, String> {
        if !req.ips.is_empty() {
            return self.requested(key, req);
        }
        let candidates = self.candidates(key, req)?;
        for &i in &candidates {
            if let Some(ips) = self.pick_in_pool(i, key, req, prefer) {
                let name = &self.pools[i].name;
                return Ok(ips.into_iter().map(|ip| (ip, name.clone())).collect());
            }
        }
        let names: Vec<String> = candidates.iter().map(|&i| format!("`{}`", self.pools[i].name)).collect();
        let needed = req.families.list().iter().filter(|f| req.families.requires(**f) || candidates.len() == 1);
        let missing: Vec<&str> =
            needed.filter(|f| !candidates.iter().any(|&i| self.pools[i].has(**f))).map(|f| f.as_str()).collect();
        if !missing.is_empty() {
            return Err(format!("no {} address in pool {}", missing.join("/"), names.join(", ")));
        }
        if candidates.len() == 1 {
            return Err(format!("address pool {} exhausted", names[0]));
        }
        // Both families of a RequireDualStack come from one pool: only the pools holding both count.
        let families = req.families.list();
        let eligible: Vec<usize> = match req.families {
            Families::Require(_) => {
                candidates.iter().copied().filter(|&i| families.iter().all(|f| self.pools[i].has(*f))).collect()
            }
            _ => candidates.clone(),
        };
        if eligible.is_empty() {
            return Err(format!(
                "ipFamilyPolicy RequireDualStack takes an IPv4 and an IPv6 address from one pool, and none of the \
                 address pools {} has both",
                names.join(", ")
            ));
        }
        let full: Vec<&str> = families
            .iter()
            .filter(|f| !eligible.iter().any(|&i| self.find(i, **f, key, req, &[]).is_some()))
            .map(|f| f.as_str())
            .collect();
        let listed: Vec<String> = eligible.iter().map(|&i| format!("`{}`", self.pools[i].name)).collect();
        let (listed, both) = match req.families {
            Families::Require(_) => (listed.join(", "), " (RequireDualStack takes both from one pool)"),
            _ => (names.join(", "), ""),
        };
        if full.is_empty() {
            return Err(format!("no address pool of {listed} has both a free IPv4 and a free IPv6 address left{both}"));
        }
        let or = if matches!(req.families, Families::Prefer(_)) { " or " } else { "/" };
        Err(format!("no free {} address left in address pools {listed}{both}", full.join(or)))
    }

    /// The pools that may serve `req`, in config order. Errors: the named pool does not exist or does
    /// not accept the Service; no auto-assign pool accepts it.
    fn candidates(&self, key: &ServiceKey, req: &Request) -> Result<Vec<usize>, String> {
        if let Some(name) = &req.pool {
            let i = self
                .pools
                .iter()
                .position(|p| p.name == *name)
                .ok_or_else(|| format!("no address pool named `{}`", bounded(name, QUOTE)))?;
            self.check_accepts(i, key, req)?;
            return Ok(vec![i]);
        }
        let auto: Vec<usize> = (0..self.pools.len())
            .filter(|&i| self.pools[i].auto_assign && self.pools[i].accepts(&key.namespace, &req.labels))
            .collect();
        if auto.is_empty() {
            return Err(format!(
                "no auto-assign address pool accepts namespace `{}` and this Service's labels (name a pool with annotation {})",
                key.namespace,
                request::POOL_ANNOTATION
            ));
        }
        Ok(auto)
    }

    fn check_accepts(&self, i: usize, key: &ServiceKey, req: &Request) -> Result<(), String> {
        let pool = &self.pools[i];
        if !pool.allows_namespace(&key.namespace) {
            return Err(format!("address pool `{}` does not allow namespace `{}`", pool.name, key.namespace));
        }
        if !pool.accepts(&key.namespace, &req.labels) {
            return Err(format!(
                "address pool `{}`: this Service's labels do not match its service_selector",
                pool.name
            ));
        }
        Ok(())
    }

    fn pick_in_pool(&self, i: usize, key: &ServiceKey, req: &Request, prefer: &[IpAddr]) -> Option<Vec<IpAddr>> {
        let mut ips = Vec::new();
        for &family in req.families.list() {
            match self.find(i, family, key, req, prefer) {
                Some(ip) => ips.push(ip),
                None if req.families.requires(family) => return None,
                None => {}
            }
        }
        (!ips.is_empty()).then_some(ips)
    }

    fn find(&self, i: usize, family: Family, key: &ServiceKey, req: &Request, prefer: &[IpAddr]) -> Option<IpAddr> {
        let pool = &self.pools[i];
        let fits = |ip: &IpAddr| Family::of(ip) == family && pool.contains(ip) && self.available(ip, key, req);
        if let Some(ip) = prefer.iter().find(|ip| fits(ip)) {
            return Some(*ip);
        }
        if req.sharing_key.is_some() {
            let mut shared: Vec<&IpAddr> = self.used.keys().filter(|ip| fits(ip)).collect();
            shared.sort();
            if let Some(ip) = shared.first() {
                return Some(**ip);
            }
        }
        let from =
            self.hints.borrow().get(&(i, family)).copied().or_else(|| pool.first(family)).unwrap_or(lowest(family));
        let found = pool.addresses_from(family, from).find(|ip| !self.used.contains_key(ip))?;
        // Every usable address in [from, found) is in use: the next scan may start at `found`.
        self.hints.borrow_mut().insert((i, family), found);
        Some(found)
    }

    /// Whether `key` may take `ip`: nobody else holds it, or every holder, live or reserved for a
    /// withdrawal the appliance has not acknowledged ([`Self::withdraw`]), has the same sharing key
    /// and no port+protocol in common with the request. (A reserved holder without a sharing key
    /// shares with nobody.)
    fn available(&self, ip: &IpAddr, key: &ServiceKey, req: &Request) -> bool {
        let Some(holders) = self.used.get(ip) else { return true };
        holders.iter().filter(|h| h.key != *key).all(|h| {
            req.sharing_key.is_some()
                && h.sharing_key == req.sharing_key
                && !h.ports.iter().any(|p| req.ports.contains(p))
        })
    }

    /// The requested addresses, each from the pool that contains it (an IPv4 and an IPv6 may come from
    /// two pools). Errors: an address outside every pool, in a pool that does not accept the Service or
    /// is not the requested one, or used by a Service it may not share with.
    fn requested(&self, key: &ServiceKey, req: &Request) -> Result<Vec<(IpAddr, String)>, String> {
        let mut assigned = Vec::with_capacity(req.ips.len());
        for ip in &req.ips {
            let i = self
                .pools
                .iter()
                .position(|p| p.contains(ip))
                .ok_or_else(|| format!("{ip} is not in any address pool"))?;
            let pool = &self.pools[i];
            self.check_accepts(i, key, req)?;
            if let Some(want) = &req.pool
                && *want != pool.name
            {
                let want = bounded(want, QUOTE);
                return Err(format!("{ip} is in pool `{}`, not in the requested pool `{want}`", pool.name));
            }
            if !self.available(ip, key, req) {
                // Sorted by name: the order in which they took the address is no part of the reason,
                // and a reason that changed with it was a MODIFIED with nothing else changed.
                let mut others: Vec<&Holder> = self.used[ip].iter().filter(|h| h.key != *key).collect();
                others.sort_by(|x, y| x.key.cmp(&y.key));
                let holders: Vec<String> = others
                    .into_iter()
                    .map(|h| match h.draining {
                        Some(_) => format!("{} (given up; the appliance has not acknowledged that yet)", h.key),
                        None => h.key.to_string(),
                    })
                    .collect();
                return Err(format!(
                    "{ip} is already used by {} (share it with the same {} key and distinct ports)",
                    holders.join(", "),
                    request::SHARED_IP_ANNOTATION
                ));
            }
            assigned.push((*ip, pool.name.clone()));
        }
        Ok(assigned)
    }

    fn take(&mut self, holder: &Holder, ips: &[IpAddr]) {
        for ip in ips {
            let before = self.use_of(ip);
            self.used.entry(*ip).or_default().push(holder.clone());
            self.count(*ip, before);
        }
        if !ips.is_empty() {
            self.by_service.insert(holder.key.clone(), ips.to_vec());
        }
    }

    fn lower_hint(&mut self, ip: IpAddr) {
        if let Some(i) = self.pools.iter().position(|p| p.contains(&ip))
            && let Some(hint) = self.hints.get_mut().get_mut(&(i, Family::of(&ip)))
            && ip < *hint
        {
            *hint = ip;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PoolConfig;

    fn allocator(pools: &[(&str, &[&str], bool)]) -> Allocator {
        let configs: Vec<PoolConfig> = pools
            .iter()
            .map(|(name, addresses, auto)| PoolConfig {
                name: (*name).into(),
                addresses: addresses.iter().map(|s| s.to_string()).collect(),
                auto_assign: *auto,
                namespaces: vec![],
                service_selector: String::new(),
                avoid_buggy_ips: false,
            })
            .collect();
        Allocator::new(Pools::new(&configs).unwrap())
    }

    fn svc(annotations: serde_json::Value, spec: serde_json::Value) -> ServiceView {
        let mut spec = spec;
        spec["type"] = "LoadBalancer".into();
        let json = serde_json::json!({"metadata": {"name": "x", "annotations": annotations}, "spec": spec});
        ServiceView::from_service(&serde_json::from_value(json).unwrap())
    }

    fn plain() -> ServiceView {
        svc(serde_json::json!({}), serde_json::json!({"ports": [{"port": 80}]}))
    }

    fn key(name: &str) -> ServiceKey {
        ServiceKey::new("ns", name)
    }

    fn addrs(a: &Allocation) -> Vec<&str> {
        a.addresses.iter().map(String::as_str).collect()
    }

    #[test]
    fn lowest_free_address_in_config_order_and_stable_on_reassign() {
        let mut al = allocator(&[("manual", &["10.0.0.0/30"], false), ("lab", &["192.0.2.10-192.0.2.12"], true)]);
        let a = al.assign(&key("a"), &plain(), &[]);
        assert_eq!((addrs(&a), a.pool.as_deref(), a.source), (vec!["192.0.2.10"], Some("lab"), VipSource::Pool));
        assert_eq!(addrs(&al.assign(&key("b"), &plain(), &[])), vec!["192.0.2.11"]);
        assert_eq!(addrs(&al.assign(&key("a"), &plain(), &[])), vec!["192.0.2.10"], "a keeps its address");
        al.release(&key("a"));
        assert_eq!(addrs(&al.assign(&key("c"), &plain(), &[])), vec!["192.0.2.10"], "the freed address is the lowest");
        let named = svc(serde_json::json!({"vipwatch.io/address-pool": "manual"}), serde_json::json!({}));
        assert_eq!(addrs(&al.assign(&key("d"), &named, &[])), vec!["10.0.0.0"]);
    }

    #[test]
    fn requested_addresses_are_honoured_or_refused_with_a_reason() {
        let mut al = allocator(&[("lab", &["192.0.2.0/28"], true)]);
        let want = svc(serde_json::json!({"vipwatch.io/loadBalancerIPs": "192.0.2.7"}), serde_json::json!({}));
        assert_eq!(addrs(&al.assign(&key("a"), &want, &[])), vec!["192.0.2.7"]);
        let taken = al.assign(&key("b"), &want, &[]);
        assert_eq!(
            taken.reason.as_deref(),
            Some(
                "192.0.2.7 is already used by ns/a (share it with the same vipwatch.io/allow-shared-ip key and distinct ports)"
            )
        );
        let outside = svc(serde_json::json!({}), serde_json::json!({"loadBalancerIP": "198.51.100.1"}));
        assert_eq!(
            al.assign(&key("c"), &outside, &[]).reason.as_deref(),
            Some("198.51.100.1 is not in any address pool")
        );
        let unknown = svc(serde_json::json!({"vipwatch.io/address-pool": "nope"}), serde_json::json!({}));
        assert_eq!(al.assign(&key("d"), &unknown, &[]).reason.as_deref(), Some("no address pool named `nope`"));
    }

    #[test]
    fn sharing_needs_the_same_key_and_distinct_ports() {
        let mut al = allocator(&[("lab", &["192.0.2.0/29"], true)]);
        let shared = |port: i32| {
            svc(serde_json::json!({"vipwatch.io/allow-shared-ip": "k"}), serde_json::json!({"ports": [{"port": port}]}))
        };
        let a = al.assign(&key("a"), &shared(80), &[]);
        let b = al.assign(&key("b"), &shared(443), &[]);
        let c = al.assign(&key("c"), &shared(80), &[]);
        assert_eq!((addrs(&a), addrs(&b), addrs(&c)), (vec!["192.0.2.0"], vec!["192.0.2.0"], vec!["192.0.2.1"]));
        assert_eq!(al.usage(), vec![PoolUsage { pool: "lab".into(), in_use: 2, free: 6, reserved: 0 }]);
    }

    /// The reason names the holders by name, whichever took the address first: a reason that followed
    /// their order changed (a `MODIFIED` with nothing else changed) when one of them gave the address
    /// up and took it back.
    #[test]
    fn a_refused_request_names_the_holders_in_order_of_name() {
        let shared = |port: i32, protocol: &str| {
            let ann =
                serde_json::json!({"vipwatch.io/allow-shared-ip": "k", "vipwatch.io/loadBalancerIPs": "192.0.2.5"});
            svc(ann, serde_json::json!({"ports": [{"port": port, "protocol": protocol}]}))
        };
        let want = "192.0.2.5 is already used by ns/a, ns/b (share it with the same vipwatch.io/allow-shared-ip key and distinct ports)";
        for first in ["b", "a"] {
            let mut al = allocator(&[("lab", &["192.0.2.0/29"], true)]);
            let second = if first == "a" { "b" } else { "a" };
            al.assign(&key(first), &shared(53, "TCP"), &[]);
            al.assign(&key(second), &shared(53, "UDP"), &[]);
            assert_eq!(al.assign(&key("c"), &shared(53, "UDP"), &[]).reason.as_deref(), Some(want), "{first} first");
        }
    }

    #[test]
    fn exhaustion_is_pending_with_a_reason() {
        let mut al = allocator(&[("tiny", &["192.0.2.1-192.0.2.2"], true)]);
        al.assign(&key("a"), &plain(), &[]);
        al.assign(&key("b"), &plain(), &[]);
        let c = al.assign(&key("c"), &plain(), &[]);
        assert_eq!((addrs(&c), c.reason.as_deref()), (vec![], Some("address pool `tiny` exhausted")));
    }

    #[test]
    fn dual_stack_follows_the_family_policy() {
        let mut al =
            allocator(&[("v4", &["192.0.2.0/30"], true), ("both", &["198.51.100.0/30", "2001:db8::/126"], true)]);
        let require = svc(
            serde_json::json!({}),
            serde_json::json!({"ipFamilyPolicy": "RequireDualStack", "ipFamilies": ["IPv6", "IPv4"]}),
        );
        let r = al.assign(&key("r"), &require, &[]);
        assert_eq!((addrs(&r), r.pool.as_deref()), (vec!["2001:db8::", "198.51.100.0"], Some("both")));
        let prefer = svc(serde_json::json!({}), serde_json::json!({"ipFamilyPolicy": "PreferDualStack"}));
        assert_eq!(
            addrs(&al.assign(&key("p"), &prefer, &[])),
            vec!["192.0.2.0"],
            "the first pool has only IPv4: that is enough"
        );
        let mut v4only = allocator(&[("v4", &["192.0.2.0/30"], true)]);
        assert_eq!(v4only.assign(&key("r"), &require, &[]).reason.as_deref(), Some("no IPv6 address in pool `v4`"));
    }

    /// Requested addresses come each from the pool that contains it; `pool` is the first one's.
    #[test]
    fn requested_addresses_of_two_pools_each_name_their_own() {
        let mut al = allocator(&[("v4", &["192.0.2.0/28"], true), ("v6", &["2001:db8::/120"], true)]);
        let both = svc(
            serde_json::json!({"vipwatch.io/loadBalancerIPs": "2001:db8::51,192.0.2.5"}),
            serde_json::json!({"ipFamilyPolicy": "PreferDualStack", "ipFamilies": ["IPv6", "IPv4"]}),
        );
        let a = al.assign(&key("a"), &both, &[]);
        let each: Vec<(&str, &str, Option<&str>)> =
            a.per_address.iter().map(|p| (p.address.as_str(), p.family.as_str(), p.pool.as_deref())).collect();
        assert_eq!(each, vec![("2001:db8::51", "IPv6", Some("v6")), ("192.0.2.5", "IPv4", Some("v4"))]);
        assert_eq!((addrs(&a), a.pool.as_deref()), (vec!["2001:db8::51", "192.0.2.5"], Some("v6")));
        assert_eq!(
            (a.pool_of("192.0.2.5"), a.pool_of("2001:db8::51"), a.pool_of("192.0.2.6")),
            (Some("v4"), Some("v6"), None)
        );
        let usage: Vec<(String, u64)> = al.usage().into_iter().map(|u| (u.pool, u.in_use)).collect();
        assert_eq!(usage, vec![("v4".to_owned(), 1), ("v6".to_owned(), 1)]);
        let shown = svc(serde_json::json!({}), serde_json::json!({}));
        let mut shown = shown;
        shown.ingress = a.ingress();
        assert_eq!(al.published(&shown), Some(a), "what the status shows, each address with its pool");
    }

    /// Dual-stack allocations that cannot be made say why: RequireDualStack takes both families from
    /// one pool (none has both; the pools with both are full), PreferDualStack with every pool full.
    #[test]
    fn dual_stack_refusals_name_the_families_and_pools_that_lack_them() {
        let require = svc(
            serde_json::json!({}),
            serde_json::json!({"ipFamilyPolicy": "RequireDualStack", "ipFamilies": ["IPv4", "IPv6"]}),
        );
        let prefer = svc(serde_json::json!({}), serde_json::json!({"ipFamilyPolicy": "PreferDualStack"}));
        let mut split = allocator(&[("v4", &["192.0.2.0"], true), ("v6", &["2001:db8::"], true)]);
        assert_eq!(
            split.assign(&key("r"), &require, &[]).reason.as_deref(),
            Some(
                "ipFamilyPolicy RequireDualStack takes an IPv4 and an IPv6 address from one pool, and none of the address pools `v4`, `v6` has both"
            )
        );
        assert_eq!(addrs(&split.assign(&key("a"), &prefer, &[])), vec!["192.0.2.0"]);
        assert_eq!(
            addrs(&split.assign(&key("b"), &prefer, &[])),
            vec!["2001:db8::"],
            "the next pool serves one family"
        );
        assert_eq!(
            split.assign(&key("c"), &prefer, &[]).reason.as_deref(),
            Some("no free IPv4 or IPv6 address left in address pools `v4`, `v6`")
        );
        let mut mixed = allocator(&[("v4", &["192.0.2.0/30"], true), ("both", &["198.51.100.0", "2001:db8::"], true)]);
        assert_eq!(addrs(&mixed.assign(&key("r1"), &require, &[])), vec!["198.51.100.0", "2001:db8::"]);
        assert_eq!(
            mixed.assign(&key("r2"), &require, &[]).reason.as_deref(),
            Some("no free IPv4/IPv6 address left in address pools `both` (RequireDualStack takes both from one pool)")
        );
    }

    #[test]
    fn preferred_addresses_win_when_free() {
        let mut al = allocator(&[("lab", &["192.0.2.0/28"], true)]);
        let adopted = al.assign(&key("a"), &plain(), &["192.0.2.9".parse().unwrap(), "203.0.113.1".parse().unwrap()]);
        assert_eq!(addrs(&adopted), vec!["192.0.2.9"]);
        assert_eq!(addrs(&al.assign(&key("b"), &plain(), &["192.0.2.9".parse().unwrap()])), vec!["192.0.2.0"]);
    }

    #[test]
    fn failure_reasons_name_what_is_missing() {
        let mut al = allocator(&[("a", &["192.0.2.1"], true), ("v6", &["2001:db8::/64"], true)]);
        al.assign(&key("x"), &plain(), &[]);
        assert_eq!(
            al.assign(&key("y"), &plain(), &[]).reason.as_deref(),
            Some("no free IPv4 address left in address pools `a`, `v6`")
        );
        let mut restricted = allocator(&[]);
        let cfg = PoolConfig {
            name: "edge".into(),
            addresses: vec!["192.0.2.0/30".into()],
            auto_assign: false,
            namespaces: vec!["prod".into()],
            service_selector: "tier=edge".into(),
            avoid_buggy_ips: false,
        };
        restricted.pools = Pools::new(&[cfg]).unwrap().0;
        let named = svc(serde_json::json!({"vipwatch.io/address-pool": "edge"}), serde_json::json!({}));
        assert_eq!(
            restricted.assign(&key("z"), &named, &[]).reason.as_deref(),
            Some("address pool `edge` does not allow namespace `ns`")
        );
        assert_eq!(
            restricted.assign(&ServiceKey::new("prod", "z"), &named, &[]).reason.as_deref(),
            Some("address pool `edge`: this Service's labels do not match its service_selector")
        );
    }

    /// [`Allocator::usage`] counted the slow way, by walking every address in use: what the kept counts
    /// must always equal.
    fn recounted(al: &Allocator) -> Vec<PoolUsage> {
        al.pools
            .iter()
            .map(|p| {
                let holders: Vec<&Vec<Holder>> =
                    al.used.iter().filter(|(ip, _)| p.contains(ip)).map(|(_, h)| h).collect();
                let in_use = holders.len() as u64;
                let reserved = holders.iter().filter(|h| h.iter().all(|h| h.draining.is_some())).count() as u64;
                PoolUsage { pool: p.name.clone(), in_use, free: p.size() - u128::from(in_use), reserved }
            })
            .collect()
    }

    /// One operation on the allocator, for a test that runs a list of them.
    type Step<'a> = Box<dyn Fn(&mut Allocator) + 'a>;

    /// Every way an address changes hands — assign, share, hold, release, drain, withdraw, an
    /// acknowledgement, a re-assign to another address — keeps the counts [`Allocator::usage`] reports
    /// equal to a walk over every address in use.
    #[test]
    fn usage_kept_as_addresses_change_hands_equals_a_recount_after_every_step() {
        let mut al = allocator(&[("a", &["192.0.2.0/30"], true), ("b", &["192.0.2.4-192.0.2.9"], true)]);
        let shared = |port: i32| {
            let ann = serde_json::json!({"vipwatch.io/allow-shared-ip": "k"});
            svc(ann, serde_json::json!({"ports": [{"port": port}]}))
        };
        let want = |ip: &str| svc(serde_json::json!({"vipwatch.io/loadBalancerIPs": ip}), serde_json::json!({}));
        let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
        let mut seen = Vec::new();
        let steps: Vec<Step<'_>> = vec![
            Box::new(|al| drop(al.assign(&key("s1"), &shared(80), &[]))),
            Box::new(|al| drop(al.assign(&key("s2"), &shared(443), &[]))),
            Box::new(|al| drop(al.assign(&key("p"), &plain(), &[]))),
            Box::new(|al| drop(al.assign(&key("w"), &want("192.0.2.3"), &[]))),
            Box::new(|al| al.drain(&key("s1"), "uid-s1", &[ip("192.0.2.0")], None)),
            Box::new(|al| al.drain(&key("s2"), "uid-s2", &[ip("192.0.2.0")], None)),
            Box::new(|al| al.withdraw(&key("w"), "uid-w", &[ip("192.0.2.3")], None)),
            Box::new(|al| drop(al.assign(&key("w"), &want("192.0.2.5"), &[]))),
            Box::new(|al| _ = al.finish_drain(&key("s1"), "uid-s1", &[ip("192.0.2.0")])),
            Box::new(|al| _ = al.finish_drain(&key("s1"), "uid-s1", &[ip("192.0.2.0")])),
            Box::new(|al| al.use_addresses(&key("h"), &al_view("192.0.2.4"))),
            Box::new(|al| _ = al.finish_drain(&key("w"), "uid-w", &[ip("192.0.2.3")])),
            Box::new(|al| _ = al.finish_drain(&key("s2"), "uid-s2", &[ip("192.0.2.0")])),
            Box::new(|al| al.release(&key("p"))),
            Box::new(|al| al.release(&key("h"))),
            Box::new(|al| al.release(&key("w"))),
        ];
        for (i, step) in steps.iter().enumerate() {
            step(&mut al);
            assert_eq!(al.usage(), recounted(&al), "after step {i}");
            seen.push(al.usage().iter().map(|u| (u.in_use, u.reserved)).collect::<Vec<_>>());
        }
        assert_eq!(seen[5], vec![(3, 1), (0, 0)], "192.0.2.0 only reserved, .1 and .3 in use");
        assert_eq!(seen[10], vec![(3, 2), (2, 0)], "w moved to .5: .3 and .0 only reserved; h holds .4");
        assert_eq!(seen.last(), Some(&vec![(0, 0), (0, 0)]));
    }

    /// A view holding `address` from pool `b`, as the database would give it back.
    fn al_view(address: &str) -> ServiceView {
        let mut view = plain();
        view.allocation = Some(Allocation {
            source: VipSource::Pool,
            pool: Some("b".into()),
            addresses: vec![address.into()],
            per_address: Vec::new(),
            hostname: None,
            reason: None,
        });
        view
    }

    #[test]
    fn a_deleted_services_addresses_drain_before_anyone_else_gets_them() {
        let mut al = allocator(&[("one", &["192.0.2.1"], true)]);
        al.assign(&key("a"), &plain(), &[]);
        let x: IpAddr = "192.0.2.1".parse().unwrap();
        al.drain(&key("a"), "uid-a", &[x], None);
        assert_eq!(al.assign(&key("b"), &plain(), &[]).reason.as_deref(), Some("address pool `one` exhausted"));
        assert!(!al.finish_drain(&key("a"), "uid-other", &[x]), "another object's acknowledgement frees nothing");
        assert!(al.finish_drain(&key("a"), "uid-a", &[x]));
        assert_eq!(addrs(&al.assign(&key("b"), &plain(), &[])), vec!["192.0.2.1"]);
    }

    #[test]
    fn each_withdrawal_holds_the_address_until_its_own_acknowledgement() {
        let mut al = allocator(&[("one", &["192.0.2.1"], true)]);
        let x: IpAddr = "192.0.2.1".parse().unwrap();
        al.assign(&key("a"), &plain(), &[]);
        al.release(&key("a"));
        al.withdraw(&key("a"), "uid-a", &[x], None);
        assert_eq!(addrs(&al.assign(&key("a"), &plain(), &[x])), vec!["192.0.2.1"], "the same name may take it back");
        al.release(&key("a"));
        al.withdraw(&key("a"), "uid-a", &[x], None);
        assert!(al.finish_drain(&key("a"), "uid-a", &[x]));
        assert_eq!(
            al.assign(&key("b"), &plain(), &[]).reason.as_deref(),
            Some("address pool `one` exhausted"),
            "the second withdrawal is not acknowledged yet"
        );
        assert_eq!(al.usage(), vec![PoolUsage { pool: "one".into(), in_use: 1, free: 0, reserved: 1 }]);
        assert!(al.finish_drain(&key("a"), "uid-a", &[x]));
        assert_eq!(addrs(&al.assign(&key("b"), &plain(), &[])), vec!["192.0.2.1"]);
    }

    /// A reservation keeps the sharing key and ports of the view that used the address: a Service of
    /// that key on other ports keeps or takes the address meanwhile; one on the same port, one with
    /// another key or none, and anyone while the view is unknown (`None`), wait.
    #[test]
    fn a_reservation_shares_the_address_as_the_view_that_used_it_did() {
        let shared = |port: i32, key: &str| {
            let ann = serde_json::json!({"vipwatch.io/allow-shared-ip": key});
            svc(ann, serde_json::json!({"ports": [{"port": port}]}))
        };
        let x: IpAddr = "192.0.2.1".parse().unwrap();
        for (from, port, sharing, gets_x) in [
            (Some(shared(443, "k")), 80, "k", true),
            (Some(shared(443, "k")), 443, "k", false),
            (Some(shared(443, "k")), 80, "other", false),
            (Some(plain()), 80, "k", false),
            (None, 80, "k", false),
        ] {
            let mut al = allocator(&[("two", &["192.0.2.1", "192.0.2.2"], true)]);
            al.withdraw(&key("b"), "uid-b", &[x], from.as_ref());
            let got = al.assign(&key("a"), &shared(port, sharing), &[x]);
            assert_eq!(addrs(&got) == vec!["192.0.2.1"], gets_x, "{from:?} {port} {sharing}: {got:?}");
        }
    }

    #[test]
    fn a_status_shows_a_pool_allocation_only_for_pool_addresses() {
        let al = allocator(&[("one", &["192.0.2.0/30"], true)]);
        let mut view = plain();
        view.ingress =
            serde_json::from_value(serde_json::json!([{"ip": "198.51.100.1"}, {"ip": "192.0.2.2"}])).unwrap();
        let a = al.published(&view).unwrap();
        assert_eq!((addrs(&a), a.pool.as_deref(), a.source), (vec!["192.0.2.2"], Some("one"), VipSource::Pool));
        view.ingress.clear();
        assert_eq!(al.published(&view), None);
    }
}
