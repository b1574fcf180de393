//! The in-memory VIP index behind `/api/v1/vips`: every (VIP, Service) pair of the current-state
//! table, ordered by address (IPv4, then IPv6, numerically; then hostnames), namespace, name, so a
//! page of 1,000 is a range walk instead of a JSON scan of every Service.
//!
//! A page costs a range walk and rendering its items: the index keeps no rendered JSON, so its memory
//! is the entries alone, kept small because there is one per VIP: an entry's address and Service
//! are its map key only, Services with the same ports share one copy of them, and a Service's uid
//! is kept as a hash.
//!
//! Freshness: a read first brings the index up to the last committed event, reading again only the
//! Services those events changed. A status-only change (a published ingress IP, which records no
//! event) is picked up by a background scan of every Service that replaces the entries of those whose
//! VIPs differ: at most [`MAX_AGE`] later on a small cluster, within [`BUILD_SHARE`] times a scan's
//! duration on a large one, and only when the database was written since. `since` of a VIP is
//! carried across changes; the first build of a process dates each VIP from the event log (start of
//! the newest run of events whose view carries it), later changes from the Service row's
//! `updated_at` (the change that brought it).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{BuildHasher, Hash};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use crate::model::{PortView, ServiceKey, ServiceView};
use crate::store::ServiceRow;
use crate::store::{Store, StoreError};
use vipwatch_contract::IpFamily;

/// Longest time a status-only VIP change may take to show.
pub const MAX_AGE: Duration = Duration::from_secs(1);

/// Sort key of an address: IPs numerically (v4 before v6), then hostnames.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Addr {
    /// An IPv4 or IPv6 address.
    Ip(IpAddr),
    /// A DNS name (`status.loadBalancer.ingress[].hostname`).
    Host(String),
}

impl Addr {
    /// Classifies an address string.
    pub fn parse(s: &str) -> Self {
        s.parse().map(Addr::Ip).unwrap_or_else(|_| Addr::Host(s.to_owned()))
    }

    /// `IPv4` or `IPv6`; `None` for a hostname.
    pub fn family(&self) -> Option<IpFamily> {
        match self {
            Addr::Ip(ip) => Some(IpFamily::of(ip)),
            Addr::Host(_) => None,
        }
    }
}

/// What the index keeps of one (VIP, Service) pair beside its key.
#[derive(Debug)]
struct Vip {
    /// The address as the Service spells it, when that is not how `addr` prints (an IPv6 address
    /// written in capitals or with leading zeros); `None` for nearly every address.
    spelled: Option<Box<str>>,
    /// The Service's ports, shared with every entry of the same ports ([`Index::ports`]).
    ports: Arc<[PortView]>,
    /// `pool`, `appliance`, `status`, `annotation` or `spec` (see `ServiceView::vip_sources`).
    source: &'static str,
    /// The pool this address comes from, for `source = pool` (each address its own: a Service may hold
    /// addresses of two pools).
    pool: Option<Arc<str>>,
    /// Since when this Service has this VIP (Unix ms).
    since: i64,
}

/// One (VIP, Service) pair, as a read sees it: borrowed from the index.
#[derive(Debug, Clone, Copy)]
pub struct VipEntry<'a> {
    /// The address's sort key.
    pub addr: &'a Addr,
    /// The Service.
    pub key: &'a ServiceKey,
    vip: &'a Vip,
}

impl VipEntry<'_> {
    /// The address as the Service spells it.
    pub fn address(&self) -> String {
        match (&self.vip.spelled, self.addr) {
            (Some(spelled), _) => spelled.to_string(),
            (None, Addr::Ip(ip)) => ip.to_string(),
            (None, Addr::Host(host)) => host.clone(),
        }
    }

    /// The Service's ports.
    pub fn ports(&self) -> &[PortView] {
        &self.vip.ports
    }

    /// `pool`, `appliance`, `status`, `annotation` or `spec` (see `ServiceView::vip_sources`).
    pub fn source(&self) -> &'static str {
        self.vip.source
    }

    /// The pool this address comes from, for `source = pool`.
    pub fn pool(&self) -> Option<&str> {
        self.vip.pool.as_deref()
    }

    /// Since when this Service has this VIP (Unix ms).
    pub fn since(&self) -> i64 {
        self.vip.since
    }
}

type EntryKey = (Addr, ServiceKey);

/// A VIP of one Service under one uid (hashed): (address, Service, uid), what a date is carried by.
type Dated = (Addr, ServiceKey, u64);

/// The index's contents at one point: every entry up to event `committed`.
pub struct Index {
    committed: i64,
    generation: i64,
    entries: BTreeMap<EntryKey, Vip>,
    /// Each Service's uid (hashed, [`uid_hash`]) and addresses, to take its entries out when it
    /// changes.
    by_service: HashMap<ServiceKey, (u64, Box<[Addr]>)>,
    /// One copy of each set of ports in use, shared by the entries that have it (most Services
    /// of a cluster have one of a few: `80`, `443`, both).
    ports: HashSet<Arc<[PortView]>>,
    /// The pool names in use, shared likewise.
    pools: HashSet<Arc<str>>,
}

/// Hashes uids the same way in every index of the process (a build carries dates by it).
fn uid_hash(uid: &str) -> u64 {
    std::hash::BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().hash_one(uid)
}

fn entry<'a>((key, vip): (&'a EntryKey, &'a Vip)) -> VipEntry<'a> {
    VipEntry { addr: &key.0, key: &key.1, vip }
}

impl Index {
    fn empty() -> Self {
        Self {
            committed: -1,
            generation: -1,
            entries: BTreeMap::new(),
            by_service: HashMap::new(),
            ports: HashSet::new(),
            pools: HashSet::new(),
        }
    }

    /// Entries strictly after `after` (address, Service) in index order.
    pub fn after(&self, after: Option<(Addr, ServiceKey)>) -> impl Iterator<Item = VipEntry<'_>> {
        use std::ops::Bound::{Excluded, Unbounded};
        let lower = after.map_or(Unbounded, Excluded);
        self.entries.range((lower, Unbounded)).map(entry)
    }

    /// Every Service behind `addr`, by namespace and name.
    pub fn of(&self, addr: &Addr) -> Vec<VipEntry<'_>> {
        self.entries
            .range((addr.clone(), ServiceKey::new("", ""))..)
            .map(entry)
            .take_while(|e| e.addr == addr)
            .collect()
    }

    /// Whether `row` would change Service `row.key`'s entries: another uid, other VIPs, or another
    /// source, pool or ports of one.
    fn differs(&self, row: &ServiceRow) -> bool {
        let Some((uid, addrs)) = self.by_service.get(&row.key) else { return !row.view.vip_sources().is_empty() };
        let sources = row.view.vip_sources();
        if *uid != uid_hash(&row.uid) || addrs.len() != sources.len() {
            return true;
        }
        sources.iter().any(|(address, source)| {
            let entry = self.entries.get(&(Addr::parse(address), row.key.clone()));
            let pool = row.view.allocation.as_ref().and_then(|a| a.pool_of(address));
            entry.is_none_or(|e| e.source != *source || e.pool.as_deref() != pool || *e.ports != *row.view.ports)
        })
    }

    /// The shared copy of `value` in `set`, made when there is none.
    fn shared<T: ?Sized + Hash + Eq>(set: &mut HashSet<Arc<T>>, value: &T) -> Arc<T>
    where
        for<'a> Arc<T>: From<&'a T>,
    {
        if let Some(found) = set.get(value) {
            return found.clone();
        }
        let made = Arc::from(value);
        set.insert(Arc::clone(&made));
        made
    }

    /// Drops `vip`'s shared parts from their sets when it held the last use of them.
    fn release(&mut self, vip: Vip) {
        if Arc::strong_count(&vip.ports) == 2 {
            self.ports.remove(&vip.ports);
        }
        if let Some(pool) = vip.pool.filter(|p| Arc::strong_count(p) == 2) {
            self.pools.remove(&pool);
        }
    }

    /// Replaces the entries of Service `key` with those of its current `row` (`None`: it is gone). A
    /// VIP it had before under the same uid keeps its `since`; a new one is dated by `carried` (an
    /// earlier index's date of (address, Service, uid), or the event log's) or else the row's
    /// `updated_at`.
    fn put(&mut self, key: &ServiceKey, row: Option<&ServiceRow>, carried: impl Fn(&Dated) -> Option<i64>) {
        let uid = row.map(|r| uid_hash(&r.uid));
        let mut kept = HashMap::new();
        if let Some((was, addrs)) = self.by_service.remove(key) {
            for addr in addrs {
                if let Some(vip) = self.entries.remove(&(addr.clone(), key.clone())) {
                    if uid == Some(was) {
                        kept.insert(addr, vip.since);
                    }
                    self.release(vip);
                }
            }
        }
        let (Some(row), Some(uid)) = (row, uid) else { return };
        let mut addrs = Vec::new();
        for (address, source) in row.view.vip_sources() {
            let addr = Addr::parse(&address);
            let dated = (addr.clone(), key.clone(), uid);
            let since = kept.get(&addr).copied().or_else(|| carried(&dated)).unwrap_or(row.updated_at);
            let pool = row.view.allocation.as_ref().and_then(|a| a.pool_of(&address));
            let pool = pool.map(|p| Self::shared(&mut self.pools, p));
            let ports = Self::shared(&mut self.ports, &row.view.ports[..]);
            let spelled = matches!(&addr, Addr::Ip(ip) if ip.to_string() != address).then(|| address.into());
            addrs.push(addr.clone());
            self.entries.insert((addr, key.clone()), Vip { spelled, ports, source, pool, since });
        }
        self.by_service.insert(key.clone(), (uid, addrs.into()));
    }

    /// The date of each entry, by (address, Service, uid): what a new build carries over to a Service
    /// that still has that uid.
    fn dates(&self) -> HashMap<Dated, i64> {
        let uid = |key: &ServiceKey| self.by_service.get(key).map_or(0, |(uid, _)| *uid);
        self.entries.iter().map(|((addr, key), vip)| ((addr.clone(), key.clone(), uid(key)), vip.since)).collect()
    }
}

/// The index; cheap to share behind an `Arc`.
///
/// A read first brings it up to the last committed event: the Services those events changed are
/// read again and their entries replaced, so the work follows the changes, not the number of
/// Services. A full build reads every Service: at the first read of a process, and when the events
/// it would need were pruned; a background scan reads them all for status-only changes (see
/// [`VipIndex::read`]).
pub struct VipIndex {
    store: Store,
    current: RwLock<Index>,
    /// Taken to change the index (bring it up to date, swap a build in).
    updating: tokio::sync::Mutex<()>,
    /// When the background scan last ran, and how long the last scan or build took.
    checked: Mutex<(Instant, Duration)>,
    rebuilding: Arc<tokio::sync::Mutex<()>>,
}

/// How much of the time the background scan may take: it runs at most once per this many times the
/// last scan's (or build's) duration, and at most once per [`MAX_AGE`], so its share of a CPU stays
/// small however many Services there are.
const BUILD_SHARE: u32 = 10;

impl VipIndex {
    /// An empty index over `store`; the first read builds it.
    pub fn new(store: Store) -> Arc<Self> {
        Arc::new(Self {
            store,
            current: RwLock::new(Index::empty()),
            updating: tokio::sync::Mutex::new(()),
            checked: Mutex::new((Instant::now(), Duration::ZERO)),
            rebuilding: Arc::new(tokio::sync::Mutex::new(())),
        })
    }

    /// Runs `read` on the index once it includes every event up to `committed`. A status-only change
    /// (it records no event) shows after the background scan that follows a read at least
    /// [`MAX_AGE`] (or [`BUILD_SHARE`] times the last scan's duration, if longer) after the last
    /// one, when the database was written since. Errors: [`StoreError`].
    pub async fn read<T>(self: &Arc<Self>, committed: i64, read: impl FnOnce(&Index) -> T) -> Result<T, StoreError> {
        self.catch_up(committed).await?;
        self.check_in_background();
        let index = self.current.read().unwrap_or_else(|e| e.into_inner());
        Ok(read(&index))
    }

    fn committed(&self) -> i64 {
        self.current.read().unwrap_or_else(|e| e.into_inner()).committed
    }

    /// Brings the index up to event `committed`: the changed Services' entries replaced, or a full
    /// build when there is none yet or the events since it were pruned.
    async fn catch_up(self: &Arc<Self>, committed: i64) -> Result<(), StoreError> {
        if self.committed() >= committed.max(0) {
            return Ok(());
        }
        let _updating = self.updating.lock().await;
        let from = self.committed();
        if from >= committed.max(0) {
            return Ok(());
        }
        if from < 0 || from + 1 < self.store.min_event_id().await? {
            let next = self.build(committed, from < 0).await?;
            *self.current.write().unwrap_or_else(|e| e.into_inner()) = next;
            return Ok(());
        }
        let changed = self.store.services_changed(from, committed).await?;
        let mut index = self.current.write().unwrap_or_else(|e| e.into_inner());
        for (key, row) in &changed {
            index.put(key, row.as_ref(), |_| None);
        }
        index.committed = committed;
        Ok(())
    }

    /// Starts the background check ([`VipIndex::refresh`]) when it is due and not running.
    fn check_in_background(self: &Arc<Self>) {
        {
            let checked = self.checked.lock().unwrap_or_else(|e| e.into_inner());
            if checked.0.elapsed() < MAX_AGE.max(checked.1 * BUILD_SHARE) {
                return;
            }
        }
        let Ok(guard) = self.rebuilding.clone().try_lock_owned() else { return };
        let index = self.clone();
        tokio::spawn(async move {
            let _guard = guard;
            if let Err(e) = index.refresh().await {
                tracing::warn!(error = %e, "cannot refresh the VIP index");
            }
            index.checked.lock().unwrap_or_else(|e| e.into_inner()).0 = Instant::now();
        });
    }

    /// Reads every Service when the database was written since the last check, and replaces the
    /// entries of those whose VIPs differ from the index's (a status-only change). Runs off the
    /// runtime's workers and streams the rows, so neither the API nor the watch waits for it and
    /// memory stays flat; a Service deleted meanwhile is taken out by its event, not here.
    async fn refresh(self: &Arc<Self>) -> Result<(), StoreError> {
        let generation = self.store.write_generation().await?;
        if generation == self.current.read().unwrap_or_else(|e| e.into_inner()).generation {
            return Ok(());
        }
        let changed = self
            .scan(|index, runtime| {
                let mut changed = Vec::new();
                let visit = |row: ServiceRow| {
                    if index.current.read().unwrap_or_else(|e| e.into_inner()).differs(&row) {
                        changed.push(row);
                    }
                };
                runtime.block_on(index.store.for_each_service(visit))?;
                Ok(changed)
            })
            .await?;
        let _updating = self.updating.lock().await;
        let mut index = self.current.write().unwrap_or_else(|e| e.into_inner());
        for row in &changed {
            index.put(&row.key, Some(row), |_| None);
        }
        index.generation = generation;
        Ok(())
    }

    /// Every Service's entries, as of event `committed` or later: a new index (the first of the
    /// process dates VIPs from the event log, a later one carries the current index's dates).
    async fn build(self: &Arc<Self>, committed: i64, first: bool) -> Result<Index, StoreError> {
        let generation = self.store.write_generation().await?;
        let history = if first { run_starts(&self.store).await? } else { HashMap::new() };
        self.scan(move |index, runtime| {
            // Taken out of the old index first, so the build does not hold it.
            let carried =
                if first { HashMap::new() } else { index.current.read().unwrap_or_else(|e| e.into_inner()).dates() };
            let since = |dated: &Dated| {
                let (addr, key, _) = dated;
                carried.get(dated).or_else(|| history.get(&(key.clone(), addr.clone()))).copied()
            };
            let mut next = Index { committed, generation, ..Index::empty() };
            runtime.block_on(index.store.for_each_service(|row| next.put(&row.key, Some(&row), since)))?;
            Ok(next)
        })
        .await
    }

    /// Runs `work` (a read of every Service, given the runtime to drive its stream) on a blocking
    /// thread, off the runtime's workers, and notes how long it took: the background scan's pace.
    async fn scan<T: Send + 'static>(
        self: &Arc<Self>,
        work: impl FnOnce(&Self, &tokio::runtime::Handle) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (index, runtime) = (self.clone(), tokio::runtime::Handle::current());
        let run = move || {
            let started = Instant::now();
            let out = work(&index, &runtime);
            index.checked.lock().unwrap_or_else(|e| e.into_inner()).1 = started.elapsed();
            out
        };
        tokio::task::spawn_blocking(run).await.map_err(|_| gone())?
    }
}

/// The error of a build whose thread panicked or was cancelled (the runtime shutting down).
fn gone() -> StoreError {
    StoreError::Sqlx(sqlx::Error::PoolClosed)
}

/// Per (Service, VIP): `observed_at` of the first event of the newest run of events (current uid)
/// whose view carries the VIP.
async fn run_starts(store: &Store) -> Result<HashMap<(ServiceKey, Addr), i64>, StoreError> {
    let mut out = HashMap::new();
    let mut open: HashMap<String, i64> = HashMap::new();
    let mut current: Option<ServiceKey> = None;
    store
        .for_each_current_event(|key, observed_at, view| {
            // `replace` runs whenever the key changes, also for the first one.
            if current.as_ref() != Some(&key)
                && let Some(done) = current.replace(key)
            {
                out.extend(open.drain().map(|(vip, at)| ((done.clone(), Addr::parse(&vip)), at)));
            }
            step(&mut open, observed_at, &view);
        })
        .await?;
    if let Some(done) = current {
        out.extend(open.drain().map(|(vip, at)| ((done.clone(), Addr::parse(&vip)), at)));
    }
    Ok(out)
}

fn step(open: &mut HashMap<String, i64>, observed_at: i64, view: &ServiceView) {
    let vips = view.vips();
    open.retain(|vip, _| vips.contains(vip));
    for vip in vips {
        open.entry(vip).or_insert(observed_at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_sort_numerically_then_hostnames() {
        let mut v = ["lb.example.net", "2001:db8::1", "192.0.2.10", "192.0.2.9", "10.0.0.1"].map(Addr::parse);
        v.sort();
        let shown: Vec<String> = v
            .iter()
            .map(|a| match a {
                Addr::Ip(ip) => ip.to_string(),
                Addr::Host(h) => h.clone(),
            })
            .collect();
        assert_eq!(shown, ["10.0.0.1", "192.0.2.9", "192.0.2.10", "2001:db8::1", "lb.example.net"]);
    }

    /// A row of Service `default/<name>` (uid `uid`) announcing `ips`, changed at `at`.
    fn row(name: &str, uid: &str, ips: &str, at: i64) -> ServiceRow {
        let ann = serde_json::json!({"vipwatch.io/loadBalancerIPs": ips});
        let svc = serde_json::json!({"metadata": {"name": name, "namespace": "default", "annotations": ann},
                                     "spec": {"type": "LoadBalancer"}});
        ServiceRow {
            key: ServiceKey::new("default", name),
            uid: uid.into(),
            resource_version: "1".into(),
            view: ServiceView::from_service(&serde_json::from_value(svc).unwrap()),
            backends: Default::default(),
            first_seen_at: 1,
            updated_at: at,
        }
    }

    fn listed(index: &Index) -> Vec<(String, String, i64)> {
        index.after(None).map(|e| (e.address(), e.key.name.to_string(), e.since())).collect()
    }

    /// A change replaces only its Service's entries: a VIP it keeps keeps its date, a new one is dated
    /// by the change, a VIP it dropped is gone; a new uid dates every VIP anew; a Service gone leaves
    /// nothing behind.
    #[test]
    fn a_change_replaces_only_its_services_entries_and_keeps_the_dates_of_the_vips_it_keeps() {
        let mut index = Index::empty();
        let a = ServiceKey::new("default", "a");
        index.put(&a, Some(&row("a", "u1", "192.0.2.1,192.0.2.2", 10)), |_| None);
        index.put(&ServiceKey::new("default", "b"), Some(&row("b", "u2", "192.0.2.3", 20)), |_| None);
        index.put(&a, Some(&row("a", "u1", "192.0.2.2,192.0.2.4", 30)), |_| None);
        let at = |ip: &str, name: &str, since: i64| (ip.to_owned(), name.to_owned(), since);
        assert_eq!(listed(&index), [at("192.0.2.2", "a", 10), at("192.0.2.3", "b", 20), at("192.0.2.4", "a", 30)]);

        index.put(&a, Some(&row("a", "u9", "192.0.2.2", 40)), |_| None);
        assert_eq!(listed(&index), [at("192.0.2.2", "a", 40), at("192.0.2.3", "b", 20)]);

        index.put(&a, None, |_| None);
        assert_eq!(listed(&index), [at("192.0.2.3", "b", 20)]);
        assert_eq!((index.by_service.len(), index.entries.len()), (1, 1));
    }

    /// Entries with the same ports share one copy of them, kept while one of them uses it; an address
    /// is shown as the Service spells it.
    #[test]
    fn entries_share_their_ports_and_keep_an_address_as_spelled() {
        let mut index = Index::empty();
        let (a, b) = (ServiceKey::new("default", "a"), ServiceKey::new("default", "b"));
        // Another controller's status may spell an address as it likes (the annotation's are canonical).
        let mut spelled = row("a", "u1", "192.0.2.1", 10);
        spelled.view.ingress = serde_json::from_value(serde_json::json!([{"ip": "2001:DB8::0001"}])).unwrap();
        index.put(&a, Some(&spelled), |_| None);
        index.put(&b, Some(&row("b", "u2", "192.0.2.2", 20)), |_| None);
        assert_eq!(index.ports.len(), 1, "one set of ports for three entries");
        let shown: Vec<String> = index.after(None).map(|e| e.address()).collect();
        assert_eq!(shown, ["192.0.2.1", "192.0.2.2", "2001:DB8::0001"]);
        assert_eq!(index.of(&Addr::parse("2001:db8::1"))[0].key, &a, "found by any spelling");

        index.put(&a, None, |_| None);
        assert_eq!(index.ports.len(), 1, "b still uses it");
        index.put(&b, None, |_| None);
        assert_eq!((index.ports.len(), index.entries.len(), index.by_service.len()), (0, 0, 0));
    }

    #[test]
    fn a_vip_is_dated_from_the_start_of_its_newest_run() {
        let with = |ip: Option<&str>| {
            let ann = ip.map(|ip| serde_json::json!({"vipwatch.io/loadBalancerIPs": ip})).unwrap_or_default();
            let svc =
                serde_json::json!({"metadata": {"name": "a", "annotations": ann}, "spec": {"type": "LoadBalancer"}});
            ServiceView::from_service(&serde_json::from_value(svc).unwrap())
        };
        let mut open = HashMap::new();
        step(&mut open, 1, &with(Some("192.0.2.1")));
        step(&mut open, 2, &with(None));
        step(&mut open, 3, &with(Some("192.0.2.1")));
        step(&mut open, 4, &with(Some("192.0.2.1")));
        assert_eq!(open, HashMap::from([("192.0.2.1".to_owned(), 3)]));
    }
}
