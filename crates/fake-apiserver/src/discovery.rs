//! Discovery documents kubectl needs before it lists or writes anything: `/version` (reports 1.32, which
//! the installed kubectl dispatcher uses to pick its binary), `/api`, `/apis` (groups `discovery.k8s.io`
//! and `events.k8s.io`), `/api/v1` (`services`, `nodes`, their `status` subresources, `events`),
//! `/apis/{group}` and `/apis/{group}/v1`, and a minimal OpenAPI v3 (`/openapi/v3`,
//! `/openapi/v3/{api/v1 | apis/discovery.k8s.io/v1 | apis/events.k8s.io/v1}`).
//!
//! The OpenAPI v3 documents only declare, per kind, a PATCH operation accepting the `fieldValidation`
//! query parameter: that is what kubectl checks to validate `create`/`apply` server-side (the fake
//! ignores the parameter) instead of downloading schemas. They declare no schemas and no patch request
//! bodies, so client-side `kubectl apply` computes its strategic merge patch from its compiled-in types.
//! `/openapi/v2` stays 404, which kubectl tolerates once v3 is there.

use serde_json::{Map, Value, json};

use super::Shared;
use super::resource::{DISCOVERY_GROUP, Resource};

/// The `events.k8s.io` API group.
pub(crate) const EVENTS_GROUP: &str = "events.k8s.io";

/// The API groups besides core, each served at version `v1` only.
pub(crate) const GROUPS: [&str; 2] = [DISCOVERY_GROUP, EVENTS_GROUP];

/// The verbs every stored resource serves.
const VERBS: [&str; 7] = ["create", "delete", "get", "list", "patch", "update", "watch"];

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

fn group(name: &str) -> Value {
    let v1 = json!({ "groupVersion": format!("{name}/v1"), "version": "v1" });
    json!({ "name": name, "versions": [v1], "preferredVersion": v1 })
}

/// `GET /apis`: `APIGroupList` with the groups of [`GROUPS`] (version `v1` each).
pub(crate) fn api_groups() -> Value {
    let groups: Vec<Value> = GROUPS.iter().map(|g| group(g)).collect();
    json!({ "kind": "APIGroupList", "apiVersion": "v1", "groups": groups })
}

/// `GET /apis/{name}` for a group of [`GROUPS`]: its `APIGroup`.
pub(crate) fn api_group(name: &str) -> Value {
    let mut g = group(name);
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

/// The `APIResource` entries of a stored resource: the collection (verbs [`VERBS`]; short names `svc`
/// and `no`; Services in category `all`) and, if it has one, its `status` subresource.
fn resource_entries(res: Resource) -> Vec<Value> {
    let mut main = json!({
        "name": res.plural(), "singularName": res.kind().to_lowercase(), "namespaced": res.namespaced(),
        "kind": res.kind(), "verbs": VERBS,
    });
    match res {
        Resource::Services => {
            main["shortNames"] = json!(["svc"]);
            main["categories"] = json!(["all"]);
        }
        Resource::Nodes => main["shortNames"] = json!(["no"]),
        Resource::EndpointSlices => {}
    }
    let status = json!({
        "name": format!("{}/status", res.plural()), "singularName": "", "namespaced": res.namespaced(),
        "kind": res.kind(), "verbs": ["get", "patch", "update"],
    });
    if res.has_status() { vec![main, status] } else { vec![main] }
}

fn resource_list(group_version: &str, resources: Vec<Value>) -> Value {
    json!({ "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources })
}

/// `GET /api/v1`: `APIResourceList` with `services` and `nodes` (and their `status`), and `events`
/// (short name `ev`; no `watch` verb).
pub(crate) fn core_resource_list() -> Value {
    let mut resources = resource_entries(Resource::Services);
    resources.extend(resource_entries(Resource::Nodes));
    resources.push(events_resource(true));
    resource_list("v1", resources)
}

/// `GET /apis/{name}/v1` for a group of [`GROUPS`]: `endpointslices` or `events`.
pub(crate) fn group_resource_list(name: &str) -> Value {
    let resources = match name {
        DISCOVERY_GROUP => resource_entries(Resource::EndpointSlices),
        _ => vec![events_resource(false)],
    };
    resource_list(&format!("{name}/v1"), resources)
}

/// `GET /openapi/v3`: the index of the per group-version documents.
pub(crate) fn openapi_v3_root() -> Value {
    let mut paths = Map::new();
    for gv in ["api/v1".to_string()].into_iter().chain(GROUPS.iter().map(|g| format!("apis/{g}/v1"))) {
        paths.insert(gv.clone(), json!({ "serverRelativeURL": format!("/openapi/v3/{gv}?hash=FAKE0001") }));
    }
    json!({ "paths": paths })
}

/// `GET /openapi/v3/{gv}` for `gv` = `api/v1`, `apis/discovery.k8s.io/v1` or `apis/events.k8s.io/v1`;
/// `None` for any other. One PATCH operation per kind, on its item path.
pub(crate) fn openapi_v3_doc(gv: &str) -> Option<Value> {
    let stored = |r: Resource| (r.group(), r.plural(), r.kind(), r.namespaced());
    let event = |group: &'static str| (group, "events", "Event", true);
    let kinds = match gv {
        "api/v1" => vec![stored(Resource::Services), stored(Resource::Nodes), event("")],
        "apis/discovery.k8s.io/v1" => vec![stored(Resource::EndpointSlices)],
        "apis/events.k8s.io/v1" => vec![event(EVENTS_GROUP)],
        _ => return None,
    };
    let mut paths = Map::new();
    for (group, plural, kind, namespaced) in kinds {
        let scope = if namespaced { "Namespaced" } else { "" };
        let patch = json!({
            "operationId": format!("patch{scope}{kind}"),
            "x-kubernetes-action": "patch",
            "x-kubernetes-group-version-kind": { "group": group, "version": "v1", "kind": kind },
            "parameters": [
                { "name": "dryRun", "in": "query", "schema": { "type": "string" } },
                { "name": "fieldManager", "in": "query", "schema": { "type": "string" } },
                { "name": "fieldValidation", "in": "query", "schema": { "type": "string" } },
            ],
            "responses": { "200": { "description": "OK" } },
        });
        let ns = if namespaced { "/namespaces/{namespace}" } else { "" };
        paths.insert(format!("/{gv}{ns}/{plural}/{{name}}"), json!({ "patch": patch }));
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": { "title": "Kubernetes (vipwatch fake apiserver)", "version": "v1.32.0" },
        "paths": paths,
        "components": { "schemas": {} },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_lists_nodes_and_endpointslices() {
        let core = core_resource_list();
        let names: Vec<&str> =
            core["resources"].as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["services", "services/status", "nodes", "nodes/status", "events"]);
        assert_eq!(
            (core["resources"][2]["namespaced"].as_bool(), &core["resources"][2]["shortNames"]),
            (Some(false), &json!(["no"]))
        );
        let slices = group_resource_list(DISCOVERY_GROUP);
        assert_eq!(slices["groupVersion"], "discovery.k8s.io/v1");
        assert_eq!(slices["resources"][0]["kind"], "EndpointSlice");
        assert_eq!(slices["resources"].as_array().unwrap().len(), 1);
        assert_eq!(api_group(DISCOVERY_GROUP)["preferredVersion"]["groupVersion"], "discovery.k8s.io/v1");
        let doc = openapi_v3_doc("api/v1").unwrap();
        let node = &doc["paths"]["/api/v1/nodes/{name}"]["patch"];
        assert_eq!(node["x-kubernetes-group-version-kind"], json!({"group": "", "version": "v1", "kind": "Node"}));
        let es = openapi_v3_doc("apis/discovery.k8s.io/v1").unwrap();
        assert!(
            es["paths"]["/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices/{name}"]["patch"].is_object()
        );
        assert!(openapi_v3_root()["paths"]["apis/discovery.k8s.io/v1"].is_object());
    }
}
