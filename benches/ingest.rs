//! Ingest benchmark: initial sync of 10,000 Services and sustained change events into
//! SQLite, each against a baseline measured in the same run on the same fake apiserver.
//!
//! Run: `cargo bench --bench ingest` (optional args: SERVICES CHANGES, default 10000 40000).
//!
//! - initial sync: `vipwatch` start → first full list stored (`ready`), vs. the baseline of a bare
//!   kube-rs paged list of the same Services (fetch + decode only, nothing stored).
//! - change events: N port changes written to the fake apiserver as fast as it takes them → all N
//!   MODIFIED rows committed, vs. the baseline of a bare kube-rs watcher receiving the same N events.
//! - initial sync with allocation: the same first sync on a fresh database with a `/16`
//!   `[[pools]]` entry, so every Service also gets a VIP allocated, vs. the initial sync above.

mod common;

use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::api::ListParams;
use kube::runtime::watcher;
use serde_json::json;
use vipwatch::config::Config;
use vipwatch::fake_apiserver::{FakeApiServer, FakeApiServerOptions};

fn service(i: usize, port: usize) -> serde_json::Value {
    json!({"metadata": {"name": format!("svc-{i:05}"), "namespace": format!("ns-{:02}", i % 50), "labels": {"app": format!("a{i}")}},
           "spec": {"type": "LoadBalancer", "selector": {"app": format!("a{i}")},
                    "ports": [{"name": "http", "protocol": "TCP", "port": port, "targetPort": 8080, "nodePort": 30000 + (i % 2000)}]}})
}

fn mutate(api: &FakeApiServer, services: usize, changes: usize, round: usize) {
    for c in 0..changes {
        let i = c % services;
        let port = 1000 + round * 10 + c / services;
        api.update(&format!("ns-{:02}", i % 50), &format!("svc-{i:05}"), |o| {
            o["spec"]["ports"][0]["port"] = json!(port)
        });
    }
}

async fn baseline_list(client: kube::Client) -> (Duration, usize) {
    let api: Api<Service> = Api::all(client);
    let start = Instant::now();
    let mut n = 0;
    let mut lp = ListParams::default().limit(500);
    loop {
        let page = api.list(&lp).await.unwrap();
        n += page.items.len();
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => lp = lp.continue_token(&c),
            _ => break,
        }
    }
    (start.elapsed(), n)
}

/// The bare watcher's time for the `changes` events, and its CPU per event (µs).
async fn baseline_watch(
    api_server: &FakeApiServer,
    client: kube::Client,
    services: usize,
    changes: usize,
) -> (Duration, f64) {
    let api: Api<Service> = Api::all(client);
    let mut stream = Box::pin(watcher(api, watcher::Config::default()));
    while let Some(Ok(ev)) = stream.next().await {
        if matches!(ev, watcher::Event::InitDone) {
            break;
        }
    }
    let start = Instant::now();
    let cpu = cpu_time();
    mutate(api_server, services, changes, 0);
    let mut seen = 0;
    while seen < changes {
        if let Some(Ok(watcher::Event::Apply(_))) = stream.next().await {
            seen += 1;
        }
    }
    let elapsed = start.elapsed();
    let cpu = (cpu_time() - cpu).as_secs_f64() * 1e6 / changes as f64;
    println!("  (bare watcher: {cpu:.0} µs CPU per event)");
    (elapsed, cpu)
}

async fn wait_for_events(running: &vipwatch::app::Running, n: i64) {
    running.committed().wait_for(|id| *id >= n).await.unwrap();
}

/// CPU time (user + system) of this process so far, from /proc/self/stat (Linux; 0 elsewhere).
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
    let ticks: u64 = fields.get(11..13).map(|f| f.iter().filter_map(|v| v.parse::<u64>().ok()).sum()).unwrap_or(0);
    Duration::from_millis(ticks * 10) // USER_HZ is 100 on Linux
}

fn per_sec(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

#[tokio::main]
async fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let services = args.first().copied().unwrap_or(10_000);
    let changes = args.get(1).copied().unwrap_or(40_000);
    let mut results = common::results::Results::new("ingest");
    results.param("services", services);
    results.param("changes", changes);
    let options = FakeApiServerOptions { history_limit: changes * 3 + services, ..Default::default() };
    let api = FakeApiServer::start_with(options).await.unwrap();
    api.seed((0..services).map(|i| service(i, 80)));
    let client = kube::Client::try_from(kube::Config::new(api.url().parse().unwrap())).unwrap();

    let (list_time, listed) = baseline_list(client.clone()).await;
    assert_eq!(listed, services);
    let (watch_time, watch_cpu) = baseline_watch(&api, client, services, changes).await;

    let rss_before = common::peak_rss_mib(std::process::id());
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::default();
    config.kubernetes.url = Some(api.url().parse().unwrap());
    config.database.path = dir.path().join("bench.db");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let start = Instant::now();
    let running = vipwatch::app::start(config, listener).await.unwrap();
    running.ready().await;
    let sync_time = start.elapsed();
    assert_eq!(running.store.event_count().await.unwrap(), services as i64);

    let start = Instant::now();
    let cpu = cpu_time();
    mutate(&api, services, changes, 1);
    wait_for_events(&running, (services + changes) as i64).await;
    let ingest_time = start.elapsed();
    let ingest_cpu = (cpu_time() - cpu).as_secs_f64() * 1e6 / changes as f64;
    println!("  (vipwatch: {ingest_cpu:.0} µs CPU per event)");
    running.stop().await.unwrap();

    let pooled_dir = tempfile::tempdir().unwrap();
    let mut config = Config::default();
    config.kubernetes.url = Some(api.url().parse().unwrap());
    config.kubernetes.write_status = false; // measure the allocation, not 10,000 status patches after it
    config.database.path = pooled_dir.path().join("bench.db");
    config.pools = vec![toml::from_str("name = \"bench\"\naddresses = [\"10.20.0.0/16\"]\n").unwrap()];
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let start = Instant::now();
    let running = vipwatch::app::start(config, listener).await.unwrap();
    running.ready().await;
    let pooled_sync_time = start.elapsed();
    running.stop().await.unwrap();

    println!("ingest benchmark: {services} Services, {changes} change events (fake apiserver on loopback)");
    println!(
        "initial sync   : {:>8.3} s  (baseline bare paged list {:.3} s; ratio {:.2}x)",
        sync_time.as_secs_f64(),
        list_time.as_secs_f64(),
        sync_time.as_secs_f64() / list_time.as_secs_f64()
    );
    println!(
        "change events  : {:>8.0} /s into SQLite  (baseline bare watcher {:.0} /s; ratio {:.2})",
        per_sec(changes, ingest_time),
        per_sec(changes, watch_time),
        per_sec(changes, ingest_time) / per_sec(changes, watch_time)
    );
    println!(
        "sync + allocate: {:>8.3} s  ({} VIPs from one pool; ratio {:.2}x the initial sync without pools)",
        pooled_sync_time.as_secs_f64(),
        services,
        pooled_sync_time.as_secs_f64() / sync_time.as_secs_f64()
    );
    results.compare("initial sync", sync_time.as_secs_f64(), "s", "bare kube-rs paged list", list_time.as_secs_f64());
    let (rate, base_rate) = (per_sec(changes, ingest_time), per_sec(changes, watch_time));
    results.compare("change events into SQLite", rate, "/s", "bare kube-rs watcher", base_rate);
    results.compare("CPU per change event", ingest_cpu, "µs", "bare kube-rs watcher", watch_cpu);
    let pooled = pooled_sync_time.as_secs_f64();
    results.compare(
        "initial sync + allocation from a pool",
        pooled,
        "s",
        "initial sync without pools",
        sync_time.as_secs_f64(),
    );
    common::report_own_peak_rss(rss_before, &mut results);
    results.write();
}
