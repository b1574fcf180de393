//! REST API benchmark: `GET /api/v1/vips?limit=1000` with 10,000 Services (each with a VIP) in the
//! database, next to `GET /healthz` in the same run: requests/s and p50/p99 latency at concurrency 32,
//! and the ratio. Load comes from reqwest clients in the same process (2 cores shared with the server).
//!
//! Run: `cargo bench --bench api` (optional args: SERVICES CONCURRENCY SECONDS, default 10000 32 5).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::sync::Mutex;
use vipwatch::config::Config;
use vipwatch::fake_apiserver::FakeApiServer;

fn service(i: usize) -> serde_json::Value {
    let ip = format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256);
    json!({"metadata": {"name": format!("svc-{i:05}"), "namespace": format!("ns-{:02}", i % 50), "labels": {"app": format!("a{i}")}},
           "spec": {"type": "LoadBalancer", "selector": {"app": format!("a{i}")},
                    "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080, "nodePort": 30000 + (i % 2000)}]},
           "status": {"loadBalancer": {"ingress": [{"ip": ip}]}}})
}

struct Result {
    requests: usize,
    elapsed: Duration,
    p50: Duration,
    p99: Duration,
}

/// `concurrency` workers GET `url` in a loop for `seconds`; every answer must be 200.
async fn load(url: &str, concurrency: usize, seconds: u64) -> Result {
    let client = reqwest::Client::builder().pool_max_idle_per_host(concurrency).build().unwrap();
    let latencies = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let deadline = start + Duration::from_secs(seconds);
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (client, url, latencies) = (client.clone(), url.to_owned(), latencies.clone());
        workers.spawn(async move {
            let mut own = Vec::new();
            while Instant::now() < deadline {
                let t = Instant::now();
                let response = client.get(&url).send().await.unwrap();
                assert_eq!(response.status(), 200);
                response.bytes().await.unwrap();
                own.push(t.elapsed());
            }
            latencies.lock().await.extend(own);
        });
    }
    workers.join_all().await;
    let elapsed = start.elapsed();
    let mut all = std::mem::take(&mut *latencies.lock().await);
    all.sort();
    let at = |q: f64| all[((all.len() as f64 * q) as usize).min(all.len() - 1)];
    Result { requests: all.len(), elapsed, p50: at(0.50), p99: at(0.99) }
}

fn report(name: &str, r: &Result) -> f64 {
    let rps = r.requests as f64 / r.elapsed.as_secs_f64();
    println!("{name:<32} {:>8} req {rps:>10.0} req/s   p50 {:>8.2?}   p99 {:>8.2?}", r.requests, r.p50, r.p99);
    rps
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let services = args.first().copied().unwrap_or(10_000);
    let concurrency = args.get(1).copied().unwrap_or(32);
    let seconds = args.get(2).copied().unwrap_or(5) as u64;
    let mut results = common::results::Results::new("api");
    results.param("services", services);
    results.param("concurrency", concurrency);
    results.param("seconds", seconds);
    let fake = FakeApiServer::start().await.unwrap();
    fake.seed((0..services).map(service));
    let rss_before = common::peak_rss_mib(std::process::id());
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::default();
    config.kubernetes.url = Some(fake.url().parse().unwrap());
    config.database.path = dir.path().join("vipwatch.db");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let vw = vipwatch::app::start(config, listener).await.unwrap();
    vw.ready().await;
    let base = format!("http://{}", vw.addr);
    let first = Instant::now();
    let page: serde_json::Value =
        reqwest::get(format!("{base}/api/v1/vips?limit=1000")).await.unwrap().json().await.unwrap();
    let first = first.elapsed();
    assert_eq!(page["items"].as_array().unwrap().len(), 1000.min(services));
    println!("{services} Services stored; first /api/v1/vips (builds the VIP index): {first:.2?}");
    println!("concurrency {concurrency}, {seconds} s per endpoint");
    let health_run = load(&format!("{base}/healthz"), concurrency, seconds).await;
    let health = report("GET /healthz", &health_run);
    let vips_run = load(&format!("{base}/api/v1/vips?limit=1000"), concurrency, seconds).await;
    let vips = report("GET /api/v1/vips?limit=1000", &vips_run);
    println!("ratio vips/healthz throughput: {:.3}", vips / health);
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    results.compare("GET /api/v1/vips?limit=1000: throughput", vips, "req/s", "GET /healthz: throughput", health);
    results.compare(
        "GET /api/v1/vips?limit=1000: latency p50",
        ms(vips_run.p50),
        "ms",
        "GET /healthz: latency p50",
        ms(health_run.p50),
    );
    results.compare(
        "GET /api/v1/vips?limit=1000: latency p99",
        ms(vips_run.p99),
        "ms",
        "GET /healthz: latency p99",
        ms(health_run.p99),
    );
    results.compare(
        "first GET /api/v1/vips (builds the VIP index)",
        ms(first),
        "ms",
        "GET /api/v1/vips?limit=1000: latency p50",
        ms(vips_run.p50),
    );
    common::report_own_peak_rss(rss_before, &mut results);
    results.write();
    vw.stop().await.unwrap();
}
