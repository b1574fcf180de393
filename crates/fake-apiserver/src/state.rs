//! The fake apiserver's object store: Services keyed by `(namespace, name)`, the global resourceVersion
//! counter, the bounded event history and the registry of open watch subscriptions.
//!
//! Everything here lives behind one `std::sync::Mutex` (see [`SharedStore`]); no `.await` happens while it
//! is held. Taking the watch snapshot and registering the subscriber happen under that one lock
//! ([`Store::subscribe`]), so no write can fall between them.
//!
//! Finalizers: [`Store::delete`] of an object with finalizers only marks it terminating
//! (`deletionTimestamp`), and [`Store::commit`] turns a write that leaves a terminating object without
//! finalizers into its removal. Admission checks of HTTP writes live in `services.rs`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value, json};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use super::meta::{finalizers, is_terminating, meta_mut, new_uid, normalise_with, now_rfc3339};

/// The store as shared between the server handle, the HTTP handlers, the watch tasks and [`super::Faults`].
pub(crate) type SharedStore = Arc<Mutex<Store>>;

/// Kind of a stored change, as written in the watch line's `type` field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    /// The wire name: `ADDED`, `MODIFIED` or `DELETED`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change in the history (or a synthetic ADDED of a watch's initial snapshot).
#[derive(Debug)]
pub(crate) struct HistEntry {
    /// resourceVersion of the write (for a synthetic ADDED: the object's own resourceVersion).
    pub rv: u64,
    pub kind: EventType,
    /// The object after the write, with `kind`/`apiVersion`; for DELETED its last state carrying the
    /// deletion's resourceVersion.
    pub object: Value,
    /// For MODIFIED: the state before the write (used to turn selector transitions into ADDED/DELETED).
    pub prev: Option<Value>,
}

/// A message to one open watch stream. Events and fault instructions share one ordered channel, so a
/// fault applies exactly after the events broadcast before it.
#[derive(Debug)]
pub(crate) enum WatchMsg {
    /// A change to deliver (after selector filtering).
    Event(Arc<HistEntry>),
    /// Send an in-band 410 ERROR line, then end the stream. `current` is the global rv at that time.
    Gone { current: u64 },
    /// Write the next event line only half, then cut the connection.
    CutNext,
    /// Replace the next event line with a malformed one.
    CorruptNext,
    /// Write a non-JSON line now.
    Garbage,
    /// Send a BOOKMARK now (if the watch asked for bookmarks).
    Bookmark,
}

/// Where a new watch starts.
#[derive(Debug, Clone, Copy)]
pub(crate) enum StartFrom {
    /// No resourceVersion (or `"0"`): synthetic ADDED for every current object first.
    Snapshot,
    /// Replay history after this resourceVersion.
    After(u64),
}

/// A successful subscription: what to send first, where the stream stands, and the live channel.
pub(crate) struct Subscription {
    pub id: u64,
    pub initial: VecDeque<Arc<HistEntry>>,
    /// Global resourceVersion at subscription time: everything up to it is covered by `initial`.
    pub rv: u64,
    pub rx: UnboundedReceiver<WatchMsg>,
}

/// A watch from a resourceVersion older than the retained history: `(requested, oldest resumable)`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TooOld {
    pub requested: u64,
    pub oldest: u64,
}

/// The outcome of a write: the new global resourceVersion and the object as stored, or, when the write
/// removed it, its last state as carried by the DELETED event.
#[derive(Debug, Clone)]
pub(crate) struct Committed {
    /// The global resourceVersion after the write (for an already terminating delete: the object's).
    pub rv: u64,
    /// The object as stored, or its last state when removed.
    pub object: Value,
}

/// The object store. See the module docs.
pub(crate) struct Store {
    objects: BTreeMap<(String, String), Value>,
    rv: u64,
    history: VecDeque<Arc<HistEntry>>,
    history_limit: usize,
    /// A watch from rv `N` can be served iff `N >= floor` (all changes after `floor` are in `history`).
    floor: u64,
    watchers: HashMap<u64, UnboundedSender<WatchMsg>>,
    next_watcher: u64,
}

impl Store {
    /// An empty store whose global resourceVersion starts at 1; `history_limit` entries are retained
    /// (at least 1).
    pub(crate) fn new(history_limit: usize) -> Store {
        Store {
            objects: BTreeMap::new(),
            rv: 1,
            history: VecDeque::new(),
            history_limit: history_limit.max(1),
            floor: 1,
            watchers: HashMap::new(),
            next_watcher: 0,
        }
    }

    /// Current global resourceVersion.
    pub(crate) fn rv(&self) -> u64 {
        self.rv
    }

    /// Set the history bound (entries beyond it are dropped oldest first; at least 1).
    pub(crate) fn set_history_limit(&mut self, limit: usize) {
        self.history_limit = limit.max(1);
        self.trim();
    }

    /// Create or replace a Service through the Rust API (no admission checks); returns the new
    /// resourceVersion. Panics if `obj` is not a JSON object or has no non-empty string `metadata.name`.
    /// uid and creationTimestamp are kept from the stored object when `obj` lacks them (fresh ones on
    /// create); see [`Store::commit`] for terminating objects.
    pub(crate) fn apply(&mut self, mut obj: Value) -> u64 {
        let (ns, name) = normalise(&mut obj);
        assert!(!name.is_empty(), "a Service needs a non-empty string metadata.name");
        let prev = self.objects.get(&(ns, name)).cloned();
        let meta = meta_mut(&mut obj);
        let keep = |meta: &mut Map<String, Value>, field: &str, fallback: Option<Value>| {
            let absent = meta.get(field).is_none_or(|v| v.is_null() || v == "");
            if let (true, Some(v)) = (absent, fallback) {
                meta.insert(field.to_string(), v);
            }
        };
        match &prev {
            Some(p) => {
                keep(meta, "uid", p.pointer("/metadata/uid").cloned());
                keep(meta, "creationTimestamp", p.pointer("/metadata/creationTimestamp").cloned());
            }
            None => {
                keep(meta, "uid", Some(Value::String(new_uid())));
                keep(meta, "creationTimestamp", Some(Value::String(now_rfc3339())));
            }
        }
        self.commit(obj).rv
    }

    /// Store a normalised object (key from its metadata) as a create or replace, bumping the global
    /// resourceVersion and emitting ADDED or MODIFIED. When the stored object is terminating (has a
    /// `deletionTimestamp`), its `deletionTimestamp` and `deletionGracePeriodSeconds` are carried over,
    /// and if the new state has no finalizers the object is removed instead: DELETED with the stored state
    /// at the new resourceVersion (as the real apiserver's delete-during-update does).
    pub(crate) fn commit(&mut self, mut obj: Value) -> Committed {
        let (ns, name) = normalise(&mut obj);
        let key = (ns, name);
        let prev = self.objects.get(&key).cloned();
        if let Some(p) = prev.as_ref().filter(|p| is_terminating(p)) {
            let meta = meta_mut(&mut obj);
            for field in ["deletionTimestamp", "deletionGracePeriodSeconds"] {
                match p.pointer(&format!("/metadata/{field}")) {
                    Some(v) => meta.insert(field.to_string(), v.clone()),
                    None => meta.remove(field),
                };
            }
            if finalizers(&obj).is_empty() {
                return self.remove(&key.0, &key.1).expect("stored object exists");
            }
        }
        self.rv += 1;
        let rv = self.rv;
        meta_mut(&mut obj).insert("resourceVersion".into(), Value::String(rv.to_string()));
        self.objects.insert(key, obj.clone());
        let kind = if prev.is_some() { EventType::Modified } else { EventType::Added };
        self.push(HistEntry { rv, kind, object: obj.clone(), prev });
        Committed { rv, object: obj }
    }

    /// Modify a stored Service with `f` and store it as a replace (name and namespace are forced back to
    /// the key). `None` if absent.
    pub(crate) fn update(&mut self, ns: &str, name: &str, f: impl FnOnce(&mut Value)) -> Option<u64> {
        let mut obj = self.objects.get(&(ns.to_string(), name.to_string()))?.clone();
        f(&mut obj);
        let meta = meta_mut(&mut obj);
        meta.insert("namespace".into(), Value::String(ns.to_string()));
        meta.insert("name".into(), Value::String(name.to_string()));
        Some(self.apply(obj))
    }

    /// Delete a Service honouring finalizers: with a non-empty `metadata.finalizers` the object only
    /// gets `deletionTimestamp` (now) and `deletionGracePeriodSeconds: 0` (MODIFIED; nothing changes if
    /// it is already terminating); otherwise it is removed (DELETED). `None` if absent.
    pub(crate) fn delete(&mut self, ns: &str, name: &str) -> Option<Committed> {
        let obj = self.objects.get(&(ns.to_string(), name.to_string()))?.clone();
        if finalizers(&obj).is_empty() {
            return self.remove(ns, name);
        }
        if is_terminating(&obj) {
            let rv = obj.pointer("/metadata/resourceVersion").and_then(Value::as_str).and_then(|s| s.parse().ok());
            return Some(Committed { rv: rv.unwrap_or(self.rv), object: obj });
        }
        let mut next = obj;
        let meta = meta_mut(&mut next);
        meta.insert("deletionTimestamp".into(), Value::String(now_rfc3339()));
        meta.insert("deletionGracePeriodSeconds".into(), json!(0));
        Some(self.commit(next))
    }

    /// Remove a Service regardless of finalizers (DELETED carries its last state with the deletion's
    /// rv). `None` if absent.
    pub(crate) fn remove(&mut self, ns: &str, name: &str) -> Option<Committed> {
        let mut obj = self.objects.remove(&(ns.to_string(), name.to_string()))?;
        self.rv += 1;
        let rv = self.rv;
        meta_mut(&mut obj).insert("resourceVersion".into(), Value::String(rv.to_string()));
        self.push(HistEntry { rv, kind: EventType::Deleted, object: obj.clone(), prev: None });
        Some(Committed { rv, object: obj })
    }

    /// One stored Service (with `kind`/`apiVersion`).
    pub(crate) fn get(&self, ns: &str, name: &str) -> Option<&Value> {
        self.objects.get(&(ns.to_string(), name.to_string()))
    }

    /// Stored Services in `(namespace, name)` order whose key is strictly after `after` (if given),
    /// restricted to namespace `ns` (if given).
    pub(crate) fn objects_after<'a>(
        &'a self,
        ns: Option<&'a str>,
        after: Option<(String, String)>,
    ) -> impl Iterator<Item = &'a Value> + 'a {
        use std::ops::Bound;
        let lower = match after {
            Some(k) => Bound::Excluded(k),
            None => Bound::Unbounded,
        };
        self.objects
            .range((lower, Bound::Unbounded))
            .filter(move |((n, _), _)| ns.is_none_or(|want| want == n))
            .map(|(_, v)| v)
    }

    /// All stored Services in `(namespace, name)` order.
    pub(crate) fn all(&self) -> Vec<Value> {
        self.objects.values().cloned().collect()
    }

    /// Drop all history: a watch from any rv older than the current one gets the in-band 410.
    pub(crate) fn compact(&mut self) {
        self.history.clear();
        self.floor = self.rv;
    }

    /// Take the watch snapshot (or history replay) and register a subscriber, under this one lock.
    pub(crate) fn subscribe(&mut self, from: StartFrom) -> Result<Subscription, TooOld> {
        let initial: VecDeque<Arc<HistEntry>> = match from {
            StartFrom::Snapshot => self
                .objects
                .values()
                .map(|o| {
                    let rv = o
                        .pointer("/metadata/resourceVersion")
                        .and_then(Value::as_str)
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(self.rv);
                    Arc::new(HistEntry { rv, kind: EventType::Added, object: o.clone(), prev: None })
                })
                .collect(),
            StartFrom::After(n) if n < self.floor => {
                return Err(TooOld { requested: n, oldest: self.floor });
            }
            StartFrom::After(n) => self.history.iter().filter(|e| e.rv > n).cloned().collect(),
        };
        let (tx, rx) = unbounded_channel();
        let id = self.next_watcher;
        self.next_watcher += 1;
        self.watchers.insert(id, tx);
        Ok(Subscription { id, initial, rv: self.rv, rx })
    }

    /// Forget a subscriber (its stream ended).
    pub(crate) fn unsubscribe(&mut self, id: u64) {
        self.watchers.remove(&id);
    }

    /// Number of registered watch streams.
    pub(crate) fn watcher_count(&self) -> usize {
        self.watchers.len()
    }

    /// Send a message (made fresh per watcher) to every open watch, dropping closed ones.
    pub(crate) fn broadcast(&mut self, msg: impl Fn(u64) -> WatchMsg) {
        let rv = self.rv;
        self.watchers.retain(|_, tx| tx.send(msg(rv)).is_ok());
    }

    fn push(&mut self, entry: HistEntry) {
        let entry = Arc::new(entry);
        self.history.push_back(entry.clone());
        self.trim();
        self.broadcast(|_| WatchMsg::Event(entry.clone()));
    }

    fn trim(&mut self) {
        while self.history.len() > self.history_limit {
            if let Some(old) = self.history.pop_front() {
                self.floor = old.rv;
            }
        }
    }
}

/// Fill in `kind: Service`, `apiVersion: v1`, `metadata.namespace` (default `"default"`) and return the
/// key (name `""` if missing). Panics if `obj` is not a JSON object.
fn normalise(obj: &mut Value) -> (String, String) {
    normalise_with(obj, "Service", "v1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_bound_moves_floor() {
        let mut s = Store::new(2);
        for i in 0..5 {
            s.apply(json!({"metadata": {"name": format!("s{i}")}}));
        }
        assert_eq!(s.rv(), 6);
        assert!(s.subscribe(StartFrom::After(3)).is_err());
        let sub = s.subscribe(StartFrom::After(4)).expect("4 is resumable");
        assert_eq!(sub.initial.len(), 2);
    }
}
