//! The desired state: every Service vipwatch delivered and the agent accepted, the uids it deleted,
//! which server slot of each backend holds which member, and which event log speaks for which
//! cluster. Kept in `state.json` (written atomically), so a restarted agent renders the very same
//! `haproxy.cfg` without asking anyone.
//!
//! A Service is identified by cluster, namespace and name ([`ServiceKey`]): one agent serves several
//! clusters, each with its own vipwatch, and the same `namespace/name` in two of them are two
//! Services. A delivery without `data.cluster` (a vipwatch before 0.2) counts as cluster
//! [`DEFAULT_CLUSTER`]. A `state.json` written before clusters (keys `namespace/name`) loads with
//! its Services unclaimed (`cluster: None`): served as before until a cluster claims them
//! ([`crate::clusters`]).
//!
//! Rules for a delivery (docs/reference/agent-api.md):
//! - a delivery older than what was accepted for the same uid in the same cluster is stale and
//!   ignored (resourceVersions compared as numbers, then event ids: [`Version::older_than`]);
//! - a DELETED removes the Service and leaves a tombstone for its cluster and uid, so a late delivery
//!   for that uid is stale; deleting something unknown is fine;
//! - a Service HAProxy cannot serve (a UDP or SCTP port, a VIP that is a hostname, a VIP:port another
//!   Service binds, in this cluster or another) is refused on its own, never taking the others down.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use serde::{Deserialize, Serialize};
use vipwatch_contract::{MemberState, WebhookService};

/// Tombstones kept at most per cluster. Beyond it, the cluster's tombstone with the lowest uid is
/// forgotten (uids are random, so an arbitrary one); one cluster's deletions never push out
/// another's.
const MAX_TOMBSTONES: usize = 10_000;

/// The cluster of a delivery without `data.cluster` (a vipwatch before 0.2, which knew no cluster).
pub const DEFAULT_CLUSTER: &str = "default";

/// Whether `s` is a DNS-1123 label (lower-case letters, digits and `-`, at most 63, no `-` at
/// either end): what Kubernetes requires of namespace names and vipwatch of `cluster.name`, and
/// what keeps the `_`-separated HAProxy names and the `/`-separated state keys unambiguous.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A Service's identity in the agent: cluster, namespace and name. In `state.json` it is the string
/// `cluster/namespace/name`; `cluster: None` (written `namespace/name`) is a Service an agent stored
/// before clusters existed, not yet claimed by one. None of the three parts can hold `/` (they are
/// DNS labels), so the two forms never mix up.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceKey {
    /// The cluster (`data.cluster`); `None`: unclaimed, from before clusters.
    pub cluster: Option<String>,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
}

impl ServiceKey {
    /// The key of `svc` in `cluster`.
    pub fn of(cluster: &str, svc: &WebhookService) -> Self {
        Self { cluster: Some(cluster.to_owned()), namespace: svc.namespace.clone(), name: svc.name.clone() }
    }

    /// `namespace/name`.
    pub fn service(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The same Service in `cluster`.
    pub fn in_cluster(&self, cluster: &str) -> Self {
        Self { cluster: Some(cluster.to_owned()), ..self.clone() }
    }

    /// How a log line or a refusal names it: `Service shop/web of cluster east` (`Service shop/web`
    /// while unclaimed).
    pub fn describe(&self) -> String {
        match &self.cluster {
            Some(c) => format!("Service {}/{} of cluster {c}", self.namespace, self.name),
            None => {
                format!("Service {}/{} (stored before clusters, not yet claimed by one)", self.namespace, self.name)
            }
        }
    }
}

impl fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.cluster {
            Some(c) => write!(f, "{c}/{}/{}", self.namespace, self.name),
            None => write!(f, "{}/{}", self.namespace, self.name),
        }
    }
}

impl std::str::FromStr for ServiceKey {
    type Err = String;

    /// `cluster/namespace/name`, or `namespace/name` (unclaimed).
    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.split('/').collect();
        let bad = || format!("`{s}` is not a Service key (`cluster/namespace/name` or `namespace/name`)");
        match parts[..] {
            [c, ns, name] if !c.is_empty() && !ns.is_empty() && !name.is_empty() => {
                Ok(Self { cluster: Some(c.to_owned()), namespace: ns.to_owned(), name: name.to_owned() })
            }
            [ns, name] if !ns.is_empty() && !name.is_empty() => {
                Ok(Self { cluster: None, namespace: ns.to_owned(), name: name.to_owned() })
            }
            _ => Err(bad()),
        }
    }
}

/// A deleted object in a cluster: `cluster/uid` in `state.json`; `cluster: None` (written `uid`) is
/// a tombstone stored before clusters, which holds in every cluster until one claims it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UidKey {
    /// The cluster; `None`: from before clusters.
    pub cluster: Option<String>,
    /// `metadata.uid`.
    pub uid: String,
}

impl fmt::Display for UidKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.cluster {
            Some(c) => write!(f, "{c}/{}", self.uid),
            None => f.write_str(&self.uid),
        }
    }
}

impl std::str::FromStr for UidKey {
    type Err = String;

    /// `cluster/uid`, or `uid` (from before clusters).
    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once('/') {
            Some((c, uid)) if !c.is_empty() && !uid.is_empty() && !uid.contains('/') => {
                Ok(Self { cluster: Some(c.to_owned()), uid: uid.to_owned() })
            }
            None if !s.is_empty() => Ok(Self { cluster: None, uid: s.to_owned() }),
            _ => Err(format!("`{s}` is not a tombstone key (`cluster/uid` or `uid`)")),
        }
    }
}

/// Serde as the `Display`/`FromStr` string, so the keys stay JSON object keys.
macro_rules! string_serde {
    ($t:ty) => {
        impl Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}
string_serde!(ServiceKey);
string_serde!(UidKey);

/// Where a delivery stands in its object's history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Version {
    /// vipwatch's event-log id (`null` for a resync).
    pub event_id: Option<i64>,
    /// `metadata.resourceVersion` of the change.
    pub resource_version: String,
    /// The event log `event_id` belongs to (`data.log_id`); event ids of different logs do not
    /// compare.
    #[serde(default)]
    pub log_id: Option<String>,
}

impl Version {
    /// Whether `self` is strictly older than `other` (both of the same uid). The resourceVersions
    /// decide when both are numbers and differ (etcd revisions are; the rule: a delivery with an older
    /// resourceVersion of the same uid is stale); on a tie — a members-only change keeps the Service's
    /// resourceVersion — vipwatch's event ids decide when both have one from the same event log
    /// (`log_id`). A replaced vipwatch database counts its event ids from 1 again under a new
    /// `log_id`, so its deliveries are not mistaken for old ones.
    pub fn older_than(&self, other: &Version) -> bool {
        if let (Ok(a), Ok(b)) = (self.resource_version.parse::<u64>(), other.resource_version.parse::<u64>())
            && a != b
        {
            return a < b;
        }
        self.log_id == other.log_id && matches!((self.event_id, other.event_id), (Some(a), Some(b)) if a < b)
    }

    /// Whether this change came after the snapshot of a resync of log `log_id` that included events
    /// up to `as_of`: the same log and a higher event id.
    pub fn after(&self, log_id: Option<&str>, as_of: Option<i64>) -> bool {
        self.log_id.as_deref() == log_id && matches!((self.event_id, as_of), (Some(e), Some(o)) if e > o)
    }
}

/// An accepted Service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Accepted {
    /// The Service as last delivered.
    pub service: WebhookService,
    /// The delivery it came with.
    pub version: Version,
}

/// Which vipwatch speaks for a cluster name: the event log (`data.log_id`) that first delivered
/// it, kept until that log renames its cluster or another log takes the name over (rules in
/// [`crate::clusters`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Binding {
    /// The bound event log; `None`: a vipwatch that sends none (before 0.1).
    pub log_id: Option<String>,
    /// The highest event id accepted from that log for this cluster.
    #[serde(default)]
    pub last_event_id: Option<i64>,
    /// Names this log delivered under before it renamed its cluster, each with the event id at the
    /// rename: a delivery under such a name whose event id is not above it was made before the
    /// rename (vipwatch renders a delivery when it enqueues it) and is applied under the current name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub former_names: BTreeMap<String, Option<i64>>,
}

/// The desired state (see the module docs). `PartialEq`: an unchanged state needs no apply.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Desired {
    /// Accepted Services by cluster, namespace and name.
    pub services: BTreeMap<ServiceKey, Accepted>,
    /// Deleted uids per cluster and the version of their DELETED.
    pub tombstones: BTreeMap<UidKey, Version>,
    /// Per backend name, slot `i` holds the member `address:port` (`None`: empty slot).
    pub slots: BTreeMap<String, Vec<Option<String>>>,
    /// Per cluster name, the event log bound to it.
    #[serde(default)]
    pub clusters: BTreeMap<String, Binding>,
    /// The identity of this state, `gen_` + 32 hex digits: made when the state is created and kept
    /// with it, and answered with every delivery ([`crate::catchup`]), so that vipwatch tells a state
    /// made again after a loss from the one it fed. A `state.json` of an agent before it has none
    /// and is given one when loaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<String>,
    /// This state was made while HAProxy ran a configuration the agent had not made (the state was
    /// lost, HAProxy kept serving): HAProxy is left as it is until the agent is caught up.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub held: bool,
}

/// What a delivery asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Intent {
    /// Create or replace a Service.
    Upsert {
        /// The Service's cluster.
        cluster: String,
        /// The Service.
        service: Box<WebhookService>,
        /// The delivery's version.
        version: Version,
    },
    /// Remove a Service.
    Delete {
        /// The Service.
        key: ServiceKey,
        /// The deleted object's uid.
        uid: String,
        /// The DELETED's version.
        version: Version,
    },
    /// The end of a complete resync of one cluster: remove every Service of `cluster` not in `keep`
    /// whose last change is not newer than the resync (event id at most `as_of`). Other clusters'
    /// Services are not the resync's to judge.
    Sweep {
        /// The cluster the resync came from.
        cluster: String,
        /// The Services the resync announced.
        keep: BTreeSet<ServiceKey>,
        /// The newest event id the resync included.
        as_of: Option<i64>,
        /// The event log `as_of` belongs to: a Service last changed under another log (vipwatch's
        /// database was replaced) is swept when the resync left it out.
        log_id: Option<String>,
    },
}

/// The backend name of Service port `port` of `key`: `be_<cluster>_<namespace>_<name>_<port>`
/// (`be_<namespace>_<name>_<port>` while unclaimed, as agents before clusters named it). Unique:
/// the parts are DNS labels, which hold no `_`.
pub fn backend_name(key: &ServiceKey, port: i32) -> String {
    match &key.cluster {
        Some(c) => format!("be_{c}_{}_{}_{port}", key.namespace, key.name),
        None => format!("be_{}_{}_{port}", key.namespace, key.name),
    }
}

/// A member's slot key, `address:port` (`[v6]:port`).
pub fn member_key(address: &str, port: i32) -> String {
    match address.parse::<IpAddr>() {
        Ok(ip) => SocketAddr::new(ip, u16::try_from(port).unwrap_or(0)).to_string(),
        Err(_) => format!("{address}:{port}"),
    }
}

impl Desired {
    /// Why a delivery of `intent` is not applied: `Some("stale")` or `None` when it should be.
    pub fn ignore(&self, intent: &Intent) -> Option<&'static str> {
        match intent {
            Intent::Upsert { cluster, service: svc, version } => {
                if self.tombstone(cluster, &svc.uid).is_some_and(|t| !t.older_than(version)) {
                    return Some("stale: the object was deleted");
                }
                let current = self.services.get(&ServiceKey::of(cluster, svc)).filter(|a| a.service.uid == svc.uid);
                current.filter(|a| version.older_than(&a.version)).map(|_| "stale: a newer version is applied")
            }
            Intent::Delete { key, uid, version } => {
                let current = self.services.get(key).filter(|a| a.service.uid == *uid);
                current.filter(|a| version.older_than(&a.version)).map(|_| "stale: a newer version is applied")
            }
            Intent::Sweep { .. } => None,
        }
    }

    /// The tombstone of `uid` in `cluster`, or one stored before clusters.
    fn tombstone(&self, cluster: &str, uid: &str) -> Option<&Version> {
        let key = |cluster: Option<&str>| UidKey { cluster: cluster.map(str::to_owned), uid: uid.to_owned() };
        self.tombstones.get(&key(Some(cluster))).or_else(|| self.tombstones.get(&key(None)))
    }

    /// Applies `intent`. Errors: the reason HAProxy could never serve the Service (the state is then
    /// unchanged).
    pub fn apply(&mut self, intent: Intent) -> Result<(), String> {
        let mut binds = Binds::of(self);
        self.apply_with(intent, &mut binds)
    }

    /// [`Desired::apply`] with `binds`, the bind index of this state ([`Binds::of`]), kept up to
    /// date: a batch of deliveries checks each Service's binds by lookup instead of a pass over every
    /// accepted Service (which made a batch quadratic in the Services accepted). `binds` must be
    /// this state's: rebuild it after changing `services` by other means.
    pub fn apply_with(&mut self, intent: Intent, binds: &mut Binds) -> Result<(), String> {
        match intent {
            Intent::Upsert { cluster, service, version } => {
                let key = ServiceKey::of(&cluster, &service);
                self.servable(&key, &service, binds)?;
                for (k, a) in self.drop_unclaimed(&service.uid) {
                    binds.remove(&k, &a.service);
                }
                if let Some(old) = self.services.get(&key) {
                    binds.remove(&key, &old.service);
                }
                binds.add(&key, &service);
                self.services.insert(key, Accepted { service: *service, version });
            }
            Intent::Delete { key, uid, version } => {
                if self.services.get(&key).is_some_and(|a| a.service.uid == uid)
                    && let Some(old) = self.services.remove(&key)
                {
                    binds.remove(&key, &old.service);
                }
                for (k, a) in self.drop_unclaimed(&uid) {
                    binds.remove(&k, &a.service);
                }
                self.tombstones.insert(UidKey { cluster: key.cluster.clone(), uid }, version);
                self.cap_tombstones(&key.cluster, MAX_TOMBSTONES);
            }
            Intent::Sweep { cluster, keep, as_of, log_id } => {
                self.services.retain(|k, a| {
                    k.cluster.as_deref() != Some(cluster.as_str())
                        || keep.contains(k)
                        || a.version.after(log_id.as_deref(), as_of)
                });
                *binds = Binds::of(self);
            }
        }
        Ok(())
    }

    /// Forgets `cluster`'s tombstones beyond `max`, lowest uids first (see [`MAX_TOMBSTONES`]).
    fn cap_tombstones(&mut self, cluster: &Option<String>, max: usize) {
        let first = UidKey { cluster: cluster.clone(), uid: String::new() };
        let of_cluster = || self.tombstones.range(first.clone()..).take_while(|(k, _)| k.cluster == *cluster);
        let excess = of_cluster().count().saturating_sub(max);
        let forget: Vec<UidKey> = of_cluster().take(excess).map(|(k, _)| k.clone()).collect();
        for k in forget {
            self.tombstones.remove(&k);
        }
    }

    /// Removes the unclaimed Service (stored before clusters) with `uid`: a cluster's delivery of
    /// the same object supersedes it. Unclaimed keys sort first, so only they are looked at.
    fn drop_unclaimed(&mut self, uid: &str) -> Vec<(ServiceKey, Accepted)> {
        let unclaimed = self.services.iter().take_while(|(k, _)| k.cluster.is_none());
        let same: Vec<ServiceKey> = unclaimed.filter(|(_, a)| a.service.uid == uid).map(|(k, _)| k.clone()).collect();
        same.into_iter().filter_map(|k| self.services.remove(&k).map(|a| (k, a))).collect()
    }

    /// Whether any Service or tombstone is still unclaimed (stored before clusters). Unclaimed keys
    /// sort first.
    pub fn has_unclaimed(&self) -> bool {
        self.services.keys().next().is_some_and(|k| k.cluster.is_none())
            || self.tombstones.keys().next().is_some_and(|k| k.cluster.is_none())
    }

    /// Checks that HAProxy can serve `svc` as `key` next to the other accepted Services, of every
    /// cluster (an unclaimed one of the same uid is the same object, about to be replaced).
    fn servable(&self, key: &ServiceKey, svc: &WebhookService, index: &Binds) -> Result<(), String> {
        for (what, part) in [("namespace", &svc.namespace), ("name", &svc.name)] {
            if !is_dns_label(part) {
                return Err(format!("Service {what} `{part}` is not a DNS-1123 label"));
            }
        }
        if let Some(p) = svc.view.ports.iter().find(|p| p.protocol != "TCP") {
            return Err(format!("port {}/{}: HAProxy proxies TCP only", p.port, p.protocol));
        }
        let mut binds = Vec::new();
        for vip in &svc.vips {
            let ip: IpAddr = vip.parse().map_err(|_| format!("VIP `{vip}` is a hostname: HAProxy binds addresses"))?;
            binds.extend(svc.view.ports.iter().map(|p| SocketAddr::new(ip, u16::try_from(p.port).unwrap_or(0))));
        }
        // The first other Service (in key order) holding one of these binds, and the first bind it holds.
        let other_holds = |k: &&ServiceKey| {
            *k != key && (k.cluster.is_some() || self.services.get(*k).is_some_and(|a| a.service.uid != svc.uid))
        };
        let other = binds.iter().flat_map(|b| index.holders(b)).filter(other_holds).min();
        if let Some(other) = other {
            let held = self.services.get(other).map(|a| binds_of(&a.service)).unwrap_or_default();
            if let Some(b) = binds.iter().find(|b| held.contains(b)) {
                let hint = if other.cluster.is_some() && other.cluster != key.cluster {
                    " (clusters sharing this appliance need address pools that do not overlap)"
                } else {
                    ""
                };
                return Err(format!("{b} is already bound by {}{hint}", other.describe()));
            }
        }
        Ok(())
    }

    /// Moves the Services of cluster `from` (`None`: the unclaimed ones) that `pick` selects into
    /// cluster `to`, with their server slots, so members keep their slots and nothing is served
    /// twice. A Service `to` already has stays (it is newer); the moved one of the same name is
    /// dropped. Returns how many moved.
    pub fn move_services(&mut self, from: Option<&str>, to: &str, mut pick: impl FnMut(&Accepted) -> bool) -> usize {
        let keys: Vec<ServiceKey> = self
            .services
            .iter()
            .filter(|(k, a)| k.cluster.as_deref() == from && pick(a))
            .map(|(k, _)| k.clone())
            .collect();
        let mut moved = 0;
        for old in keys {
            let Some(a) = self.services.remove(&old) else { continue };
            let new = old.in_cluster(to);
            for p in &a.service.view.ports {
                if let Some(slots) = self.slots.remove(&backend_name(&old, p.port))
                    && !self.services.contains_key(&new)
                {
                    self.slots.insert(backend_name(&new, p.port), slots);
                }
            }
            if let std::collections::btree_map::Entry::Vacant(e) = self.services.entry(new) {
                e.insert(a);
                moved += 1;
            }
        }
        moved
    }

    /// Moves the tombstones of cluster `from` (`None`: from before clusters) that `pick` selects
    /// into cluster `to`.
    pub fn move_tombstones(&mut self, from: Option<&str>, to: &str, mut pick: impl FnMut(&Version) -> bool) {
        let keys: Vec<UidKey> = self
            .tombstones
            .iter()
            .filter(|(k, v)| k.cluster.as_deref() == from && pick(v))
            .map(|(k, _)| k.clone())
            .collect();
        for old in keys {
            if let Some(v) = self.tombstones.remove(&old) {
                self.tombstones.entry(UidKey { cluster: Some(to.to_owned()), uid: old.uid }).or_insert(v);
            }
        }
    }

    /// Puts every member into a server slot of its backend: a member keeps its slot for as long as it
    /// exists (so draining connections stay put), new members take the lowest empty slots, and a
    /// backend grows by `per` slots at a time when it runs out. Backends of removed ports go away.
    pub fn reslot(&mut self, per: usize) {
        let mut wanted: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (key, a) in &self.services {
            let members = a.service.backends.iter().flat_map(|b| &b.ports);
            for p in a.service.view.ports.iter().filter(|p| p.protocol == "TCP") {
                let port = members.clone().find(|bp| bp.port == p.port && bp.protocol == p.protocol);
                let keys = port.into_iter().flat_map(|bp| &bp.members).map(|m| member_key(&m.address, m.port));
                wanted.insert(backend_name(key, p.port), keys.collect());
            }
        }
        self.slots.retain(|name, _| wanted.contains_key(name));
        for (name, members) in wanted {
            let slots = self.slots.entry(name).or_default();
            let present: BTreeSet<&String> = members.iter().collect();
            for s in slots.iter_mut() {
                if s.as_ref().is_some_and(|m| !present.contains(m)) {
                    *s = None;
                }
            }
            for m in &members {
                if slots.iter().any(|s| s.as_ref() == Some(m)) {
                    continue;
                }
                match slots.iter_mut().find(|s| s.is_none()) {
                    Some(free) => *free = Some(m.clone()),
                    None => slots.push(Some(m.clone())),
                }
            }
            let size = slots.len().div_ceil(per).max(1) * per;
            slots.resize(size, None);
        }
    }

    /// How many Services each cluster has (`None`: unclaimed ones from before clusters); every bound
    /// cluster is listed, with 0 when it has none.
    pub fn services_per_cluster(&self) -> BTreeMap<Option<String>, usize> {
        let mut out: BTreeMap<Option<String>, usize> = self.clusters.keys().map(|c| (Some(c.clone()), 0)).collect();
        for k in self.services.keys() {
            *out.entry(k.cluster.clone()).or_default() += 1;
        }
        out
    }

    /// Reads `state.json`; an absent file is an empty state. A file written before clusters (keys
    /// `namespace/name`, tombstones by uid alone) loads with everything unclaimed. Errors: the file
    /// exists but cannot be read or is not a state (the agent refuses to start rather than drop
    /// every Service).
    pub fn load(path: &Path) -> Result<Self, String> {
        Ok(Self::load_existing(path)?.unwrap_or_default())
    }

    /// [`Self::load`], with `None` when there is no `state.json` at all (the agent has no state).
    /// Errors: as [`Self::load`].
    pub fn load_existing(path: &Path) -> Result<Option<Self>, String> {
        match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| format!("{}: not an agent state: {e}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("{}: {e}", path.display())),
        }
    }

    /// Writes `state.json` atomically (a temp file renamed over it, synced). Errors: I/O.
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let bytes = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        write_atomically(path, &bytes)
    }
}

/// Every VIP:port `svc` binds.
pub fn binds_of(svc: &WebhookService) -> Vec<SocketAddr> {
    let ips = svc.vips.iter().filter_map(|v| v.parse::<IpAddr>().ok());
    ips.flat_map(|ip| svc.view.ports.iter().map(move |p| SocketAddr::new(ip, u16::try_from(p.port).unwrap_or(0))))
        .collect()
}

/// Which accepted Services bind each address, for [`Desired::apply_with`]: built from a state once,
/// then kept up to date by it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Binds {
    holders: std::collections::HashMap<SocketAddr, Vec<ServiceKey>>,
}

impl Binds {
    /// The bind index of `state`.
    pub fn of(state: &Desired) -> Self {
        let mut index = Self::default();
        for (key, a) in &state.services {
            index.add(key, &a.service);
        }
        index
    }

    fn add(&mut self, key: &ServiceKey, svc: &WebhookService) {
        for b in binds_of(svc) {
            self.holders.entry(b).or_default().push(key.clone());
        }
    }

    fn remove(&mut self, key: &ServiceKey, svc: &WebhookService) {
        for b in binds_of(svc) {
            if let Some(keys) = self.holders.get_mut(&b) {
                if let Some(i) = keys.iter().position(|k| k == key) {
                    keys.swap_remove(i);
                }
                if keys.is_empty() {
                    self.holders.remove(&b);
                }
            }
        }
    }

    /// The Services that bind `b`.
    fn holders(&self, b: &SocketAddr) -> &[ServiceKey] {
        self.holders.get(b).map_or(&[], Vec::as_slice)
    }
}

/// The state of member `key` of backend port members `m`, if it is there.
pub fn member_state(svc: &WebhookService, port: i32, key: &str) -> Option<MemberState> {
    let b = svc.backends.as_ref()?;
    let p = b.ports.iter().find(|p| p.port == port)?;
    p.members.iter().find(|m| member_key(&m.address, m.port) == key).map(|m| m.state)
}

/// Writes `bytes` to `path` through a temp file in the same directory, synced, then renamed.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent().and_then(|d| std::fs::File::open(d).ok()) {
        let _ = dir.sync_all();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{Desired, UidKey, Version};

    #[test]
    fn one_clusters_deletions_never_push_out_another_clusters_tombstones() {
        let mut s = Desired::default();
        let tomb = |c: &str, uid: &str| UidKey { cluster: Some(c.into()), uid: uid.into() };
        for (c, uid) in [("alpha", "u1"), ("zeta", "u2"), ("zeta", "u3"), ("zeta", "u4")] {
            s.tombstones.insert(tomb(c, uid), v(Some(1), "1"));
        }
        s.cap_tombstones(&Some("zeta".into()), 2);
        let kept: Vec<String> = s.tombstones.keys().map(ToString::to_string).collect();
        assert_eq!(kept, ["alpha/u1", "zeta/u3", "zeta/u4"]);
    }

    #[test]
    fn keys_of_a_state_before_clusters_read_as_unclaimed_and_new_ones_round_trip() {
        let old: super::ServiceKey = "shop/web".parse().unwrap();
        assert_eq!((old.cluster.clone(), old.service()), (None, "shop/web".to_owned()));
        let new: super::ServiceKey = "east/shop/web".parse().unwrap();
        assert_eq!((new.cluster.as_deref(), new.to_string()), (Some("east"), "east/shop/web".to_owned()));
        assert!("a/b/c/d".parse::<super::ServiceKey>().is_err());
        assert!("east//web".parse::<super::ServiceKey>().is_err());
        let tomb: UidKey = "6f1c-uid".parse().unwrap();
        assert_eq!(tomb, UidKey { cluster: None, uid: "6f1c-uid".into() });
        assert_eq!("east/6f1c-uid".parse::<UidKey>().unwrap().to_string(), "east/6f1c-uid");
    }

    fn v(event_id: Option<i64>, rv: &str) -> Version {
        Version { event_id, resource_version: rv.to_owned(), log_id: Some("log-a".into()) }
    }

    #[test]
    fn the_resource_version_decides_then_the_event_id() {
        // A higher resourceVersion wins even with a lower event id (vipwatch's database was replaced).
        assert!(!v(Some(3), "120").older_than(&v(Some(900), "100")));
        assert!(v(Some(900), "100").older_than(&v(Some(3), "120")));
        // Same resourceVersion (a members-only change): the event id orders them.
        assert!(v(Some(7), "100").older_than(&v(Some(8), "100")));
        assert!(!v(Some(8), "100").older_than(&v(Some(7), "100")));
        // A resync carries no event id: never stale against the same resourceVersion.
        assert!(!v(None, "100").older_than(&v(Some(8), "100")));
        // Equal versions are not older (a retry of the same change applies again, harmlessly).
        assert!(!v(Some(8), "100").older_than(&v(Some(8), "100")));
        // resourceVersions that are not numbers are opaque: only event ids can order them.
        assert!(v(Some(1), "b").older_than(&v(Some(2), "a")));
        assert!(!v(None, "b").older_than(&v(Some(2), "a")));
    }

    #[test]
    fn event_ids_of_another_event_log_do_not_compare() {
        // vipwatch's database was replaced: its ids start again at 1 under a new log id.
        let replaced = Version { log_id: Some("log-b".into()), ..v(Some(1), "100") };
        assert!(!replaced.older_than(&v(Some(900), "100")));
        assert!(!replaced.after(Some("log-a"), Some(0)), "not newer than a resync of the other log");
        assert!(v(Some(901), "100").after(Some("log-a"), Some(900)));
        assert!(!v(Some(900), "100").after(Some("log-a"), Some(900)));
        assert!(!v(None, "100").after(Some("log-a"), Some(900)), "a resync's own delivery is not newer");
    }
}
