//! The agent's one typed configuration: a TOML file (`--config`, default `vipwatch-haproxy.toml` when
//! it exists) merged with `VIPWATCH_HAPROXY_<KEY>` environment overrides (figment). Every key is in
//! docs/reference/agent-configuration.md, generated from these doc comments.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

/// The file read when `--config` is not given, if it exists.
pub const DEFAULT_CONFIG_FILE: &str = "vipwatch-haproxy.toml";

/// The prefix of the environment overrides (`VIPWATCH_HAPROXY_LISTEN=...`).
pub const ENV_PREFIX: &str = "VIPWATCH_HAPROXY_";

/// Variables with the prefix that are not keys: the config file (`--config`) and the log filter.
pub const NAMED_VARS: [&str; 2] = ["CONFIG", "LOG"];

/// Standard Webhooks keys are 24 to 64 random bytes (vipwatch refuses anything else).
const KEY_BYTES: std::ops::RangeInclusive<usize> = 24..=64;

/// A configuration that cannot be used; the message names the key.
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
    /// A key has the wrong type, or is unknown.
    #[error("{0}")]
    Invalid(String),
    /// A value parsed but cannot be used.
    #[error("invalid value for `{key}`: {reason}")]
    Value {
        /// The key.
        key: &'static str,
        /// Why.
        reason: String,
    },
}

/// The whole configuration. Unknown keys are errors.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct AgentConfig {
    /// Where vipwatch delivers (`POST` on any path), and where `/healthz`, `/state` and `/metrics` are served.
    pub listen: SocketAddr,
    /// Standard Webhooks secrets (`whsec_` + base64 of 24 to 64 bytes, as vipwatch requires): a delivery signed
    /// with any of them is accepted, so a secret can be rotated without downtime. `secrets` and `secret_files`
    /// together must name at least one. Never printed.
    #[serde(serialize_with = "redacted")]
    pub secrets: Vec<String>,
    /// Files holding one more secret each (trailing whitespace ignored).
    pub secret_files: Vec<PathBuf>,
    /// The agent's directory: `haproxy.cfg`, `state.json`, `master.sock`, `admin.sock`, `haproxy.pid`,
    /// `agent.lock`.
    pub dir: PathBuf,
    /// The HAProxy binary (a name is looked up on `PATH`).
    pub haproxy_bin: PathBuf,
    /// Server slots per backend come in multiples of this (1–1000): member changes inside the slots are applied
    /// through the Runtime API without a reload. Every slot is a server HAProxy parses, starts and holds on each
    /// reload, so more slots cost reload time and memory with thousands of Services.
    pub server_slots: usize,
    /// Deliveries arriving within this window of one that needs a reload share one render and one reload (at most
    /// `10s`); a members-only change does not wait for it.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("x-humantime" = true))]
    pub batch_window: Duration,
    /// How many deliveries the agent asks each vipwatch to keep in flight (1–4096), on every answer
    /// (`vipwatch-receiver-concurrency`): those arriving within `batch_window` share one reload, so a large
    /// change (a first sync, an agent starting empty) goes live in a few reloads. The endpoint's own `concurrency`
    /// in vipwatch's configuration wins over it. Each delivery in flight costs vipwatch its request and connection
    /// (tens of KB), so a lower number bounds vipwatch's memory during a large change.
    pub concurrency: usize,
    /// How long a reload may take to be confirmed (`show proc`) before the delivery gets a 503.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("x-humantime" = true))]
    pub reload_timeout: Duration,
    /// How long a delivery waits for its change to be live before it is answered 503 (`Retry-After: 1`; the change
    /// still completes, and vipwatch's retry is then answered 200). Keep it below the vipwatch endpoint's
    /// `timeout`, so vipwatch hears the answer.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("x-humantime" = true))]
    pub answer_timeout: Duration,
    /// HAProxy's `hard-stop-after`: old workers still draining long connections are stopped this long after a
    /// reload, so they do not pile up. At least `1s`.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("x-humantime" = true))]
    pub hard_stop_after: Duration,
    /// HAProxy's `mworker-max-reloads`: a worker that survived this many reloads is stopped.
    pub mworker_max_reloads: u32,
    /// How long the event log bound to a cluster name must have been silent before another vipwatch (another
    /// `data.log_id`) may take the name over, e.g. a vipwatch whose database was replaced. Until then its
    /// deliveries are refused with 409: two vipwatch claiming one `cluster.name` is a mistake to fix (give each
    /// cluster its own name), not something to apply. Silence is counted from the bound log's last delivery, or
    /// from the agent's start. At least `1s`.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("x-humantime" = true))]
    pub cluster_takeover_after: Duration,
    /// The clusters (`cluster.name` of each vipwatch delivering here) whose full resync the agent waits for after it
    /// starts: until each has gone live, `/healthz` answers 503 (not caught up), so keepalived does not give this host
    /// the VIPs. Empty: every cluster `state.json` knows at start (with no state, the first cluster to complete a
    /// resync). List them on an agent serving several clusters, so that one that lost its state waits for all of them
    /// before it replaces the configuration HAProxy runs; leave out a cluster whose vipwatch is gone for good.
    pub clusters: Vec<String>,
    /// Stop HAProxy when the agent stops. `false`: traffic keeps flowing while the agent is restarted or upgraded,
    /// and the next agent attaches to the running HAProxy. `true` also has the kernel stop it when the agent is
    /// killed (SIGKILL included): for demos and tests.
    pub stop_haproxy_on_exit: bool,
}

fn redacted<S: serde::Serializer>(v: &[String], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(v.iter().map(|_| "<redacted>"))
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 9080)),
            secrets: Vec::new(),
            secret_files: Vec::new(),
            dir: PathBuf::from("/var/lib/vipwatch-haproxy"),
            haproxy_bin: PathBuf::from("haproxy"),
            server_slots: 4,
            batch_window: Duration::from_millis(200),
            concurrency: vipwatch_contract::receiver::MAX_CONCURRENCY,
            reload_timeout: Duration::from_secs(10),
            answer_timeout: Duration::from_secs(8),
            hard_stop_after: Duration::from_secs(30 * 60),
            mworker_max_reloads: 50,
            cluster_takeover_after: Duration::from_secs(10 * 60),
            clusters: Vec::new(),
            stop_haproxy_on_exit: false,
        }
    }
}

impl AgentConfig {
    /// Defaults, then the TOML file, then `VIPWATCH_HAPROXY_*` variables; validated. Errors:
    /// [`ConfigError`] naming the key.
    pub fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        let config = Self::load_unchecked(path)?;
        config.validate()?;
        Ok(config)
    }

    /// [`Self::load`] without the checks that only `serve` needs (secrets): what `render` reads.
    /// Errors: an unreadable file or a key of the wrong type.
    pub fn load_unchecked(path: Option<&Path>) -> Result<Self, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(AgentConfig::default()));
        match path {
            Some(p) => {
                std::fs::File::open(p).map_err(|source| ConfigError::Unreadable { path: p.to_owned(), source })?;
                figment = figment.merge(Toml::file_exact(p));
            }
            None if Path::new(DEFAULT_CONFIG_FILE).exists() => figment = figment.merge(Toml::file(DEFAULT_CONFIG_FILE)),
            None => {}
        }
        let figment = figment.merge(Env::prefixed(ENV_PREFIX).ignore(&NAMED_VARS));
        let config: AgentConfig = figment.extract().map_err(|e| {
            let key = if e.path.is_empty() { String::new() } else { format!("`{}`: ", e.path.join(".")) };
            ConfigError::Invalid(format!("{key}{}", e.kind.to_string().trim_end()))
        })?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let bad = |key, reason: &str| Err(ConfigError::Value { key, reason: reason.to_owned() });
        if self.resolve_secrets()?.is_empty() {
            return bad(
                "secrets",
                "no secret configured: set `secrets` or `secret_files` (the endpoint's whsec_ secret in vipwatch)",
            );
        }
        if self.server_slots == 0 || self.server_slots > 1000 {
            return bad("server_slots", "must be between 1 and 1000");
        }
        if self.concurrency == 0 || self.concurrency > vipwatch_contract::receiver::MAX_CONCURRENCY {
            return bad("concurrency", "must be between 1 and 4096");
        }
        if self.reload_timeout < Duration::from_millis(100) {
            return bad("reload_timeout", "must be at least 100ms");
        }
        if self.batch_window > Duration::from_secs(10) {
            return bad("batch_window", "must be at most 10s (deliveries would time out)");
        }
        if self.answer_timeout < Duration::from_secs(1) || self.answer_timeout <= self.batch_window {
            return bad("answer_timeout", "must be at least 1s and longer than `batch_window`");
        }
        if self.hard_stop_after < Duration::from_secs(1) {
            return bad("hard_stop_after", "must be at least 1s (0 would cut every connection at each reload)");
        }
        if self.cluster_takeover_after < Duration::from_secs(1) {
            return bad(
                "cluster_takeover_after",
                "must be at least 1s (0 would let any vipwatch take any cluster's name)",
            );
        }
        if let Some(c) = self.clusters.iter().find(|c| !crate::state::is_dns_label(c)) {
            return Err(ConfigError::Value {
                key: "clusters",
                reason: format!("`{c}` is not a DNS-1123 label (vipwatch's cluster.name is one)"),
            });
        }
        if self.dir.as_os_str().is_empty() {
            return bad("dir", "must not be empty");
        }
        Ok(())
    }

    /// Every secret, from `secrets` and `secret_files`, each checked to be a Standard Webhooks secret:
    /// `whsec_` + base64 of 24 to 64 bytes, as vipwatch requires. Errors: [`ConfigError::Value`] for
    /// an unreadable file or a value that is not such a secret, naming the file.
    pub fn resolve_secrets(&self) -> Result<Vec<String>, ConfigError> {
        let mut out = Vec::new();
        for (i, s) in self.secrets.iter().enumerate() {
            check_secret(s)
                .map_err(|why| ConfigError::Value { key: "secrets", reason: format!("entry {}: {why}", i + 1) })?;
            out.push(s.clone());
        }
        for path in &self.secret_files {
            let invalid =
                |why: String| ConfigError::Value { key: "secret_files", reason: format!("{}: {why}", path.display()) };
            let text = std::fs::read_to_string(path).map_err(|e| invalid(e.to_string()))?;
            let secret = text.trim_end().to_owned();
            check_secret(&secret).map_err(invalid)?;
            out.push(secret);
        }
        Ok(out)
    }

    /// Runs `haproxy_bin -v`; its first line (the version). Errors: [`ConfigError::Value`] for
    /// `haproxy_bin` when it cannot run.
    pub fn check_haproxy(&self) -> Result<String, ConfigError> {
        let invalid = |why: String| ConfigError::Value {
            key: "haproxy_bin",
            reason: format!("{}: {why}", self.haproxy_bin.display()),
        };
        let out =
            std::process::Command::new(&self.haproxy_bin).arg("-v").output().map_err(|e| invalid(e.to_string()))?;
        if !out.status.success() {
            return Err(invalid(format!("`-v` exited with {}", out.status)));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        Ok(text.lines().next().unwrap_or_default().trim().to_owned())
    }

    /// The effective configuration as TOML, secrets redacted (`vipwatch-haproxy check-config`).
    pub fn to_redacted_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot render the configuration: {e}\n"))
    }
}

/// Why `s` is not a Standard Webhooks secret vipwatch would sign with; the secret is never echoed.
fn check_secret(s: &str) -> Result<(), String> {
    use base64::Engine;
    let not = || "not a Standard Webhooks secret (`whsec_` + base64 of 24 to 64 random bytes)".to_owned();
    let key = s.strip_prefix("whsec_").ok_or_else(not)?;
    let bytes = base64::engine::general_purpose::STANDARD.decode(key).map_err(|_| not())?;
    if !KEY_BYTES.contains(&bytes.len()) {
        return Err(format!("the key is {} bytes; Standard Webhooks keys are 24 to 64 random bytes", bytes.len()));
    }
    standardwebhooks::Webhook::new(s).map(|_| ()).map_err(|_| not())
}
