//! The load the benchmarks that start `vipwatch serve` drive, and what they measure it with: Services
//! carrying a `rev` label, label changes through the apiserver's HTTP API, a receiver that notes per
//! Service which `rev` arrived when, and the latency from a write to its delivery.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use serde_json::{Value, json};
use vipwatch::fake_apiserver::FakeApiServer;

/// The receiver endpoint's Standard Webhooks secret.
pub const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// Per Service name: `(rev, arrival)` of every delivery or watch event seen, in arrival order.
pub type Arrivals = HashMap<String, Vec<(u64, Instant)>>;

/// What the receiver (or a bare watch) saw.
#[derive(Clone, Default)]
pub struct Seen {
    pub by_name: Arc<Mutex<Arrivals>>,
    pub count: Arc<AtomicUsize>,
    /// Body bytes the receiver got (0 for a bare watch).
    pub bytes: Arc<AtomicUsize>,
}

impl Seen {
    pub fn note(&self, name: &str, rev: u64, at: Instant) {
        self.by_name.lock().unwrap().entry(name.to_owned()).or_default().push((rev, at));
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    pub fn names(&self) -> usize {
        self.by_name.lock().unwrap().len()
    }

    /// Per write `(name, rev, written at)`: milliseconds until `rev` or a newer one of the Service was
    /// seen; `None` while some is still missing.
    pub fn latencies(&self, written: &[(String, u64, Instant)]) -> Option<Vec<f64>> {
        let seen = self.by_name.lock().unwrap();
        let mut out = Vec::with_capacity(written.len());
        for (name, rev, at) in written {
            let first = seen.get(name)?.iter().filter(|(r, _)| r >= rev).map(|(_, t)| *t).min()?;
            out.push(first.saturating_duration_since(*at).as_secs_f64() * 1000.0);
        }
        out.sort_by(f64::total_cmp);
        Some(out)
    }

    /// When the last of `written` was first seen.
    pub fn last_arrival(&self, written: &[(String, u64, Instant)]) -> Option<Instant> {
        let seen = self.by_name.lock().unwrap();
        written
            .iter()
            .filter_map(|(name, rev, _)| seen.get(name)?.iter().filter(|(r, _)| r >= rev).map(|(_, t)| *t).min())
            .max()
    }
}

/// The `rev` label of a Service (its delivered view or its metadata); 0 when absent.
pub fn rev_of(service: &Value) -> u64 {
    service["labels"]["rev"].as_str().and_then(|r| r.parse().ok()).unwrap_or(0)
}

/// The receiver on `127.0.0.1:0`: 204 at once, noting each delivery's Service and `rev` label in
/// `seen`. Returns its URL. It runs on a thread and runtime of its own, as the independent load
/// test's nginx sink ran in a process of its own: on the benchmark's runtime its answers waited
/// behind the fake apiserver and the burst's writers, which are as busy as the apiserver lets them be.
pub async fn receiver(seen: Seen) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    std::thread::Builder::new()
        .name("receiver".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async move {
                serve_receiver(tokio::net::TcpListener::from_std(listener).unwrap(), seen).await;
            });
        })
        .unwrap();
    url
}

async fn serve_receiver(listener: tokio::net::TcpListener, seen: Seen) {
    let app = Router::new()
        .fallback(|State(seen): State<Seen>, body: Bytes| async move {
            let now = Instant::now();
            seen.bytes.fetch_add(body.len(), Ordering::Relaxed);
            if let Ok(v) = serde_json::from_slice::<Value>(&body) {
                let svc = &v["data"]["service"];
                seen.note(svc["name"].as_str().unwrap_or(""), rev_of(svc), now);
            }
            StatusCode::NO_CONTENT
        })
        .with_state(seen);
    axum::serve(listener, app).await.unwrap();
}

/// LoadBalancer Service `i` in namespace `bench`, label `rev` = 0.
pub fn service(i: usize) -> Value {
    json!({"metadata": {"name": name(i), "namespace": "bench", "labels": {"app": "bench", "rev": "0"}},
           "spec": {"type": "LoadBalancer", "selector": {"app": "bench"},
                    "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080, "nodePort": 30000 + (i % 2000)}]}})
}

pub fn name(i: usize) -> String {
    format!("svc-{i:05}")
}

/// Writes `<dir>/<file>.toml` for `vipwatch serve` against `api`, its API on a free loopback port,
/// one signed endpoint `sink` at `hook`, the finalizer as given and `database` as the body of
/// `[database]` (`path = "…"` or `url = "…"` …); returns its path. With `BENCH_POOL` set in the
/// environment, also a pool of 65,536 addresses (`10.200.0.0/16`): every Service then gets a VIP, its
/// status written back once acknowledged, and the watch sees each write-back as a change.
pub fn config(dir: &Path, file: &str, api: &str, hook: &str, finalizer: bool, database: &str) -> PathBuf {
    let pool = match std::env::var_os("BENCH_POOL") {
        Some(_) => "[[pools]]\nname = \"bench\"\naddresses = [\"10.200.0.0/16\"]\n",
        None => "",
    };
    let config = format!(
        "[kubernetes]\nurl = \"{api}\"\nfinalizer = {finalizer}\n[database]\n{database}\n[server]\nlisten = \"127.0.0.1:0\"\n\
         {pool}[[webhooks]]\nname = \"sink\"\nurl = \"{hook}\"\nsecret = \"{SECRET}\"\n"
    );
    let path = dir.join(format!("{file}.toml"));
    std::fs::write(&path, config).unwrap();
    path
}

/// One label change through the apiserver's HTTP API (merge patch); returns when it answered.
pub async fn write(client: &reqwest::Client, base: &str, service: &str, rev: u64) -> Instant {
    let url = format!("{base}/api/v1/namespaces/bench/services/{service}");
    let patch = json!({"metadata": {"labels": {"rev": rev.to_string()}}});
    let r = client
        .patch(url)
        .header("content-type", "application/merge-patch+json")
        .body(patch.to_string())
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "patch answered {}", r.status());
    Instant::now()
}

/// RATE writes per second for SECONDS s, over HOT Services (Service `7n mod HOT` for write `n`, so
/// consecutive writes touch different Services).
pub async fn steady(
    api: &FakeApiServer,
    hot: usize,
    rate: usize,
    seconds: usize,
    first_rev: u64,
) -> Vec<(String, u64, Instant)> {
    let client = reqwest::Client::new();
    let start = Instant::now();
    let mut written = Vec::with_capacity(rate * seconds);
    for n in 0..rate * seconds {
        tokio::time::sleep_until((start + Duration::from_secs_f64(n as f64 / rate as f64)).into()).await;
        let (svc, rev) = (name((n * 7) % hot), first_rev + n as u64);
        let at = write(&client, &api.url(), &svc, rev).await;
        written.push((svc, rev, at));
    }
    written
}

/// Waits (at most 120 s) until every write was seen; returns the sorted latencies.
pub async fn settle(seen: &Seen, written: &[(String, u64, Instant)]) -> Vec<f64> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(l) = seen.latencies(written) {
            return l;
        }
        assert!(Instant::now() < deadline, "not every change arrived within 120 s");
        tokio::time::sleep(Duration::from_millis(20)).await; // ok: benchmark polling, not a test
    }
}

/// Writers of a [`burst`], each with its own HTTP client.
pub const WRITERS: usize = 8;

/// CHANGES writes over HOT Services by [`WRITERS`] writers as fast as the apiserver answers, or, with
/// `pace` (changes/s over all writers, [`burst_pace`]), change `n` no earlier than `n / pace` s after
/// the start.
pub async fn burst(
    api: &FakeApiServer,
    hot: usize,
    changes: usize,
    first_rev: u64,
    pace: Option<f64>,
) -> Vec<(String, u64, Instant)> {
    let next = Arc::new(AtomicUsize::new(0));
    let start = tokio::time::Instant::now();
    let mut writers = tokio::task::JoinSet::new();
    for _ in 0..WRITERS {
        let (next, base) = (next.clone(), api.url());
        writers.spawn(async move {
            let client = reqwest::Client::new();
            let mut mine = Vec::new();
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= changes {
                    return mine;
                }
                if let Some(pace) = pace {
                    tokio::time::sleep_until(start + Duration::from_secs_f64(n as f64 / pace)).await;
                }
                let (svc, rev) = (name(n % hot), first_rev + n as u64);
                let at = write(&client, &base, &svc, rev).await;
                mine.push((svc, rev, at));
            }
        });
    }
    writers.join_all().await.into_iter().flatten().collect()
}
