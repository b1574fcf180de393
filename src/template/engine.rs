//! Compiling an endpoint's templates into one minijinja environment and rendering requests from it.

use std::collections::BTreeMap;

use minijinja::{Environment, Value};
use reqwest::Method;
use reqwest::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use url::Url;

use super::TemplateError;
use super::filters::environment;
use crate::config::{
    AuthConfig, Check, Poll, RequestTemplate, Secret, TEMPLATE_EVENTS, TemplateConfig, TemplateMode, WebhookConfig,
    forbidden_address,
};

/// What replaces a secret in the delivery log.
const REDACTED: &str = "<redacted>";

/// One request, compiled: its templates live in the endpoint's environment under `<name>.url`,
/// `<name>.headers.<Header>` and `<name>.body`.
#[derive(Debug, Clone)]
pub struct CompiledRequest {
    /// `on.ADDED[0]` or `full_state`.
    pub name: String,
    /// HTTP method.
    pub method: Method,
    /// Header names with a template (defaults merged in, request's own win).
    headers: Vec<HeaderName>,
    /// Whether a body template exists.
    has_body: bool,
    /// Whether the request repeats per element of its `each` list (template `<name>.each`).
    pub has_each: bool,
    /// Success statuses (empty: any 2xx).
    pub success: Vec<u16>,
    /// Statuses that fail the delivery at once.
    pub permanent: Vec<u16>,
    /// Condition on the response body.
    pub check: Option<Check>,
    /// name → JSON pointer captured from the response.
    pub capture: BTreeMap<String, String>,
    /// JSON pointer of the VIP(s) in the response.
    pub capture_vip: Option<String>,
    /// Polling settings (its URL template is `<name>.poll`).
    pub poll: Option<Poll>,
}

/// A rendered request, ready to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    /// HTTP method.
    pub method: Method,
    /// Absolute URL.
    pub url: Url,
    /// Headers in order (`Content-Type: application/json` added when a body has none).
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The body (valid JSON), if any.
    pub body: Option<String>,
}

/// An endpoint's templates, compiled once (at start, and at `check-config`).
pub struct Compiled {
    env: Environment<'static>,
    base: Url,
    allow_link_local: bool,
    events: BTreeMap<&'static str, Vec<CompiledRequest>>,
    full_state: Option<CompiledRequest>,
    secrets: BTreeMap<String, Secret>,
    auth: Option<Secret>,
    /// Whether any template reads `told` (only then is it read from the store per attempt).
    uses_told: bool,
    /// The template settings as configured.
    pub config: TemplateConfig,
}

impl std::fmt::Debug for Compiled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compiled").field("base", &self.base).field("mode", &self.config.mode).finish_non_exhaustive()
    }
}

impl Compiled {
    /// Compiles `w.template`: reads `body_file`s, resolves secrets, adds every template to one
    /// environment. Errors: [`TemplateError::Setup`] (no template, unreadable file, secret) or
    /// [`TemplateError::Template`] with the template name, line and reason.
    pub fn new(w: &WebhookConfig) -> Result<Self, TemplateError> {
        let config = w.template.clone().ok_or_else(|| TemplateError::Setup("no [webhooks.template]".into()))?;
        let mut env = environment(config.fuel);
        let mut compile = |r: &RequestTemplate, name: String| compile_request(&mut env, &config, r, name);
        let mut events = BTreeMap::new();
        let mut full_state = None;
        match config.mode {
            TemplateMode::Event => {
                for event in TEMPLATE_EVENTS {
                    let list = config.on.get(event).map(Vec::as_slice).unwrap_or_default();
                    let compiled = list
                        .iter()
                        .enumerate()
                        .map(|(i, r)| compile(r, format!("on.{event}[{i}]")))
                        .collect::<Result<Vec<_>, _>>()?;
                    events.insert(event, compiled);
                }
                for (from, to) in &config.like {
                    let copy = events.get(to.as_str()).cloned().unwrap_or_default();
                    if let Some(event) = TEMPLATE_EVENTS.into_iter().find(|e| *e == from.as_str()) {
                        events.insert(event, copy);
                    }
                }
            }
            TemplateMode::FullState => {
                if let Some(r) = &config.full_state {
                    full_state = Some(compile(r, "full_state".into())?);
                }
            }
        }
        let setup = |what: &str, e: String| TemplateError::Setup(format!("{what}: {e}"));
        let mut secrets = BTreeMap::new();
        for (name, s) in &config.secrets {
            secrets.insert(name.clone(), s.resolve().map_err(|e| setup(&format!("secrets.{name}"), e))?);
        }
        let auth = match &config.auth {
            Some(AuthConfig::Bearer(s)) => {
                let token = s.resolve().map_err(|e| setup("auth.bearer", e))?;
                Some(Secret::new(format!("Bearer {}", token.expose())))
            }
            Some(AuthConfig::Basic(b)) => {
                let password = b.password.resolve().map_err(|e| setup("auth.basic", e))?;
                let pair = format!("{}:{}", b.username, password.expose());
                let encoded = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, pair);
                Some(Secret::new(format!("Basic {encoded}")))
            }
            None => None,
        };
        let base = w.url.clone();
        let uses_told = env.templates().any(|(_, t)| t.undeclared_variables(false).contains("told"));
        let allow_link_local = w.allow_link_local;
        Ok(Self { env, base, allow_link_local, events, full_state, secrets, auth, uses_told, config })
    }

    /// Whether any of the endpoint's templates reads `told` (what the endpoint last acknowledged for
    /// the Service): the relay reads it from the store for each attempt only then.
    pub fn uses_told(&self) -> bool {
        self.uses_told
    }

    /// The requests of event type `event` (`ADDED`, `MODIFIED`, `DELETED`, `SYNCED`), in order.
    pub fn requests(&self, event: &str) -> &[CompiledRequest] {
        self.events.get(event).map_or(&[], Vec::as_slice)
    }

    /// The full-state request (`mode = "full_state"`).
    pub fn full_state(&self) -> Option<&CompiledRequest> {
        self.full_state.as_ref()
    }

    /// `secrets` as templates see them: name → value.
    pub fn secrets_value(&self) -> serde_json::Value {
        self.secrets.iter().map(|(k, v)| (k.clone(), serde_json::Value::from(v.expose()))).collect()
    }

    /// The `Authorization` header value from `auth`, if configured.
    pub fn authorization(&self) -> Option<&Secret> {
        self.auth.as_ref()
    }

    /// Every secret value, longest first (what [`redact`] removes from the log).
    pub fn secret_values(&self) -> Vec<&str> {
        let mut out: Vec<&str> = self.secrets.values().chain(&self.auth).map(Secret::expose).collect();
        // The token (or the Basic credentials) alone, as a template might echo it.
        out.extend(self.auth.iter().filter_map(|a| a.expose().split_once(' ').map(|(_, v)| v)));
        out.retain(|s| !s.is_empty());
        out.sort_by_key(|s| std::cmp::Reverse(s.len()));
        out
    }

    /// Renders `req` with `ctx` (see [`super::event_context`]). Errors: [`TemplateError`] naming the
    /// template (`on.ADDED[0].body`) with line and reason, or the bad output.
    pub fn render(&self, req: &CompiledRequest, ctx: &Value) -> Result<Rendered, TemplateError> {
        let url = self.render_url(&format!("{}.url", req.name), ctx)?;
        let mut headers = Vec::with_capacity(req.headers.len() + 1);
        for h in &req.headers {
            let name = format!("{}.headers.{h}", req.name);
            let value = self.render_text(&name, ctx)?;
            let value = HeaderValue::from_str(&value)
                .map_err(|_| TemplateError::Output { template: name, what: "an invalid header value".into() })?;
            headers.push((h.clone(), value));
        }
        let body = if req.has_body {
            let name = format!("{}.body", req.name);
            let body = self.render_one(&name, ctx)?;
            if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(&body) {
                return Err(TemplateError::Output { template: name, what: format!("a body that is not JSON: {e}") });
            }
            if !headers.iter().any(|(h, _)| h == CONTENT_TYPE) {
                headers.push((CONTENT_TYPE, HeaderValue::from_static("application/json")));
            }
            Some(body)
        } else {
            None
        };
        Ok(Rendered { method: req.method.clone(), url, headers, body })
    }

    /// The elements `req` repeats over (its `each` expression), or `None` when it is sent once.
    /// Errors: [`TemplateError`] when the expression fails or is not a list.
    pub fn each(&self, req: &CompiledRequest, ctx: &Value) -> Result<Option<Vec<serde_json::Value>>, TemplateError> {
        if !req.has_each {
            return Ok(None);
        }
        let name = format!("{}.each", req.name);
        let out = self.render_one(&name, ctx)?;
        match serde_json::from_str(&out) {
            Ok(serde_json::Value::Array(items)) => Ok(Some(items)),
            Ok(serde_json::Value::Null) => Ok(Some(Vec::new())),
            _ => Err(TemplateError::Output { template: name, what: "something that is not a list".into() }),
        }
    }

    /// Renders `req` once, or once per `each` element (with `item` and `loop_index`). Errors: as
    /// [`Compiled::render`].
    pub fn render_all(&self, req: &CompiledRequest, ctx: &Value) -> Result<Vec<Rendered>, TemplateError> {
        match self.each(req, ctx)? {
            None => Ok(vec![self.render(req, ctx)?]),
            Some(items) => {
                items.iter().enumerate().map(|(i, item)| self.render(req, &with_item(ctx, i, item))).collect()
            }
        }
    }

    /// Renders the `poll.url` of `req` (a `GET`, no body). Errors: as [`Compiled::render`].
    pub fn render_poll(&self, req: &CompiledRequest, ctx: &Value) -> Result<Rendered, TemplateError> {
        let url = self.render_url(&format!("{}.poll", req.name), ctx)?;
        Ok(Rendered { method: Method::GET, url, headers: Vec::new(), body: None })
    }

    fn render_one(&self, name: &str, ctx: &Value) -> Result<String, TemplateError> {
        let t = self.env.get_template(name).map_err(|e| TemplateError::from_minijinja(name, &e))?;
        t.render(ctx).map_err(|e| TemplateError::from_minijinja(name, &e))
    }

    fn render_text(&self, name: &str, ctx: &Value) -> Result<String, TemplateError> {
        let out = self.render_one(name, ctx)?;
        if out.contains(['\r', '\n']) {
            return Err(TemplateError::Output { template: name.to_owned(), what: "a line break (CR or LF)".into() });
        }
        Ok(out)
    }

    fn render_url(&self, name: &str, ctx: &Value) -> Result<Url, TemplateError> {
        let text = self.render_text(name, ctx)?;
        let bad = |what: String| TemplateError::Output { template: name.to_owned(), what };
        let url = if text.starts_with("http://") || text.starts_with("https://") {
            Url::parse(&text)
        } else {
            let base = self.base.as_str().trim_end_matches('/');
            let sep = if text.starts_with('/') || text.starts_with('?') || text.is_empty() { "" } else { "/" };
            Url::parse(&format!("{base}{sep}{text}"))
        }
        .map_err(|e| bad(format!("`{text}`, which is not a URL: {e}")))?;
        let ip = match url.host() {
            Some(url::Host::Ipv4(v4)) => Some(std::net::IpAddr::V4(v4)),
            Some(url::Host::Ipv6(v6)) => Some(std::net::IpAddr::V6(v6)),
            _ => None,
        };
        if let Some(why) = ip.and_then(forbidden_address)
            && !self.allow_link_local
        {
            return Err(bad(format!("a URL pointing at {why}")));
        }
        Ok(url)
    }
}

/// Adds `r`'s templates to `env` under `name`. Errors: [`TemplateError`] for a template that does not
/// compile, an unreadable `body_file`, an `autoescape` block.
fn compile_request(
    env: &mut Environment<'static>,
    config: &TemplateConfig,
    r: &RequestTemplate,
    name: String,
) -> Result<CompiledRequest, TemplateError> {
    let mut add = |part: String, source: String| -> Result<(), TemplateError> {
        if source.contains("autoescape") {
            let reason = "`autoescape` blocks are not allowed (bodies are always JSON-escaped)".into();
            return Err(TemplateError::Template { template: part, line: None, reason });
        }
        env.add_template_owned(part.clone(), source).map_err(|e| TemplateError::from_minijinja(&part, &e))
    };
    add(format!("{name}.url"), r.url.clone())?;
    let mut merged: BTreeMap<String, &String> =
        config.headers.iter().map(|(k, v)| (k.to_ascii_lowercase(), v)).collect();
    merged.extend(r.headers.iter().map(|(k, v)| (k.to_ascii_lowercase(), v)));
    let mut headers = Vec::new();
    for (h, source) in merged {
        let header = HeaderName::from_bytes(h.as_bytes()).map_err(|_| TemplateError::Output {
            template: format!("{name}.headers"),
            what: format!("`{h}`, which is not a header name"),
        })?;
        add(format!("{name}.headers.{header}"), source.clone())?;
        headers.push(header);
    }
    let body = match (&r.body, &r.body_file) {
        (Some(b), _) => Some(b.clone()),
        (None, Some(path)) => Some(
            std::fs::read_to_string(path)
                .map_err(|e| TemplateError::Setup(format!("{name}.body_file {}: {e}", path.display())))?,
        ),
        (None, None) => None,
    };
    let has_body = body.is_some();
    if let Some(body) = body {
        add(format!("{name}.body"), body)?;
    }
    if let Some(p) = &r.poll {
        add(format!("{name}.poll"), p.url.clone())?;
    }
    if let Some(each) = &r.each {
        add(format!("{name}.each"), format!("{{{{ ({each})|tojson }}}}"))?;
    }
    let or_default = |own: &[u16], default: &[u16]| if own.is_empty() { default.to_vec() } else { own.to_vec() };
    Ok(CompiledRequest {
        method: Method::from_bytes(r.method.to_ascii_uppercase().as_bytes())
            .map_err(|_| TemplateError::Setup(format!("{name}.method: `{}` is not an HTTP method", r.method)))?,
        headers,
        has_body,
        has_each: r.each.is_some(),
        success: or_default(&r.success, &config.success),
        permanent: or_default(&r.permanent, &config.permanent),
        check: r.check.clone(),
        capture: r.capture.clone(),
        capture_vip: r.capture_vip.clone(),
        poll: r.poll.clone(),
        name,
    })
}

/// `ctx` plus `item` (an `each` element) and `loop_index` (its 0-based position).
pub fn with_item(ctx: &Value, index: usize, item: &serde_json::Value) -> Value {
    minijinja::context! { item => Value::from(minijinja::value::Serde(item)), loop_index => index, ..ctx.clone() }
}

/// `text` with every value of `secrets` (longest first) replaced by `<redacted>`.
pub fn redact(text: &str, secrets: &[&str]) -> String {
    let mut out = text.to_owned();
    for s in secrets.iter().filter(|s| !s.is_empty()) {
        // As written, JSON-escaped (a body renders values through JSON auto-escape) and
        // percent-encoded (`path_segment`, `query`; `+` for spaces as forms write them).
        let json = serde_json::to_string(s).unwrap_or_default();
        let json = json.get(1..json.len().saturating_sub(1)).unwrap_or_default().to_owned();
        let encoded = percent_encoding::utf8_percent_encode(s, super::filters::URL_PART).to_string();
        let form = encoded.replace("%20", "+");
        for variant in [s.to_string(), json, encoded.clone(), encoded.to_lowercase(), form] {
            if !variant.is_empty() && out.contains(&variant) {
                out = out.replace(&variant, REDACTED);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_replaces_every_secret() {
        assert_eq!(redact("a s3cr3t b s3cr3t", &["s3cr3t"]), "a <redacted> b <redacted>");
    }

    #[test]
    fn redact_finds_a_secret_json_escaped_or_percent_encoded() {
        let pw = r#"p"ss\w<rd&'"#;
        let body = format!("{{\"password\": {}}}", serde_json::to_string(pw).unwrap());
        assert_eq!(redact(&body, &[pw]), r#"{"password": "<redacted>"}"#);
        let token = "abc/def+ghi==";
        assert_eq!(redact("/login?token=abc%2Fdef%2Bghi%3D%3D", &[token]), "/login?token=<redacted>");
        assert_eq!(redact("q=a+b", &["a b"]), "q=<redacted>");
    }
}
