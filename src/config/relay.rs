//! `[relay]` and `[[webhooks]]`: the outbound webhook endpoints (the LB appliance) and how deliveries
//! to them are dispatched and retried.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};
use serde::{Deserialize, Serialize, Serializer};
use url::{Host, Url};

use super::ConfigError;

/// A secret value: deserialized from the config as given, never printed. `Debug` and `Serialize`
/// (used by `check-config`) show `"<redacted>"`.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself: pass it to the signer or the HTTP header, never to a log.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

/// `url` for display: a password in the userinfo and every query value replaced by `REDACTED`
/// (appliance URLs sometimes carry tokens). Used by `check-config`, logs and the API.
pub fn redact_url(url: &Url) -> String {
    let mut copy = url.clone();
    if copy.password().is_some() {
        let _ = copy.set_password(Some("REDACTED"));
    }
    if copy.query().is_some() {
        let pairs: Vec<(String, String)> =
            copy.query_pairs().map(|(k, _)| (k.into_owned(), "REDACTED".to_owned())).collect();
        copy.query_pairs_mut().clear().extend_pairs(pairs);
    }
    copy.to_string()
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str("<redacted>")
    }
}

/// `[relay]`: dispatcher settings shared by every endpoint.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RelayConfig {
    /// Deliveries in flight at once per endpoint, each for a different Service. Per endpoint:
    /// `webhooks.concurrency`, or what the receiver asks for (`vipwatch-receiver-concurrency`) when that is unset.
    pub concurrency: usize,
    /// How long a claimed delivery is reserved for its attempt, 1s–24h. Nine tenths of it must exceed every webhook
    /// `timeout` (and a poll's `deadline` plus two timeouts): an attempt still running at nine tenths of it after
    /// its claim (a request template's chain of requests, each within its `timeout`, or a claim that waited for a
    /// busy machine) is cut off, recorded as a `timeout` and retried, so no attempt outlives its lease. Leases are
    /// cleared at start: after a crash, what was in flight is sent again.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("x-humantime" = true))]
    pub lease: Duration,
    /// On SIGTERM or Ctrl-C: how long in-flight attempts may finish; the rest stay pending.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("x-humantime" = true))]
    pub shutdown_grace: Duration,
    /// Fallback poll for work enqueued by another process (`vipwatch resync`), and the period at which status
    /// write-back and finalizer removal look at delivery outcomes.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("x-humantime" = true))]
    pub poll_interval: Duration,
    /// Consecutive attempts that find an endpoint down (no answer, redirect, 5xx, 401, 403, 408, 429) after which
    /// its circuit opens: one probe at a time on the retry schedule until it answers. `0` disables the breaker. Per
    /// endpoint: `webhooks.circuit_failures`.
    pub circuit_failures: u32,
}

impl RelayConfig {
    /// How long one attempt may run: nine tenths of `lease`, so that its outcome is recorded while
    /// the delivery is still leased; the dispatcher cuts a longer one off as a `timeout`, retried.
    /// An attempt past its lease counts as not in flight: the relay may claim the delivery again,
    /// and a newer `MODIFIED` may supersede it as an untouched head, so that change could go out
    /// while the older one is still being sent (a request template of several requests, each within
    /// its `timeout`, can run past the lease). Every webhook `timeout`, and a
    /// poll's deadline plus two timeouts, must stay below it (checked at load); a chain of requests
    /// is bounded only by this.
    pub fn attempt_limit(&self) -> Duration {
        self.lease - self.lease / 10
    }
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            concurrency: 32,
            lease: Duration::from_secs(60),
            shutdown_grace: Duration::from_secs(10),
            poll_interval: Duration::from_secs(1),
            circuit_failures: 5,
        }
    }
}

/// `retry = { ... }` of a webhook: exponential backoff with jitter between attempts.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RetryConfig {
    /// Give up (delivery `failed`: kept, replayable) after this many attempts.
    pub max_attempts: u32,
    /// Give up once a delivery is this old (since enqueued) and its last attempt failed.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("x-humantime" = true))]
    pub max_age: Duration,
    /// Delay after the first failure; doubles per attempt, with jitter.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("x-humantime" = true))]
    pub initial_delay: Duration,
    /// Ceiling of the delay between attempts; also the clamp for a receiver's `Retry-After`.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("x-humantime" = true))]
    pub max_delay: Duration,
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self {
            max_attempts: 400,
            max_age: Duration::from_secs(24 * 3600),
            initial_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(300),
        }
    }
}

/// `tls = { ... }` of a webhook: private CA and client certificate (mTLS), as appliances need.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// PEM bundle of CA certificates trusted in addition to the system roots (a self-signed appliance).
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate chain, for mTLS (with `client_key_file`).
    pub client_cert_file: Option<PathBuf>,
    /// PEM private key of the client certificate (with `client_cert_file`).
    pub client_key_file: Option<PathBuf>,
}

/// One `[[webhooks]]` table: an outbound endpoint.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WebhookConfig {
    /// Unique endpoint name, used in the API, metrics and the delivery log: non-empty, no `/`, `.` or spaces.
    pub name: String,
    /// The `http` or `https` URL that receives a POST per delivery (with a `template`: the base that relative
    /// request URLs are appended to). A link-local or cloud-metadata address is refused unless `allow_link_local`.
    pub url: Url,
    /// The Standard Webhooks secret: `whsec_` + base64 of 24 to 64 random bytes (e.g. `echo whsec_$(head -c 32
    /// /dev/urandom | base64)`). Exactly one of `secret`, `secret_file`, `secret_env` is required (a template
    /// endpoint needs one only with `sign = true`). Never printed.
    #[serde(default)]
    pub secret: Option<Secret>,
    /// A file holding the secret (trailing whitespace ignored), instead of `secret`.
    #[serde(default)]
    pub secret_file: Option<PathBuf>,
    /// An environment variable holding the secret (trailing whitespace ignored), instead of `secret`.
    #[serde(default)]
    pub secret_env: Option<String>,
    /// Which event types this endpoint receives: `ADDED`, `MODIFIED`, `DELETED`. `service.synced` (a resync) is
    /// always sent. An endpoint without `MODIFIED` never hears of an address assigned after the `ADDED` (vipwatch
    /// warns at start).
    #[serde(default = "all_events")]
    pub events: Vec<String>,
    /// Only Services in these namespaces; empty: every namespace in scope.
    #[serde(default)]
    pub namespaces: Vec<String>,
    /// Only Services whose labels match (before or after the change); empty: all.
    #[serde(default)]
    pub label_selector: String,
    /// Limit of one attempt: connect, request and the whole response body. An answer not complete within it is a
    /// `timeout`, retried.
    #[serde(default = "default_timeout", with = "humantime_serde")]
    #[schemars(with = "String", extend("x-humantime" = true))]
    pub timeout: Duration,
    /// TCP and TLS connect limit.
    #[serde(default = "default_connect_timeout", with = "humantime_serde")]
    #[schemars(with = "String", extend("x-humantime" = true))]
    pub connect_timeout: Duration,
    /// Static extra headers, e.g. `{ Authorization = "Bearer ..." }` (an appliance API token). Values are secrets:
    /// never logged or printed.
    #[serde(default)]
    pub headers: BTreeMap<String, Secret>,
    /// TLS settings: a private CA, a client certificate.
    #[serde(default)]
    pub tls: TlsConfig,
    /// Retry policy: exponential backoff with jitter between attempts, and when to give up.
    #[serde(default)]
    pub retry: RetryConfig,
    /// `false`: nothing is enqueued for or sent to this endpoint.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// The appliance chooses the VIP: the `{"vips": ["…"]}` or `{"hostname": "…"}` in its 2xx response body becomes
    /// the Service's address (`source = "appliance"`), instead of a pool allocation. An empty body keeps what it
    /// had.
    #[serde(default)]
    pub assigns_vip: bool,
    /// The appliance this endpoint is one host of, when several endpoints are the hosts of one appliance (a pair of
    /// load-balancer hosts behind keepalived, each with its own agent): endpoints naming the same `appliance` are
    /// one appliance to the Kubernetes write-back, so a status, a finalizer's removal and a pool address's release
    /// wait for one of them, not all. Each host still gets every delivery; one that lags catches up before it takes
    /// the VIPs. Unset: the endpoint is an appliance of its own. Same rules as `name`; not with `assigns_vip` or a
    /// full-state template; the hosts of one appliance must have the same `events`, `namespaces`,
    /// `label_selector` and `backend_mode` (each must get the same Services). A name only one endpoint
    /// carries draws a warning.
    #[serde(default)]
    pub appliance: Option<String>,
    /// This endpoint's backend mode (`nodePort`, `pod` or `none`) instead of `[backends] mode`; a Service's
    /// `vipwatch.io/backend-mode` annotation still wins.
    #[serde(default)]
    pub backend_mode: Option<crate::model::backends::ModeSetting>,
    /// Deliveries in flight at once to this endpoint (each for a different Service) instead of `relay.concurrency`,
    /// 1–4096: fewer for an appliance API with a rate limit. Unset, a receiver that says how many it takes at once
    /// (the HAProxy agent: `vipwatch-receiver-concurrency` in its answers, as it batches many Services into one
    /// reload) gets that many after its first answers; set, this number wins.
    #[serde(default)]
    pub concurrency: Option<usize>,
    /// This endpoint's circuit breaker threshold instead of `relay.circuit_failures`; `0` disables its breaker.
    #[serde(default)]
    pub circuit_failures: Option<u32>,
    /// Allow a `url`, or an address its host name resolves to, in the link-local or cloud-metadata ranges
    /// (`169.254.0.0/16`, `fe80::/10`, `fd00:ec2::254`, `100.100.100.200`); refused by default.
    #[serde(default)]
    pub allow_link_local: bool,
    /// Requests in the appliance's own API (F5 AS3, NetScaler NITRO, a REST portal) instead of the default signed
    /// POST; see `[webhooks.template]`.
    #[serde(default)]
    pub template: Option<super::TemplateConfig>,
}

/// Why `ip` is refused as a webhook target, or `None` when it is allowed (a URL
/// must not reach a node's link-local services or a cloud's instance-metadata service, which hands
/// out credentials). Refused: IPv4 link-local `169.254.0.0/16` (AWS, GCP, Azure, OpenStack and
/// Oracle metadata at `169.254.169.254`, the ECS task endpoint at `169.254.170.2`), IPv6 link-local
/// `fe80::/10`, AWS's IPv6 metadata `fd00:ec2::254` and Alibaba Cloud's metadata `100.100.100.200`.
/// An IPv6 address embedding an IPv4 one — mapped `::ffff:a.b.c.d`, compatible `::a.b.c.d`, NAT64
/// `64:ff9b::/96` — is judged by the IPv4 address. Decimal, hex and octal IPv4 spellings
/// (`2852039166`, `0xa9fea9fe`, `0251.0376.0251.0376`) are normalised by the URL parser before this.
pub fn forbidden_address(ip: IpAddr) -> Option<&'static str> {
    const LINK_LOCAL_V4: Ipv4Net = Ipv4Net::new_assert(Ipv4Addr::new(169, 254, 0, 0), 16);
    const LINK_LOCAL_V6: Ipv6Net = Ipv6Net::new_assert(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0), 10);
    const NAT64: Ipv6Net = Ipv6Net::new_assert(Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0), 96);
    const AWS_METADATA_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254);
    const ALIBABA_METADATA: Ipv4Addr = Ipv4Addr::new(100, 100, 100, 200);
    let v4 = match ip {
        IpAddr::V4(v4) => v4,
        IpAddr::V6(v6) if v6 == AWS_METADATA_V6 => return Some("a cloud instance-metadata address"),
        IpAddr::V6(v6) if LINK_LOCAL_V6.contains(&v6) => return Some("an IPv6 link-local address (fe80::/10)"),
        IpAddr::V6(v6) if NAT64.contains(&v6) => Ipv4Addr::from_bits(v6.to_bits() as u32),
        // `to_ipv4` also turns `::1` into 0.0.0.1: harmless, that is no forbidden address.
        IpAddr::V6(v6) => v6.to_ipv4()?,
    };
    if v4 == ALIBABA_METADATA {
        Some("a cloud instance-metadata address")
    } else if LINK_LOCAL_V4.contains(&v4) {
        Some("an IPv4 link-local / instance-metadata address (169.254.0.0/16)")
    } else {
        None
    }
}

/// Reads a secret given inline, in a file or in an environment variable (exactly one; a file's or a
/// variable's trailing whitespace is dropped). Errors: `(key, reason)` naming the offending key
/// (`secret`, `secret_file` or `secret_env`).
pub(super) fn read_secret(
    secret: &Option<Secret>,
    file: &Option<PathBuf>,
    env: &Option<String>,
) -> Result<Secret, (&'static str, String)> {
    let value = match (secret, file, env) {
        (Some(s), None, None) => s.expose().to_owned(),
        (None, Some(path), None) => std::fs::read_to_string(path)
            .map_err(|e| ("secret_file", format!("{}: {e}", path.display())))?
            .trim_end()
            .to_owned(),
        // Trimmed like a file: a Secret created from a file (`kubectl create secret --from-file`)
        // and passed with `envFrom` carries the file's trailing newline.
        (None, None, Some(var)) => {
            std::env::var(var).map_err(|_| ("secret_env", format!("`{var}` is not set")))?.trim_end().to_owned()
        }
        (None, None, None) => return Err(("secret", "one of secret, secret_file, secret_env is required".into())),
        _ => return Err(("secret", "set only one of secret, secret_file, secret_env".into())),
    };
    Ok(Secret(value))
}

fn all_events() -> Vec<String> {
    ["ADDED", "MODIFIED", "DELETED"].map(str::to_owned).to_vec()
}
fn default_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_connect_timeout() -> Duration {
    Duration::from_secs(5)
}
fn yes() -> bool {
    true
}

impl WebhookConfig {
    /// Whether this endpoint sends one declaration of every Service (`template.mode = "full_state"`)
    /// rather than a delivery per Service. Its acknowledgements gate nothing in Kubernetes: neither
    /// a status, nor a finalizer's removal, nor a pool address's release.
    pub fn declares_full_state(&self) -> bool {
        self.template.as_ref().is_some_and(|t| t.mode == super::TemplateMode::FullState)
    }

    /// Resolves the secret from `secret`, `secret_file` or `secret_env` (exactly one must be set).
    /// Errors: [`ConfigError::Value`] naming `webhooks.<name>.secret*` when none, several, or an
    /// unreadable source is given, or when the value is not a valid Standard Webhooks secret.
    pub fn resolve_secret(&self) -> Result<Secret, ConfigError> {
        let value = read_secret(&self.secret, &self.secret_file, &self.secret_env)
            .map_err(|(key, reason)| self.invalid(key, reason))?
            .0;
        let not_a_secret = || self.invalid("secret", "not a Standard Webhooks secret (`whsec_` + base64 key)".into());
        let key = value.strip_prefix("whsec_").ok_or_else(not_a_secret)?;
        let key =
            base64::Engine::decode(&base64::engine::general_purpose::STANDARD, key).map_err(|_| not_a_secret())?;
        if !(24..=64).contains(&key.len()) {
            let reason = format!("the key is {} bytes; Standard Webhooks keys are 24 to 64 random bytes", key.len());
            return Err(self.invalid("secret", reason));
        }
        standardwebhooks::Webhook::new(&value).map_err(|_| not_a_secret())?;
        Ok(Secret(value))
    }

    /// Whether requests carry Standard Webhooks signatures (so the secret is needed): always for plain
    /// webhooks, `template.sign` for templated ones.
    pub fn signs(&self) -> bool {
        self.template.as_ref().is_none_or(|t| t.sign)
    }

    fn invalid(&self, key: &str, reason: String) -> ConfigError {
        ConfigError::Webhook { name: self.name.clone(), key: key.to_owned(), reason }
    }

    fn validate_tls_files(&self) -> Result<(), ConfigError> {
        let files = [
            ("tls.ca_file", &self.tls.ca_file),
            ("tls.client_cert_file", &self.tls.client_cert_file),
            ("tls.client_key_file", &self.tls.client_key_file),
        ];
        for (key, path) in files {
            let Some(path) = path else { continue };
            let pem = std::fs::read(path).map_err(|e| self.invalid(key, format!("{}: {e}", path.display())))?;
            if !pem.windows(11).any(|w| w == b"-----BEGIN ") {
                return Err(self.invalid(key, format!("{} is not a PEM file", path.display())));
            }
        }
        if let Some(path) = &self.tls.ca_file {
            let pem = std::fs::read(path).unwrap_or_default();
            reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| self.invalid("tls.ca_file", format!("{}: {e}", path.display())))?;
        }
        Ok(())
    }

    /// Checks everything but the secret. Errors: [`ConfigError::Webhook`] naming the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.name.is_empty() || self.name.contains(['/', ' ', '.']) {
            return Err(self.invalid("name", "must be non-empty, without `/`, `.` or spaces".into()));
        }
        if !matches!(self.url.scheme(), "http" | "https") {
            return Err(self.invalid("url", format!("scheme `{}` is not http or https", self.url.scheme())));
        }
        let ip = match self.url.host() {
            Some(Host::Ipv4(v4)) => Some(IpAddr::V4(v4)),
            Some(Host::Ipv6(v6)) => Some(IpAddr::V6(v6)),
            Some(Host::Domain(_)) | None => None,
        };
        if let Some(why) = ip.and_then(forbidden_address)
            && !self.allow_link_local
        {
            let reason = format!(
                "{} points at {} ({why}); set allow_link_local = true if that is really the appliance",
                redact_url(&self.url),
                ip.map(|ip| ip.to_string()).unwrap_or_default()
            );
            return Err(self.invalid("url", reason));
        }
        if let Some(bad) = self.events.iter().find(|e| !["ADDED", "MODIFIED", "DELETED"].contains(&e.as_str())) {
            return Err(self.invalid("events", format!("`{bad}` is not ADDED, MODIFIED or DELETED")));
        }
        if self.timeout.is_zero() || self.connect_timeout.is_zero() {
            return Err(self.invalid("timeout", "timeouts must be positive".into()));
        }
        if self.concurrency.is_some_and(|c| c == 0 || c > 4096) {
            return Err(self.invalid("concurrency", "must be between 1 and 4096".into()));
        }
        if self.retry.max_attempts == 0 || self.retry.initial_delay.is_zero() {
            return Err(self.invalid("retry", "max_attempts and initial_delay must be positive".into()));
        }
        if self.tls.client_cert_file.is_some() != self.tls.client_key_file.is_some() {
            return Err(self.invalid("tls", "client_cert_file and client_key_file go together".into()));
        }
        for (header, value) in &self.headers {
            if reqwest::header::HeaderName::from_bytes(header.as_bytes()).is_err() {
                return Err(self.invalid("headers", format!("`{header}` is not a valid header name")));
            }
            if reqwest::header::HeaderValue::from_str(value.expose()).is_err() {
                return Err(self.invalid("headers", format!("the value of `{header}` is not a valid header value")));
            }
        }
        if let Some(appliance) = &self.appliance {
            if appliance.is_empty() || appliance.contains(['/', ' ', '.']) {
                return Err(self.invalid("appliance", "must be non-empty, without `/`, `.` or spaces".into()));
            }
            if self.assigns_vip {
                let reason = "the hosts of one appliance serve the same VIPs, so none of them may choose a Service's";
                return Err(self.invalid("appliance", reason.into()));
            }
            if self.declares_full_state() {
                let reason = "a full-state endpoint's acknowledgements gate nothing in Kubernetes";
                return Err(self.invalid("appliance", reason.into()));
            }
        }
        if self.retry.initial_delay > self.retry.max_delay {
            return Err(self.invalid("retry", "initial_delay must not exceed max_delay".into()));
        }
        self.validate_tls_files()?;
        if let Some(t) = &self.template {
            t.validate(&self.events, self.assigns_vip).map_err(|(key, reason)| self.invalid(&key, reason))?;
        }
        crate::model::LabelSelector::parse(&self.label_selector)
            .map_err(|e| self.invalid("label_selector", e.to_string()))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forbidden_addresses_cover_link_local_metadata_and_embedded_ipv4() {
        let refused = ["169.254.169.254", "169.254.0.1", "fe80::1", "febf::1", "fd00:ec2::254", "100.100.100.200"];
        let refused_embedded = ["::ffff:169.254.169.254", "::169.254.1.1", "64:ff9b::169.254.169.254"];
        for ip in refused.iter().chain(&refused_embedded) {
            assert!(forbidden_address(ip.parse().unwrap()).is_some(), "{ip}");
        }
        let allowed = ["127.0.0.1", "::1", "10.0.0.1", "100.100.100.201", "fec0::1", "fd00:ec2::253", "2001:db8::1"];
        for ip in allowed {
            assert_eq!(forbidden_address(ip.parse().unwrap()), None, "{ip}");
        }
    }

    fn endpoint(extra: &str) -> WebhookConfig {
        toml::from_str(&format!("name = \"lb1\"\nurl = \"http://192.0.2.1:9080/\"\n{extra}")).unwrap()
    }

    #[test]
    fn an_appliance_is_named_like_an_endpoint_and_neither_chooses_vips_nor_declares_full_state() {
        assert!(endpoint("appliance = \"pair\"").validate().is_ok());
        let refused = |extra: &str| endpoint(extra).validate().unwrap_err().to_string();
        let bad_name = refused("appliance = \"the pair\"");
        assert!(bad_name.contains("appliance") && bad_name.contains("without `/`, `.` or spaces"), "{bad_name}");
        let assigns = refused("appliance = \"pair\"\nassigns_vip = true");
        assert!(assigns.contains("none of them may choose a Service's"), "{assigns}");
    }

    #[test]
    fn endpoints_naming_one_appliance_gate_together_and_the_rest_alone() {
        let config: crate::config::Config = toml::from_str(
            "[[webhooks]]\nname = \"f5\"\nurl = \"http://192.0.2.9/\"\n\
             [[webhooks]]\nname = \"lb1\"\nurl = \"http://192.0.2.1/\"\nappliance = \"pair\"\n\
             [[webhooks]]\nname = \"off\"\nurl = \"http://192.0.2.3/\"\nenabled = false\n\
             [[webhooks]]\nname = \"lb2\"\nurl = \"http://192.0.2.2/\"\nappliance = \"pair\"\n",
        )
        .unwrap();
        let expected = crate::model::Gates::new(vec![vec!["f5".into()], vec!["lb1".into(), "lb2".into()]]);
        assert_eq!(config.gates(), expected);
    }

    #[test]
    fn the_hosts_of_one_appliance_get_the_same_services_and_a_lone_name_is_reported() {
        let config = |lb2: &str| -> crate::config::Config {
            toml::from_str(&format!(
                "[[webhooks]]\nname = \"lb1\"\nurl = \"http://192.0.2.1/\"\nappliance = \"pair\"\n\
                 [[webhooks]]\nname = \"lb2\"\nurl = \"http://192.0.2.2/\"\nappliance = \"pair\"\n{lb2}\n\
                 [[webhooks]]\nname = \"f5\"\nurl = \"http://192.0.2.9/\"\nappliance = \"solo\"\n"
            ))
            .unwrap()
        };
        assert!(config("").validate_appliances().is_ok());
        assert_eq!(config("").lone_appliances(), [("f5", "solo")]);
        // The same sets in another order, and the default mode written out, are the same Services.
        let same = "events = [\"DELETED\", \"MODIFIED\", \"ADDED\", \"ADDED\"]\nbackend_mode = \"nodePort\"";
        assert!(config(same).validate_appliances().is_ok());
        for (lb2, key) in [
            ("namespaces = [\"shop\"]", "namespaces"),
            ("events = [\"ADDED\", \"DELETED\"]", "events"),
            ("label_selector = \"tier=web\"", "label_selector"),
            ("backend_mode = \"pod\"", "backend_mode"),
        ] {
            let e = config(lb2).validate_appliances().unwrap_err().to_string();
            let expected = format!(
                "invalid value for `webhooks.appliance`: `lb1` and `lb2` are hosts of appliance `pair` but differ in \
                 `{key}`: the hosts of one appliance serve the same VIPs, so each must get the same Services"
            );
            assert_eq!(e, expected);
        }
    }
}
