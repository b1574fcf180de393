//! A pair of load-balancer hosts, built from the shipped files: two network namespaces (`lb1`, `lb2`),
//! each running keepalived with `deploy/haproxy-agent/keepalived.conf`, `vipwatch-haproxy` as its
//! systemd unit starts it with `vipwatch-haproxy.toml`, and the HAProxy the agent runs; the sysctl file
//! applied in each. A client namespace (`cl`) makes requests to the VIPs; the test's own namespace
//! holds vipwatch, the simulated apiserver and the Pods (HTTP servers), all on one bridge (in a `sw`
//! namespace). Only addresses and paths differ from the shipped files.
//!
//! ```text
//!        198.18.S.0/24 bridge (ns sw)
//!   ┌─────────┬──────────┬──────────┬────────────────────────┐
//!  cl .100   lb1 .11    lb2 .12    test ns .1 (vipwatch, apiserver, Pods .51)
//!            VIPs .200-.203 on whichever host keepalived makes MASTER
//! ```
//!
//! Needs root, `ip`, `keepalived`, `haproxy` and `curl` (the shipped track script's).

mod common;
#[path = "common/lb_topology.rs"]
mod topology;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use tempfile::TempDir;
use topology::{Client, Host, Net, in_namespace, other, recovery, request};
use vipwatch::app::Running;
use vipwatch::config::Config;
use vipwatch::fake_apiserver::Resource;
use vipwatch::model::backends::{MODE_ANNOTATION, ModeSetting, SERVICE_NAME_LABEL};
use vipwatch::store::DeliveryFilter;

/// Whether the pair can run here: root and the programs it runs, under the suite's one policy for
/// what is missing ([`require_tool`]: skipped locally, a failure under CI).
fn can_run() -> bool {
    require_root().is_some() && ["ip", "keepalived", "haproxy", "curl"].iter().all(|t| require_tool(t).is_some())
}

/// The pair with vipwatch delivering to both agents.
struct Pair {
    net: Net,
    _root: TempDir,
    hosts: Vec<Host>,
    h: Harness,
    vw: Option<Running>,
    config: Config,
    pod: SocketAddr,
}

impl Pair {
    async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    /// [`Pair::start`] with vipwatch's configuration changed by `change` first.
    async fn start_with(change: impl FnOnce(&mut Config)) -> Self {
        init_logs();
        vipwatch::relay::sender::install_crypto_provider();
        let net = Net::build();
        let root = tempfile::tempdir().unwrap();
        let vips: Vec<Ipv4Addr> = (200..204).map(|last| net.ip(last)).collect();
        let mut hosts = vec![
            Host::new(&net, root.path(), "lb1", &vips, receiver::SECRET),
            Host::new(&net, root.path(), "lb2", &vips, receiver::SECRET),
        ];
        for host in &mut hosts {
            host.start_agent();
            host.start_keepalived();
        }
        let pod = pod(SocketAddr::from((net.ip(51), 8080))).await;
        for host in &hosts {
            wait_until(&format!("{}'s agent runs HAProxy", host.name), || async {
                let state = agent_state(&net, host.name).await?;
                (state["haproxyUp"] == true).then_some(())
            })
            .await;
        }
        let h = Harness::new().await;
        let mut config = Self::config(&h, &net);
        change(&mut config);
        let vw = Some(h.start(config.clone()).await);
        Self { net, _root: root, hosts, h, vw, pod, config }
    }

    fn config(h: &Harness, net: &Net) -> Config {
        let url = |last| format!("http://{}:9080/hooks/vipwatch", net.ip(last));
        let host = |name: &str, last| {
            let mut w = webhook(name, &url(last));
            w.appliance = Some("pair".into());
            w
        };
        let mut config = h.config_with(vec![host("lb1", 11), host("lb2", 12)]);
        config.backends.mode = ModeSetting::Pod;
        let pool = format!("name = \"pair\"\naddresses = [\"{}-{}\"]", net.ip(200), net.ip(203));
        config.pools = vec![toml::from_str(&pool).unwrap()];
        config
    }

    fn host(&mut self, name: &str) -> &mut Host {
        self.hosts.iter_mut().find(|h| h.name == name).unwrap()
    }

    /// Creates Service `eval/<name>` on port 80 with the Pod as its one member; returns its VIP once
    /// its status shows one.
    async fn service(&self, name: &str) -> Ipv4Addr {
        let mut svc = lb_service("eval", name, 80);
        svc["metadata"]["annotations"] = json!({ MODE_ANNOTATION: "pod" });
        self.h.api.apply(svc);
        let slice = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("{name}-1"), "namespace": "eval", "labels": {SERVICE_NAME_LABEL: name}},
            "addressType": "IPv4", "ports": [{"name": "http", "protocol": "TCP", "port": self.pod.port()}],
            "endpoints": [{"addresses": [self.pod.ip().to_string()], "conditions": {"ready": true}}]});
        self.h.api.apply_resource(Resource::EndpointSlices, slice);
        let what = format!("a VIP in eval/{name}'s status");
        let vip = wait_until(&what, || async {
            let svc = self.h.api.get("eval", name)?;
            svc.pointer("/status/loadBalancer/ingress/0/ip")?.as_str().map(str::to_owned)
        })
        .await;
        vip.parse().unwrap()
    }

    /// Waits until `vip` answers from the client namespace; returns the host holding it.
    async fn wait_serving(&self, vip: Ipv4Addr) -> &'static str {
        let ns = self.net.ns("cl");
        wait_until(&format!("{vip}:80 answers from the client namespace"), || async {
            let holder = self.net.holder(vip)?;
            let ns = ns.clone();
            let answered = tokio::task::spawn_blocking(move || in_namespace(&ns, || request((vip, 80).into())))
                .await
                .unwrap()
                .is_some_and(|b| b.contains("hello from pod"));
            answered.then_some(holder)
        })
        .await
    }

    /// Waits until `host` holds `vip`.
    async fn wait_holder(&self, vip: Ipv4Addr, host: &str) {
        wait_until(&format!("{vip} on {host}"), || async { (self.net.holder(vip) == Some(host)).then_some(()) }).await;
    }

    fn describe(&self) -> String {
        let logs = self.hosts.iter().map(|h| {
            let tail = |s: String| {
                let lines: Vec<&str> = s.lines().collect();
                lines[lines.len().saturating_sub(15)..].join("\n")
            };
            let (keepalived, agent) = (tail(h.log("keepalived.log")), tail(h.log("agent.log")));
            format!("--- {} keepalived:\n{keepalived}\n--- {} agent:\n{agent}", h.name, h.name)
        });
        logs.collect::<Vec<_>>().join("\n")
    }

    async fn stop(mut self) {
        if let Some(vw) = self.vw.take() {
            vw.stop().await.unwrap();
        }
    }
}

/// A Pod at `addr`: an HTTP server answering every request with `hello from pod <ip>`.
async fn pod(addr: SocketAddr) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind(addr).await.expect("the Pod's address is free");
    let body = format!("hello from pod {}\n", addr.ip());
    let app = axum::Router::new().fallback(axum::routing::get(move || std::future::ready(body.clone())));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr
}

/// Waits until the client's record shows it answered again after `lost` (and the VIP is on a host);
/// returns how long after `lost` the first answer came and how many requests failed before it.
async fn recovered(client: &Client, lost: Instant) -> (Duration, usize) {
    wait_until("an answer through the VIP after the loss", || async {
        let seen = client.seen();
        let last_ok = seen.last().is_some_and(|(at, ok)| *ok && *at > lost);
        last_ok.then(|| recovery(&seen, lost)).flatten()
    })
    .await;
    recovery(&client.seen(), lost).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn losing_the_active_host_moves_every_vip_to_the_standby_which_serves_every_service() {
    if !can_run() {
        return;
    }
    let mut pair = Pair::start().await;
    let web = pair.service("web").await;
    let api = pair.service("api").await;
    let active = pair.wait_serving(web).await;
    assert_eq!(pair.wait_serving(api).await, active, "one host holds every VIP");
    let client = Client::start(&pair.net.ns("cl"), (web, 80).into());
    wait_until("the client's first answer", || async { client.seen().iter().any(|(_, ok)| *ok).then_some(()) }).await;

    // The agent is SIGKILLed on the active host: keepalived's track script fails, the VIPs move.
    let lost = Instant::now();
    pair.host(active).kill_agent();
    let standby = other(active);
    pair.wait_holder(web, standby).await;
    let (back, failed) = recovered(&client, lost).await;
    eprintln!("agent killed on {active}: answered from {standby} after {back:?}, {failed} failed requests");
    assert_eq!(pair.wait_serving(api).await, standby, "every Service answers on the standby\n{}", pair.describe());
    pair.host(active).start_agent();
    wait_until(&format!("{active}'s agent healthy again"), || async {
        (pair.hosts.iter().find(|h| h.name == active).unwrap().healthz(&pair.net).await == Some(200)).then_some(())
    })
    .await;

    // HAProxy is SIGKILLed on the host now active: its agent starts it again.
    let active = standby;
    let lost = Instant::now();
    let killed = pair.host(active).kill_haproxy();
    assert!(killed >= 2, "HAProxy's master and a worker killed on {active}: {killed}");
    let (back, failed) = recovered(&client, lost).await;
    let holder_now = pair.wait_serving(web).await;
    eprintln!("HAProxy killed on {active}: answered from {holder_now} after {back:?}, {failed} failed requests");
    assert_eq!(pair.wait_serving(api).await, holder_now, "every Service answers\n{}", pair.describe());

    // The active host's link goes down: VRRP adverts stop, the other host takes the VIPs.
    let active = holder_now;
    let lost = Instant::now();
    pair.net.link(active, false);
    let standby = other(active);
    pair.wait_holder(web, standby).await;
    let (back, failed) = recovered(&client, lost).await;
    eprintln!("link of {active} down: answered from {standby} after {back:?}, {failed} failed requests");
    assert_eq!(pair.wait_serving(api).await, standby, "every Service answers on the standby\n{}", pair.describe());
    drop(client);
    pair.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pair_is_one_appliance_a_new_service_gets_its_status_while_one_host_is_down() {
    if !can_run() {
        return;
    }
    let mut pair = Pair::start().await;
    let web = pair.service("web").await;
    let active = pair.wait_serving(web).await;
    let standby = other(active);
    pair.host(standby).kill_agent();
    pair.host(standby).kill_haproxy();

    let api = pair.service("api").await;
    assert_eq!(pair.wait_serving(api).await, active, "the active host serves the new Service");
    let store = &pair.vw.as_ref().unwrap().store;
    let filter = DeliveryFilter { name: Some("api".into()), webhook: Some(standby.into()), ..Default::default() };
    let to_standby = store.deliveries(&filter).await.unwrap();
    assert_eq!(to_standby.iter().map(|d| d.state.as_str()).collect::<Vec<_>>(), ["pending"], "{to_standby:?}");
    pair.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_split_brain_puts_the_vips_on_both_hosts_and_one_keeps_them_once_they_see_each_other_again() {
    if !can_run() {
        return;
    }
    let pair = Pair::start().await;
    let web = pair.service("web").await;
    let active = pair.wait_serving(web).await;
    let client = Client::start(&pair.net.ns("cl"), (web, 80).into());
    wait_until("the client's first answer", || async { client.seen().iter().any(|(_, ok)| *ok).then_some(()) }).await;

    // The hosts stop hearing each other's adverts: the standby takes the VIPs too.
    let split = Instant::now();
    pair.net.split(true);
    wait_until("both hosts hold the VIP", || async { (pair.net.holders(web).len() == 2).then_some(()) }).await;
    let both = Instant::now();
    wait_until("an answer while both hold it", || async {
        client.seen().iter().any(|(at, ok)| *ok && *at > both + Duration::from_secs(1)).then_some(())
    })
    .await;
    let failed_split = client.seen().iter().filter(|(at, ok)| !ok && *at >= split).count();

    // They hear each other again: the higher priority keeps the VIPs, the other lets them go.
    let healed = Instant::now();
    pair.net.split(false);
    wait_until("one host holds the VIP again", || async { (pair.net.holders(web).len() == 1).then_some(()) }).await;
    let (back, failed_heal) = recovered(&client, healed).await;
    let holder = pair.wait_serving(web).await;
    eprintln!(
        "split brain: both hosts held {web} {:?} after the split, {failed_split} failed requests while split; \
         healed: {holder} holds it (was {active}), answered after {back:?}, {failed_heal} failed",
        both - split
    );
    assert_eq!(pair.net.holders(web), [holder]);
    drop(client);
    pair.stop().await;
}

/// What `host`'s agent answers on `GET /state`, from the test's namespace.
async fn agent_state(net: &Net, host: &str) -> Option<serde_json::Value> {
    let ip = if host == "lb1" { net.ip(11) } else { net.ip(12) };
    let client = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(2)).build().unwrap();
    client.get(format!("http://{ip}:9080/state")).send().await.ok()?.json().await.ok()
}

/// The `eval/…` Services in an agent's `/state`, sorted.
fn services_in(state: &serde_json::Value) -> Vec<String> {
    let mut names: Vec<String> = state["services"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["service"].as_str().map(str::to_owned))
        .collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_host_back_from_an_outage_catches_up_by_itself_before_it_can_take_the_vips() {
    if !can_run() {
        return;
    }
    // Production-like backoff: one failed attempt opens the circuit, whose next probe is 30-60 s
    // away, longer than the test waits; vipwatch must notice the host coming back by itself.
    let pair = Pair::start_with(|config| {
        config.relay.lease = Duration::from_secs(30);
        for w in &mut config.webhooks {
            w.circuit_failures = Some(1);
            w.timeout = Duration::from_secs(10); // the agent's answer_timeout is 8 s
            w.retry.initial_delay = Duration::from_secs(30);
            w.retry.max_delay = Duration::from_secs(60);
        }
    });
    let mut pair = pair.await;
    let web = pair.service("web").await;
    let active = pair.wait_serving(web).await;
    let standby = other(active);

    // The standby host goes down whole: keepalived, the agent and HAProxy gone, its link down.
    pair.host(standby).power_off();
    pair.net.link(standby, false);
    let api = pair.service("api").await;
    assert_eq!(pair.wait_serving(api).await, active, "the active host serves what was created meanwhile");

    // It comes back: nobody runs a resync.
    pair.net.link(standby, true);
    let back = Instant::now();
    pair.host(standby).start_agent();
    pair.host(standby).start_keepalived();
    let restarted = pair.hosts.iter().find(|h| h.name == standby).unwrap().log("keepalived.log").lines().count();
    let (not_caught_up, held_vip_early) = (AtomicUsize::new(0), AtomicBool::new(false));
    let caught_up = wait_until(&format!("{standby} caught up"), || async {
        let healthz = pair.hosts.iter().find(|h| h.name == standby).unwrap().healthz(&pair.net).await;
        if healthz == Some(200) {
            return Some(back.elapsed());
        }
        not_caught_up.fetch_add(usize::from(healthz == Some(503)), Ordering::Relaxed);
        held_vip_early.fetch_or(pair.net.holders(web).contains(&standby), Ordering::Relaxed);
        None
    })
    .await;
    let (not_caught_up, held_vip_early) = (not_caught_up.into_inner(), held_vip_early.into_inner());
    assert!(!held_vip_early, "{standby} held a VIP before it was caught up");
    let state = agent_state(&pair.net, standby).await.unwrap();
    assert_eq!(services_in(&state), ["eval/api", "eval/web"], "{state}");
    let metrics = reqwest::get(format!("http://{}/metrics", pair.vw.as_ref().unwrap().addr)).await.unwrap();
    let metrics = metrics.text().await.unwrap();
    let series = format!("vipwatch_webhook_receiver_resyncs_total{{webhook=\"{standby}\",reason=\"not_caught_up\"}} ");
    let resyncs = metrics.lines().find_map(|l| l.strip_prefix(&series)).and_then(|n| n.parse::<f64>().ok());
    assert!(resyncs.is_some_and(|n| n >= 1.0), "no resync counted for {standby}:\n{metrics}");
    eprintln!("{standby} back: caught up {caught_up:?} after its agent started ({not_caught_up} answers of 503 seen)");

    // Once it is BACKUP again, the active host is lost: the new Service answers from it at once.
    wait_until(&format!("{standby}'s keepalived in BACKUP"), || async {
        let log = pair.hosts.iter().find(|h| h.name == standby).unwrap().log("keepalived.log");
        let last = log
            .lines()
            .skip(restarted)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .find(|l| l.contains("Entering") && l.contains("STATE"))
            .map(str::to_owned);
        last.filter(|l| l.contains("BACKUP")).map(drop)
    })
    .await;
    let client = Client::start(&pair.net.ns("cl"), (api, 80).into());
    wait_until("the client's first answer", || async { client.seen().iter().any(|(_, ok)| *ok).then_some(()) }).await;
    let lost = Instant::now();
    pair.host(active).kill_agent();
    pair.wait_holder(api, standby).await;
    let (answered, failed) = recovered(&client, lost).await;
    eprintln!(
        "then {active}'s agent killed: {api} answered from {standby} after {answered:?}, {failed} failed requests"
    );
    assert_eq!(pair.wait_serving(api).await, standby);
    assert_eq!(pair.wait_serving(web).await, standby);
    drop(client);
    pair.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_agent_restarted_while_vipwatch_was_down_is_resynced_at_vipwatchs_start_with_nothing_to_send() {
    if !can_run() {
        return;
    }
    let mut pair = Pair::start().await;
    let web = pair.service("web").await;
    let active = pair.wait_serving(web).await;
    let standby = other(active);
    // vipwatch stops; meanwhile the standby's agent restarts (not caught up); nothing changes.
    pair.vw.take().unwrap().stop().await.unwrap();
    pair.host(standby).kill_agent();
    pair.host(standby).start_agent();
    let host = pair.hosts.iter().find(|h| h.name == standby).unwrap();
    wait_until(&format!("{standby} not caught up"), || async {
        (host.healthz(&pair.net).await == Some(503)).then_some(())
    })
    .await;
    // vipwatch starts again with nothing to send: it remembers that the agent reports its identity.
    let vw = pair.h.start(pair.config.clone()).await;
    wait_until(&format!("{standby} caught up"), || async {
        (host.healthz(&pair.net).await == Some(200)).then_some(())
    })
    .await;
    let state = agent_state(&pair.net, standby).await.unwrap();
    assert_eq!(services_in(&state), ["eval/web"], "{state}");
    vw.stop().await.unwrap();
}
