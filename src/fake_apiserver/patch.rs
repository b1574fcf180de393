//! PATCH of a Service and of its `status` subresource, applied as a JSON merge patch (RFC 7386).
//!
//! Accepted content types: `application/merge-patch+json`, `application/strategic-merge-patch+json` and
//! `application/apply-patch+yaml` (the body must be JSON; lists are replaced, not merged by key). Other
//! types answer 415. A `metadata.resourceVersion` in the patch that differs from the stored one answers
//! 409 Conflict. On the main resource `status` and `metadata.name/namespace/resourceVersion` are ignored;
//! on `/status` only the patch's `status` is applied. A successful patch emits MODIFIED.

use std::sync::Arc;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use serde_json::{Value, json};

use super::Shared;
use super::http::{bad_request, json_response, not_found, status};

/// JSON merge patch (RFC 7386) of `patch` into `target`.
fn merge(target: &mut Value, patch: &Value) {
    let Some(p) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let t = target.as_object_mut().expect("just made an object");
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// PATCH with a JSON body, applied as a merge patch (merge-patch, strategic-merge-patch and apply-patch
/// content types; an apply body must be JSON here). `status_only` applies just the patch's `status`.
pub(crate) fn patch(
    shared: &Arc<Shared>,
    ns: &str,
    name: &str,
    headers: &HeaderMap,
    body: &Bytes,
    status_only: bool,
) -> Response {
    let ct = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let ct = ct.split(';').next().unwrap_or("").trim();
    if !matches!(
        ct,
        "application/merge-patch+json" | "application/strategic-merge-patch+json" | "application/apply-patch+yaml"
    ) {
        return status(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/merge-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml (got {ct:?})"
            ),
        );
    }
    let Ok(mut p) = serde_json::from_slice::<Value>(body) else {
        return bad_request("the patch body is not valid JSON");
    };
    let mut store = shared.store.lock().expect("store lock");
    let Some(mut obj) = store.get(ns, name).cloned() else {
        return not_found(name);
    };
    let want_rv = p.pointer("/metadata/resourceVersion").and_then(Value::as_str).filter(|s| !s.is_empty());
    if want_rv.is_some_and(|w| Some(w) != obj.pointer("/metadata/resourceVersion").and_then(Value::as_str)) {
        return status(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on services \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
            ),
        );
    }
    if status_only {
        if let Some(st) = p.get("status") {
            merge(&mut obj["status"], st);
        }
    } else if let Some(map) = p.as_object_mut() {
        map.remove("status");
        if let Some(meta) = map.get_mut("metadata").and_then(Value::as_object_mut) {
            for k in ["name", "namespace", "resourceVersion"] {
                meta.remove(k);
            }
        }
        merge(&mut obj, &p);
    }
    store.update(ns, name, |o| *o = obj);
    match store.get(ns, name) {
        Some(obj) => json_response(StatusCode::OK, obj),
        None => not_found(name),
    }
}
