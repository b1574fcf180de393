//! One appliance, many clusters, over real sockets: two simulated clusters (two fake apiservers),
//! each with its own `vipwatch` (its own `cluster.name`, database and address pool), delivering to
//! one HAProxy agent in front of one real `haproxy`; Pods are small HTTP servers on 127.0.1.x, VIPs
//! are on 127.0.100.x. The same `eval/web` in both clusters answers through each cluster's own VIP
//! from its own Pods; a resync or a delete in one cluster leaves the other serving; a VIP:port both
//! clusters claim is refused (422) and the second cluster never reports a VIP that does not answer;
//! a second vipwatch under a cluster name another one holds is refused (409) and shown; and an agent
//! upgraded from a `state.json` without clusters keeps serving through one hitless reload.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use common::*;
use serde_json::{Value, json};
use tempfile::TempDir;
use vipwatch::app::Running;
use vipwatch::config::Config;
use vipwatch::fake_apiserver::{FakeApiServer, Resource};
use vipwatch::model::backends::{MODE_ANNOTATION, ModeSetting, SERVICE_NAME_LABEL};
use vipwatch::store::{DeliveryFilter, DeliveryRow, Store};

/// The Service port test `i` uses, different per test process so that concurrent runs on one machine
/// (the VIPs are the same loopback addresses) do not take each other's binds; below the ephemeral
/// range the Pods' ports come from.
fn service_port(i: u16) -> u16 {
    20_000 + (std::process::id() % 1_200) as u16 * 10 + i
}

/// A Pod on `ip`: an HTTP server answering every request with `hello from pod <ip> (<owner>)`, as
/// the demo's Pods do. `port` 0 takes a free one. Returns its address.
async fn pod(ip: &str, port: u16, owner: &str) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind((ip, port)).await.expect("the Pod's address is free");
    let addr = listener.local_addr().unwrap();
    let body = format!("hello from pod {ip} ({owner})\n");
    let app = axum::Router::new().fallback(axum::routing::get(move || std::future::ready(body.clone())));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr
}

/// What `GET http://<addr>/` answers, over a new TCP connection each time (as `curl` would); `None`
/// when the connection is refused or fails.
async fn get(addr: &str) -> Option<String> {
    let client = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let r = client.get(format!("http://{addr}/")).send().await.ok()?;
    r.status().is_success().then_some(())?;
    r.text().await.ok()
}

/// The agent and its HAProxy, in a directory of their own (HAProxy stops with the agent, even when
/// the test fails).
struct Agent {
    dir: TempDir,
    running: Option<vipwatch_haproxy::Running>,
    url: String,
}

impl Agent {
    /// Starts an agent on `dir` (which may hold a `state.json`) with `cluster_takeover_after`.
    async fn start(dir: TempDir, takeover_after: Duration) -> Self {
        vipwatch::relay::sender::install_crypto_provider();
        let config = vipwatch_haproxy::AgentConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            secrets: vec![receiver::SECRET.into()],
            dir: dir.path().to_owned(),
            batch_window: Duration::from_millis(20),
            cluster_takeover_after: takeover_after,
            stop_haproxy_on_exit: true,
            ..Default::default()
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let running = vipwatch_haproxy::start(config, listener).await.expect("the agent starts");
        let url = format!("http://{}", running.addr);
        Self { dir, running: Some(running), url }
    }

    /// `GET /state` as JSON.
    async fn state(&self) -> Value {
        reqwest::get(format!("{}/state", self.url)).await.unwrap().json().await.unwrap()
    }

    /// `GET /metrics`.
    async fn metrics(&self) -> String {
        reqwest::get(format!("{}/metrics", self.url)).await.unwrap().text().await.unwrap()
    }

    /// The applied `haproxy.cfg`.
    fn config_text(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("haproxy.cfg")).unwrap()
    }

    /// The HAProxy master's reload counter (`show proc`).
    async fn reloads(&self) -> u64 {
        let h = vipwatch_haproxy::haproxy::Haproxy::new("haproxy".as_ref(), self.dir.path());
        h.show_proc().await.unwrap().reloads
    }

    async fn stop(mut self) {
        if let Some(r) = self.running.take() {
            r.stop().await;
        }
    }
}

/// One simulated cluster: its fake apiserver and database ([`Harness`]), its vipwatch and the
/// configuration that vipwatch runs with.
struct Cluster {
    h: Harness,
    config: Config,
    vw: Option<Running>,
}

impl Cluster {
    /// A cluster named `name` whose vipwatch hands out VIPs from `pool` (mode pod) and delivers to
    /// the agent at `agent_url`. Not started.
    async fn new(name: &str, pool: &str, agent_url: &str) -> Self {
        let h = Harness::new().await;
        let mut config = h.config_with(vec![webhook("lb", &format!("{agent_url}/hooks/vipwatch"))]);
        config.cluster.name = Some(name.to_owned());
        config.backends.mode = ModeSetting::Pod;
        config.pools = vec![toml::from_str(&format!("name = \"lab\"\naddresses = [\"{pool}\"]")).unwrap()];
        Self { h, config, vw: None }
    }

    fn api(&self) -> &FakeApiServer {
        &self.h.api
    }

    async fn start(&mut self) {
        self.vw = Some(self.h.start(self.config.clone()).await);
    }

    fn store(&self) -> &Store {
        &self.vw.as_ref().expect("started").store
    }

    /// Creates Service `eval/web` on `port` with one Pod endpoint `member`.
    fn web(&self, port: u16, member: SocketAddr) {
        let mut svc = lb_service("eval", "web", i64::from(port));
        svc["metadata"]["annotations"] = json!({ MODE_ANNOTATION: "pod" });
        self.api().apply(svc);
        let slice = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "web-1", "namespace": "eval", "labels": {SERVICE_NAME_LABEL: "web"}},
            "addressType": "IPv4", "ports": [{"name": "http", "protocol": "TCP", "port": member.port()}],
            "endpoints": [{"addresses": [member.ip().to_string()], "conditions": {"ready": true}}]});
        self.api().apply_resource(Resource::EndpointSlices, slice);
    }

    /// `eval/web`'s uid.
    fn web_uid(&self) -> String {
        let svc = self.api().get("eval", "web").expect("eval/web exists");
        svc["metadata"]["uid"].as_str().unwrap().to_owned()
    }

    /// `status.loadBalancer.ingress` of `eval/web` (`null` while empty).
    fn ingress(&self) -> Value {
        let svc = self.api().get("eval", "web");
        svc.and_then(|s| s.pointer("/status/loadBalancer/ingress").cloned()).unwrap_or(Value::Null)
    }

    /// Waits until `eval/web`'s status shows a VIP; returns it.
    async fn wait_vip(&self) -> String {
        wait_until("a VIP in eval/web's status", || async {
            self.ingress().pointer("/0/ip").and_then(Value::as_str).map(str::to_owned)
        })
        .await
    }

    /// `(reason, note)` of the Kubernetes Events about `eval/web`.
    fn events(&self) -> Vec<(String, String)> {
        let about_web = |e: &Value| e["apiVersion"] == "events.k8s.io/v1" && e["regarding"]["name"] == "web";
        let events = self.api().events().into_iter().filter(about_web);
        events
            .map(|e| (e["reason"].as_str().unwrap_or("").to_owned(), e["note"].as_str().unwrap_or("").to_owned()))
            .collect()
    }

    /// The newest delivery of `eval/web` and its attempts' `(status, response body)`.
    async fn web_delivery(&self) -> Option<(DeliveryRow, Vec<(Option<i64>, Option<String>)>)> {
        let filter = DeliveryFilter { name: Some("web".into()), ..DeliveryFilter::default() };
        let row = self.store().deliveries(&filter).await.unwrap().pop()?;
        let attempts = self.store().attempts(row.id).await.unwrap();
        Some((row, attempts.into_iter().map(|a| (a.status_code, a.response_body)).collect()))
    }

    /// Waits until every delivery vipwatch made has succeeded.
    async fn wait_all_delivered(&self) {
        wait_until("every delivery succeeded", || async {
            let rows = self.store().deliveries(&DeliveryFilter::default()).await.unwrap();
            (!rows.is_empty() && rows.iter().all(|r| r.state == "succeeded" || r.state == "superseded")).then_some(())
        })
        .await
    }

    async fn stop(mut self) {
        if let Some(vw) = self.vw.take() {
            vw.stop().await.unwrap();
        }
    }
}

/// The problem `detail` of an agent's answer body.
fn detail(body: &str) -> String {
    let v: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    v["detail"].as_str().unwrap_or_default().to_owned()
}

/// The error a `SyncLoadBalancerFailed` Event's `note` reports, after checking that the note names
/// a delivery of `eval/web` in `cluster`.
async fn failed_error(cluster: &Cluster, note: &str) -> String {
    let rest = note.strip_prefix("Error syncing load balancer: webhook `lb` delivery ");
    let (id, error) =
        rest.and_then(|r| r.split_once(": ")).unwrap_or_else(|| panic!("not a failed delivery's note: {note}"));
    let id: i64 = id.parse().unwrap_or_else(|_| panic!("no delivery id in: {note}"));
    let filter = DeliveryFilter { name: Some("web".into()), ..DeliveryFilter::default() };
    let ids: Vec<i64> = cluster.store().deliveries(&filter).await.unwrap().iter().map(|r| r.id).collect();
    assert!(ids.contains(&id), "delivery {id} is not one of eval/web's: {ids:?}");
    error.to_owned()
}

/// Whether `why` is the agent's 409 reason for cluster name `east` held by event log `log`, with
/// some number of seconds since its last delivery.
fn is_name_refusal(why: &str, log: &str) -> bool {
    let prefix = format!("cluster name east is in use by another vipwatch: event log {log}, last delivery ");
    let suffix = " s ago; give each cluster its own cluster.name (a vipwatch whose database was replaced takes the \
                  name over once the other has been silent for 10m)";
    let seconds = why.strip_prefix(&prefix).and_then(|r| r.strip_suffix(suffix));
    seconds.is_some_and(|s| s.parse::<u64>().is_ok())
}

/// `(cluster, service, uid)` of every Service in the agent's `/state`.
fn services_of(state: &Value) -> Vec<(Value, String, String)> {
    let list = state["services"].as_array().unwrap();
    list.iter()
        .map(|s| {
            (s["cluster"].clone(), s["service"].as_str().unwrap().to_owned(), s["uid"].as_str().unwrap().to_owned())
        })
        .collect()
}

#[tokio::test]
async fn the_same_service_in_two_clusters_answers_through_each_clusters_vip_and_a_resync_or_delete_in_one_leaves_the_other()
 {
    let Some(_haproxy) = require_tool("haproxy") else { return };
    let agent = Agent::start(tempfile::tempdir().unwrap(), Duration::from_secs(600)).await;
    let port = service_port(0);
    let mut east = Cluster::new("east", "127.0.100.0/25", &agent.url).await;
    let mut west = Cluster::new("west", "127.0.100.128/25", &agent.url).await;
    let east_pod = pod("127.0.1.1", 0, "east eval/web").await;
    let west_pod = pod("127.0.1.2", east_pod.port(), "west eval/web").await;
    east.web(port, east_pod);
    west.web(port, west_pod);
    east.start().await;
    west.start().await;

    assert_eq!(east.wait_vip().await, "127.0.100.0");
    assert_eq!(west.wait_vip().await, "127.0.100.128");
    let (east_vip, west_vip) = (format!("127.0.100.0:{port}"), format!("127.0.100.128:{port}"));
    assert_eq!(get(&east_vip).await.as_deref(), Some("hello from pod 127.0.1.1 (east eval/web)\n"));
    assert_eq!(get(&west_vip).await.as_deref(), Some("hello from pod 127.0.1.2 (west eval/web)\n"));

    // Two Services, one per cluster, each under HAProxy names of its own.
    let state = agent.state().await;
    let both = vec![
        (json!("east"), "eval/web".to_owned(), east.web_uid()),
        (json!("west"), "eval/web".to_owned(), west.web_uid()),
    ];
    assert_eq!(services_of(&state), both);
    let clusters: Vec<(Value, Value, Value)> = state["clusters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["cluster"].clone(), c["logId"].clone(), c["services"].clone()))
        .collect();
    assert_eq!(
        clusters,
        [
            (json!("east"), json!(east.store().log_id()), json!(1)),
            (json!("west"), json!(west.store().log_id()), json!(1))
        ]
    );
    let text = agent.config_text();
    for name in [format!("frontend fe_east_eval_web_{port}"), format!("frontend fe_west_eval_web_{port}")] {
        assert_eq!(text.matches(&format!("{name}\n")).count(), 1, "{name} once in:\n{text}");
    }
    let metrics = agent.metrics().await;
    for line in ["vipwatch_haproxy_services{cluster=\"east\"} 1", "vipwatch_haproxy_services{cluster=\"west\"} 1"] {
        assert!(metrics.lines().any(|l| l == line), "missing `{line}` in:\n{metrics}");
    }

    // A full resync of east: it sweeps what east did not include, and west's eval/web is not east's.
    // (vipwatch resynced the agent by itself once at its start, as it was not caught up: only the
    // deliveries after `before` are this resync's.)
    east.wait_all_delivered().await;
    let all = DeliveryFilter { webhook: Some("lb".into()), ..DeliveryFilter::default() };
    let before = east.store().deliveries(&all).await.unwrap().iter().map(|r| r.id).max().unwrap_or(0);
    let sent = vipwatch::route::resync(east.store(), &east.config, None).await.unwrap();
    assert_eq!(sent, [("lb".to_owned(), 1)]);
    wait_until("east's resync delivered, sync.completed included", || async {
        let filter = DeliveryFilter { webhook: Some("lb".into()), after_id: Some(before), ..DeliveryFilter::default() };
        let rows = east.store().deliveries(&filter).await.unwrap();
        let synced: Vec<&DeliveryRow> = rows.iter().filter(|r| r.kind == "SYNCED").collect();
        (synced.len() == 2 && synced.iter().all(|r| r.state == "succeeded")).then_some(())
    })
    .await;
    assert_eq!(services_of(&agent.state().await), both, "east's resync left west's Service alone");
    assert_eq!(get(&west_vip).await.as_deref(), Some("hello from pod 127.0.1.2 (west eval/web)\n"));
    assert_eq!(get(&east_vip).await.as_deref(), Some("hello from pod 127.0.1.1 (east eval/web)\n"));

    // Deleting east's eval/web takes east's VIP away, and only that. (The agent publishes its state
    // once the change is live, just before it answers the DELETED.)
    assert!(east.api().delete("eval", "web"));
    wait_until("east's Service gone from the agent", || async {
        (services_of(&agent.state().await) == both[1..]).then_some(())
    })
    .await;
    assert_eq!(get(&east_vip).await, None, "east's VIP refuses connections");
    assert_eq!(get(&west_vip).await.as_deref(), Some("hello from pod 127.0.1.2 (west eval/web)\n"));
    wait_until("east's Service gone from the cluster (finalizer released)", || async {
        east.api().get("eval", "web").is_none().then_some(())
    })
    .await;

    east.stop().await;
    west.stop().await;
    agent.stop().await;
}

#[tokio::test]
async fn a_vip_port_two_clusters_claim_is_refused_and_the_second_cluster_never_reports_it() {
    let Some(_haproxy) = require_tool("haproxy") else { return };
    let agent = Agent::start(tempfile::tempdir().unwrap(), Duration::from_secs(600)).await;
    let port = service_port(1);
    // Overlapping pools: both clusters hand out 127.0.100.0 first.
    let mut east = Cluster::new("east", "127.0.100.0/25", &agent.url).await;
    let mut west = Cluster::new("west", "127.0.100.0/24", &agent.url).await;
    let east_pod = pod("127.0.1.3", 0, "east eval/web").await;
    let west_pod = pod("127.0.1.4", east_pod.port(), "west eval/web").await;
    east.web(port, east_pod);
    west.web(port, west_pod);
    east.start().await;
    assert_eq!(east.wait_vip().await, "127.0.100.0");
    let vip = format!("127.0.100.0:{port}");
    assert_eq!(get(&vip).await.as_deref(), Some("hello from pod 127.0.1.3 (east eval/web)\n"));

    west.start().await;
    let reason = format!(
        "127.0.100.0:{port} is already bound by Service eval/web of cluster east (clusters sharing this appliance \
         need address pools that do not overlap)"
    );
    // The refusal and its reason are in west's delivery log...
    let (row, attempts) = wait_until("west's delivery refused three times", || async {
        west.web_delivery().await.filter(|(_, a)| a.len() >= 3)
    })
    .await;
    let error = format!("HTTP 422 Unprocessable Entity: {reason}");
    assert_eq!(
        (row.state.as_str(), row.last_status, row.last_error.as_deref()),
        ("pending", Some(422), Some(error.as_str()))
    );
    for (status, body) in &attempts {
        assert_eq!((*status, detail(body.as_deref().unwrap_or_default())), (Some(422), reason.clone()));
    }
    // ...and a Kubernetes Event on west's Service says its load balancer failed.
    let failed = wait_until("a SyncLoadBalancerFailed Event on west's eval/web", || async {
        west.events().into_iter().find(|(r, _)| r == "SyncLoadBalancerFailed").map(|(_, note)| note)
    })
    .await;
    assert_eq!(failed_error(&west, &failed).await, error);
    // East keeps serving; west never claimed a VIP that would not answer.
    assert_eq!(get(&vip).await.as_deref(), Some("hello from pod 127.0.1.3 (east eval/web)\n"));
    assert_eq!(west.ingress(), Value::Null, "west's status stays empty");
    assert_eq!(services_of(&agent.state().await), [(json!("east"), "eval/web".to_owned(), east.web_uid())]);

    east.stop().await;
    west.stop().await;
    agent.stop().await;
}

#[tokio::test]
async fn a_second_vipwatch_under_a_cluster_name_another_one_holds_is_refused_and_shown() {
    let Some(_haproxy) = require_tool("haproxy") else { return };
    let agent = Agent::start(tempfile::tempdir().unwrap(), Duration::from_secs(600)).await;
    let port = service_port(2);
    // Two clusters, two databases, one cluster.name.
    let mut first = Cluster::new("east", "127.0.100.0/25", &agent.url).await;
    let mut second = Cluster::new("east", "127.0.100.128/25", &agent.url).await;
    let first_pod = pod("127.0.1.5", 0, "first eval/web").await;
    let second_pod = pod("127.0.1.6", first_pod.port(), "second eval/web").await;
    first.web(port, first_pod);
    second.web(port, second_pod);
    first.start().await;
    assert_eq!(first.wait_vip().await, "127.0.100.0");
    let first_vip = format!("127.0.100.0:{port}");
    assert_eq!(get(&first_vip).await.as_deref(), Some("hello from pod 127.0.1.5 (first eval/web)\n"));

    second.start().await;
    let (first_log, second_log) = (first.store().log_id().to_owned(), second.store().log_id().to_owned());
    assert_ne!(first_log, second_log);
    let (row, attempts) = wait_until("the second vipwatch's delivery refused three times", || async {
        second.web_delivery().await.filter(|(_, a)| a.len() >= 3)
    })
    .await;
    let error = row.last_error.clone().unwrap_or_default();
    assert_eq!(row.last_status, Some(409));
    assert!(error.strip_prefix("HTTP 409 Conflict: ").is_some_and(|why| is_name_refusal(why, &first_log)), "{error}");
    for (status, body) in &attempts {
        let why = detail(body.as_deref().unwrap_or_default());
        assert_eq!(*status, Some(409));
        assert!(is_name_refusal(&why, &first_log), "{why}");
    }
    let failed = wait_until("a SyncLoadBalancerFailed Event on the second cluster's eval/web", || async {
        second.events().into_iter().find(|(r, _)| r == "SyncLoadBalancerFailed").map(|(_, note)| note)
    })
    .await;
    let error = failed_error(&second, &failed).await;
    assert!(error.strip_prefix("HTTP 409 Conflict: ").is_some_and(|why| is_name_refusal(why, &first_log)), "{failed}");

    // The first keeps its name and its Service; the second's status stays empty.
    assert_eq!(get(&first_vip).await.as_deref(), Some("hello from pod 127.0.1.5 (first eval/web)\n"));
    assert_eq!(get(&format!("127.0.100.128:{port}")).await, None);
    assert_eq!(second.ingress(), Value::Null);
    let state = agent.state().await;
    assert_eq!(services_of(&state), [(json!("east"), "eval/web".to_owned(), first.web_uid())]);
    let east = &state["clusters"][0];
    assert_eq!((&east["cluster"], &east["logId"]), (&json!("east"), &json!(first_log)));
    assert_eq!(east["lastConflict"]["logId"], json!(second_log));
    assert!(is_name_refusal(east["lastConflict"]["reason"].as_str().unwrap(), &first_log), "{east}");
    let conflicts = east["conflicts"].as_u64().unwrap();
    assert!(conflicts >= 3, "{east}");
    let metrics = agent.metrics().await;
    let counted =
        metrics.lines().find_map(|l| l.strip_prefix("vipwatch_haproxy_cluster_conflicts_total{cluster=\"east\"} "));
    assert!(counted.and_then(|n| n.parse::<u64>().ok()).is_some_and(|n| n >= conflicts), "{metrics}");

    // The documented fix: the second cluster gets a name of its own and restarts. Its delivery made
    // under `east` goes out under `north`, and `east` stays the first cluster's.
    let waiting = second.web_delivery().await.unwrap().0.id;
    let vw = second.vw.take().unwrap();
    vw.stop().await.unwrap();
    second.config.cluster.name = Some("north".into());
    second.start().await;
    assert_eq!(second.wait_vip().await, "127.0.100.128");
    let filter = DeliveryFilter { name: Some("web".into()), ..DeliveryFilter::default() };
    let rows = second.store().deliveries(&filter).await.unwrap();
    let row = rows.iter().find(|r| r.id == waiting).unwrap();
    assert_eq!(row.state, "succeeded", "{rows:?}");
    assert_eq!(
        get(&format!("127.0.100.128:{port}")).await.as_deref(),
        Some("hello from pod 127.0.1.6 (second eval/web)\n")
    );
    assert_eq!(get(&first_vip).await.as_deref(), Some("hello from pod 127.0.1.5 (first eval/web)\n"));
    let mut served = services_of(&agent.state().await);
    served.sort_by(|a, b| a.0.as_str().cmp(&b.0.as_str()));
    let expected = [
        (json!("east"), "eval/web".to_owned(), first.web_uid()),
        (json!("north"), "eval/web".to_owned(), second.web_uid()),
    ];
    assert_eq!(served, expected);

    first.stop().await;
    second.stop().await;
    agent.stop().await;
}

#[tokio::test]
async fn an_agent_upgraded_from_a_state_without_clusters_keeps_serving_and_renames_with_one_reload() {
    let Some(_haproxy) = require_tool("haproxy") else { return };
    let port = service_port(3);
    let dir = tempfile::tempdir().unwrap();
    let pod = pod("127.0.1.7", 0, "east eval/web").await;
    // The cluster and its vipwatch's database exist; the agent's state.json was written by an agent
    // before clusters: Services keyed `namespace/name`, tombstones by uid, backends `be_<ns>_<name>_<port>`.
    let mut east = Cluster::new("east", "127.0.100.64/32", "http://unused").await;
    east.web(port, pod);
    let log_id = east.h.store().await.log_id().to_owned();
    let uid = east.web_uid();
    let mut service = json!({"namespace": "eval", "name": "web", "uid": uid, "resourceVersion": "1",
        "vips": ["127.0.100.64"], "type": "LoadBalancer", "loadBalancerClass": null,
        "ports": [{"name": "http", "protocol": "TCP", "port": port, "targetPort": "8080", "nodePort": null, "appProtocol": null}],
        "selector": {"app": "web"}, "externalTrafficPolicy": "Cluster", "healthCheckNodePort": null,
        "sessionAffinity": "None", "sessionAffinityTimeoutSeconds": null, "loadBalancerSourceRanges": [],
        "externalIPs": [], "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
        "allocateLoadBalancerNodePorts": null, "loadBalancerIP": null, "requestedIPs": [], "ingress": [],
        "labels": {}, "annotations": {}, "allocation": null, "finalizers": [], "deleting": false});
    let member = json!({"address": "127.0.1.7", "port": pod.port(), "state": "active", "nodeName": null, "zone": null});
    service["backends"] = json!({"mode": "pod", "revision": 1, "hash": "sha256:1", "healthCheck": null, "reason": null,
        "ports": [{"name": "http", "protocol": "TCP", "port": port, "members": [member]}]});
    let version = json!({"event_id": 1, "resource_version": "1", "log_id": log_id});
    let slots = json!([format!("127.0.1.7:{}", pod.port()), null, null, null, null, null, null, null]);
    let old = json!({
        "services": {"eval/web": {"service": service, "version": version}},
        "tombstones": {"0b0c0d0e-0000-4000-8000-000000000001": version},
        "slots": {format!("be_eval_web_{port}"): slots}
    });
    std::fs::write(dir.path().join("state.json"), serde_json::to_vec_pretty(&old).unwrap()).unwrap();

    // The upgraded agent serves the old state as it was, under the old names, before any delivery.
    let agent = Agent::start(dir, Duration::from_secs(600)).await;
    let vip = format!("127.0.100.64:{port}");
    assert_eq!(get(&vip).await.as_deref(), Some("hello from pod 127.0.1.7 (east eval/web)\n"));
    assert!(agent.config_text().contains(&format!("\n# eval/web port {port}/TCP\nfrontend fe_eval_web_{port}\n")));
    assert_eq!(services_of(&agent.state().await), [(Value::Null, "eval/web".to_owned(), uid.clone())]);
    let reloads = agent.reloads().await;

    // A client keeps connecting through the VIP while east's vipwatch (the same event log) delivers.
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let client = {
        let (stop, ok, failed, vip) = (stop.clone(), ok.clone(), failed.clone(), vip.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                match get(&vip).await.as_deref() {
                    Some("hello from pod 127.0.1.7 (east eval/web)\n") => ok.fetch_add(1, Ordering::Relaxed),
                    _ => failed.fetch_add(1, Ordering::Relaxed),
                };
            }
        })
    };
    east.config.webhooks = vec![webhook("lb", &format!("{}/hooks/vipwatch", agent.url))];
    east.start().await;
    assert_eq!(east.wait_vip().await, "127.0.100.64");
    east.wait_all_delivered().await;
    stop.store(true, Ordering::Relaxed);
    client.await.unwrap();
    assert_eq!(failed.load(Ordering::Relaxed), 0, "{} requests answered", ok.load(Ordering::Relaxed));
    assert!(ok.load(Ordering::Relaxed) > 0);

    // Adopted into east (its log recorded the old entries): new names, one reload, no second copy.
    assert_eq!(agent.reloads().await - reloads, 1, "one reload renamed the HAProxy objects");
    let text = agent.config_text();
    assert!(text.contains(&format!("\n# east/eval/web port {port}/TCP\nfrontend fe_east_eval_web_{port}\n")), "{text}");
    assert!(!text.contains(&format!("fe_eval_web_{port}")), "{text}");
    assert_eq!(text.matches(&format!("bind {vip}\n")).count(), 1, "{text}");
    assert_eq!(services_of(&agent.state().await), [(json!("east"), "eval/web".to_owned(), uid.clone())]);
    let saved: Value = serde_json::from_slice(&std::fs::read(agent.dir.path().join("state.json")).unwrap()).unwrap();
    let keys: Vec<&String> = saved["services"].as_object().unwrap().keys().collect();
    assert_eq!(keys, ["east/eval/web"]);
    let tombstones: Vec<&String> = saved["tombstones"].as_object().unwrap().keys().collect();
    assert_eq!(tombstones, ["east/0b0c0d0e-0000-4000-8000-000000000001"]);
    assert_eq!(saved["clusters"]["east"]["log_id"], json!(log_id));
    assert_eq!(get(&vip).await.as_deref(), Some("hello from pod 127.0.1.7 (east eval/web)\n"));

    east.stop().await;
    agent.stop().await;
}
