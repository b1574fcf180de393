//! Relay benchmark: deliveries/s to a local receiver that answers 204 at once, and
//! event→delivery latency at a steady 500 events/s.
//!
//! Run: `cargo bench --bench relay` (optional args: BACKLOG RATE SECONDS, default 20000 500 10;
//! `--no-finalizer` to leave out the finalizer patch before each Service's first delivery).
//!
//! - throughput: BACKLOG Services exist before vipwatch starts, so its first list records BACKLOG ADDED
//!   events at once; measured from ready to the last 2xx, next to the baseline of a bare reqwest client
//!   POSTing the same number of bodies with the same concurrency (32) to the same receiver.
//! - latency: RATE Service updates per second for SECONDS seconds written to the fake apiserver; for
//!   each, the time from the write to the receiver getting its delivery. p50 / p99 reported, next to
//!   the baseline of a bare watch on the same apiserver seeing the same updates (the watch's own
//!   latency, which every delivery includes).

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use serde_json::json;
use vipwatch::config::{Config, Secret, WebhookConfig};
use vipwatch::fake_apiserver::{FakeApiServer, FakeApiServerOptions};

type Arrivals = Arc<Mutex<HashMap<(String, i64), Instant>>>;

async fn receiver() -> (String, Arrivals, Arc<std::sync::atomic::AtomicUsize>) {
    let arrivals: Arrivals = Arc::default();
    let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let state = (arrivals.clone(), count.clone());
    let app = Router::new()
        .fallback(
            |State((arrivals, count)): State<(Arrivals, Arc<std::sync::atomic::AtomicUsize>)>, body: Bytes| async move {
                let now = Instant::now();
                if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&body) {
                    let svc = &v["data"]["service"];
                    let key =
                        (svc["name"].as_str().unwrap_or("").to_owned(), svc["ports"][0]["port"].as_i64().unwrap_or(0));
                    arrivals.lock().unwrap().insert(key, now);
                }
                count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                StatusCode::NO_CONTENT
            },
        )
        .with_state(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, arrivals, count)
}

fn service(i: usize, port: i64) -> serde_json::Value {
    json!({"metadata": {"name": format!("svc-{i:05}"), "namespace": "bench"},
           "spec": {"type": "LoadBalancer", "ports": [{"name": "http", "port": port, "targetPort": 8080}]}})
}

async fn baseline(url: &str, n: usize, body: String) -> Duration {
    vipwatch::relay::sender::install_crypto_provider();
    let client = reqwest::Client::new();
    let start = Instant::now();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..32 {
        let (client, url, body, next) = (client.clone(), url.to_owned(), body.clone(), next.clone());
        tasks.spawn(async move {
            while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < n {
                let r = client.post(&url).header("content-type", "application/json").body(body.clone()).send().await;
                assert!(r.unwrap().status().is_success());
            }
        });
    }
    tasks.join_all().await;
    start.elapsed()
}

/// The baseline watcher: a bare watch on every Service from `rv`, noting when each `(name, port)`
/// first arrived.
async fn bare_watch(api: &FakeApiServer, rv: String) -> Arrivals {
    let seen: Arrivals = Arc::default();
    let url = format!("{}/api/v1/services?watch=1&resourceVersion={rv}", api.url());
    let mut response = reqwest::get(url).await.unwrap();
    let noted = seen.clone();
    tokio::spawn(async move {
        let mut buf = Vec::new();
        while let Ok(Some(chunk)) = response.chunk().await {
            let now = Instant::now();
            buf.extend_from_slice(&chunk);
            while let Some(end) = buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buf.drain(..=end).collect();
                if let Ok(ev) = serde_json::from_slice::<serde_json::Value>(&line) {
                    let svc = &ev["object"];
                    let key = (
                        svc["metadata"]["name"].as_str().unwrap_or("").to_owned(),
                        svc["spec"]["ports"][0]["port"].as_i64().unwrap_or(0),
                    );
                    noted.lock().unwrap().entry(key).or_insert(now);
                }
            }
        }
    });
    seen
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p).ceil() as usize).saturating_sub(1).min(sorted.len() - 1)]
}

#[tokio::main]
async fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (backlog, rate, seconds) = (
        args.first().copied().unwrap_or(20_000),
        args.get(1).copied().unwrap_or(500),
        args.get(2).copied().unwrap_or(10),
    );
    let finalizer = !std::env::args().any(|a| a == "--no-finalizer");
    let mut results = common::results::Results::new("relay");
    results.param("backlog", backlog);
    results.param("rate", rate);
    results.param("seconds", seconds);
    results.param("finalizer", finalizer);
    let api = FakeApiServer::start_with(FakeApiServerOptions {
        history_limit: backlog + rate * seconds * 2,
        ..Default::default()
    })
    .await
    .unwrap();
    api.seed((0..backlog).map(|i| service(i, 80)));
    let (url, arrivals, count) = receiver().await;
    let sample_body =
        serde_json::to_string(&json!({"type": "service.added", "data": {"service": service(0, 80)}})).unwrap();
    let base = baseline(&url, backlog, sample_body).await;
    count.store(0, std::sync::atomic::Ordering::Relaxed);

    let rss_before = common::peak_rss_mib(std::process::id());
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::default();
    config.kubernetes.url = Some(api.url().parse().unwrap());
    config.database.path = dir.path().join("bench.db");
    let mut w: WebhookConfig = toml::from_str(&format!("name = \"bench\"\nurl = \"{url}\"\n")).unwrap();
    w.secret = Some(Secret::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"));
    config.webhooks = vec![w];
    // `--no-finalizer`: measure the relay alone. By default (as in production) each Service's first
    // delivery waits until vipwatch's finalizer is on it, a Kubernetes write per Service.
    config.kubernetes.finalizer = finalizer;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let running = vipwatch::app::start(config, listener).await.unwrap();
    running.ready().await;
    let start = Instant::now();
    let backlog_done = || count.load(std::sync::atomic::Ordering::Relaxed) >= backlog;
    common::wait_until("the backlog delivered", Duration::from_millis(2), backlog_done).await;
    let relay_time = start.elapsed();
    let watched = bare_watch(&api, api.resource_version()).await;

    let mut tick = tokio::time::interval(Duration::from_secs(1) / rate as u32);
    let mut written = Vec::with_capacity(rate * seconds);
    for n in 0..rate * seconds {
        tick.tick().await;
        let i = n % backlog;
        let port = 1000 + (n / backlog) as i64;
        api.update("bench", &format!("svc-{i:05}"), |o| o["spec"]["ports"][0]["port"] = json!(port));
        written.push(((format!("svc-{i:05}"), port), Instant::now()));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut latencies = Vec::new();
    while Instant::now() < deadline {
        latencies = {
            let got = arrivals.lock().unwrap();
            written.iter().filter_map(|(k, at)| got.get(k).map(|r| r.saturating_duration_since(*at))).collect()
        };
        if latencies.len() == written.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await; // ok: benchmark polling, not a test
    }
    running.stop().await.unwrap();
    latencies.sort();
    let mut watch_latencies: Vec<Duration> = {
        let got = watched.lock().unwrap();
        written.iter().filter_map(|(k, at)| got.get(k).map(|r| r.saturating_duration_since(*at))).collect()
    };
    watch_latencies.sort();

    let per_sec = |n: usize, d: Duration| n as f64 / d.as_secs_f64();
    println!("relay benchmark: receiver on loopback answering 204 at once");
    println!(
        "throughput : {:>8.0} deliveries/s ({backlog} signed deliveries, outbox → 2xx recorded)  baseline bare reqwest x32 {:.0} req/s; ratio {:.2}",
        per_sec(backlog, relay_time),
        per_sec(backlog, base),
        per_sec(backlog, relay_time) / per_sec(backlog, base)
    );
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let (p50, p99, max) =
        (ms(percentile(&latencies, 0.50)), ms(percentile(&latencies, 0.99)), ms(*latencies.last().unwrap()));
    let (b50, b99, bmax) = match watch_latencies.last() {
        Some(last) => (ms(percentile(&watch_latencies, 0.50)), ms(percentile(&watch_latencies, 0.99)), ms(*last)),
        None => (f64::NAN, f64::NAN, f64::NAN),
    };
    println!(
        "latency    : {} of {} updates at {rate}/s delivered; write → receiver p50 {p50:.1} ms, p99 {p99:.1} ms, max {max:.1} ms \
         (bare watch: p50 {b50:.1} ms, p99 {b99:.1} ms; p99 ratio {:.1})",
        latencies.len(),
        written.len(),
        p99 / b99
    );
    let (throughput, base_throughput) = (per_sec(backlog, relay_time), per_sec(backlog, base));
    results.compare("throughput", throughput, "deliveries/s", "bare reqwest client, 32 at once", base_throughput);
    results.compare("steady: latency p50", p50, "ms", "bare watch: latency p50", b50);
    results.compare("steady: latency p99", p99, "ms", "bare watch: latency p99", b99);
    results.compare("steady: latency max", max, "ms", "bare watch: latency max", bmax);
    common::report_own_peak_rss(rss_before, &mut results);
    results.write();
}
