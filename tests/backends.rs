//! Pool members over real sockets: the fake apiserver serving Nodes and EndpointSlices as Kubernetes
//! writes them, vipwatch on a real SQLite file, a real receiver. Rolling updates, Node flaps, the
//! exclusion label, restarts, and what the payload and the API say.

mod common;

use std::time::Duration;

use common::api::Api;
use common::receiver::{Hit, Receiver};
use common::*;
use serde_json::{Value, json};
use vipwatch::fake_apiserver::{FakeApiServer, Resource};
use vipwatch::model::backends::{EXCLUDE_LABEL, MODE_ANNOTATION, SERVICE_NAME_LABEL};

/// A Node with one InternalIP, Ready, in zone `z1`.
fn node(name: &str, ip: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": "z1"}},
        "status": {"addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}],
                   "conditions": [{"type": "Ready", "status": "True"}]}})
}

/// An EndpointSlice `name` of Service `shop/svc` with port `http` → `port` and `endpoints`.
fn slice(svc: &str, name: &str, family: &str, port: i64, endpoints: Vec<Value>) -> Value {
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "shop", "labels": {SERVICE_NAME_LABEL: svc,
            "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
        "addressType": family, "ports": [{"name": "http", "protocol": "TCP", "port": port}], "endpoints": endpoints})
}

/// One endpoint on Node `w1` with the given conditions.
fn endpoint(ip: &str, ready: bool, serving: bool, terminating: bool) -> Value {
    json!({"addresses": [ip], "nodeName": "w1", "zone": "z1",
        "conditions": {"ready": ready, "serving": serving, "terminating": terminating}})
}

/// `lb_service` in mode `pod` (by annotation).
fn pod_service(name: &str, port: i64) -> Value {
    let mut svc = lb_service("shop", name, port);
    svc["metadata"]["annotations"] = json!({ MODE_ANNOTATION: "pod" });
    svc
}

/// `(event, changed)` of the deliveries `rx` accepted for Service `name`.
fn deliveries_of(rx: &Receiver, name: &str) -> Vec<(String, Vec<String>)> {
    rx.accepted()
        .iter()
        .map(Hit::json)
        .filter(|v| v["data"]["service"]["name"] == name)
        .map(|v| {
            let changed = v["data"]["changed"].as_array().unwrap().iter().map(|c| s(c.as_str().unwrap())).collect();
            (s(v["data"]["event"].as_str().unwrap()), changed)
        })
        .collect()
}

/// The last `data.service.backends` delivered for Service `name`.
fn last_backends(rx: &Receiver, name: &str) -> Value {
    let hits: Vec<Value> =
        rx.accepted().iter().map(Hit::json).filter(|v| v["data"]["service"]["name"] == name).collect();
    hits.last().expect("a delivery").pointer("/data/service/backends").cloned().unwrap()
}

/// `address:port/state` of every member of the first port of `backends`.
fn members(backends: &Value) -> Vec<String> {
    backends["ports"][0]["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| format!("{}:{}/{}", m["address"].as_str().unwrap(), m["port"], m["state"].as_str().unwrap()))
        .collect()
}

fn seed_nodes(api: &FakeApiServer, n: usize) {
    for i in 1..=n {
        api.apply_resource(Resource::Nodes, node(&format!("w{i}"), &format!("10.0.0.{i}")));
    }
}

#[tokio::test]
async fn a_rolling_update_is_a_few_coalesced_modifieds_in_pod_mode_and_none_in_node_port_mode() {
    let h = Harness::new().await;
    seed_nodes(&h.api, 3);
    h.api.apply(pod_service("web", 80));
    h.api.apply(lb_service("shop", "np", 81));
    let old: Vec<String> = (1..=100).map(|i| format!("10.244.1.{i}")).collect();
    let ready = |ips: &[String]| ips.iter().map(|ip| endpoint(ip, true, true, false)).collect::<Vec<_>>();
    h.api.apply_resource(Resource::EndpointSlices, slice("web", "web-abc", "IPv4", 8080, ready(&old)));
    h.api.apply_resource(Resource::EndpointSlices, slice("np", "np-abc", "IPv4", 8080, ready(&old)));
    let rx = Receiver::ok().await;
    let vw = h.start(h.config_with(vec![webhook("lab", &rx.url)])).await;
    wait_until("both ADDEDs", || async { (rx.accepted().len() == 2).then_some(()) }).await;
    assert_eq!(members(&last_backends(&rx, "web")).len(), 100);

    // 100 Pods replaced 25 at a time (maxSurge 25%, maxUnavailable 25%), as the EndpointSlice controller
    // writes it: a new endpoint not ready, then ready; an old one terminating but serving, then gone.
    // 4 writes per Pod, 400 per Service, paced like a fast rollout (about 2 s).
    let new: Vec<String> = (1..=100).map(|i| format!("10.244.2.{i}")).collect();
    let mut endpoints: Vec<(String, Value)> =
        old.iter().map(|ip| (ip.clone(), endpoint(ip, true, true, false))).collect();
    let mut writes = 0;
    for batch in 0..4 {
        let (olds, news) = (&old[batch * 25..batch * 25 + 25], &new[batch * 25..batch * 25 + 25]);
        let steps: [(&[String], Option<Value>); 4] = [
            (news, Some(json!([false, false, false]))),
            (news, Some(json!([true, true, false]))),
            (olds, Some(json!([false, true, true]))),
            (olds, None),
        ];
        for (ips, conditions) in steps {
            for ip in ips {
                endpoints.retain(|(e, _)| e != ip);
                if let Some(c) = &conditions {
                    let c = c.as_array().unwrap();
                    let e = endpoint(ip, c[0].as_bool().unwrap(), c[1].as_bool().unwrap(), c[2].as_bool().unwrap());
                    endpoints.push((ip.clone(), e));
                }
                let list: Vec<Value> = endpoints.iter().map(|(_, e)| e.clone()).collect();
                h.api.apply_resource(Resource::EndpointSlices, slice("web", "web-abc", "IPv4", 8080, list.clone()));
                h.api.apply_resource(Resource::EndpointSlices, slice("np", "np-abc", "IPv4", 8080, list));
                writes += 1;
                tokio::time::sleep(Duration::from_millis(5)).await; // ok: paces the scripted rollout, not a wait
            }
        }
    }
    assert_eq!(writes, 400);
    let want: Vec<String> = new.iter().map(|ip| format!("{ip}:8080/active")).collect();
    let mut want_sorted: Vec<(std::net::IpAddr, String)> =
        new.iter().zip(&want).map(|(ip, w)| (ip.parse().unwrap(), w.clone())).collect();
    want_sorted.sort();
    let want: Vec<String> = want_sorted.into_iter().map(|(_, w)| w).collect();
    wait_until("the final member set delivered", || async {
        (members(&last_backends(&rx, "web")) == want).then_some(())
    })
    .await;
    let web = deliveries_of(&rx, "web");
    let modified = web.iter().filter(|(e, _)| e == "MODIFIED").count();
    assert!((1..=30).contains(&modified), "{modified} MODIFIEDs for 400 slice writes");
    assert!(web[1..].iter().all(|(e, c)| e == "MODIFIED" && c == &[s("backends")]), "{web:?}");
    assert_eq!(deliveries_of(&rx, "np"), vec![(s("ADDED"), vec![])], "nodePort members do not follow Pods");
    let events = vw.store.events(&Default::default()).await.unwrap();
    assert!(events.iter().filter(|e| e.event_type == "MODIFIED").all(|e| e.cause == "backends"));
    vw.stop().await.unwrap();
}

#[tokio::test]
async fn node_flaps_record_nothing_and_the_exclusion_label_is_one_modified_per_service() {
    let h = Harness::new().await;
    seed_nodes(&h.api, 3);
    h.api.apply(lb_service("shop", "a", 80));
    h.api.apply(lb_service("shop", "b", 81));
    let rx = Receiver::ok().await;
    let vw = h.start(h.config_with(vec![webhook("lab", &rx.url)])).await;
    wait_until("both ADDEDs", || async { (rx.accepted().len() == 2).then_some(()) }).await;
    assert_eq!(
        members(&last_backends(&rx, "a")),
        ["10.0.0.1:30080/active", "10.0.0.2:30080/active", "10.0.0.3:30080/active"]
    );

    for i in 0..20 {
        let status = if i % 2 == 0 { "False" } else { "True" };
        h.api.update_resource(Resource::Nodes, "", "w2", |n| {
            n["status"]["conditions"] = json!([{"type": "Ready", "status": status, "lastHeartbeatTime": format!("2026-12-01T00:00:{i:02}Z")}]);
        });
    }
    h.api.update_resource(Resource::Nodes, "", "w3", |n| n["metadata"]["labels"][EXCLUDE_LABEL] = json!("true"));
    wait_until("a MODIFIED for each Service", || async { (rx.accepted().len() == 4).then_some(()) }).await;
    for name in ["a", "b"] {
        assert_eq!(
            deliveries_of(&rx, name),
            vec![(s("ADDED"), vec![]), (s("MODIFIED"), vec![s("backends")])],
            "{name}"
        );
    }
    assert_eq!(members(&last_backends(&rx, "a")), ["10.0.0.1:30080/active", "10.0.0.2:30080/active"]);
    let diff = rx.accepted().last().unwrap().json()["data"]["backendsDiff"].clone();
    assert_eq!(diff["removed"][0]["address"], "10.0.0.3");
    assert_eq!((diff["fromRevision"].as_u64(), diff["toRevision"].as_u64()), (Some(1), Some(2)));
    let events = vw.store.events(&Default::default()).await.unwrap();
    assert_eq!(summary(&events).len(), 4, "the 20 Ready flaps recorded nothing");

    let nodes = Api::new(&vw).ok("/api/v1/nodes").await;
    let out: Vec<(&str, bool, &str)> = nodes["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["name"].as_str().unwrap(), n["eligible"].as_bool().unwrap(), n["reason"].as_str().unwrap_or("")))
        .collect();
    let label = format!("labelled {EXCLUDE_LABEL}=true");
    assert_eq!(out, vec![("w1", true, ""), ("w2", true, ""), ("w3", false, label.as_str())]);
    vw.stop().await.unwrap();
}

#[tokio::test]
async fn a_node_deleted_while_vipwatch_was_down_is_a_modified_after_start_and_an_unchanged_restart_is_nothing() {
    let h = Harness::new().await;
    seed_nodes(&h.api, 2);
    h.api.apply(lb_service("shop", "a", 80));
    h.api.apply(pod_service("p", 81));
    h.api.apply_resource(
        Resource::EndpointSlices,
        slice("p", "p-1", "IPv4", 8080, vec![endpoint("10.244.1.1", true, true, false)]),
    );
    let config = h.config();
    let vw = h.start(config.clone()).await;
    assert_eq!(wait_events(&vw.store, 2).await.len(), 2);
    vw.stop().await.unwrap();

    let vw = h.start(config.clone()).await;
    assert_eq!(summary(&events(&vw.store).await).len(), 2, "a restart with nothing changed records nothing");
    vw.stop().await.unwrap();

    assert!(h.api.delete_resource(Resource::Nodes, "", "w2"));
    let vw = h.start(config).await;
    let rows = wait_events(&vw.store, 3).await;
    assert_eq!(summary(&rows[2..]), vec![(s("MODIFIED"), s("startup"), s("shop/a"))]);
    assert_eq!(rows[2].changed, vec![s("backends")]);
    let row = vw.store.service(&vipwatch::model::ServiceKey::new("shop", "a")).await.unwrap().unwrap();
    let b = &row.backends[&vipwatch_contract::BackendMode::NodePort];
    assert_eq!((b.revision, b.ports[0].members.len()), (2, 1));
    assert_eq!(vw.store.nodes().await.unwrap().iter().map(|n| n.name.as_str()).collect::<Vec<_>>(), ["w1"]);
    vw.stop().await.unwrap();
}

#[tokio::test]
async fn an_added_waits_for_its_first_endpoints_instead_of_announcing_an_empty_pool() {
    let h = Harness::new().await;
    let rx = Receiver::ok().await;
    let vw = h.start(h.config_with(vec![webhook("lab", &rx.url)])).await;
    h.api.apply(pod_service("web", 80));
    // The EndpointSlice controller writes the slice a moment after the Service.
    one_pod_slice(&h.api);
    wait_until("the ADDED", || async { (!rx.accepted().is_empty()).then_some(()) }).await;
    assert_eq!(deliveries_of(&rx, "web"), vec![(s("ADDED"), vec![])]);
    assert_eq!(members(&last_backends(&rx, "web")), ["10.244.1.1:8080/active"]);
    vw.stop().await.unwrap();
}

#[tokio::test]
async fn slices_are_joined_deduplicated_dual_stack_and_ported_per_slice_in_the_payload_and_the_api() {
    let h = Harness::new().await;
    let mut svc = pod_service("web", 80);
    svc["spec"]["ipFamilies"] = json!(["IPv4", "IPv6"]);
    svc["spec"]["ipFamilyPolicy"] = json!("RequireDualStack");
    svc["spec"]["ports"][0]["targetPort"] = json!("web");
    h.api.apply(svc);
    let e = |ip: &str| endpoint(ip, true, true, false);
    // The same endpoint in two slices (moving between them), a named targetPort resolving to 8080 on
    // some Pods and 9090 on others, and an IPv6 slice.
    h.api.apply_resource(
        Resource::EndpointSlices,
        slice("web", "web-a", "IPv4", 8080, vec![e("10.244.1.9"), e("10.244.1.10")]),
    );
    h.api.apply_resource(
        Resource::EndpointSlices,
        slice("web", "web-b", "IPv4", 8080, vec![e("10.244.1.10"), endpoint("10.244.1.2", false, true, true)]),
    );
    h.api.apply_resource(Resource::EndpointSlices, slice("web", "web-c", "IPv4", 9090, vec![e("10.244.3.1")]));
    h.api.apply_resource(Resource::EndpointSlices, slice("web", "web-v6", "IPv6", 8080, vec![e("fd00::5")]));
    let rx = Receiver::ok().await;
    let vw = h.start(h.config_with(vec![webhook("lab", &rx.url)])).await;
    wait_until("the ADDED", || async { (!rx.accepted().is_empty()).then_some(()) }).await;
    let backends = last_backends(&rx, "web");
    assert_eq!(
        members(&backends),
        [
            "10.244.1.2:8080/draining",
            "10.244.1.9:8080/active",
            "10.244.1.10:8080/active",
            "10.244.3.1:9090/active",
            "fd00::5:8080/active"
        ]
    );
    assert_eq!((backends["mode"].as_str(), backends["revision"].as_u64()), (Some("pod"), Some(1)));
    assert_eq!(backends["healthCheck"], Value::Null);

    let api = Api::new(&vw);
    let detail = api.ok("/api/v1/services/shop/web").await;
    assert_eq!(detail["service"]["backends"]["pod"], backends);
    // Rewriting a slice in another order, or moving an endpoint between slices, changes nothing.
    h.api.apply_resource(
        Resource::EndpointSlices,
        slice("web", "web-a", "IPv4", 8080, vec![e("10.244.1.10"), e("10.244.1.9")]),
    );
    h.api.apply_resource(
        Resource::EndpointSlices,
        slice("web", "web-b", "IPv4", 8080, vec![endpoint("10.244.1.2", false, true, true)]),
    );
    let noop_before = vw.metrics.backend_noop.get();
    wait_until("both writes recomputed to no change", || async {
        (vw.metrics.backend_noop.get() > noop_before).then_some(())
    })
    .await;
    assert_eq!(rx.accepted().len(), 1);
    vw.stop().await.unwrap();
}

#[tokio::test]
async fn etp_local_hints_its_health_check_node_port_and_can_keep_only_nodes_with_ready_endpoints() {
    let h = Harness::new().await;
    seed_nodes(&h.api, 3);
    let mut svc = lb_service("shop", "web", 80);
    svc["spec"]["externalTrafficPolicy"] = json!("Local");
    svc["spec"]["healthCheckNodePort"] = json!(31888);
    h.api.apply(svc);
    let on = |ip: &str, node: &str, ready: bool| {
        let mut e = endpoint(ip, ready, true, !ready);
        e["nodeName"] = json!(node);
        e
    };
    h.api.apply_resource(
        Resource::EndpointSlices,
        slice("web", "web-1", "IPv4", 8080, vec![on("10.244.1.1", "w1", true), on("10.244.2.1", "w2", false)]),
    );
    let mut none = Vec::new();
    for local_only in [false, true] {
        let rx = Receiver::ok().await;
        let mut config = h.config_with(vec![webhook("lab", &rx.url)]);
        config.backends.local_endpoints_only = local_only;
        config.database.path = h.dir.path().join(format!("local-{local_only}.db"));
        let vw = h.start(config).await;
        wait_until("the ADDED", || async { (!rx.accepted().is_empty()).then_some(()) }).await;
        let b = last_backends(&rx, "web");
        assert_eq!(
            b["healthCheck"],
            json!({"protocol": "HTTP", "port": 31888, "path": "/healthz", "scope": "service"})
        );
        none.push(members(&b));
        vw.stop().await.unwrap();
    }
    assert_eq!(none[0], ["10.0.0.1:30080/active", "10.0.0.2:30080/active", "10.0.0.3:30080/active"]);
    assert_eq!(none[1], ["10.0.0.1:30080/active", "10.0.0.2:30080/draining"]);
}

#[tokio::test]
async fn without_node_ports_a_service_has_no_members_and_says_why() {
    let h = Harness::new().await;
    seed_nodes(&h.api, 1);
    let mut svc = lb_service("shop", "web", 80);
    svc["spec"]["allocateLoadBalancerNodePorts"] = json!(false);
    svc["spec"]["ports"][0].as_object_mut().unwrap().remove("nodePort");
    h.api.apply(svc);
    let rx = Receiver::ok().await;
    let vw = h.start(h.config_with(vec![webhook("lab", &rx.url)])).await;
    wait_until("the ADDED", || async { (!rx.accepted().is_empty()).then_some(()) }).await;
    let b = last_backends(&rx, "web");
    assert_eq!(members(&b), Vec::<String>::new());
    assert_eq!(b["reason"], "allocateLoadBalancerNodePorts is false: the Service has no nodePort to send traffic to");
    let warned =
        || h.api.events().iter().any(|e| e["reason"] == "UnAvailableLoadBalancer" && e["regarding"]["name"] == "web");
    wait_until("an UnAvailableLoadBalancer Event", || async { warned().then_some(()) }).await;
    vw.stop().await.unwrap();
}

#[tokio::test]
async fn an_endpoint_in_pod_mode_gets_pod_members_while_another_gets_node_ports() {
    let h = web_with_one_pod().await;
    let (pods, nodes) = (Receiver::ok().await, Receiver::ok().await);
    let mut f5 = webhook("f5", &pods.url);
    f5.backend_mode = Some(vipwatch::model::backends::ModeSetting::Pod);
    let vw = h.start(h.config_with(vec![f5, webhook("haproxy", &nodes.url)])).await;
    wait_until("both ADDEDs", || async { (!pods.accepted().is_empty() && !nodes.accepted().is_empty()).then_some(()) })
        .await;
    assert_eq!(members(&last_backends(&pods, "web")), ["10.244.1.1:8080/active"]);
    assert_eq!(members(&last_backends(&nodes, "web")), ["10.0.0.1:30080/active"]);
    // A Pod change reaches the pod-mode endpoint only.
    h.api.apply_resource(
        Resource::EndpointSlices,
        slice("web", "web-1", "IPv4", 8080, vec![endpoint("10.244.1.2", true, true, false)]),
    );
    wait_until("the MODIFIED", || async { (pods.accepted().len() == 2).then_some(()) }).await;
    assert_eq!(members(&last_backends(&pods, "web")), ["10.244.1.2:8080/active"]);
    let events = wait_events(&vw.store, 2).await;
    assert_eq!(summary(&events)[1], (s("MODIFIED"), s("backends"), s("shop/web")));
    let filter = vipwatch::store::DeliveryFilter { webhook: Some(s("haproxy")), ..Default::default() };
    let to_haproxy = vw.store.deliveries(&filter).await.unwrap();
    assert_eq!(to_haproxy.len(), 1, "nothing changed for the nodePort endpoint: {to_haproxy:?}");
    vw.stop().await.unwrap();
}

#[tokio::test]
async fn an_annotation_switching_the_mode_sends_the_new_members_as_a_diff_from_the_old_ones() {
    let h = web_with_one_pod().await;
    let rx = Receiver::ok().await;
    let _vw = h.start(h.config_with(vec![webhook("lab", &rx.url)])).await;
    wait_until("the ADDED", || async { (!rx.accepted().is_empty()).then_some(()) }).await;
    let added = last_backends(&rx, "web");
    assert_eq!((added["mode"].as_str(), members(&added)), (Some("nodePort"), vec![s("10.0.0.1:30080/active")]));
    let from = added["revision"].as_u64().unwrap();

    let diff_of = |v: &Value, list: &str| -> Vec<String> {
        v["data"]["backendsDiff"][list]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| format!("{}:{}", m["address"].as_str().unwrap(), m["port"]))
            .collect()
    };
    // nodePort → pod: the Pods replace the Node, and the revision goes on from the old mode's.
    h.api.update("shop", "web", |o| o["metadata"]["annotations"] = json!({ MODE_ANNOTATION: "pod" }));
    wait_until("the MODIFIED", || async { (rx.accepted().len() == 2).then_some(()) }).await;
    let switched = rx.accepted()[1].json();
    assert_eq!(switched["data"]["changed"], json!(["annotations", "backends"]));
    assert_eq!(switched["data"]["service"]["backends"]["mode"], "pod");
    let to = switched["data"]["service"]["backends"]["revision"].as_u64().unwrap();
    assert!(to > from, "revision {from} → {to}");
    assert_eq!(switched["data"]["backendsDiff"]["fromRevision"], from);
    assert_eq!(switched["data"]["backendsDiff"]["toRevision"], to);
    assert_eq!(diff_of(&switched, "added"), ["10.244.1.1:8080"]);
    assert_eq!(diff_of(&switched, "removed"), ["10.0.0.1:30080"]);

    // pod → none: no members at all, and `changed` says so.
    h.api.update("shop", "web", |o| o["metadata"]["annotations"] = json!({ MODE_ANNOTATION: "none" }));
    wait_until("the second MODIFIED", || async { (rx.accepted().len() == 3).then_some(()) }).await;
    let none = rx.accepted()[2].json();
    assert_eq!(none["data"]["changed"], json!(["annotations", "backends"]));
    assert_eq!(none["data"]["service"]["backends"], Value::Null);
    assert_eq!(none["data"].get("backendsDiff"), None);
}

#[tokio::test]
async fn a_restart_with_another_backend_mode_resyncs_that_endpoint_only() {
    let h = web_with_one_pod().await;
    let (lab, other) = (Receiver::ok().await, Receiver::ok().await);
    let config = h.config_with(vec![webhook("lab", &lab.url), webhook("other", &other.url)]);
    let vw = h.start(config.clone()).await;
    wait_until("both ADDEDs", || async { (lab.accepted().len() == 1 && other.accepted().len() == 1).then_some(()) })
        .await;
    vw.stop().await.unwrap();

    // Same cluster, but `lab` now takes Pods.
    let mut switched = config.clone();
    switched.webhooks[0].backend_mode = Some(vipwatch::model::backends::ModeSetting::Pod);
    let vw = h.start(switched).await;
    // The start computes Pod members for the first time: a MODIFIED (cause startup) carrying them,
    // which only `lab` takes; then the resync, so `lab` holds every Service in its new mode. The
    // resync's SYNCED supersedes the MODIFIED if that is still pending (as documented: a full-state
    // delivery replaces what waits before it), which a loaded machine makes happen.
    let kinds =
        || -> Vec<String> { lab.accepted()[1..].iter().map(|h| s(h.json()["type"].as_str().unwrap())).collect() };
    // The SYNCED comes after the MODIFIED if that went out (per-Service order), so once both the
    // SYNCED and the sync's end are in, the MODIFIED's fate is settled.
    let done = || ["service.synced", "sync.completed"].iter().all(|k| kinds().contains(&s(k)));
    wait_until("the resync of `lab`", || async { done().then_some(()) }).await;
    let mut got = kinds();
    got.sort();
    if got.len() == 3 {
        assert_eq!(got, ["service.modified", "service.synced", "sync.completed"]);
    } else {
        assert_eq!(got, ["service.synced", "sync.completed"], "the MODIFIED was superseded by the SYNCED");
    }
    let synced = lab.accepted()[1..].iter().map(Hit::json).find(|v| v["type"] == "service.synced").unwrap();
    assert_eq!(members(&synced["data"]["service"]["backends"]), ["10.244.1.1:8080/active"]);
    assert_eq!(synced["data"]["sync"]["total"], 1);
    // `other` kept its mode and its members: nothing for it.
    assert_eq!(other.accepted().len(), 1);
    let events = wait_events(&vw.store, 2).await;
    assert_eq!(summary(&events)[1], (s("MODIFIED"), s("startup"), s("shop/web")));
    // The modes are recorded: the same configuration again switches nothing.
    let mut again = config;
    again.webhooks[0].backend_mode = Some(vipwatch::model::backends::ModeSetting::Pod);
    assert_eq!(vipwatch::route::resync_switched_modes(&vw.store, &again).await.unwrap(), Vec::<String>::new());
    vw.stop().await.unwrap();
}

#[tokio::test]
async fn the_event_log_filters_member_changes_and_shows_what_each_event_carried() {
    let h = Harness::new().await;
    h.api.apply(pod_service("web", 80));
    one_pod_slice(&h.api);
    let rx = Receiver::ok().await;
    let mut config = h.config_with(vec![webhook("lab", &rx.url)]);
    config.kubernetes.finalizer = false; // no Service write that could carry the member change along
    let vw = h.start(config).await;
    h.api.apply_resource(
        Resource::EndpointSlices,
        slice("web", "web-1", "IPv4", 8080, vec![endpoint("10.244.1.2", true, true, false)]),
    );
    let events = wait_events(&vw.store, 2).await;
    assert_eq!(summary(&events)[1], (s("MODIFIED"), s("backends"), s("shop/web")));
    let api = Api::new(&vw);
    let changes = api.ok("/api/v1/events?cause=backends").await;
    let items = changes["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{changes}");
    assert_eq!((items[0]["cause"].as_str(), items[0]["changed"].clone()), (Some("backends"), json!(["backends"])));
    let id = items[0]["id"].as_i64().unwrap();
    let modified = api.ok(&format!("/api/v1/events/{id}")).await;
    let diff = &modified["backends_diff"]["pod"];
    assert_eq!(diff["added"][0]["address"], "10.244.1.2");
    assert_eq!(diff["removed"][0]["address"], "10.244.1.1");
    assert_eq!(modified["backends"], json!({}));
    let added = api.ok("/api/v1/events?type=ADDED").await["items"][0]["id"].as_i64().unwrap();
    let added = api.ok(&format!("/api/v1/events/{added}")).await;
    assert_eq!(members(&added["backends"]["pod"]), ["10.244.1.1:8080/active"]);
    assert_eq!(added["backends_diff"], json!({}));
    vw.stop().await.unwrap();
}

/// `shop/web`'s EndpointSlice `web-1` with one ready Pod, 10.244.1.1:8080.
fn one_pod_slice(api: &FakeApiServer) {
    api.apply_resource(
        Resource::EndpointSlices,
        slice("web", "web-1", "IPv4", 8080, vec![endpoint("10.244.1.1", true, true, false)]),
    );
}

/// One Node and the `LoadBalancer` Service `shop/web` with [`one_pod_slice`].
async fn web_with_one_pod() -> Harness {
    let h = Harness::new().await;
    seed_nodes(&h.api, 1);
    h.api.apply(lb_service("shop", "web", 80));
    one_pod_slice(&h.api);
    h
}
