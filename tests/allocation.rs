//! Pools and VIPs end to end: pools, allocation, status write-back gated on the appliance, Kubernetes Events,
//! the finalizer lifecycle, appliance-assigned VIPs. Real sockets throughout: the fake apiserver, a
//! real SQLite file, real webhook receivers.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::api::Api;
use common::receiver::{Receiver, Reply};
use common::{Harness, lb_service, wait_until, webhook};
use serde_json::{Value, json};
use vipwatch::config::{Config, PoolConfig};
use vipwatch::fake_apiserver::FakeApiServer;

fn pool(name: &str, addresses: &[&str]) -> PoolConfig {
    let toml = format!("name = \"{name}\"\naddresses = {addresses:?}\n");
    toml::from_str(&toml).unwrap()
}

fn config(h: &Harness, rx: &Receiver, pools: Vec<PoolConfig>) -> Config {
    let mut c = h.config_with(vec![webhook("lb", &rx.url)]);
    c.pools = pools;
    c
}

/// `status.loadBalancer.ingress` of a Service in the fake apiserver.
fn ingress(api: &FakeApiServer, ns: &str, name: &str) -> Value {
    api.get(ns, name).and_then(|s| s.pointer("/status/loadBalancer/ingress").cloned()).unwrap_or(Value::Null)
}

/// Waits until the Service's status shows `want` (a JSON list).
async fn wait_ingress(api: &FakeApiServer, ns: &str, name: &str, want: Value) {
    wait_until(&format!("status of {ns}/{name} = {want}"), || async { (ingress(api, ns, name) == want).then_some(()) })
        .await;
}

fn vip(ip: &str) -> Value {
    json!([{"ip": ip, "ipMode": "VIP"}])
}

/// The Kubernetes Events (events.k8s.io/v1, as vipwatch writes them) about `name`, in order.
fn k8s_event_objects(api: &FakeApiServer, name: &str) -> Vec<Value> {
    api.events()
        .into_iter()
        .filter(|e| e["apiVersion"] == "events.k8s.io/v1" && e["regarding"]["name"] == name)
        .collect()
}

/// `(reason, note)` of [`k8s_event_objects`].
fn k8s_events(api: &FakeApiServer, name: &str) -> Vec<(String, String)> {
    k8s_event_objects(api, name)
        .iter()
        .map(|e| (e["reason"].as_str().unwrap_or("").to_owned(), e["note"].as_str().unwrap_or("").to_owned()))
        .collect()
}

async fn wait_k8s_event(api: &FakeApiServer, name: &str, reason: &str) -> String {
    wait_until(&format!("a {reason} Event about {name}"), || async {
        k8s_events(api, name).into_iter().find(|(r, _)| r == reason).map(|(_, m)| m)
    })
    .await
}

fn with_annotations(mut svc: Value, annotations: Value) -> Value {
    svc["metadata"]["annotations"] = annotations;
    svc
}

#[tokio::test]
async fn allocates_in_order_writes_status_after_the_ack_and_adds_the_finalizer() {
    let h = Harness::new().await;
    let rx = Receiver::ok().await;
    h.api.apply(lb_service("shop", "a", 80));
    h.api.apply(lb_service("shop", "b", 80));
    let running = h.start(config(&h, &rx, vec![pool("lab", &["192.0.2.10-192.0.2.20"])])).await;
    wait_ingress(&h.api, "shop", "a", vip("192.0.2.10")).await;
    wait_ingress(&h.api, "shop", "b", vip("192.0.2.11")).await;
    let svc = h.api.get("shop", "a").unwrap();
    assert_eq!(svc["metadata"]["finalizers"], json!(["vipwatch.io/cleanup"]));
    let added = rx.accepted().into_iter().map(|h| h.json()).find(|b| b["data"]["service"]["name"] == "a").unwrap();
    assert_eq!(added["data"]["event"], "ADDED");
    assert_eq!(added["data"]["service"]["vips"], json!(["192.0.2.10"]));
    assert_eq!(
        added["data"]["service"]["allocation"],
        json!({"source": "pool", "pool": "lab", "addresses": ["192.0.2.10"],
            "perAddress": [{"address": "192.0.2.10", "family": "IPv4", "pool": "lab"}], "hostname": null, "reason": null})
    );
    let cluster = vipwatch::model::cluster::from_namespace_uid(&h.api.namespace_uid("kube-system"));
    let ensured = format!("Ensured load balancer: 192.0.2.10 (cluster {cluster})");
    assert_eq!(wait_k8s_event(&h.api, "a", "EnsuredLoadBalancer").await, ensured);
    let reasons: Vec<String> = k8s_events(&h.api, "a").into_iter().map(|(r, _)| r).collect();
    // The test cluster has no Node: in mode nodePort the Service has no member, and says so.
    assert_eq!(reasons, vec!["IPAllocated", "EnsuringLoadBalancer", "UnAvailableLoadBalancer", "EnsuredLoadBalancer"]);
    let api = Api::new(&running);
    let vips = api.ok("/api/v1/vips").await;
    let rows: Vec<Value> =
        vips["items"].as_array().unwrap().iter().map(|v| json!([v["ip"], v["name"], v["source"], v["pool"]])).collect();
    assert_eq!(rows, vec![json!(["192.0.2.10", "a", "pool", "lab"]), json!(["192.0.2.11", "b", "pool", "lab"])]);
    let metrics = api.get("/metrics").await.text;
    assert!(metrics.contains("vipwatch_pool_addresses_in_use{pool=\"lab\"} 2"), "{metrics}");
    assert!(metrics.contains("vipwatch_pool_addresses_free{pool=\"lab\"} 9"), "{metrics}");
    running.stop().await.unwrap();
}

/// `EnsuringLoadBalancer` follows the upstream service controller's `needsUpdate`: a label change is
/// delivered to the appliance but announces nothing, an annotation change is announced. The Recorder
/// folds the repeat into the first Event's series, so its count says how many were published; the
/// `InvalidBackendMode` Warning is published after the annotation change's own `EnsuringLoadBalancer`,
/// so once it is there every earlier Event is too.
#[tokio::test]
async fn a_label_change_is_delivered_without_an_ensuring_event() {
    let h = Harness::new().await;
    let rx = Receiver::ok().await;
    h.api.apply(lb_service("shop", "a", 80));
    let running = h.start(config(&h, &rx, vec![pool("lab", &["192.0.2.10-192.0.2.20"])])).await;
    wait_k8s_event(&h.api, "a", "EnsuredLoadBalancer").await;
    let mut svc = h.api.get("shop", "a").unwrap();
    svc["metadata"]["labels"] = json!({"tier": "web"});
    h.api.apply(svc.clone());
    wait_until("the label change delivered", || async {
        rx.accepted()
            .into_iter()
            .map(|h| h.json())
            .any(|b| b["data"]["service"]["labels"] == json!({"tier": "web"}))
            .then_some(())
    })
    .await;
    svc = h.api.get("shop", "a").unwrap();
    svc["metadata"]["annotations"] = json!({"vipwatch.io/backend-mode": "bogus"});
    h.api.apply(svc);
    wait_k8s_event(&h.api, "a", "InvalidBackendMode").await;
    let ensuring: Vec<Value> =
        k8s_event_objects(&h.api, "a").into_iter().filter(|e| e["reason"] == "EnsuringLoadBalancer").collect();
    assert_eq!(ensuring.len(), 1, "{ensuring:?}");
    assert_eq!(ensuring[0]["series"]["count"], 2, "the ADDED and the annotation change: {ensuring:?}");
    running.stop().await.unwrap();
}

#[tokio::test]
async fn requested_ips_sharing_and_impossible_requests() {
    let h = Harness::new().await;
    let rx = Receiver::ok().await;
    h.api.apply(with_annotations(lb_service("ns", "wants", 80), json!({"vipwatch.io/loadBalancerIPs": "192.0.2.15"})));
    h.api.apply(with_annotations(
        lb_service("ns", "outside", 80),
        json!({"vipwatch.io/loadBalancerIPs": "198.51.100.1"}),
    ));
    h.api.apply(with_annotations(lb_service("ns", "web", 80), json!({"vipwatch.io/allow-shared-ip": "k"})));
    h.api.apply(with_annotations(lb_service("ns", "tls", 443), json!({"vipwatch.io/allow-shared-ip": "k"})));
    let running = h.start(config(&h, &rx, vec![pool("lab", &["192.0.2.0/28"])])).await;
    wait_ingress(&h.api, "ns", "wants", vip("192.0.2.15")).await;
    wait_ingress(&h.api, "ns", "web", vip("192.0.2.0")).await;
    wait_ingress(&h.api, "ns", "tls", vip("192.0.2.0")).await;
    // Same key, but port 80 is taken on 192.0.2.0: the next address.
    h.api.apply(with_annotations(lb_service("ns", "web2", 80), json!({"vipwatch.io/allow-shared-ip": "k"})));
    wait_ingress(&h.api, "ns", "web2", vip("192.0.2.1")).await;
    let failed = wait_k8s_event(&h.api, "outside", "AllocationFailed").await;
    assert_eq!(failed, "198.51.100.1 is not in any address pool");
    let warning = h.api.events().into_iter().find(|e| e["reason"] == "AllocationFailed").unwrap();
    assert_eq!(warning["type"], "Warning");
    assert_eq!(ingress(&h.api, "ns", "outside"), Value::Null);
    let shown = Api::new(&running).ok("/api/v1/services/ns/outside").await;
    assert_eq!(shown["service"]["view"]["allocation"]["reason"], "198.51.100.1 is not in any address pool", "{shown}");
    assert_eq!(shown["service"]["vips"], json!([]), "{shown}");
    running.stop().await.unwrap();
}

#[tokio::test]
async fn an_exhausted_pool_leaves_a_service_pending_until_an_address_frees() {
    let h = Harness::new().await;
    let rx = Receiver::ok().await;
    for name in ["a", "b", "c"] {
        h.api.apply(lb_service("ns", name, 80));
    }
    let running = h.start(config(&h, &rx, vec![pool("tiny", &["192.0.2.1-192.0.2.2"])])).await;
    wait_ingress(&h.api, "ns", "b", vip("192.0.2.2")).await;
    assert_eq!(wait_k8s_event(&h.api, "c", "AllocationFailed").await, "address pool `tiny` exhausted");
    assert_eq!(ingress(&h.api, "ns", "c"), Value::Null);
    h.api.delete("ns", "a");
    wait_ingress(&h.api, "ns", "c", vip("192.0.2.1")).await;
    let events = common::events(&running.store).await;
    let last_c = events.iter().rev().find(|e| e.key.name == "c").unwrap();
    assert_eq!((last_c.event_type.as_str(), last_c.cause.as_str()), ("MODIFIED", "allocation"));
    assert_eq!(last_c.changed, vec!["allocation".to_owned()]);
    running.stop().await.unwrap();
}

#[tokio::test]
async fn a_lost_database_never_renumbers_a_vip() {
    let h = Harness::new().await;
    let rx = Receiver::ok().await;
    // Created in reverse order, so lowest-free allocation alone would hand out other addresses.
    for i in (0..50).rev() {
        h.api.apply(lb_service("ns", &format!("s{i:02}"), 80));
    }
    let pools = vec![pool("lab", &["192.0.2.0/24"])];
    let running = h.start(config(&h, &rx, pools.clone())).await;
    wait_until("50 statuses written", || async {
        (0..50).all(|i| ingress(&h.api, "ns", &format!("s{i:02}")) != Value::Null).then_some(())
    })
    .await;
    let before: Vec<Value> = (0..50).map(|i| ingress(&h.api, "ns", &format!("s{i:02}"))).collect();
    running.stop().await.unwrap();
    h.wipe_database().await;
    // Service s00 is created first now: it must not take an address another Service already shows.
    h.api.delete_now("ns", "s00");
    h.api.apply(lb_service("ns", "s00", 80));
    let hits_before = rx.accepted().len();
    let running = h.start(config(&h, &rx, pools)).await;
    wait_until("s00 re-allocated", || async { (ingress(&h.api, "ns", "s00") != Value::Null).then_some(()) }).await;
    let after: Vec<Value> = (1..50).map(|i| ingress(&h.api, "ns", &format!("s{i:02}"))).collect();
    assert_eq!(after, before[1..].to_vec(), "every address adopted from status");
    let rows = common::services(&running.store).await;
    let stored: Vec<Value> = rows[1..].iter().map(|r| json!(r.view.allocation.as_ref().unwrap().addresses)).collect();
    let published: Vec<Value> = before[1..].iter().map(|i| json!([i[0]["ip"]])).collect();
    assert_eq!(stored, published);
    // A lost database cannot know what the appliance has: each Service is announced once (ADDED,
    // cause startup) with the address it already had.
    wait_until("50 re-announcements", || async { (rx.accepted().len() >= hits_before + 50).then_some(()) }).await;
    let again: Vec<Value> = rx.accepted()[hits_before..].iter().map(|h| h.json()).collect();
    assert_eq!(again.len(), 50);
    assert!(again.iter().all(|b| b["data"]["event"] == "ADDED" && b["data"]["cause"] == "startup"));
    running.stop().await.unwrap();
    // With the database intact, a restart announces nothing.
    let hits = rx.accepted().len();
    let running = h.start(config(&h, &rx, vec![pool("lab", &["192.0.2.0/24"])])).await;
    let n = common::events(&running.store).await.len();
    running.stop().await.unwrap();
    assert_eq!((rx.accepted().len(), n), (hits, 50), "no new event, no new delivery");
}

#[tokio::test]
async fn status_waits_for_the_appliance_and_failures_are_reported() {
    let h = Harness::new().await;
    let healthy = Arc::new(AtomicBool::new(false));
    let flag = healthy.clone();
    let rx = Receiver::start(move |_, _| Reply::Status(if flag.load(Ordering::SeqCst) { 204 } else { 500 })).await;
    h.api.apply(lb_service("ns", "a", 80));
    let running = h.start(config(&h, &rx, vec![pool("lab", &["192.0.2.0/28"])])).await;
    let why = wait_k8s_event(&h.api, "a", "SyncLoadBalancerFailed").await;
    assert!(why.starts_with("Error syncing load balancer: webhook `lb` delivery "), "{why}");
    assert!(why.ends_with(": HTTP 500 Internal Server Error"), "{why}");
    assert_eq!(ingress(&h.api, "ns", "a"), Value::Null, "no status before the appliance acknowledged");
    healthy.store(true, Ordering::SeqCst);
    wait_ingress(&h.api, "ns", "a", vip("192.0.2.0")).await;
    running.stop().await.unwrap();
}

#[tokio::test]
async fn a_service_deleted_while_vipwatch_was_down_is_released_after_the_deleted_is_acknowledged() {
    let h = Harness::new().await;
    // The appliance does not know the VIP any more: 404 to the DELETED still completes it.
    let rx = Receiver::start(|_, hit| Reply::Status(if hit.event().0 == "DELETED" { 404 } else { 204 })).await;
    h.api.apply(lb_service("ns", "a", 80));
    let running = h.start(config(&h, &rx, vec![pool("lab", &["192.0.2.0/28"])])).await;
    wait_ingress(&h.api, "ns", "a", vip("192.0.2.0")).await;
    running.stop().await.unwrap();
    assert!(h.api.delete("ns", "a"));
    let marked = h.api.get("ns", "a").expect("the finalizer keeps it");
    assert!(marked["metadata"]["deletionTimestamp"].is_string());
    let running = h.start(config(&h, &rx, vec![pool("lab", &["192.0.2.0/28"])])).await;
    wait_until("the Service is gone", || async { h.api.get("ns", "a").is_none().then_some(()) }).await;
    let deleted: Vec<Value> = rx.hits().iter().map(|h| h.json()).filter(|b| b["data"]["event"] == "DELETED").collect();
    assert_eq!(deleted.len(), 1);
    assert_eq!(deleted[0]["data"]["cause"], "startup");
    assert_eq!(deleted[0]["data"]["service"]["vips"], json!(["192.0.2.0"]));
    let events = common::events(&running.store).await;
    assert_eq!(common::summary(&events).iter().filter(|(t, _, _)| t == "DELETED").count(), 1, "exactly one DELETED");
    assert_eq!(wait_k8s_event(&h.api, "a", "DeletedLoadBalancer").await, "Deleted load balancer");
    running.stop().await.unwrap();
}

#[tokio::test]
async fn a_live_delete_waits_for_the_appliance_then_lets_the_service_go() {
    let h = Harness::new().await;
    let healthy = Arc::new(AtomicBool::new(true));
    let flag = healthy.clone();
    let rx = Receiver::start(move |_, _| Reply::Status(if flag.load(Ordering::SeqCst) { 204 } else { 503 })).await;
    h.api.apply(lb_service("ns", "a", 80));
    let running = h.start(config(&h, &rx, vec![])).await;
    wait_until("the finalizer", || async {
        (h.api.get("ns", "a")?["metadata"]["finalizers"] == json!(["vipwatch.io/cleanup"])).then_some(())
    })
    .await;
    wait_until("the ADDED delivered", || async { (!rx.accepted().is_empty()).then_some(()) }).await;
    healthy.store(false, Ordering::SeqCst);
    h.api.delete("ns", "a");
    wait_until("a failed DELETED attempt", || async {
        rx.hits().iter().any(|h| h.event().0 == "DELETED").then_some(())
    })
    .await;
    assert!(h.api.get("ns", "a").is_some(), "kept while the appliance has not acknowledged");
    healthy.store(true, Ordering::SeqCst);
    wait_until("the Service is gone", || async { h.api.get("ns", "a").is_none().then_some(()) }).await;
    let kinds: Vec<String> = rx.accepted().iter().map(|h| h.event().0).collect();
    assert_eq!(kinds, vec!["ADDED", "DELETED"]);
    running.stop().await.unwrap();
}

#[tokio::test]
async fn the_appliance_can_assign_the_vip() {
    let h = Harness::new().await;
    let rx = Receiver::start(|_, hit| {
        let name = hit.json()["data"]["service"]["name"].as_str().unwrap().to_owned();
        let body = if name == "a" { json!({"vips": ["203.0.113.7"]}) } else { json!({"hostname": "lb-b.example.net"}) };
        Reply::Body(200, body.to_string())
    })
    .await;
    let audit = Receiver::ok().await;
    h.api.apply(lb_service("ns", "a", 80));
    h.api.apply(lb_service("ns", "b", 80));
    let mut endpoint = webhook("lb", &rx.url);
    endpoint.assigns_vip = true;
    let running = h.start(h.config_with(vec![endpoint, webhook("audit", &audit.url)])).await;
    wait_ingress(&h.api, "ns", "a", vip("203.0.113.7")).await;
    wait_ingress(&h.api, "ns", "b", json!([{"hostname": "lb-b.example.net"}])).await;
    let vips = Api::new(&running).ok("/api/v1/vips/203.0.113.7").await;
    assert_eq!(
        (&vips["services"][0]["name"], &vips["services"][0]["source"]),
        (&json!("a"), &json!("appliance")),
        "{vips}"
    );
    // The other endpoints hear of the address; the appliance that chose it is not asked again.
    let modified = audit.accepted().iter().map(|h| h.json()).find(|b| b["data"]["event"] == "MODIFIED").unwrap();
    assert_eq!(modified["data"]["cause"], "appliance");
    assert_eq!(modified["data"]["changed"], json!(["allocation"]));
    let kinds: Vec<String> = rx.accepted().iter().map(|h| h.event().0).collect();
    assert_eq!(kinds, vec!["ADDED", "ADDED"]);
    running.stop().await.unwrap();
}

#[tokio::test]
async fn release_finalizers_removes_ours_and_only_ours() {
    let h = Harness::new().await;
    let rx = Receiver::ok().await;
    let mut other = lb_service("ns", "b", 80);
    other["metadata"]["finalizers"] = json!(["example.com/keep"]);
    h.api.apply(lb_service("ns", "a", 80));
    h.api.apply(other);
    let running = h.start(config(&h, &rx, vec![])).await;
    wait_until("both finalized", || async {
        let b = h.api.get("ns", "b")?;
        (b["metadata"]["finalizers"] == json!(["example.com/keep", "vipwatch.io/cleanup"])
            && h.api.get("ns", "a")?["metadata"]["finalizers"] == json!(["vipwatch.io/cleanup"]))
        .then_some(())
    })
    .await;
    running.stop().await.unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_vipwatch"))
        .arg("release-finalizers")
        .env("VIPWATCH_KUBERNETES__URL", h.api.url())
        .env("VIPWATCH_DATABASE__PATH", h.db_path())
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout} {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout, "released ns/a\nreleased ns/b\nremoved the vipwatch.io/cleanup finalizer from 2 Services\n");
    assert_eq!(h.api.get("ns", "a").unwrap()["metadata"].get("finalizers").cloned().unwrap_or(json!([])), json!([]));
    assert_eq!(h.api.get("ns", "b").unwrap()["metadata"]["finalizers"], json!(["example.com/keep"]));
}

#[tokio::test]
async fn no_delivery_goes_out_before_the_finalizer_is_on_the_service() {
    let h = Harness::new().await;
    let rx = Receiver::ok().await;
    let running = h.start(config(&h, &rx, vec![])).await;
    common::wait_watching(&h.api).await;
    // Every request fails from now on (the open watch needs none): the finalizer cannot be added.
    h.api.faults().fail_requests(usize::MAX);
    h.api.apply(lb_service("ns", "a", 80));
    wait_until("two failed finalizer patches", || async {
        let patches =
            h.api.requests().iter().filter(|r| r.method == "PATCH" && r.path.ends_with("/services/a")).count();
        (patches >= 2).then_some(())
    })
    .await;
    assert_eq!(rx.hits().len(), 0, "the ADDED waits for the finalizer");
    h.api.faults().fail_requests(0);
    wait_until("the ADDED delivered", || async { (rx.accepted().len() == 1).then_some(()) }).await;
    assert_eq!(h.api.get("ns", "a").unwrap()["metadata"]["finalizers"], json!(["vipwatch.io/cleanup"]));
    running.stop().await.unwrap();
}

#[tokio::test]
async fn a_slow_finalizer_patch_holds_back_only_its_own_services_deliveries() {
    let h = Harness::new().await;
    // Both exist before the start, so one pass of the publisher patches them together.
    h.api.apply(lb_service("ns", "slow", 80));
    h.api.apply(lb_service("ns", "fast", 81));
    h.api.faults().hold_writes_to("slow", true);
    let rx = Receiver::ok().await;
    let running = h.start(config(&h, &rx, vec![])).await;
    let names = || -> Vec<String> {
        rx.accepted().iter().map(|hit| hit.json()["data"]["service"]["name"].as_str().unwrap().to_owned()).collect()
    };
    // The relay used to wait for every patch of the pass, the stuck one too.
    wait_until("fast's ADDED delivered", || async { (names() == ["fast"]).then_some(()) }).await;
    assert_eq!(h.api.get("ns", "slow").unwrap()["metadata"].get("finalizers"), None, "slow's patch is still held");
    h.api.faults().hold_writes_to("slow", false);
    wait_until("slow's ADDED delivered", || async { (names() == ["fast", "slow"]).then_some(()) }).await;
    assert_eq!(h.api.get("ns", "slow").unwrap()["metadata"]["finalizers"], json!(["vipwatch.io/cleanup"]));
    running.stop().await.unwrap();
}

#[tokio::test]
async fn leaving_scope_clears_the_status_and_the_finalizer_after_the_deleted_is_acknowledged() {
    let h = Harness::new().await;
    let rx = Receiver::ok().await;
    h.api.apply(lb_service("ns", "a", 80));
    let running = h.start(config(&h, &rx, vec![pool("lab", &["192.0.2.0/28"])])).await;
    wait_ingress(&h.api, "ns", "a", vip("192.0.2.0")).await;
    h.api.update("ns", "a", |s| {
        s["spec"]["type"] = json!("ClusterIP");
        s["spec"]["ports"][0].as_object_mut().unwrap().remove("nodePort");
    });
    wait_ingress(&h.api, "ns", "a", Value::Null).await;
    wait_until("the finalizer removed", || async {
        let finalizers = h.api.get("ns", "a")?["metadata"].get("finalizers").cloned().unwrap_or(json!([]));
        (finalizers == json!([])).then_some(())
    })
    .await;
    let kinds: Vec<String> = rx.accepted().iter().map(|h| h.event().0).collect();
    assert_eq!(kinds, vec!["ADDED", "DELETED"]);
    // The address is free again once the release is handed to the allocator, which the publisher does
    // right after removing the finalizer (never before: the old status must be gone first).
    wait_until("the address released", || async { running.store.releases().await.unwrap().is_empty().then_some(()) })
        .await;
    h.api.apply(lb_service("ns", "b", 80));
    wait_ingress(&h.api, "ns", "b", vip("192.0.2.0")).await;
    running.stop().await.unwrap();
}

#[tokio::test]
async fn after_a_lost_database_statuses_outside_the_pools_take_nothing_and_requests_come_first() {
    let h = Harness::new().await;
    let rx = Receiver::ok().await;
    let pools = vec![pool("two", &["192.0.2.1-192.0.2.2"])];
    h.api.apply(lb_service("ns", "z1", 80));
    h.api.apply(lb_service("ns", "z2", 80));
    let running = h.start(config(&h, &rx, pools.clone())).await;
    // Both statuses must be written before the database is lost: they are all the next start knows.
    wait_ingress(&h.api, "ns", "z1", vip("192.0.2.1")).await;
    wait_ingress(&h.api, "ns", "z2", vip("192.0.2.2")).await;
    running.stop().await.unwrap();
    h.wipe_database().await;
    // Sorted first: a Service showing an address of another controller, and one requesting z1's.
    let mut foreign = lb_service("ns", "a0", 80);
    foreign["status"] = json!({"loadBalancer": {"ingress": [{"ip": "203.0.113.99"}]}});
    h.api.apply(foreign);
    h.api.apply(with_annotations(lb_service("ns", "a1", 80), json!({"vipwatch.io/loadBalancerIPs": "192.0.2.1"})));
    let running = h.start(config(&h, &rx, pools)).await;
    assert_eq!(
        wait_k8s_event(&h.api, "a1", "AllocationFailed").await,
        "192.0.2.1 is already used by ns/z1 (share it with the same vipwatch.io/allow-shared-ip key and distinct ports)"
    );
    assert_eq!(wait_k8s_event(&h.api, "a0", "AllocationFailed").await, "address pool `two` exhausted");
    assert_eq!((ingress(&h.api, "ns", "z1"), ingress(&h.api, "ns", "z2")), (vip("192.0.2.1"), vip("192.0.2.2")));
    running.stop().await.unwrap();

    // On an empty pool, an explicit request wins over an auto-assigned Service listed before it.
    let h = Harness::new().await;
    h.api.apply(lb_service("ns", "aa", 80));
    h.api.apply(with_annotations(lb_service("ns", "bb", 80), json!({"vipwatch.io/loadBalancerIPs": "192.0.2.1"})));
    let running = h.start(config(&h, &rx, vec![pool("two", &["192.0.2.1-192.0.2.2"])])).await;
    wait_ingress(&h.api, "ns", "bb", vip("192.0.2.1")).await;
    wait_ingress(&h.api, "ns", "aa", vip("192.0.2.2")).await;
    running.stop().await.unwrap();
}

#[tokio::test]
async fn a_terminating_service_unknown_to_a_lost_database_still_gets_its_deleted() {
    let h = Harness::new().await;
    let rx = Receiver::ok().await;
    h.api.apply(lb_service("ns", "q1", 80));
    let running = h.start(config(&h, &rx, vec![pool("lab", &["192.0.2.0/28"])])).await;
    wait_ingress(&h.api, "ns", "q1", vip("192.0.2.0")).await;
    running.stop().await.unwrap();
    h.api.delete("ns", "q1");
    h.wipe_database().await;
    let before = rx.accepted().len();
    let running = h.start(config(&h, &rx, vec![pool("lab", &["192.0.2.0/28"])])).await;
    wait_until("q1 is gone", || async { h.api.get("ns", "q1").is_none().then_some(()) }).await;
    let sent: Vec<Value> = rx.accepted()[before..].iter().map(|h| h.json()).collect();
    assert_eq!(sent.len(), 1);
    assert_eq!(
        (&sent[0]["data"]["event"], &sent[0]["data"]["service"]["vips"]),
        (&json!("DELETED"), &json!(["192.0.2.0"]))
    );
    let events = common::events(&running.store).await;
    assert_eq!(common::summary(&events), vec![(common::s("DELETED"), common::s("startup"), common::s("ns/q1"))]);
    running.stop().await.unwrap();
}

#[tokio::test]
async fn a_deleted_services_address_is_reused_only_after_the_appliance_acknowledged_the_deleted() {
    let h = Harness::new().await;
    let deletes_fail = Arc::new(AtomicBool::new(true));
    let flag = deletes_fail.clone();
    let rx = Receiver::start(move |_, hit| {
        let failing = hit.event().0 == "DELETED" && flag.load(Ordering::SeqCst);
        Reply::Status(if failing { 500 } else { 204 })
    })
    .await;
    h.api.apply(lb_service("ns", "a", 80));
    let running = h.start(config(&h, &rx, vec![pool("one", &["192.0.2.1"])])).await;
    wait_ingress(&h.api, "ns", "a", vip("192.0.2.1")).await;
    h.api.delete("ns", "a");
    h.api.apply(with_annotations(lb_service("ns", "b", 80), json!({"vipwatch.io/loadBalancerIPs": "192.0.2.1"})));
    let why = wait_k8s_event(&h.api, "b", "AllocationFailed").await;
    assert_eq!(
        why,
        "192.0.2.1 is already used by ns/a (given up; the appliance has not acknowledged that yet) (share it with the same vipwatch.io/allow-shared-ip key and distinct ports)"
    );
    wait_until("a failed DELETED attempt", || async {
        rx.hits().iter().any(|h| h.event().0 == "DELETED").then_some(())
    })
    .await;
    assert_eq!(ingress(&h.api, "ns", "b"), Value::Null);
    deletes_fail.store(false, Ordering::SeqCst);
    wait_ingress(&h.api, "ns", "b", vip("192.0.2.1")).await;
    let order: Vec<(String, String)> = rx
        .accepted()
        .iter()
        .map(|h| h.json())
        .map(|b| {
            (b["data"]["event"].as_str().unwrap().to_owned(), b["data"]["service"]["name"].as_str().unwrap().to_owned())
        })
        .filter(|(_, name)| name == "a" || name == "b")
        .collect();
    let deleted_a = order.iter().position(|e| *e == ("DELETED".to_owned(), "a".to_owned())).unwrap();
    let b_gets_it = order.iter().position(|(kind, name)| kind == "MODIFIED" && name == "b").unwrap();
    assert!(deleted_a < b_gets_it, "{order:?}");
    running.stop().await.unwrap();
}

/// A state-table refresh of `ns/name` holding `addresses` from pool `lab` (no event).
fn holding(name: &str, addresses: &[&str]) -> vipwatch::store::StateChange {
    let svc: k8s_openapi::api::core::v1::Service = serde_json::from_value(lb_service("ns", name, 80)).unwrap();
    let mut view = vipwatch::model::ServiceView::from_service(&svc);
    view.allocation = Some(vipwatch_contract::Allocation::from_pools(
        addresses.iter().map(|a| (a.parse().unwrap(), "lab".into())).collect(),
    ));
    let tracked = vipwatch::model::Tracked {
        uid: format!("uid-{name}"),
        resource_version: "1".into(),
        view: Arc::new(view),
        backends: Arc::default(),
    };
    vipwatch::store::StateChange::Refresh {
        key: vipwatch::model::ServiceKey::new("ns", name),
        tracked: Box::new(tracked),
    }
}

#[tokio::test]
async fn the_database_refuses_one_pool_address_for_two_services_and_commits_nothing_of_that_write() {
    use vipwatch::store::{NoOutbox, StoreError};
    let h = Harness::new().await;
    let store = h.store().await;
    let addresses = |rows: Vec<vipwatch::store::ServiceRow>| -> Vec<(String, Vec<String>)> {
        rows.into_iter()
            .map(|r| (r.key.name.to_string(), r.view.allocation.map(|a| a.addresses).unwrap_or_default()))
            .collect()
    };
    store.apply(&[holding("a", &["10.9.0.1"])], &[], &NoOutbox).await.unwrap();
    let err =
        store.apply(&[holding("c", &["10.9.0.3"]), holding("b", &["10.9.0.1"])], &[], &NoOutbox).await.unwrap_err();
    assert!(matches!(err, StoreError::AddressTaken(_)), "{err:?}");
    assert_eq!(err.fault(), None, "a refusal, not a storage fault to retry");
    assert_eq!(addresses(store.services().await.unwrap()), vec![("a".into(), vec!["10.9.0.1".to_owned()])]);
    // Moving the address in one write (a gives it up, b takes it) is fine, whatever the order.
    store.apply(&[holding("b", &["10.9.0.1"]), holding("a", &[])], &[], &NoOutbox).await.unwrap();
    let want = vec![("a".to_owned(), vec![]), ("b".to_owned(), vec!["10.9.0.1".to_owned()])];
    assert_eq!(addresses(store.services().await.unwrap()), want);
    store.close().await;
}

/// The publisher reads the statuses waiting a window at a time: after the last Service of one window
/// the next begins, each waiting Service comes once per round, in namespace and name order.
#[tokio::test]
async fn status_work_comes_a_window_at_a_time_after_the_last_service_read() {
    use vipwatch::store::NoOutbox;
    let h = Harness::new().await;
    let store = h.store().await;
    let names = ["a", "b", "c", "d", "e"];
    let rows: Vec<_> = names.iter().enumerate().map(|(i, n)| holding(n, &[&format!("10.9.0.{}", i + 1)])).collect();
    store.apply(&rows, &[], &NoOutbox).await.unwrap();
    let mut after = None;
    let mut windows = Vec::new();
    loop {
        let work = store.status_work(after.as_ref(), 2).await.unwrap();
        windows.push(work.iter().map(|w| w.key.name.clone()).collect::<Vec<_>>());
        let Some(last) = work.last() else { break };
        after = Some(last.key.clone());
    }
    assert_eq!(windows, vec![vec!["a", "b"], vec!["c", "d"], vec!["e"], vec![]]);
    store.close().await;
}

/// Two ports of one Service with the same number and protocol (the fake apiserver takes what a real
/// one refuses) are one `vip_addresses` row: as two, the database refused the Service's own address
/// and port as "held by two Services", and every start ended the same way.
#[tokio::test]
async fn a_service_repeating_a_port_holds_its_address_once() {
    let h = Harness::new().await;
    let rx = Receiver::ok().await;
    let mut svc = lb_service("ns", "a", 80);
    let port = svc["spec"]["ports"][0].clone();
    let mut again = port.clone();
    again["name"] = json!("again");
    svc["spec"]["ports"] = json!([port, again]);
    h.api.apply(svc);
    let running = h.start(config(&h, &rx, vec![pool("lab", &["10.9.0.1"])])).await;
    wait_ingress(&h.api, "ns", "a", vip("10.9.0.1")).await;
    h.api.apply(lb_service("ns", "b", 80));
    wait_until("b's ADDED delivered", || async {
        rx.accepted().iter().any(|hit| hit.json()["data"]["service"]["name"] == "b").then_some(())
    })
    .await;
    running.stop().await.unwrap();
}

/// On SQLite, a batch the database refuses for good ends the run with that error (the process then
/// exits non-zero, so a supervisor restarts it), not as a requested stop. (On PostgreSQL only the
/// term ends, and the replica gives up the lease: `app::lead::elect`.) The refusal is provoked with
/// a `vip_addresses` row the allocator cannot know of.
#[tokio::test]
async fn a_batch_the_database_refuses_ends_the_run_with_an_error() {
    use sqlx::Connection as _;
    let h = Harness::on(vipwatch::store::Backend::Sqlite).await;
    let rx = Receiver::ok().await;
    let cfg = config(&h, &rx, vec![pool("lab", &["10.9.0.1"])]);
    h.start(cfg.clone()).await.stop().await.unwrap();
    let url = format!("sqlite://{}", h.db_path().display());
    let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
    let ghost = "INSERT INTO vip_addresses (address, protocol, port, namespace, name) \
                 VALUES ('10.9.0.1', 'TCP', 80, 'ns', 'ghost')";
    sqlx::raw_sql(ghost).execute(&mut conn).await.unwrap();
    conn.close().await.unwrap();
    h.api.apply(lb_service("ns", "a", 80));
    let running = h.start(cfg).await;
    tokio::time::timeout(std::time::Duration::from_secs(20), running.failed()).await.expect("the run ends by itself");
    let err = running.stop().await.expect_err("ended by a refusal");
    let chain = format!("{err}");
    assert!(chain.contains("refused"), "{chain}");
}

/// More Kubernetes Events due at once than the Event queue holds (`NOTICE_QUEUE`, 1,000), while the
/// apiserver holds every Event write: the queue takes 1,000, the publisher may have taken one more
/// (waiting on its write), and every other one is dropped and counted in
/// `vipwatch_kubernetes_writes_total{kind="event",outcome="dropped"}`. Once writes go through, the
/// kept ones are published: published and dropped add up to every Event due. Each of the 600
/// Services cannot get its address and has no endpoints: `AllocationFailed`, `EnsuringLoadBalancer`
/// and `UnAvailableLoadBalancer`, 1,800 Events.
#[tokio::test]
async fn events_past_a_full_queue_are_dropped_and_counted() {
    const N: usize = 600;
    let due = 3 * N;
    let h = Harness::new().await;
    let rx = Receiver::ok().await;
    let outside = json!({"vipwatch.io/loadBalancerIPs": "198.51.100.1"});
    h.api.seed((0..N).map(|i| with_annotations(lb_service("ns", &format!("s{i:03}"), 80), outside.clone())));
    h.api.faults().hold_writes_to("events", true);
    let running = h.start(config(&h, &rx, vec![pool("lab", &["192.0.2.0/28"])])).await;
    let api = Api::new(&running);
    let sample = |outcome: &str| format!("vipwatch_kubernetes_writes_total{{kind=\"event\",outcome=\"{outcome}\"}}");
    let queue = vipwatch::model::NOTICE_QUEUE;
    wait_until("every Event past the queue counted", || async {
        (api.metric(&sample("dropped")).await >= (due - queue - 1) as f64).then_some(())
    })
    .await;
    assert_eq!(h.api.events().len(), 0, "nothing published while Event writes are held");
    h.api.faults().hold_writes_to("events", false);
    let dropped = api.metric(&sample("dropped")).await as usize;
    let kept = due - dropped;
    assert!(kept == queue || kept == queue + 1, "the queue, and at most the one in flight: {kept}");
    wait_until("the kept Events published", || async {
        (api.metric(&sample("ok")).await == kept as f64).then_some(())
    })
    .await;
    assert_eq!(h.api.events().len(), kept);
    assert_eq!(api.metric(&sample("dropped")).await, dropped as f64, "nothing more dropped");
    assert_eq!(api.metric(&sample("error")).await, 0.0);
    running.stop().await.unwrap();
}

/// A PreferDualStack Service (`spec.ipFamilies` IPv4 then IPv6) with `annotations`.
fn dual_stack(ns: &str, name: &str, annotations: Value) -> Value {
    let mut svc = with_annotations(lb_service(ns, name, 80), annotations);
    svc["spec"]["ipFamilyPolicy"] = json!("PreferDualStack");
    svc["spec"]["ipFamilies"] = json!(["IPv4", "IPv6"]);
    svc
}

/// The pools of the dual-stack tests: one per family.
fn family_pools() -> Vec<PoolConfig> {
    vec![pool("v4", &["192.0.2.0/28"]), pool("v6", &["2001:db8::/120"])]
}

/// With an IPv4 and an IPv6 pool, a Service holding an address of each (both requested) and one holding
/// a requested IPv6 only: every field that names a pool or a family names the right one for each
/// address — the allocation in the webhook payload and the API (`pool` stays the first address's,
/// `perAddress` tells each), `requestedIPs` (normalized, whichever annotation carried the request),
/// `/api/v1/services` `vips`, `/api/v1/vips` (and its `family` filter), `/api/v1/vips/{ip}`, the pool
/// metrics and the `IPAllocated` Events.
#[tokio::test]
async fn each_address_names_its_own_pool_and_family_everywhere() {
    let h = Harness::new().await;
    let rx = Receiver::ok().await;
    h.api.apply(dual_stack("ns", "dual", json!({"vipwatch.io/loadBalancerIPs": "192.0.2.5, 2001:db8::51"})));
    h.api.apply(dual_stack("ns", "six", json!({"lbipam.cilium.io/ips": " 2001:DB8:0::52 "})));
    h.api.apply(lb_service("ns", "four", 80));
    let running = h.start(config(&h, &rx, family_pools())).await;
    wait_ingress(
        &h.api,
        "ns",
        "dual",
        json!([{"ip": "192.0.2.5", "ipMode": "VIP"}, {"ip": "2001:db8::51", "ipMode": "VIP"}]),
    )
    .await;
    wait_ingress(&h.api, "ns", "six", vip("2001:db8::52")).await;
    wait_ingress(&h.api, "ns", "four", vip("192.0.2.0")).await;

    let both = json!({"source": "pool", "pool": "v4", "addresses": ["192.0.2.5", "2001:db8::51"],
        "perAddress": [{"address": "192.0.2.5", "family": "IPv4", "pool": "v4"},
                       {"address": "2001:db8::51", "family": "IPv6", "pool": "v6"}],
        "hostname": null, "reason": null});
    let six = json!({"source": "pool", "pool": "v6", "addresses": ["2001:db8::52"],
        "perAddress": [{"address": "2001:db8::52", "family": "IPv6", "pool": "v6"}], "hostname": null, "reason": null});
    let added = |name: &str| {
        rx.accepted().into_iter().map(|h| h.json()).find(|b| b["data"]["service"]["name"] == name).unwrap()
    };
    let payload = added("dual");
    let service = &payload["data"]["service"];
    assert_eq!(service["allocation"], both, "{payload}");
    assert_eq!(
        (&service["vips"], &service["requestedIPs"], &service["ipFamilies"]),
        (&json!(["192.0.2.5", "2001:db8::51"]), &json!(["192.0.2.5", "2001:db8::51"]), &json!(["IPv4", "IPv6"]))
    );
    let payload = added("six");
    assert_eq!(payload["data"]["service"]["allocation"], six, "{payload}");
    assert_eq!(payload["data"]["service"]["requestedIPs"], json!(["2001:db8::52"]), "normalized: {payload}");

    let api = Api::new(&running);
    let shown = api.ok("/api/v1/services/ns/dual").await;
    assert_eq!(shown["service"]["view"]["allocation"], both, "{shown}");
    assert_eq!(
        shown["service"]["vips"],
        json!([{"address": "192.0.2.5", "source": "pool", "family": "IPv4", "pool": "v4"},
               {"address": "2001:db8::51", "source": "pool", "family": "IPv6", "pool": "v6"}])
    );
    let listed = api.ok("/api/v1/services?namespace=ns").await;
    let six_listed = listed["items"].as_array().unwrap().iter().find(|s| s["name"] == "six").unwrap();
    assert_eq!(six_listed["view"]["requestedIPs"], json!(["2001:db8::52"]));
    assert_eq!(
        six_listed["vips"],
        json!([{"address": "2001:db8::52", "source": "pool", "family": "IPv6", "pool": "v6"}])
    );

    let rows = |page: Value| -> Vec<Value> {
        page["items"].as_array().unwrap().iter().map(|v| json!([v["ip"], v["name"], v["family"], v["pool"]])).collect()
    };
    let all = [
        json!(["192.0.2.0", "four", "IPv4", "v4"]),
        json!(["192.0.2.5", "dual", "IPv4", "v4"]),
        json!(["2001:db8::51", "dual", "IPv6", "v6"]),
        json!(["2001:db8::52", "six", "IPv6", "v6"]),
    ];
    assert_eq!(rows(api.ok("/api/v1/vips").await), all.to_vec());
    assert_eq!(rows(api.ok("/api/v1/vips?family=IPv6").await), all[2..].to_vec());
    assert_eq!(rows(api.ok("/api/v1/vips?family=IPv4&namespace=ns").await), all[..2].to_vec());
    let one = api.ok("/api/v1/vips/2001:db8::51").await;
    assert_eq!((&one["services"][0]["pool"], &one["services"][0]["family"]), (&json!("v6"), &json!("IPv6")), "{one}");

    let samples = api.samples().await;
    let gauge = |name: &str| samples.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
    assert_eq!(
        ["in_use{pool=\"v4\"}", "in_use{pool=\"v6\"}", "free{pool=\"v4\"}", "free{pool=\"v6\"}"]
            .map(|s| gauge(&format!("vipwatch_pool_addresses_{s}"))),
        [Some(2.0), Some(2.0), Some(14.0), Some(254.0)]
    );

    assert_eq!(
        wait_k8s_event(&h.api, "dual", "IPAllocated").await,
        "Assigned 192.0.2.5 from pool v4, 2001:db8::51 from pool v6"
    );
    assert_eq!(wait_k8s_event(&h.api, "six", "IPAllocated").await, "Assigned 2001:db8::52 from pool v6");
    running.stop().await.unwrap();
}

/// A Service whose addresses change gets an `IPAllocated` and an `EnsuredLoadBalancer` Event with the
/// new addresses and pool: a repeat of a reason folds into the earlier Event's series only when its
/// note is the same, as client-go's event recorder does; otherwise the Event would keep saying the
/// addresses it had first.
#[tokio::test]
async fn new_addresses_get_events_of_their_own_naming_them_and_their_pool() {
    let h = Harness::new().await;
    let cluster = vipwatch::model::cluster::from_namespace_uid(&h.api.namespace_uid("kube-system"));
    let rx = Receiver::ok().await;
    h.api.apply(dual_stack("ns", "moves", json!({})));
    let running = h.start(config(&h, &rx, family_pools())).await;
    wait_ingress(&h.api, "ns", "moves", vip("192.0.2.0")).await;
    wait_k8s_event(&h.api, "moves", "EnsuredLoadBalancer").await;
    h.api.update("ns", "moves", |s| {
        s["metadata"]["annotations"] = json!({"metallb.io/loadBalancerIPs": "2001:db8::55"})
    });
    wait_ingress(&h.api, "ns", "moves", vip("2001:db8::55")).await;
    let notes = |reason: &str| -> Vec<(String, Value)> {
        k8s_event_objects(&h.api, "moves")
            .into_iter()
            .filter(|e| e["reason"] == reason)
            .map(|e| (e["note"].as_str().unwrap_or("").to_owned(), e["series"]["count"].clone()))
            .collect()
    };
    assert_eq!(
        notes("IPAllocated"),
        vec![
            ("Assigned 192.0.2.0 from pool v4".to_owned(), Value::Null),
            ("Assigned 2001:db8::55 from pool v6".to_owned(), Value::Null)
        ]
    );
    wait_until("the second EnsuredLoadBalancer", || async { (notes("EnsuredLoadBalancer").len() == 2).then_some(()) })
        .await;
    assert_eq!(
        notes("EnsuredLoadBalancer"),
        vec![
            (format!("Ensured load balancer: 192.0.2.0 (cluster {cluster})"), Value::Null),
            (format!("Ensured load balancer: 2001:db8::55 (cluster {cluster})"), Value::Null)
        ]
    );
    let shown = Api::new(&running).ok("/api/v1/services/ns/moves").await;
    assert_eq!(shown["service"]["view"]["requestedIPs"], json!(["2001:db8::55"]), "{shown}");
    assert_eq!(shown["service"]["view"]["allocation"]["pool"], "v6", "{shown}");
    running.stop().await.unwrap();
}

/// A Service whose stored allocation predates `perAddress` (an upgrade) is not re-announced for it:
/// the first start rewrites its row (no event, no delivery) and the API then shows each address's
/// family and pool.
#[tokio::test]
async fn an_allocation_stored_without_per_address_is_completed_without_an_event() {
    use vipwatch::store::NoOutbox;
    let h = Harness::new().await;
    let rx = Receiver::ok().await;
    h.api.apply(lb_service("ns", "old", 80));
    let object = h.api.get("ns", "old").unwrap();
    let svc: k8s_openapi::api::core::v1::Service = serde_json::from_value(object.clone()).unwrap();
    let mut view = vipwatch::model::ServiceView::from_service(&svc);
    let mut stored = vipwatch_contract::Allocation::from_pools(vec![("192.0.2.0".parse().unwrap(), "lab".into())]);
    stored.per_address.clear();
    view.allocation = Some(stored);
    let tracked = vipwatch::model::Tracked {
        uid: object["metadata"]["uid"].as_str().unwrap().to_owned(),
        resource_version: object["metadata"]["resourceVersion"].as_str().unwrap().to_owned(),
        view: Arc::new(view),
        backends: Arc::default(),
    };
    let store = h.store().await;
    let key = vipwatch::model::ServiceKey::new("ns", "old");
    store
        .apply(&[vipwatch::store::StateChange::Refresh { key, tracked: Box::new(tracked) }], &[], &NoOutbox)
        .await
        .unwrap();
    store.close().await;
    let mut config = config(&h, &rx, vec![pool("lab", &["192.0.2.0/28"])]);
    config.backends.mode = toml::from_str::<toml::Value>("m = \"none\"").unwrap()["m"].clone().try_into().unwrap();
    let running = h.start(config).await;
    wait_ingress(&h.api, "ns", "old", vip("192.0.2.0")).await;
    let api = Api::new(&running);
    let shown = wait_until("the row completed", || async {
        let shown = api.ok("/api/v1/services/ns/old").await;
        (shown["service"]["view"]["allocation"]["perAddress"] != json!([])).then_some(shown)
    })
    .await;
    assert_eq!(
        shown["service"]["view"]["allocation"]["perAddress"],
        json!([{"address": "192.0.2.0", "family": "IPv4", "pool": "lab"}])
    );
    assert_eq!(common::events(&running.store).await, vec![], "no event");
    assert_eq!(rx.accepted().len(), 0, "no delivery");
    running.stop().await.unwrap();
}
