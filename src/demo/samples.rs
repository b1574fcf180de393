//! The objects the demo's simulated cluster starts with (Services, Nodes, EndpointSlices), and the
//! ones its script writes.

use serde_json::{Value, json};

use crate::model::backends::{EXCLUDE_LABEL, MODE_ANNOTATION, SERVICE_NAME_LABEL, ZONE_LABEL};

/// The annotation through which a Service requests its VIPs.
pub const REQUESTED_IPS: &str = "vipwatch.io/loadBalancerIPs";

/// The Nodes of the simulated cluster: `(name, InternalIP, zone)`.
pub const NODES: [(&str, &str, &str); 3] =
    [("w1", "10.0.0.11", "zone-a"), ("w2", "10.0.0.12", "zone-a"), ("w3", "10.0.0.13", "zone-b")];

/// The seeded cluster: four `LoadBalancer` Services in `shop` and `payments` (one requesting its VIP
/// by annotation, one with a published ingress address, two still without a VIP; `shop/web` sends
/// its Pods as members, the others their Nodes' nodePorts), the `default/kubernetes` ClusterIP Service
/// every cluster has (out of scope), three Nodes, and an EndpointSlice with two ready Pods per
/// Service.
pub fn seed() -> Vec<Value> {
    let web = with_annotation(lb("shop", "web", &[("http", 8080), ("https", 8443)]), REQUESTED_IPS, "127.0.100.10");
    let mut services = vec![
        with_annotation(web, MODE_ANNOTATION, "pod"),
        lb("shop", "cart", &[("http", 8080)]),
        with_ingress(lb("payments", "api", &[("https", 8443), ("grpc", 9443)]), "127.0.100.20"),
        lb("payments", "gateway", &[("https", 8443)]),
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
    let slices: Vec<Value> = services
        .iter()
        .filter(|s| s["spec"]["type"] == "LoadBalancer")
        .enumerate()
        .map(|(i, s)| pods(s, 1, &[(i as u8 * 10 + 1, "w1", Pod::Ready), (i as u8 * 10 + 2, "w2", Pod::Ready)]))
        .collect();
    let nodes = NODES.iter().map(|(name, ip, zone)| node(name, ip, zone, false));
    nodes.chain(services).chain(slices).collect()
}

/// A Pod's state in an EndpointSlice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pod {
    /// Not ready yet (starting).
    Starting,
    /// Ready.
    Ready,
    /// Terminating but still serving (draining).
    Draining,
}

/// The EndpointSlice of Service `svc` (its only one, `<name>-demo`) holding Pods `127.0.<rack>.<host>`
/// `(host, node, state)` with every port of the Service on target port 8080 (where the demo's pods
/// listen: every loopback address is local).
pub fn pods(svc: &Value, rack: u8, pods: &[(u8, &str, Pod)]) -> Value {
    let (ns, name) = (svc["metadata"]["namespace"].as_str().unwrap(), svc["metadata"]["name"].as_str().unwrap());
    let ports: Vec<Value> = svc["spec"]["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| json!({"name": p["name"], "protocol": "TCP", "port": 8080}))
        .collect();
    let endpoints: Vec<Value> = pods
        .iter()
        .map(|(host, node, state)| {
            let (ready, terminating) = (*state == Pod::Ready, *state == Pod::Draining);
            json!({"addresses": [pod_ip(rack, *host).to_string()], "nodeName": node,
                   "conditions": {"ready": ready, "serving": ready || terminating, "terminating": terminating}})
        })
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{name}-demo"), "namespace": ns, "labels": {SERVICE_NAME_LABEL: name}},
        "addressType": "IPv4", "ports": ports, "endpoints": endpoints})
}

/// The address of pod `host` in `rack`: `127.0.<rack>.<host>`.
pub fn pod_ip(rack: u8, host: u8) -> std::net::IpAddr {
    std::net::IpAddr::V4(std::net::Ipv4Addr::new(127, 0, rack, host))
}

/// Every pod address of a seed's EndpointSlices, with its Service (`namespace/name`).
pub fn pod_addresses(objects: &[Value]) -> Vec<(std::net::IpAddr, String)> {
    let slices = objects.iter().filter(|o| o["kind"] == "EndpointSlice");
    slices
        .flat_map(|s| {
            let owner = format!(
                "{}/{}",
                s["metadata"]["namespace"].as_str().unwrap_or(""),
                s["metadata"]["labels"][SERVICE_NAME_LABEL].as_str().unwrap_or("")
            );
            let ips: Vec<_> = s["endpoints"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|e| e["addresses"][0].as_str()?.parse().ok())
                .collect();
            ips.into_iter().map(move |ip| (ip, owner.clone()))
        })
        .collect()
}

/// A Ready Node with one InternalIP in `zone`, labelled out of load balancers when `excluded`.
pub fn node(name: &str, ip: &str, zone: &str, excluded: bool) -> Value {
    let mut labels = json!({ ZONE_LABEL: zone, "kubernetes.io/hostname": name });
    if excluded {
        labels[EXCLUDE_LABEL] = json!("true");
    }
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
        "status": {"addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}],
                   "conditions": [{"type": "Ready", "status": "True"}]}})
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
    svc["metadata"]["annotations"][key] = json!(value);
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
            .filter(|o| o["kind"] == "Service")
            .flat_map(|s| s["spec"]["ports"].as_array().cloned().unwrap_or_default())
            .filter_map(|p| p["nodePort"].as_i64())
            .collect();
        assert_eq!(ports, vec![31000, 31001, 31002, 31003, 31004, 31005]);
    }

    #[test]
    fn the_seed_has_four_load_balancers_in_two_namespaces() {
        let lbs: Vec<String> = seed()
            .iter()
            .filter(|s| s["kind"] == "Service" && s["spec"]["type"] == "LoadBalancer")
            .map(|s| {
                format!("{}/{}", s["metadata"]["namespace"].as_str().unwrap(), s["metadata"]["name"].as_str().unwrap())
            })
            .collect();
        assert_eq!(lbs, ["shop/web", "shop/cart", "payments/api", "payments/gateway"]);
    }
}
