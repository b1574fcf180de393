//! Discovery documents kubectl needs before it lists or writes anything: `/version` (reports 1.32, which
//! the installed kubectl dispatcher uses to pick its binary), `/api`, `/apis`, `/api/v1`,
//! `/apis/events.k8s.io[/v1]`, and a minimal OpenAPI v3 (`/openapi/v3`, `/openapi/v3/{api/v1 |
//! apis/events.k8s.io/v1}`).
//!
//! The OpenAPI v3 documents only declare, per kind, a PATCH operation accepting the `fieldValidation`
//! query parameter: that is what kubectl checks to validate `create`/`apply` server-side (the fake
//! ignores the parameter) instead of downloading schemas. They declare no schemas and no patch request
//! bodies, so client-side `kubectl apply` computes its strategic merge patch from its compiled-in types.
//! `/openapi/v2` stays 404, which kubectl tolerates once v3 is there.

use serde_json::{Value, json};

use super::Shared;

/// `GET /version`: a v1.32.0 `version.Info`.
pub(crate) fn version() -> Value {
    json!({
        "major": "1", "minor": "32", "gitVersion": "v1.32.0",
        "gitCommit": "70d3cc986aa8221cd1dfb1121852688902d3bf53", "gitTreeState": "clean",
        "buildDate": "2024-12-11T17:57:02Z", "goVersion": "go1.23.3", "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// `GET /api`: `APIVersions` with `v1` and this server's address.
pub(crate) fn api_versions(shared: &Shared) -> Value {
    json!({
        "kind": "APIVersions", "versions": ["v1"],
        "serverAddressByClientCIDRs": [{ "clientCIDR": "0.0.0.0/0", "serverAddress": shared.addr.to_string() }],
    })
}

fn events_group() -> Value {
    let v1 = json!({ "groupVersion": "events.k8s.io/v1", "version": "v1" });
    json!({ "name": "events.k8s.io", "versions": [v1], "preferredVersion": v1 })
}

/// `GET /apis`: `APIGroupList` with the `events.k8s.io` group (version `v1`).
pub(crate) fn api_groups() -> Value {
    json!({ "kind": "APIGroupList", "apiVersion": "v1", "groups": [events_group()] })
}

/// `GET /apis/events.k8s.io`: its `APIGroup`.
pub(crate) fn events_api_group() -> Value {
    let mut g = events_group();
    g["kind"] = json!("APIGroup");
    g["apiVersion"] = json!("v1");
    g
}

fn events_resource(short_names: bool) -> Value {
    let mut r = json!({
        "name": "events", "singularName": "event", "namespaced": true, "kind": "Event",
        "verbs": ["create", "delete", "get", "list", "patch", "update"],
    });
    if short_names {
        r["shortNames"] = json!(["ev"]);
    }
    r
}

/// `GET /api/v1`: `APIResourceList` with `services` (short name `svc`), `services/status` and `events`
/// (short name `ev`; no `watch` verb).
pub(crate) fn resource_list() -> Value {
    json!({
        "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "v1",
        "resources": [
            {
                "name": "services", "singularName": "service", "namespaced": true, "kind": "Service",
                "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
                "shortNames": ["svc"], "categories": ["all"], "storageVersionHash": "0/CO1lhkEBI=",
            },
            {
                "name": "services/status", "singularName": "", "namespaced": true, "kind": "Service",
                "verbs": ["get", "patch", "update"],
            },
            events_resource(true),
        ],
    })
}

/// `GET /apis/events.k8s.io/v1`: `APIResourceList` with `events`.
pub(crate) fn events_resource_list() -> Value {
    json!({
        "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "events.k8s.io/v1",
        "resources": [events_resource(false)],
    })
}

/// `GET /openapi/v3`: the index of the per group-version documents.
pub(crate) fn openapi_v3_root() -> Value {
    json!({ "paths": {
        "api/v1": { "serverRelativeURL": "/openapi/v3/api/v1?hash=FAKE0001" },
        "apis/events.k8s.io/v1": { "serverRelativeURL": "/openapi/v3/apis/events.k8s.io/v1?hash=FAKE0001" },
    }})
}

/// `GET /openapi/v3/{gv}` for `gv` = `api/v1` or `apis/events.k8s.io/v1`; `None` for any other.
pub(crate) fn openapi_v3_doc(gv: &str) -> Option<Value> {
    let (prefix, group, kinds): (&str, &str, &[(&str, &str)]) = match gv {
        "api/v1" => ("/api/v1", "", &[("services", "Service"), ("events", "Event")]),
        "apis/events.k8s.io/v1" => ("/apis/events.k8s.io/v1", "events.k8s.io", &[("events", "Event")]),
        _ => return None,
    };
    let mut paths = serde_json::Map::new();
    for (resource, kind) in kinds {
        let patch = json!({
            "operationId": format!("patchNamespaced{kind}"),
            "x-kubernetes-action": "patch",
            "x-kubernetes-group-version-kind": { "group": group, "version": "v1", "kind": kind },
            "parameters": [
                { "name": "dryRun", "in": "query", "schema": { "type": "string" } },
                { "name": "fieldManager", "in": "query", "schema": { "type": "string" } },
                { "name": "fieldValidation", "in": "query", "schema": { "type": "string" } },
            ],
            "responses": { "200": { "description": "OK" } },
        });
        paths.insert(format!("{prefix}/namespaces/{{namespace}}/{resource}/{{name}}"), json!({ "patch": patch }));
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": { "title": "Kubernetes (vipwatch fake apiserver)", "version": "v1.32.0" },
        "paths": paths,
        "components": { "schemas": {} },
    }))
}
