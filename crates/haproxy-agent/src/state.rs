//! The desired state: every Service vipwatch delivered and the agent accepted, the uids it deleted,
//! and which server slot of each backend holds which member. Kept in `state.json` (written
//! atomically), so a restarted agent renders the very same `haproxy.cfg` without asking anyone.
//!
//! Rules for a delivery (docs/reference/agent-api.md):
//! - a delivery older than what was accepted for the same uid is stale and ignored (resourceVersions
//!   compared as numbers, then event ids: [`Version::older_than`]);
//! - a DELETED removes the Service and leaves a tombstone, so a late delivery for that uid is stale;
//!   deleting something unknown is fine;
//! - a Service HAProxy cannot serve (a UDP or SCTP port, a VIP that is a hostname, a VIP:port another
//!   Service binds) is refused on its own, never taking the others down.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use serde::{Deserialize, Serialize};
use vipwatch_contract::{MemberState, WebhookService};

/// Tombstones kept at most (the oldest are forgotten first).
const MAX_TOMBSTONES: usize = 10_000;

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

/// The desired state (see the module docs). `PartialEq`: an unchanged state needs no apply.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Desired {
    /// Accepted Services by `namespace/name`.
    pub services: BTreeMap<String, Accepted>,
    /// Deleted uids and the version of their DELETED.
    pub tombstones: BTreeMap<String, Version>,
    /// Per backend name, slot `i` holds the member `address:port` (`None`: empty slot).
    pub slots: BTreeMap<String, Vec<Option<String>>>,
}

/// What a delivery asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Intent {
    /// Create or replace a Service.
    Upsert(Box<WebhookService>, Version),
    /// Remove a Service.
    Delete {
        /// `namespace/name`.
        key: String,
        /// The deleted object's uid.
        uid: String,
        /// The DELETED's version.
        version: Version,
    },
    /// The end of a complete resync: remove every Service not in `keep` whose last change is not newer
    /// than the resync (event id at most `as_of`).
    Sweep {
        /// The keys the resync announced.
        keep: BTreeSet<String>,
        /// The newest event id the resync included.
        as_of: Option<i64>,
        /// The event log `as_of` belongs to: a Service last changed under another log (vipwatch's
        /// database was replaced) is swept when the resync left it out.
        log_id: Option<String>,
    },
}

/// `namespace/name` of a Service.
pub fn key_of(s: &WebhookService) -> String {
    format!("{}/{}", s.namespace, s.name)
}

/// The backend name of Service port `port` of `key`: `be_<namespace>_<name>_<port>`.
pub fn backend_name(key: &str, port: i32) -> String {
    format!("be_{}_{port}", key.replace('/', "_"))
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
            Intent::Upsert(svc, version) => {
                let tomb = self.tombstones.get(&svc.uid);
                if tomb.is_some_and(|t| !t.older_than(version)) {
                    return Some("stale: the object was deleted");
                }
                let current = self.services.get(&key_of(svc)).filter(|a| a.service.uid == svc.uid);
                current.filter(|a| version.older_than(&a.version)).map(|_| "stale: a newer version is applied")
            }
            Intent::Delete { key, uid, version } => {
                let current = self.services.get(key).filter(|a| a.service.uid == *uid);
                current.filter(|a| version.older_than(&a.version)).map(|_| "stale: a newer version is applied")
            }
            Intent::Sweep { .. } => None,
        }
    }

    /// Applies `intent`. Errors: the reason HAProxy could never serve the Service (the state is then
    /// unchanged).
    pub fn apply(&mut self, intent: Intent) -> Result<(), String> {
        match intent {
            Intent::Upsert(svc, version) => {
                self.servable(&svc)?;
                let key = key_of(&svc);
                self.services.insert(key, Accepted { service: *svc, version });
            }
            Intent::Delete { key, uid, version } => {
                if self.services.get(&key).is_some_and(|a| a.service.uid == uid) {
                    self.services.remove(&key);
                }
                self.tombstones.insert(uid, version);
                while self.tombstones.len() > MAX_TOMBSTONES {
                    self.tombstones.pop_first();
                }
            }
            Intent::Sweep { keep, as_of, log_id } => {
                self.services.retain(|k, a| keep.contains(k) || a.version.after(log_id.as_deref(), as_of))
            }
        }
        Ok(())
    }

    /// Checks that HAProxy can serve `svc` next to the other accepted Services.
    fn servable(&self, svc: &WebhookService) -> Result<(), String> {
        if let Some(p) = svc.view.ports.iter().find(|p| p.protocol != "TCP") {
            return Err(format!("port {}/{}: HAProxy proxies TCP only", p.port, p.protocol));
        }
        let mut binds = Vec::new();
        for vip in &svc.vips {
            let ip: IpAddr = vip.parse().map_err(|_| format!("VIP `{vip}` is a hostname: HAProxy binds addresses"))?;
            binds.extend(svc.view.ports.iter().map(|p| SocketAddr::new(ip, u16::try_from(p.port).unwrap_or(0))));
        }
        let key = key_of(svc);
        for (other, a) in self.services.iter().filter(|(k, _)| **k != key) {
            if let Some(b) = binds.iter().find(|b| binds_of(&a.service).contains(b)) {
                return Err(format!("{b} is already bound by Service {other}"));
            }
        }
        Ok(())
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

    /// Reads `state.json`; an absent file is an empty state. Errors: the file exists but cannot be
    /// read or is not a state (the agent refuses to start rather than drop every Service).
    pub fn load(path: &Path) -> Result<Self, String> {
        match std::fs::read(path) {
            Ok(bytes) => {
                serde_json::from_slice(&bytes).map_err(|e| format!("{}: not an agent state: {e}", path.display()))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
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
    use super::Version;

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
