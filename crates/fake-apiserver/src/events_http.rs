//! HTTP handlers for `events` through core/v1 (`/api/v1/[namespaces/{ns}/]events[/{name}]`) and
//! events.k8s.io/v1 (`/apis/events.k8s.io/v1/[namespaces/{ns}/]events[/{name}]`), over the one
//! [`EventStore`](super::events::EventStore):
//!
//! - list (`GET` collection): `labelSelector`, `fieldSelector` (see [`field_pointer`]), `limit`/`continue`;
//!   `watch` is not supported (400).
//! - create (`POST`): name from `metadata.name` or `generateName` (+ 5 random characters; neither: 422),
//!   namespace from the URL (a different one in the body: 400), existing name: 409 `AlreadyExists`;
//!   assigns uid, `creationTimestamp` and an events resourceVersion. Answers 201. No other validation.
//! - `GET`, `PUT` (a differing `resourceVersion`: 409), `PATCH` (all formats of [`super::patch`], applied to
//!   the object as that API shows it; this is how kube-runtime's `Recorder` updates an event series) and
//!   `DELETE` (200 with the object) of one event.

use std::sync::Arc;

use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::{Value, json};

use super::Shared;
use super::errors::{ApiError, json_response};
use super::events::{EventApi, field_pointer, from_core, to_core};
use super::http::Params;
use super::list::{list_response, page, paging};
use super::meta::{generate_name, meta_mut, meta_str, new_uid, now_rfc3339};
use super::patch::{PatchKind, patched};
use super::selector::{FieldSelector, LabelSelector, Matcher};

const RESOURCE: &str = "events";

fn respond(code: StatusCode, api: EventApi, result: Result<Value, ApiError>) -> Response {
    match result {
        Ok(core) => json_response(code, &from_core(api, &core)),
        Err(e) => e.response(),
    }
}

/// `GET` of an events collection (`ns: None` = all namespaces).
pub(crate) fn list(shared: &Arc<Shared>, api: EventApi, ns: Option<&str>, params: &Params) -> Response {
    if params.flag("watch") {
        return ApiError::bad_request("the fake apiserver does not support watching events").response();
    }
    let matcher = LabelSelector::parse(params.get("labelSelector").unwrap_or("")).and_then(|labels| {
        let fields = FieldSelector::parse_with(params.get("fieldSelector").unwrap_or(""), field_pointer)?;
        Ok(Matcher { namespace: ns.map(str::to_string), labels, fields })
    });
    let matcher = match matcher {
        Ok(m) => m,
        Err(e) => return ApiError::bad_request(e).response(),
    };
    let (limit, token) = match paging(shared, params) {
        Ok(p) => p,
        Err(e) => return e.response(),
    };
    let store = shared.events.lock().expect("events lock");
    let (rv, after) = match token {
        Some((rv, ns, name)) => (rv, Some((ns, name))),
        None => (store.rv(), None),
    };
    let (items, next) = page(store.range(ns, after), &matcher, limit, rv, |o| from_core(api, o));
    list_response("EventList", api.api_version(), rv, items, next)
}

/// Parse a request body as an event of `api`; errors: 400 for non-JSON, non-objects, another kind or
/// apiVersion.
fn parse_body(api: EventApi, body: &[u8]) -> Result<Value, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))?;
    if !v.is_object() {
        return Err(ApiError::bad_request("the request body must be a JSON object"));
    }
    let kind = v.get("kind").and_then(Value::as_str).unwrap_or("");
    let version = v.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    if !matches!(kind, "" | "Event") || !(version.is_empty() || version == api.api_version()) {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({version}) does not match the expected API version ({}), or the kind ({kind}) is not Event",
            api.api_version()
        )));
    }
    Ok(v)
}

/// `POST` of an event into namespace `ns`.
pub(crate) fn create(shared: &Arc<Shared>, api: EventApi, ns: &str, body: &[u8]) -> Response {
    let result = parse_body(api, body).and_then(|obj| {
        let mut obj = to_core(api, obj);
        let meta = meta_mut(&mut obj);
        match meta.get("namespace").and_then(Value::as_str) {
            Some(given) if !given.is_empty() && given != ns => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            _ => meta.insert("namespace".into(), json!(ns)),
        };
        meta.insert("uid".into(), json!(new_uid()));
        meta.insert("creationTimestamp".into(), json!(now_rfc3339()));
        let mut store = shared.events.lock().expect("events lock");
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
                let detail = "Required value: name or generateName is required";
                return Err(ApiError::invalid("Event", "", "metadata.name", "FieldValueRequired", detail));
            }
        };
        if store.get(ns, &name).is_some() {
            return Err(ApiError::already_exists(RESOURCE, &name));
        }
        Ok(store.put(ns, &name, obj, api))
    });
    respond(StatusCode::CREATED, api, result)
}

/// `GET` of one event.
pub(crate) fn get(shared: &Arc<Shared>, api: EventApi, ns: &str, name: &str) -> Response {
    let store = shared.events.lock().expect("events lock");
    respond(StatusCode::OK, api, store.get(ns, name).cloned().ok_or_else(|| ApiError::not_found(RESOURCE, name)))
}

/// `PUT` (`patch: None`, body = the new object) or `PATCH` (`patch: Some(headers)`) of one event.
pub(crate) fn write(
    shared: &Arc<Shared>,
    api: EventApi,
    ns: &str,
    name: &str,
    patch: Option<&HeaderMap>,
    body: &[u8],
) -> Response {
    let mut store = shared.events.lock().expect("events lock");
    let result = store.get(ns, name).cloned().ok_or_else(|| ApiError::not_found(RESOURCE, name)).and_then(|current| {
        let new = match patch {
            Some(headers) => patched(PatchKind::from_headers(headers)?, &from_core(api, &current), body)?,
            None => parse_body(api, body)?,
        };
        if !new.is_object() {
            return Err(ApiError::bad_request("the patched object is not a JSON object"));
        }
        for (field, want) in [("name", name), ("namespace", ns)] {
            if meta_str(&new, field).is_some_and(|got| got != want) {
                let msg = format!("the {field} of the object does not match the {field} on the URL ({want})");
                return Err(ApiError::bad_request(msg));
            }
        }
        if meta_str(&new, "resourceVersion").is_some_and(|rv| Some(rv) != meta_str(&current, "resourceVersion")) {
            return Err(ApiError::stale(RESOURCE, name));
        }
        let mut next = to_core(api, new);
        let meta = meta_mut(&mut next);
        meta.insert("name".into(), json!(name));
        meta.insert("namespace".into(), json!(ns));
        for field in ["uid", "creationTimestamp"] {
            if let Some(v) = current.pointer(&format!("/metadata/{field}")) {
                meta.insert(field.to_string(), v.clone());
            }
        }
        Ok(store.put(ns, name, next, api))
    });
    respond(StatusCode::OK, api, result)
}

/// `DELETE` of one event: 200 with its last state.
pub(crate) fn delete(shared: &Arc<Shared>, api: EventApi, ns: &str, name: &str) -> Response {
    let mut store = shared.events.lock().expect("events lock");
    respond(StatusCode::OK, api, store.remove(ns, name).ok_or_else(|| ApiError::not_found(RESOURCE, name)))
}
