//! An address never reaches the appliance for a second Service before the appliance
//! acknowledged that the first one gave it up. One test per path that frees a pool address (a
//! DELETED, a lost database with a terminating Service, a type change, a changed request), each over
//! the fake apiserver, a real SQLite file and a real receiver that refuses the withdrawal until told.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::api::Api;
use common::receiver::{Hit, Receiver, Reply};
use common::{Harness, lb_service, wait_until, webhook};
use serde_json::{Value, json};
use vipwatch::config::{Config, PoolConfig};
use vipwatch::fake_apiserver::FakeApiServer;

/// The one address of pool `one`.
const X: &str = "192.0.2.1";

fn pool(name: &str, addresses: &[&str], auto_assign: bool) -> PoolConfig {
    let toml = format!("name = \"{name}\"\naddresses = {addresses:?}\nauto_assign = {auto_assign}\n");
    toml::from_str(&toml).unwrap()
}

fn config(h: &Harness, rx: &Receiver, pools: Vec<PoolConfig>) -> Config {
    let mut c = h.config_with(vec![webhook("lb", &rx.url)]);
    c.pools = pools;
    c
}

/// A receiver that answers 503 to the `event` of Service `name` while the returned flag is set, and
/// 204 to everything else.
async fn refusing(event: &'static str, name: &'static str) -> (Receiver, Arc<AtomicBool>) {
    let refuse = Arc::new(AtomicBool::new(true));
    let flag = refuse.clone();
    let rx = Receiver::start(move |_, hit| {
        let (kind, svc) = what(hit);
        Reply::Status(if kind == event && svc == name && flag.load(Ordering::SeqCst) { 503 } else { 204 })
    })
    .await;
    (rx, refuse)
}

/// `(event, service name)` of a delivery.
fn what(hit: &Hit) -> (String, String) {
    let b = hit.json();
    (b["data"]["event"].as_str().unwrap().to_owned(), b["data"]["service"]["name"].as_str().unwrap().to_owned())
}

/// `(event, service name, vips)` of the accepted deliveries from index `from` on.
fn accepted(rx: &Receiver, from: usize) -> Vec<(String, String, Value)> {
    let hits = rx.accepted();
    hits[from..]
        .iter()
        .map(|h| {
            let (kind, name) = what(h);
            (kind, name, h.json()["data"]["service"]["vips"].clone())
        })
        .collect()
}

fn row(kind: &str, name: &str, vips: Value) -> (String, String, Value) {
    (kind.to_owned(), name.to_owned(), vips)
}

fn ingress(api: &FakeApiServer, name: &str) -> Value {
    api.get("ns", name).and_then(|s| s.pointer("/status/loadBalancer/ingress").cloned()).unwrap_or(Value::Null)
}

async fn wait_ingress(api: &FakeApiServer, name: &str, want: Value) {
    wait_until(&format!("status of ns/{name} = {want}"), || async { (ingress(api, name) == want).then_some(()) }).await;
}

fn vip(ip: &str) -> Value {
    json!([{"ip": ip, "ipMode": "VIP"}])
}

/// Refused attempts of `event` of Service `name` so far.
fn refused(rx: &Receiver, event: &str, name: &str) -> usize {
    let all = rx.hits().iter().filter(|h| what(h) == (event.to_owned(), name.to_owned())).count();
    let ok = rx.accepted().iter().filter(|h| what(h) == (event.to_owned(), name.to_owned())).count();
    all - ok
}

/// Waits until the receiver accepted `b`'s ADDED.
async fn wait_b_added(rx: &Receiver) {
    wait_until("b's ADDED accepted", || async {
        rx.accepted().iter().any(|h| what(h) == ("ADDED".to_owned(), "b".to_owned())).then_some(())
    })
    .await;
}

/// Waits until `b`'s ADDED (without an address: the pool is full) was accepted and the refused
/// withdrawal of `a` was retried once more after it, then checks that `b` got nothing meanwhile.
async fn b_waits_while_refused(h: &Harness, rx: &Receiver, event: &str) {
    wait_b_added(rx).await;
    let attempts = refused(rx, event, "a");
    wait_until("another refused attempt after b's ADDED", || async {
        (refused(rx, event, "a") > attempts).then_some(())
    })
    .await;
    assert_eq!(ingress(&h.api, "b"), Value::Null, "b has no address while a's {event} is unacknowledged");
    let b_with_x = rx.hits().iter().any(|h| what(h).1 == "b" && h.json()["data"]["service"]["vips"] == json!([X]));
    assert!(!b_with_x, "no delivery of b carries {X} yet");
}

#[tokio::test]
async fn a_deleted_services_address_goes_to_a_waiting_service_only_after_the_deleted_is_acknowledged() {
    deleted_address_waits_for_the_acknowledgement(true).await;
}

/// Without our finalizer the Service is gone at once, and the watch's DELETED carries the object as
/// the apiserver last had it, with no allocation: the address must still be reserved for that DELETED
/// and freed once it is acknowledged (it was held until a restart).
#[tokio::test]
async fn without_the_finalizer_a_deleted_services_address_is_freed_once_its_deleted_is_acknowledged() {
    deleted_address_waits_for_the_acknowledgement(false).await;
}

/// a holds the pool's one address and is deleted (with `kubernetes.finalizer` as given) while the
/// receiver refuses its DELETED; b, created then, gets the address only once that is acknowledged.
async fn deleted_address_waits_for_the_acknowledgement(finalizer: bool) {
    let h = Harness::new().await;
    let (rx, refuse) = refusing("DELETED", "a").await;
    h.api.apply(lb_service("ns", "a", 80));
    let mut c = config(&h, &rx, vec![pool("one", &[X], true)]);
    c.kubernetes.finalizer = finalizer;
    let running = h.start(c).await;
    wait_ingress(&h.api, "a", vip(X)).await;
    assert!(h.api.delete("ns", "a"));
    assert_eq!(h.api.get("ns", "a").is_some(), finalizer, "only the finalizer keeps a terminating");
    wait_until("a refused DELETED", || async { (refused(&rx, "DELETED", "a") > 0).then_some(()) }).await;
    h.api.apply(lb_service("ns", "b", 80));
    b_waits_while_refused(&h, &rx, "DELETED").await;
    let api = Api::new(&running);
    let gauge = |g: &str, n: u32| format!("vipwatch_pool_addresses_{g}{{pool=\"one\"}} {n}\n");
    let metrics = api.get("/metrics").await.text;
    assert!(metrics.contains(&gauge("reserved", 1)), "{metrics}");
    refuse.store(false, Ordering::SeqCst);
    wait_ingress(&h.api, "b", vip(X)).await;
    let metrics = api.get("/metrics").await.text;
    assert!(metrics.contains(&gauge("reserved", 0)) && metrics.contains(&gauge("in_use", 1)), "b holds it: {metrics}");
    assert_eq!(
        accepted(&rx, 0),
        vec![
            row("ADDED", "a", json!([X])),
            row("ADDED", "b", json!([])),
            row("DELETED", "a", json!([X])),
            row("MODIFIED", "b", json!([X])),
        ]
    );
    running.stop().await.unwrap();
}

/// The pool gauges follow an acknowledged withdrawal that changes nothing else (no Service waits for
/// the address): they were only set with a plan that stored something, so they showed the address
/// reserved until the next change of any Service.
#[tokio::test]
async fn the_pool_gauges_show_an_acknowledged_release_without_waiting_for_another_change() {
    let h = Harness::new().await;
    let (rx, refuse) = refusing("DELETED", "a").await;
    h.api.apply(lb_service("ns", "a", 80));
    h.api.apply(lb_service("ns", "b", 80));
    let running = h.start(config(&h, &rx, vec![pool("two", &[X, "192.0.2.2"], true)])).await;
    wait_ingress(&h.api, "a", vip(X)).await;
    wait_ingress(&h.api, "b", vip("192.0.2.2")).await;
    let api = Api::new(&running);
    let gauges = || async {
        let text = api.get("/metrics").await.text;
        ["in_use", "free", "reserved"].map(|g| {
            let line = format!("vipwatch_pool_addresses_{g}{{pool=\"two\"}} ");
            text.lines().find_map(|l| l.strip_prefix(line.as_str())).unwrap_or("?").to_owned()
        })
    };
    assert!(h.api.delete("ns", "a"));
    wait_until("a refused DELETED", || async { (refused(&rx, "DELETED", "a") > 0).then_some(()) }).await;
    wait_until("a's address reserved", || async { (gauges().await == ["2", "0", "1"]).then_some(()) }).await;
    refuse.store(false, Ordering::SeqCst);
    wait_until("a is gone", || async { h.api.get("ns", "a").is_none().then_some(()) }).await;
    wait_until("gauges after the release", || async { (gauges().await == ["1", "1", "0"]).then_some(()) }).await;
    running.stop().await.unwrap();
}

#[tokio::test]
async fn after_a_lost_database_a_terminating_services_address_stays_reserved_until_its_deleted_is_acknowledged() {
    lost_database_terminating_frees_on_acknowledgement(None).await;
}

/// a holds the pool's one address; while vipwatch is down its type changes to `retyped` (if any), the
/// database is lost, and a is deleted (our finalizer keeps it terminating, still showing the
/// address) and b created. At start a's DELETED carries the address, which b gets only once that is
/// acknowledged, and a's finalizer comes off.
async fn lost_database_terminating_frees_on_acknowledgement(retyped: Option<&str>) {
    let h = Harness::new().await;
    let (rx, refuse) = refusing("DELETED", "a").await;
    h.api.apply(lb_service("ns", "a", 80));
    let pools = vec![pool("one", &[X], true)];
    let running = h.start(config(&h, &rx, pools.clone())).await;
    wait_ingress(&h.api, "a", vip(X)).await;
    running.stop().await.unwrap();
    if let Some(ty) = retyped {
        h.api.update("ns", "a", |s| s["spec"]["type"] = json!(ty)).unwrap();
    }
    h.wipe_database().await;
    assert!(h.api.delete("ns", "a"));
    assert_eq!(ingress(&h.api, "a"), vip(X), "terminating, still showing its address");
    h.api.apply(lb_service("ns", "b", 80));
    let before = rx.accepted().len();
    let running = h.start(config(&h, &rx, pools)).await;
    wait_until("a refused DELETED", || async { (refused(&rx, "DELETED", "a") > 0).then_some(()) }).await;
    b_waits_while_refused(&h, &rx, "DELETED").await;
    refuse.store(false, Ordering::SeqCst);
    wait_ingress(&h.api, "b", vip(X)).await;
    wait_until("a is gone", || async { h.api.get("ns", "a").is_none().then_some(()) }).await;
    assert_eq!(
        accepted(&rx, before),
        vec![row("ADDED", "b", json!([])), row("DELETED", "a", json!([X])), row("MODIFIED", "b", json!([X]))]
    );
    running.stop().await.unwrap();
}

#[tokio::test]
async fn a_type_change_away_from_load_balancer_frees_the_address_only_after_the_appliance_acknowledged_it() {
    let h = Harness::new().await;
    let (rx, refuse) = refusing("MODIFIED", "a").await;
    h.api.apply(lb_service("ns", "a", 80));
    let mut c = config(&h, &rx, vec![pool("one", &[X], true)]);
    // NodePort Services stay in scope: the change is a MODIFIED that withdraws the address.
    c.kubernetes.service_types = vec!["LoadBalancer".into(), "NodePort".into()];
    let running = h.start(c).await;
    wait_ingress(&h.api, "a", vip(X)).await;
    h.api.apply(lb_service("ns", "b", 80));
    wait_b_added(&rx).await;
    h.api.update("ns", "a", |s| s["spec"]["type"] = json!("NodePort")).unwrap();
    wait_until("a refused MODIFIED", || async { (refused(&rx, "MODIFIED", "a") > 0).then_some(()) }).await;
    b_waits_while_refused(&h, &rx, "MODIFIED").await;
    refuse.store(false, Ordering::SeqCst);
    wait_ingress(&h.api, "b", vip(X)).await;
    let seen: Vec<(String, String)> = accepted(&rx, 0).into_iter().map(|(k, n, _)| (k, n)).collect();
    let pairs = |v: &[(&str, &str)]| v.iter().map(|(k, n)| (k.to_string(), n.to_string())).collect::<Vec<_>>();
    assert_eq!(seen, pairs(&[("ADDED", "a"), ("ADDED", "b"), ("MODIFIED", "a"), ("MODIFIED", "b")]));
    // a's MODIFIED takes its VIP away (its status still showed X then), b's gives it to b.
    assert_eq!(accepted(&rx, 2), vec![row("MODIFIED", "a", json!([])), row("MODIFIED", "b", json!([X]))]);
    // The status a kept from its LoadBalancer days is cleared, as the upstream controller clears it.
    wait_ingress(&h.api, "a", Value::Null).await;
    let vips = Api::new(&running).ok("/api/v1/vips").await;
    let listed: Vec<(&str, &str)> = vips["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| (v["ip"].as_str().unwrap(), v["name"].as_str().unwrap()))
        .collect();
    assert_eq!(listed, vec![(X, "b")], "one Service per address: {vips}");
    running.stop().await.unwrap();
}

#[tokio::test]
async fn a_changed_address_request_frees_the_old_address_only_after_the_appliance_acknowledged_it() {
    let h = Harness::new().await;
    let (rx, refuse) = refusing("MODIFIED", "a").await;
    h.api.apply(lb_service("ns", "a", 80));
    // `manual` is never auto-assigned: only an explicit request takes its address.
    let pools = vec![pool("one", &[X], true), pool("manual", &["198.51.100.1"], false)];
    let running = h.start(config(&h, &rx, pools)).await;
    wait_ingress(&h.api, "a", vip(X)).await;
    h.api.apply(lb_service("ns", "b", 80));
    wait_b_added(&rx).await;
    h.api
        .update("ns", "a", |s| {
            s["metadata"]["annotations"] = json!({"vipwatch.io/loadBalancerIPs": "198.51.100.1"});
        })
        .unwrap();
    wait_until("a refused MODIFIED", || async { (refused(&rx, "MODIFIED", "a") > 0).then_some(()) }).await;
    b_waits_while_refused(&h, &rx, "MODIFIED").await;
    refuse.store(false, Ordering::SeqCst);
    wait_ingress(&h.api, "b", vip(X)).await;
    wait_ingress(&h.api, "a", vip("198.51.100.1")).await;
    assert_eq!(
        accepted(&rx, 0),
        vec![
            row("ADDED", "a", json!([X])),
            row("ADDED", "b", json!([])),
            row("MODIFIED", "a", json!(["198.51.100.1"])),
            row("MODIFIED", "b", json!([X])),
        ]
    );
    running.stop().await.unwrap();
}

#[tokio::test]
async fn a_withdrawal_superseded_by_a_later_change_frees_the_address_once_that_change_is_acknowledged() {
    let h = Harness::new().await;
    let (rx, refuse) = refusing("MODIFIED", "a").await;
    h.api.apply(lb_service("ns", "a", 80));
    let pools = vec![pool("one", &[X], true), pool("manual", &["198.51.100.1"], false)];
    let running = h.start(config(&h, &rx, pools)).await;
    wait_ingress(&h.api, "a", vip(X)).await;
    h.api.apply(lb_service("ns", "b", 80));
    wait_b_added(&rx).await;
    // A label change sits refused at the head of a's queue; the withdrawal of X queues behind it and
    // is superseded by the next change: the appliance only ever gets the label changes' views.
    h.api.update("ns", "a", |s| s["metadata"]["labels"]["rev"] = json!("1")).unwrap();
    wait_until("a refused MODIFIED", || async { (refused(&rx, "MODIFIED", "a") > 0).then_some(()) }).await;
    h.api
        .update("ns", "a", |s| {
            s["metadata"]["annotations"] = json!({"vipwatch.io/loadBalancerIPs": "198.51.100.1"});
        })
        .unwrap();
    h.api.update("ns", "a", |s| s["metadata"]["labels"]["rev"] = json!("2")).unwrap();
    wait_until("the withdrawal superseded", || async {
        let rows = running.store.deliveries(&Default::default()).await.unwrap();
        rows.iter().any(|d| d.key.name == "a" && d.state == "superseded").then_some(())
    })
    .await;
    b_waits_while_refused(&h, &rx, "MODIFIED").await;
    refuse.store(false, Ordering::SeqCst);
    wait_ingress(&h.api, "b", vip(X)).await;
    assert_eq!(
        accepted(&rx, 0),
        vec![
            row("ADDED", "a", json!([X])),
            row("ADDED", "b", json!([])),
            row("MODIFIED", "a", json!([X])),
            row("MODIFIED", "a", json!(["198.51.100.1"])),
            row("MODIFIED", "b", json!([X])),
        ]
    );
    running.stop().await.unwrap();
}

#[tokio::test]
async fn a_service_replaced_under_the_same_name_keeps_the_old_objects_address_until_its_deleted_is_acknowledged() {
    let h = Harness::new().await;
    let (rx, refuse) = refusing("DELETED", "a").await;
    h.api.apply(lb_service("ns", "a", 80));
    h.api.apply(lb_service("ns", "b", 80));
    let pools = vec![pool("one", &[X], true), pool("manual", &["198.51.100.1"], false)];
    let running = h.start(config(&h, &rx, pools.clone())).await;
    wait_ingress(&h.api, "a", vip(X)).await;
    wait_b_added(&rx).await;
    running.stop().await.unwrap();
    // While vipwatch is down, a is deleted for good and a new object of that name asks for another
    // address: the start records the DELETED of the old object and the ADDED of the new one.
    assert!(h.api.delete_now("ns", "a"));
    let mut new_a = lb_service("ns", "a", 80);
    new_a["metadata"]["annotations"] = json!({"vipwatch.io/loadBalancerIPs": "198.51.100.1"});
    h.api.apply(new_a);
    let before = rx.accepted().len();
    let running = h.start(config(&h, &rx, pools)).await;
    wait_until("a refused DELETED", || async { (refused(&rx, "DELETED", "a") > 0).then_some(()) }).await;
    let attempts = refused(&rx, "DELETED", "a");
    wait_until("another refused DELETED", || async { (refused(&rx, "DELETED", "a") > attempts).then_some(()) }).await;
    let b_with_x = rx.hits().iter().any(|h| what(h).1 == "b" && h.json()["data"]["service"]["vips"] == json!([X]));
    assert!(!b_with_x, "no delivery of b carries {X} while the old a's DELETED is unacknowledged");
    refuse.store(false, Ordering::SeqCst);
    wait_ingress(&h.api, "b", vip(X)).await;
    wait_ingress(&h.api, "a", vip("198.51.100.1")).await;
    let mut sent = accepted(&rx, before);
    // The new a's ADDED and b's MODIFIED are in different queues: only "after the DELETED" is ordered.
    let deleted = sent.iter().position(|r| *r == row("DELETED", "a", json!([X]))).expect("the DELETED");
    let b_gets_x = sent.iter().position(|r| *r == row("MODIFIED", "b", json!([X]))).expect("b gets X");
    assert!(deleted < b_gets_x, "{sent:?}");
    sent.sort_by(|l, r| (&l.0, &l.1).cmp(&(&r.0, &r.1)));
    assert_eq!(
        sent,
        vec![
            row("ADDED", "a", json!(["198.51.100.1"])),
            row("DELETED", "a", json!([X])),
            row("MODIFIED", "b", json!([X]))
        ]
    );
    running.stop().await.unwrap();
}

#[tokio::test]
async fn a_pool_change_that_moves_a_service_frees_its_old_address_only_after_the_appliance_acknowledged_it() {
    let h = Harness::new().await;
    let (rx, refuse) = refusing("MODIFIED", "a").await;
    h.api.apply(lb_service("ns", "a", 80));
    h.api.apply(lb_service("other", "b", 80));
    let running = h.start(config(&h, &rx, vec![pool("one", &[X], true)])).await;
    wait_ingress(&h.api, "a", vip(X)).await;
    wait_b_added(&rx).await;
    running.stop().await.unwrap();
    // X moves to a pool only namespace `other` may use: a gets 192.0.2.9 at start, b may have X —
    // once the appliance acknowledged a's MODIFIED.
    let only_other: PoolConfig =
        toml::from_str(&format!("name = \"two\"\naddresses = [\"{X}\"]\nnamespaces = [\"other\"]\n")).unwrap();
    let before = rx.accepted().len();
    let running = h.start(config(&h, &rx, vec![pool("one", &["192.0.2.9"], true), only_other])).await;
    wait_until("a refused MODIFIED", || async { (refused(&rx, "MODIFIED", "a") > 0).then_some(()) }).await;
    let attempts = refused(&rx, "MODIFIED", "a");
    wait_until("another refused MODIFIED", || async { (refused(&rx, "MODIFIED", "a") > attempts).then_some(()) }).await;
    let b_status = || h.api.get("other", "b").and_then(|s| s.pointer("/status/loadBalancer/ingress").cloned());
    assert_eq!(b_status(), None, "b has no address while a's MODIFIED is unacknowledged");
    let b_with_x = rx.hits().iter().any(|h| what(h).1 == "b" && h.json()["data"]["service"]["vips"] == json!([X]));
    assert!(!b_with_x, "no delivery of b carries {X} yet");
    refuse.store(false, Ordering::SeqCst);
    wait_until("b shows X", || async { (b_status() == Some(vip(X))).then_some(()) }).await;
    assert_eq!(
        accepted(&rx, before),
        vec![
            // b's reason changed with the pools (X is reserved now, not in an exhausted pool).
            row("MODIFIED", "b", json!([])),
            row("MODIFIED", "a", json!(["192.0.2.9"])),
            row("MODIFIED", "b", json!([X])),
        ]
    );
    running.stop().await.unwrap();
}

/// `svc` sharing its address under key `k`.
fn shared(mut svc: Value) -> Value {
    svc["metadata"]["annotations"] = json!({"vipwatch.io/allow-shared-ip": "k"});
    svc
}

/// A Service sharing an address keeps it while its neighbour's DELETED is unacknowledged, through its
/// own changes and a restart: the neighbour's reservation keeps its sharing key and ports (it was
/// renumbered to another address at its next change).
#[tokio::test]
async fn a_service_sharing_an_address_keeps_it_while_its_neighbours_deleted_is_unacknowledged() {
    let h = Harness::new().await;
    let (rx, refuse) = refusing("DELETED", "b").await;
    h.api.apply(shared(lb_service("ns", "a", 80)));
    h.api.apply(shared(lb_service("ns", "b", 443)));
    let c = config(&h, &rx, vec![pool("two", &[X, "192.0.2.2"], true)]);
    let running = h.start(c.clone()).await;
    wait_ingress(&h.api, "a", vip(X)).await;
    wait_ingress(&h.api, "b", vip(X)).await;
    assert!(h.api.delete("ns", "b"));
    wait_until("b's refused DELETED", || async { (refused(&rx, "DELETED", "b") > 0).then_some(()) }).await;
    let a_changes = |rx: &Receiver| accepted(rx, 0).into_iter().filter(|(_, n, _)| n == "a").collect::<Vec<_>>();
    h.api.update("ns", "a", |s| s["metadata"]["labels"]["round"] = json!("1")).unwrap();
    wait_until("a's MODIFIED", || async { (a_changes(&rx).len() == 2).then_some(()) }).await;
    running.stop().await.unwrap();
    let running = h.start(c).await;
    h.api.update("ns", "a", |s| s["metadata"]["labels"]["round"] = json!("2")).unwrap();
    wait_until("a's second MODIFIED", || async { (a_changes(&rx).len() == 3).then_some(()) }).await;
    refuse.store(false, Ordering::SeqCst);
    wait_until("b is gone", || async { h.api.get("ns", "b").is_none().then_some(()) }).await;
    assert_eq!(
        a_changes(&rx),
        vec![row("ADDED", "a", json!([X])), row("MODIFIED", "a", json!([X])), row("MODIFIED", "a", json!([X]))]
    );
    assert_eq!(ingress(&h.api, "a"), vip(X));
    running.stop().await.unwrap();
}

/// A Service that gave its address up (here: a type change away from LoadBalancer, in scope) and
/// comes back before the appliance acknowledged it takes the same address back, after the
/// withdrawal in its own queue, instead of another one (or none, from a full pool).
#[tokio::test]
async fn a_service_coming_back_takes_back_the_address_it_gave_up() {
    let h = Harness::new().await;
    let (rx, refuse) = refusing("MODIFIED", "a").await;
    h.api.apply(lb_service("ns", "a", 80));
    let mut c = config(&h, &rx, vec![pool("two", &[X, "192.0.2.2"], true)]);
    c.kubernetes.service_types = vec!["LoadBalancer".into(), "NodePort".into()];
    let running = h.start(c).await;
    wait_ingress(&h.api, "a", vip(X)).await;
    h.api.update("ns", "a", |s| s["spec"]["type"] = json!("NodePort")).unwrap();
    wait_until("a refused MODIFIED", || async { (refused(&rx, "MODIFIED", "a") > 0).then_some(()) }).await;
    h.api.update("ns", "a", |s| s["spec"]["type"] = json!("LoadBalancer")).unwrap();
    refuse.store(false, Ordering::SeqCst);
    wait_until("a's last MODIFIED", || async { (accepted(&rx, 0).len() == 3).then_some(()) }).await;
    assert_eq!(
        accepted(&rx, 0),
        vec![row("ADDED", "a", json!([X])), row("MODIFIED", "a", json!([])), row("MODIFIED", "a", json!([X]))]
    );
    wait_ingress(&h.api, "a", vip(X)).await;
    running.stop().await.unwrap();
}

/// After a lost database, a terminating Service that is no longer a LoadBalancer (its type changed
/// while vipwatch was down) but still shows a pool address: its DELETED carries that address, which
/// stays reserved until it is acknowledged and is then free (it stayed reserved until a restart).
#[tokio::test]
async fn after_a_lost_database_a_terminating_service_of_another_type_frees_the_address_its_status_shows() {
    lost_database_terminating_frees_on_acknowledgement(Some("ClusterIP")).await;
}

/// A Service that moves its shared address to another port keeps the old port reserved until the
/// appliance acknowledged the move: a Service of the same sharing key asking for that port gets
/// another address meanwhile, not the one the appliance still serves that port on for the first.
#[tokio::test]
async fn a_shared_address_keeps_a_port_it_moved_away_from_until_the_move_is_acknowledged() {
    let h = Harness::new().await;
    let (rx, refuse) = refusing("MODIFIED", "a").await;
    h.api.apply(shared(lb_service("ns", "a", 443)));
    let running = h.start(config(&h, &rx, vec![pool("two", &[X, "192.0.2.2"], true)])).await;
    wait_ingress(&h.api, "a", vip(X)).await;
    h.api.update("ns", "a", |s| s["spec"]["ports"][0]["port"] = json!(8443)).unwrap();
    wait_until("a refused MODIFIED", || async { (refused(&rx, "MODIFIED", "a") > 0).then_some(()) }).await;
    h.api.apply(shared(lb_service("ns", "c", 443)));
    wait_ingress(&h.api, "c", vip("192.0.2.2")).await;
    refuse.store(false, Ordering::SeqCst);
    wait_until("a's MODIFIED", || async { (accepted(&rx, 0).len() == 3).then_some(()) }).await;
    assert_eq!(
        accepted(&rx, 0),
        vec![row("ADDED", "a", json!([X])), row("ADDED", "c", json!(["192.0.2.2"])), row("MODIFIED", "a", json!([X]))]
    );
    running.stop().await.unwrap();
}
