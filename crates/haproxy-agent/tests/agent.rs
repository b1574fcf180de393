//! The agent against a real HAProxy over real TCP: a delivery answered 2xx is live for the very next
//! connection, member changes go through the Runtime API without a reload, reloads drop no
//! connection, an impossible Service is refused alone, restarts reproduce the same configuration, a
//! killed HAProxy comes back with everything, and a full resync sweeps what it did not include.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use common::*;
use vipwatch_contract::MemberState;

#[tokio::test]
async fn an_answered_delivery_is_live_for_the_next_connection_and_members_change_without_a_reload() {
    let Some(agent) = Agent::start().await else { return };
    let (a, b) = (pod("a").await, pod("b").await);
    let vip = vip();
    let addr = format!("{vip}:18080");
    assert!(hit(&addr).await.is_err(), "nothing listens before the ADDED");

    let (status, body) = agent.send(&delivery("service.added", 1, "web", &vip, &[18080], &[active(0, a)])).await;
    assert_eq!((status, body["status"].as_str()), (200, Some("applied")));
    assert_eq!(hit(&addr).await.as_deref(), Ok("a"), "the next connection reaches the pod");
    let reloads = agent.reloads().await;

    // A rolling update: b arrives while a drains, then a is gone.
    let draining = [(0, a, MemberState::Draining), active(0, b)];
    assert_eq!(agent.send(&delivery("service.modified", 2, "web", &vip, &[18080], &draining)).await.0, 200);
    for _ in 0..4 {
        assert_eq!(hit(&addr).await.as_deref(), Ok("b"), "a draining member gets no new connection");
    }
    assert!(
        agent.config_text().contains(&format!("server s1 {a} weight 0\n    server s2 {b}\n")),
        "{}",
        agent.config_text()
    );
    let (status, _) = agent.send(&delivery("service.modified", 3, "web", &vip, &[18080], &[active(0, b)])).await;
    assert_eq!(status, 200);
    assert_eq!(hit(&addr).await.as_deref(), Ok("b"));
    assert!(agent.config_text().contains(&format!("server s1 127.0.0.1:1 disabled\n    server s2 {b}\n")));
    assert_eq!(agent.reloads().await, reloads, "member changes went through the Runtime API");

    let (status, _) = agent.send(&delivery("service.deleted", 4, "web", &vip, &[18080], &[active(0, b)])).await;
    assert_eq!(status, 200);
    assert!(hit(&addr).await.is_err(), "the VIP refuses connections once deleted");

    // Started empty, one reload for the ADDED, two runtime updates, one reload for the DELETED.
    let (status, metrics) = agent.get("/metrics").await;
    assert_eq!(status, 200);
    for line in [
        "vipwatch_haproxy_reloads_total{result=\"ok\"} 2",
        "vipwatch_haproxy_runtime_updates_total 2",
        "vipwatch_haproxy_deliveries_total{status=\"200\"} 4",
        "vipwatch_haproxy_apply_seconds_count 4",
        "vipwatch_haproxy_services{cluster=\"default\"} 0",
        "vipwatch_haproxy_up 1",
    ] {
        assert!(metrics.lines().any(|l| l == line), "missing `{line}` in:\n{metrics}");
    }
    // A first start, without a state: not caught up until vipwatch's first full resync went live
    // (here an empty one: the cluster has no Service left).
    let waiting = "not caught up: waiting for the first full resync (this run has none yet, and its state names no \
                   cluster to wait for)";
    assert_eq!(agent.get("/healthz").await, (503, waiting.to_owned()));
    assert_eq!(resync(&agent, "sync_1", &[]).await, [200]);
    assert_eq!(agent.get("/healthz").await, (200, "ok".to_owned()));
    agent.stop().await;
}

#[tokio::test]
async fn signatures_duplicates_and_stale_deliveries() {
    let Some(agent) = Agent::start().await else { return };
    let a = pod("a").await;
    let vip = vip();
    let added = delivery("service.added", 5, "web", &vip, &[18081], &[active(0, a)]);
    let forged = "whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
    let (status, body) = agent.send_as(&added, &fresh_id(), forged).await;
    assert_eq!((status, body["status"].as_u64()), (401, Some(401)));
    let id = fresh_id();
    assert_eq!(agent.send_as(&added, &id, SECRET).await, (200, serde_json::json!({"status": "applied"})));
    assert_eq!(agent.send_as(&added, &id, SECRET).await, (200, serde_json::json!({"status": "duplicate"})));
    let stale = delivery("service.modified", 4, "web", &vip, &[18081], &[]);
    let (status, body) = agent.send(&stale).await;
    assert_eq!((status, body["status"].as_str()), (200, Some("ignored")));
    assert_eq!(hit(&format!("{vip}:18081")).await.as_deref(), Ok("a"), "the stale delivery changed nothing");
    agent.stop().await;
}

#[tokio::test]
async fn an_impossible_service_is_refused_alone() {
    let Some(agent) = Agent::start().await else { return };
    let a = pod("a").await;
    let (v1, v2) = (vip(), vip());
    let good = delivery("service.added", 1, "good", &v1, &[18082], &[active(0, a)]);
    let mut udp = delivery("service.added", 2, "dns", &v2, &[53], &[]);
    std::sync::Arc::make_mut(&mut udp.data.service.as_mut().unwrap().view).ports[0].protocol = "UDP".into();
    // Both within one batch window: the UDP one is refused, the other applied.
    let (r1, r2) = tokio::join!(agent.send(&good), agent.send(&udp));
    assert_eq!(r1.0, 200);
    assert_eq!((r2.0, r2.1["detail"].as_str()), (422, Some("port 53/UDP: HAProxy proxies TCP only")));
    let clash = delivery("service.added", 3, "clash", &v1, &[18082], &[]);
    let r3 = agent.send(&clash).await;
    let detail = format!("{v1}:18082 is already bound by Service shop/good of cluster default");
    assert_eq!((r3.0, r3.1["detail"].as_str()), (422, Some(detail.as_str())));
    assert_eq!(hit(&format!("{v1}:18082")).await.as_deref(), Ok("a"));
    // A VIP another program holds: the reload could never succeed, so it is refused up front.
    let taken = std::net::TcpListener::bind((v2.as_str(), 18083)).unwrap();
    let (status, body) = agent.send(&delivery("service.added", 4, "busy", &v2, &[18083], &[])).await;
    assert_eq!(
        (status, body["detail"].as_str()),
        (422, Some(format!("{v2}:18083 is in use by another program").as_str()))
    );
    drop(taken);
    agent.stop().await;
}

/// A configuration only HAProxy itself refuses (port 0 on a bind passes the agent's own checks): the
/// reload fails, the old worker keeps serving, the refused Service gets HAProxy's words and the rest
/// of its batch goes live; the next reload succeeds.
#[tokio::test]
async fn a_configuration_haproxy_refuses_fails_only_its_service_and_the_next_reload_succeeds() {
    let Some(agent) = Agent::start().await else { return };
    let a = pod("a").await;
    let (v1, v2, v3) = (vip(), vip(), vip());
    assert_eq!(agent.send(&delivery("service.added", 1, "first", &v1, &[18085], &[active(0, a)])).await.0, 200);
    let good = delivery("service.added", 2, "good", &v2, &[18086], &[active(0, a)]);
    let zero = delivery("service.added", 3, "zero", &v3, &[0], &[]);
    let (r1, r2) = tokio::join!(agent.send(&good), agent.send(&zero));
    assert_eq!(r1.0, 200);
    let detail = r2.1["detail"].as_str().unwrap_or_default();
    assert_eq!(r2.0, 422, "{}", r2.1);
    assert!(detail.starts_with("HAProxy refused the configuration: "), "{detail}");
    assert!(detail.contains("'bind' : invalid port '0'"), "{detail}");
    assert_eq!(hit(&format!("{v1}:18085")).await.as_deref(), Ok("a"));
    assert_eq!(hit(&format!("{v2}:18086")).await.as_deref(), Ok("a"));
    let before = agent.reloads().await;
    assert_eq!(agent.send(&delivery("service.added", 4, "after", &v3, &[18087], &[active(0, a)])).await.0, 200);
    assert_eq!(hit(&format!("{v3}:18087")).await.as_deref(), Ok("a"));
    assert_eq!(agent.reloads().await, before + 1);
    agent.stop().await;
}

#[tokio::test]
async fn fifty_reloads_while_a_client_keeps_connecting_fail_no_connection() {
    let Some(agent) = Agent::start().await else { return };
    let a = pod("a").await;
    let web = vip();
    let addr = format!("{web}:18084");
    assert_eq!(agent.send(&delivery("service.added", 1, "web", &web, &[18084], &[active(0, a)])).await.0, 200);
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let client = {
        let (stop, ok, failed, addr) = (stop.clone(), ok.clone(), failed.clone(), addr.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                match hit(&addr).await {
                    Ok(reply) if reply == "a" => ok.fetch_add(1, Ordering::Relaxed),
                    _ => failed.fetch_add(1, Ordering::Relaxed),
                };
            }
        })
    };
    let before = agent.reloads().await;
    let other = vip();
    for i in 0..50 {
        // Each delivery adds or removes a port: a new bind, hence a reload.
        let ports: Vec<i32> = if i % 2 == 0 { vec![18085] } else { vec![18085, 18086] };
        let (status, body) = agent.send(&delivery("service.modified", 10 + i, "other", &other, &ports, &[])).await;
        assert_eq!(status, 200, "{body}");
    }
    stop.store(true, Ordering::Relaxed);
    client.await.unwrap();
    assert_eq!(agent.reloads().await - before, 50);
    assert_eq!(failed.load(Ordering::Relaxed), 0, "{} connections succeeded", ok.load(Ordering::Relaxed));
    assert!(ok.load(Ordering::Relaxed) > 50);
    agent.stop().await;
}

#[tokio::test]
async fn a_restart_reproduces_the_configuration_and_a_killed_haproxy_comes_back_with_everything() {
    let Some(mut agent) = Agent::start().await else { return };
    let (a, b) = (pod("a").await, pod("b").await);
    let (v1, v2) = (vip(), vip());
    assert_eq!(agent.send(&delivery("service.added", 1, "one", &v1, &[18087], &[active(0, a)])).await.0, 200);
    assert_eq!(agent.send(&delivery("service.added", 2, "two", &v2, &[18087], &[active(0, b)])).await.0, 200);
    let (text, reloads) = (agent.config_text(), agent.reloads().await);
    agent.restart().await;
    assert_eq!(agent.config_text(), text, "byte-identical");
    assert_eq!(agent.reloads().await, reloads, "no reload");
    assert_eq!(hit(&format!("{v1}:18087")).await.as_deref(), Ok("a"));
    // It could not receive what vipwatch sent while it was down: not caught up with the cluster its
    // state knows until a full resync of it.
    let waiting = (503, "not caught up: waiting for a full resync of cluster default".to_owned());
    assert_eq!(agent.get("/healthz").await, waiting);

    let pid = std::fs::read_to_string(agent.dir.path().join("haproxy.pid")).unwrap();
    assert!(std::process::Command::new("kill").args(["-KILL", pid.trim()]).status().unwrap().success());
    wait_until("deliveries refused with 503 while HAProxy is gone", || async {
        let (status, _) = agent.send(&delivery("service.modified", 3, "two", &v2, &[18087], &[active(0, a)])).await;
        status == 503 || status == 200
    })
    .await;
    wait_until("HAProxy back with both Services", || async {
        hit(&format!("{v1}:18087")).await.as_deref() == Ok("a") && agent.get("/healthz").await == waiting
    })
    .await;
    let (status, _) = agent.send(&delivery("service.modified", 4, "two", &v2, &[18087], &[active(0, a)])).await;
    assert_eq!(status, 200);
    assert_eq!(hit(&format!("{v2}:18087")).await.as_deref(), Ok("a"));
    let both = [
        delivery("service.synced", 5, "one", &v1, &[18087], &[active(0, a)]),
        delivery("service.synced", 5, "two", &v2, &[18087], &[active(0, a)]),
    ];
    assert_eq!(resync(&agent, "sync_1", &both).await, [200, 200, 200]);
    assert_eq!(agent.get("/healthz").await, (200, "ok".to_owned()));
    assert_eq!(hit(&format!("{v1}:18087")).await.as_deref(), Ok("a"));
    agent.stop().await;
}

#[tokio::test]
async fn a_full_resync_sweeps_what_it_did_not_include() {
    let Some(agent) = Agent::start().await else { return };
    let a = pod("a").await;
    let (keep, gone) = (vip(), vip());
    assert_eq!(agent.send(&delivery("service.added", 1, "keep", &keep, &[18088], &[active(0, a)])).await.0, 200);
    assert_eq!(agent.send(&delivery("service.added", 2, "gone", &gone, &[18088], &[active(0, a)])).await.0, 200);
    let mut synced = delivery("service.synced", 3, "keep", &keep, &[18088], &[active(0, a)]);
    synced.data.sync =
        Some(vipwatch_contract::SyncMarker { id: "sync_1".into(), index: Some(1), total: 1, as_of_event_id: Some(2) });
    assert_eq!(agent.send(&synced).await.0, 200);
    assert!(hit(&format!("{gone}:18088")).await.is_err(), "the Service the resync left out is gone");
    assert_eq!(hit(&format!("{keep}:18088")).await.as_deref(), Ok("a"));
    let (_, state) = agent.get("/state").await;
    let state: serde_json::Value = serde_json::from_str(&state).unwrap();
    assert_eq!(state["services"].as_array().unwrap().len(), 1);
    agent.stop().await;
}

/// A `service.synced` of resync `id` (`total` Services, snapshot `as_of`) from event log `log`.
fn synced(
    name: &str,
    vip: &str,
    port: i32,
    members: &[(usize, std::net::SocketAddr, MemberState)],
    sync: (&str, u64, i64),
    log: &str,
) -> vipwatch_contract::WebhookPayload {
    let mut d = delivery("service.synced", 1, name, vip, &[port], members);
    d.data.log_id = Some(log.into());
    let (id, total, as_of) = sync;
    d.data.sync =
        Some(vipwatch_contract::SyncMarker { id: id.into(), index: Some(1), total, as_of_event_id: Some(as_of) });
    d
}

#[tokio::test]
async fn a_resync_completes_with_a_refused_service_and_sweeps_what_an_older_event_log_left_behind() {
    let Some(agent) = Agent::start().await else { return };
    let a = pod("a").await;
    let (keep, old, bad) = (vip(), vip(), vip());
    // Two Services from vipwatch's first database, with high event ids.
    for (i, (name, v)) in [("keep", &keep), ("old", &old)].into_iter().enumerate() {
        let mut added = delivery("service.added", 5000 + i as i64, name, v, &[18089], &[active(0, a)]);
        added.data.log_id = Some("log-1".into());
        assert_eq!(agent.send(&added).await.0, 200);
    }
    // vipwatch's database was replaced (event ids restart under log-2) and a resync of two Services
    // follows: `keep`, and `bad`, which HAProxy can never serve (a UDP port) — arriving last.
    let sync = ("sync_2", 2, 3);
    // The new log takes the cluster name over once the old one has been silent for
    // `cluster_takeover_after` (1 s here); until then it is refused (409).
    wait_until("the new event log takes the cluster name over", || async {
        agent.send(&synced("keep", &keep, 18089, &[active(0, a)], sync, "log-2")).await.0 == 200
    })
    .await;
    let mut refused = synced("bad", &bad, 18089, &[], sync, "log-2");
    std::sync::Arc::make_mut(&mut refused.data.service.as_mut().unwrap().view).ports[0].protocol = "UDP".into();
    let (status, body) = agent.send(&refused).await;
    assert_eq!((status, body["detail"].as_str().map(|d| d.contains("UDP"))), (422, Some(true)), "{body}");
    // The resync is complete all the same: `old` (left out, and from the older log) is swept. The state
    // is published once the reload that dropped it is confirmed live.
    let names = || async {
        let (_, state) = agent.get("/state").await;
        let state: serde_json::Value = serde_json::from_str(&state).unwrap();
        let names: Vec<String> =
            state["services"].as_array().unwrap().iter().map(|s| s["service"].as_str().unwrap().to_owned()).collect();
        names
    };
    wait_until("the Service the resync left out to be swept", || async { names().await.len() == 1 }).await;
    assert_eq!(names().await, ["shop/keep"]);
    assert!(hit(&format!("{old}:18089")).await.is_err(), "the swept VIP no longer answers");
    assert_eq!(hit(&format!("{keep}:18089")).await.as_deref(), Ok("a"));
    agent.stop().await;
}

#[tokio::test]
async fn a_delivery_type_the_agent_does_not_know_is_acknowledged() {
    let Some(agent) = Agent::start().await else { return };
    let body = serde_json::json!({"type": "service.renamed", "timestamp": "2026-12-01T00:00:00.000Z", "data": {}});
    let (status, answer) = agent.send_json(&body).await;
    assert_eq!(
        (status, answer),
        (200, serde_json::json!({"status": "ignored", "reason": "unknown type `service.renamed`"}))
    );
    // A known type with a broken body is still an error.
    let broken = serde_json::json!({"type": "service.added", "timestamp": "x", "data": {}});
    assert_eq!(agent.send_json(&broken).await.0, 400);
    agent.stop().await;
}

#[tokio::test]
async fn one_agent_per_directory() {
    let Some(agent) = Agent::start().await else { return };
    let mut config = agent.config();
    config.stop_haproxy_on_exit = false;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let Err(e) = vipwatch_haproxy::start(config, listener).await else { panic!("a second agent started") };
    let expected = format!(
        "another vipwatch-haproxy already runs with dir {0} (it holds {0}/agent.lock); one agent per directory",
        agent.dir.path().display()
    );
    assert_eq!(e.to_string(), expected);
    agent.stop().await;
}
