//! Shared test harness: a fake apiserver, a database (a temp SQLite file, or a fresh PostgreSQL
//! database when `VIPWATCH_TEST_BACKEND=postgres`, see [`backend`]), vipwatch started in-process on
//! port 0, and deadline-bounded waits on conditions (never bare sleeps).

#![allow(dead_code)]

pub mod api;
pub mod appliance;
pub mod receiver;
pub mod require;

#[allow(unused_imports)] // each test binary uses some of them
pub use require::{PG_URL_VAR, require_pg, require_root, require_tool, under_ci};

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};
use tempfile::TempDir;
use vipwatch::app::{self, Running};
use vipwatch::config::{Config, RetryConfig, Secret, WebhookConfig};
use vipwatch::fake_apiserver::FakeApiServer;
use vipwatch::store::{Backend, EventFilter, EventRow, ServiceRow, Store};

/// Default deadline of [`wait_until`].
pub const DEADLINE: Duration = Duration::from_secs(20);

/// A fake apiserver plus the database: a temp directory holding the SQLite file, and on
/// PostgreSQL a database of its own.
pub struct Harness {
    pub api: FakeApiServer,
    pub dir: TempDir,
    /// The PostgreSQL database's URL, when the tests run on PostgreSQL.
    pub pg_url: Option<String>,
}

/// The backend the end-to-end tests run on: PostgreSQL in the `postgres` test binary
/// (tests/postgres.rs, which runs the store-heavy test files again as its modules) or when
/// `VIPWATCH_TEST_BACKEND=postgres`; SQLite otherwise.
pub fn backend() -> Backend {
    match std::env::var("VIPWATCH_TEST_BACKEND").as_deref() {
        Ok("postgres") => Backend::Postgres,
        Ok(_) => Backend::Sqlite,
        Err(_) if module_path!().starts_with("postgres::") => Backend::Postgres,
        Err(_) => Backend::Sqlite,
    }
}

/// The PostgreSQL server URL from [`PG_URL_VAR`], by [`require_pg`]'s policy. Without one (outside
/// CI) the test binary stops here with exit status 0 after the `SKIPPED` line: it is called by the
/// harness of the `postgres` binary, where every test needs the server.
pub fn pg_server_url() -> String {
    require_pg().unwrap_or_else(|| std::process::exit(0))
}

/// A fresh, empty PostgreSQL database on the server at `server_url`; returns its URL.
pub async fn fresh_pg_database(server_url: &str) -> String {
    use sqlx::Connection as _;
    let name = format!("vw_{}", uuid::Uuid::new_v4().simple());
    let mut conn = sqlx::PgConnection::connect(server_url).await.expect("PostgreSQL test server reachable");
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}"))).execute(&mut conn).await.unwrap();
    let mut url: url::Url = server_url.parse().unwrap();
    url.set_path(&format!("/{name}"));
    url.to_string()
}

impl Harness {
    /// A harness on the [`backend`] the run selects.
    pub async fn new() -> Self {
        Self::on(backend()).await
    }

    /// A harness on `backend`; on PostgreSQL see [`pg_server_url`] for when no server is configured.
    pub async fn on(backend: Backend) -> Self {
        init_logs();
        let api = FakeApiServer::start().await.expect("fake apiserver starts");
        let pg_url = match backend {
            Backend::Sqlite => None,
            Backend::Postgres => Some(fresh_pg_database(&pg_server_url()).await),
        };
        Self { api, dir: tempfile::tempdir().unwrap(), pg_url }
    }

    /// The SQLite file (also on PostgreSQL, where nothing uses it).
    pub fn db_path(&self) -> PathBuf {
        self.dir.path().join("vipwatch.db")
    }

    /// Opens the harness's database directly (what vipwatch opens with [`Self::config`]).
    pub async fn store(&self) -> Store {
        Store::connect(&self.config().database).await.expect("database opens")
    }

    /// Loses the whole database (a volume that was not kept): removes the SQLite file, or drops and
    /// re-creates the PostgreSQL database. vipwatch must not be running.
    pub async fn wipe_database(&self) {
        match &self.pg_url {
            None => std::fs::remove_file(self.db_path()).unwrap(),
            Some(url) => {
                use sqlx::Connection as _;
                let name = url.parse::<url::Url>().unwrap().path().trim_start_matches('/').to_owned();
                let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
                let tables = "DROP SCHEMA public CASCADE; CREATE SCHEMA public";
                sqlx::raw_sql(tables).execute(&mut conn).await.unwrap_or_else(|e| panic!("wipe {name}: {e}"));
            }
        }
    }

    /// A config pointing at the fake apiserver (or `url`) and the harness's database.
    pub fn config_for(&self, url: &str) -> Config {
        let mut config = Config::default();
        config.kubernetes.url = Some(url.parse().unwrap());
        config.database.path = self.db_path();
        config.database.url = self.pg_url.as_deref().map(Secret::new);
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
    ///
    /// On SQLite it first waits until the database's lock file is free: a test that restarts
    /// vipwatch in this process may find the lock still held for a moment by a child that another
    /// test forked (an agent's HAProxy) before `exec` closed the inherited descriptor.
    pub async fn start(&self, config: Config) -> Running {
        if config.database.url.is_none() {
            let path = config.database.path.clone();
            wait_until("the database's lock file is free", || {
                let free = vipwatch::store::WriterLock::acquire(&path).is_ok();
                async move { free.then_some(()) }
            })
            .await;
        }
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

/// An address on 127.0.0.1 that refuses every connection for as long as this lives: its port is
/// bound but never listened on. A port bound and closed again goes back to the kernel's pool, and
/// another test's listener may be given it meanwhile (a flake seen under load: a replica meant to
/// reach no apiserver listed another test's simulated one); a bound port cannot be given out.
pub struct Refused {
    _socket: tokio::net::TcpSocket,
    /// The address (connections to it get `ECONNREFUSED`).
    pub addr: std::net::SocketAddr,
}

impl Refused {
    /// Binds a port on 127.0.0.1 without listening. Panics if no port can be bound.
    pub fn new() -> Self {
        let socket = tokio::net::TcpSocket::new_v4().expect("a TCP socket");
        socket.bind("127.0.0.1:0".parse().unwrap()).expect("a port on 127.0.0.1");
        let addr = socket.local_addr().unwrap();
        Self { _socket: socket, addr }
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
                            address: ip.to_string().into(),
                            port: np,
                            state: MemberState::Active,
                            node_name: Some((*n).into()),
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
    [(BackendMode::NodePort, Box::new(b))].into_iter().collect()
}

/// Seeds `n` LoadBalancer Services `bulk/svc-NNNN` on port 80 ([`lb_service`]).
pub fn seed_bulk(api: &FakeApiServer, n: usize) {
    api.seed((0..n).map(|i| lb_service("bulk", &format!("svc-{i:04}"), 80)));
}

/// Changes the port of every Service of [`seed_bulk`] twice, to 81 then 82, one round after the other.
pub fn change_bulk_twice(api: &FakeApiServer, n: usize) {
    for round in 1..=2 {
        change_bulk(api, n, round);
    }
}

/// One round of [`change_bulk_twice`]: the port of every Service of [`seed_bulk`] set to `80 + round`.
pub fn change_bulk(api: &FakeApiServer, n: usize, round: i32) {
    for i in 0..n {
        api.update("bulk", &format!("svc-{i:04}"), |o| o["spec"]["ports"][0]["port"] = json!(80 + round));
    }
}

/// The log after [`seed_bulk`] and [`change_bulk_twice`] of `n` Services: `3n` events, ids
/// increasing, and each Service's exactly ADDED 80, MODIFIED 81, MODIFIED 82.
pub fn assert_bulk_changed_twice(rows: &[EventRow], n: usize) {
    assert_eq!(rows.len(), 3 * n);
    assert!(rows.windows(2).all(|w| w[0].id < w[1].id), "ids increase");
    let mut per_service: std::collections::BTreeMap<&str, Vec<(&str, i32)>> = Default::default();
    for r in rows {
        per_service.entry(r.key.name.as_str()).or_default().push((r.event_type.as_str(), r.view.ports[0].port));
    }
    assert_eq!(per_service.len(), n);
    for (name, seen) in per_service {
        assert_eq!(seen, vec![("ADDED", 80), ("MODIFIED", 81), ("MODIFIED", 82)], "{name}");
    }
}

/// Waits until `store` holds the `3n` events of [`seed_bulk`] and [`change_bulk_twice`], then
/// checks them: ids exactly 1..=3n, [`assert_bulk_changed_twice`], and every Service's state row at
/// its last change (port 82).
pub async fn assert_bulk_recorded_in_order(store: &Store, n: usize) {
    let rows = wait_events(store, 3 * n).await;
    assert_eq!(rows.iter().map(|r| r.id).collect::<Vec<_>>(), (1..=3 * n as i64).collect::<Vec<_>>());
    assert_bulk_changed_twice(&rows, n);
    let state = services(store).await;
    assert_eq!(state.len(), n);
    assert!(state.iter().all(|s| s.view.ports[0].port == 82));
}
