//! HTTP routes of the fake apiserver: discovery (and a minimal OpenAPI v3) for kubectl; list / get /
//! watch / create / replace / patch / delete of `services` (core v1) and their `status` subresource
//! ([`super::services`]); `events` through core/v1 and events.k8s.io/v1 ([`super::events_http`]).
//!
//! Routing is done by hand on the path segments behind one axum fallback handler, so every request (also
//! unknown paths) is recorded and subject to [`super::Faults::fail_requests`].

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::response::Response;

use super::discovery::{self, api_versions, resource_list, version};
use super::errors::{ApiError, bad_request, json_response, status};
use super::events::EventApi;
use super::selector::{FieldSelector, LabelSelector, Matcher};
use super::state::StartFrom;
use super::watch::{self, WatchSpec};
use super::{RecordedRequest, Shared, events_http, list, services};

/// The service for one server: a single fallback handler over shared state.
pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new().fallback(handle).with_state(shared)
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

    /// Whether `key` is given as a true boolean (`true`, `1`, `t`, …).
    pub(crate) fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true" | "1" | "t" | "T" | "TRUE" | "True"))
    }

    /// `key` as a non-negative integer (`None` if absent or empty); errors name the parameter.
    pub(crate) fn number(&self, key: &str) -> Result<Option<u64>, String> {
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
    EventsGroup,
    EventsV1,
    OpenApiV3,
    OpenApiV3Doc(String),
    Collection { ns: Option<&'a str>, watch: bool },
    Item { ns: &'a str, name: &'a str, watch: bool },
    Status { ns: &'a str, name: &'a str },
    Events { api: EventApi, ns: Option<&'a str> },
    Event { api: EventApi, ns: &'a str, name: &'a str },
}

fn route<'a>(segs: &[&'a str]) -> Option<Route<'a>> {
    use EventApi::{Core, EventsV1};
    const GROUP: &str = "events.k8s.io";
    Some(match segs {
        ["version"] => Route::Version,
        ["api"] => Route::Api,
        ["apis"] => Route::Apis,
        ["api", "v1"] => Route::ApiV1,
        ["apis", GROUP] => Route::EventsGroup,
        ["apis", GROUP, "v1"] => Route::EventsV1,
        ["openapi", "v3"] => Route::OpenApiV3,
        ["openapi", "v3", rest @ ..] => Route::OpenApiV3Doc(rest.join("/")),
        ["api", "v1", "services"] => Route::Collection { ns: None, watch: false },
        ["api", "v1", "namespaces", ns, "services"] => Route::Collection { ns: Some(ns), watch: false },
        ["api", "v1", "namespaces", ns, "services", name] => Route::Item { ns, name, watch: false },
        ["api", "v1", "namespaces", ns, "services", name, "status"] => Route::Status { ns, name },
        ["api", "v1", "watch", "services"] => Route::Collection { ns: None, watch: true },
        ["api", "v1", "watch", "namespaces", ns, "services"] => Route::Collection { ns: Some(ns), watch: true },
        ["api", "v1", "watch", "namespaces", ns, "services", name] => Route::Item { ns, name, watch: true },
        ["api", "v1", "events"] => Route::Events { api: Core, ns: None },
        ["api", "v1", "namespaces", ns, "events"] => Route::Events { api: Core, ns: Some(ns) },
        ["api", "v1", "namespaces", ns, "events", name] => Route::Event { api: Core, ns, name },
        ["apis", GROUP, "v1", "events"] => Route::Events { api: EventsV1, ns: None },
        ["apis", GROUP, "v1", "namespaces", ns, "events"] => Route::Events { api: EventsV1, ns: Some(ns) },
        ["apis", GROUP, "v1", "namespaces", ns, "events", name] => Route::Event { api: EventsV1, ns, name },
        _ => return None,
    })
}

/// The request body (at most 16 MiB; more answers 413).
async fn read_body(req: Request) -> Result<Bytes, Response> {
    axum::body::to_bytes(req.into_body(), 16 << 20)
        .await
        .map_err(|_| status(413, "RequestEntityTooLarge", "the request body is too large (limit 16 MiB)"))
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
    let ok = |v: &serde_json::Value| json_response(StatusCode::OK, v);
    let writes = matches!(method, Method::POST | Method::PUT | Method::PATCH | Method::DELETE);
    let body = if writes {
        match read_body(req).await {
            Ok(b) => b,
            Err(resp) => return resp,
        }
    } else {
        Bytes::new()
    };
    match (method, route) {
        (Method::GET, Route::Version) => ok(&version()),
        (Method::GET, Route::Api) => ok(&api_versions(&shared)),
        (Method::GET, Route::Apis) => ok(&discovery::api_groups()),
        (Method::GET, Route::ApiV1) => ok(&resource_list()),
        (Method::GET, Route::EventsGroup) => ok(&discovery::events_api_group()),
        (Method::GET, Route::EventsV1) => ok(&discovery::events_resource_list()),
        (Method::GET, Route::OpenApiV3) => ok(&discovery::openapi_v3_root()),
        (Method::GET, Route::OpenApiV3Doc(gv)) => match discovery::openapi_v3_doc(&gv) {
            Some(doc) => ok(&doc),
            None => status(404, "NotFound", "the server could not find the requested resource"),
        },
        (Method::GET, Route::Collection { ns, watch })
            if super::table::wanted(&headers) && !watch && !params.flag("watch") =>
        {
            match matcher(ns, None, &params) {
                Ok(m) => list::services_table(&shared, &m),
                Err(e) => bad_request(e),
            }
        }
        (Method::GET, Route::Collection { ns, watch }) => collection(&shared, ns, None, watch, &params),
        (Method::POST, Route::Collection { ns: Some(ns), watch: false }) => {
            services::create(&shared, ns, &params, &body)
        }
        (Method::GET, Route::Item { ns, name, watch }) if watch || params.flag("watch") => {
            collection(&shared, Some(ns), Some(name), true, &params)
        }
        (Method::GET, Route::Item { ns, name, .. } | Route::Status { ns, name }) => {
            let store = shared.store.lock().expect("store lock");
            match store.get(ns, name) {
                Some(obj) if super::table::wanted(&headers) => {
                    ok(&super::table::services(std::slice::from_ref(obj), store.rv()))
                }
                Some(obj) => ok(obj),
                None => not_found(name),
            }
        }
        (Method::PUT, Route::Item { ns, name, watch: false }) => {
            services::replace(&shared, ns, name, &params, &body, false)
        }
        (Method::PUT, Route::Status { ns, name }) => services::replace(&shared, ns, name, &params, &body, true),
        (Method::PATCH, Route::Item { ns, name, watch: false }) => {
            services::patch(&shared, ns, name, &params, &headers, &body, false)
        }
        (Method::PATCH, Route::Status { ns, name }) => {
            services::patch(&shared, ns, name, &params, &headers, &body, true)
        }
        (Method::DELETE, Route::Item { ns, name, watch: false }) => services::delete(&shared, ns, name, &params, &body),
        (Method::GET, Route::Events { api, ns }) => events_http::list(&shared, api, ns, &params),
        (Method::POST, Route::Events { api, ns: Some(ns) }) => events_http::create(&shared, api, ns, &body),
        (Method::GET, Route::Event { api, ns, name }) => events_http::get(&shared, api, ns, name),
        (Method::PUT, Route::Event { api, ns, name }) => events_http::write(&shared, api, ns, name, None, &body),
        (Method::PATCH, Route::Event { api, ns, name }) => {
            events_http::write(&shared, api, ns, name, Some(&headers), &body)
        }
        (Method::DELETE, Route::Event { api, ns, name }) => events_http::delete(&shared, api, ns, name),
        (m, _) => status(
            405,
            "MethodNotAllowed",
            format!("the server does not allow this method on the requested resource: {m}"),
        ),
    }
}

/// A 404 `Status` for the Service `name`.
pub(crate) fn not_found(name: &str) -> Response {
    ApiError::not_found("services", name).response()
}

/// List or watch a collection (`name` narrows a watch to one object, as the named watch paths do).
/// The label and field selectors of a collection request (plus `name`, for a watch of one object).
/// Errors: the message of a 400 (a selector that does not parse).
fn matcher(ns: Option<&str>, name: Option<&str>, params: &Params) -> Result<Matcher, String> {
    let labels = LabelSelector::parse(params.get("labelSelector").unwrap_or(""))?;
    let mut fields_raw = params.get("fieldSelector").unwrap_or("").to_string();
    if let Some(name) = name {
        fields_raw = format!("{fields_raw},metadata.name={name}");
    }
    let fields = FieldSelector::parse(&fields_raw)?;
    Ok(Matcher { namespace: ns.map(str::to_string), labels, fields })
}

fn collection(shared: &Arc<Shared>, ns: Option<&str>, name: Option<&str>, watch: bool, params: &Params) -> Response {
    let matcher = match matcher(ns, name, params) {
        Ok(m) => m,
        Err(e) => return bad_request(e),
    };
    if watch || params.flag("watch") {
        watch_request(shared, matcher, params)
    } else {
        list::services(shared, &matcher, params)
    }
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
}
