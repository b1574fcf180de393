//! Failover of a pair of load-balancer hosts built from the shipped files, as `tests/lb_pair.rs`
//! builds it (network namespaces, `tests/common/lb_topology.rs`): vipwatch (in-process, with the
//! simulated apiserver) delivers SERVICES Services to both hosts' agents, and a client in its own
//! namespace asks the first VIP every 20 ms over a new connection.
//!
//! Then, REPEATS times each, the host holding the VIPs is lost:
//! - **agent killed** (SIGKILL): keepalived's track script (`/healthz`) fails and it gives up the VIPs;
//! - **link down** (`ip link set eth0 down` in the host's namespace): its VRRP adverts stop and the
//!   other host takes over after the master-down interval;
//! - baseline, **keepalived stopped** (SIGTERM): it hands the VIPs over at once with a priority-0
//!   advert, the fastest hand-over the pair has.
//!
//! Each figure is the time from the loss to the client's first answer from the other host (once the
//! VIP is there), p50 and p99 over the repeats, with the requests that failed meanwhile, next to the baseline's. After each loss the host
//! comes back (the agent restarted, the link up, keepalived started) and the pair settles (one host
//! holds every VIP, the other is BACKUP) before the next. Peak RSS (VmHWM) of each agent and of this
//! process.
//!
//! Then the standby's agent restarts (its state kept): it is not caught up until vipwatch notices and
//! resyncs it; the time from its start to `/healthz` 200 (SERVICES Services resynced and live), next
//! to the time vipwatch's first start took to get every Service's status written (both agents
//! acknowledged).
//!
//! Last, a down standby does not slow the active host: min(SERVICES, 20) label changes, the time
//! until the active host's agent acknowledged every one, with the standby's link down (its attempts
//! time out) next to the same with both hosts up.
//!
//! Run: `cargo bench --bench failover` (args: REPEATS SERVICES, default 10 50, at most 130). Needs root, `ip`,
//! `keepalived`, `haproxy` and `curl`; the workspace's `vipwatch-haproxy` must be built
//! (`cargo build -p vipwatch-haproxy`).

mod common;
#[path = "../tests/common/lb_topology.rs"]
mod topology;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use common::peak_rss_mib;
use common::results::Results;
use serde_json::json;
use topology::{Client, Host, Net, other, request};
use vipwatch::config::{Config, WebhookConfig};
use vipwatch::fake_apiserver::{FakeApiServer, Resource};
use vipwatch::store::{DeliveryFilter, Store};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const POD_PORT: u16 = 8080;

/// How a host is lost, and how it comes back.
#[derive(Clone, Copy)]
enum Loss {
    KeepalivedStopped,
    AgentKilled,
    LinkDown,
}

impl Loss {
    fn name(self) -> &'static str {
        match self {
            Self::KeepalivedStopped => "keepalived stopped",
            Self::AgentKilled => "agent killed",
            Self::LinkDown => "link down",
        }
    }
}

struct Bench {
    net: Net,
    hosts: Vec<Host>,
    vip: Ipv4Addr,
}

impl Bench {
    fn host(&mut self, name: &str) -> &mut Host {
        self.hosts.iter_mut().find(|h| h.name == name).unwrap()
    }

    /// The host that holds the VIP, once the pair has settled: one host holds it, the other's
    /// keepalived last entered BACKUP, and the VIP answers from the client's namespace.
    async fn settled(&self) -> &'static str {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if let Some(holder) = self.net.holder(self.vip) {
                let standby = self.hosts.iter().find(|h| h.name == other(holder)).unwrap();
                let log = standby.log("keepalived.log");
                let last = log.lines().rev().find(|l| l.contains("Entering") && l.contains("STATE"));
                let ns = self.net.ns("cl");
                let vip = self.vip;
                let answered = tokio::task::spawn_blocking(move || {
                    topology::in_namespace(&ns, || request(SocketAddr::from((vip, 80))))
                })
                .await
                .unwrap()
                .is_some_and(|b| b.contains("hello from pod"));
                if answered && last.is_some_and(|l| l.contains("BACKUP")) {
                    return holder;
                }
            }
            assert!(Instant::now() < deadline, "the pair did not settle within 90 s");
            tokio::time::sleep(Duration::from_millis(100)).await; // ok: polling the pair's state
        }
    }

    /// Loses `host` as `loss` says.
    fn lose(&mut self, host: &str, loss: Loss) {
        match loss {
            Loss::KeepalivedStopped => {
                let k = self.host(host).keepalived.take().unwrap();
                // SAFETY: kill(2) on a child's pid with a plain signal.
                unsafe { libc::kill(k.id() as i32, libc::SIGTERM) };
                let mut k = k;
                k.wait().unwrap();
            }
            Loss::AgentKilled => self.host(host).kill_agent(),
            Loss::LinkDown => self.net.link(host, false),
        }
    }

    /// Brings `host` back after `loss`.
    fn restore(&mut self, host: &str, loss: Loss) {
        match loss {
            Loss::KeepalivedStopped => self.host(host).start_keepalived(),
            Loss::AgentKilled => self.host(host).start_agent(),
            Loss::LinkDown => self.net.link(host, true),
        }
    }
}

/// Starts the pod, the apiserver with SERVICES Services, vipwatch and the pair; waits until the
/// first VIP answers.
async fn setup(services: usize) -> (Bench, FakeApiServer, vipwatch::app::Running, tempfile::TempDir, Duration) {
    let net = Net::build();
    let root = tempfile::tempdir().unwrap();
    let vips: Vec<Ipv4Addr> = (120..120 + services as u8).map(|last| net.ip(last)).collect();
    let mut hosts =
        vec![Host::new(&net, root.path(), "lb1", &vips, SECRET), Host::new(&net, root.path(), "lb2", &vips, SECRET)];
    for host in &mut hosts {
        host.start_agent();
        host.start_keepalived();
    }
    let pod = net.ip(51);
    let listener = tokio::net::TcpListener::bind((pod, POD_PORT)).await.expect("the Pod's address");
    let app = axum::Router::new().fallback(axum::routing::get(|| async { "hello from pod\n" }));
    tokio::spawn(async move { axum::serve(listener, app).await });

    let api = FakeApiServer::start().await.unwrap();
    for i in 0..services {
        let name = format!("web-{i}");
        api.apply(json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": "bench", "annotations": {"vipwatch.io/backend-mode": "pod"}},
            "spec": {"type": "LoadBalancer", "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}}));
        api.apply_resource(
            Resource::EndpointSlices,
            json!({"apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice", "metadata": {"name": format!("{name}-1"), "namespace": "bench",
            "labels": {"kubernetes.io/service-name": name}}, "addressType": "IPv4",
            "ports": [{"name": "http", "protocol": "TCP", "port": POD_PORT}],
            "endpoints": [{"addresses": [pod.to_string()], "conditions": {"ready": true}}]}),
        );
    }
    let mut config = Config::default();
    config.kubernetes.url = Some(api.url().parse().unwrap());
    config.database.path = root.path().join("vipwatch.db");
    let pool = format!("name = \"pair\"\naddresses = [\"{}-{}\"]", vips[0], vips[services - 1]);
    config.pools = vec![toml::from_str(&pool).unwrap()];
    config.webhooks = ["lb1", "lb2"]
        .iter()
        .zip([11, 12])
        .map(|(name, last)| {
            let url = format!("http://{}:9080/hooks/vipwatch", net.ip(last));
            let toml = format!("name = \"{name}\"\nurl = \"{url}\"\nsecret = \"{SECRET}\"\nappliance = \"pair\"\n");
            toml::from_str::<WebhookConfig>(&toml).unwrap()
        })
        .collect();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let started = Instant::now();
    let vw = vipwatch::app::start(config, listener).await.expect("vipwatch starts");
    let bench = Bench { net, hosts, vip: vips[0] };
    let deadline = Instant::now() + Duration::from_secs(120);
    while api
        .get("bench", &format!("web-{}", services - 1))
        .and_then(|s| s.pointer("/status/loadBalancer/ingress/0/ip").cloned())
        .is_none()
    {
        assert!(Instant::now() < deadline, "every Service's status within 120 s");
        tokio::time::sleep(Duration::from_millis(100)).await; // ok: polling the statuses
    }
    let first_sync = started.elapsed();
    (bench, api, vw, root, first_sync)
}

/// The newest delivery to `webhook` of Service `bench/name`: its id and state.
async fn newest(store: &Store, webhook: &str, name: &str) -> Option<(i64, String)> {
    let filter = DeliveryFilter { webhook: Some(webhook.into()), name: Some(name.into()), ..Default::default() };
    let rows = store.deliveries(&filter).await.unwrap();
    rows.last().map(|d| (d.id, d.state.clone()))
}

/// Changes a label on the first `n` Services (`round` as its value) and returns the time until
/// `webhook` acknowledged each change (ms).
async fn changes_acknowledged(api: &FakeApiServer, store: &Store, webhook: &str, n: usize, round: u32) -> f64 {
    let mut before = Vec::new();
    for i in 0..n {
        before.push(newest(store, webhook, &format!("web-{i}")).await.map_or(0, |(id, _)| id));
    }
    let started = Instant::now();
    for i in 0..n {
        let mut svc = api.get("bench", &format!("web-{i}")).expect("the Service");
        svc["metadata"]["labels"] = json!({ "round": round.to_string() });
        api.apply(svc);
    }
    let deadline = started + Duration::from_secs(60);
    for (i, before) in before.iter().enumerate() {
        loop {
            match newest(store, webhook, &format!("web-{i}")).await {
                Some((id, state)) if id > *before && state == "succeeded" => break,
                _ => {}
            }
            assert!(Instant::now() < deadline, "web-{i}'s change acknowledged by {webhook} within 60 s");
            tokio::time::sleep(Duration::from_millis(10)).await; // ok: polling the delivery log
        }
    }
    started.elapsed().as_secs_f64() * 1e3
}

/// The `p` quantile of `values` (sorted here).
fn quantile(values: &[f64], p: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    common::pct(&sorted, p)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let repeats: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(10);
    let services: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(50).clamp(1, 130);
    if let Some(why) = topology::missing_prerequisite() {
        eprintln!("failover benchmark cannot run: {why}");
        std::process::exit(2);
    }
    let mut results = Results::new("failover");
    results.param("repeats", repeats as u64);
    results.param("services", services as u64);
    let rss_before = peak_rss_mib(std::process::id());
    let (mut bench, api, vw, _root, first_sync) = setup(services).await;
    println!("first start: every status written after {:.0} ms", first_sync.as_secs_f64() * 1e3);

    let mut figures: Vec<(Loss, Vec<f64>, Vec<f64>)> = Vec::new();
    for loss in [Loss::KeepalivedStopped, Loss::AgentKilled, Loss::LinkDown] {
        let (mut times, mut failed) = (Vec::new(), Vec::new());
        for _ in 0..repeats {
            let active = bench.settled().await;
            let client = Client::start(&bench.net.ns("cl"), SocketAddr::from((bench.vip, 80)));
            let deadline = Instant::now() + Duration::from_secs(10);
            while !client.seen().iter().any(|(_, ok)| *ok) {
                assert!(Instant::now() < deadline, "the client's first answer");
                tokio::time::sleep(Duration::from_millis(10)).await; // ok: polling the client's record
            }
            let lost = Instant::now();
            bench.lose(active, loss);
            let standby = other(active);
            let deadline = lost + Duration::from_secs(60);
            // The VIP on the other host, then the first answer after that: an answer from it.
            while bench.net.holders(bench.vip) != [standby] {
                assert!(Instant::now() < deadline, "{}: the VIP not on {standby} within 60 s", loss.name());
                tokio::time::sleep(Duration::from_millis(10)).await; // ok: polling the VIP's holder
            }
            let moved = Instant::now();
            let (back, n) = loop {
                let seen = client.seen();
                if let Some((at, _)) = seen.iter().find(|(at, ok)| *ok && *at > moved) {
                    let failed = seen.iter().filter(|(t, ok)| !ok && *t >= lost && t <= at).count();
                    break (*at - lost, failed);
                }
                assert!(Instant::now() < deadline, "{}: no answer within 60 s", loss.name());
                tokio::time::sleep(Duration::from_millis(10)).await; // ok: polling the client's record
            };
            println!("{:<20}: answered after {:>7.0} ms, {n} failed requests", loss.name(), back.as_secs_f64() * 1e3);
            times.push(back.as_secs_f64() * 1e3);
            failed.push(n as f64);
            drop(client);
            bench.restore(active, loss);
        }
        figures.push((loss, times, failed));
    }
    let (_, base_times, base_failed) = &figures[0];
    let (b50, b99, bf) = (quantile(base_times, 0.5), quantile(base_times, 0.99), quantile(base_failed, 0.99));
    results.figure("keepalived stopped: first answer p50", b50, "ms");
    results.figure("keepalived stopped: first answer p99", b99, "ms");
    for (loss, times, failed) in &figures[1..] {
        let name = loss.name();
        let (p50, p99) = (quantile(times, 0.5), quantile(times, 0.99));
        println!(
            "{name:<20}: first answer p50 {p50:.0} ms, p99 {p99:.0} ms; failed requests p99 {}",
            quantile(failed, 0.99)
        );
        results.compare(&format!("{name}: first answer p50"), p50, "ms", "keepalived stopped p50", b50);
        results.compare(&format!("{name}: first answer p99"), p99, "ms", "keepalived stopped p99", b99);
        let f99 = quantile(failed, 0.99);
        results.compare(&format!("{name}: failed requests p99"), f99, "", "keepalived stopped", bf);
    }
    // A returning host: the standby's agent restarts and is caught up once vipwatch has resynced it.
    let active = bench.settled().await;
    let standby = other(active);
    bench.host(standby).kill_agent();
    let restarted = Instant::now();
    bench.host(standby).start_agent();
    let host = bench.hosts.iter().find(|h| h.name == standby).unwrap();
    let deadline = restarted + Duration::from_secs(120);
    while host.healthz(&bench.net).await != Some(200) {
        assert!(Instant::now() < deadline, "the restarted agent caught up within 120 s");
        tokio::time::sleep(Duration::from_millis(20)).await; // ok: polling /healthz
    }
    let caught_up = restarted.elapsed().as_secs_f64() * 1e3;
    println!("restarted agent caught up on {services} Services after {caught_up:.0} ms");
    let base = first_sync.as_secs_f64() * 1e3;
    results.compare("returning host: caught up", caught_up, "ms", "first start: every status written", base);
    for host in &bench.hosts {
        if let Some(agent) = &host.agent {
            let rss = peak_rss_mib(agent.id());
            results.compare(
                &format!("peak RSS of {}'s agent", host.name),
                rss,
                "MiB",
                "this process before",
                rss_before,
            );
        }
    }
    // A down standby does not slow the active host.
    let active = bench.settled().await;
    let standby = other(active);
    let n = services.min(20);
    let both_up = changes_acknowledged(&api, &vw.store, active, n, 1).await;
    bench.lose(standby, Loss::LinkDown);
    let standby_down = changes_acknowledged(&api, &vw.store, active, n, 2).await;
    bench.restore(standby, Loss::LinkDown);
    println!(
        "{n} changes acknowledged by the active host: {standby_down:.0} ms with the standby's link down, \
         {both_up:.0} ms with both up"
    );
    results.compare(
        "standby link down: changes acknowledged by the active host",
        standby_down,
        "ms",
        "both hosts up",
        both_up,
    );
    common::report_own_peak_rss(rss_before, &mut results);
    vw.stop().await.unwrap();
    results.write();
}
