//! Burst benchmark: the shape of the independent load test, against `vipwatch serve`
//! running as its own process (so its CPU and peak RSS are its own), every figure next to a baseline
//! from the same run.
//!
//! Run: `cargo bench --bench burst` (optional args: SERVICES HOT CHANGES RATE SECONDS, default
//! 10000 1000 20000 500 20; `--no-finalizer` sets `kubernetes.finalizer = false`; the burst's writers
//! keep to 7,000 changes/s in all, `BENCH_BURST_RATE=N` to N, `BENCH_BURST_RATE=unpaced` write as
//! fast as the apiserver answers; `BENCH_POOL=1` adds a pool; `BENCH_APISERVER_CPU=500us` makes the
//! simulated apiserver spend that much CPU on each request, and a fifth of it on each watch event, as
//! a slower apiserver sharing the CPUs would: such a run is kept as `burst-slow-apiserver`).
//!
//! Phases, each with vipwatch's own peak RSS (VmHWM, reset between phases through
//! `/proc/<pid>/clear_refs`) next to the peak of the same binary started on an empty cluster, and
//! its resident memory at the phase's end split into anonymous (heap, allocator) and file-backed
//! (the binary's mapped code and data):
//! 1. initial sync: SERVICES Services exist before the start; start → `/readyz` 200 and start → the
//!    receiver has every Service's ADDED (with the finalizer, each first delivery waits for vipwatch's
//!    finalizer patch), next to a bare reqwest client POSTing as many bodies to the same receiver.
//! 2. burst: CHANGES label changes over HOT Services, written through the apiserver's HTTP API by 8
//!    writers at 7,000/s in all; per change, the time from the apiserver's answer to the receiver
//!    getting that change or a newer one of the same Service (a newer MODIFIED may supersede an older
//!    pending one, as documented); deliveries/s while the burst lasts. The baseline is a bare watch
//!    client on the same apiserver: the same latency measured at the watch stream.
//!    The relay's cycle per slot (an attempt's end → its round recorded and the next heads
//!    claimed), split into its stages from `vipwatch_relay_round_seconds`.
//! 3. steady: RATE changes/s for SECONDS s, the same latency, and vipwatch's CPU time per change.
//!
//! The burst and the steady phase also print the bytes vipwatch wrote (`wchar` of `/proc/<pid>/io`:
//! the WAL, the checkpoints, its requests) per change, next to the bytes the receiver got.
//!
//! Sizing mode: `cargo bench --bench burst -- --sizes` (1,000, 3,000, 10,000 and 30,000 Services) or
//! `--sizes=1000,50000,...`: for each size a fresh cluster and a fresh vipwatch, phases 1 and 3 only
//! (RATE and SECONDS as above, over up to HOT Services), so peak RSS and CPU by number of Services;
//! every Service has a VIP (by annotation), and `GET /api/v1/vips?limit=1000` is read every 100 ms
//! during the steady phase, next to the same read with no changes coming.
//! Its figures go into `benchmarks/results.json` under `burst-sizes`, the default run's under `burst`.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::load::{Seen, burst, receiver, rev_of, service, settle, steady};
use common::results::Results;
use common::{Process, Rounds, cpu_time, pct, reset_peak_rss, rss_split_mib, wait_until, written_bytes};
use serde_json::{Value, json};
use vipwatch::fake_apiserver::{FakeApiServer, FakeApiServerOptions};

/// `vipwatch serve` on a SQLite file in `dir`, delivering to `url`.
fn vipwatch(dir: &std::path::Path, api: &FakeApiServer, url: &str, finalizer: bool) -> Process {
    let database = format!("path = \"{}\"", dir.join("vipwatch.db").display());
    Process::vipwatch(&common::load::config(dir, "vipwatch", &api.url(), url, finalizer, &database))
}

/// The baseline watcher: a bare watch on every Service from `rv`, noting each event like the receiver.
async fn bare_watch(api: &FakeApiServer, rv: String, seen: Seen) {
    let url = format!("{}/api/v1/services?watch=1&resourceVersion={rv}", api.url());
    let mut response = reqwest::get(url).await.unwrap();
    tokio::spawn(async move {
        let mut buf = Vec::new();
        while let Ok(Some(chunk)) = response.chunk().await {
            let now = Instant::now();
            buf.extend_from_slice(&chunk);
            while let Some(end) = buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buf.drain(..=end).collect();
                if let Ok(ev) = serde_json::from_slice::<Value>(&line) {
                    let meta = &ev["object"]["metadata"];
                    seen.note(meta["name"].as_str().unwrap_or(""), rev_of(meta), now);
                }
            }
        }
    });
}

/// `BENCH_APISERVER_CPU` (e.g. `500us`): the CPU the simulated apiserver spends per request; zero
/// when unset.
fn apiserver_cpu() -> Duration {
    std::env::var("BENCH_APISERVER_CPU").map_or(Duration::ZERO, |raw| {
        humantime::parse_duration(&raw).unwrap_or_else(|e| panic!("BENCH_APISERVER_CPU={raw:?}: {e}"))
    })
}

/// The burst's pace in changes/s over all its writers: [`BURST_RATE`], or `BENCH_BURST_RATE` (a
/// positive number, or `unpaced`: as fast as the apiserver answers, which the fake one does at two
/// to three times a real one's rate on the same machine). Panics on another value.
fn burst_pace() -> Option<f64> {
    let raw = std::env::var("BENCH_BURST_RATE").unwrap_or_else(|_| BURST_RATE.to_string());
    if raw == "unpaced" {
        return None;
    }
    let pace: f64 = raw.parse().unwrap_or_else(|_| panic!("BENCH_BURST_RATE={raw:?}: not a number of changes/s"));
    assert!(pace > 0.0 && pace.is_finite(), "BENCH_BURST_RATE={raw:?}: must be a positive number of changes/s");
    Some(pace)
}

/// The burst's default pace, changes/s: the rate the scale targets are stated at (1,000 Services
/// changed at 7,000 writes/s).
const BURST_RATE: u32 = 7_000;

/// When vipwatch's API first showed change `rev` of Service `svc` stored (its `rev` label), polled
/// every 5 ms: the watch's ingestion, apart from the relay.
async fn stored(addr: &str, svc: &str, rev: u64) -> Instant {
    let (url, needle) = (format!("http://{addr}/api/v1/services/bench/{svc}"), format!("\"rev\":\"{rev}\""));
    let client = reqwest::Client::new();
    loop {
        if let Ok(r) = client.get(&url).send().await
            && r.text().await.is_ok_and(|body| body.contains(&needle))
        {
            return Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(5)).await; // ok: benchmark polling, not a test
    }
}

/// A bare reqwest client POSTing `n` bodies with concurrency 32 to `url`.
async fn bare_posts(url: &str, n: usize) -> Duration {
    let body = json!({"type": "service.added", "data": {"service": service(0)}}).to_string();
    let client = reqwest::Client::new();
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..32 {
        let (client, url, body, next) = (client.clone(), url.to_owned(), body.clone(), next.clone());
        tasks.spawn(async move {
            while next.fetch_add(1, Ordering::Relaxed) < n {
                client.post(&url).body(body.clone()).send().await.unwrap();
            }
        });
    }
    tasks.join_all().await;
    start.elapsed()
}

/// A bare paged list of every Service (pages of 500, as kube-runtime's watcher asks for), each page
/// parsed: what the apiserver's list alone costs a client, the floor of vipwatch's time to ready.
async fn bare_list(api: &FakeApiServer) -> Duration {
    let client = reqwest::Client::new();
    let start = Instant::now();
    let url = format!("{}/api/v1/services", api.url());
    let mut token: Option<String> = None;
    loop {
        // The simulated apiserver's tokens are hex: safe in a URL as they are.
        let url = match &token {
            Some(token) => format!("{url}?limit=500&continue={token}"),
            None => format!("{url}?limit=500"),
        };
        let page: Value = client.get(url).send().await.unwrap().json().await.unwrap();
        assert!(page["items"].is_array(), "a page of the Service list: {page}");
        match page["metadata"]["continue"].as_str() {
            Some(next) if !next.is_empty() => token = Some(next.to_owned()),
            _ => return start.elapsed(),
        }
    }
}

/// Prints and records the time to ready next to the bare list's, and says when the apiserver's list is
/// most of it (the apiserver, not vipwatch, is then the bound).
fn ready_line(results: &mut Results, key: &str, ready: f64, list: f64) {
    let bound = if list > ready / 2.0 { "; the apiserver's list is the bound" } else { "" };
    println!("  initial sync: ready {ready:.2} s; a bare paged list of every Service took {list:.2} s{bound}");
    results.compare(&format!("{key}initial sync: ready"), ready, "s", "bare paged list of every Service", list);
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Prints a phase's latency line and records its p50 / p99 / max next to the bare watch's.
fn latency_line(results: &mut Results, key: &str, what: &str, got: &[f64], base: &[f64]) {
    let (p50, p99, b50, b99) = (pct(got, 0.5), pct(got, 0.99), pct(base, 0.5), pct(base, 0.99));
    let (max, bmax) = (got.last().copied().unwrap_or(f64::NAN), base.last().copied().unwrap_or(f64::NAN));
    println!(
        "  {what}: latency p50 {p50:.1} ms, p99 {p99:.1} ms, max {max:.1} ms (bare watch: p50 {b50:.1} ms, p99 {b99:.1} ms; p99 ratio {:.1})",
        p99 / b99
    );
    results.compare(&format!("{key}: latency p50"), p50, "ms", "bare watch: latency p50", b50);
    results.compare(&format!("{key}: latency p99"), p99, "ms", "bare watch: latency p99", b99);
    results.compare(&format!("{key}: latency max"), max, "ms", "bare watch: latency max", bmax);
}

/// The same binary and config on an empty cluster: its peak RSS and its resident memory split
/// `(anonymous, file-backed)` once ready, the fixed cost every phase's memory is compared with
/// (NaN under `BENCH_WRAP`, whose profiler would write its output twice).
async fn empty_cluster(url: &str, finalizer: bool, results: &mut Results) -> Baseline {
    let empty = FakeApiServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let base = if std::env::var_os("BENCH_WRAP").is_some() {
        Baseline { rss: f64::NAN, anon: f64::NAN, file: f64::NAN }
    } else {
        let vw = vipwatch(dir.path(), &empty, url, finalizer);
        vw.wait_ready().await;
        let (rss, (anon, file)) = (vw.peak_rss_mib(), rss_split_mib(vw.pid()));
        vw.stop();
        Baseline { rss, anon, file }
    };
    println!("  baseline: peak RSS on an empty cluster {:.1} MiB", base.rss);
    results.figure("empty cluster: peak RSS", base.rss, "MiB");
    base
}

/// vipwatch's memory on an empty cluster ([`empty_cluster`]), in MiB.
#[derive(Clone, Copy)]
struct Baseline {
    rss: f64,
    anon: f64,
    file: f64,
}

impl Baseline {
    /// Prints `phase`'s memory line and records its peak and its split at the end (`key` prefixes
    /// the figures' names) next to the empty cluster's.
    fn rss_line(&self, results: &mut Results, key: &str, phase: &str, vw: &Process) {
        let (rss, (anon, file)) = (vw.peak_rss_mib(), rss_split_mib(vw.pid()));
        println!(
            "  {phase}: peak RSS {rss:.1} MiB (ratio {:.2} to the empty cluster; at its end {anon:.1} MiB anonymous, {file:.1} MiB file-backed)",
            rss / self.rss
        );
        results.compare(&format!("{key}: peak RSS"), rss, "MiB", "empty cluster: peak RSS", self.rss);
        results.compare(
            &format!("{key}: anonymous RSS at its end"),
            anon,
            "MiB",
            "empty cluster: anonymous RSS",
            self.anon,
        );
        results.compare(
            &format!("{key}: file-backed RSS at its end"),
            file,
            "MiB",
            "empty cluster: file-backed RSS",
            self.file,
        );
    }
}

/// `--sizes` (the default ladder, [`SIZES`]) or `--sizes=1000,5000,...`: the Services of each run of
/// the sizing mode.
fn sizes() -> Option<Vec<usize>> {
    std::env::args().skip(1).find_map(|a| match a.as_str() {
        "--sizes" => Some(SIZES.to_vec()),
        _ => a.strip_prefix("--sizes=").map(|list| {
            list.split(',')
                .map(|n| {
                    n.trim()
                        .replace('_', "")
                        .parse()
                        .unwrap_or_else(|_| panic!("--sizes={list}: not a list of numbers"))
                })
                .collect()
        }),
    })
}

/// The sizing mode's default cluster sizes.
const SIZES: [usize; 4] = [1_000, 3_000, 10_000, 30_000];

#[tokio::main]
async fn main() {
    vipwatch::relay::sender::install_crypto_provider();
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let arg = |i: usize, default: usize| args.get(i).copied().unwrap_or(default);
    let (services, hot, changes, rate, seconds) =
        (arg(0, 10_000), arg(1, 1_000), arg(2, 20_000), arg(3, 500), arg(4, 20));
    let finalizer = !std::env::args().any(|a| a == "--no-finalizer");
    if let Some(sizes) = sizes() {
        return sizing(&sizes, hot, rate, seconds, finalizer).await;
    }
    let pace = burst_pace();
    let how = pace.map_or_else(|| "as fast as the apiserver answers".to_owned(), |p| format!("at most {p}/s"));
    println!(
        "burst: {services} Services; {changes} changes over {hot} {how}; {rate}/s for {seconds} s; finalizer {finalizer}"
    );
    let cpu_per_request = apiserver_cpu();
    let mut results = Results::new(if cpu_per_request.is_zero() { "burst" } else { "burst-slow-apiserver" });
    results.param("apiserver_cpu_per_request_us", cpu_per_request.as_micros() as u64);
    results.param("services", services);
    results.param("hot", hot);
    results.param("changes", changes);
    results.param("rate", rate);
    results.param("seconds", seconds);
    results.param("finalizer", finalizer);
    results.param("burst_rate", pace);
    results.param("pool", std::env::var_os("BENCH_POOL").is_some());
    let seen = Seen::default();
    let url = receiver(seen.clone()).await;

    // The fixed cost: the same binary and config on an empty cluster.
    let empty = empty_cluster(&url, finalizer, &mut results).await;

    let history_limit = services + 2 * (changes + rate * seconds);
    let options = FakeApiServerOptions { history_limit, cpu_per_request, ..Default::default() };
    let api = FakeApiServer::start_with(options).await.unwrap();
    api.seed((0..services).map(service));
    let base_posts = bare_posts(&url, services).await;
    let list = bare_list(&api).await.as_secs_f64();
    seen.by_name.lock().unwrap().clear();

    // 1. Initial sync.
    let dir = tempfile::tempdir().unwrap();
    let own_cpu = cpu_time(std::process::id());
    let start = Instant::now();
    let vw = vipwatch(dir.path(), &api, &url, finalizer);
    vw.wait_ready().await;
    let ready = start.elapsed();
    wait_until("every Service's ADDED delivered", Duration::from_millis(5), || seen.names() >= services).await;
    let delivered = start.elapsed();
    println!(
        "  initial sync: ready {:.2} s, all {services} delivered {:.2} s after start (bare POSTs of as many: {:.2} s; ratio {:.2})",
        ready.as_secs_f64(),
        delivered.as_secs_f64(),
        base_posts.as_secs_f64(),
        delivered.as_secs_f64() / base_posts.as_secs_f64()
    );
    let (sync_cpu, own_sync_cpu) =
        (cpu_time(vw.pid()).as_secs_f64(), (cpu_time(std::process::id()) - own_cpu).as_secs_f64());
    println!(
        "  initial sync: CPU until all delivered: vipwatch {sync_cpu:.2} s, this process (fake apiserver, receiver) {own_sync_cpu:.2} s"
    );
    ready_line(&mut results, "", ready.as_secs_f64(), list);
    let posts = "bare reqwest POSTs of as many (32 at once)";
    results.compare("initial sync: all delivered", delivered.as_secs_f64(), "s", posts, base_posts.as_secs_f64());
    let own = "the benchmark's process (fake apiserver, receiver)";
    results.compare("initial sync: vipwatch CPU", sync_cpu, "s", own, own_sync_cpu);
    empty.rss_line(&mut results, "initial sync", "initial sync", &vw);

    // 2. Burst.
    reset_peak_rss(vw.pid());
    let watched = Seen::default();
    bare_watch(&api, api.resource_version(), watched.clone()).await;
    let before = seen.count.load(Ordering::Relaxed);
    let (vw_cpu, own_cpu) = (cpu_time(vw.pid()), cpu_time(std::process::id()));
    let io = Io::start(&vw, &seen);
    let rounds = Rounds::scrape(&vw.addr).await;
    let start = Instant::now();
    let written = burst(&api, hot, changes, 1, pace).await;
    let wrote = start.elapsed();
    let (svc, rev, _) = written.iter().max_by_key(|w| w.1).unwrap();
    let (got, stored) = tokio::join!(settle(&seen, &written), stored(&vw.addr, svc, *rev));
    let base = settle(&watched, &written).await;
    let last = seen.last_arrival(&written).unwrap().duration_since(start);
    let deliveries = seen.count.load(Ordering::Relaxed) - before;
    println!(
        "  burst: {changes} changes written in {:.2} s ({:.0}/s); {deliveries} deliveries in {:.2} s ({:.0}/s; the rest superseded)",
        wrote.as_secs_f64(),
        changes as f64 / wrote.as_secs_f64(),
        last.as_secs_f64(),
        deliveries as f64 / last.as_secs_f64()
    );
    let (written_rate, delivered_rate) = (changes as f64 / wrote.as_secs_f64(), deliveries as f64 / last.as_secs_f64());
    results.figure("burst: changes written", written_rate, "/s");
    results.compare("burst: deliveries", delivered_rate, "/s", "burst: changes written", written_rate);
    round_lines(&mut results, Rounds::scrape(&vw.addr).await.since(&rounds), deliveries);
    latency_line(&mut results, "burst", "burst", &got, &base);
    let lag = stored.duration_since(written.iter().find(|w| w.1 == *rev).unwrap().2).as_secs_f64();
    println!(
        "  burst: the last change stored {:.2} s after the start, {lag:.2} s after it was written (the watch's ingestion; the rest of its latency is the relay's)",
        stored.duration_since(start).as_secs_f64(),
    );
    results.compare(
        "burst: the last change stored, after it was written",
        lag,
        "s",
        "burst: latency p99",
        pct(&got, 0.99) / 1e3,
    );
    let (burst_cpu, own_burst_cpu) =
        ((cpu_time(vw.pid()) - vw_cpu).as_secs_f64(), (cpu_time(std::process::id()) - own_cpu).as_secs_f64());
    println!(
        "  burst: CPU until settled: vipwatch {burst_cpu:.2} s, this process (fake apiserver, writers, receiver) {own_burst_cpu:.2} s"
    );
    let own = "the benchmark's process (fake apiserver, writers, receiver)";
    results.compare("burst: vipwatch CPU", burst_cpu, "s", own, own_burst_cpu);
    io.line(&mut results, "burst", "burst", changes);
    empty.rss_line(&mut results, "burst", "burst", &vw);

    // 3. Steady rate.
    reset_peak_rss(vw.pid());
    let cpu = cpu_time(vw.pid());
    let io = Io::start(&vw, &seen);
    let written = steady(&api, hot, rate, seconds, 1 + changes as u64).await;
    let got = settle(&seen, &written).await;
    let base = settle(&watched, &written).await;
    let used = cpu_time(vw.pid()) - cpu;
    let phase = format!("steady {rate}/s");
    latency_line(&mut results, "steady", &phase, &got, &base);
    let per_change = ms(used) / written.len() as f64;
    println!("  {phase}: vipwatch CPU {:.2} s over {seconds} s, {per_change:.3} ms per change", used.as_secs_f64());
    results.compare("steady: vipwatch CPU per change", per_change, "ms", "interval between changes", 1e3 / rate as f64);
    io.line(&mut results, "steady", &phase, written.len());
    empty.rss_line(&mut results, "steady", &phase, &vw);
    vw.stop();
    results.write();
}

/// The sizing mode (`--sizes`): for each size, a fresh cluster of that many Services and a fresh
/// vipwatch: the initial sync (phase 1) and the steady rate (phase 3), each with vipwatch's peak RSS
/// and CPU, recorded as `burst-sizes` with the size in each figure's name (`10000 Services: ...`).
async fn sizing(sizes: &[usize], hot: usize, rate: usize, seconds: usize, finalizer: bool) {
    println!(
        "burst --sizes: {sizes:?} Services; {rate}/s for {seconds} s over up to {hot} of them; finalizer {finalizer}"
    );
    let mut results = Results::new("burst-sizes");
    results.param("sizes", sizes);
    results.param("hot", hot);
    results.param("rate", rate);
    results.param("seconds", seconds);
    results.param("finalizer", finalizer);
    results.param("pool", std::env::var_os("BENCH_POOL").is_some());
    let seen = Seen::default();
    let url = receiver(seen.clone()).await;
    let empty = empty_cluster(&url, finalizer, &mut results).await;
    for &services in sizes {
        let hot = hot.min(services);
        let options = FakeApiServerOptions { history_limit: services + 2 * rate * seconds, ..Default::default() };
        let api = FakeApiServer::start_with(options).await.unwrap();
        api.seed((0..services).map(|i| with_vip(service(i), i)));
        let base_posts = bare_posts(&url, services).await;
        let list = bare_list(&api).await.as_secs_f64();
        seen.by_name.lock().unwrap().clear();
        println!("{services} Services:");
        let key = format!("{services} Services");

        let dir = tempfile::tempdir().unwrap();
        let own_cpu = cpu_time(std::process::id());
        let start = Instant::now();
        let vw = vipwatch(dir.path(), &api, &url, finalizer);
        vw.wait_ready().await;
        let ready = start.elapsed().as_secs_f64();
        wait_until("every Service's ADDED delivered", Duration::from_millis(5), || seen.names() >= services).await;
        let delivered = start.elapsed().as_secs_f64();
        let (sync_cpu, own_sync_cpu) =
            (cpu_time(vw.pid()).as_secs_f64(), (cpu_time(std::process::id()) - own_cpu).as_secs_f64());
        println!(
            "  initial sync: ready {ready:.2} s, all delivered {delivered:.2} s after start (bare POSTs of as many: {:.2} s); \
             CPU vipwatch {sync_cpu:.2} s, this process {own_sync_cpu:.2} s",
            base_posts.as_secs_f64()
        );
        ready_line(&mut results, &format!("{key}: "), ready, list);
        let posts = "bare reqwest POSTs of as many (32 at once)";
        results.compare(
            &format!("{key}: initial sync: all delivered"),
            delivered,
            "s",
            posts,
            base_posts.as_secs_f64(),
        );
        let own = "the benchmark's process (fake apiserver, receiver)";
        results.compare(&format!("{key}: initial sync: vipwatch CPU"), sync_cpu, "s", own, own_sync_cpu);
        empty.rss_line(&mut results, &format!("{key}: initial sync"), "initial sync", &vw);

        // The first read builds the index (every Service once per process): not counted.
        vip_page(&reqwest::Client::new(), &vw.addr, services.min(1000)).await;
        let idle = vip_pages(vw.addr.clone(), services.min(1000), 50, Arc::default()).await;
        reset_peak_rss(vw.pid());
        let watched = Seen::default();
        bare_watch(&api, api.resource_version(), watched.clone()).await;
        let cpu = cpu_time(vw.pid());
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = tokio::spawn(vip_pages(vw.addr.clone(), services.min(1000), usize::MAX, stop.clone()));
        let written = steady(&api, hot, rate, seconds, 1).await;
        let got = settle(&seen, &written).await;
        let base = settle(&watched, &written).await;
        let used = cpu_time(vw.pid()) - cpu;
        let phase = format!("steady {rate}/s");
        latency_line(&mut results, &format!("{key}: steady"), &phase, &got, &base);
        stop.store(true, Ordering::Relaxed);
        let busy = reader.await.unwrap();
        vip_page_lines(&mut results, &key, &phase, &idle, busy);
        let per_change = ms(used) / written.len() as f64;
        println!("  {phase}: vipwatch CPU {:.2} s over {seconds} s, {per_change:.3} ms per change", used.as_secs_f64());
        let interval = 1e3 / rate as f64;
        results.compare(
            &format!("{key}: steady: vipwatch CPU per change"),
            per_change,
            "ms",
            "interval between changes",
            interval,
        );
        empty.rss_line(&mut results, &format!("{key}: steady"), &phase, &vw);
        vw.stop();
    }
    results.write();
}

/// Where a relay slot's turnaround went during the burst (`vipwatch_relay_round_seconds`): the mean
/// wait from an attempt's end to its round going to the store, and the mean time in the store (the
/// wait for the write connection and the transaction recording it and claiming the next heads);
/// their sum is the cycle per slot, recorded next to the store stage alone.
fn round_lines(results: &mut Results, (waiting, store, rounds): (f64, f64, f64), deliveries: usize) {
    let cycle = waiting + store;
    println!(
        "  burst: relay cycle per slot {cycle:.2} ms: waiting for the round {waiting:.2} ms, in the store {store:.2} ms ({rounds:.0} rounds, {:.1} deliveries each)",
        deliveries as f64 / rounds.max(1.0)
    );
    results.compare("burst: relay cycle per slot", cycle, "ms", "burst: relay round in the store", store);
    results.compare("burst: relay round waiting", waiting, "ms", "burst: relay cycle per slot", cycle);
}

/// Service `s` (from [`service`]) with VIP `10.0.0.0` + `i` in its annotation: every Service of the
/// sizing mode has one, so `GET /api/v1/vips` pages are full.
fn with_vip(mut s: Value, i: usize) -> Value {
    let ip = std::net::Ipv4Addr::from(u32::from(std::net::Ipv4Addr::new(10, 0, 0, 0)) + i as u32);
    s["metadata"]["annotations"] = json!({"vipwatch.io/loadBalancerIPs": ip.to_string()});
    s
}

/// `GET /api/v1/vips?limit=1000` on vipwatch at `addr`: its latency in ms; panics unless the page
/// has `items` items.
async fn vip_page(client: &reqwest::Client, addr: &str, items: usize) -> f64 {
    let start = Instant::now();
    let page: Value =
        client.get(format!("http://{addr}/api/v1/vips?limit=1000")).send().await.unwrap().json().await.unwrap();
    let took = ms(start.elapsed());
    assert_eq!(page["items"].as_array().map(Vec::len), Some(items), "a page of /api/v1/vips");
    took
}

/// Pages read one after the other, 100 ms apart, `most` of them or until `stop` is set: their
/// latencies, sorted.
async fn vip_pages(addr: String, items: usize, most: usize, stop: Arc<std::sync::atomic::AtomicBool>) -> Vec<f64> {
    let client = reqwest::Client::new();
    let mut got = Vec::new();
    while got.len() < most && !stop.load(Ordering::Relaxed) {
        got.push(vip_page(&client, &addr, items).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    got.sort_by(f64::total_cmp);
    got
}

/// The `/api/v1/vips?limit=1000` latencies while changes came (`busy`) next to those of the same
/// request while none did (`idle`, before the phase).
fn vip_page_lines(results: &mut Results, key: &str, phase: &str, idle: &[f64], busy: Vec<f64>) {
    let (p50, p99) = (pct(&busy, 0.5), pct(&busy, 0.99));
    let (idle50, idle99) = (pct(idle, 0.5), pct(idle, 0.99));
    println!(
        "  {phase}: GET /api/v1/vips?limit=1000 every 100 ms: p50 {p50:.1} ms, p99 {p99:.1} ms over {} reads (no changes coming: p50 {idle50:.1} ms, p99 {idle99:.1} ms)",
        busy.len()
    );
    let idle_name = format!("{key}: GET /api/v1/vips?limit=1000, no changes coming: p99");
    results.figure(&idle_name, idle99, "ms");
    results.compare(&format!("{key}: steady: GET /api/v1/vips?limit=1000 p50"), p50, "ms", &idle_name, idle99);
    results.compare(&format!("{key}: steady: GET /api/v1/vips?limit=1000 p99"), p99, "ms", &idle_name, idle99);
}

/// Bytes vipwatch writes during a phase (`wchar`: its WAL frames, its checkpoints' pages, its requests)
/// next to the bytes the receiver got in the same phase: how much vipwatch writes per byte it
/// delivers. Not timing, so steadier from run to run than CPU or latency.
struct Io<'a> {
    pid: u32,
    seen: &'a Seen,
    written: u64,
    delivered: usize,
}

impl<'a> Io<'a> {
    fn start(vw: &Process, seen: &'a Seen) -> Self {
        Self { pid: vw.pid(), seen, written: written_bytes(vw.pid()), delivered: seen.bytes.load(Ordering::Relaxed) }
    }

    /// Prints the phase's line and records the bytes written per change (`{key}: bytes written per
    /// change`) next to the bytes delivered per change.
    fn line(&self, results: &mut Results, key: &str, phase: &str, changes: usize) {
        let written = (written_bytes(self.pid) - self.written) as f64;
        let delivered = (self.seen.bytes.load(Ordering::Relaxed) - self.delivered) as f64;
        println!(
            "  {phase}: vipwatch wrote {:.1} MB, {:.1} KB per change (bytes delivered: {:.1} MB; ratio {:.1})",
            written / 1e6,
            written / 1e3 / changes as f64,
            delivered / 1e6,
            written / delivered
        );
        let (per_change, delivered_per_change) = (written / 1e3 / changes as f64, delivered / 1e3 / changes as f64);
        let name = format!("{key}: bytes written per change");
        results.compare(&name, per_change, "KB", "bytes delivered per change", delivered_per_change);
    }
}
