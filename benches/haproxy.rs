//! HAProxy end-to-end benchmark: the simulated Kubernetes API → `vipwatch serve` (its own
//! process) → the HAProxy agent (its own process: this binary re-run as `agent-child`) → a real
//! `haproxy` → TCP through loopback VIPs to "pods". vipwatch has a second endpoint, a plain receiver
//! that only notes arrivals: the baseline from the same run, so every figure is also a ratio to
//! "vipwatch delivered it" and shows what the agent and HAProxy add.
//!
//! Run: `cargo bench --bench haproxy` (optional args: CREATES BULK..., default 100 1000; each BULK
//! after the first is another bulk phase, its figures named `bulk N: …`). Needs `haproxy` on `PATH`.
//!
//! - create: CREATES Services, one after the other, each a Service then its EndpointSlice (as the
//!   endpoint controller writes it); per Service the time from the create to the first connection
//!   through its VIP that reaches the pod, p50 / p99, next to the create → delivery at the receiver.
//! - members: for each of those Services, its EndpointSlice moves to the other pod; the time from the
//!   write to the first connection that reaches the new pod, p50 / p99, next to the write → the
//!   MODIFIED at the receiver; and the reloads this took (member changes go through the Runtime API).
//! - bulk: BULK Services already in the cluster, an agent with an empty directory, vipwatch started:
//!   the time until the agent has applied all of them and the last VIP answers, next to the time until
//!   the receiver has all of them; reloads used; peak RSS (VmHWM) of the agent and of HAProxy's worker,
//!   next to vipwatch's.

mod common;

use std::collections::HashMap;

use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use common::results::Results;
use common::{Process, peak_rss_mib};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use vipwatch::fake_apiserver::{FakeApiServer, FakeApiServerOptions, Resource};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const PORT: u16 = 8080;
const POD_A: &str = "127.0.9.1";
const POD_B: &str = "127.0.9.2";
const POD_PORT: u16 = 18480;

/// `(Service name, marker)` → first arrival at the receiver. Marker `added` for an ADDED (and
/// `vip=<address>` for its VIP), else the address a MODIFIED's `backendsDiff` added.
type Arrivals = Arc<Mutex<HashMap<(String, String), Instant>>>;

async fn receiver() -> (String, Arrivals) {
    let arrivals: Arrivals = Arc::default();
    let app = Router::new()
        .fallback(|State(arrivals): State<Arrivals>, body: Bytes| async move {
            let now = Instant::now();
            if let Ok(v) = serde_json::from_slice::<Value>(&body) {
                let name = v["data"]["service"]["name"].as_str().unwrap_or("").to_owned();
                let mut seen = arrivals.lock().unwrap();
                if v["type"] == "service.added" {
                    seen.entry((name.clone(), "added".into())).or_insert(now);
                    for vip in v["data"]["service"]["vips"].as_array().into_iter().flatten() {
                        seen.entry((name.clone(), format!("vip={}", vip.as_str().unwrap_or("")))).or_insert(now);
                    }
                }
                for m in v["data"]["backendsDiff"]["added"].as_array().into_iter().flatten() {
                    seen.entry((name.clone(), m["address"].as_str().unwrap_or("").to_owned())).or_insert(now);
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

/// A pod answering every connection with `name`.
async fn pod(ip: &str, name: &'static str) {
    let listener = tokio::net::TcpListener::bind((ip, POD_PORT)).await.unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let _ = s.write_all(name.as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    });
}

/// What one connection to `addr` reads; `None` when refused, reset or silent for a second.
async fn hit(addr: &str) -> Option<String> {
    let io = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).await.ok()?;
        Some(out)
    };
    tokio::time::timeout(Duration::from_secs(1), io).await.ok().flatten().filter(|s| !s.is_empty())
}

fn service(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "bench"},
        "spec": {"type": "LoadBalancer", "selector": {"app": name},
                 "ports": [{"name": "http", "protocol": "TCP", "port": PORT, "targetPort": POD_PORT}]}})
}

fn slice(name: &str, pod: &str) -> Value {
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{name}-abc"), "namespace": "bench",
                     "labels": {"kubernetes.io/service-name": name}},
        "addressType": "IPv4", "ports": [{"name": "http", "protocol": "TCP", "port": POD_PORT}],
        "endpoints": [{"addresses": [pod], "conditions": {"ready": true}}]})
}

fn name(i: usize) -> String {
    format!("svc-{i:04}")
}

/// The children of `pid` (HAProxy's workers under its master).
fn children(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            let after = stat.rsplit(')').next().unwrap_or("");
            after.split_whitespace().nth(1).and_then(|pp| pp.parse::<u32>().ok()) == Some(pid)
        })
        .collect()
}

/// `vipwatch serve` against `api`, with the receiver and the agent as endpoints, members in mode pod;
/// a pool of 16,384 loopback VIPs (a bulk of 10,000 fits).
fn vipwatch(dir: &Path, api: &FakeApiServer, receiver: &str, agent: &str) -> Process {
    let config = format!(
        "[kubernetes]\nurl = \"{}\"\n[database]\npath = \"{}\"\n[server]\nlisten = \"127.0.0.1:0\"\n\
         [backends]\nmode = \"pod\"\n[[pools]]\nname = \"bench\"\naddresses = [\"127.102.0.0/18\"]\n\
         [[webhooks]]\nname = \"receiver\"\nurl = \"{receiver}\"\nsecret = \"{SECRET}\"\n\
         [[webhooks]]\nname = \"haproxy\"\nurl = \"{agent}\"\nsecret = \"{SECRET}\"\n",
        api.url(),
        dir.join("vipwatch.db").display()
    );
    let path = dir.join("vipwatch.toml");
    std::fs::write(&path, config).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vipwatch"));
    cmd.args(["serve", "--config"]).arg(&path).env("VIPWATCH_LOG", "info");
    Process::spawn(cmd, "API listening addr=", false)
}

/// This binary as the agent (`agent-child DIR`), with the default batch window and HAProxy tied to it.
fn agent(dir: &Path) -> Process {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.arg("agent-child").arg(dir);
    Process::spawn(cmd, "AGENT ", true)
}

/// The `agent-child` mode: the agent on 127.0.0.1:0 until SIGTERM, with its defaults and the
/// `VIPWATCH_HAPROXY_*` overrides of the environment (e.g. `VIPWATCH_HAPROXY_CONCURRENCY`).
async fn agent_child(dir: &str) {
    // Its log goes to stdout after the marker: kept with `BENCH_LOG_FILE`, at `VIPWATCH_HAPROXY_LOG`.
    if std::env::var_os("BENCH_LOG_FILE").is_some() {
        let filter = tracing_subscriber::EnvFilter::try_from_env("VIPWATCH_HAPROXY_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
        tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stdout).with_ansi(false).init();
    }
    let config = vipwatch_haproxy::AgentConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        secrets: vec![SECRET.into()],
        dir: dir.into(),
        stop_haproxy_on_exit: true,
        ..vipwatch_haproxy::AgentConfig::load_unchecked(None).unwrap()
    };
    let listener = tokio::net::TcpListener::bind(config.listen).await.unwrap();
    println!("AGENT {}", listener.local_addr().unwrap());
    let term = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).unwrap();
        term.recv().await;
    };
    vipwatch_haproxy::run(config, listener, term).await.unwrap();
}

async fn until<T>(what: &str, limit: Duration, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

async fn reloads(dir: &Path) -> u64 {
    vipwatch_haproxy::haproxy::Haproxy::new("haproxy".as_ref(), dir).show_proc().await.unwrap().reloads
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    sorted.get(((sorted.len() as f64 * p).ceil() as usize).saturating_sub(1)).copied().unwrap_or(f64::NAN)
}

/// Prints p50 / p99 of `got` next to `base`'s and records them as `{key} p50` and `{key} p99`.
fn report(results: &mut Results, key: &str, what: &str, mut got: Vec<f64>, mut base: Vec<f64>) {
    got.sort_by(f64::total_cmp);
    base.sort_by(f64::total_cmp);
    let (p50, p99, b50, b99) = (pct(&got, 0.5), pct(&got, 0.99), pct(&base, 0.5), pct(&base, 0.99));
    println!(
        "  {what}: p50 {p50:.0} ms, p99 {p99:.0} ms (delivered to the receiver: p50 {b50:.0} ms, p99 {b99:.0} ms; \
         ratios {:.2} / {:.2})",
        p50 / b50,
        p99 / b99
    );
    results.compare(&format!("{key} p50"), p50, "ms", "delivered to the receiver p50", b50);
    results.compare(&format!("{key} p99"), p99, "ms", "delivered to the receiver p99", b99);
}

fn arrival(arrivals: &Arrivals, name: &str, marker: &str) -> Option<Instant> {
    arrivals.lock().unwrap().get(&(name.to_owned(), marker.to_owned())).copied()
}

/// The VIP of Service `name`, from its ADDED at the receiver (the status write-back, which waits for
/// every endpoint's acknowledgement, is not what is measured).
fn vip_of(arrivals: &Arrivals, name: &str) -> Option<String> {
    let got = arrivals.lock().unwrap();
    got.keys().find(|(n, m)| n == name && m.starts_with("vip=")).map(|(_, m)| m["vip=".len()..].to_owned())
}

async fn creates_and_member_changes(n: usize, results: &mut Results) {
    let api = FakeApiServer::start_with(FakeApiServerOptions::default()).await.unwrap();
    let (url, arrivals) = receiver().await;
    let dir = tempfile::tempdir().unwrap();
    let agent = agent(&dir.path().join("agent"));
    let vw = vipwatch(dir.path(), &api, &url, &format!("http://{}/hooks/vipwatch", agent.addr));
    let client = reqwest::Client::new();
    until("vipwatch ready", Duration::from_secs(60), async || {
        let r = client.get(format!("http://{}/readyz", vw.addr)).send().await.ok()?;
        (r.status() == 200).then_some(())
    })
    .await;

    let (mut got, mut base, mut vips) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..n {
        let name = name(i);
        let start = Instant::now();
        api.apply(service(&name));
        api.apply_resource(Resource::EndpointSlices, slice(&name, POD_A));
        let vip =
            until("the VIP in the receiver's ADDED", Duration::from_secs(30), async || vip_of(&arrivals, &name)).await;
        let addr = format!("{vip}:{PORT}");
        until("a connection through the VIP", Duration::from_secs(30), async || {
            (hit(&addr).await.as_deref() == Some("a")).then_some(())
        })
        .await;
        got.push(start.elapsed().as_secs_f64() * 1000.0);
        let arrived =
            until("the receiver's ADDED", Duration::from_secs(30), async || arrival(&arrivals, &name, "added")).await;
        base.push(arrived.duration_since(start).as_secs_f64() * 1000.0);
        vips.push(addr);
    }
    let what = format!("Service created → first connection through its VIP ({n} Services)");
    report(results, "create → live", &what, got, base);

    let agent_dir = dir.path().join("agent");
    let before = reloads(&agent_dir).await;
    let (mut got, mut base) = (Vec::new(), Vec::new());
    for (i, addr) in vips.iter().enumerate() {
        let name = name(i);
        let start = Instant::now();
        api.apply_resource(Resource::EndpointSlices, slice(&name, POD_B));
        until("the connection reaching the new pod", Duration::from_secs(30), async || {
            (hit(addr).await.as_deref() == Some("b")).then_some(())
        })
        .await;
        got.push(start.elapsed().as_secs_f64() * 1000.0);
        let arrived =
            until("the receiver's MODIFIED", Duration::from_secs(30), async || arrival(&arrivals, &name, POD_B)).await;
        base.push(arrived.duration_since(start).as_secs_f64() * 1000.0);
    }
    report(results, "member change → live", &format!("member-only change → live ({n} changes)"), got, base);
    let member_reloads = reloads(&agent_dir).await - before;
    println!("    reloads for those {n} member changes: {member_reloads}");
    results.compare("member changes: reloads", member_reloads as f64, "", "member changes", n as f64);
    vw.stop();
    agent.stop();
}

/// One bulk phase of `n` Services; its figures are named `{phase}: …`.
async fn bulk(n: usize, phase: &str, results: &mut Results) {
    let options = FakeApiServerOptions { history_limit: 8 * n + 1000, ..Default::default() };
    let api = FakeApiServer::start_with(options).await.unwrap();
    api.seed((0..n).map(|i| service(&name(i))));
    api.seed((0..n).map(|i| slice(&name(i), POD_A)));
    let (url, arrivals) = receiver().await;
    let dir = tempfile::tempdir().unwrap();
    let agent_dir = dir.path().join("agent");
    let agent = agent(&agent_dir);
    let client = reqwest::Client::new();
    let start = Instant::now();
    let vw = vipwatch(dir.path(), &api, &url, &format!("http://{}/hooks/vipwatch", agent.addr));
    let last = name(n - 1);
    let received = until("every ADDED at the receiver", Duration::from_secs(600), async || {
        let got = arrivals.lock().unwrap();
        let all = (0..n).all(|i| got.contains_key(&(name(i), "added".to_owned())));
        all.then(|| got.values().copied().max().unwrap())
    })
    .await;
    let state_url = format!("http://{}/state", agent.addr);
    until("every Service applied by the agent", Duration::from_secs(600), async || {
        let state: Value = client.get(&state_url).send().await.ok()?.json().await.ok()?;
        (state["services"].as_array()?.len() == n).then_some(())
    })
    .await;
    let vip = until("the last VIP", Duration::from_secs(60), async || vip_of(&arrivals, &last)).await;
    let addr = format!("{vip}:{PORT}");
    until("the last VIP answering", Duration::from_secs(60), async || {
        (hit(&addr).await.as_deref() == Some("a")).then_some(())
    })
    .await;
    let applied = start.elapsed().as_secs_f64();
    let base = received.duration_since(start).as_secs_f64();
    let bulk_reloads = reloads(&agent_dir).await;
    println!(
        "  {n} Services from empty: all live through HAProxy after {applied:.2} s (all delivered to the receiver: \
         {base:.2} s; ratio {:.2}); reloads: {bulk_reloads}",
        applied / base,
    );
    let all_delivered = format!("{phase}: all delivered to the receiver");
    results.compare(&format!("{phase}: all live"), applied, "s", &all_delivered, base);
    results.compare(&format!("{phase}: reloads"), bulk_reloads as f64, "", "Services", n as f64);
    let master: u32 = std::fs::read_to_string(agent_dir.join("haproxy.pid")).unwrap().trim().parse().unwrap();
    let worker = children(master).into_iter().map(peak_rss_mib).fold(0.0, f64::max);
    let (agent_rss, vw_rss) = (peak_rss_mib(agent.child.id()), peak_rss_mib(vw.child.id()));
    let master = peak_rss_mib(master);
    println!(
        "  peak RSS: agent {agent_rss:.1} MiB, HAProxy worker {worker:.1} MiB, master {master:.1} MiB \
         (vipwatch {vw_rss:.1} MiB; agent ratio {:.2})",
        agent_rss / vw_rss
    );
    results.figure(&format!("{phase}: peak RSS of vipwatch"), vw_rss, "MiB");
    results.compare(&format!("{phase}: peak RSS of the agent"), agent_rss, "MiB", "vipwatch", vw_rss);
    results.compare(&format!("{phase}: peak RSS of HAProxy's worker"), worker, "MiB", "vipwatch", vw_rss);
    results.compare(&format!("{phase}: peak RSS of HAProxy's master"), master, "MiB", "vipwatch", vw_rss);
    vw.stop();
    agent.stop();
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("agent-child") {
        return agent_child(&args[1]).await;
    }
    let ok = Command::new("haproxy").arg("-v").output().is_ok_and(|o| o.status.success());
    assert!(ok, "this benchmark runs a real HAProxy: install Debian's `haproxy` package");
    vipwatch::relay::sender::install_crypto_provider();
    let numbers: Vec<usize> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let creates = numbers.first().copied().unwrap_or(100);
    let bulks = if numbers.len() > 1 { numbers[1..].to_vec() } else { vec![1000] };
    let mut results = Results::new("haproxy");
    results.param("creates", creates);
    results.param("bulk", bulks[0]);
    if bulks.len() > 1 {
        results.param("more bulks", format!("{:?}", &bulks[1..]));
    }
    let version = Command::new("haproxy").arg("-v").output().map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    let version = version.unwrap_or_default();
    results.param("haproxy", version.lines().next().unwrap_or("").to_owned());
    println!(
        "haproxy: vipwatch → agent → HAProxy 2.6 → pods, through loopback VIPs (batch window 200 ms, backends window 100 ms: the defaults)"
    );
    pod(POD_A, "a").await;
    pod(POD_B, "b").await;
    creates_and_member_changes(creates, &mut results).await;
    for (i, n) in bulks.iter().enumerate() {
        bulk(*n, &if i == 0 { "bulk".to_owned() } else { format!("bulk {n}") }, &mut results).await;
    }
    results.write();
}
