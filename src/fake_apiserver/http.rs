//! HTTP routes of the fake apiserver: discovery for kubectl, list / get / watch of `services` (core v1),
//! merge-style PATCH of a Service and its `status` subresource, and `Status` error bodies.
//!
//! Routing is done by hand on the path segments behind one axum fallback handler, so every request (also
//! unknown paths) is recorded and subject to [`super::Faults::fail_requests`].

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::discovery::{api_versions, resource_list, version};
use super::patch::patch;
use super::selector::{FieldSelector, LabelSelector, Matcher};
use super::state::StartFrom;
use super::watch::{self, WatchSpec};
use super::{RecordedRequest, Shared};

/// The service for one server: a single fallback handler over shared state.
pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new().fallback(handle).with_state(shared)
}

/// A `Status` error response: `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
/// "message":…,"reason":…,"code":…}` with the same HTTP status code.
pub(crate) fn status(code: u16, reason: &str, message: impl Into<String>) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message.into(), "reason": reason, "code": code,
    });
    json_response(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), &body)
}

/// A JSON body with `Content-Type: application/json`.
pub(crate) fn json_response(code: StatusCode, body: &Value) -> Response {
    (code, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

/// A 400 `Status` with reason `BadRequest`.
pub(crate) fn bad_request(message: impl Into<String>) -> Response {
    status(400, "BadRequest", message)
}

/// Decoded query pairs. Empty pairs (`?&limit=500`) are skipped; `+` means space; `%XX` is decoded.
#[derive(Debug, Default)]
pub(crate) struct Params(Vec<(String, String)>);

impl Params {
    /// Parse a raw query string (without the `?`).
    pub(crate) fn parse(raw: &str) -> Params {
        let pairs = raw.split('&').filter(|p| !p.is_empty()).map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        });
        Params(pairs.collect())
    }

    /// The last value given for `key`.
    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.0.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true" | "1" | "t" | "T" | "TRUE" | "True"))
    }

    fn number(&self, key: &str) -> Result<Option<u64>, String> {
        match self.get(key).filter(|v| !v.is_empty()) {
            None => Ok(None),
            Some(v) => v.parse().map(Some).map_err(|_| format!("invalid {key}: {v:?}")),
        }
    }
}

fn decode(s: &str) -> String {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h << 4 | l);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What a path names.
enum Route<'a> {
    Version,
    Api,
    Apis,
    ApiV1,
    Collection { ns: Option<&'a str>, watch: bool },
    Item { ns: &'a str, name: &'a str, watch: bool },
    Status { ns: &'a str, name: &'a str },
}

fn route<'a>(segs: &[&'a str]) -> Option<Route<'a>> {
    Some(match segs {
        ["version"] => Route::Version,
        ["api"] => Route::Api,
        ["apis"] => Route::Apis,
        ["api", "v1"] => Route::ApiV1,
        ["api", "v1", "services"] => Route::Collection { ns: None, watch: false },
        ["api", "v1", "namespaces", ns, "services"] => Route::Collection { ns: Some(ns), watch: false },
        ["api", "v1", "namespaces", ns, "services", name] => Route::Item { ns, name, watch: false },
        ["api", "v1", "namespaces", ns, "services", name, "status"] => Route::Status { ns, name },
        ["api", "v1", "watch", "services"] => Route::Collection { ns: None, watch: true },
        ["api", "v1", "watch", "namespaces", ns, "services"] => Route::Collection { ns: Some(ns), watch: true },
        ["api", "v1", "watch", "namespaces", ns, "services", name] => Route::Item { ns, name, watch: true },
        _ => return None,
    })
}

async fn handle(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    shared.record(RecordedRequest { method: method.to_string(), path: path.clone(), query: query.clone() });
    if shared.faults.take_failure() {
        return status(
            500,
            "InternalError",
            "an error on the server (fault injected) has prevented the request from succeeding",
        );
    }
    let params = Params::parse(&query);
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let Some(route) = route(&segs) else {
        return status(404, "NotFound", "the server could not find the requested resource");
    };
    let headers = req.headers().clone();
    match (method, route) {
        (Method::GET, Route::Version) => json_response(StatusCode::OK, &version()),
        (Method::GET, Route::Api) => json_response(StatusCode::OK, &api_versions(&shared)),
        (Method::GET, Route::Apis) => {
            json_response(StatusCode::OK, &json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": []}))
        }
        (Method::GET, Route::ApiV1) => json_response(StatusCode::OK, &resource_list()),
        (Method::GET, Route::Collection { ns, watch }) => collection(&shared, ns, None, watch, &params),
        (Method::GET, Route::Item { ns, name, watch }) if watch || params.flag("watch") => {
            collection(&shared, Some(ns), Some(name), true, &params)
        }
        (Method::GET, Route::Item { ns, name, .. } | Route::Status { ns, name }) => {
            match shared.store.lock().expect("store lock").get(ns, name) {
                Some(obj) => json_response(StatusCode::OK, obj),
                None => not_found(name),
            }
        }
        (Method::PATCH, Route::Item { ns, name, watch: false }) => {
            let body = axum::body::to_bytes(req.into_body(), 16 << 20).await.unwrap_or_default();
            patch(&shared, ns, name, &headers, &body, false)
        }
        (Method::PATCH, Route::Status { ns, name }) => {
            let body = axum::body::to_bytes(req.into_body(), 16 << 20).await.unwrap_or_default();
            patch(&shared, ns, name, &headers, &body, true)
        }
        (m, _) => status(
            405,
            "MethodNotAllowed",
            format!("the server does not allow this method on the requested resource: {m}"),
        ),
    }
}

/// A 404 `Status` for the Service `name`.
pub(crate) fn not_found(name: &str) -> Response {
    status(404, "NotFound", format!("services \"{name}\" not found"))
}

/// List or watch a collection (`name` narrows a watch to one object, as the named watch paths do).
fn collection(shared: &Arc<Shared>, ns: Option<&str>, name: Option<&str>, watch: bool, params: &Params) -> Response {
    let labels = match LabelSelector::parse(params.get("labelSelector").unwrap_or("")) {
        Ok(l) => l,
        Err(e) => return bad_request(e),
    };
    let mut fields_raw = params.get("fieldSelector").unwrap_or("").to_string();
    if let Some(name) = name {
        fields_raw = format!("{fields_raw},metadata.name={name}");
    }
    let fields = match FieldSelector::parse(&fields_raw) {
        Ok(f) => f,
        Err(e) => return bad_request(e),
    };
    let matcher = Matcher { namespace: ns.map(str::to_string), labels, fields };
    if watch || params.flag("watch") { watch_request(shared, matcher, params) } else { list(shared, &matcher, params) }
}

fn watch_request(shared: &Arc<Shared>, matcher: Matcher, params: &Params) -> Response {
    let initial_events = params.flag("sendInitialEvents");
    let from = match params.get("resourceVersion") {
        _ if initial_events => StartFrom::Snapshot,
        None | Some("" | "0") => StartFrom::Snapshot,
        Some(rv) => match rv.parse() {
            Ok(n) => StartFrom::After(n),
            Err(_) => return bad_request(format!("resourceVersion: Invalid value: {rv:?}: must be a number")),
        },
    };
    let timeout = match params.number("timeoutSeconds") {
        Ok(t) => t.filter(|&t| t > 0).map(Duration::from_secs),
        Err(e) => return bad_request(e),
    };
    let bookmarks = params.flag("allowWatchBookmarks");
    watch::start(shared, WatchSpec { matcher, from, timeout, bookmarks, initial_events_end: initial_events })
}

/// Continue tokens: hex of `"{snapshot rv}\n{namespace}\n{name}"` (last key served).
fn encode_token(rv: u64, ns: &str, name: &str) -> String {
    format!("{rv}\n{ns}\n{name}").bytes().map(|b| format!("{b:02x}")).collect()
}

fn decode_token(tok: &str) -> Option<(u64, String, String)> {
    if tok.len() % 2 != 0 || !tok.is_ascii() {
        return None;
    }
    let bytes: Option<Vec<u8>> =
        (0..tok.len()).step_by(2).map(|i| u8::from_str_radix(&tok[i..i + 2], 16).ok()).collect();
    let text = String::from_utf8(bytes?).ok()?;
    let mut parts = text.splitn(3, '\n');
    let rv = parts.next()?.parse().ok()?;
    Some((rv, parts.next()?.to_string(), parts.next()?.to_string()))
}

fn list(shared: &Arc<Shared>, matcher: &Matcher, params: &Params) -> Response {
    let limit = match params.number("limit") {
        Ok(l) => l.unwrap_or(0) as usize,
        Err(e) => return bad_request(e),
    };
    let token = match params.get("continue").filter(|c| !c.is_empty()) {
        None => None,
        Some(_) if shared.faults.continue_expired() => {
            return status(
                410,
                "Expired",
                "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
            );
        }
        Some(c) => match decode_token(c) {
            Some(t) => Some(t),
            None => return bad_request(format!("continue key is not valid: {c:?}")),
        },
    };
    let store = shared.store.lock().expect("store lock");
    let (rv, after) = match token {
        Some((rv, ns, name)) => (rv, Some((ns, name))),
        None => (store.rv(), None),
    };
    let mut items = Vec::new();
    let mut next = None;
    let mut last: Option<&Value> = None;
    for obj in store.objects_after(matcher.namespace.as_deref(), after).filter(|o| matcher.matches(o)) {
        if limit > 0 && items.len() == limit {
            let key = |p: &str| last.and_then(|l| l.pointer(p)).and_then(Value::as_str).unwrap_or("").to_string();
            next = Some(encode_token(rv, &key("/metadata/namespace"), &key("/metadata/name")));
            break;
        }
        let mut item = obj.clone();
        if let Some(map) = item.as_object_mut() {
            map.remove("kind");
            map.remove("apiVersion");
        }
        items.push(item);
        last = Some(obj);
    }
    let mut metadata = json!({ "resourceVersion": rv.to_string() });
    if let Some(next) = next {
        metadata["continue"] = Value::String(next);
    }
    json_response(
        StatusCode::OK,
        &json!({ "kind": "ServiceList", "apiVersion": "v1", "metadata": metadata, "items": items }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_skips_empty_pairs_and_decodes() {
        let p = Params::parse("&limit=500&&labelSelector=app%3Dweb%2Ctier+in+(a)&x");
        assert_eq!(p.get("limit"), Some("500"));
        assert_eq!(p.get("labelSelector"), Some("app=web,tier in (a)"));
        assert_eq!(p.get("x"), Some(""));
        assert_eq!(decode("100%"), "100%");
        assert_eq!(decode("%zz%41"), "%zzA");
    }

    #[test]
    fn token_roundtrip() {
        let t = encode_token(42, "ns", "a-b");
        assert_eq!(decode_token(&t), Some((42, "ns".into(), "a-b".into())));
        assert_eq!(decode_token("zz"), None);
    }
}
