//! The Services the demo's simulated cluster starts with, and the one its script creates and deletes.

use serde_json::{Value, json};

/// The annotation through which a Service requests its VIPs.
pub const REQUESTED_IPS: &str = "vipwatch.io/loadBalancerIPs";

/// The seeded cluster: four `LoadBalancer` Services in `shop` and `payments` (one requesting its VIP
/// by annotation, one with a published ingress address, two still without a VIP) and the
/// `default/kubernetes` ClusterIP Service every cluster has, which is out of scope.
pub fn seed() -> Vec<Value> {
    let mut services = vec![
        with_annotation(lb("shop", "web", &[("http", 80), ("https", 443)]), REQUESTED_IPS, "192.0.2.10"),
        lb("shop", "cart", &[("http", 8080)]),
        with_ingress(lb("payments", "api", &[("https", 443), ("grpc", 9443)]), "192.0.2.20"),
        lb("payments", "gateway", &[("https", 443)]),
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "kubernetes", "namespace": "default", "labels": {"component": "apiserver"}},
               "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.1",
                        "ports": [{"name": "https", "protocol": "TCP", "port": 443, "targetPort": 6443}]}}),
    ];
    // Distinct node ports, as a cluster allocates them (31000 up; the scripted Service's are below).
    let node_ports = services.iter_mut().flat_map(|s| s["spec"]["ports"].as_array_mut().into_iter().flatten());
    for (i, port) in node_ports.filter(|p| p.get("nodePort").is_some()).enumerate() {
        port["nodePort"] = json!(31000 + i as i64);
    }
    services
}

/// A `LoadBalancer` Service `namespace/name` selecting `app: name`, one TCP port per `(name, port)`,
/// each to target port 8080 with a node port.
pub fn lb(namespace: &str, name: &str, ports: &[(&str, i64)]) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
        "spec": {"type": "LoadBalancer", "selector": {"app": name}, "externalTrafficPolicy": "Cluster",
                 "ports": ports.iter().map(|&(port_name, port)| port_json(port_name, port)).collect::<Vec<_>>()}
    })
}

/// One TCP port entry `port` → 8080 with a node port derived from `port`.
pub fn port_json(name: &str, port: i64) -> Value {
    json!({"name": name, "protocol": "TCP", "port": port, "targetPort": 8080, "nodePort": 30000 + port % 2768})
}

fn with_annotation(mut svc: Value, key: &str, value: &str) -> Value {
    svc["metadata"]["annotations"] = json!({ key: value });
    svc
}

fn with_ingress(mut svc: Value, ip: &str) -> Value {
    svc["status"] = json!({"loadBalancer": {"ingress": [{"ip": ip, "ipMode": "VIP"}]}});
    svc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ports_stay_in_the_default_node_port_range() {
        for port in [80, 443, 8080, 9443, 65535] {
            let node_port = port_json("p", port)["nodePort"].as_i64().unwrap();
            assert!((30000..=32767).contains(&node_port), "{port} → {node_port}");
        }
    }

    #[test]
    fn seeded_node_ports_are_distinct() {
        let ports: Vec<i64> = seed()
            .iter()
            .flat_map(|s| s["spec"]["ports"].as_array().cloned().unwrap_or_default())
            .filter_map(|p| p["nodePort"].as_i64())
            .collect();
        assert_eq!(ports, vec![31000, 31001, 31002, 31003, 31004, 31005]);
    }

    #[test]
    fn the_seed_has_four_load_balancers_in_two_namespaces() {
        let lbs: Vec<String> = seed()
            .iter()
            .filter(|s| s["spec"]["type"] == "LoadBalancer")
            .map(|s| {
                format!("{}/{}", s["metadata"]["namespace"].as_str().unwrap(), s["metadata"]["name"].as_str().unwrap())
            })
            .collect();
        assert_eq!(lbs, ["shop/web", "shop/cart", "payments/api", "payments/gateway"]);
    }
}
