//! The fake apiserver's object store: one collection per [`Resource`] keyed by `(namespace, name)`
//! (namespace `""` for Nodes), ONE global resourceVersion counter across all of them (like etcd's
//! revision), one bounded event history shared by all resources (each entry names its resource; a watch
//! filters its own), and the registry of open watch subscriptions.
//!
//! Everything here lives behind one `std::sync::Mutex` (see [`SharedStore`]); no `.await` happens while it
//! is held. Taking the watch snapshot and registering the subscriber happen under that one lock
//! ([`Store::subscribe`]), so no write can fall between them.
//!
//! Finalizers: [`Store::delete`] of an object with finalizers only marks it terminating
//! (`deletionTimestamp`), and [`Store::commit`] turns a write that leaves a terminating object without
//! finalizers into its removal. Admission checks of HTTP writes live in `objects.rs`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value, json};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use super::meta::{finalizers, is_terminating, meta_mut, new_uid, now_rfc3339};
use super::resource::Resource;

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
    /// The collection the object belongs to.
    pub resource: Resource,
    /// resourceVersion of the write (for a synthetic ADDED: the object's own resourceVersion).
    pub rv: u64,
    pub kind: EventType,
    /// The object after the write, with `kind`/`apiVersion`; for DELETED its last state carrying the
    /// deletion's resourceVersion.
    pub object: Arc<Value>,
    /// For MODIFIED: the state before the write (used to turn selector transitions into ADDED/DELETED).
    pub prev: Option<Arc<Value>>,
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

/// A successful subscription: what to send first, where the stream stands, and the live channel. The
/// replayed history and the live channel carry every resource's changes (the watch keeps its own and
/// advances its resourceVersion past the others); a snapshot holds only the watched resource's objects.
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
    /// The object as stored, or its last state when removed (shared with the store and its history).
    pub object: Arc<Value>,
}

/// `(namespace, name)`; namespace `""` for cluster-scoped objects.
type Key = (String, String);

/// The object store. See the module docs.
pub(crate) struct Store {
    /// One collection per resource, indexed by [`Resource::index`]. Shared with the history entries and
    /// watch snapshots: a write copies nothing it does not change.
    objects: [BTreeMap<Key, Arc<Value>>; Resource::ALL.len()],
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
            objects: Default::default(),
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

    /// Create or replace an object of `res` through the Rust API (no admission checks); returns the new
    /// resourceVersion. uid and creationTimestamp are kept from the stored object when `obj` lacks them
    /// (fresh ones on create); see [`Store::commit`] for terminating objects. Panics if `obj` is not a
    /// JSON object, has no non-empty string `metadata.name`, or has a `kind` other than `res`'s.
    pub(crate) fn apply(&mut self, res: Resource, mut obj: Value) -> u64 {
        let kind = obj.get("kind").and_then(Value::as_str).unwrap_or(res.kind());
        assert_eq!(kind, res.kind(), "an object of kind {kind:?} cannot be stored as {}", res.plural());
        let (ns, name) = res.normalise(&mut obj);
        assert!(!name.is_empty(), "a {} needs a non-empty string metadata.name", res.kind());
        // Only the two kept fields of the stored object are read: cloning it whole would be most of
        // the cost of an update in the benchmarks that drive this server.
        let kept = self
            .get(res, &ns, &name)
            .map(|p| (p.pointer("/metadata/uid").cloned(), p.pointer("/metadata/creationTimestamp").cloned()));
        let meta = meta_mut(&mut obj);
        let keep = |meta: &mut Map<String, Value>, field: &str, fallback: Option<Value>| {
            let absent = meta.get(field).is_none_or(|v| v.is_null() || v == "");
            if let (true, Some(v)) = (absent, fallback) {
                meta.insert(field.to_string(), v);
            }
        };
        match kept {
            Some((uid, created)) => {
                keep(meta, "uid", uid);
                keep(meta, "creationTimestamp", created);
            }
            None => {
                keep(meta, "uid", Some(Value::String(new_uid())));
                keep(meta, "creationTimestamp", Some(Value::String(now_rfc3339())));
            }
        }
        self.commit(res, obj).rv
    }

    /// Store a normalised object (key from its metadata) as a create or replace, bumping the global
    /// resourceVersion and emitting ADDED or MODIFIED. When the stored object is terminating (has a
    /// `deletionTimestamp`), its `deletionTimestamp` and `deletionGracePeriodSeconds` are carried over,
    /// and if the new state has no finalizers the object is removed instead: DELETED with the stored state
    /// at the new resourceVersion (as the real apiserver's delete-during-update does).
    pub(crate) fn commit(&mut self, res: Resource, mut obj: Value) -> Committed {
        let key = res.normalise(&mut obj);
        if let Some(p) = self.get(res, &key.0, &key.1).filter(|p| is_terminating(p)) {
            let meta = meta_mut(&mut obj);
            for field in ["deletionTimestamp", "deletionGracePeriodSeconds"] {
                match p.pointer(&format!("/metadata/{field}")) {
                    Some(v) => meta.insert(field.to_string(), v.clone()),
                    None => meta.remove(field),
                };
            }
            if finalizers(&obj).is_empty() {
                return self.remove(res, &key.0, &key.1).expect("stored object exists");
            }
        }
        self.rv += 1;
        let rv = self.rv;
        meta_mut(&mut obj).insert("resourceVersion".into(), Value::String(rv.to_string()));
        let obj = Arc::new(obj);
        // The replaced object becomes the event's `prev` as it is, without a copy.
        let prev = self.objects[res.index()].insert(key, obj.clone());
        let kind = if prev.is_some() { EventType::Modified } else { EventType::Added };
        self.push(HistEntry { resource: res, rv, kind, object: obj.clone(), prev });
        Committed { rv, object: obj }
    }

    /// Modify a stored object with `f` and store it as a replace through [`Store::apply`] (name and
    /// namespace are forced back to the key; `f` changing `kind` panics there). `None` if absent.
    pub(crate) fn update(&mut self, res: Resource, ns: &str, name: &str, f: impl FnOnce(&mut Value)) -> Option<u64> {
        let ns = res.key_ns(ns);
        let mut obj = self.get(res, ns, name)?.clone();
        f(&mut obj);
        res.set_key(&mut obj, ns, name);
        Some(self.apply(res, obj))
    }

    /// Delete an object honouring finalizers: with a non-empty `metadata.finalizers` the object only
    /// gets `deletionTimestamp` (now) and `deletionGracePeriodSeconds: 0` (MODIFIED; nothing changes if
    /// it is already terminating); otherwise it is removed (DELETED). `None` if absent.
    pub(crate) fn delete(&mut self, res: Resource, ns: &str, name: &str) -> Option<Committed> {
        let obj = self.get(res, ns, name)?.clone();
        if finalizers(&obj).is_empty() {
            return self.remove(res, ns, name);
        }
        if is_terminating(&obj) {
            let rv = obj.pointer("/metadata/resourceVersion").and_then(Value::as_str).and_then(|s| s.parse().ok());
            return Some(Committed { rv: rv.unwrap_or(self.rv), object: Arc::new(obj) });
        }
        let mut next = obj;
        let meta = meta_mut(&mut next);
        meta.insert("deletionTimestamp".into(), Value::String(now_rfc3339()));
        meta.insert("deletionGracePeriodSeconds".into(), json!(0));
        Some(self.commit(res, next))
    }

    /// Remove an object regardless of finalizers (DELETED carries its last state with the deletion's
    /// rv). `None` if absent.
    pub(crate) fn remove(&mut self, res: Resource, ns: &str, name: &str) -> Option<Committed> {
        let key = (res.key_ns(ns).to_string(), name.to_string());
        let mut obj = Arc::unwrap_or_clone(self.objects[res.index()].remove(&key)?);
        self.rv += 1;
        let rv = self.rv;
        meta_mut(&mut obj).insert("resourceVersion".into(), Value::String(rv.to_string()));
        let obj = Arc::new(obj);
        self.push(HistEntry { resource: res, rv, kind: EventType::Deleted, object: obj.clone(), prev: None });
        Some(Committed { rv, object: obj })
    }

    /// One stored object (with `kind`/`apiVersion`); `ns` is ignored for cluster-scoped resources.
    pub(crate) fn get(&self, res: Resource, ns: &str, name: &str) -> Option<&Value> {
        self.objects[res.index()].get(&(res.key_ns(ns).to_string(), name.to_string())).map(Arc::as_ref)
    }

    /// Stored objects of `res` in `(namespace, name)` order whose key is strictly after `after` (if
    /// given), restricted to namespace `ns` (if given).
    pub(crate) fn objects_after<'a>(
        &'a self,
        res: Resource,
        ns: Option<&'a str>,
        after: Option<Key>,
    ) -> impl Iterator<Item = &'a Value> + 'a {
        use std::ops::Bound;
        let lower = match after {
            Some(k) => Bound::Excluded(k),
            None => Bound::Unbounded,
        };
        self.objects[res.index()]
            .range((lower, Bound::Unbounded))
            .filter(move |((n, _), _)| ns.is_none_or(|want| want == n))
            .map(|(_, v)| v.as_ref())
    }

    /// All stored objects of `res` in `(namespace, name)` order.
    pub(crate) fn all(&self, res: Resource) -> Vec<Value> {
        self.objects[res.index()].values().map(|v| v.as_ref().clone()).collect()
    }

    /// Drop all history: a watch from any rv older than the current one gets the in-band 410.
    pub(crate) fn compact(&mut self) {
        self.history.clear();
        self.floor = self.rv;
    }

    /// Take the watch snapshot of `res` (or the history replay) and register a subscriber, under this
    /// one lock. Errors: `from` is older than the retained history (of all resources).
    pub(crate) fn subscribe(&mut self, res: Resource, from: StartFrom) -> Result<Subscription, TooOld> {
        let initial: VecDeque<Arc<HistEntry>> = match from {
            StartFrom::Snapshot => self.objects[res.index()]
                .values()
                .map(|o| {
                    let rv = o
                        .pointer("/metadata/resourceVersion")
                        .and_then(Value::as_str)
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(self.rv);
                    Arc::new(HistEntry { resource: res, rv, kind: EventType::Added, object: o.clone(), prev: None })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_bound_moves_floor() {
        let mut s = Store::new(2);
        for i in 0..5 {
            s.apply(Resource::Services, json!({"metadata": {"name": format!("s{i}")}}));
        }
        assert_eq!(s.rv(), 6);
        assert!(s.subscribe(Resource::Services, StartFrom::After(3)).is_err());
        let sub = s.subscribe(Resource::Services, StartFrom::After(4)).expect("4 is resumable");
        assert_eq!(sub.initial.len(), 2);
    }

    #[test]
    fn one_counter_and_history_for_all_resources() {
        let mut s = Store::new(100);
        s.apply(Resource::Services, json!({"metadata": {"name": "web"}}));
        let node_rv = s.apply(Resource::Nodes, json!({"metadata": {"name": "w1", "namespace": "x"}}));
        s.apply(Resource::EndpointSlices, json!({"metadata": {"name": "web-1", "namespace": "shop"}}));
        assert_eq!((node_rv, s.rv()), (3, 4));
        let node = s.get(Resource::Nodes, "ignored", "w1").expect("cluster-scoped key ignores ns");
        assert!(node["metadata"].get("namespace").is_none() && node["kind"] == "Node");
        assert!(s.get(Resource::Services, "default", "w1").is_none());
        let snapshot = s.subscribe(Resource::EndpointSlices, StartFrom::Snapshot).unwrap();
        assert_eq!(snapshot.initial.len(), 1);
        let replay = s.subscribe(Resource::Nodes, StartFrom::After(1)).unwrap();
        let kinds: Vec<Resource> = replay.initial.iter().map(|e| e.resource).collect();
        assert_eq!(kinds, [Resource::Services, Resource::Nodes, Resource::EndpointSlices]);
        assert_eq!(s.delete(Resource::Nodes, "", "w1").map(|c| c.rv), Some(5));
        assert!(s.all(Resource::Nodes).is_empty() && s.all(Resource::Services).len() == 1);
    }
}
