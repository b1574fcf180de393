//! HTTP routes of the fake apiserver: discovery (and a minimal OpenAPI v3) for kubectl; list / get /
//! watch / create / replace / patch / delete of every [`Resource`] — core/v1 `services` and `nodes`
//! (with their `status` subresource) and discovery.k8s.io/v1 `endpointslices` — by one generic path
//! ([`super::list`], [`super::watch`], [`super::objects`]); `events` through core/v1 and
//! events.k8s.io/v1 ([`super::events_http`]).
//!
//! Resource paths, under `/api/v1` (core) or `/apis/{group}/v1`, optionally after a deprecated `watch/`:
//! namespaced `{plural}` (all namespaces), `namespaces/{ns}/{plural}[/{name}[/status]]`; cluster-scoped
//! `{plural}[/{name}[/status]]`. A path of the wrong scope (`/api/v1/services/x`,
//! `/api/v1/namespaces/x/nodes`) is a 404, as is `/status` of a resource without that subresource.
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

use super::discovery::{self, EVENTS_GROUP, GROUPS, api_versions, version};
use super::errors::{bad_request, json_response, status};
use super::events::EventApi;
use super::objects::{self, Target};
use super::resource::Resource;
use super::selector::{FieldSelector, LabelSelector, Matcher};
use super::state::StartFrom;
use super::watch::{self, WatchSpec};
use super::{RecordedRequest, Shared, events_http, list};

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
    Group(&'a str),
    GroupV1(&'a str),
    OpenApiV3,
    OpenApiV3Doc(String),
    /// A collection of a stored resource (`ns: None` = all namespaces, or cluster-scoped).
    Collection {
        res: Resource,
        ns: Option<&'a str>,
        watch: bool,
    },
    /// One stored object or its `status` (`target.status`); `watch` for the deprecated watch path.
    Object {
        target: Target<'a>,
        watch: bool,
    },
    Events {
        api: EventApi,
        ns: Option<&'a str>,
    },
    Event {
        api: EventApi,
        ns: &'a str,
        name: &'a str,
    },
    /// One namespace (read-only: `GET`), as a controller reads `kube-system` for the cluster's uid.
    Namespace(&'a str),
}

fn route<'a>(segs: &[&'a str]) -> Option<Route<'a>> {
    use EventApi::{Core, EventsV1};
    Some(match segs {
        ["version"] => Route::Version,
        ["api"] => Route::Api,
        ["apis"] => Route::Apis,
        ["api", "v1"] => Route::ApiV1,
        ["apis", group] if GROUPS.contains(group) => Route::Group(group),
        ["apis", group, "v1"] if GROUPS.contains(group) => Route::GroupV1(group),
        ["openapi", "v3"] => Route::OpenApiV3,
        ["openapi", "v3", rest @ ..] => Route::OpenApiV3Doc(rest.join("/")),
        ["api", "v1", "namespaces", name] => Route::Namespace(name),
        ["api", "v1", "events"] => Route::Events { api: Core, ns: None },
        ["api", "v1", "namespaces", ns, "events"] => Route::Events { api: Core, ns: Some(ns) },
        ["api", "v1", "namespaces", ns, "events", name] => Route::Event { api: Core, ns, name },
        ["apis", EVENTS_GROUP, "v1", "events"] => Route::Events { api: EventsV1, ns: None },
        ["apis", EVENTS_GROUP, "v1", "namespaces", ns, "events"] => Route::Events { api: EventsV1, ns: Some(ns) },
        ["apis", EVENTS_GROUP, "v1", "namespaces", ns, "events", name] => Route::Event { api: EventsV1, ns, name },
        ["api", "v1", rest @ ..] => return resource_route("", rest),
        ["apis", group, "v1", rest @ ..] => return resource_route(group, rest),
        _ => return None,
    })
}

/// A path below `/api/v1` (`group` `""`) or `/apis/{group}/v1` naming a stored resource (see the module
/// docs for the shapes); `None` for anything else, including a path of the wrong scope.
fn resource_route<'a>(group: &str, rest: &[&'a str]) -> Option<Route<'a>> {
    let (watch, rest) = match rest {
        ["watch", rest @ ..] => (true, rest),
        _ => (false, rest),
    };
    let (ns, rest) = match rest {
        ["namespaces", ns, rest @ ..] => (Some(*ns), rest),
        _ => (None, rest),
    };
    let (plural, name, status) = match rest {
        [plural] => (*plural, None, false),
        [plural, name] => (*plural, Some(*name), false),
        [plural, name, "status"] if !watch => (*plural, Some(*name), true),
        _ => return None,
    };
    let res = Resource::lookup(group, plural)?;
    if (!res.namespaced() && ns.is_some()) || (res.namespaced() && ns.is_none() && name.is_some()) {
        return None;
    }
    if status && !res.has_status() {
        return None;
    }
    Some(match name {
        None => Route::Collection { res, ns, watch },
        Some(name) => Route::Object { target: Target { res, ns: ns.unwrap_or(""), name, status }, watch },
    })
}

/// The request body (at most 16 MiB; more answers 413).
async fn read_body(req: Request) -> Result<Bytes, Response> {
    axum::body::to_bytes(req.into_body(), 16 << 20)
        .await
        .map_err(|_| status(413, "RequestEntityTooLarge", "the request body is too large (limit 16 MiB)"))
}

/// The answer of an injected failure with HTTP `code`.
fn injected(code: u16, method: &axum::http::Method, path: &str) -> Response {
    let reason = match code {
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        429 => "TooManyRequests",
        503 => "ServiceUnavailable",
        _ => "InternalError",
    };
    let message = match code {
        401 => "Unauthorized (fault injected)".to_owned(),
        403 => format!("{method} {path} is forbidden (fault injected): the user may not access this resource"),
        _ => "an error on the server (fault injected) has prevented the request from succeeding".to_owned(),
    };
    status(code, reason, message)
}

async fn handle(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    shared.record(RecordedRequest {
        method: method.to_string(),
        path: path.clone(),
        query: query.clone(),
        at: std::time::Instant::now(),
    });
    crate::spend(shared.options.cpu_per_request);
    if let Some(code) = shared.faults.take_failure() {
        return injected(code, &method, &path);
    }
    let params = Params::parse(&query);
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let Some(route) = route(&segs) else {
        return status(404, "NotFound", "the server could not find the requested resource");
    };
    let headers = req.headers().clone();
    let ok = |v: &serde_json::Value| json_response(StatusCode::OK, v);
    let writes = matches!(method, Method::POST | Method::PUT | Method::PATCH | Method::DELETE);
    if writes {
        shared.faults.write_allowed(&path).await;
    }
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
        (Method::GET, Route::Namespace(name)) => ok(&shared.namespace(name)),
        (Method::GET, Route::Api) => ok(&api_versions(&shared)),
        (Method::GET, Route::Apis) => ok(&discovery::api_groups()),
        (Method::GET, Route::ApiV1) => ok(&discovery::core_resource_list()),
        (Method::GET, Route::Group(group)) => ok(&discovery::api_group(group)),
        (Method::GET, Route::GroupV1(group)) => ok(&discovery::group_resource_list(group)),
        (Method::GET, Route::OpenApiV3) => ok(&discovery::openapi_v3_root()),
        (Method::GET, Route::OpenApiV3Doc(gv)) => match discovery::openapi_v3_doc(&gv) {
            Some(doc) => ok(&doc),
            None => status(404, "NotFound", "the server could not find the requested resource"),
        },
        (Method::GET, Route::Collection { res, ns, watch })
            if super::table::wanted(&headers) && !watch && !params.flag("watch") =>
        {
            match matcher(res, ns, None, &params) {
                Ok(m) => list::table(&shared, res, &m),
                Err(e) => bad_request(e),
            }
        }
        (Method::GET, Route::Collection { res, ns, watch }) => {
            let metadata_only = super::partial::list_wanted(&headers);
            collection(&shared, res, ns, None, watch, &params, metadata_only)
        }
        (Method::POST, Route::Collection { res, ns, watch: false }) if res.namespaced() == ns.is_some() => {
            objects::create(&shared, res, ns.unwrap_or(""), &params, &body)
        }
        (Method::GET, Route::Object { target, watch }) if !target.status && (watch || params.flag("watch")) => {
            let ns = Some(target.ns).filter(|_| target.res.namespaced());
            collection(&shared, target.res, ns, Some(target.name), true, &params, false)
        }
        (Method::GET, Route::Object { target, .. }) => objects::get(&shared, &target, &headers),
        (Method::PUT, Route::Object { target, watch: false }) => objects::replace(&shared, &target, &params, &body),
        (Method::PATCH, Route::Object { target, watch: false }) => {
            objects::patch(&shared, &target, &params, &headers, &body)
        }
        (Method::DELETE, Route::Object { target, watch: false }) if !target.status => {
            objects::delete(&shared, &target, &params, &body)
        }
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

/// The label and field selectors of a collection request of `res` (plus `name`, for a watch of one
/// object). Errors: the message of a 400 (a selector that does not parse, a field label `res` lacks).
fn matcher(res: Resource, ns: Option<&str>, name: Option<&str>, params: &Params) -> Result<Matcher, String> {
    let labels = LabelSelector::parse(params.get("labelSelector").unwrap_or(""))?;
    let mut fields_raw = params.get("fieldSelector").unwrap_or("").to_string();
    if let Some(name) = name {
        fields_raw = format!("{fields_raw},metadata.name={name}");
    }
    let fields = FieldSelector::parse_with(&fields_raw, |f| res.field_pointer(f))?;
    Ok(Matcher { namespace: ns.map(str::to_string), labels, fields })
}

/// List or watch a collection of `res` (`name` narrows a watch to one object, as the named watch paths
/// do); `metadata_only` answers a list with a `PartialObjectMetadataList`.
fn collection(
    shared: &Arc<Shared>,
    res: Resource,
    ns: Option<&str>,
    name: Option<&str>,
    watch: bool,
    params: &Params,
    metadata_only: bool,
) -> Response {
    let matcher = match matcher(res, ns, name, params) {
        Ok(m) => m,
        Err(e) => return bad_request(e),
    };
    if watch || params.flag("watch") {
        if shared.faults.take_gone_watch() {
            let rv = params.get("resourceVersion").unwrap_or("0");
            return status(410, "Expired", format!("too old resource version: {rv} (fault injected)"));
        }
        watch_request(shared, res, matcher, params)
    } else {
        list::objects(shared, res, &matcher, params, metadata_only)
    }
}

fn watch_request(shared: &Arc<Shared>, resource: Resource, matcher: Matcher, params: &Params) -> Response {
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
    watch::start(shared, WatchSpec { resource, matcher, from, timeout, bookmarks, initial_events_end: initial_events })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_routes_respect_scope() {
        fn parse(p: &str) -> Option<Route<'_>> {
            route(&p.split('/').filter(|s| !s.is_empty()).collect::<Vec<_>>())
        }
        fn target(p: &str) -> Option<(Resource, &str, &str, bool, bool)> {
            match parse(p)? {
                Route::Object { target: t, watch } => Some((t.res, t.ns, t.name, t.status, watch)),
                _ => None,
            }
        }
        assert_eq!(target("/api/v1/nodes/w1/status"), Some((Resource::Nodes, "", "w1", true, false)));
        assert_eq!(target("/api/v1/watch/nodes/w1"), Some((Resource::Nodes, "", "w1", false, true)));
        assert_eq!(
            target("/apis/discovery.k8s.io/v1/namespaces/shop/endpointslices/web-abc"),
            Some((Resource::EndpointSlices, "shop", "web-abc", false, false))
        );
        assert!(matches!(
            parse("/apis/discovery.k8s.io/v1/watch/endpointslices"),
            Some(Route::Collection { res: Resource::EndpointSlices, ns: None, watch: true })
        ));
        for wrong in [
            "/api/v1/services/x",
            "/api/v1/namespaces/x/nodes",
            "/apis/discovery.k8s.io/v1/namespaces/x/endpointslices/y/status",
            "/api/v1/endpointslices",
            "/api/v1/watch/nodes/w1/status",
            "/apis/apps/v1/deployments",
        ] {
            assert!(parse(wrong).is_none(), "{wrong}");
        }
        // One namespace is readable (a controller reads kube-system's uid), nothing below it that is
        // not a resource.
        assert!(matches!(parse("/api/v1/namespaces/kube-system"), Some(Route::Namespace("kube-system"))));
    }

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
