//! Crash safety: `kill -9` of a real `vipwatch serve` process during a burst of 1,000 events, then a
//! restart: every event is delivered at least once; duplicates only for deliveries that were in flight.

mod common;

use std::collections::HashMap;
use std::process::Stdio;
use std::time::Duration;

use common::receiver::{Receiver, Reply, SECRET};
use common::*;
use vipwatch::store::{DeliveryFilter, Store};

const SERVICES: usize = 1000;
const CONCURRENCY: usize = 8;

fn spawn_vipwatch(config: &std::path::Path) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_vipwatch"))
        .arg("serve")
        .arg("--config")
        .arg(config)
        .env("VIPWATCH_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

#[tokio::test]
async fn kill_9_during_a_burst_then_restart_delivers_every_event_at_least_once() {
    let h = Harness::new().await;
    let rx = Receiver::start(|_, _| Reply::After(Duration::from_millis(3), 204)).await;
    let config_path = h.dir.path().join("vipwatch.toml");
    let config = format!(
        "[kubernetes]\nurl = \"{}\"\n[database]\npath = \"{}\"\n[server]\nlisten = \"127.0.0.1:0\"\n\
         [relay]\nconcurrency = {CONCURRENCY}\npoll_interval = \"100ms\"\nlease = \"5s\"\n\
         [[webhooks]]\nname = \"lab\"\nurl = \"{}\"\nsecret = \"{SECRET}\"\ntimeout = \"2s\"\n\
         retry = {{ initial_delay = \"50ms\", max_delay = \"1s\" }}\n",
        h.api.url(),
        h.db_path().display(),
        rx.url
    );
    std::fs::write(&config_path, config).unwrap();

    let mut first = spawn_vipwatch(&config_path);
    for i in 0..SERVICES {
        h.api.apply(lb_service("burst", &format!("svc-{i:04}"), 80));
    }
    wait_until("part of the burst delivered", || async { (rx.accepted().len() >= 200).then_some(()) }).await;
    first.start_kill().unwrap(); // SIGKILL: no graceful path
    first.wait().await.unwrap();
    let delivered_before = rx.accepted().len();
    assert!(delivered_before < SERVICES, "the kill happened mid-burst ({delivered_before} delivered)");

    let mut second = spawn_vipwatch(&config_path);
    let store = Store::open(&h.db_path()).await.unwrap();
    let deliveries = wait_until("every event delivered after the restart", || async {
        let rows = store.deliveries(&DeliveryFilter::default()).await.unwrap();
        let done = rows.len() == SERVICES && rows.iter().all(|r| r.state == "succeeded");
        done.then_some(rows)
    })
    .await;
    second.start_kill().unwrap();
    second.wait().await.unwrap();

    assert_eq!(store.event_count().await.unwrap(), SERVICES as i64, "each Service recorded exactly once");
    let mut seen: HashMap<String, usize> = HashMap::new();
    for hit in rx.accepted() {
        *seen.entry(hit.header("webhook-id")).or_default() += 1;
    }
    for d in &deliveries {
        assert!(seen.contains_key(&d.msg_id), "delivery {} ({}) never reached the receiver", d.id, d.key);
    }
    let duplicates: usize = seen.values().map(|n| n - 1).sum();
    assert!(duplicates <= CONCURRENCY, "{duplicates} duplicates; only the {CONCURRENCY} in flight may repeat");
    store.close().await;
}

#[tokio::test]
async fn with_its_log_on_a_full_disk_vipwatch_records_and_delivers_every_change() {
    let h = Harness::new().await;
    let rx = Receiver::ok().await;
    let config_path = h.dir.path().join("vipwatch.toml");
    let config = format!(
        "[kubernetes]\nurl = \"{}\"\n[database]\npath = \"{}\"\n[server]\nlisten = \"127.0.0.1:0\"\n\
         [[webhooks]]\nname = \"lab\"\nurl = \"{}\"\nsecret = \"{SECRET}\"\n",
        h.api.url(),
        h.db_path().display(),
        rx.url
    );
    std::fs::write(&config_path, config).unwrap();
    // Every log line fails with ENOSPC; at `debug` there are many.
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
    let _vw = tokio::process::Command::new(env!("CARGO_BIN_EXE_vipwatch"))
        .args(["serve", "--config"])
        .arg(&config_path)
        .env("VIPWATCH_LOG", "debug")
        .stdout(Stdio::null())
        .stderr(full)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    for i in 0..20 {
        h.api.apply(lb_service("shop", &format!("web-{i:02}"), 80));
    }
    wait_until("20 ADDEDs delivered", || async { (rx.accepted().len() == 20).then_some(()) }).await;
    h.api.update("shop", "web-00", |o| o["metadata"]["labels"]["tier"] = serde_json::json!("gold"));
    wait_until("the MODIFIED delivered too", || async { (rx.accepted().len() == 21).then_some(()) }).await;
    let events: Vec<String> = rx.accepted().iter().map(|h| h.event().0).collect();
    assert_eq!(events.iter().filter(|e| *e == "ADDED").count(), 20);
    assert_eq!(events.last().map(String::as_str), Some("MODIFIED"));
}
