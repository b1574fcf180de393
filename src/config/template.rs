//! `[webhooks.template]`: a request template that replaces an endpoint's default webhook request
//! so one config speaks an appliance's own API (F5 AS3, NetScaler NITRO, a REST portal).
//! The shapes only; compiling and rendering live in [`crate::template`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::Secret;

/// The event types a `mode = "event"` template answers: one list of requests each.
pub const TEMPLATE_EVENTS: [&str; 4] = ["ADDED", "MODIFIED", "DELETED", "SYNCED"];

/// `[webhooks.template]` of one endpoint.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TemplateConfig {
    /// `event`: requests per event, rendered from that event's payload; `full_state`: one declaration of every
    /// Service, debounced and re-sent periodically.
    pub mode: TemplateMode,
    /// Add the Standard Webhooks headers (`webhook-id`, `webhook-timestamp`, `webhook-signature`) over each request
    /// body; the endpoint's `secret` is then required (otherwise it is not).
    #[serde(default)]
    pub sign: bool,
    /// `Authorization` from a secret: `{ bearer = { secret_env = "LB_TOKEN" } }` or `{ basic = { username =
    /// "admin", secret_file = "/run/secrets/f5" } }`; the secret is given as `secret`, `secret_file` or
    /// `secret_env`, like the endpoint's own.
    #[serde(default)]
    pub auth: Option<AuthConfig>,
    /// Named secrets templates may use as `secrets.<name>` (e.g. NITRO's `X-NITRO-PASS` header), each a `{ secret |
    /// secret_file | secret_env }`; only these, never the whole environment. Their values are redacted from the
    /// delivery log.
    #[serde(default)]
    pub secrets: BTreeMap<String, SecretRef>,
    /// Header templates sent with every request (a request's own `headers` win).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Statuses that count as success for requests that list none; empty: any 2xx.
    #[serde(default)]
    pub success: Vec<u16>,
    /// Statuses that fail the delivery at once, without retries (e.g. `[400, 422]`), for requests that list none.
    #[serde(default)]
    pub permanent: Vec<u16>,
    /// `mode = "event"`: the ordered requests per event type (`ADDED`, `MODIFIED`, `DELETED`, `SYNCED`); the
    /// delivery succeeds when all did. Every event type the endpoint takes (`events`) and `SYNCED` need requests,
    /// their own or through `like`.
    #[serde(default)]
    pub on: BTreeMap<String, Vec<RequestTemplate>>,
    /// `mode = "event"`: event types that reuse another's requests, e.g. `{ MODIFIED = "ADDED" }`. An event type
    /// with requests of its own cannot also have a `like` (a `DELETED` sending the `ADDED`'s PUT would leave the
    /// VIP up).
    #[serde(default)]
    pub like: BTreeMap<String, String>,
    /// `mode = "full_state"`: the one request (same keys as a request of `on`) whose body renders `services`.
    #[serde(default)]
    pub full_state: Option<RequestTemplate>,
    /// `full_state`: a change is declared once changes were quiet this long (each change pushes it back).
    #[serde(default = "default_debounce", with = "humantime_serde")]
    #[schemars(with = "String", extend("x-humantime" = true))]
    pub debounce: Duration,
    /// `full_state`: declare again this often even without changes (repairs drift on the appliance); also once at
    /// start, after the first full lists. At least `1s`.
    #[serde(default = "default_resend", with = "humantime_serde")]
    #[schemars(with = "String", extend("x-humantime" = true))]
    pub resend_interval: Duration,
    /// `full_state`: the removal guard. A declaration that removes more than this share (0 to 1) of the Services
    /// the appliance was last told is held until confirmed (`POST /api/v1/webhooks/{name}/confirm-removal`); `1`
    /// disables the guard.
    #[serde(default = "default_max_removal")]
    pub max_removal: f64,
    /// Instruction budget of one render (minijinja fuel): a runaway loop fails instead of spinning. The default
    /// fits the shipped AS3 tenant example at 10,000 Services.
    #[serde(default = "default_fuel")]
    pub fuel: u64,
}

/// `mode` of a template.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TemplateMode {
    /// Requests per event, rendered from that event's payload.
    Event,
    /// One declaration of every in-scope Service, debounced and re-sent periodically.
    FullState,
}

/// `auth`: an `Authorization` header built from a secret (never logged).
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum AuthConfig {
    /// `auth = { bearer = { secret_env = "LB_TOKEN" } }`: `Authorization: Bearer <token>`.
    Bearer(SecretRef),
    /// `auth = { basic = { username = "admin", secret_env = "F5_PASSWORD" } }`: RFC 7617 Basic.
    Basic(BasicAuth),
}

/// Basic credentials: a user name and the password from a secret.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct BasicAuth {
    /// User name (not secret).
    pub username: String,
    /// The password.
    #[serde(flatten)]
    pub password: SecretRef,
}

/// A secret given inline (`secret`), in a file (`secret_file`, trailing whitespace ignored) or in an
/// environment variable (`secret_env`): exactly one, as for the endpoint's own `secret`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SecretRef {
    /// The value itself.
    #[serde(default)]
    pub secret: Option<Secret>,
    /// A file holding it.
    #[serde(default)]
    pub secret_file: Option<PathBuf>,
    /// An environment variable holding it.
    #[serde(default)]
    pub secret_env: Option<String>,
}

impl SecretRef {
    /// The value. Errors: a message when none or several sources are set, or the source is unreadable.
    pub fn resolve(&self) -> Result<Secret, String> {
        super::relay::read_secret(&self.secret, &self.secret_file, &self.secret_env).map_err(|(_, reason)| reason)
    }
}

/// One templated request.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RequestTemplate {
    /// HTTP method: `GET`, `POST`, `PUT`, `PATCH` or `DELETE`.
    #[serde(default = "default_method")]
    pub method: String,
    /// URL template: relative (appended to the endpoint's `url`, e.g. `/vips/{{ service.name|path_segment }}`) or
    /// absolute; link-local targets are refused as for `url`. Text output: use `path_segment` or `urlencode` on
    /// values; CR and LF are refused.
    pub url: String,
    /// Header templates (text; CR and LF refused), over `template.headers`.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Send this request once per element of a list: a minijinja expression (e.g. `service.ports`) evaluated in the
    /// request's context; each send sees the element as `item` (and `loop_index`, 0-based). An empty list sends
    /// nothing.
    #[serde(default)]
    pub each: Option<String>,
    /// Body template, rendered with JSON auto-escape: every `{{ value }}` prints as JSON (a string with its
    /// quotes), so never quote it yourself. The result must parse as JSON. `Content-Type: application/json` unless
    /// a header sets it.
    #[serde(default)]
    pub body: Option<String>,
    /// The body template in a file instead of `body` (relative: to the config file's directory).
    #[serde(default)]
    pub body_file: Option<PathBuf>,
    /// Statuses that count as success; empty: `template.success`, else any 2xx.
    #[serde(default)]
    pub success: Vec<u16>,
    /// Statuses that fail the delivery at once; empty: `template.permanent`.
    #[serde(default)]
    pub permanent: Vec<u16>,
    /// A condition on the JSON response body of a successful status (e.g. AS3's `results[].code`); a failed check
    /// is an `http` failure, retried.
    #[serde(default)]
    pub check: Option<Check>,
    /// Values captured from the JSON response: name → JSON pointer; later requests and `poll` see them as
    /// `captured.<name>`.
    #[serde(default)]
    pub capture: BTreeMap<String, String>,
    /// JSON pointer to the VIP (a string, or an array of strings) in the response: it becomes the Service's
    /// address, as `assigns_vip` (which must be `true`) does for plain webhooks.
    #[serde(default)]
    pub capture_vip: Option<String>,
    /// Asynchronous APIs (AS3's `202` and a task id): poll until done.
    #[serde(default)]
    pub poll: Option<Poll>,
}

/// A condition on a JSON response body: the values at `pointer` (RFC 6901; a `*` segment stands for
/// every element of an array, as in `/results/*/code`) must exist and each satisfy the test.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Check {
    /// Where to look.
    pub pointer: String,
    /// Each value equals this.
    #[serde(default)]
    pub equals: Option<Value>,
    /// Each value is one of these.
    #[serde(default)]
    pub one_of: Vec<Value>,
    /// No value equals this.
    #[serde(default)]
    pub not_equals: Option<Value>,
}

/// Polling after an accepted-but-not-done answer.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Poll {
    /// Statuses that start polling. Default `[202]`.
    #[serde(default = "default_poll_on")]
    pub on_status: Vec<u16>,
    /// URL template of the `GET`, e.g. `/mgmt/shared/appsvcs/task/{{ captured.task }}`.
    pub url: String,
    /// Poll until the response (with a success status) satisfies this; then `check` applies to it.
    pub until: Check,
    /// Between polls.
    #[serde(default = "default_poll_every", with = "humantime_serde")]
    #[schemars(with = "String", extend("x-humantime" = true))]
    pub every: Duration,
    /// Give up (the attempt fails and is retried) after this long. Plus twice the endpoint's `timeout`, it must
    /// stay below nine tenths of `relay.lease`.
    #[serde(default = "default_poll_deadline", with = "humantime_serde")]
    #[schemars(with = "String", extend("x-humantime" = true))]
    pub deadline: Duration,
}

fn default_debounce() -> Duration {
    Duration::from_secs(2)
}
fn default_resend() -> Duration {
    Duration::from_secs(600)
}
fn default_max_removal() -> f64 {
    0.5
}
fn default_fuel() -> u64 {
    50_000_000
}
fn default_method() -> String {
    "POST".into()
}
fn default_poll_on() -> Vec<u16> {
    vec![202]
}
fn default_poll_every() -> Duration {
    Duration::from_secs(1)
}
fn default_poll_deadline() -> Duration {
    Duration::from_secs(30)
}

impl TemplateConfig {
    /// The requests of event type `event` (`ADDED`, ...), following `like`; empty when none.
    pub fn requests_for(&self, event: &str) -> &[RequestTemplate] {
        let event = self.like.get(event).map_or(event, String::as_str);
        self.on.get(event).map_or(&[], Vec::as_slice)
    }

    /// Every request with a name for messages (`on.ADDED[0]`, `full_state`).
    pub fn named_requests(&self) -> Vec<(String, &RequestTemplate)> {
        let mut out: Vec<(String, &RequestTemplate)> = Vec::new();
        for (event, list) in &self.on {
            out.extend(list.iter().enumerate().map(|(i, r)| (format!("on.{event}[{i}]"), r)));
        }
        out.extend(self.full_state.iter().map(|r| ("full_state".to_owned(), r)));
        out
    }

    /// Makes relative `body_file` paths relative to `dir` (the config file's directory).
    pub fn resolve_paths(&mut self, dir: &Path) {
        let requests = self.on.values_mut().flatten().chain(self.full_state.as_mut());
        for r in requests {
            if let Some(p) = r.body_file.as_mut()
                && p.is_relative()
            {
                *p = dir.join(&*p);
            }
        }
    }

    /// Checks the shape (not the templates: [`crate::template::Compiled`] does). `events` are the
    /// endpoint's event types, `assigns_vip` its flag. Errors: `(key, reason)`.
    pub fn validate(&self, events: &[String], assigns_vip: bool) -> Result<(), (String, String)> {
        let bad = |key: &str, reason: String| Err((format!("template.{key}"), reason));
        if let Some(unknown) = self.on.keys().chain(self.like.keys()).find(|e| !TEMPLATE_EVENTS.contains(&e.as_str())) {
            return bad("on", format!("`{unknown}` is not one of {}", TEMPLATE_EVENTS.join(", ")));
        }
        match self.mode {
            TemplateMode::Event => {
                if self.full_state.is_some() {
                    return bad("full_state", "only with mode = \"full_state\"".into());
                }
                for (from, to) in &self.like {
                    if self.on.contains_key(from) {
                        // Which would win is a guess; a DELETED sending the ADDED's PUT leaves the VIP up.
                        let why = format!(
                            "{from} has requests of its own ([[webhooks.template.on.{from}]]); remove one of the two"
                        );
                        return bad(&format!("like.{from}"), why);
                    }
                    if self.like.contains_key(to) || !self.on.contains_key(to) {
                        return bad(&format!("like.{from}"), format!("`{to}` has no requests of its own"));
                    }
                }
                let needed = events.iter().map(String::as_str).chain(["SYNCED"]);
                for event in needed {
                    if self.requests_for(event).is_empty() {
                        let reason =
                            format!("no requests for {event}: add [[webhooks.template.on.{event}]] or like.{event}");
                        return bad("on", reason);
                    }
                }
            }
            TemplateMode::FullState => {
                if !self.on.is_empty() || !self.like.is_empty() {
                    return bad("on", "only with mode = \"event\"; full_state has one request".into());
                }
                match &self.full_state {
                    None => {
                        return bad("full_state", "mode = \"full_state\" needs [webhooks.template.full_state]".into());
                    }
                    Some(r) if r.capture_vip.is_some() => {
                        return bad(
                            "full_state.capture_vip",
                            "only with mode = \"event\" (one Service per request)".into(),
                        );
                    }
                    Some(_) => {}
                }
                if !(0.0..=1.0).contains(&self.max_removal) {
                    return bad("max_removal", "must be between 0 and 1".into());
                }
                if self.resend_interval < Duration::from_secs(1) {
                    return bad("resend_interval", "must be at least 1s".into());
                }
            }
        }
        if self.fuel < 1000 {
            return bad("fuel", "must be at least 1000".into());
        }
        for (name, r) in self.named_requests() {
            r.validate(assigns_vip).or_else(|reason| bad(&name, reason))?;
        }
        for (name, s) in &self.secrets {
            s.resolve().map(drop).or_else(|reason| bad(&format!("secrets.{name}"), reason))?;
        }
        match &self.auth {
            Some(AuthConfig::Bearer(s)) => s.resolve().map(drop).or_else(|r| bad("auth.bearer", r)),
            Some(AuthConfig::Basic(b)) => b.password.resolve().map(drop).or_else(|r| bad("auth.basic", r)),
            None => Ok(()),
        }
    }
}

impl RequestTemplate {
    fn validate(&self, assigns_vip: bool) -> Result<(), String> {
        if reqwest::Method::from_bytes(self.method.as_bytes()).is_err() {
            return Err(format!("method `{}` is not an HTTP method", self.method));
        }
        if self.body.is_some() && self.body_file.is_some() {
            return Err("set body or body_file, not both".into());
        }
        if self.capture_vip.is_some() && !assigns_vip {
            return Err("capture_vip needs assigns_vip = true on the endpoint".into());
        }
        let statuses = self.success.iter().chain(&self.permanent);
        if let Some(s) = statuses.clone().find(|s| !(100..=599).contains(*s)) {
            return Err(format!("status {s} is not an HTTP status"));
        }
        let pointers = self.capture.values().chain(&self.capture_vip);
        if let Some(p) = pointers.clone().find(|p| !p.is_empty() && !p.starts_with('/')) {
            return Err(format!("`{p}` is not a JSON pointer (starts with `/`)"));
        }
        if let Some(c) = &self.check {
            c.validate().map_err(|e| format!("check: {e}"))?;
        }
        if let Some(p) = &self.poll {
            p.until.validate().map_err(|e| format!("poll.until: {e}"))?;
            if p.every.is_zero() || p.deadline < p.every {
                return Err("poll: every must be positive and at most deadline".into());
            }
        }
        Ok(())
    }
}

impl Check {
    fn validate(&self) -> Result<(), String> {
        if !self.pointer.starts_with('/') {
            return Err(format!("pointer `{}` does not start with `/`", self.pointer));
        }
        let tests = usize::from(self.equals.is_some())
            + usize::from(!self.one_of.is_empty())
            + usize::from(self.not_equals.is_some());
        if tests != 1 {
            return Err("set exactly one of equals, one_of, not_equals".into());
        }
        Ok(())
    }
}
