//! The in-memory VIP index behind `/api/v1/vips`: every (VIP, Service) pair of the current-state
//! table, ordered by address (IPv4, then IPv6, numerically; then hostnames), namespace, name, so a
//! page of 1,000 is a range walk instead of a JSON scan of every Service.
//!
//! Each entry holds its list item pre-rendered as JSON, so a page costs a range walk and a copy.
//!
//! Freshness: a read rebuilds the index first when an event was committed since it was built; a
//! status-only change (a published ingress IP, which records no event) is picked up at most
//! [`MAX_AGE`] later by a background check that rebuilds only when the database was written since. `since` of a VIP is carried across rebuilds; the first build of a
//! process dates each VIP from the event log (start of the newest run of events whose view carries it),
//! later ones from the Service row's `updated_at` (the change that brought it).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use crate::model::{PortView, ServiceKey, ServiceView};
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
}

/// One (VIP, Service) pair.
#[derive(Debug, Clone)]
pub struct VipEntry {
    /// The address as the Service spells it.
    pub address: String,
    /// Its sort key.
    pub addr: Addr,
    /// The Service.
    pub key: ServiceKey,
    /// The Service's ports.
    pub ports: Vec<PortView>,
    /// `pool`, `appliance`, `status`, `annotation` or `spec` (see `ServiceView::vip_sources`).
    pub source: &'static str,
    /// The pool this address comes from, for `source = pool` (each address its own: a Service may hold
    /// addresses of two pools).
    pub pool: Option<String>,
    /// `IPv4` or `IPv6`; `None` for a hostname.
    pub family: Option<IpFamily>,
    /// Since when this Service has this VIP (Unix ms).
    pub since: i64,
    /// The `/api/v1/vips` item of this entry, as JSON.
    pub json: String,
}

type EntryKey = (Addr, ServiceKey);
type SinceKey = (String, ServiceKey, String);

/// One immutable build of the index.
pub struct Snapshot {
    committed: i64,
    generation: i64,
    checked: Mutex<Instant>,
    entries: BTreeMap<EntryKey, VipEntry>,
    since: HashMap<SinceKey, i64>,
}

impl Snapshot {
    fn empty() -> Self {
        Self {
            committed: -1,
            generation: -1,
            checked: Mutex::new(Instant::now()),
            entries: BTreeMap::new(),
            since: HashMap::new(),
        }
    }

    /// Entries strictly after `after` (address, Service) in index order.
    pub fn after(&self, after: Option<(Addr, ServiceKey)>) -> impl Iterator<Item = &VipEntry> {
        use std::ops::Bound::{Excluded, Unbounded};
        let lower = after.map_or(Unbounded, Excluded);
        self.entries.range((lower, Unbounded)).map(|(_, e)| e)
    }

    /// Every Service behind `addr`, by namespace and name.
    pub fn of(&self, addr: &Addr) -> Vec<&VipEntry> {
        self.entries
            .range((addr.clone(), ServiceKey::new("", ""))..)
            .map(|(_, e)| e)
            .take_while(|e| e.addr == *addr)
            .collect()
    }
}

/// The index; cheap to share behind an `Arc`.
pub struct VipIndex {
    store: Store,
    current: RwLock<Arc<Snapshot>>,
    rebuilding: Arc<tokio::sync::Mutex<()>>,
}

impl VipIndex {
    /// An empty index over `store`; the first read builds it.
    pub fn new(store: Store) -> Arc<Self> {
        Arc::new(Self {
            store,
            current: RwLock::new(Arc::new(Snapshot::empty())),
            rebuilding: Arc::new(tokio::sync::Mutex::new(())),
        })
    }

    fn current(&self) -> Arc<Snapshot> {
        self.current.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// A snapshot that includes every event up to `committed` (rebuilt first if needed; a merely old
    /// one is returned as is while a background task checks it). Errors: [`StoreError`].
    pub async fn snapshot(self: &Arc<Self>, committed: i64) -> Result<Arc<Snapshot>, StoreError> {
        let snap = self.current();
        if snap.committed >= committed && snap.committed >= 0 {
            if snap.checked.lock().unwrap_or_else(|e| e.into_inner()).elapsed() >= MAX_AGE
                && let Ok(guard) = self.rebuilding.clone().try_lock_owned()
            {
                let index = self.clone();
                tokio::spawn(async move {
                    let _guard = guard;
                    if let Err(e) = index.refresh(committed).await {
                        tracing::warn!(error = %e, "cannot refresh the VIP index");
                    }
                });
            }
            return Ok(snap);
        }
        let _guard = self.rebuilding.lock().await;
        let snap = self.current();
        if snap.committed >= committed && snap.committed >= 0 {
            return Ok(snap);
        }
        self.rebuild(committed).await
    }

    /// Rebuilds when the database was written since the current snapshot was built.
    async fn refresh(&self, committed: i64) -> Result<(), StoreError> {
        let snap = self.current();
        if self.store.write_generation().await? == snap.generation {
            *snap.checked.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
            return Ok(());
        }
        self.rebuild(committed.max(snap.committed)).await.map(|_| ())
    }

    async fn rebuild(&self, committed: i64) -> Result<Arc<Snapshot>, StoreError> {
        let prev = self.current();
        let generation = self.store.write_generation().await?;
        let history = if prev.committed < 0 { run_starts(&self.store).await? } else { HashMap::new() };
        let mut next = Snapshot {
            committed,
            generation,
            checked: Mutex::new(Instant::now()),
            entries: BTreeMap::new(),
            since: HashMap::new(),
        };
        for row in self.store.services().await? {
            for (address, source) in row.view.vip_sources() {
                let since_key = (address.clone(), row.key.clone(), row.uid.clone());
                let since = prev
                    .since
                    .get(&since_key)
                    .or_else(|| history.get(&(row.key.clone(), address.clone())))
                    .copied()
                    .unwrap_or(row.updated_at);
                next.since.insert(since_key, since);
                let addr = Addr::parse(&address);
                let pool = row.view.allocation.as_ref().and_then(|a| a.pool_of(&address)).map(str::to_owned);
                let family = match &addr {
                    Addr::Ip(ip) => Some(IpFamily::of(ip)),
                    Addr::Host(_) => None,
                };
                let mut entry = VipEntry {
                    address,
                    addr: addr.clone(),
                    key: row.key.clone(),
                    ports: row.view.ports.clone(),
                    source,
                    pool,
                    family,
                    since,
                    json: String::new(),
                };
                entry.json = super::vips::render(&entry);
                next.entries.insert((addr, row.key.clone()), entry);
            }
        }
        let next = Arc::new(next);
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = next.clone();
        Ok(next)
    }
}

/// Per (Service, VIP): `observed_at` of the first event of the newest run of events (current uid)
/// whose view carries the VIP.
async fn run_starts(store: &Store) -> Result<HashMap<(ServiceKey, String), i64>, StoreError> {
    let mut out = HashMap::new();
    let mut open: HashMap<String, i64> = HashMap::new();
    let mut current: Option<ServiceKey> = None;
    store
        .for_each_current_event(|key, observed_at, view| {
            // `replace` runs whenever the key changes, also for the first one.
            if current.as_ref() != Some(&key)
                && let Some(done) = current.replace(key)
            {
                out.extend(open.drain().map(|(vip, at)| ((done.clone(), vip), at)));
            }
            step(&mut open, observed_at, &view);
        })
        .await?;
    if let Some(done) = current {
        out.extend(open.drain().map(|(vip, at)| ((done.clone(), vip), at)));
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
