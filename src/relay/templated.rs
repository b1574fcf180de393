//! Templated endpoints: one attempt of a delivery is the template's requests in order
//! (each judged by its own success rules, polled when asynchronous, its captures passed on), all
//! logged in the attempt's `request` (secrets redacted). Plain endpoints keep [`Sender`].
//!
//! In event mode the templates also see `told`, what the endpoint last acknowledged for the
//! Service (`store::told`, read per attempt when a template uses it), and each attempt says what
//! the endpoint will hold once it completes the delivery ([`AttemptResult::told`]): the dispatcher
//! records that in the transaction that records the success.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use reqwest::header::{AUTHORIZATION, HeaderValue};
use serde::Serialize;
use serde_json::{Map, Value as Json};

use super::RelayError;
use super::full_state::FullState;
use super::policy::Verdict;
use super::resolve::system_lookup;
use super::sender::{self, AttemptResult, Sender, failure, read_response};
use crate::config::WebhookConfig;
use crate::store::{Claimed, Store, ToldValue, now_ms};
use crate::template::{Compiled, CompiledRequest, Judgement, Rendered, TemplateError, capture, judge, matches};

/// How one endpoint's deliveries go out.
pub enum Transport {
    /// The default signed webhook POST.
    Plain(Box<Sender>),
    /// The endpoint's request template.
    Template(Box<TemplateSender>),
}

impl Transport {
    /// One attempt of `c`. Never fails: errors become the attempt's `error_class`.
    pub async fn send(&self, c: &Claimed) -> AttemptResult {
        match self {
            Self::Plain(s) => s.send(&c.msg_id, &c.payload).await,
            Self::Template(t) => t.send(c).await,
        }
    }
}

/// Sends a templated endpoint's deliveries.
pub struct TemplateSender {
    name: String,
    client: reqwest::Client,
    pub(super) compiled: std::sync::Arc<Compiled>,
    signer: Option<standardwebhooks::Webhook>,
    timeout: Duration,
    full_state: Option<FullState>,
    /// Where event mode reads `told`.
    store: Store,
}

/// One HTTP exchange of an attempt, as the delivery log shows it.
#[derive(Debug, Serialize)]
struct Step {
    name: String,
    method: String,
    url: String,
    headers: BTreeMap<String, String>,
    body: Option<String>,
    status: Option<u16>,
    response: Option<String>,
    error: Option<String>,
}

/// What an attempt collected so far.
#[derive(Default)]
pub(super) struct Log {
    steps: Vec<Step>,
    /// `captured.*` for later requests.
    pub captured: Map<String, Json>,
    vips: Vec<String>,
    /// `Retry-After` of the last response that had one.
    retry_after: Option<Duration>,
    /// The attempt is of a `DELETED`: a `DELETE` answered 404 or 410 is done ([`gone`]).
    deleted: bool,
}

/// An attempt cut short: its result.
type Stop = Box<AttemptResult>;

impl TemplateSender {
    /// Compiles `cfg.template` and builds the endpoint's client (and signer, when `sign`); a
    /// full-state endpoint reads Services through `full_state`, an event-mode one what it was
    /// `told` through `store`. Errors: [`RelayError::Endpoint`] for templates that do not compile,
    /// TLS material, a missing secret.
    pub fn new(cfg: &WebhookConfig, full_state: Option<FullState>, store: Store) -> Result<Self, RelayError> {
        let err = |reason: String| RelayError::Endpoint { name: cfg.name.clone(), reason };
        let compiled = std::sync::Arc::new(Compiled::new(cfg).map_err(|e| err(e.to_string()))?);
        let signer = if cfg.signs() { Some(sender::signer(cfg)?) } else { None };
        let client = sender::client(cfg, system_lookup())?;
        Ok(Self { name: cfg.name.clone(), client, compiled, signer, timeout: cfg.timeout, full_state, store })
    }

    /// One attempt of delivery `c`: the requests of its event type rendered from its payload, or
    /// (full state) the declaration of every Service. Never fails.
    pub async fn send(&self, c: &Claimed) -> AttemptResult {
        let (started_at, clock) = (now_ms(), Instant::now());
        let mut log = Log::default();
        let mut told = None;
        let verdict = match &self.full_state {
            Some(fs) => fs.send(self, c, &mut log).await,
            None => self.send_event(c, &mut told, &mut log).await,
        };
        let mut result = finish(verdict, log);
        result.told = told;
        result.record.started_at = started_at;
        result.record.duration_ms = i64::try_from(clock.elapsed().as_millis()).unwrap_or(i64::MAX);
        result
    }

    /// One attempt of event delivery `c`: its event type's requests, rendered with `told` (read
    /// first, when a template uses it). Sets `told_now` to what the endpoint holds for the Service
    /// once the delivery completes: its `service` value, or [`ToldValue::Withdrawn`] for a DELETED
    /// (also when a 404 completes it).
    async fn send_event(&self, c: &Claimed, told_now: &mut Option<ToldValue>, log: &mut Log) -> Result<(), Stop> {
        let payload: Json = serde_json::from_str(&c.payload)
            .map_err(|e| template_failure(TemplateError::Setup(format!("the stored payload is not JSON: {e}"))))?;
        let event = payload["data"]["event"].as_str().unwrap_or_default().to_owned();
        let service = &payload["data"]["service"];
        if service.is_null() {
            return Ok(()); // `sync.completed`: nothing for an appliance API
        }
        log.deleted = c.kind == "DELETED";
        *told_now = Some(if log.deleted { ToldValue::Withdrawn } else { ToldValue::Service(service.to_string()) });
        let told = if self.compiled.uses_told() { self.told(c).await? } else { None };
        let secrets = self.compiled.secrets_value();
        let ctx = |captured: &Map<String, Json>| {
            crate::template::event_context(&payload, &self.name, &secrets, told.as_ref(), captured)
        };
        self.run(&c.msg_id, self.compiled.requests(&event), ctx, log).await
    }

    /// What this endpoint last acknowledged for `c`'s Service (`None`: nothing). A database that
    /// cannot be read fails the attempt, retried (class `template`: no request went out, so it does
    /// not count against the endpoint's circuit).
    async fn told(&self, c: &Claimed) -> Result<Option<Json>, Stop> {
        let unreadable =
            |e: String| Box::new(failure("template", format!("cannot read what the endpoint was told: {e}")));
        let text = self.store.told(&self.name, &c.key).await.map_err(|e| unreadable(e.to_string()))?;
        text.map(|t| serde_json::from_str(&t)).transpose().map_err(|e| unreadable(e.to_string()))
    }

    /// Sends `requests` in order; `ctx` builds the template context from the captures so far.
    pub(super) async fn run(
        &self,
        msg_id: &str,
        requests: &[CompiledRequest],
        ctx: impl Fn(&Map<String, Json>) -> minijinja::Value,
        log: &mut Log,
    ) -> Result<(), Stop> {
        for req in requests {
            let base = ctx(&log.captured);
            match self.each(req, &base).await.map_err(template_failure)? {
                None => self.one(msg_id, req, &req.name, &ctx, None, log).await?,
                Some(items) => {
                    for (i, item) in items.into_iter().enumerate() {
                        self.one(msg_id, req, &format!("{}#{i}", req.name), &ctx, Some((i, item)), log).await?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Sends `req` once (with `item` and `loop_index` for an `each` element).
    async fn one(
        &self,
        msg_id: &str,
        req: &CompiledRequest,
        name: &str,
        ctx: &impl Fn(&Map<String, Json>) -> minijinja::Value,
        item: Option<(usize, Json)>,
        log: &mut Log,
    ) -> Result<(), Stop> {
        let with_item = |captured: &Map<String, Json>| match &item {
            None => ctx(captured),
            Some((i, v)) => crate::template::with_item(&ctx(captured), *i, v),
        };
        let rendered = self.render(req, with_item(&log.captured)).await.map_err(template_failure)?;
        let (status, body) = self.exchange(msg_id, name, rendered, log).await?;
        let body = match judge(req, status, &body) {
            Judgement::Success => body,
            _ if gone(log, req, status) => return Ok(()),
            Judgement::Poll => self.poll(msg_id, req, &body, &with_item, log).await?,
            Judgement::Permanent(why) => return Err(http_failure(status, why, Verdict::Permanent)),
            Judgement::Retry(why) => return Err(http_failure(status, why, retry_verdict(log))),
        };
        capture(req, &body, &mut log.captured).map_err(|e| http_failure(status, e, retry_verdict(log)))?;
        if let Some(pointer) = &req.capture_vip {
            log.vips.extend(captured_vips(&body, pointer));
        }
        Ok(())
    }

    /// Renders `req` in `ctx` ([`Self::template_work`]).
    async fn render(&self, req: &CompiledRequest, ctx: minijinja::Value) -> Result<Rendered, TemplateError> {
        self.template_work(Compiled::render, req, ctx).await
    }

    /// [`Compiled::each`] of `req` in `ctx` ([`Self::template_work`]).
    async fn each(&self, req: &CompiledRequest, ctx: &minijinja::Value) -> Result<Option<Vec<Json>>, TemplateError> {
        self.template_work(Compiled::each, req, ctx.clone()).await
    }

    /// `work` on `req` in `ctx`. For a full-state declaration (every in-scope Service: its context
    /// and render take most of a second for 10,000 Services) it runs on tokio's
    /// blocking pool, so the runtime's one worker (`server.worker_threads`) goes on with the watch,
    /// the other deliveries and the API meanwhile; an event's requests are small and run in place.
    async fn template_work<T: Send + 'static>(
        &self,
        work: fn(&Compiled, &CompiledRequest, &minijinja::Value) -> Result<T, TemplateError>,
        req: &CompiledRequest,
        ctx: minijinja::Value,
    ) -> Result<T, TemplateError> {
        if self.full_state.is_none() {
            return work(&self.compiled, req, &ctx);
        }
        let (compiled, req) = (self.compiled.clone(), req.clone());
        tokio::task::spawn_blocking(move || work(&compiled, &req, &ctx)).await.unwrap_or_else(|e| Err(not_finished(&e)))
    }

    /// Polls `req.poll.url` until `until` holds on a success status; returns the last body. The
    /// first (accepted) response's captures are taken first (e.g. AS3's task id).
    async fn poll(
        &self,
        msg_id: &str,
        req: &CompiledRequest,
        accepted: &[u8],
        ctx: &impl Fn(&Map<String, Json>) -> minijinja::Value,
        log: &mut Log,
    ) -> Result<Vec<u8>, Stop> {
        let p = req.poll.as_ref().expect("judged Poll only with poll settings");
        capture(req, accepted, &mut log.captured).map_err(|e| http_failure(202, e, retry_verdict(log)))?;
        let deadline = Instant::now() + p.deadline;
        loop {
            tokio::time::sleep(p.every).await;
            if Instant::now() >= deadline {
                let why = format!("still not done after polling for {:?}", p.deadline);
                return Err(Box::new(failure("timeout", why)));
            }
            let rendered = self.compiled.render_poll(req, &ctx(&log.captured)).map_err(template_failure)?;
            let (status, body) = self.exchange(msg_id, &format!("{}.poll", req.name), rendered, log).await?;
            let success =
                if req.success.is_empty() { (200..300).contains(&status) } else { req.success.contains(&status) };
            let doc = serde_json::from_slice::<Json>(&body).ok();
            if success && doc.as_ref().is_some_and(|d| matches(&p.until, d)) {
                return match (&req.check, &doc) {
                    (Some(check), Some(d)) if !matches(check, d) => {
                        let why = format!("the finished task fails the check on {}", check.pointer);
                        Err(http_failure(status, why, retry_verdict(log)))
                    }
                    _ => Ok(body),
                };
            }
            if req.permanent.contains(&status) {
                return Err(http_failure(status, format!("HTTP {status} while polling"), Verdict::Permanent));
            }
        }
    }

    /// Sends one request; logs it. Returns status and body, or the failed attempt (transport error).
    async fn exchange(&self, msg_id: &str, name: &str, r: Rendered, log: &mut Log) -> Result<(u16, Vec<u8>), Stop> {
        let secrets = self.compiled.secret_values();
        let mut request = self.client.request(r.method.clone(), r.url.clone());
        let mut shown: BTreeMap<String, String> = BTreeMap::new();
        for (h, v) in &r.headers {
            shown.insert(h.to_string(), crate::template::redact(v.to_str().unwrap_or_default(), &secrets));
            request = request.header(h, v);
        }
        if let Some(auth) = self.compiled.authorization() {
            let mut value = HeaderValue::from_str(auth.expose()).map_err(|_| {
                template_failure(TemplateError::Setup("the auth secret is not a valid header value".into()))
            })?;
            value.set_sensitive(true);
            request = request.header(AUTHORIZATION, value);
            shown.insert(AUTHORIZATION.to_string(), "<redacted>".into());
        }
        let body = r.body.clone().unwrap_or_default();
        if let Some(signer) = &self.signer {
            let timestamp = jiff::Timestamp::now().as_second();
            let signature = signer.sign(msg_id, timestamp, body.as_bytes()).unwrap_or_default();
            for (h, v) in [("webhook-id", msg_id.to_owned()), ("webhook-timestamp", timestamp.to_string())] {
                shown.insert(h.into(), v.clone());
                request = request.header(h, v);
            }
            request = request.header("webhook-signature", signature);
        }
        if r.body.is_some() {
            request = request.body(body);
        }
        let mut step = Step {
            name: name.to_owned(),
            method: r.method.to_string(),
            url: crate::template::redact(r.url.as_str(), &secrets),
            headers: shown,
            body: r.body.as_deref().map(|b| crate::template::redact(b, &secrets)),
            status: None,
            response: None,
            error: None,
        };
        let safety = self.timeout + Duration::from_secs(1);
        let mut result = match tokio::time::timeout(safety, request.send()).await {
            Ok(Ok(response)) => read_response(response).await,
            Ok(Err(e)) => failure(sender::classify(&e), sender::error_chain(&e)),
            Err(_) => failure("timeout", format!("no complete answer within {:?}", self.timeout)),
        };
        // An appliance may echo what it was sent (a login answer, an error quoting the request).
        if let Some(body) = result.record.response_body.as_mut() {
            *body = crate::template::redact(body, &secrets);
        }
        step.status = result.record.status_code;
        step.response = result.record.response_body.clone();
        match result.record.status_code {
            Some(status) => {
                log.steps.push(step);
                if let Verdict::Retry { retry_after: Some(after) } = result.verdict {
                    log.retry_after = Some(after);
                }
                Ok((status, result.body))
            }
            None => {
                step.error = result.record.error.clone();
                log.steps.push(step);
                Err(Box::new(result))
            }
        }
    }
}

/// The attempt's result from the last step's outcome and the log.
fn finish(outcome: Result<(), Stop>, log: Log) -> AttemptResult {
    let last = log.steps.last();
    let mut result = match outcome {
        Ok(()) => {
            let body = if log.vips.is_empty() {
                Vec::new()
            } else {
                serde_json::to_vec(&serde_json::json!({ "vips": log.vips })).unwrap_or_default()
            };
            let record = crate::store::AttemptRecord {
                status_code: last.and_then(|s| s.status),
                response_body: last.and_then(|s| s.response.clone()),
                ..Default::default()
            };
            AttemptResult { record, verdict: Verdict::Success, body, told: None }
        }
        Err(stop) => *stop,
    };
    if result.record.response_body.is_none() {
        result.record.response_body = last.and_then(|s| s.response.clone());
    }
    result.record.request = Some(serde_json::to_string(&log.steps).unwrap_or_default());
    result
}

/// Whether `req`'s answer `status` leaves nothing to do: in a `DELETED`, a `DELETE` answered 404 or
/// 410 found the object gone, which is what it asks for, and the requests after it still go out (the
/// dispatcher's rule for a whole delivery, [`super::policy::already_gone`], would end the chain there
/// as done and leave what they remove behind).
fn gone(log: &Log, req: &CompiledRequest, status: u16) -> bool {
    log.deleted && req.method == reqwest::Method::DELETE && matches!(status, 404 | 410)
}

/// `Retry`, with the last response's `Retry-After` when it had one.
fn retry_verdict(log: &Log) -> Verdict {
    Verdict::Retry { retry_after: log.retry_after }
}

fn http_failure(status: u16, why: String, verdict: Verdict) -> Stop {
    let mut result = failure("http", why);
    result.record.status_code = Some(status);
    result.verdict = verdict;
    Box::new(result)
}

/// Template work on the blocking pool that did not return: it panicked (a bug, reported as such) or
/// the runtime is shutting down.
pub(super) fn not_finished(e: &tokio::task::JoinError) -> TemplateError {
    let what = if e.is_panic() { "panicked" } else { "was cancelled (shutting down)" };
    TemplateError::Setup(format!("rendering {what}: {e}"))
}

/// A template that cannot render: the delivery fails at once (class `template`).
pub(super) fn template_failure(e: TemplateError) -> Stop {
    let mut result = failure("template", e.to_string());
    result.verdict = Verdict::Permanent;
    Box::new(result)
}

/// The strings at `pointer` in the JSON `body`: one string, or an array of strings.
fn captured_vips(body: &[u8], pointer: &str) -> Vec<String> {
    let Ok(doc) = serde_json::from_slice::<Json>(body) else { return Vec::new() };
    match doc.pointer(pointer) {
        Some(Json::String(s)) => vec![s.clone()],
        Some(Json::Array(items)) => items.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect(),
        _ => Vec::new(),
    }
}
