//! Reads and writes of one stored object over HTTP, the same code for every [`Resource`]: create (POST),
//! get (GET), replace (PUT), patch (PATCH), delete (DELETE), on the main resource and on the `status`
//! subresource (Services and Nodes), with the apiserver's rules:
//!
//! - create: name from `metadata.name` or `metadata.generateName` + 5 random characters (neither: 422);
//!   namespace from the URL (a different one in the body: 400; a cluster-scoped Node's is dropped); an
//!   existing name: 409 `AlreadyExists`; a fresh uid, `creationTimestamp` and resourceVersion; a
//!   Service's `status` reset to `{"loadBalancer":{}}` (a Node keeps the `status` it is created with, as
//!   kubelet registers nodes); a given `resourceVersion`/`deletionTimestamp` is dropped. Answers 201.
//! - every body (and every patched object) must have this resource's `kind`/`apiVersion` or none (400);
//!   per-kind validation in [`Resource::validate`] (an EndpointSlice's `addressType`: 422).
//! - every write drops empty `metadata` collections (`finalizers: []`, `labels: {}`, …), as the
//!   apiserver's storage does.
//! - replace / patch: a `metadata.resourceVersion` in the new object that differs from the stored one
//!   answers 409 `Conflict`, as does a different `metadata.uid`; name/namespace must match the URL (400).
//!   With a `status` subresource, a main-resource write keeps `status` and a `/status` write changes only
//!   `status`. uid, `creationTimestamp`, `deletionTimestamp` and `deletionGracePeriodSeconds` can't be
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
use super::resource::Resource;
use super::state::Store;

/// Fields of `metadata` that only the server sets.
const SYSTEM_FIELDS: [&str; 4] = ["uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds"];

/// One object named by a URL: `/{prefix}/[namespaces/{ns}/]{plural}/{name}[/status]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Target<'a> {
    pub res: Resource,
    /// The namespace (`""` for a cluster-scoped resource).
    pub ns: &'a str,
    pub name: &'a str,
    /// The `status` subresource rather than the main resource.
    pub status: bool,
}

impl Target<'_> {
    fn not_found(&self) -> ApiError {
        ApiError::not_found(self.res.qualified(), self.name)
    }

    fn current(&self, store: &Store) -> Result<Value, ApiError> {
        store.get(self.res, self.ns, self.name).cloned().ok_or_else(|| self.not_found())
    }
}

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

/// A request body as an object of `res`. Errors: 400 for non-JSON, non-objects, another kind/apiVersion.
fn parse_body(res: Resource, body: &[u8]) -> Result<Value, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))?;
    if !v.is_object() {
        return Err(ApiError::bad_request("the request body must be a JSON object"));
    }
    res.check_type(&v)?;
    Ok(v)
}

/// `GET` of one object (also through `/status`), as a Table when the client asks for one.
pub(crate) fn get(shared: &Arc<Shared>, target: &Target, headers: &HeaderMap) -> Response {
    let store = shared.store.lock().expect("store lock");
    match store.get(target.res, target.ns, target.name) {
        Some(obj) if super::table::wanted(headers) => {
            json_response(StatusCode::OK, &super::table::of(target.res, std::slice::from_ref(obj), store.rv()))
        }
        Some(obj) if super::partial::wanted(headers) => json_response(StatusCode::OK, &super::partial::of(obj)),
        Some(obj) => json_response(StatusCode::OK, obj),
        None => target.not_found().response(),
    }
}

/// `POST` to a collection: create in namespace `ns` (`""` for a cluster-scoped resource).
pub(crate) fn create(shared: &Arc<Shared>, res: Resource, ns: &str, params: &Params, body: &[u8]) -> Response {
    let result = parse_body(res, body).and_then(|mut obj| {
        match meta_str(&obj, "namespace") {
            Some(given) if res.namespaced() && given != ns => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            _ => {}
        }
        let meta = meta_mut(&mut obj);
        for f in ["resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds"] {
            meta.remove(f);
        }
        meta.insert("uid".into(), json!(new_uid()));
        meta.insert("creationTimestamp".into(), json!(now_rfc3339()));
        if let Some(status) = res.create_status() {
            obj["status"] = status;
        }
        drop_empty_meta(&mut obj);
        let mut store = shared.store.lock().expect("store lock");
        let name = create_name(&store, res, ns, &obj)?;
        res.set_key(&mut obj, ns, &name);
        res.normalise(&mut obj);
        res.validate(&obj, None)?;
        if store.get(res, ns, &name).is_some() {
            return Err(ApiError::already_exists(res.qualified(), &name));
        }
        if dry_run(params) {
            return Ok(obj);
        }
        Ok(Arc::unwrap_or_clone(store.commit(res, obj).object))
    });
    respond(StatusCode::CREATED, result)
}

/// The name of a new object: `metadata.name`, or `metadata.generateName` plus 5 random characters not
/// yet taken in `ns`. Errors: 422 when neither is given.
fn create_name(store: &Store, res: Resource, ns: &str, obj: &Value) -> Result<String, ApiError> {
    if let Some(name) = meta_str(obj, "name") {
        return Ok(name.to_string());
    }
    let Some(prefix) = meta_str(obj, "generateName") else {
        let detail = "Required value: name or generateName is required";
        return Err(ApiError::invalid(res.qualified_kind(), "", "metadata.name", "FieldValueRequired", detail));
    };
    let mut name = generate_name(prefix);
    while store.get(res, ns, &name).is_some() {
        name = generate_name(prefix);
    }
    Ok(name)
}

/// `PUT` of an object or its `/status`: replace with the body.
pub(crate) fn replace(shared: &Arc<Shared>, target: &Target, params: &Params, body: &[u8]) -> Response {
    let result = parse_body(target.res, body).and_then(|new| {
        let mut store = shared.store.lock().expect("store lock");
        let current = target.current(&store)?;
        write(&mut store, target, &current, new, dry_run(params))
    });
    respond(StatusCode::OK, result)
}

/// `PATCH` of an object or its `/status` (see [`super::patch`] for the formats).
pub(crate) fn patch(
    shared: &Arc<Shared>,
    target: &Target,
    params: &Params,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    let result = PatchKind::from_headers(headers).and_then(|kind| {
        let mut store = shared.store.lock().expect("store lock");
        let current = target.current(&store)?;
        let new = patched(kind, &current, body)?;
        if !new.is_object() {
            return Err(ApiError::bad_request("the patched object is not a JSON object"));
        }
        target.res.check_type(&new)?;
        write(&mut store, target, &current, new, dry_run(params))
    });
    let metadata_only = super::partial::wanted(headers);
    respond(StatusCode::OK, result.map(|obj| if metadata_only { super::partial::of(&obj) } else { obj }))
}

/// Check and store `new` as the next state of `current` (see the module docs); returns the object as
/// stored (or as deleted, when the write removed the last finalizer of a terminating object).
fn write(store: &mut Store, target: &Target, current: &Value, new: Value, dry: bool) -> Result<Value, ApiError> {
    let res = target.res;
    check_preconditions(target, current, &new)?;
    let mut next = merge_status(target, current, new);
    let meta = meta_mut(&mut next);
    for field in SYSTEM_FIELDS {
        match current.pointer(&format!("/metadata/{field}")) {
            Some(v) => meta.insert(field.to_string(), v.clone()),
            None => meta.remove(field),
        };
    }
    meta.insert("resourceVersion".into(), json!(meta_str(current, "resourceVersion").unwrap_or("")));
    res.set_key(&mut next, target.ns, target.name);
    drop_empty_meta(&mut next);
    res.normalise(&mut next);
    res.validate(&next, Some(current))?;
    check_finalizers(target, current, &next)?;
    if next == *current || dry {
        return Ok(next);
    }
    Ok(Arc::unwrap_or_clone(store.commit(res, next).object))
}

/// The URL's name and namespace (400 on a mismatch; a cluster-scoped object's namespace is ignored), and
/// the uid and resourceVersion preconditions a new object carries (409).
fn check_preconditions(target: &Target, current: &Value, new: &Value) -> Result<(), ApiError> {
    let (res, name) = (target.res, target.name);
    let scoped = [("name", name, true), ("namespace", target.ns, res.namespaced())];
    for (field, want, _) in scoped.into_iter().filter(|(_, _, checked)| *checked) {
        if let Some(got) = meta_str(new, field).filter(|got| *got != want) {
            return Err(ApiError::bad_request(format!(
                "the {field} of the object ({got}) does not match the {field} on the URL ({want})"
            )));
        }
    }
    let (cur_uid, cur_rv) =
        (meta_str(current, "uid").unwrap_or(""), meta_str(current, "resourceVersion").unwrap_or(""));
    if let Some(uid) = meta_str(new, "uid").filter(|u| *u != cur_uid) {
        let why = format!("Precondition failed: UID in precondition: {uid}, UID in object meta: {cur_uid}");
        return Err(ApiError::conflict(res.qualified(), name, &why));
    }
    if meta_str(new, "resourceVersion").is_some_and(|rv| rv != cur_rv) {
        return Err(ApiError::stale(res.qualified(), name));
    }
    Ok(())
}

/// With a `status` subresource: a main-resource write keeps the stored `status`, a `/status` write takes
/// only `status` from `new`. Without one, `new` as it is.
fn merge_status(target: &Target, current: &Value, new: Value) -> Value {
    if !target.res.has_status() {
        return new;
    }
    let (mut next, status) = if target.status {
        (current.clone(), new.get("status").cloned())
    } else {
        (new, current.get("status").cloned())
    };
    if let Some(map) = next.as_object_mut() {
        match status {
            Some(st) => map.insert("status".into(), st),
            None => map.remove("status"),
        };
    }
    next
}

/// On a terminating object, no finalizer may be added (422 `Invalid`).
fn check_finalizers(target: &Target, current: &Value, next: &Value) -> Result<(), ApiError> {
    if !is_terminating(current) {
        return Ok(());
    }
    let old = finalizers(current);
    let added: Vec<String> = finalizers(next).into_iter().filter(|f| !old.contains(f)).collect();
    if added.is_empty() {
        return Ok(());
    }
    let detail = format!(
        "Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{{{}}}",
        added.iter().map(|f| format!("{f:?}")).collect::<Vec<_>>().join(", ")
    );
    let kind = target.res.qualified_kind();
    Err(ApiError::invalid(kind, target.name, "metadata.finalizers", "FieldValueForbidden", &detail))
}

/// `DELETE` of one object (body: optional JSON `DeleteOptions`).
pub(crate) fn delete(shared: &Arc<Shared>, target: &Target, params: &Params, body: &[u8]) -> Response {
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
    let current = match target.current(&store) {
        Ok(c) => c,
        Err(e) => return e.response(),
    };
    for (field, label) in [("uid", "UID"), ("resourceVersion", "ResourceVersion")] {
        let want = options.pointer(&format!("/preconditions/{field}")).and_then(Value::as_str);
        let have = meta_str(&current, field).unwrap_or("");
        if let Some(want) = want.filter(|w| *w != have) {
            let why = format!("Precondition failed: {label} in precondition: {want}, {label} in object meta: {have}");
            return ApiError::conflict(target.res.qualified(), target.name, &why).response();
        }
    }
    if dry_run(params) {
        return json_response(StatusCode::OK, &current);
    }
    match store.delete(target.res, target.ns, target.name) {
        Some(done) => json_response(StatusCode::OK, &done.object),
        None => target.not_found().response(),
    }
}
