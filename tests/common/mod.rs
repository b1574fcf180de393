//! Shared test harness: a fake apiserver, a temp SQLite file, vipwatch started in-process on port 0,
//! and deadline-bounded waits on conditions (never bare sleeps).

#![allow(dead_code)]

pub mod api;
pub mod appliance;
pub mod receiver;

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};
use tempfile::TempDir;
use vipwatch::app::{self, Running};
use vipwatch::config::{Config, RetryConfig, Secret, WebhookConfig};
use vipwatch::fake_apiserver::FakeApiServer;
use vipwatch::store::{EventFilter, EventRow, ServiceRow, Store};

/// Default deadline of [`wait_until`].
pub const DEADLINE: Duration = Duration::from_secs(20);

/// A fake apiserver plus a temp directory holding the database.
pub struct Harness {
    pub api: FakeApiServer,
    pub dir: TempDir,
}

impl Harness {
    pub async fn new() -> Self {
        init_logs();
        let api = FakeApiServer::start().await.expect("fake apiserver starts");
        Self { api, dir: tempfile::tempdir().unwrap() }
    }

    pub fn db_path(&self) -> PathBuf {
        self.dir.path().join("vipwatch.db")
    }

    /// A config pointing at the fake apiserver (or `url`) and the temp database.
    pub fn config_for(&self, url: &str) -> Config {
        let mut config = Config::default();
        config.kubernetes.url = Some(url.parse().unwrap());
        config.database.path = self.db_path();
        config
    }

    pub fn config(&self) -> Config {
        self.config_for(&self.api.url())
    }

    /// [`Self::config`] with these endpoints and a 100 ms relay poll.
    pub fn config_with(&self, webhooks: Vec<WebhookConfig>) -> Config {
        let mut config = self.config();
        config.webhooks = webhooks;
        config.relay.poll_interval = Duration::from_millis(100);
        config.relay.lease = Duration::from_secs(5);
        config
    }

    /// Starts vipwatch with `config` on 127.0.0.1:0 and waits until it is ready.
    pub async fn start(&self, config: Config) -> Running {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let running = app::start(config, listener).await.expect("vipwatch starts");
        tokio::time::timeout(DEADLINE, running.ready()).await.expect("vipwatch becomes ready");
        running
    }
}

/// Waits until the fake apiserver has an open watch (a fault switch applies to open watches only).
pub async fn wait_watching(api: &FakeApiServer) {
    wait_until("an open watch", || async { (api.open_watches() >= 1).then_some(()) }).await;
}

/// A webhook endpoint with test-friendly timings: 1 s timeout, retries from 50 ms doubling to 1 s.
pub fn webhook(name: &str, url: &str) -> WebhookConfig {
    let toml = format!("name = \"{name}\"\nurl = \"{url}\"\n");
    let mut w: WebhookConfig = toml::from_str(&toml).unwrap();
    w.secret = Some(Secret::new(receiver::SECRET));
    w.timeout = Duration::from_secs(1);
    w.retry = RetryConfig {
        max_attempts: 50,
        max_age: Duration::from_secs(600),
        initial_delay: Duration::from_millis(50),
        max_delay: Duration::from_secs(1),
    };
    w
}

/// Logs to the test's captured output (`VIPWATCH_LOG` or `info`).
pub fn init_logs() {
    let filter = std::env::var("VIPWATCH_LOG").unwrap_or_else(|_| "info".into());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
}

/// Polls `check` every 20 ms until it returns `Some`, failing the test with `what` after `DEADLINE`.
pub async fn wait_until<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    let poll = async {
        loop {
            tick.tick().await;
            if let Some(v) = check().await {
                return v;
            }
        }
    };
    match tokio::time::timeout(DEADLINE, poll).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {DEADLINE:?} waiting for: {what}"),
    }
}

/// Every event in the log, with `observed_at` zeroed so rows compare whole.
pub async fn events(store: &Store) -> Vec<EventRow> {
    let mut rows = store.events(&EventFilter::default()).await.unwrap();
    for r in &mut rows {
        assert!(r.observed_at > 1_700_000_000_000, "observed_at is Unix ms");
        r.observed_at = 0;
    }
    rows
}

/// Waits until the event log holds exactly `n` events, then returns them (observed_at zeroed).
pub async fn wait_events(store: &Store, n: usize) -> Vec<EventRow> {
    wait_until(&format!("{n} events"), || async {
        let rows = events(store).await;
        (rows.len() >= n).then_some(rows)
    })
    .await
}

/// The state table with times zeroed.
pub async fn services(store: &Store) -> Vec<ServiceRow> {
    let mut rows = store.services().await.unwrap();
    for r in &mut rows {
        assert!(r.first_seen_at > 0 && r.updated_at >= r.first_seen_at);
        r.first_seen_at = 0;
        r.updated_at = 0;
    }
    rows
}

/// A LoadBalancer Service with one TCP port `port` → 8080.
pub fn lb_service(namespace: &str, name: &str, port: i64) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
        "spec": {"type": "LoadBalancer", "selector": {"app": name},
                 "ports": [{"name": "http", "protocol": "TCP", "port": port, "targetPort": 8080, "nodePort": 30000 + port}]}
    })
}

/// Short summary `(type, cause, namespace/name)` of event rows, for readable asserts.
pub fn summary(rows: &[EventRow]) -> Vec<(String, String, String)> {
    rows.iter().map(|r| (r.event_type.clone(), r.cause.clone(), r.key.to_string())).collect()
}

pub fn s(v: &str) -> String {
    v.to_owned()
}

/// The members vipwatch announces in its default mode (`nodePort`) for `view`, given the cluster's
/// Nodes `(name, InternalIP)`: every Node × each port's nodePort, kube-proxy's health check hinted,
/// at `revision`; built from the README's rules, with the hash as documented (sha256 of the canonical
/// JSON of mode, healthCheck, reason and ports).
pub fn node_port_members(
    view: &vipwatch::model::ServiceView,
    nodes: &[(&str, &str)],
    revision: u64,
) -> vipwatch::model::backends::BackendSets {
    use vipwatch_contract::{BackendMode, BackendPort, Backends, HealthCheck, HealthCheckScope, Member, MemberState};
    let mut sorted: Vec<(std::net::IpAddr, &str)> = nodes.iter().map(|(n, ip)| (ip.parse().unwrap(), *n)).collect();
    sorted.sort();
    let ports: Vec<BackendPort> = view
        .ports
        .iter()
        .map(|p| BackendPort {
            name: p.name.clone(),
            protocol: p.protocol.clone(),
            port: p.port,
            members: p
                .node_port
                .map(|np| {
                    sorted
                        .iter()
                        .map(|(ip, n)| Member {
                            address: ip.to_string(),
                            port: np,
                            state: MemberState::Active,
                            node_name: Some((*n).to_owned()),
                            zone: None,
                        })
                        .collect()
                })
                .unwrap_or_default(),
        })
        .collect();
    let health_check =
        HealthCheck { protocol: "HTTP".into(), port: 10256, path: "/healthz".into(), scope: HealthCheckScope::Node };
    #[derive(serde::Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Canonical<'a> {
        mode: &'a str,
        health_check: &'a HealthCheck,
        reason: Option<&'a str>,
        ports: &'a [BackendPort],
    }
    let canonical = Canonical { mode: "nodePort", health_check: &health_check, reason: None, ports: &ports };
    let digest = <sha2::Sha256 as sha2::Digest>::digest(serde_json::to_vec(&canonical).unwrap());
    let hash = format!("sha256:{}", digest.iter().map(|b| format!("{b:02x}")).collect::<String>());
    let b =
        Backends { mode: BackendMode::NodePort, revision, hash, health_check: Some(health_check), reason: None, ports };
    [(BackendMode::NodePort, b)].into_iter().collect()
}
