//! Server-side printing: kubectl asks for `Accept: application/json;as=Table;v=v1;g=meta.k8s.io` and
//! shows the columns the server returns; without it kubectl falls back to NAME and AGE. The columns are
//! a real apiserver's (`pkg/printers/internalversion`), `-o wide` ones at priority 1:
//!
//! - Service: NAME, TYPE, CLUSTER-IP, EXTERNAL-IP, PORT(S), AGE, (SELECTOR).
//! - Node: NAME, STATUS (`Ready` / `NotReady` from the `Ready` condition, `Unknown` without one, plus
//!   `,SchedulingDisabled` when `spec.unschedulable`), ROLES (from `node-role.kubernetes.io/<role>` and
//!   `kubernetes.io/role` labels, sorted, or `<none>`), AGE, VERSION (`status.nodeInfo.kubeletVersion`),
//!   (INTERNAL-IP, EXTERNAL-IP, OS-IMAGE, KERNEL-VERSION, CONTAINER-RUNTIME).
//! - EndpointSlice: NAME, ADDRESSTYPE, PORTS, ENDPOINTS (at most 3 each, then `+ N more...`; `<unset>`
//!   when empty), AGE.

use std::collections::BTreeSet;

use axum::http::HeaderMap;
use axum::http::header::ACCEPT;
use serde_json::{Value, json};

use super::resource::Resource;

/// Whether the client asked for a `meta.k8s.io/v1` Table.
pub(crate) fn wanted(headers: &HeaderMap) -> bool {
    headers.get(ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(|a| a.contains("as=Table"))
}

/// The Table of `objects` (all of resource `res`) at resourceVersion `rv`.
pub(crate) fn of(res: Resource, objects: &[Value], rv: u64) -> Value {
    let (names, cells): (&[Column], fn(&Value) -> Value) = match res {
        Resource::Services => (&SERVICE_COLUMNS, service_cells),
        Resource::Nodes => (&NODE_COLUMNS, node_cells),
        Resource::EndpointSlices => (&ENDPOINT_SLICE_COLUMNS, endpoint_slice_cells),
    };
    let columns: Vec<Value> = names
        .iter()
        .map(|(name, priority)| {
            json!({"name": name, "type": "string", "format": if *name == "Name" { "name" } else { "" },
                   "description": "", "priority": priority})
        })
        .collect();
    let rows: Vec<Value> =
        objects.iter().map(|obj| json!({"cells": cells(obj), "object": super::partial::of(obj)})).collect();
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": rv.to_string()},
           "columnDefinitions": columns, "rows": rows})
}

/// `(column name, priority)`: priority 1 columns show only with `-o wide`.
type Column = (&'static str, u8);

const SERVICE_COLUMNS: [Column; 7] =
    [("Name", 0), ("Type", 0), ("Cluster-IP", 0), ("External-IP", 0), ("Port(s)", 0), ("Age", 0), ("Selector", 1)];

const NODE_COLUMNS: [Column; 10] = [
    ("Name", 0),
    ("Status", 0),
    ("Roles", 0),
    ("Age", 0),
    ("Version", 0),
    ("Internal-IP", 1),
    ("External-IP", 1),
    ("OS-Image", 1),
    ("Kernel-Version", 1),
    ("Container-Runtime", 1),
];

const ENDPOINT_SLICE_COLUMNS: [Column; 5] =
    [("Name", 0), ("AddressType", 0), ("Ports", 0), ("Endpoints", 0), ("Age", 0)];

fn text(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_owned()
}

fn service_cells(svc: &Value) -> Value {
    let spec = &svc["spec"];
    let ty = spec["type"].as_str().unwrap_or("ClusterIP");
    json!([
        text(&svc["metadata"]["name"]),
        ty,
        spec["clusterIP"].as_str().unwrap_or("<none>"),
        external_ip(svc, ty),
        ports(spec),
        age(&svc["metadata"]["creationTimestamp"]),
        selector(spec),
    ])
}

fn node_cells(node: &Value) -> Value {
    let mut conditions = node.pointer("/status/conditions").and_then(Value::as_array).into_iter().flatten();
    let ready = conditions.rfind(|c| c["type"] == "Ready").map(|c| c["status"] == "True");
    let mut status = match ready {
        Some(true) => "Ready".to_string(),
        Some(false) => "NotReady".to_string(),
        None => "Unknown".to_string(),
    };
    if node.pointer("/spec/unschedulable") == Some(&Value::Bool(true)) {
        status.push_str(",SchedulingDisabled");
    }
    let info = &node["status"]["nodeInfo"];
    let or_unknown = |v: &Value| v.as_str().filter(|s| !s.is_empty()).unwrap_or("<unknown>").to_owned();
    json!([
        text(&node["metadata"]["name"]),
        status,
        roles(node),
        age(&node["metadata"]["creationTimestamp"]),
        text(&info["kubeletVersion"]),
        node_address(node, "InternalIP"),
        node_address(node, "ExternalIP"),
        or_unknown(&info["osImage"]),
        or_unknown(&info["kernelVersion"]),
        or_unknown(&info["containerRuntimeVersion"]),
    ])
}

/// Roles from `node-role.kubernetes.io/<role>` label keys and the `kubernetes.io/role` label value.
fn roles(node: &Value) -> String {
    let labels = node.pointer("/metadata/labels").and_then(Value::as_object).into_iter().flatten();
    let roles: BTreeSet<&str> = labels
        .filter_map(|(k, v)| match k.strip_prefix("node-role.kubernetes.io/") {
            Some(role) => Some(role),
            None if k == "kubernetes.io/role" => v.as_str(),
            None => None,
        })
        .filter(|r| !r.is_empty())
        .collect();
    if roles.is_empty() { "<none>".into() } else { roles.into_iter().collect::<Vec<_>>().join(",") }
}

/// The first `status.addresses` entry of type `ty`, or `<none>`.
fn node_address(node: &Value, ty: &str) -> String {
    let addresses = node.pointer("/status/addresses").and_then(Value::as_array).into_iter().flatten();
    addresses.filter(|a| a["type"] == ty).find_map(|a| a["address"].as_str()).unwrap_or("<none>").to_owned()
}

fn endpoint_slice_cells(slice: &Value) -> Value {
    let list = |v: &Value| v.as_array().cloned().unwrap_or_default();
    let ports: Vec<String> = list(&slice["ports"])
        .iter()
        .map(|p| match (p["port"].as_i64(), p["name"].as_str()) {
            (Some(port), _) => port.to_string(),
            (None, Some(name)) => name.to_owned(),
            (None, None) => "*".to_owned(),
        })
        .collect();
    let endpoints = list(&slice["endpoints"]);
    let addresses: Vec<String> = endpoints.iter().flat_map(|e| list(&e["addresses"])).map(|a| text(&a)).collect();
    json!([
        text(&slice["metadata"]["name"]),
        text(&slice["addressType"]),
        at_most_three(&ports),
        at_most_three(&addresses),
        age(&slice["metadata"]["creationTimestamp"]),
    ])
}

/// kubectl's `listWithMoreString`: up to 3 items joined by `,`, then ` + N more...`; `<unset>` if empty.
fn at_most_three(items: &[String]) -> String {
    match items.len() {
        0 => "<unset>".into(),
        n if n > 3 => format!("{} + {} more...", items[..3].join(","), n - 3),
        _ => items.join(","),
    }
}

fn external_ip(svc: &Value, ty: &str) -> String {
    let ingress = svc.pointer("/status/loadBalancer/ingress").and_then(Value::as_array);
    let shown: Vec<&str> =
        ingress.into_iter().flatten().filter_map(|i| i["ip"].as_str().or_else(|| i["hostname"].as_str())).collect();
    match (shown.is_empty(), ty) {
        (false, _) => shown.join(","),
        (true, "LoadBalancer") => "<pending>".into(),
        _ => "<none>".into(),
    }
}

fn ports(spec: &Value) -> String {
    let list = spec["ports"].as_array().into_iter().flatten().map(|p| {
        let proto = p["protocol"].as_str().unwrap_or("TCP");
        match p["nodePort"].as_i64() {
            Some(node) => format!("{}:{node}/{proto}", p["port"]),
            None => format!("{}/{proto}", p["port"]),
        }
    });
    let joined: Vec<String> = list.collect();
    if joined.is_empty() { "<none>".into() } else { joined.join(",") }
}

fn selector(spec: &Value) -> String {
    let pairs = spec["selector"].as_object().into_iter().flatten();
    let joined: Vec<String> = pairs.map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default())).collect();
    if joined.is_empty() { "<none>".into() } else { joined.join(",") }
}

/// kubectl's short age (`45s`, `12m`, `5h`, `3d`), or `<unknown>`.
fn age(created: &Value) -> String {
    let Some(at) = created.as_str().and_then(|s| s.parse::<jiff::Timestamp>().ok()) else {
        return "<unknown>".into();
    };
    let secs = (jiff::Timestamp::now().as_second() - at.as_second()).max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_rows_show_external_ips_and_ports_as_kubectl_does() {
        let svc = json!({"metadata": {"name": "web", "namespace": "shop"},
            "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.10", "selector": {"app": "web"},
                     "ports": [{"port": 80, "nodePort": 30080, "protocol": "TCP"}, {"port": 53, "protocol": "UDP"}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.10", "ipMode": "VIP"}]}}});
        let pending = json!({"metadata": {"name": "cart"}, "spec": {"type": "LoadBalancer"}});
        let t = of(Resource::Services, &[svc, pending], 7);
        assert_eq!(
            t["rows"][0]["cells"],
            json!(["web", "LoadBalancer", "10.96.0.10", "192.0.2.10", "80:30080/TCP,53/UDP", "<unknown>", "app=web"])
        );
        assert_eq!(
            t["rows"][1]["cells"],
            json!(["cart", "LoadBalancer", "<none>", "<pending>", "<none>", "<unknown>", "<none>"])
        );
        assert_eq!(t["rows"][0]["object"]["metadata"]["namespace"], "shop");
    }

    #[test]
    fn node_rows_as_kubectl_prints_them() {
        let ready = |s: &str| json!({"type": "Ready", "status": s});
        let labels = json!({"node-role.kubernetes.io/worker": "", "node-role.kubernetes.io/edge": "x",
                            "kubernetes.io/role": "infra"});
        let node = json!({"metadata": {"name": "w1", "labels": labels},
            "spec": {"unschedulable": true},
            "status": {"conditions": [{"type": "MemoryPressure", "status": "False"}, ready("True")],
                       "addresses": [{"type": "Hostname", "address": "w1"},
                                     {"type": "InternalIP", "address": "10.0.0.1"}],
                       "nodeInfo": {"kubeletVersion": "v1.32.0", "osImage": "Ubuntu"}}});
        let t = of(
            Resource::Nodes,
            &[
                node,
                json!({"metadata": {"name": "w2"}, "status": {"conditions": [ready("Unknown")]}}),
                json!({"metadata": {"name": "w3"}}),
            ],
            9,
        );
        assert_eq!(
            t["rows"][0]["cells"],
            json!([
                "w1",
                "Ready,SchedulingDisabled",
                "edge,infra,worker",
                "<unknown>",
                "v1.32.0",
                "10.0.0.1",
                "<none>",
                "Ubuntu",
                "<unknown>",
                "<unknown>"
            ])
        );
        assert_eq!((&t["rows"][1]["cells"][1], &t["rows"][1]["cells"][2]), (&json!("NotReady"), &json!("<none>")));
        assert_eq!(t["rows"][2]["cells"][1], "Unknown");
        assert_eq!(t["columnDefinitions"][4]["name"], "Version");
        assert_eq!(t["metadata"]["resourceVersion"], "9");
    }

    #[test]
    fn endpoint_slice_rows_cap_at_three() {
        let ep = |a: &str| json!({"addresses": [a]});
        let slice = json!({"metadata": {"name": "web-abc", "namespace": "shop"}, "addressType": "IPv4",
            "ports": [{"port": 80}, {"name": "dns"}, {}, {"port": 8443}],
            "endpoints": [ep("10.0.0.1"), ep("10.0.0.2"), ep("10.0.0.3"), ep("10.0.0.4"), ep("10.0.0.5")]});
        let t =
            of(Resource::EndpointSlices, &[slice, json!({"metadata": {"name": "empty"}, "addressType": "IPv6"})], 3);
        assert_eq!(
            t["rows"][0]["cells"],
            json!(["web-abc", "IPv4", "80,dns,* + 1 more...", "10.0.0.1,10.0.0.2,10.0.0.3 + 2 more...", "<unknown>"])
        );
        assert_eq!(t["rows"][1]["cells"], json!(["empty", "IPv6", "<unset>", "<unset>", "<unknown>"]));
        assert_eq!(t["rows"][0]["object"]["metadata"]["namespace"], "shop");
    }
}
