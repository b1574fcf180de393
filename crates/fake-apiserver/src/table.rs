//! Server-side printing: kubectl asks for `Accept: application/json;as=Table;v=v1;g=meta.k8s.io` and
//! shows the columns the server returns (a real apiserver's Service columns: NAME, TYPE, CLUSTER-IP,
//! EXTERNAL-IP, PORT(S), AGE, SELECTOR with `-o wide`); without it kubectl falls back to NAME and AGE.

use axum::http::HeaderMap;
use axum::http::header::ACCEPT;
use serde_json::{Value, json};

/// Whether the client asked for a `meta.k8s.io/v1` Table.
pub(crate) fn wanted(headers: &HeaderMap) -> bool {
    headers.get(ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(|a| a.contains("as=Table"))
}

/// The Table of `services` at resourceVersion `rv`.
pub(crate) fn services(services: &[Value], rv: u64) -> Value {
    let column = |name: &str, priority: u8| {
        json!({"name": name, "type": "string", "format": if name == "Name" { "name" } else { "" },
               "description": "", "priority": priority})
    };
    let columns = [
        column("Name", 0),
        column("Type", 0),
        column("Cluster-IP", 0),
        column("External-IP", 0),
        column("Port(s)", 0),
        column("Age", 0),
        column("Selector", 1),
    ];
    let rows: Vec<Value> = services.iter().map(row).collect();
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": rv.to_string()},
           "columnDefinitions": columns, "rows": rows})
}

fn row(svc: &Value) -> Value {
    let spec = &svc["spec"];
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    let ty = spec["type"].as_str().unwrap_or("ClusterIP");
    let cells = json!([
        text(&svc["metadata"]["name"]),
        ty,
        spec["clusterIP"].as_str().unwrap_or("<none>"),
        external_ip(svc, ty),
        ports(spec),
        age(&svc["metadata"]["creationTimestamp"]),
        selector(spec),
    ]);
    let object = json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": svc["metadata"]});
    json!({"cells": cells, "object": object})
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
        let t = services(&[svc, pending], 7);
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
}
