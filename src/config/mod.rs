//! The one typed configuration: a TOML file (`--config`, default `vipwatch.toml` when present) merged
//! with `VIPWATCH_*` environment overrides (figment). Every key is in docs/reference/configuration.md,
//! generated from these types' doc comments.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};
use url::Url;

use crate::model::{LabelSelector, Scope};

mod backends;
pub mod env;
mod guard;
mod pool;
mod relay;
pub mod schema;
mod template;

pub use backends::BackendsConfig;
pub use guard::GuardConfig;
pub use pool::PoolConfig;
pub use relay::{RelayConfig, RetryConfig, Secret, TlsConfig, WebhookConfig, forbidden_address, redact_url};
pub use template::{
    AuthConfig, BasicAuth, Check, Poll, RequestTemplate, SecretRef, TEMPLATE_EVENTS, TemplateConfig, TemplateMode,
};

/// The warning for each of [`Config::lone_appliances`].
pub const LONE_APPLIANCE: &str = "no other endpoint names this appliance: the endpoint gates the write-back alone (a typo in another host's `appliance`?)";

/// The file read when `--config` is not given, if it exists (otherwise built-in defaults apply).
pub const DEFAULT_CONFIG_FILE: &str = "vipwatch.toml";

/// A configuration that cannot be used. The message names the key and the problem; the CLI prints it
/// and exits with status 2.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// `--config` names a file that cannot be read.
    #[error("config file {path}: {source}")]
    Unreadable {
        /// The path given.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Parse or type error from the TOML file or an environment variable.
    #[error("{key}{problem} (from {origin})")]
    Invalid {
        /// "`dotted.key`: " (e.g. `kubernetes.manage_classless`); empty for a file that is not TOML.
        key: String,
        /// What is wrong.
        problem: String,
        /// Where the value came from: the file, or the `VIPWATCH_` environment variables.
        origin: String,
    },
    /// A `[[webhooks]]` entry is not acceptable.
    #[error("invalid value for `webhooks.{name}.{key}`: {reason}")]
    Webhook {
        /// The endpoint's `name`.
        name: String,
        /// The key within the entry, e.g. `secret`.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// A `[[pools]]` entry is not acceptable (names the pool and the reason).
    #[error(transparent)]
    Pool(#[from] crate::ipam::PoolError),
    /// A value parsed but is not acceptable.
    #[error("invalid value for `{key}`: {reason}")]
    Value {
        /// Dotted key, e.g. `kubernetes.url`.
        key: &'static str,
        /// What is wrong and what is expected.
        reason: String,
    },
}

/// The default group-commit interval (`database.commit_interval`): the least time between the
/// starts of two commits of the watch's writer, and between two relay rounds
/// (each endpoint's dispatcher); a relay round waits for the watch's next commit to carry it when that is
/// due within it. Changes that come faster than this share a commit; a change after a quiet spell
/// commits at once, and a plan of a full transaction's worth of changes (128) does not wait.
///
/// Each commit writes every page it touched into the WAL once (the event, its delivery and the
/// claims and completions riding with it, and their indexes), so this trades latency under load for
/// CPU: a shorter interval costs more CPU and more bytes written per change at a steady rate, a
/// longer one more latency (see docs/explanation/design-decisions.md). It also bounds what one
/// endpoint's relay delivers while every slot is busy: about `concurrency` deliveries per interval or
/// two, which is why the interval is shorter while the relay is backlogged
/// (`store::BACKLOG_COMMIT_INTERVAL`).
pub const DEFAULT_COMMIT_INTERVAL: Duration = Duration::from_millis(15);

/// The default period of the safety-net full relist (`kubernetes.relist_interval`).
pub const DEFAULT_RELIST_INTERVAL: Duration = Duration::from_secs(30 * 60);

/// The whole configuration. Unknown keys are errors.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// `[kubernetes]`: where and what to watch.
    pub kubernetes: KubernetesConfig,
    /// `[database]`: the SQLite file, or the PostgreSQL database replicas share.
    pub database: DatabaseConfig,
    /// `[server]`: the REST API listener.
    pub server: ServerConfig,
    /// `[relay]`: webhook dispatch settings.
    pub relay: RelayConfig,
    /// `[backends]`: pool members from Nodes and EndpointSlices.
    pub backends: BackendsConfig,
    /// `[[webhooks]]`: the outbound endpoints (the LB appliance).
    pub webhooks: Vec<WebhookConfig>,
    /// `[[pools]]`: address pools VIPs are allocated from; empty = vipwatch allocates nothing.
    pub pools: Vec<PoolConfig>,
    /// `[guard]`: the mass-deletion guard.
    pub guard: GuardConfig,
    /// `[cluster]`: the identity of the cluster this vipwatch serves.
    pub cluster: ClusterConfig,
}

/// `[cluster]` table.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// The name of the cluster this vipwatch serves, a DNS-1123 label (lower-case letters, digits and
    /// `-`, at most 63 characters). Every delivery carries it (`data.cluster`) and request templates
    /// see it (`cluster`), so one appliance can serve several clusters and keep their Services apart:
    /// give each cluster its own.
    ///
    /// Unset: derived from the cluster itself, `k8s-` and the first 12 hex digits of the uid of its
    /// `kube-system` namespace, which is unique per cluster and lives as long as it does, so two
    /// clusters built from the same manifests never share a name by accident (reading it needs `get`
    /// on that namespace; without it, vipwatch uses the name it derived before, else `vipwatch-` and
    /// 12 hex digits of its event log's id, and says so). The name in use is stored in the database,
    /// shown by `GET /api/v1/status`, and a change of it is logged.
    pub name: Option<String>,
}

/// `[kubernetes]` table.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct KubernetesConfig {
    /// API base URL, e.g. `http://127.0.0.1:8001` for `kubectl proxy`; no credentials are added to requests. `http`
    /// or `https` only. Unset: the kubeconfig (`KUBECONFIG` or `~/.kube/config`, with `context`), else the
    /// in-cluster service account.
    pub url: Option<Url>,
    /// The kubeconfig context to use when `url` is unset; unset: the kubeconfig's current context.
    pub context: Option<String>,
    /// Namespaces to watch; empty: all namespaces (one cluster-wide watch), else one watch per namespace.
    pub namespaces: Vec<String>,
    /// Label selector applied server-side to the list and the watch (Kubernetes syntax, e.g.
    /// `team=edge,tier!=dev`); empty: none.
    pub label_selector: String,
    /// Service types in scope: any of `ClusterIP`, `NodePort`, `LoadBalancer`, `ExternalName`; `["*"]`: every type.
    /// Only a `LoadBalancer` has VIPs: a Service of another type in scope is recorded and sent with `vips: []`.
    pub service_types: Vec<String>,
    /// A `LoadBalancer` Service whose `spec.loadBalancerClass` equals this is ours.
    pub load_balancer_class: String,
    /// Also take `LoadBalancer` Services with no `spec.loadBalancerClass`. A class naming another controller is
    /// never ours. Set `false` on a cluster where MetalLB or a cloud controller serves classless Services, and give
    /// vipwatch's Services the class `load_balancer_class`.
    pub manage_classless: bool,
    /// Server-side watch timeout (`timeoutSeconds`). A watch whose response head or next event (or BOOKMARK) does not
    /// come within 5 s longer is dropped as stalled (logged, `vipwatch_watch_errors_total{kind="stalled"}`) and resumed from
    /// the last `resourceVersion`. vipwatch asks for BOOKMARKs, so a healthy stream is never that quiet.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("x-humantime" = true))]
    pub watch_timeout: Duration,
    /// Period of a safety-net full relist: whatever a watch lost silently (a line the client dropped, a proxy that
    /// swallowed an event) is found and recorded with cause `relist`.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("x-humantime" = true))]
    pub relist_interval: Duration,
    /// Longest wait for a list response, its head and its whole body, counted from the request. Past it the list is
    /// dropped as stalled and retried with backoff. At least `1s`.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("x-humantime" = true))]
    pub list_timeout: Duration,
    /// TCP connect timeout towards the apiserver. At least `1s`. Connections also carry TCP keepalive (first probe
    /// after 30 s idle, then every 10 s, dropped after 3 unanswered: a dead peer is noticed in about a minute); a
    /// proxy that keeps answering TCP but stops forwarding is caught by `watch_timeout` and `list_timeout` instead.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("x-humantime" = true))]
    pub connect_timeout: Duration,
    /// `/readyz` answers 503 once a watch scope has been out of sync this long: counted from the end of its last
    /// healthy watch (or the last byte of a stalled one) while it is not watching. A healthy open watch is never
    /// stale however quiet, so this may be shorter than `watch_timeout`. At least `1s`.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("x-humantime" = true))]
    pub stale_after: Duration,
    /// Write `status.loadBalancer.ingress` of the Services whose VIPs vipwatch assigns (a pool, or an appliance
    /// with `assigns_vip`), once every subscribed appliance acknowledged the change carrying them (an endpoint, or
    /// one host of an `appliance` group); clear it once they acknowledged its withdrawal.
    pub write_status: bool,
    /// Put the `vipwatch.io/cleanup` finalizer on in-scope Services before their first delivery, so a deleted
    /// Service stays until every subscribed appliance (an endpoint, or one host of an `appliance` group)
    /// acknowledged its `DELETED` (a `404` or `410` answer counts).
    /// Remove it from every Service with `vipwatch release-finalizers` when uninstalling.
    pub finalizer: bool,
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        Self {
            url: None,
            context: None,
            namespaces: Vec::new(),
            label_selector: String::new(),
            service_types: vec!["LoadBalancer".to_owned()],
            load_balancer_class: "vipwatch.io/lb".to_owned(),
            manage_classless: true,
            watch_timeout: Duration::from_secs(290),
            relist_interval: DEFAULT_RELIST_INTERVAL,
            list_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(10),
            stale_after: Duration::from_secs(30),
            write_status: true,
            finalizer: true,
        }
    }
}

impl KubernetesConfig {
    /// The in-scope rule these keys describe.
    pub fn scope(&self) -> Scope {
        Scope {
            service_types: self.service_types.clone(),
            load_balancer_class: self.load_balancer_class.clone(),
            manage_classless: self.manage_classless,
        }
    }
}

/// `[database]` table.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseConfig {
    /// The SQLite file, created if missing (WAL mode, 8 KiB pages). Ignored when `url` is set.
    pub path: PathBuf,
    /// PostgreSQL instead of the SQLite file, for two or more replicas sharing it:
    /// `postgres://user:password@host:5432/vipwatch`; a unix socket:
    /// `postgres://user@localhost/vipwatch?host=/run/postgresql`; TLS:
    /// `?sslmode=verify-full&sslrootcert=/etc/vipwatch/pg-ca.pem` (rustls with the system's roots or that CA).
    /// Redacted in `check-config` and logs. Also `VIPWATCH_DATABASE__URL`.
    pub url: Option<Secret>,
    /// Events older than this, and finished deliveries (succeeded, superseded, failed) with their attempts, are
    /// pruned at start and then hourly; pending deliveries never are.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("x-humantime" = true))]
    pub event_retention: Duration,
    /// Longest wait between retries of a write the database refused (disk full, I/O error, locked by another
    /// process); retries start at 100 ms and double up to it, with jitter. 100ms–5m.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("x-humantime" = true))]
    pub write_retry_max_delay: Duration,
    /// The group commit: changes that come faster than this share one write transaction, and each endpoint's relay
    /// records its finished attempts and claims the next at most this often, riding those transactions. Lower: less
    /// latency under a sustained load and more deliveries per second per endpoint (about `concurrency` per interval
    /// or two while every slot is busy), more CPU per change. 0s–1s; `"0s"` commits each batch of changes as soon
    /// as the writer has it (no group commit).
    ///
    /// While an endpoint is backlogged (a round claimed every one of the 8 or more heads it asked for, after
    /// attempts that took less than this interval on average, one of them successful) the interval is at most 5 ms
    /// for the next 100 ms.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("x-humantime" = true))]
    pub commit_interval: Duration,
    /// PostgreSQL: how long the leader's lease lasts without renewal. A crashed, paused or cut-off leader is
    /// replaced this long after its last renewal, found at a follower's next bid: within `leader_ttl` +
    /// `leader_renew` of the crash; it stops acting itself `max(1s, leader_renew)` before that. Also sets the
    /// sessions' limits, so what a stopped leader's session holds is gone by then: the server ends a write
    /// statement after, and a transaction left idle after, (`leader_ttl` − `leader_renew`) / 2 each.
    /// 3s–5m, at least three `leader_renew`. The upstream cloud-controller-manager's default.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("x-humantime" = true))]
    pub leader_ttl: Duration,
    /// PostgreSQL: how often the leader renews its lease and followers bid for an expired one. 100ms–1m.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("x-humantime" = true))]
    pub leader_renew: Duration,
    /// PostgreSQL: a leader whose watch fails this long without a break gives the lease up and waits `leader_ttl`
    /// before bidding again, so a replica that can reach Kubernetes leads. Before its first lists are stored that
    /// is a scope's requests failing or stalling (a first list still being read counts as progress); after,
    /// `/readyz`'s watch check. 1s–1h.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("x-humantime" = true))]
    pub leader_step_down_after: Duration,
    /// PostgreSQL: this replica's name in the lease and in `GET /api/v1/status`. Unset: the host name plus a random
    /// suffix, new at every start. In Kubernetes: the pod name (`VIPWATCH_DATABASE__REPLICA` from the downward
    /// API).
    pub replica: Option<String>,
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        Self {
            path: PathBuf::from("vipwatch.db"),
            url: None,
            event_retention: Duration::from_secs(30 * 86_400),
            write_retry_max_delay: Duration::from_secs(5),
            commit_interval: DEFAULT_COMMIT_INTERVAL,
            leader_ttl: Duration::from_secs(15),
            leader_renew: Duration::from_secs(2),
            leader_step_down_after: Duration::from_secs(60),
            replica: None,
        }
    }
}

/// `[server]` table.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Address of the REST API, `host:port`.
    pub listen: SocketAddr,
    /// Bearer token required by every POST (and by reads with `require_auth_for_reads`), compared in constant time.
    /// Also `VIPWATCH_API_TOKEN`. Unset: every POST is refused with 403.
    pub api_token: Option<Secret>,
    /// Require the token for `/api/v1/**` GETs and `/metrics` too; `/healthz`, `/readyz`, `/openapi.json` and
    /// `/docs` stay open.
    pub require_auth_for_reads: bool,
    /// Browser origins allowed by CORS, e.g. `["https://ops.example.net"]`; empty: CORS off.
    pub cors_origins: Vec<Url>,
    /// Longest time a request may take (408 after); `"0s"`: no limit. The SSE stream is exempt once started.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("x-humantime" = true))]
    pub request_timeout: Duration,
    /// Largest request body accepted, in bytes (413 above).
    pub body_limit: usize,
    /// Threads of the async runtime that runs the watch, the relay and the API (tokio's workers), 1–64. One is
    /// enough and costs least: the work mostly waits on sockets and on the database connections' own threads, and a
    /// worker per core costs more CPU per change in wake-ups with no latency gained. What would hold the thread for
    /// long (rendering a full-state declaration) runs on tokio's blocking pool. A sustained load of thousands of
    /// changes per second is delivered sooner with 2 (and a shorter `database.commit_interval`), at more CPU per
    /// change.
    pub worker_threads: usize,
}

/// The shortest `relay.lease` accepted: a tenth of it (100 ms) is the margin between an attempt's
/// cut-off and the end of its lease, which a loaded machine's timers and scheduling must fit in
/// (with a lease of a few tens of ms, attempts are cut off several ms late, past their lease).
pub const MIN_LEASE: Duration = Duration::from_secs(1);

/// The longest `relay.lease` accepted (a day): leases are stored as Unix ms, and a longer one only
/// delays the retry of what a crashed process had claimed.
pub const MAX_LEASE: Duration = Duration::from_secs(86_400);

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            api_token: None,
            require_auth_for_reads: false,
            cors_origins: Vec::new(),
            request_timeout: Duration::from_secs(30),
            body_limit: 64 * 1024,
            worker_threads: 1,
        }
    }
}

const KNOWN_TYPES: [&str; 5] = ["*", "ClusterIP", "NodePort", "LoadBalancer", "ExternalName"];

impl Config {
    /// Loads defaults, then the TOML file (`path`, or [`DEFAULT_CONFIG_FILE`] if it exists), then
    /// `VIPWATCH_*` variables from `env` (`__` separates tables: `VIPWATCH_DATABASE__PATH`), and
    /// validates. Errors: [`ConfigError`], naming the key.
    pub fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        match path {
            Some(p) => {
                std::fs::File::open(p).map_err(|source| ConfigError::Unreadable { path: p.to_owned(), source })?;
                figment = figment.merge(Toml::file_exact(p));
            }
            None if Path::new(DEFAULT_CONFIG_FILE).exists() => figment = figment.merge(Toml::file(DEFAULT_CONFIG_FILE)),
            None => {}
        }
        env::log_ignored();
        let figment = figment.merge(env_provider()).merge(env::Strings::from_env());
        let mut config: Config = figment.extract().map_err(|e| invalid(named(&figment, e)))?;
        let dir = path.and_then(Path::parent).filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        for t in config.webhooks.iter_mut().filter_map(|w| w.template.as_mut()) {
            t.resolve_paths(dir);
        }
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let k = &self.kubernetes;
        if let Some(url) = &k.url
            && !matches!(url.scheme(), "http" | "https")
        {
            let reason = format!("scheme `{}` is not http or https", url.scheme());
            return Err(ConfigError::Value { key: "kubernetes.url", reason });
        }
        if k.service_types.is_empty() {
            return Err(ConfigError::Value { key: "kubernetes.service_types", reason: "must not be empty".into() });
        }
        if let Some(bad) = k.service_types.iter().find(|t| !KNOWN_TYPES.contains(&t.as_str())) {
            let reason = format!("`{bad}` is not one of {}", KNOWN_TYPES.join(", "));
            return Err(ConfigError::Value { key: "kubernetes.service_types", reason });
        }
        validate_namespaces(&k.namespaces)?;
        if let Some(url) = &self.database.url {
            let url = url.expose();
            if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
                let reason = "must be a postgres:// or postgresql:// URL (unset it to use the SQLite file `path`)";
                return Err(ConfigError::Value { key: "database.url", reason: reason.into() });
            }
            if let Err(e) = url.parse::<sqlx::postgres::PgConnectOptions>() {
                return Err(ConfigError::Value { key: "database.url", reason: format!("not a PostgreSQL URL: {e}") });
            }
        }
        if self.database.path.as_os_str().is_empty() {
            return Err(ConfigError::Value { key: "database.path", reason: "must not be empty".into() });
        }
        if self.database.event_retention < Duration::from_secs(60) {
            let reason = "must be at least 1m (a shorter retention would empty the event log)".into();
            return Err(ConfigError::Value { key: "database.event_retention", reason });
        }
        let retry = self.database.write_retry_max_delay;
        if !(Duration::from_millis(100)..=Duration::from_secs(300)).contains(&retry) {
            let reason = "must be between 100ms and 5m".into();
            return Err(ConfigError::Value { key: "database.write_retry_max_delay", reason });
        }
        if self.database.commit_interval > Duration::from_secs(1) {
            let reason = "must be at most 1s".into();
            return Err(ConfigError::Value { key: "database.commit_interval", reason });
        }
        self.validate_leader()?;
        if k.watch_timeout > Duration::from_secs(3600) {
            return Err(ConfigError::Value { key: "kubernetes.watch_timeout", reason: "must be at most 1h".into() });
        }
        LabelSelector::parse(&k.label_selector)
            .map_err(|e| ConfigError::Value { key: "kubernetes.label_selector", reason: e.to_string() })?;
        self.validate_webhooks()?;
        if self.server.api_token.as_ref().is_some_and(|t| t.expose().is_empty()) {
            let reason = "is empty; set a random token, or leave it unset to refuse every POST";
            return Err(ConfigError::Value { key: "server.api_token", reason: reason.into() });
        }
        if let Some(token) = &self.server.api_token
            && token.expose().contains("REPLACE_ME")
        {
            let reason =
                "is still the shipped placeholder; set a random token (e.g. `head -c 32 /dev/urandom | base64`)";
            return Err(ConfigError::Value { key: "server.api_token", reason: reason.into() });
        }
        if !(1..=64).contains(&self.server.worker_threads) {
            let reason = "must be between 1 and 64".into();
            return Err(ConfigError::Value { key: "server.worker_threads", reason });
        }
        crate::ipam::Pools::new(&self.pools)?;
        self.backends.validate()?;
        self.guard.validate()?;
        if let Some(name) = &self.cluster.name
            && !is_dns1123_label(name)
        {
            let reason = format!("`{name}` is not a DNS-1123 label (lower-case letters, digits and `-`, at most 63)");
            return Err(ConfigError::Value { key: "cluster.name", reason });
        }
        if k.relist_interval < Duration::from_secs(1) {
            return Err(ConfigError::Value { key: "kubernetes.relist_interval", reason: "must be at least 1s".into() });
        }
        if k.watch_timeout.as_secs() == 0 {
            return Err(ConfigError::Value { key: "kubernetes.watch_timeout", reason: "must be at least 1s".into() });
        }
        for (key, value) in [
            ("kubernetes.list_timeout", k.list_timeout),
            ("kubernetes.connect_timeout", k.connect_timeout),
            ("kubernetes.stale_after", k.stale_after),
        ] {
            if value < Duration::from_secs(1) {
                return Err(ConfigError::Value { key, reason: "must be at least 1s".into() });
            }
        }
        Ok(())
    }

    /// `database.leader_ttl`, `leader_renew` and `leader_step_down_after` in range, the lease outliving three renewals
    /// (client-go's rule: the lease duration exceeds the renew deadline, which exceeds the retry
    /// period times its jitter), and a replica name that is not blank.
    fn validate_leader(&self) -> Result<(), ConfigError> {
        let d = &self.database;
        if !(Duration::from_secs(3)..=Duration::from_secs(300)).contains(&d.leader_ttl) {
            return Err(ConfigError::Value { key: "database.leader_ttl", reason: "must be between 3s and 5m".into() });
        }
        if !(Duration::from_millis(100)..=Duration::from_secs(60)).contains(&d.leader_renew) {
            let reason = "must be between 100ms and 1m".into();
            return Err(ConfigError::Value { key: "database.leader_renew", reason });
        }
        if d.leader_renew * 3 > d.leader_ttl {
            let reason = format!(
                "must be at least three times database.leader_renew ({}), or one missed renewal loses the lease",
                humantime::format_duration(d.leader_renew)
            );
            return Err(ConfigError::Value { key: "database.leader_ttl", reason });
        }
        if !(Duration::from_secs(1)..=Duration::from_secs(3600)).contains(&d.leader_step_down_after) {
            let reason = "must be between 1s and 1h".into();
            return Err(ConfigError::Value { key: "database.leader_step_down_after", reason });
        }
        if d.replica.as_deref().is_some_and(|r| r.trim().is_empty() || r.len() > 200) {
            let reason = "must not be blank and at most 200 characters; unset it for the host name".into();
            return Err(ConfigError::Value { key: "database.replica", reason });
        }
        Ok(())
    }

    fn validate_webhooks(&self) -> Result<(), ConfigError> {
        if !(MIN_LEASE..=MAX_LEASE).contains(&self.relay.lease) {
            let reason = "must be between 1s and 24h: an attempt is cut off a tenth of the lease before it ends, \
                          which needs room for a busy machine's scheduling; a longer one only delays the retry of \
                          what a crashed process had claimed"
                .into();
            return Err(ConfigError::Value { key: "relay.lease", reason });
        }
        let mut names = std::collections::HashSet::new();
        for w in &self.webhooks {
            w.validate()?;
            if w.signs() {
                w.resolve_secret()?;
            }
            if !names.insert(&w.name) {
                let reason = format!("`{}` is used by more than one endpoint", w.name);
                return Err(ConfigError::Value { key: "webhooks.name", reason });
            }
            let polls = w.template.iter().flat_map(|t| t.named_requests()).filter_map(|(_, r)| r.poll.as_ref());
            // An attempt is cut off at nine tenths of the lease (`RelayConfig::attempt_limit`).
            let limit = self.relay.attempt_limit();
            if let Some(p) = polls.max_by_key(|p| p.deadline)
                && p.deadline.saturating_add(w.timeout.saturating_mul(2)) >= limit
            {
                let reason = format!(
                    "nine tenths of it must be longer than a poll deadline plus two timeouts (`{}` polls up to {:?})",
                    w.name, p.deadline
                );
                return Err(ConfigError::Value { key: "relay.lease", reason });
            }
            if w.timeout >= limit {
                let reason = format!(
                    "nine tenths of it must be longer than every webhook timeout (`{}` has {:?})",
                    w.name, w.timeout
                );
                return Err(ConfigError::Value { key: "relay.lease", reason });
            }
        }
        self.validate_appliances()?;
        if self.relay.poll_interval < Duration::from_millis(10) {
            return Err(ConfigError::Value { key: "relay.poll_interval", reason: "must be at least 10ms".into() });
        }
        if self.relay.concurrency == 0 {
            return Err(ConfigError::Value { key: "relay.concurrency", reason: "must be at least 1".into() });
        }
        Ok(())
    }

    /// The hosts of one `appliance` serve the same VIPs, so each must get the same Services and the
    /// same kinds of event: a failover to a host that was sent less would drop Services. Errors:
    /// [`ConfigError::Value`] on `webhooks.appliance` naming the two endpoints and what differs
    /// (`events` or `namespaces` as sets, `label_selector`, the effective `backend_mode`).
    fn validate_appliances(&self) -> Result<(), ConfigError> {
        for (i, a) in self.webhooks.iter().enumerate() {
            let Some(group) = a.appliance.as_deref() else { continue };
            for b in self.webhooks[i + 1..].iter().filter(|b| b.appliance.as_deref() == Some(group)) {
                fn set(v: &[String]) -> std::collections::BTreeSet<&str> {
                    v.iter().map(String::as_str).collect()
                }
                let mode = |w: &WebhookConfig| w.backend_mode.unwrap_or(self.backends.mode);
                let differs = [
                    ("events", set(&a.events) != set(&b.events)),
                    ("namespaces", set(&a.namespaces) != set(&b.namespaces)),
                    ("label_selector", a.label_selector.trim() != b.label_selector.trim()),
                    ("backend_mode", mode(a) != mode(b)),
                ];
                if let Some((key, _)) = differs.iter().find(|(_, d)| *d) {
                    let reason = format!(
                        "`{}` and `{}` are hosts of appliance `{group}` but differ in `{key}`: the hosts of one \
                         appliance serve the same VIPs, so each must get the same Services",
                        a.name, b.name
                    );
                    return Err(ConfigError::Value { key: "webhooks.appliance", reason });
                }
            }
        }
        Ok(())
    }

    /// `appliance` names that only one enabled endpoint carries, with that endpoint: legal (the
    /// endpoint is then an appliance of its own), but more often a typo for another host's name. For
    /// the warning [`LONE_APPLIANCE`], at start and in `check-config`.
    pub fn lone_appliances(&self) -> Vec<(&str, &str)> {
        let enabled = || self.webhooks.iter().filter(|w| w.enabled);
        enabled()
            .filter_map(|w| w.appliance.as_deref().map(|a| (w.name.as_str(), a)))
            .filter(|(_, a)| enabled().filter(|w| w.appliance.as_deref() == Some(a)).count() == 1)
            .collect()
    }

    /// The endpoints whose acknowledgements gate a write to Kubernetes, by appliance
    /// ([`crate::model::Gates`]): every enabled endpoint that delivers per Service (full-state
    /// declarations gate nothing), those naming one `appliance` together, the rest each alone; in
    /// the order of `[[webhooks]]`.
    pub fn gates(&self) -> crate::model::Gates {
        let mut appliances: Vec<(Option<&str>, Vec<String>)> = Vec::new();
        for w in self.webhooks.iter().filter(|w| w.enabled && !w.declares_full_state()) {
            match appliances.iter_mut().find(|(a, _)| a.is_some() && *a == w.appliance.as_deref()) {
                Some((_, hosts)) => hosts.push(w.name.clone()),
                None => appliances.push((w.appliance.as_deref(), vec![w.name.clone()])),
            }
        }
        crate::model::Gates::new(appliances.into_iter().map(|(_, hosts)| hosts).collect())
    }

    /// The backend mode of everything, and the endpoints that override it.
    pub fn mode_plan(&self) -> crate::model::backends::ModePlan {
        let endpoints =
            self.webhooks.iter().filter(|w| w.enabled).filter_map(|w| Some((w.name.clone(), w.backend_mode?)));
        crate::model::backends::ModePlan { global: self.backends.mode, endpoints: endpoints.collect() }
    }

    /// The effective configuration as TOML, with secrets redacted (for `vipwatch check-config`).
    pub fn to_redacted_toml(&self) -> String {
        let mut copy = self.clone();
        if let Some(url) = copy.kubernetes.url.as_mut() {
            *url = Url::parse(&redact_url(url)).unwrap_or_else(|_| url.clone());
        }
        for w in &mut copy.webhooks {
            w.url = Url::parse(&redact_url(&w.url)).unwrap_or_else(|_| w.url.clone());
        }
        toml::to_string_pretty(&copy).unwrap_or_else(|e| format!("# cannot render config: {e}\n"))
    }
}

/// Namespace names are DNS-1123 labels (lower-case alphanumerics and `-`, at most 63 characters), each
/// listed once: a typo would silently watch nothing and report every Service there as DELETED.
fn validate_namespaces(namespaces: &[String]) -> Result<(), ConfigError> {
    let mut seen = std::collections::HashSet::new();
    for ns in namespaces {
        if !is_dns1123_label(ns) {
            let reason = format!("`{ns}` is not a valid namespace name (DNS-1123 label)");
            return Err(ConfigError::Value { key: "kubernetes.namespaces", reason });
        }
        if !seen.insert(ns) {
            return Err(ConfigError::Value { key: "kubernetes.namespaces", reason: format!("`{ns}` is listed twice") });
        }
    }
    Ok(())
}

/// Whether `s` is a DNS-1123 label (lower-case alphanumerics and `-`, not at either end, 1 to 63
/// characters), the rule for namespace names.
pub fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// An element of `webhooks` or `pools`, for its name only.
#[derive(Deserialize)]
struct Named {
    name: Option<String>,
}

/// `e` with an element of `webhooks` or `pools` named as the rest of the config errors name it
/// (`webhooks.lab.timeout`), not by its index (`webhooks.0.timeout`, figment's path), when that
/// element has a name.
fn named(figment: &Figment, mut e: figment::Error) -> figment::Error {
    if let [table, index, ..] = e.path.as_mut_slice()
        && matches!(table.as_str(), "webhooks" | "pools")
        && let Ok(i) = index.parse::<usize>()
        && let Ok(elements) = figment.extract_inner::<Vec<Named>>(table)
        && let Some(name) = elements.get(i).and_then(|n| n.name.clone())
    {
        *index = name;
    }
    e
}

/// Turns figment's error into one line naming the key (lower-case, dotted), the problem and the source.
fn invalid(e: figment::Error) -> ConfigError {
    let origin = match &e.metadata {
        Some(m) => match &m.source {
            Some(source) => source.to_string(),
            None => m.name.to_string(),
        },
        None => "defaults".to_owned(),
    };
    let key = if e.path.is_empty() { String::new() } else { format!("`{}`: ", e.path.join(".").to_ascii_lowercase()) };
    ConfigError::Invalid { key, problem: e.kind.to_string().trim_end().to_owned(), origin }
}

/// `VIPWATCH_<TABLE>__<KEY>` variables, plus `VIPWATCH_API_TOKEN` for `server.api_token`; every other
/// `VIPWATCH_*` variable is not configuration (see [`env`]).
fn env_provider() -> Env {
    Env::prefixed(env::PREFIX).filter_map(|rest| match env::classify_rest(rest.as_str()) {
        // String keys come raw from env::Strings: figment would read `12345` as a number.
        env::EnvVar::Key(dotted) if env::is_string_key(&dotted) => None,
        env::EnvVar::Key(dotted) => Some(dotted.into()),
        env::EnvVar::Named | env::EnvVar::Ignored { .. } => None,
    })
}
