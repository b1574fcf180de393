//! Discovery documents kubectl needs before it lists anything: `/version` (reports 1.32, which the
//! installed kubectl dispatcher uses to pick its binary), `/api`, `/apis` and `/api/v1`.

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

/// `GET /api/v1`: `APIResourceList` with `services` (short name `svc`) and `services/status`.
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
        ],
    })
}
