//! Backends benchmark: pool members for 10,000 Services × 10 endpoints, against `vipwatch
//! serve` running as its own process (so its peak RSS is its own), each figure next to a baseline
//! from the same run.
//!
//! Run: `cargo bench --bench backends` (optional args: SERVICES ENDPOINTS RATE SECONDS, default
//! 10000 10 200 10).
//!
//! - initial sync: start → `/readyz` 200 with `[backends] mode = "pod"` (Services, Nodes and every
//!   EndpointSlice listed, every Service's members computed and stored), and the process's peak RSS
//!   (VmHWM), next to the same cluster with `mode = "none"` (Services only).
//! - churn: RATE EndpointSlice writes per second for SECONDS seconds, each replacing one endpoint of
//!   a different Service; per write, the time from the write to the receiver getting the MODIFIED whose
//!   `backendsDiff.added` holds the new address (the coalescing window of 250 ms included), p50 / p99,
//!   next to the same rate of Service label changes (a MODIFIED with no window).
//! - recompute: the members of one Service with 1,000 endpoints in 10 slices, computed in-process,
//!   mean and p99 over 2,000 runs, next to serializing the resulting member set to JSON.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use serde_json::{Value, json};
use vipwatch::fake_apiserver::{FakeApiServer, FakeApiServerOptions, Resource};
use vipwatch::model::backends::{BackendIndex, MemberRules, ObservedSlice, compute};

/// `(service name, marker)` → when the receiver got it. The marker is an added member's address (a
/// member change) or the value of label `rev` (a label change).
type Arrivals = Arc<Mutex<HashMap<(String, String), Instant>>>;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

async fn receiver() -> (String, Arrivals) {
    let arrivals: Arrivals = Arc::default();
    let app = Router::new()
        .fallback(|State(arrivals): State<Arrivals>, body: Bytes| async move {
            let now = Instant::now();
            if let Ok(v) = serde_json::from_slice::<Value>(&body) {
                let name = v["data"]["service"]["name"].as_str().unwrap_or("").to_owned();
                let mut seen = arrivals.lock().unwrap();
                for m in v["data"]["backendsDiff"]["added"].as_array().into_iter().flatten() {
                    seen.entry((name.clone(), m["address"].as_str().unwrap_or("").to_owned())).or_insert(now);
                }
                if let Some(rev) = v["data"]["service"]["labels"]["rev"].as_str() {
                    seen.entry((name, format!("rev={rev}"))).or_insert(now);
                }
            }
            StatusCode::NO_CONTENT
        })
        .with_state(arrivals.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, arrivals)
}

fn service(i: usize) -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": format!("svc-{i:05}"), "namespace": "bench", "labels": {"app": format!("a{i}"), "rev": "0"}},
        "spec": {"type": "LoadBalancer", "selector": {"app": format!("a{i}")},
                 "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080, "nodePort": 30000 + (i % 2000)}]}})
}

fn endpoint(ip: &str, node: usize) -> Value {
    json!({"addresses": [ip], "nodeName": format!("node-{node:02}"), "zone": "z1", "conditions": {"ready": true}})
}

fn slice(i: usize, endpoints: Vec<Value>) -> Value {
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("svc-{i:05}-abc"), "namespace": "bench",
                     "labels": {"kubernetes.io/service-name": format!("svc-{i:05}")}},
        "addressType": "IPv4", "ports": [{"name": "http", "protocol": "TCP", "port": 8080}], "endpoints": endpoints})
}

/// Pod `j` of Service `i`: `10.<i/250>.<i%250>.<j+1>` (unique for up to 65,000 Services × 250 Pods).
fn pod_ip(i: usize, j: usize) -> String {
    format!("10.{}.{}.{}", 100 + i / 250, i % 250, j + 1)
}

fn node(i: usize) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": format!("node-{i:02}")},
        "status": {"addresses": [{"type": "InternalIP", "address": format!("192.168.0.{}", i + 1)}]}})
}

/// `vipwatch serve` as a child process with `mode` against `api`, relaying to `url`.
struct Vipwatch {
    child: Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Vipwatch {
    fn start(api: &FakeApiServer, url: &str, mode: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config = format!(
            "[kubernetes]\nurl = \"{}\"\n[database]\npath = \"{}\"\n[server]\nlisten = \"127.0.0.1:0\"\n\
             [backends]\nmode = \"{mode}\"\n[[webhooks]]\nname = \"lab\"\nurl = \"{url}\"\nsecret = \"{SECRET}\"\n",
            api.url(),
            dir.path().join("vipwatch.db").display()
        );
        let path = dir.path().join("vipwatch.toml");
        std::fs::write(&path, config).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_vipwatch"))
            .args(["serve", "--config"])
            .arg(&path)
            .env("VIPWATCH_LOG", "info")
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let addr = loop {
            let line = lines.next().expect("vipwatch logs its address").unwrap();
            if let Some(a) = line.split("API listening addr=").nth(1) {
                break a.trim().to_owned();
            }
        };
        std::thread::spawn(move || for _ in lines {});
        Self { child, addr, _dir: dir }
    }

    async fn wait_ready(&self) {
        common::wait_readyz(&self.addr).await
    }

    /// Waits until nothing is pending for the endpoint (the first sync's deliveries are out).
    async fn wait_idle(&self) {
        let url = format!("http://{}/api/v1/webhooks/lab", self.addr);
        let client = reqwest::Client::new();
        loop {
            let body: Value = client.get(&url).send().await.unwrap().json().await.unwrap();
            if body["pending"] == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Peak resident set size so far (VmHWM), in MiB.
    fn peak_rss_mib(&self) -> f64 {
        common::peak_rss_mib(self.child.id())
    }

    fn stop(mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let _ = self.child.wait();
    }
}

async fn initial_sync(api: &FakeApiServer, url: &str, mode: &str) -> (Vipwatch, Duration, f64) {
    let start = Instant::now();
    let vw = Vipwatch::start(api, url, mode);
    vw.wait_ready().await;
    let took = start.elapsed();
    let rss = vw.peak_rss_mib();
    (vw, took, rss)
}

/// Writes `rate` changes per second for `seconds` with `write(n)` (returns the arrival key), then
/// waits for every arrival; returns the sorted latencies.
async fn churn(
    rate: usize,
    seconds: usize,
    arrivals: &Arrivals,
    write: impl Fn(usize) -> (String, String),
) -> Vec<f64> {
    let mut written = Vec::new();
    let start = Instant::now();
    for n in 0..rate * seconds {
        let due = start + Duration::from_secs_f64(n as f64 / rate as f64);
        tokio::time::sleep_until(due.into()).await;
        written.push((write(n), Instant::now()));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut latencies: Vec<f64> = {
            let got = arrivals.lock().unwrap();
            written
                .iter()
                .filter_map(|(k, at)| got.get(k).map(|t| t.duration_since(*at).as_secs_f64() * 1000.0))
                .collect()
        };
        if latencies.len() == written.len() || Instant::now() > deadline {
            latencies.sort_by(f64::total_cmp);
            println!("    ({} of {} changes arrived)", latencies.len(), written.len());
            return latencies;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    sorted.get(((sorted.len() as f64 * p).ceil() as usize).saturating_sub(1)).copied().unwrap_or(f64::NAN)
}

fn recompute(runs: usize) -> (f64, f64, f64) {
    let key = vipwatch::model::ServiceKey::new("bench", "big");
    let mut index = BackendIndex::default();
    for s in 0..10 {
        let endpoints: Vec<Value> = (0..100).map(|j| endpoint(&pod_ip(s, j), j % 20)).collect();
        let mut obj = slice(s, endpoints);
        obj["metadata"]["labels"]["kubernetes.io/service-name"] = json!("big");
        index.set_slice(ObservedSlice::from_slice(&serde_json::from_value(obj).unwrap()));
    }
    let svc = serde_json::from_value(service(0)).unwrap();
    let view = vipwatch::model::ServiceView::from_service(&svc);
    let rules = MemberRules {
        address_types: vec!["InternalIP".into()],
        local_endpoints_only: false,
        kube_proxy_health_port: 10256,
    };
    let mut times = Vec::with_capacity(runs);
    let mut out = None;
    for _ in 0..runs {
        let t = Instant::now();
        out = Some(std::hint::black_box(compute(&key, &view, vipwatch_contract::BackendMode::Pod, &rules, &index)));
        times.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let members = out.unwrap();
    assert_eq!(members.ports[0].members.len(), 1000);
    let t = Instant::now();
    for _ in 0..runs {
        std::hint::black_box(serde_json::to_string(&members).unwrap());
    }
    let json = t.elapsed().as_secs_f64() * 1000.0 / runs as f64;
    times.sort_by(f64::total_cmp);
    (times.iter().sum::<f64>() / runs as f64, pct(&times, 0.99), json)
}

#[tokio::main]
async fn main() {
    vipwatch::relay::sender::install_crypto_provider();
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let services = args.first().copied().unwrap_or(10_000);
    let endpoints = args.get(1).copied().unwrap_or(10);
    let (rate, seconds) = (args.get(2).copied().unwrap_or(200), args.get(3).copied().unwrap_or(10));
    let mut results = common::results::Results::new("backends");
    results.param("services", services);
    results.param("endpoints", endpoints);
    results.param("nodes", 20);
    results.param("rate", rate);
    results.param("seconds", seconds);
    let options = FakeApiServerOptions { history_limit: 4 * (services + rate * seconds), ..Default::default() };
    let api = FakeApiServer::start_with(options).await.unwrap();
    api.seed((0..20).map(node));
    api.seed((0..services).map(service));
    api.seed((0..services).map(|i| slice(i, (0..endpoints).map(|j| endpoint(&pod_ip(i, j), j % 20)).collect())));
    let (url, arrivals) = receiver().await;
    println!("backends: {services} Services × {endpoints} endpoints, 20 Nodes");

    let (base, base_sync, base_rss) = initial_sync(&api, &url, "none").await;
    base.stop();
    let (vw, sync, rss) = initial_sync(&api, &url, "pod").await;
    println!(
        "  initial sync to ready: {:.2} s (mode none: {:.2} s; ratio {:.2})",
        sync.as_secs_f64(),
        base_sync.as_secs_f64(),
        sync.as_secs_f64() / base_sync.as_secs_f64()
    );
    println!("  peak RSS after sync: {rss:.1} MiB (mode none: {base_rss:.1} MiB; ratio {:.2})", rss / base_rss);
    results.compare("initial sync: ready", sync.as_secs_f64(), "s", "mode none: ready", base_sync.as_secs_f64());
    results.compare("initial sync: peak RSS", rss, "MiB", "mode none: peak RSS", base_rss);

    let idle = Instant::now();
    vw.wait_idle().await;
    let idle = idle.elapsed().as_secs_f64();
    println!("  first deliveries out {idle:.2} s after ready");
    results.figure("initial sync: first deliveries out, after ready", idle, "s");
    println!(
        "  churn: {rate} EndpointSlice writes/s for {seconds} s (one endpoint replaced each, round-robin over Services)"
    );
    let members = churn(rate, seconds, &arrivals, |n| {
        let i = (n * 7919) % services;
        let fresh = format!("10.250.{}.{}", n / 250, n % 250 + 1);
        let mut eps: Vec<Value> = (1..endpoints).map(|j| endpoint(&pod_ip(i, j), j % 20)).collect();
        eps.push(endpoint(&fresh, 0));
        api.apply_resource(Resource::EndpointSlices, slice(i, eps));
        (format!("svc-{i:05}"), fresh)
    })
    .await;
    println!("  baseline: {rate} Service label changes/s for {seconds} s");
    let labels = churn(rate, seconds, &arrivals, |n| {
        let i = (n * 104_729 + 13) % services;
        api.update("bench", &format!("svc-{i:05}"), |o| o["metadata"]["labels"]["rev"] = json!(format!("r{n}")));
        (format!("svc-{i:05}"), format!("rev=r{n}"))
    })
    .await;
    let (p50, p99, b50, b99) = (pct(&members, 0.5), pct(&members, 0.99), pct(&labels, 0.5), pct(&labels, 0.99));
    println!(
        "  endpoint change → delivery: p50 {p50:.0} ms, p99 {p99:.0} ms (Service change: p50 {b50:.0} ms, p99 {b99:.0} ms; p99 ratio {:.2})",
        p99 / b99
    );
    results.compare("endpoint change → delivery p50", p50, "ms", "Service label change → delivery p50", b50);
    results.compare("endpoint change → delivery p99", p99, "ms", "Service label change → delivery p99", b99);
    let churn_rss = vw.peak_rss_mib();
    println!("  peak RSS after churn: {churn_rss:.1} MiB");
    results.compare("churn: peak RSS", churn_rss, "MiB", "mode none: peak RSS", base_rss);
    vw.stop();

    let (mean, p99, json) = recompute(2000);
    println!(
        "  recompute 1,000 endpoints: mean {mean:.3} ms, p99 {p99:.3} ms (serializing them: {json:.3} ms; ratio {:.2})",
        mean / json
    );
    results.compare("recompute 1,000 endpoints: mean", mean, "ms", "serializing them: mean", json);
    results.compare("recompute 1,000 endpoints: p99", p99, "ms", "serializing them: mean", json);
    results.write();
}
