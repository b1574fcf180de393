//! Member computation over realistic Nodes and EndpointSlices.

use serde_json::{Value, json};
use vipwatch_contract::{BackendMode, HealthCheckScope, MemberState};

use super::*;
use crate::model::{ServiceKey, ServiceView};

fn rules() -> MemberRules {
    MemberRules {
        address_types: ADDRESS_TYPES.iter().map(|t| t.to_string()).collect(),
        local_endpoints_only: false,
        kube_proxy_health_port: 10256,
    }
}

fn key() -> ServiceKey {
    ServiceKey::new("shop", "web")
}

fn service(spec: Value) -> ServiceView {
    let mut svc = json!({"metadata": {"name": "web", "namespace": "shop"}, "spec": {"type": "LoadBalancer"}});
    for (k, v) in spec.as_object().unwrap() {
        svc["spec"][k] = v.clone();
    }
    ServiceView::from_service(&serde_json::from_value(svc).unwrap())
}

fn node(name: &str, addresses: &[&str], labels: Value) -> (String, NodeView) {
    let addresses: Vec<Value> = addresses.iter().map(|a| json!({"type": "InternalIP", "address": a})).collect();
    let n = json!({"metadata": {"name": name, "labels": labels}, "status": {"addresses": addresses}});
    let o = ObservedNode::from_node(&serde_json::from_value(n).unwrap());
    (o.name, o.view)
}

fn slice(name: &str, family: &str, ports: Value, endpoints: Value) -> ObservedSlice {
    let s = json!({"metadata": {"name": name, "namespace": "shop", "labels": {SERVICE_NAME_LABEL: "web"}},
        "addressType": family, "ports": ports, "endpoints": endpoints});
    ObservedSlice::from_slice(&serde_json::from_value(s).unwrap())
}

fn ep(address: &str, node: &str, ready: bool, terminating: bool) -> Value {
    json!({"addresses": [address], "nodeName": node, "zone": "z1",
           "conditions": {"ready": ready, "serving": true, "terminating": terminating}})
}

fn addresses(b: &vipwatch_contract::Backends, port: usize) -> Vec<(String, i32, MemberState)> {
    b.ports[port].members.iter().map(|m| (m.address.to_string(), m.port, m.state)).collect()
}

#[test]
fn node_port_members_are_eligible_nodes_times_node_ports_in_numeric_order() {
    let mut index = BackendIndex::default();
    index.replace_nodes(vec![
        node("w10", &["10.0.0.10"], json!({})),
        node("w2", &["10.0.0.2"], json!({})),
        node("w3", &["10.0.0.3"], json!({EXCLUDE_LABEL: "true"})),
    ]);
    let view = service(json!({"ports": [{"name": "http", "port": 80, "nodePort": 30080},
                                        {"name": "https", "port": 443, "nodePort": 30443}]}));
    let b = compute(&key(), &view, BackendMode::NodePort, &rules(), &index);
    let active = MemberState::Active;
    assert_eq!(addresses(&b, 0), vec![("10.0.0.2".into(), 30080, active), ("10.0.0.10".into(), 30080, active)]);
    assert_eq!(addresses(&b, 1), vec![("10.0.0.2".into(), 30443, active), ("10.0.0.10".into(), 30443, active)]);
    let hc = b.health_check.unwrap();
    assert_eq!((hc.port, hc.path.as_str(), hc.scope), (10256, "/healthz", HealthCheckScope::Node));
    assert_eq!(b.reason, None);
    assert_eq!(b.ports[0].members[0].node_name.as_deref(), Some("w2"));
}

#[test]
fn etp_local_hints_the_health_check_node_port_and_can_keep_only_nodes_with_endpoints() {
    let mut index = BackendIndex::default();
    index.replace_nodes(vec![
        node("w1", &["10.0.0.1"], json!({})),
        node("w2", &["10.0.0.2"], json!({})),
        node("w3", &["10.0.0.3"], json!({})),
    ]);
    let ports = json!([{"name": "http", "protocol": "TCP", "port": 8080}]);
    let endpoints = json!([
        ep("10.244.1.5", "w1", true, false),
        ep("10.244.2.5", "w2", false, true),
        ep("10.244.1.6", "w1", false, true)
    ]);
    index.set_slice(slice("web-a", "IPv4", ports, endpoints));
    let view = service(json!({"externalTrafficPolicy": "Local", "healthCheckNodePort": 31888,
        "ports": [{"name": "http", "port": 80, "nodePort": 30080}]}));
    let all = compute(&key(), &view, BackendMode::NodePort, &rules(), &index);
    assert_eq!(all.ports[0].members.len(), 3, "every eligible Node; the health check decides");
    let hc = all.health_check.clone().unwrap();
    assert_eq!((hc.port, hc.scope), (31888, HealthCheckScope::Service));
    let filtered =
        compute(&key(), &view, BackendMode::NodePort, &MemberRules { local_endpoints_only: true, ..rules() }, &index);
    assert_eq!(
        addresses(&filtered, 0),
        vec![("10.0.0.1".into(), 30080, MemberState::Active), ("10.0.0.2".into(), 30080, MemberState::Draining)]
    );
    assert_ne!(all.hash, filtered.hash);
}

#[test]
fn without_node_ports_there_are_no_members_and_the_reason_says_why() {
    let mut index = BackendIndex::default();
    index.replace_nodes(vec![node("w1", &["10.0.0.1"], json!({}))]);
    let view = service(json!({"allocateLoadBalancerNodePorts": false, "ports": [{"port": 80}]}));
    let b = compute(&key(), &view, BackendMode::NodePort, &rules(), &index);
    assert_eq!(b.ports[0].members, vec![]);
    assert_eq!(
        b.reason.as_deref(),
        Some("allocateLoadBalancerNodePorts is false: the Service has no nodePort to send traffic to")
    );
}

#[test]
fn dual_stack_takes_the_primary_address_of_each_family() {
    let mut index = BackendIndex::default();
    index.replace_nodes(vec![node("w1", &["10.0.0.1", "fd00::1", "10.0.0.9"], json!({}))]);
    let dual = service(json!({"ipFamilies": ["IPv6", "IPv4"], "ports": [{"port": 80, "nodePort": 30080}]}));
    let b = compute(&key(), &dual, BackendMode::NodePort, &rules(), &index);
    let got: Vec<String> = b.ports[0].members.iter().map(|m| m.address.to_string()).collect();
    assert_eq!(got, vec!["10.0.0.1", "fd00::1"]);
    let v6 = service(json!({"ipFamilies": ["IPv6"], "ports": [{"port": 80, "nodePort": 30080}]}));
    let b = compute(&key(), &v6, BackendMode::NodePort, &rules(), &index);
    assert_eq!(b.ports[0].members.iter().map(|m| m.address.as_str()).collect::<Vec<_>>(), vec!["fd00::1"]);
}

#[test]
fn pod_members_join_slices_dedupe_and_take_the_port_from_each_slice() {
    let mut index = BackendIndex::default();
    let http = |port: i32| json!([{"name": "http", "protocol": "TCP", "port": port}]);
    // The same endpoint in two slices (a move in flight) is one member; the ready copy wins.
    index.set_slice(slice("web-a", "IPv4", http(8080), json!([ep("10.244.1.5", "w1", true, false)])));
    index.set_slice(slice("web-b", "IPv4", http(8080), json!([ep("10.244.1.5", "w1", false, true)])));
    // A named targetPort resolving to another number on other Pods puts them in another slice.
    index.set_slice(slice("web-c", "IPv4", http(9090), json!([ep("10.244.2.7", "w2", true, false)])));
    index.set_slice(slice("web-v6", "IPv6", http(8080), json!([ep("fd00::7", "w2", true, false)])));
    let view = service(json!({"ports": [{"name": "http", "port": 80, "targetPort": "web"}]}));
    let b = compute(&key(), &view, BackendMode::Pod, &rules(), &index);
    let active = MemberState::Active;
    assert_eq!(addresses(&b, 0), vec![("10.244.1.5".into(), 8080, active), ("10.244.2.7".into(), 9090, active)]);
    assert_eq!(b.health_check, None);
    let dual = service(json!({"ipFamilies": ["IPv4", "IPv6"], "ports": [{"name": "http", "port": 80}]}));
    let b = compute(&key(), &dual, BackendMode::Pod, &rules(), &index);
    assert_eq!(b.ports[0].members.len(), 3);
    assert_eq!(b.ports[0].members[2].address, "fd00::7");
}

#[test]
fn slice_order_does_not_change_members_or_hash() {
    let http = json!([{"name": "http", "protocol": "TCP", "port": 8080}]);
    let a = slice(
        "web-a",
        "IPv4",
        http.clone(),
        json!([ep("10.244.1.9", "w1", true, false), ep("10.244.1.10", "w1", true, false)]),
    );
    let b = slice("web-b", "IPv4", http, json!([ep("10.244.1.2", "w2", true, false)]));
    let view = service(json!({"ports": [{"name": "http", "port": 80}]}));
    let mut one = BackendIndex::default();
    one.set_slice(a.clone());
    one.set_slice(b.clone());
    let mut two = BackendIndex::default();
    two.set_slice(b);
    two.set_slice(a);
    let (x, y) = (
        compute(&key(), &view, BackendMode::Pod, &rules(), &one),
        compute(&key(), &view, BackendMode::Pod, &rules(), &two),
    );
    assert_eq!(x, y);
    let got: Vec<&str> = x.ports[0].members.iter().map(|m| m.address.as_str()).collect();
    assert_eq!(got, vec!["10.244.1.2", "10.244.1.9", "10.244.1.10"]);
    assert!(x.hash.starts_with("sha256:") && x.hash.len() == 71, "{}", x.hash);
}

#[test]
fn revisions_move_only_with_the_hash_and_diffs_name_the_members() {
    let mut index = BackendIndex::default();
    let http = json!([{"name": "http", "protocol": "TCP", "port": 8080}]);
    index.set_slice(slice(
        "web-a",
        "IPv4",
        http.clone(),
        json!([ep("10.244.1.5", "w1", true, false), ep("10.244.1.6", "w1", true, false)]),
    ));
    let view = service(json!({"ports": [{"name": "http", "port": 80}]}));
    let modes = [BackendMode::Pod];
    let first = compute_sets(&key(), &view, &modes, &rules(), &index, &BackendSets::new());
    assert_eq!(first[&BackendMode::Pod].revision, 1);
    let same = compute_sets(&key(), &view, &modes, &rules(), &index, &first);
    assert_eq!(same, first);
    assert!(diffs(&first, &same).is_empty() && !changed(&first, &same));
    index.set_slice(slice(
        "web-a",
        "IPv4",
        http,
        json!([ep("10.244.1.5", "w1", false, true), ep("10.244.1.7", "w1", true, false)]),
    ));
    let next = compute_sets(&key(), &view, &modes, &rules(), &index, &first);
    assert_eq!(next[&BackendMode::Pod].revision, 2);
    let d = &diffs(&first, &next)[&BackendMode::Pod];
    let names =
        |l: &[vipwatch_contract::MemberChange]| l.iter().map(|c| (c.address.clone(), c.state)).collect::<Vec<_>>();
    assert_eq!((d.from_revision, d.to_revision), (1, 2));
    assert_eq!(names(&d.added), vec![("10.244.1.7".into(), MemberState::Active)]);
    assert_eq!(names(&d.removed), vec![("10.244.1.6".into(), MemberState::Active)]);
    assert_eq!(names(&d.changed), vec![("10.244.1.5".into(), MemberState::Draining)]);
}

#[test]
fn revisions_grow_across_modes_so_a_mode_switch_never_goes_back() {
    let mut index = BackendIndex::default();
    let http = json!([{"name": "http", "protocol": "TCP", "port": 8080}]);
    index.set_slice(slice("web-a", "IPv4", http.clone(), json!([ep("10.244.1.5", "w1", true, false)])));
    let view = service(json!({"ports": [{"name": "http", "port": 80}]}));
    let mut current = compute_sets(&key(), &view, &[BackendMode::Pod], &rules(), &index, &BackendSets::new());
    current.get_mut(&BackendMode::Pod).unwrap().revision = 7;
    let both = [BackendMode::NodePort, BackendMode::Pod];
    let added = compute_sets(&key(), &view, &both, &rules(), &index, &current);
    assert_eq!((added[&BackendMode::NodePort].revision, added[&BackendMode::Pod].revision), (8, 7));
    index.set_slice(slice("web-a", "IPv4", http, json!([ep("10.244.1.6", "w1", true, false)])));
    let moved = compute_sets(&key(), &view, &both, &rules(), &index, &added);
    assert_eq!((moved[&BackendMode::NodePort].revision, moved[&BackendMode::Pod].revision), (8, 9));
}

#[test]
fn the_annotation_beats_the_endpoint_which_beats_the_global_mode() {
    let plan = ModePlan {
        global: ModeSetting::NodePort,
        endpoints: [("f5".to_owned(), ModeSetting::Pod)].into_iter().collect(),
    };
    let plain = service(json!({}));
    assert_eq!(plan.mode_for(&plain, "haproxy"), Some(BackendMode::NodePort));
    assert_eq!(plan.mode_for(&plain, "f5"), Some(BackendMode::Pod));
    assert_eq!(plan.modes_for(&plain), vec![BackendMode::NodePort, BackendMode::Pod]);
    let mut annotated = plain.clone();
    annotated.annotations.insert(MODE_ANNOTATION.into(), "none".into());
    assert_eq!(plan.mode_for(&annotated, "f5"), None);
    assert_eq!(plan.modes_for(&annotated), vec![]);
    annotated.annotations.insert(MODE_ANNOTATION.into(), "podz".into());
    assert_eq!(super::annotated(&annotated), Err("podz"));
    assert_eq!(plan.mode_for(&annotated, "f5"), Some(BackendMode::Pod), "an invalid value is ignored");
}

#[test]
fn member_sets_serialize_as_an_object_keyed_by_mode_even_when_empty_and_read_back() {
    #[derive(serde::Serialize)]
    struct Row {
        #[serde(serialize_with = "vipwatch_contract::object")]
        backends: BackendSets,
    }
    let empty = serde_json::to_value(Row { backends: BackendSets::new() }).unwrap();
    assert_eq!(empty, json!({"backends": {}}));
    assert_eq!(serde_json::from_value::<BackendSets>(empty["backends"].clone()).unwrap(), BackendSets::new());

    let mut index = BackendIndex::default();
    let http = json!([{"name": "http", "protocol": "TCP", "port": 8080}]);
    index.set_slice(slice("web-a", "IPv4", http, json!([ep("10.244.1.5", "w1", true, false)])));
    let view = service(json!({"ports": [{"name": "http", "port": 80}]}));
    let both = [BackendMode::Pod, BackendMode::NodePort];
    let sets = compute_sets(&key(), &view, &both, &rules(), &index, &BackendSets::new());
    let written = serde_json::to_value(Row { backends: sets.clone() }).unwrap();
    let modes: Vec<&String> = written["backends"].as_object().unwrap().keys().collect();
    assert_eq!(modes, vec!["nodePort", "pod"]);
    assert_eq!(written["backends"]["pod"]["ports"][0]["members"][0]["address"], json!("10.244.1.5"));
    assert_eq!(serde_json::from_value::<BackendSets>(written["backends"].clone()).unwrap(), sets);
}

/// Member sets hold exactly their modes, in mode order, whether computed or read back and shrunk
/// (the mirror keeps one per Service); a mode given twice is there once.
#[test]
fn member_sets_hold_exactly_their_modes() {
    let index = BackendIndex::default();
    let view = service(json!({"ports": [{"name": "http", "port": 80, "nodePort": 30080}]}));
    let one = compute_sets(&key(), &view, &[BackendMode::NodePort], &rules(), &index, &BackendSets::new());
    let json = serde_json::to_string(&one).unwrap();
    assert_eq!(one.into_tuple_vec().capacity(), 1);

    let read: BackendSets = serde_json::from_str(&json).unwrap();
    assert_eq!(super::shrink(read).into_tuple_vec().capacity(), 1);

    let modes = [BackendMode::Pod, BackendMode::NodePort, BackendMode::Pod];
    let sets = compute_sets(&key(), &view, &modes, &rules(), &index, &BackendSets::new());
    let sets = sets.into_tuple_vec();
    let order: Vec<BackendMode> = sets.iter().map(|(mode, _)| *mode).collect();
    assert_eq!((order, sets.capacity()), (vec![BackendMode::NodePort, BackendMode::Pod], 2));
}
