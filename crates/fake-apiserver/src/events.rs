//! The Event store: core/v1 `events` and events.k8s.io/v1 `events` are one collection (as in a real
//! cluster), stored in core/v1 shape and shown through either API with the apiserver's field renames
//! (`involvedObject`↔`regarding`, `message`↔`note`, `reportingComponent`↔`reportingController`,
//! `source`↔`deprecatedSource`, `firstTimestamp`↔`deprecatedFirstTimestamp`,
//! `lastTimestamp`↔`deprecatedLastTimestamp`, `count`↔`deprecatedCount`).
//!
//! Events have their own resourceVersion counter (starting at 1), separate from the global one of the
//! stored resources, and never appear in their watches or histories. There is no watch on events.

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// Which API an event request came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventApi {
    /// core/v1 (`/api/v1/.../events`).
    Core,
    /// events.k8s.io/v1 (`/apis/events.k8s.io/v1/.../events`).
    EventsV1,
}

impl EventApi {
    /// The `apiVersion` of objects in this API: `v1` or `events.k8s.io/v1`.
    pub(crate) fn api_version(self) -> &'static str {
        match self {
            EventApi::Core => "v1",
            EventApi::EventsV1 => "events.k8s.io/v1",
        }
    }
}

/// `(core/v1 name, events.k8s.io/v1 name)` of the renamed top-level fields.
const RENAMES: [(&str, &str); 7] = [
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("reportingComponent", "reportingController"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
];

/// An event as sent through `api`, converted to the stored core/v1 shape (`kind: Event`, `apiVersion: v1`).
pub(crate) fn to_core(api: EventApi, mut obj: Value) -> Value {
    if let Some(map) = obj.as_object_mut() {
        if api == EventApi::EventsV1 {
            for (core, v1) in RENAMES {
                if let Some(v) = map.remove(v1) {
                    map.insert(core.to_string(), v);
                }
            }
        }
        map.insert("kind".into(), json!("Event"));
        map.insert("apiVersion".into(), json!("v1"));
    }
    obj
}

/// A stored (core/v1 shaped) event as shown through `api`, with `kind`/`apiVersion`.
pub(crate) fn from_core(api: EventApi, core: &Value) -> Value {
    let mut obj = core.clone();
    if let Some(map) = obj.as_object_mut() {
        if api == EventApi::EventsV1 {
            for (core, v1) in RENAMES {
                if let Some(v) = map.remove(core) {
                    map.insert(v1.to_string(), v);
                }
            }
        }
        map.insert("apiVersion".into(), json!(api.api_version()));
    }
    obj
}

/// Field labels usable in an events `fieldSelector` (both APIs' spellings), as JSON pointers into the
/// stored core/v1 shape.
pub(crate) fn field_pointer(field: &str) -> Option<&'static str> {
    Some(match field {
        "metadata.name" => "/metadata/name",
        "metadata.namespace" => "/metadata/namespace",
        "reason" => "/reason",
        "type" => "/type",
        "reportingComponent" | "reportingController" => "/reportingComponent",
        "source" => "/source/component",
        f => match f.strip_prefix("involvedObject.").or_else(|| f.strip_prefix("regarding."))? {
            "kind" => "/involvedObject/kind",
            "namespace" => "/involvedObject/namespace",
            "name" => "/involvedObject/name",
            "uid" => "/involvedObject/uid",
            "apiVersion" => "/involvedObject/apiVersion",
            "resourceVersion" => "/involvedObject/resourceVersion",
            "fieldPath" => "/involvedObject/fieldPath",
            _ => return None,
        },
    })
}

/// One stored event: its core/v1 shape, the API it was created through and its creation sequence number.
#[derive(Debug, Clone)]
struct Entry {
    object: Value,
    created_via: EventApi,
    seq: u64,
}

/// Stored events keyed by `(namespace, name)`, with their own resourceVersion counter.
#[derive(Debug)]
pub(crate) struct EventStore {
    items: BTreeMap<(String, String), Entry>,
    rv: u64,
    next_seq: u64,
}

impl Default for EventStore {
    fn default() -> Self {
        EventStore { items: BTreeMap::new(), rv: 1, next_seq: 0 }
    }
}

impl EventStore {
    /// The events resourceVersion counter (starts at 1, +1 per write).
    pub(crate) fn rv(&self) -> u64 {
        self.rv
    }

    /// The stored (core/v1 shaped) event, if any.
    pub(crate) fn get(&self, ns: &str, name: &str) -> Option<&Value> {
        self.items.get(&(ns.to_string(), name.to_string())).map(|e| &e.object)
    }

    /// Stored events in `(namespace, name)` order, restricted to `ns` if given, strictly after the key
    /// `after` if given.
    pub(crate) fn range<'a>(
        &'a self,
        ns: Option<&'a str>,
        after: Option<(String, String)>,
    ) -> impl Iterator<Item = &'a Value> + 'a {
        use std::ops::Bound;
        let lower = after.map_or(Bound::Unbounded, Bound::Excluded);
        self.items
            .range((lower, Bound::Unbounded))
            .filter(move |((n, _), _)| ns.is_none_or(|want| want == n))
            .map(|(_, e)| &e.object)
    }

    /// Store a (core/v1 shaped) event under `(ns, name)` (its metadata must already carry them), setting
    /// `metadata.resourceVersion` to the next events rv. A new key records `created_via` and the creation
    /// order; an existing key keeps both. Returns the stored object.
    pub(crate) fn put(&mut self, ns: &str, name: &str, mut object: Value, created_via: EventApi) -> Value {
        self.rv += 1;
        if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("resourceVersion".into(), json!(self.rv.to_string()));
        }
        let key = (ns.to_string(), name.to_string());
        let (created_via, seq) = match self.items.get(&key) {
            Some(e) => (e.created_via, e.seq),
            None => {
                self.next_seq += 1;
                (created_via, self.next_seq)
            }
        };
        self.items.insert(key, Entry { object: object.clone(), created_via, seq });
        object
    }

    /// Remove an event; returns its last state (with a new resourceVersion), or `None` if absent.
    pub(crate) fn remove(&mut self, ns: &str, name: &str) -> Option<Value> {
        let mut e = self.items.remove(&(ns.to_string(), name.to_string()))?;
        self.rv += 1;
        if let Some(meta) = e.object.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("resourceVersion".into(), json!(self.rv.to_string()));
        }
        Some(e.object)
    }

    /// Every stored event in creation order, each shown through the API it was created through.
    pub(crate) fn all(&self) -> Vec<Value> {
        let mut entries: Vec<&Entry> = self.items.values().collect();
        entries.sort_by_key(|e| e.seq);
        entries.into_iter().map(|e| from_core(e.created_via, &e.object)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversion_round_trips_and_renames() {
        let v1 = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e"},
                        "regarding": {"kind": "Service", "name": "web"}, "note": "hi", "reportingController": "c",
                        "deprecatedCount": 2, "action": "Sync", "series": {"count": 2}});
        let core = to_core(EventApi::EventsV1, v1.clone());
        assert_eq!(core["involvedObject"]["name"], "web");
        assert_eq!((core["message"].as_str(), core["reportingComponent"].as_str()), (Some("hi"), Some("c")));
        assert_eq!((core["count"].as_i64(), core["apiVersion"].as_str()), (Some(2), Some("v1")));
        assert_eq!(from_core(EventApi::EventsV1, &core), v1);
        assert_eq!(field_pointer("regarding.name"), field_pointer("involvedObject.name"));
        assert_eq!(field_pointer("involvedObject.bogus"), None);
    }

    #[test]
    fn creation_order_and_own_counter() {
        let mut s = EventStore::default();
        let ev = |n: &str| json!({"kind": "Event", "apiVersion": "v1", "metadata": {"name": n, "namespace": "a"}});
        s.put("a", "z", ev("z"), EventApi::EventsV1);
        s.put("a", "b", ev("b"), EventApi::Core);
        s.put("a", "z", ev("z"), EventApi::Core);
        let all = s.all();
        assert_eq!(all[0]["metadata"]["name"], "z");
        assert_eq!(all[0]["apiVersion"], "events.k8s.io/v1", "keeps the API it was created through");
        assert_eq!(all[1]["metadata"]["resourceVersion"], "3");
        assert_eq!(s.rv(), 4);
        assert!(s.remove("a", "b").is_some() && s.get("a", "b").is_none());
    }
}
