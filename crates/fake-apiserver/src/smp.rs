//! Strategic merge patch (`application/strategic-merge-patch+json`), the subset kubectl produces for the
//! stored kinds: a JSON merge patch, except that the lists the Kubernetes schema marks
//! `patchStrategy: merge` are merged instead of replaced, and the directives `$patch`
//! (`replace`/`delete`/`merge`, on maps and list elements), `$retainKeys`, `$setElementOrder/<list>` and
//! `$deleteFromPrimitiveList/<list>` are obeyed. Directive keys never end up in the stored object.
//!
//! Merged lists, by the patched object's `kind`: every kind: `metadata.finalizers` (a set),
//! `metadata.ownerReferences` (by `uid`); Service: `spec.ports` (by `port`), `status.conditions` (by
//! `type`); Node: `spec.podCIDRs` (a set), `status.addresses` and `status.conditions` (by `type`).
//! Every other list is replaced, as the real schema does for atomic lists — among them a Node's
//! `spec.taints` (what `kubectl taint` relies on: it sends the whole new list) and an EndpointSlice's
//! `endpoints` and `ports`.

use serde_json::{Map, Value, json};

/// How a list at some path is patched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ListKind {
    /// Atomic: the patch's list replaces the stored one.
    Replace,
    /// A set of scalars: the patch's values are added (no duplicates).
    Set,
    /// A list of objects merged by this key.
    Keyed(&'static str),
}

/// The patch strategy of the list at `path` (map keys from the root; list elements add no segment) in an
/// object of kind `kind`.
fn list_kind(kind: &str, path: &[String]) -> ListKind {
    let path: Vec<&str> = path.iter().map(String::as_str).collect();
    match (kind, &path[..]) {
        (_, ["metadata", "finalizers"]) => ListKind::Set,
        (_, ["metadata", "ownerReferences"]) => ListKind::Keyed("uid"),
        ("Service", ["spec", "ports"]) => ListKind::Keyed("port"),
        ("Service" | "Node", ["status", "conditions"]) => ListKind::Keyed("type"),
        ("Node", ["status", "addresses"]) => ListKind::Keyed("type"),
        ("Node", ["spec", "podCIDRs"]) => ListKind::Set,
        _ => ListKind::Replace,
    }
}

/// Where the merge stands: the kind of the patched object (it picks the list strategies) and the path of
/// map keys from the root.
struct Cursor {
    kind: String,
    path: Vec<String>,
}

impl Cursor {
    fn list_kind(&self) -> ListKind {
        list_kind(&self.kind, &self.path)
    }
}

/// Apply strategic merge patch `patch` (a JSON object) to `target`, with the list strategies of
/// `target`'s `kind`. Errors: the patch is not an object, or uses an unknown `$patch` directive.
pub(crate) fn apply(target: &mut Value, patch: &Value) -> Result<(), String> {
    let p = patch.as_object().ok_or_else(|| "a strategic merge patch must be a JSON object".to_string())?;
    if p.get("$patch").and_then(Value::as_str) == Some("delete") {
        return Err("a strategic merge patch cannot delete the whole object".into());
    }
    let kind = target.get("kind").and_then(Value::as_str).unwrap_or("").to_string();
    merge_map(target, p, &mut Cursor { kind, path: Vec::new() })
}

fn merge_map(target: &mut Value, patch: &Map<String, Value>, at: &mut Cursor) -> Result<(), String> {
    match patch.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            *target = strip(&Value::Object(patch.clone()));
            return Ok(());
        }
        None | Some("merge") => {}
        Some(other) => return Err(format!("unknown patch type: {other:?} in map")),
    }
    if !target.is_object() {
        *target = json!({});
    }
    let t = target.as_object_mut().expect("just made an object");
    for (k, v) in patch {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(list)), Some(gone)) = (t.get_mut(field), v.as_array()) {
                list.retain(|x| !gone.contains(x));
            }
            continue;
        }
        if k.starts_with('$') {
            continue;
        }
        at.path.push(k.clone());
        match v {
            Value::Null => {
                t.remove(k);
            }
            Value::Object(pm) if pm.get("$patch").and_then(Value::as_str) == Some("delete") => {
                t.remove(k);
            }
            Value::Object(pm) => merge_map(t.entry(k.clone()).or_insert(Value::Null), pm, at)?,
            Value::Array(pl) => merge_list(t.entry(k.clone()).or_insert(Value::Null), pl, at)?,
            other => {
                t.insert(k.clone(), other.clone());
            }
        }
        at.path.pop();
    }
    for (k, order) in patch {
        if let (Some(field), Some(order)) = (k.strip_prefix("$setElementOrder/"), order.as_array()) {
            at.path.push(field.to_string());
            let kind = at.list_kind();
            at.path.pop();
            if let Some(Value::Array(list)) = t.get_mut(field) {
                reorder(list, order, kind);
            }
        }
    }
    if let Some(keep) = patch.get("$retainKeys").and_then(Value::as_array) {
        t.retain(|k, _| keep.iter().any(|x| x.as_str() == Some(k)));
    }
    Ok(())
}

fn is_directive(v: &Value, which: &str) -> bool {
    v.get("$patch").and_then(Value::as_str) == Some(which)
}

fn merge_list(target: &mut Value, patch: &[Value], at: &mut Cursor) -> Result<(), String> {
    let kind = at.list_kind();
    if patch.iter().any(|e| is_directive(e, "replace")) {
        *target = Value::Array(patch.iter().filter(|e| !is_directive(e, "replace")).map(strip).collect());
        return Ok(());
    }
    if kind == ListKind::Replace || !target.is_array() {
        *target = Value::Array(patch.iter().filter(|e| !is_directive(e, "delete")).map(strip).collect());
        return Ok(());
    }
    let list = target.as_array_mut().expect("checked above");
    for pe in patch {
        match kind {
            ListKind::Keyed(key) if pe.is_object() => {
                let id = pe.get(key);
                if is_directive(pe, "delete") {
                    list.retain(|e| id.is_none() || e.get(key) != id);
                    continue;
                }
                let found = id.and_then(|id| list.iter_mut().find(|e| e.get(key) == Some(id)));
                match (found, pe.as_object()) {
                    (Some(existing), Some(pm)) => merge_map(existing, pm, at)?,
                    _ => list.push(strip(pe)),
                }
            }
            _ => {
                if !list.contains(pe) {
                    list.push(strip(pe));
                }
            }
        }
    }
    Ok(())
}

/// Order `list` as `order` says (elements identified by the merge key, or by value); elements not named
/// in `order` keep their relative order after the named ones.
fn reorder(list: &mut [Value], order: &[Value], kind: ListKind) {
    let position = |e: &Value| {
        order.iter().position(|o| match kind {
            ListKind::Keyed(key) => o.get(key).is_some() && o.get(key) == e.get(key),
            _ => o == e,
        })
    };
    list.sort_by_key(|e| position(e).unwrap_or(usize::MAX));
}

/// A copy of `v` without directive keys (`$…`) and directive-only list elements.
fn strip(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            Value::Object(m.iter().filter(|(k, _)| !k.starts_with('$')).map(|(k, v)| (k.clone(), strip(v))).collect())
        }
        Value::Array(a) => Value::Array(
            a.iter().filter(|e| !is_directive(e, "replace") && !is_directive(e, "delete")).map(strip).collect(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(mut doc: Value, patch: Value) -> Value {
        apply(&mut doc, &patch).unwrap();
        doc
    }

    #[test]
    fn maps_merge_and_null_deletes() {
        let doc = json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"type": "ClusterIP"}});
        let out =
            run(doc, json!({"metadata": {"labels": {"a": null, "c": "3"}}, "spec": {"$patch": "replace", "x": 1}}));
        assert_eq!(out, json!({"metadata": {"labels": {"b": "2", "c": "3"}}, "spec": {"x": 1}}));
    }

    #[test]
    fn kubectl_apply_style_port_patch() {
        let doc = json!({"kind": "Service", "spec": {"ports": [{"port": 80, "protocol": "TCP", "nodePort": 30080},
                                            {"port": 443, "protocol": "TCP"}],
                                  "externalIPs": ["1.1.1.1", "2.2.2.2"]}});
        let patch = json!({"spec": {"$setElementOrder/ports": [{"port": 443}, {"port": 80}],
                                    "ports": [{"port": 80, "targetPort": 8080}, {"port": 8443, "$patch": "delete"}],
                                    "externalIPs": ["3.3.3.3"]}});
        let out = run(doc, patch);
        assert_eq!(
            out["spec"]["ports"],
            json!([{"port": 443, "protocol": "TCP"},
                                                {"port": 80, "protocol": "TCP", "nodePort": 30080, "targetPort": 8080}])
        );
        assert_eq!(out["spec"]["externalIPs"], json!(["3.3.3.3"]));
    }

    #[test]
    fn node_lists_by_kind() {
        let taint = |k: &str| json!({"key": k, "effect": "NoSchedule"});
        let node = json!({"kind": "Node",
            "spec": {"taints": [taint("a")], "podCIDRs": ["10.0.0.0/24"]},
            "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"},
                                     {"type": "Hostname", "address": "w1"}],
                       "conditions": [{"type": "Ready", "status": "True"}]}});
        let out = run(
            node.clone(),
            json!({"spec": {"taints": [taint("b")], "podCIDRs": ["fd00::/64"]},
            "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.2"}],
                       "conditions": [{"type": "Ready", "status": "False"}]}}),
        );
        assert_eq!(out["spec"]["taints"], json!([taint("b")]), "taints are atomic");
        assert_eq!(out["spec"]["podCIDRs"], json!(["10.0.0.0/24", "fd00::/64"]));
        assert_eq!(
            out["status"]["addresses"],
            json!([{"type": "InternalIP", "address": "10.0.0.2"}, {"type": "Hostname", "address": "w1"}])
        );
        assert_eq!(out["status"]["conditions"], json!([{"type": "Ready", "status": "False"}]));
        // The same paths in a kind without merge lists are replaced.
        let slice = json!({"kind": "EndpointSlice", "ports": [{"port": 80}], "spec": {"ports": [{"port": 1, "x": 1}]}});
        let out = run(slice, json!({"ports": [{"port": 81}], "spec": {"ports": [{"port": 1}]}}));
        assert_eq!((&out["ports"], &out["spec"]["ports"]), (&json!([{"port": 81}]), &json!([{"port": 1}])));
    }

    #[test]
    fn finalizers_are_a_set() {
        let doc = json!({"metadata": {"finalizers": ["a", "b"]}});
        let out = run(doc.clone(), json!({"metadata": {"finalizers": ["b", "c"]}}));
        assert_eq!(out["metadata"]["finalizers"], json!(["a", "b", "c"]));
        let out = run(doc.clone(), json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}));
        assert_eq!(out["metadata"]["finalizers"], json!(["b"]));
        let out = run(doc, json!({"metadata": {"finalizers": [{"$patch": "replace"}]}}));
        assert_eq!(out["metadata"]["finalizers"], json!([]));
        let mut bad = json!({});
        assert!(apply(&mut bad, &json!({"spec": {"$patch": "frob"}})).is_err());
        assert!(apply(&mut bad, &json!([1])).is_err());
    }
}
