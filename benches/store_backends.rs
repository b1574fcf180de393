//! Store backends benchmark: the same workload on SQLite (the baseline) and on
//! PostgreSQL, then the leader takeover between two replicas on PostgreSQL. Every vipwatch is
//! `vipwatch serve` as its own process, so its peak RSS (VmHWM) is its own.
//!
//! Run: `VIPWATCH_BENCH_PG_URL=$(scripts/pg-test.sh start /tmp/vw-bench-pg) cargo bench --bench
//! store_backends` (optional args: SERVICES RATE SECONDS KILLS TERMS, default 10000 500 10 10 5;
//! `--leader-ttl=3s --leader-renew=500ms` replace the production lease defaults, 15s and 2s). The
//! server is `VIPWATCH_BENCH_PG_URL`, else `VIPWATCH_TEST_PG_URL`; each part gets a fresh database on
//! it, dropped at the end.
//!
//! 1. Workload, once per backend, each on a fresh fake apiserver, database and process with the
//!    default config and one signed endpoint (a loopback receiver answering 204 at once):
//!    - sync: SERVICES Services exist before the start; start → ready (`/api/v1/status`: leading,
//!      or `single`, with `not_ready` null: what `/readyz` checks of the watch, without its database
//!      write probe, which would share the write connection with the writer measured), and start → the receiver
//!      holds every ADDED (each waits for vipwatch's finalizer patch, as in production).
//!    - ingest: one label change on every Service, written in-process as fast as the fake apiserver
//!      takes them; events/s until the event log holds them all (its newest id, then its row count,
//!      read every 5 ms through a connection of the benchmark's own).
//!    - deliveries: the same changes; deliveries/s from the first write until the receiver holds
//!      them all (one change per Service, so none is superseded).
//!    - steady: RATE changes/s for SECONDS s through the apiserver's HTTP API, each on another
//!      Service; per change, the time from the apiserver's answer to the receiver getting it, p50/p99.
//!    - burst: then 20,000 changes over 1,000 Services at 7,000/s (the `burst` benchmark's shape), by
//!      8 writers; per change as above, p99.
//!    - reads: through the steady load and the burst, `GET /api/v1/services/bench/<name>` every 10 ms,
//!      one Service after another; p50/p99. On SQLite the one instance answers; on PostgreSQL a second
//!      replica (`reader`), started before the steady load, answers as a follower.
//!
//!    PostgreSQL's figures are printed as ratios to SQLite's.
//! 2. Takeover: two replicas (`a`, `b`) on one fresh database, 1,000 Services, the lease settings as
//!    configured. KILLS times: after a random pause of up to one renewal interval (so the kill falls
//!    anywhere in the lease's cycle), SIGKILL the leader; the time until the other replica's
//!    `/api/v1/status` says `role: leader` and until it is ready as above (with the last leader's
//!    lists in the database that comes with leading: it serves those while it lists its own),
//!    polled every 20 ms; then, after another random pause (so the restarted follower's bids fall
//!    anywhere in the new leader's cycle), the killed one restarts under its name and must answer as a
//!    follower. TERMS times the same with SIGTERM (graceful: the leader resigns and notifies), also
//!    timing the old leader's exit. p50 / p99 / max, against the baseline of the configured lease TTL.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::load::{self, Seen};
use common::results::Results;
use common::{Process, pct, wait_until};
use serde_json::{Value, json};
use vipwatch::config::{DatabaseConfig, Secret};
use vipwatch::fake_apiserver::{FakeApiServer, FakeApiServerOptions};
use vipwatch::store::Store;

/// How often the takeover part asks a replica for its role (and readiness).
const POLL: Duration = Duration::from_millis(20);
/// Services in the takeover part's cluster.
const HA_SERVICES: usize = 1_000;

/// The PostgreSQL server to create the benchmark's databases on; exits 2 with how to start one
/// when none is configured.
fn pg_server() -> String {
    for var in ["VIPWATCH_BENCH_PG_URL", "VIPWATCH_TEST_PG_URL"] {
        if let Ok(url) = std::env::var(var)
            && !url.is_empty()
        {
            return url;
        }
    }
    eprintln!(
        "store_backends needs a PostgreSQL server (15 or later): set VIPWATCH_BENCH_PG_URL (or VIPWATCH_TEST_PG_URL)\n\
         to a URL whose user may CREATE DATABASE. A throwaway one (unix socket only, durability off):\n\n    \
         export VIPWATCH_BENCH_PG_URL=$(scripts/pg-test.sh start /tmp/vw-bench-pg)\n    \
         cargo bench --bench store_backends\n    \
         scripts/pg-test.sh stop /tmp/vw-bench-pg"
    );
    std::process::exit(2);
}

/// A fresh database on `server`: `(name, url)`.
async fn create_database(server: &str) -> (String, String) {
    use sqlx::Connection as _;
    let name = format!("bench_{}", uuid::Uuid::new_v4().simple());
    let mut conn = sqlx::PgConnection::connect(server).await.expect("the PostgreSQL server answers");
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}"))).execute(&mut conn).await.unwrap();
    let mut url: url::Url = server.parse().unwrap();
    url.set_path(&format!("/{name}"));
    (name, url.to_string())
}

async fn drop_database(server: &str, name: &str) {
    use sqlx::Connection as _;
    let mut conn = sqlx::PgConnection::connect(server).await.unwrap();
    let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
    if let Err(e) = sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&mut conn).await {
        eprintln!("  (could not drop database {name}: {e})");
    }
}

/// The server's version and durability settings, for the header.
async fn describe(server: &str) -> String {
    use sqlx::Connection as _;
    let mut conn = sqlx::PgConnection::connect(server).await.unwrap();
    let mut values = Vec::new();
    for setting in ["server_version", "fsync", "synchronous_commit"] {
        let sql = sqlx::AssertSqlSafe(format!("SHOW {setting}"));
        values.push(sqlx::query_scalar::<_, String>(sql).fetch_one(&mut conn).await.unwrap());
    }
    let version = values[0].split_whitespace().next().unwrap_or("");
    format!("PostgreSQL {version} (fsync {}, synchronous_commit {})", values[1], values[2])
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(2)).build().unwrap()
}

/// `GET /api/v1/status`, when the replica answers.
async fn status(client: &reqwest::Client, p: &Process) -> Option<Value> {
    client.get(format!("http://{}/api/v1/status", p.addr)).send().await.ok()?.json().await.ok()
}

fn role(status: &Value) -> &str {
    status["leader"]["role"].as_str().unwrap_or("")
}

/// Leading (or the single instance) and ready as far as the watch goes: what `/readyz` checks of
/// the watch, without its database write probe (which would take turns from the writer being
/// measured). On a fresh database that is once its first lists are stored; on a takeover, at once
/// (it serves the last leader's lists while it lists).
fn leads_ready(status: &Value) -> bool {
    matches!(role(status), "leader" | "single") && status["not_ready"].is_null()
}

/// Asks `p` for its status every [`POLL`] until `done` holds (at most 120 s); returns that status.
async fn wait_status(client: &reqwest::Client, p: &Process, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let (start, mut next) = (Instant::now(), Instant::now());
    loop {
        if let Some(s) = status(client, p).await
            && done(&s)
        {
            return s;
        }
        assert!(start.elapsed() < Duration::from_secs(120), "{} never {what}", p.addr);
        next += POLL;
        tokio::time::sleep_until(next.into()).await; // ok: benchmark polling, not a test
    }
}

/// Up to `max`, at random: so a kill or a start falls anywhere in the lease's renewal cycle.
async fn random_pause(max: Duration) {
    tokio::time::sleep(max.mul_f64(rand::random::<f64>())).await;
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// One backend's figures.
struct Figures {
    ready: Duration,
    synced: Duration,
    ingest: f64,
    deliveries: f64,
    steady: Vec<f64>,
    burst: Vec<f64>,
    /// API read latencies (ms) during the steady load and the burst, sorted.
    reads: Vec<f64>,
    peak_rss: f64,
}

/// The burst's shape, as the `burst` benchmark's: changes, over how many Services, at what pace.
const BURST_CHANGES: usize = 20_000;
const BURST_SERVICES: usize = 1_000;
const BURST_RATE: f64 = 7_000.0;
/// How often the reader asks for a Service during the steady load and the burst.
const READ_EVERY: Duration = Duration::from_millis(10);

/// `GET /api/v1/services/bench/<name>` of one Service after another on `addr`, every
/// [`READ_EVERY`], until `stop`: each read's latency in ms (a read that fails counts as its time
/// to fail, and is reported).
async fn reads(addr: String, services: usize, stop: Arc<AtomicBool>) -> Vec<f64> {
    let client = client();
    let mut got = Vec::new();
    let mut next = Instant::now();
    let mut n = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let i = (n * 7919) % services;
        n += 1;
        let start = Instant::now();
        let url = format!("http://{addr}/api/v1/services/bench/{}", load::name(i));
        match client.get(url).send().await.and_then(reqwest::Response::error_for_status) {
            Ok(r) => drop(r.bytes().await),
            Err(e) => eprintln!("  (a read failed: {e})"),
        }
        got.push(start.elapsed().as_secs_f64() * 1e3);
        next += READ_EVERY;
        tokio::time::sleep_until(next.into()).await; // ok: benchmark pacing, not a test
    }
    got
}

/// The workload on the database `store` says (`[database]` body `database` for vipwatch). With a
/// `follower` (the `[database]` body of a second replica on the same database), that replica is
/// started before the steady load and answers the reads; else the one instance does.
async fn workload(
    dir: &Path,
    file: &str,
    database: &str,
    follower: Option<&str>,
    store: &DatabaseConfig,
    args: &Args,
) -> Figures {
    let services = args.services;
    let history_limit = 3 * services + 2 * args.rate * args.seconds + 2 * BURST_CHANGES;
    let api = FakeApiServer::start_with(FakeApiServerOptions { history_limit, ..Default::default() }).await.unwrap();
    api.seed((0..services).map(load::service));
    let seen = Seen::default();
    let hook = load::receiver(seen.clone()).await;
    let client = client();

    let start = Instant::now();
    let vw = Process::vipwatch(&load::config(dir, file, &api.url(), &hook, true, database));
    wait_status(&client, &vw, "led with its lists stored", leads_ready).await;
    let ready = start.elapsed();
    wait_until("every Service's ADDED delivered", Duration::from_millis(5), || seen.names() >= services).await;
    let synced = start.elapsed();

    let reader = Store::connect(store).await.expect("the benchmark opens the database too");
    let (last, count) = (reader.max_event_id().await.unwrap(), reader.event_count().await.unwrap());
    let start = Instant::now();
    let written: Vec<(String, u64, Instant)> = (0..services)
        .map(|i| {
            api.update("bench", &load::name(i), |o| o["metadata"]["labels"]["rev"] = json!("1"));
            (load::name(i), 1, Instant::now())
        })
        .collect();
    let wrote = start.elapsed();
    // The id first (the newest row, at once); the count (which costs a scan) only once that is there.
    while reader.max_event_id().await.unwrap() < last + services as i64
        || reader.event_count().await.unwrap() < count + services as i64
    {
        tokio::time::sleep(Duration::from_millis(5)).await; // ok: benchmark polling, not a test
    }
    let ingested = start.elapsed();
    reader.close().await;
    load::settle(&seen, &written).await;
    let delivered = seen.last_arrival(&written).unwrap().duration_since(start);

    let follower_reads = follower.is_some();
    let follower = follower
        .map(|body| Process::vipwatch(&load::config(dir, &format!("{file}-follower"), &api.url(), &hook, true, body)));
    if let Some(p) = &follower {
        wait_status(&client, p, "a follower", |s| role(s) == "follower").await;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let addr = follower.as_ref().map_or(vw.addr.clone(), |p| p.addr.clone());
    let reader = tokio::spawn(reads(addr, services, stop.clone()));
    let written = load::steady(&api, services, args.rate, args.seconds, 2).await;
    let steady = load::settle(&seen, &written).await;
    let first_rev = 3 + (args.rate * args.seconds) as u64;
    let written = load::burst(&api, BURST_SERVICES.min(services), BURST_CHANGES, first_rev, Some(BURST_RATE)).await;
    let burst = load::settle(&seen, &written).await;
    stop.store(true, Ordering::Relaxed);
    let mut reads = reader.await.unwrap();
    reads.sort_by(f64::total_cmp);
    let peak_rss = vw.peak_rss_mib();
    vw.stop();
    if let Some(p) = follower {
        p.stop();
    }
    let figures = Figures {
        ready,
        synced,
        ingest: services as f64 / secs(ingested),
        deliveries: services as f64 / secs(delivered),
        steady,
        burst,
        reads,
        peak_rss,
    };
    println!(
        "  {file}: ready {:.2} s, all ADDED delivered {:.2} s; {services} changes written in {:.2} s, stored {:.2} s, \
         delivered {:.2} s; steady p50 {:.1} ms p99 {:.1} ms; burst p99 {:.0} ms; reads ({}) p99 {:.1} ms; \
         peak RSS {:.1} MiB",
        secs(figures.ready),
        secs(figures.synced),
        secs(wrote),
        secs(ingested),
        secs(delivered),
        pct(&figures.steady, 0.5),
        pct(&figures.steady, 0.99),
        pct(&figures.burst, 0.99),
        if follower_reads { "follower" } else { "the instance" },
        pct(&figures.reads, 0.99),
        figures.peak_rss
    );
    figures
}

/// The lease settings of the takeover part.
struct Lease {
    ttl: Duration,
    renew: Duration,
    /// Whether they are the production defaults (then the config leaves them out).
    defaults: bool,
}

/// `vipwatch serve` replica `name` on the PostgreSQL database `url`.
fn replica(dir: &Path, name: &str, api: &FakeApiServer, hook: &str, url: &str, lease: &Lease) -> Process {
    let mut database = format!("url = \"{url}\"\nreplica = \"{name}\"");
    if !lease.defaults {
        let (ttl, renew) = (humantime::format_duration(lease.ttl), humantime::format_duration(lease.renew));
        database.push_str(&format!("\nleader_ttl = \"{ttl}\"\nleader_renew = \"{renew}\""));
    }
    Process::vipwatch(&load::config(dir, name, &api.url(), hook, true, &database))
}

/// The takeover part's figures, in seconds.
#[derive(Default)]
struct Handovers {
    kill_leads: Vec<f64>,
    kill_ready: Vec<f64>,
    term_leads: Vec<f64>,
    term_ready: Vec<f64>,
    term_exit: Vec<f64>,
    leader_rss: f64,
    follower_rss: f64,
}

async fn takeovers(server: &str, lease: &Lease, kills: usize, terms: usize) -> Handovers {
    let (db, url) = create_database(server).await;
    let api = FakeApiServer::start().await.unwrap();
    api.seed((0..HA_SERVICES).map(load::service));
    let seen = Seen::default();
    let hook = load::receiver(seen.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let client = client();
    let names = ["a", "b"];
    let mut replicas = [
        replica(dir.path(), names[0], &api, &hook, &url, lease),
        replica(dir.path(), names[1], &api, &hook, &url, lease),
    ];
    // The first leader: whichever won; the other must follow.
    let first = loop {
        let (a, b) = (status(&client, &replicas[0]).await, status(&client, &replicas[1]).await);
        match (a.as_ref().map(role), b.as_ref().map(role)) {
            (Some("leader"), Some("follower")) => break 0,
            (Some("follower"), Some("leader")) => break 1,
            _ => tokio::time::sleep(POLL).await, // ok: benchmark polling, not a test
        }
    };
    wait_status(&client, &replicas[first], "led with its lists stored", leads_ready).await;
    wait_until("every Service's ADDED delivered", POLL, || seen.names() >= HA_SERVICES).await;
    let mut h = Handovers::default();
    let mut leader_at = first;
    for round in 0..kills + terms {
        let kill = round < kills;
        let (l, f) = (leader_at, 1 - leader_at);
        if kill {
            random_pause(lease.renew).await;
        }
        h.leader_rss = h.leader_rss.max(replicas[l].peak_rss_mib());
        h.follower_rss = h.follower_rss.max(replicas[f].peak_rss_mib());
        let epoch = status(&client, &replicas[l]).await.and_then(|s| s["leader"]["epoch"].as_i64()).unwrap_or(0);
        let asked = Instant::now();
        replicas[l].signal(if kill { libc::SIGKILL } else { libc::SIGTERM });
        let (mut leads, mut exited, mut next) = (None, None, asked);
        let took = loop {
            if exited.is_none()
                && let Some(code) = replicas[l].child.try_wait().unwrap()
            {
                exited = Some((code, secs(asked.elapsed())));
            }
            if let Some(s) = status(&client, &replicas[f]).await
                && role(&s) == "leader"
            {
                leads.get_or_insert_with(|| secs(asked.elapsed()));
                if leads_ready(&s) {
                    break s;
                }
            }
            assert!(asked.elapsed() < Duration::from_secs(120), "{} never took over", names[f]);
            next += POLL;
            tokio::time::sleep_until(next.into()).await; // ok: benchmark polling, not a test
        };
        let (leads, ready) = (leads.unwrap(), secs(asked.elapsed()));
        assert_eq!(took["leader"]["holder"].as_str(), Some(names[f]), "the survivor holds the lease: {took}");
        assert!(took["leader"]["epoch"].as_i64().unwrap_or(0) > epoch, "a new epoch: {took}");
        let (exited, exit) = match exited {
            Some(e) => e,
            None => (replicas[l].child.wait().unwrap(), secs(asked.elapsed())),
        };
        let how = if kill { "SIGKILL" } else { "SIGTERM" };
        if kill {
            h.kill_leads.push(leads);
            h.kill_ready.push(ready);
        } else {
            assert!(exited.success(), "a SIGTERM stops cleanly: {exited}");
            h.term_leads.push(leads);
            h.term_ready.push(ready);
            h.term_exit.push(exit);
        }
        println!(
            "  {how} {} (round {}): {} leads after {leads:.3} s, ready after {ready:.3} s",
            names[l],
            round + 1,
            names[f]
        );
        if round + 1 < kills {
            // The restarted follower bids on its own schedule: at any point of the leader's.
            random_pause(lease.renew).await;
        }
        replicas[l] = replica(dir.path(), names[l], &api, &hook, &url, lease);
        wait_status(&client, &replicas[l], "followed", |s| role(s) == "follower").await;
        leader_at = f;
    }
    for (i, r) in replicas.into_iter().enumerate() {
        if i == leader_at {
            h.leader_rss = h.leader_rss.max(r.peak_rss_mib());
        } else {
            h.follower_rss = h.follower_rss.max(r.peak_rss_mib());
        }
        r.stop();
    }
    drop_database(server, &db).await;
    h
}

struct Args {
    services: usize,
    rate: usize,
    seconds: usize,
    kills: usize,
    terms: usize,
    lease: Lease,
}

fn args() -> Args {
    let all: Vec<String> = std::env::args().skip(1).collect();
    let n: Vec<usize> = all.iter().filter_map(|a| a.parse().ok()).collect();
    let arg = |i: usize, default: usize| n.get(i).copied().unwrap_or(default);
    let flag = |name: &str| {
        all.iter()
            .find_map(|a| a.strip_prefix(name))
            .map(|v| humantime::parse_duration(v).expect("a duration, e.g. 3s"))
    };
    let defaults = DatabaseConfig::default();
    let (ttl, renew) = (flag("--leader-ttl="), flag("--leader-renew="));
    let lease = Lease {
        defaults: ttl.is_none() && renew.is_none(),
        ttl: ttl.unwrap_or(defaults.leader_ttl),
        renew: renew.unwrap_or(defaults.leader_renew),
    };
    Args {
        services: arg(0, 10_000),
        rate: arg(1, 500),
        seconds: arg(2, 10),
        kills: arg(3, 10),
        terms: arg(4, 5),
        lease,
    }
}

/// Prints a workload row and records PostgreSQL's figure (`PostgreSQL: {name}`) next to SQLite's.
fn row(results: &mut Results, what: &str, (name, unit): (&str, &str), base: f64, pg: f64, digits: usize) {
    println!("  {what:<40} {base:>12.digits$} {pg:>12.digits$} {:>8.2}", pg / base);
    results.compare(&format!("PostgreSQL: {name}"), pg, unit, &format!("SQLite: {name}"), base);
}

/// Prints a takeover row and records its p50 / p99 / max (`{name} p50` ...) next to the lease TTL.
fn spread(results: &mut Results, what: &str, name: &str, sorted: &[f64], ttl: f64) {
    let (p50, p99, max) = (pct(sorted, 0.5), pct(sorted, 0.99), sorted.last().copied().unwrap_or(f64::NAN));
    println!("  {what:<40} {:>3} {p50:>8.3} {p99:>8.3} {max:>8.3} {:>9.3} {:>9.3}", sorted.len(), p50 / ttl, max / ttl);
    for (q, v) in [("p50", p50), ("p99", p99), ("max", max)] {
        results.compare(&format!("{name} {q}"), v, "s", "leader_ttl", ttl);
    }
}

#[tokio::main]
async fn main() {
    let server = pg_server();
    vipwatch::relay::sender::install_crypto_provider();
    let args = args();
    let begun = Instant::now();
    let mut results = Results::new("store_backends");
    results.param("services", args.services);
    results.param("rate", args.rate);
    results.param("seconds", args.seconds);
    results.param("kills", args.kills);
    results.param("terms", args.terms);
    results.param("leader_ttl_s", secs(args.lease.ttl));
    results.param("leader_renew_s", secs(args.lease.renew));
    results.param("takeover_services", HA_SERVICES);
    let pg = describe(&server).await;
    results.param("postgresql", pg.as_str());
    println!(
        "store_backends: {} Services, {} changes/s for {} s; one signed endpoint (loopback receiver, 204 at once); {pg}",
        args.services, args.rate, args.seconds
    );

    let dir = tempfile::tempdir().unwrap();
    let sqlite_path = dir.path().join("vipwatch.db");
    let sqlite_config = DatabaseConfig { path: sqlite_path.clone(), ..Default::default() };
    let sqlite_body = format!("path = \"{}\"", sqlite_path.display());
    let sqlite = workload(dir.path(), "sqlite", &sqlite_body, None, &sqlite_config, &args).await;
    let (db, url) = create_database(&server).await;
    let pg_config = DatabaseConfig { url: Some(Secret::new(url.clone())), ..Default::default() };
    let (leader, follower) =
        (format!("url = \"{url}\"\nreplica = \"bench\""), format!("url = \"{url}\"\nreplica = \"reader\""));
    let postgres = workload(dir.path(), "postgres", &leader, Some(&follower), &pg_config, &args).await;
    drop_database(&server, &db).await;

    let lease = &args.lease;
    let (ttl, renew) = (humantime::format_duration(lease.ttl), humantime::format_duration(lease.renew));
    println!(
        "takeover: 2 replicas, {HA_SERVICES} Services, leader_ttl {ttl}, leader_renew {renew}{}",
        if lease.defaults { " (the defaults)" } else { "" }
    );
    let mut h = takeovers(&server, lease, args.kills, args.terms).await;
    for v in [&mut h.kill_leads, &mut h.kill_ready, &mut h.term_leads, &mut h.term_ready, &mut h.term_exit] {
        v.sort_by(f64::total_cmp);
    }

    println!();
    println!("store_backends ({:.0} s in all)", secs(begun.elapsed()));
    println!("  {:<40} {:>12} {:>12} {:>8}", "workload", "SQLite", "PostgreSQL", "ratio");
    let r = &mut results;
    row(r, "sync: start → ready (s)", ("initial sync: ready", "s"), secs(sqlite.ready), secs(postgres.ready), 2);
    let delivered = ("initial sync: all ADDED delivered", "s");
    row(r, "sync: start → all ADDED delivered (s)", delivered, secs(sqlite.synced), secs(postgres.synced), 2);
    row(r, "ingest (events/s)", ("ingest", "events/s"), sqlite.ingest, postgres.ingest, 0);
    row(r, "deliveries (/s)", ("deliveries", "/s"), sqlite.deliveries, postgres.deliveries, 0);
    let rate = format!("steady {}/s", args.rate);
    let (s50, p50) = (pct(&sqlite.steady, 0.5), pct(&postgres.steady, 0.5));
    row(r, &format!("{rate}: write → delivery p50 (ms)"), ("steady: latency p50", "ms"), s50, p50, 1);
    let (s99, p99) = (pct(&sqlite.steady, 0.99), pct(&postgres.steady, 0.99));
    row(r, &format!("{rate}: write → delivery p99 (ms)"), ("steady: latency p99", "ms"), s99, p99, 1);
    let burst = format!("burst {BURST_CHANGES} over {BURST_SERVICES} at {BURST_RATE}/s");
    let (s99, p99) = (pct(&sqlite.burst, 0.99), pct(&postgres.burst, 0.99));
    row(r, &format!("{burst}: p99 (ms)"), ("burst: write → delivery p99", "ms"), s99, p99, 0);
    let reads = "API read, SQLite: the instance; PostgreSQL: a follower";
    println!("  {reads} (GET /api/v1/services/bench/<name> every 10 ms through the steady load and the burst):");
    let (s50, p50) = (pct(&sqlite.reads, 0.5), pct(&postgres.reads, 0.5));
    row(r, "  read latency p50 (ms)", ("API read latency p50", "ms"), s50, p50, 2);
    let (s99, p99) = (pct(&sqlite.reads, 0.99), pct(&postgres.reads, 0.99));
    row(r, "  read latency p99 (ms)", ("API read latency p99", "ms"), s99, p99, 2);
    row(r, "peak RSS (MiB)", ("peak RSS", "MiB"), sqlite.peak_rss, postgres.peak_rss, 1);
    let ttl_s = secs(lease.ttl);
    println!(
        "  {:<40} {:>3} {:>8} {:>8} {:>8} {:>9} {:>9}",
        format!("takeover, TTL {ttl} (s)"),
        "n",
        "p50",
        "p99",
        "max",
        "p50/TTL",
        "max/TTL"
    );
    spread(r, "SIGKILL → the other leads", "takeover: SIGKILL → the other leads", &h.kill_leads, ttl_s);
    spread(r, "SIGKILL → the other ready", "takeover: SIGKILL → the other ready", &h.kill_ready, ttl_s);
    spread(r, "SIGTERM → the other leads", "takeover: SIGTERM → the other leads", &h.term_leads, ttl_s);
    spread(r, "SIGTERM → the other ready", "takeover: SIGTERM → the other ready", &h.term_ready, ttl_s);
    spread(r, "SIGTERM → the old leader exited", "takeover: SIGTERM → the old leader exited", &h.term_exit, ttl_s);
    let (lo, hi) = (lease.ttl.saturating_sub(lease.renew), lease.ttl + lease.renew);
    println!(
        "  bound after SIGKILL: the lease expires TTL after the last renewal (every {renew}), the follower bids every {renew}: \
         {} to {} (+ the {} ms poll)",
        humantime::format_duration(lo),
        humantime::format_duration(hi),
        POLL.as_millis()
    );
    if !lease.defaults {
        let d = DatabaseConfig::default();
        println!(
            "  with the defaults (leader_ttl {}, leader_renew {}): {} to {}",
            humantime::format_duration(d.leader_ttl),
            humantime::format_duration(d.leader_renew),
            humantime::format_duration(d.leader_ttl - d.leader_renew),
            humantime::format_duration(d.leader_ttl + d.leader_renew)
        );
    }
    println!("  peak RSS of the replicas: leader {:.1} MiB, follower {:.1} MiB", h.leader_rss, h.follower_rss);
    results.figure("takeover: peak RSS of the leader", h.leader_rss, "MiB");
    results.compare("takeover: peak RSS of the follower", h.follower_rss, "MiB", "the leader", h.leader_rss);
    results.write();
}
