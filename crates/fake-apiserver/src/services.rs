//! Writes to core/v1 `services` over HTTP: create (POST), replace (PUT), patch (PATCH), delete (DELETE),
//! on the main resource and on the `status` subresource, with the apiserver's rules:
//!
//! - create: name from `metadata.name` or `metadata.generateName` + 5 random characters (neither: 422);
//!   namespace from the URL (a different one in the body: 400); an existing name: 409 `AlreadyExists`;
//!   a fresh uid, `creationTimestamp` and resourceVersion; `status` reset to `{"loadBalancer":{}}`;
//!   a given `resourceVersion`/`deletionTimestamp` is dropped. Answers 201 with the object.
//! - every write drops empty `metadata` collections (`finalizers: []`, `labels: {}`, …), as the
//!   apiserver's storage does.
//! - replace / patch: a `metadata.resourceVersion` in the new object that differs from the stored one
//!   answers 409 `Conflict`, as does a different `metadata.uid`; name/namespace must match the URL (400);
//!   `kind` must be `Service` (400). On the main resource `status` is kept; on `/status` only `status`
//!   changes. uid, `creationTimestamp`, `deletionTimestamp` and `deletionGracePeriodSeconds` can't be
//!   changed. A write that changes nothing keeps the resourceVersion and emits no event.
//! - finalizers: on an object with a `deletionTimestamp`, adding a finalizer not already present answers
//!   422 `Invalid`; a write leaving it with no finalizers deletes it (DELETED).
//! - delete: with finalizers the object only gets `deletionTimestamp`/`deletionGracePeriodSeconds: 0`
//!   (MODIFIED) and stays; otherwise it is removed (DELETED). Answers 200 with the object. A JSON
//!   `DeleteOptions` body may carry `preconditions` (`uid`, `resourceVersion`; mismatch: 409);
//!   `propagationPolicy` and `gracePeriodSeconds` are ignored.
//!
//! `dryRun=All` runs every check and answers as usual without storing anything.

use std::sync::Arc;

use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::{Value, json};

use super::Shared;
use super::errors::{ApiError, json_response};
use super::http::Params;
use super::meta::{finalizers, generate_name, is_terminating, meta_mut, meta_str, new_uid, now_rfc3339};
use super::patch::{PatchKind, patched};
use super::state::Store;

const RESOURCE: &str = "services";
/// Fields of `metadata` that only the server sets.
const SYSTEM_FIELDS: [&str; 4] = ["uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds"];

/// Drop empty `metadata` collections, as the apiserver's storage does (`omitempty`): a client never
/// reads back `finalizers: []` or `labels: {}`.
fn drop_empty_meta(obj: &mut Value) {
    let meta = meta_mut(obj);
    for field in ["finalizers", "labels", "annotations", "ownerReferences", "managedFields"] {
        let empty = match meta.get(field) {
            Some(Value::Array(a)) => a.is_empty(),
            Some(Value::Object(m)) => m.is_empty(),
            Some(Value::Null) => true,
            _ => false,
        };
        if empty {
            meta.remove(field);
        }
    }
}

fn respond(code: StatusCode, result: Result<Value, ApiError>) -> Response {
    match result {
        Ok(obj) => json_response(code, &obj),
        Err(e) => e.response(),
    }
}

fn dry_run(params: &Params) -> bool {
    params.get("dryRun").is_some_and(|v| !v.is_empty())
}

fn parse_body(body: &[u8]) -> Result<Value, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))?;
    if !v.is_object() {
        return Err(ApiError::bad_request("the request body must be a JSON object"));
    }
    match (v.get("kind").and_then(Value::as_str), v.get("apiVersion").and_then(Value::as_str)) {
        (None | Some("" | "Service"), None | Some("" | "v1")) => Ok(v),
        (k, a) => Err(ApiError::bad_request(format!(
            "the API version in the data ({}) does not match the expected API version (v1), or the kind ({}) is not Service",
            a.unwrap_or(""),
            k.unwrap_or("")
        ))),
    }
}

/// `POST /api/v1/namespaces/{ns}/services`.
pub(crate) fn create(shared: &Arc<Shared>, ns: &str, params: &Params, body: &[u8]) -> Response {
    let result = parse_body(body).and_then(|mut obj| {
        let meta = meta_mut(&mut obj);
        match meta.get("namespace").and_then(Value::as_str) {
            Some(given) if !given.is_empty() && given != ns => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            _ => meta.insert("namespace".into(), json!(ns)),
        };
        for f in ["resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds"] {
            meta.remove(f);
        }
        meta.insert("uid".into(), json!(new_uid()));
        meta.insert("creationTimestamp".into(), json!(now_rfc3339()));
        obj["status"] = json!({ "loadBalancer": {} });
        drop_empty_meta(&mut obj);
        let mut store = shared.store.lock().expect("store lock");
        let given = meta_str(&obj, "name").map(str::to_string);
        let name = match (given, meta_str(&obj, "generateName").map(str::to_string)) {
            (Some(n), _) => n,
            (None, Some(prefix)) => {
                let mut name = generate_name(&prefix);
                while store.get(ns, &name).is_some() {
                    name = generate_name(&prefix);
                }
                meta_mut(&mut obj).insert("name".into(), json!(name));
                name
            }
            (None, None) => {
                return Err(ApiError::invalid(
                    "Service",
                    "",
                    "metadata.name",
                    "FieldValueRequired",
                    "Required value: name or generateName is required",
                ));
            }
        };
        if store.get(ns, &name).is_some() {
            return Err(ApiError::already_exists(RESOURCE, &name));
        }
        if dry_run(params) {
            return Ok(obj);
        }
        Ok(store.commit(obj).object)
    });
    respond(StatusCode::CREATED, result)
}

/// `PUT /api/v1/namespaces/{ns}/services/{name}[/status]`: replace with the body.
pub(crate) fn replace(
    shared: &Arc<Shared>,
    ns: &str,
    name: &str,
    params: &Params,
    body: &[u8],
    status_only: bool,
) -> Response {
    let result = parse_body(body).and_then(|new| {
        let mut store = shared.store.lock().expect("store lock");
        let current = store.get(ns, name).cloned().ok_or_else(|| ApiError::not_found(RESOURCE, name))?;
        write(&mut store, &current, new, status_only, dry_run(params))
    });
    respond(StatusCode::OK, result)
}

/// `PATCH /api/v1/namespaces/{ns}/services/{name}[/status]` (see [`super::patch`] for the formats).
pub(crate) fn patch(
    shared: &Arc<Shared>,
    ns: &str,
    name: &str,
    params: &Params,
    headers: &HeaderMap,
    body: &[u8],
    status_only: bool,
) -> Response {
    let result = PatchKind::from_headers(headers).and_then(|kind| {
        let mut store = shared.store.lock().expect("store lock");
        let current = store.get(ns, name).cloned().ok_or_else(|| ApiError::not_found(RESOURCE, name))?;
        let new = patched(kind, &current, body)?;
        if !new.is_object() {
            return Err(ApiError::bad_request("the patched object is not a JSON object"));
        }
        write(&mut store, &current, new, status_only, dry_run(params))
    });
    respond(StatusCode::OK, result)
}

/// Check and store `new` as the next state of `current` (see the module docs); returns the object as
/// stored (or as deleted, when the write removed the last finalizer of a terminating object).
fn write(store: &mut Store, current: &Value, mut new: Value, status_only: bool, dry: bool) -> Result<Value, ApiError> {
    let (ns, name) = (meta_str(current, "namespace").unwrap_or(""), meta_str(current, "name").unwrap_or(""));
    for (field, want) in [("name", name), ("namespace", ns)] {
        if meta_str(&new, field).is_some_and(|got| got != want) {
            return Err(ApiError::bad_request(format!(
                "the {field} of the object ({}) does not match the {field} on the URL ({want})",
                meta_str(&new, field).unwrap_or("")
            )));
        }
    }
    if let Some(k) = new.get("kind").and_then(Value::as_str).filter(|k| *k != "Service") {
        return Err(ApiError::bad_request(format!("kind {k:?} does not match the URL (Service)")));
    }
    let (cur_uid, cur_rv) =
        (meta_str(current, "uid").unwrap_or(""), meta_str(current, "resourceVersion").unwrap_or(""));
    if let Some(uid) = meta_str(&new, "uid").filter(|u| *u != cur_uid) {
        let why = format!("Precondition failed: UID in precondition: {uid}, UID in object meta: {cur_uid}");
        return Err(ApiError::conflict(RESOURCE, name, &why));
    }
    if meta_str(&new, "resourceVersion").is_some_and(|rv| rv != cur_rv) {
        return Err(ApiError::stale(RESOURCE, name));
    }
    let mut next = if status_only {
        let mut next = current.clone();
        match new.get("status") {
            Some(st) => next["status"] = st.clone(),
            None => drop(next.as_object_mut().map(|m| m.remove("status"))),
        }
        next
    } else {
        match current.get("status") {
            Some(st) => new["status"] = st.clone(),
            None => drop(new.as_object_mut().map(|m| m.remove("status"))),
        }
        new
    };
    let meta = meta_mut(&mut next);
    for field in SYSTEM_FIELDS {
        match current.pointer(&format!("/metadata/{field}")) {
            Some(v) => meta.insert(field.to_string(), v.clone()),
            None => meta.remove(field),
        };
    }
    meta.insert("name".into(), json!(name));
    meta.insert("namespace".into(), json!(ns));
    meta.insert("resourceVersion".into(), json!(cur_rv));
    drop_empty_meta(&mut next);
    if let Some(m) = next.as_object_mut() {
        m.entry("kind").or_insert_with(|| json!("Service"));
        m.entry("apiVersion").or_insert_with(|| json!("v1"));
    }
    if is_terminating(current) {
        let old = finalizers(current);
        let added: Vec<String> = finalizers(&next).into_iter().filter(|f| !old.contains(f)).collect();
        if !added.is_empty() {
            let detail = format!(
                "Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{{{}}}",
                added.iter().map(|f| format!("{f:?}")).collect::<Vec<_>>().join(", ")
            );
            return Err(ApiError::invalid("Service", name, "metadata.finalizers", "FieldValueForbidden", &detail));
        }
    }
    if next == *current || dry {
        return Ok(next);
    }
    Ok(store.commit(next).object)
}

/// `DELETE /api/v1/namespaces/{ns}/services/{name}` (body: optional JSON `DeleteOptions`).
pub(crate) fn delete(shared: &Arc<Shared>, ns: &str, name: &str, params: &Params, body: &[u8]) -> Response {
    let options: Value = if body.iter().all(u8::is_ascii_whitespace) {
        json!({})
    } else {
        match serde_json::from_slice(body) {
            Ok(v) => v,
            Err(e) => {
                return ApiError::bad_request(format!("the DeleteOptions body is not valid JSON: {e}")).response();
            }
        }
    };
    let mut store = shared.store.lock().expect("store lock");
    let Some(current) = store.get(ns, name).cloned() else {
        return ApiError::not_found(RESOURCE, name).response();
    };
    for (field, label) in [("uid", "UID"), ("resourceVersion", "ResourceVersion")] {
        let want = options.pointer(&format!("/preconditions/{field}")).and_then(Value::as_str);
        let have = meta_str(&current, field).unwrap_or("");
        if let Some(want) = want.filter(|w| *w != have) {
            let why = format!("Precondition failed: {label} in precondition: {want}, {label} in object meta: {have}");
            return ApiError::conflict(RESOURCE, name, &why).response();
        }
    }
    if dry_run(params) {
        return json_response(StatusCode::OK, &current);
    }
    match store.delete(ns, name) {
        Some(done) => json_response(StatusCode::OK, &done.object),
        None => ApiError::not_found(RESOURCE, name).response(),
    }
}
