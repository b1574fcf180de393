//! The mass-deletion guard. One list that would delete most Services at once (a
//! relist after downtime, a namespace typo in the config) holds those deletions: no DELETED recorded
//! or relayed, VIPs kept, an error, a metric, Kubernetes Events and `GET /api/v1/deletions/held` say
//! so; released through the API or confirmed by a later list. Normal churn and live watch deletions
//! are not held. Real sockets throughout: the fake apiserver, a real SQLite file, a real receiver.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::api::{Api, TOKEN, assert_problem};
use common::receiver::Receiver;
use common::*;
use serde_json::json;
use vipwatch::config::{Config, Secret};

/// A config with one endpoint at `rx`, a pool of 254 addresses and the API token.
fn config(h: &Harness, rx: &Receiver) -> Config {
    let mut c = h.config_with(vec![webhook("lb", &rx.url)]);
    c.pools = vec![toml::from_str("name = \"lab\"\naddresses = [\"192.0.2.0/24\"]\n").unwrap()];
    c.server.api_token = Some(Secret::new(TOKEN));
    c
}

fn name(i: usize) -> String {
    format!("svc-{i:02}")
}

/// Seeds `n` Services `shop/svc-NN`, starts vipwatch and waits until their ADDEDs are delivered.
async fn seeded(h: &Harness, rx: &Receiver, config: Config, n: usize) -> vipwatch::app::Running {
    h.api.seed((0..n).map(|i| lb_service("shop", &name(i), 1000 + i as i64)));
    let vw = h.start(config).await;
    wait_events(&vw.store, n).await;
    wait_until(&format!("{n} ADDEDs delivered"), || async { (accepted(rx, "ADDED") == n).then_some(()) }).await;
    vw
}

/// Deliveries of `kind` the receiver accepted.
fn accepted(rx: &Receiver, kind: &str) -> usize {
    rx.accepted().iter().filter(|h| h.event().0 == kind).count()
}

/// Event rows of `kind` as `(cause, namespace/name)`, sorted.
async fn recorded(vw: &vipwatch::app::Running, kind: &str) -> Vec<(String, String)> {
    let mut rows: Vec<_> = events(&vw.store)
        .await
        .into_iter()
        .filter(|r| r.event_type == kind)
        .map(|r| (r.cause, r.key.to_string()))
        .collect();
    rows.sort();
    rows
}

/// `namespace/name` of every held deletion the API lists.
async fn held(api: &Api) -> Vec<String> {
    let items = api.all("/api/v1/deletions/held", 20).await;
    items.iter().map(|i| format!("{}/{}", i["namespace"].as_str().unwrap(), i["name"].as_str().unwrap())).collect()
}

/// The Kubernetes Events with reason `DeletionHeld`, as `namespace/name` of the Service they regard.
fn held_events(h: &Harness) -> BTreeSet<String> {
    h.api
        .events()
        .iter()
        .filter(|e| e["reason"] == "DeletionHeld")
        .inspect(|e| assert_eq!(e["type"], "Warning", "{e}"))
        .map(|e| {
            format!("{}/{}", e["regarding"]["namespace"].as_str().unwrap(), e["regarding"]["name"].as_str().unwrap())
        })
        .collect()
}

fn keys(range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("shop/{}", name(i))).collect()
}

#[tokio::test]
async fn forty_five_of_fifty_gone_while_down_are_held_across_a_restart_until_released_through_the_api() {
    let h = Harness::new().await;
    let rx = Receiver::ok().await;
    let vw = seeded(&h, &rx, config(&h, &rx), 50).await;
    vw.stop().await.unwrap();
    for i in 5..50 {
        assert!(h.api.delete_now("shop", &name(i)));
    }

    let vw = h.start(config(&h, &rx)).await;
    let api = Api::new(&vw);
    assert_eq!(held(&api).await, keys(5..50));
    assert_eq!(recorded(&vw, "DELETED").await, Vec::<(String, String)>::new());
    assert_eq!(events(&vw.store).await.len(), 50);
    assert_eq!(api.metric("vipwatch_deletions_held").await, 45.0);
    assert_eq!(api.metric("vipwatch_deletion_guard_trips_total{cause=\"startup\"}").await, 1.0);
    let first = &api.ok("/api/v1/deletions/held?limit=1").await["items"][0];
    assert_eq!((first["scope"].as_str(), first["cause"].as_str()), (Some("*"), Some("startup")));
    assert_eq!(first["reason"], "45 of 50 tracked Services vanished from one startup list of scope `*`");
    // The VIPs stay allocated: every state row keeps its pool address.
    let rows = services(&vw.store).await;
    assert_eq!(rows.len(), 50);
    assert!(rows.iter().all(|r| r.view.vips().len() == 1), "every Service keeps its VIP");
    assert_eq!(api.metric("vipwatch_pool_addresses_in_use{pool=\"lab\"}").await, 50.0);
    assert_eq!(api.ok("/api/v1/services/shop/svc-10").await["service"]["held_deletion"], true);
    assert_eq!(api.ok("/api/v1/services/shop/svc-01").await["service"]["held_deletion"], false);
    let want: BTreeSet<String> = keys(5..50).into_iter().collect();
    wait_until("45 DeletionHeld Events", || async { (held_events(&h) == want).then_some(()) }).await;

    // Held state survives a restart, and the same list does not trip the guard again.
    vw.stop().await.unwrap();
    let vw = h.start(config(&h, &rx)).await;
    let api = Api::new(&vw);
    assert_eq!(held(&api).await, keys(5..50));
    assert_eq!(api.metric("vipwatch_deletions_held").await, 45.0);
    assert_eq!(api.metric("vipwatch_deletion_guard_trips_total{cause=\"startup\"}").await, 0.0);
    assert_eq!(recorded(&vw, "DELETED").await, Vec::<(String, String)>::new());
    assert_eq!(accepted(&rx, "DELETED"), 0);

    assert_problem(&api.post("/api/v1/deletions/held/release", None).await, 401, "unauthorized");
    let answer = api.post("/api/v1/deletions/held/release", Some(TOKEN)).await;
    assert_eq!(answer.status.as_u16(), 202, "{}", answer.text);
    assert_eq!(answer.body, json!({"releasing": 45}));
    wait_until("45 DELETEDs delivered", || async { (accepted(&rx, "DELETED") == 45).then_some(()) }).await;
    let want: Vec<(String, String)> = keys(5..50).into_iter().map(|k| (s("startup"), k)).collect();
    assert_eq!(recorded(&vw, "DELETED").await, want);
    assert_eq!(held(&api).await, Vec::<String>::new());
    assert_eq!(api.metric("vipwatch_deletions_held").await, 0.0);
    assert_eq!(api.metric("vipwatch_held_deletions_released_total{how=\"api\"}").await, 45.0);
    assert_eq!(services(&vw.store).await.len(), 5);
    assert_eq!(api.ok("/api/v1/services/shop/svc-01").await["service"]["held_deletion"], false);
    vw.stop().await.unwrap();
}

#[tokio::test]
async fn held_deletions_are_recorded_by_a_later_list_once_confirm_after_has_passed() {
    let h = Harness::new().await;
    let rx = Receiver::ok().await;
    let mut c = config(&h, &rx);
    c.guard.confirm_after = Duration::from_secs(2);
    c.kubernetes.relist_interval = Duration::from_secs(1);
    let vw = seeded(&h, &rx, c.clone(), 10).await;
    vw.stop().await.unwrap();
    for i in 2..10 {
        assert!(h.api.delete_now("shop", &name(i)));
    }

    let vw = h.start(c).await;
    let api = Api::new(&vw);
    assert_eq!(held(&api).await, keys(2..10));
    assert_eq!(recorded(&vw, "DELETED").await, Vec::<(String, String)>::new());
    // The periodic relist (every 1 s) confirms them once they have been held for 2 s.
    wait_until("8 DELETEDs delivered", || async { (accepted(&rx, "DELETED") == 8).then_some(()) }).await;
    let want: Vec<(String, String)> = keys(2..10).into_iter().map(|k| (s("startup"), k)).collect();
    assert_eq!(recorded(&vw, "DELETED").await, want);
    assert_eq!(held(&api).await, Vec::<String>::new());
    assert_eq!(api.metric("vipwatch_held_deletions_released_total{how=\"confirmed\"}").await, 8.0);
    assert_eq!(api.metric("vipwatch_deletion_guard_trips_total{cause=\"relist\"}").await, 0.0, "confirming is no trip");
    assert_eq!(api.metric("vipwatch_deletions_held").await, 0.0);
    vw.stop().await.unwrap();
}

#[tokio::test]
async fn a_namespace_typo_holds_everything_and_fixing_it_lets_go_without_an_event() {
    let h = Harness::new().await;
    let rx = Receiver::ok().await;
    let mut c = config(&h, &rx);
    c.kubernetes.namespaces = vec![s("shop")];
    let vw = seeded(&h, &rx, c.clone(), 10).await;
    vw.stop().await.unwrap();

    let mut typo = c.clone();
    typo.kubernetes.namespaces = vec![s("shpo")];
    let vw = h.start(typo).await;
    let api = Api::new(&vw);
    assert_eq!(held(&api).await, keys(0..10));
    let first = &api.ok("/api/v1/deletions/held?limit=1").await["items"][0];
    assert_eq!((first["scope"].as_str(), first["cause"].as_str()), (Some("unwatched"), Some("startup")));
    assert_eq!(recorded(&vw, "DELETED").await, Vec::<(String, String)>::new());
    assert_eq!(api.metric("vipwatch_deletions_held").await, 10.0);
    assert_eq!(api.metric("vipwatch_deletion_guard_trips_total{cause=\"startup\"}").await, 1.0);
    let want: BTreeSet<String> = keys(0..10).into_iter().collect();
    wait_until("10 DeletionHeld Events", || async { (held_events(&h) == want).then_some(()) }).await;
    vw.stop().await.unwrap();

    // The namespace fixed: every Service is listed again, nothing held, no event at all.
    let vw = h.start(c).await;
    let api = Api::new(&vw);
    assert_eq!(held(&api).await, Vec::<String>::new());
    assert_eq!(api.metric("vipwatch_held_deletions_released_total{how=\"reappeared\"}").await, 10.0);
    assert_eq!(events(&vw.store).await.len(), 10);
    assert_eq!(services(&vw.store).await.len(), 10);
    assert_eq!(accepted(&rx, "DELETED"), 0);
    vw.stop().await.unwrap();
}

#[tokio::test]
async fn a_410_relist_with_a_few_deletions_records_them_as_usual() {
    let h = Harness::new().await;
    let rx = Receiver::ok().await;
    let vw = seeded(&h, &rx, config(&h, &rx), 50).await;
    let api = Api::new(&vw);
    wait_watching(&h.api).await;
    h.api.faults().force_gone();
    // 6 of 50: above guard.min_deletions (5) but not above half.
    for i in 0..6 {
        assert!(h.api.delete_now("shop", &name(i)));
    }
    wait_until("6 DELETEDs delivered", || async { (accepted(&rx, "DELETED") == 6).then_some(()) }).await;
    let want: Vec<(String, String)> = keys(0..6).into_iter().map(|k| (s("relist"), k)).collect();
    assert_eq!(recorded(&vw, "DELETED").await, want);
    assert_eq!(held(&api).await, Vec::<String>::new());
    assert_eq!(api.metric("vipwatch_deletion_guard_trips_total{cause=\"relist\"}").await, 0.0);
    vw.stop().await.unwrap();
}

#[tokio::test]
async fn deletions_seen_on_the_live_watch_are_never_held() {
    let h = Harness::new().await;
    let rx = Receiver::ok().await;
    let vw = seeded(&h, &rx, config(&h, &rx), 20).await;
    let api = Api::new(&vw);
    for i in 0..20 {
        assert!(h.api.delete_now("shop", &name(i)));
    }
    wait_until("20 DELETEDs delivered", || async { (accepted(&rx, "DELETED") == 20).then_some(()) }).await;
    let want: Vec<(String, String)> = keys(0..20).into_iter().map(|k| (s("watch"), k)).collect();
    assert_eq!(recorded(&vw, "DELETED").await, want);
    assert_eq!(held(&api).await, Vec::<String>::new());
    vw.stop().await.unwrap();
}
