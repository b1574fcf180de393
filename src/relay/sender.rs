//! One endpoint's HTTP side: a reqwest client with the endpoint's timeouts, TLS material, no
//! redirects and a resolver that refuses link-local / metadata addresses, and one signed attempt
//! (Standard Webhooks headers over the exact bytes sent).

use std::time::{Duration, Instant, SystemTime};

use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, LOCATION, RETRY_AFTER};
use tracing::warn;
use url::Url;

use super::RelayError;
use super::policy::{Verdict, parse_retry_after};
use super::resolve::{ForbiddenAddress, GuardedResolver, Lookup, system_lookup};
use crate::config::WebhookConfig;
use crate::model::bounded::{self, bound};
use crate::store::{AttemptRecord, ToldValue, now_ms};
use vipwatch_contract::ReceiverIdentity;

/// Most response-body bytes read per attempt (64 KiB); the rest is dropped with the connection.
pub const MAX_BODY_READ: usize = 64 * 1024;
/// Most response-body bytes kept in the attempt log (4 KiB), the cut marked.
pub const MAX_BODY_KEPT: usize = crate::model::bounded::RESPONSE_BODY;

/// The `User-Agent` of every request.
pub const USER_AGENT: &str = concat!("vipwatch/", env!("CARGO_PKG_VERSION"));

/// What one attempt produced.
#[derive(Debug, Clone)]
pub struct AttemptResult {
    /// For the attempt log.
    pub record: AttemptRecord,
    /// For the retry policy.
    pub verdict: Verdict,
    /// The body read (at most [`MAX_BODY_READ`] bytes).
    pub body: Vec<u8>,
    /// Templated event-mode endpoints: what the endpoint holds for the Service should this attempt
    /// complete the delivery (recorded in table `told` only then); `None` for every other endpoint.
    pub told: Option<ToldValue>,
}

/// Sends deliveries to one endpoint.
pub struct Sender {
    client: reqwest::Client,
    url: Url,
    signer: standardwebhooks::Webhook,
    headers: HeaderMap,
    timeout: Duration,
    /// Where the identity a receiver answers with goes ([`super::catch_up`]).
    identity: Option<tokio::sync::watch::Sender<Option<ReceiverIdentity>>>,
}

impl Sender {
    /// Builds the client from the endpoint's config, resolving names with the system resolver.
    /// Errors: [`RelayError::Endpoint`] for unreadable or invalid TLS material, a bad header value,
    /// or an invalid secret.
    pub fn new(cfg: &WebhookConfig) -> Result<Self, RelayError> {
        Self::with_lookup(cfg, system_lookup())
    }

    /// Passes the identity each answer carries, when it carries one (a receiver that speaks the
    /// identity contract, [`vipwatch_contract::receiver`]), to `identity`.
    pub fn reporting_identity(mut self, identity: tokio::sync::watch::Sender<Option<ReceiverIdentity>>) -> Self {
        self.identity = Some(identity);
        self
    }

    /// [`Sender::new`] resolving names with `lookup` (a test's fixed answers); forbidden addresses
    /// are dropped all the same. Errors: as [`Sender::new`].
    pub fn with_lookup(cfg: &WebhookConfig, lookup: Lookup) -> Result<Self, RelayError> {
        let err = |what: String| RelayError::Endpoint { name: cfg.name.clone(), reason: what };
        let signer = signer(cfg)?;
        let client = client(cfg, lookup)?;
        let mut headers = HeaderMap::new();
        for (name, value) in &cfg.headers {
            let name = HeaderName::from_bytes(name.as_bytes()).map_err(|e| err(format!("header name: {e}")))?;
            let mut value =
                HeaderValue::from_str(value.expose()).map_err(|_| err(format!("header `{name}`: bad value")))?;
            value.set_sensitive(true);
            headers.insert(name, value);
        }
        Ok(Self { client, url: cfg.url.clone(), signer, headers, timeout: cfg.timeout, identity: None })
    }

    /// POSTs `payload` with `webhook-id: msg_id`, a fresh `webhook-timestamp` and its signature. Never
    /// fails: transport errors become the attempt's `error_class`.
    pub async fn send(&self, msg_id: &str, payload: &str) -> AttemptResult {
        let started_at = now_ms();
        let clock = Instant::now();
        let safety = self.timeout + Duration::from_secs(1);
        let result = tokio::time::timeout(safety, self.exchange(msg_id, payload)).await;
        let mut out = match result {
            Ok(out) => out,
            Err(_) => failure("timeout", format!("no complete answer within {:?}", self.timeout)),
        };
        out.record.started_at = started_at;
        out.record.duration_ms = i64::try_from(clock.elapsed().as_millis()).unwrap_or(i64::MAX);
        out
    }

    async fn exchange(&self, msg_id: &str, payload: &str) -> AttemptResult {
        let timestamp = jiff::Timestamp::now().as_second();
        let signature = match self.signer.sign(msg_id, timestamp, payload.as_bytes()) {
            Ok(s) => s,
            Err(e) => return failure("http", format!("cannot sign: {e}")),
        };
        let request = self
            .client
            .post(self.url.clone())
            .headers(self.headers.clone())
            .header(CONTENT_TYPE, "application/json")
            .header("webhook-id", msg_id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(payload.to_owned());
        match request.send().await {
            Ok(response) => {
                if let Some(tx) = &self.identity {
                    let headers = response.headers();
                    let id = ReceiverIdentity::from_headers(|n| headers.get(n).and_then(|v| v.to_str().ok()));
                    if id.is_some() {
                        tx.send_replace(id);
                    }
                }
                read_response(response).await
            }
            Err(e) => failure(classify(&e), error_chain(&e)),
        }
    }
}

/// The endpoint's HTTP client: its timeouts and TLS material, no redirects, names resolved with
/// `lookup` minus forbidden addresses. Errors: [`RelayError::Endpoint`] for unreadable or invalid TLS
/// material.
pub(super) fn client(cfg: &WebhookConfig, lookup: Lookup) -> Result<reqwest::Client, RelayError> {
    install_crypto_provider();
    let err = |what: String| RelayError::Endpoint { name: cfg.name.clone(), reason: what };
    let mut builder = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(cfg.timeout)
        .connect_timeout(cfg.connect_timeout)
        .dns_resolver(GuardedResolver { lookup, allow_link_local: cfg.allow_link_local })
        .user_agent(USER_AGENT);
    if let Some(path) = &cfg.tls.ca_file {
        let pem = std::fs::read(path).map_err(|e| err(format!("tls.ca_file {}: {e}", path.display())))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| err(format!("tls.ca_file: {e}")))?;
        for cert in certs {
            builder = builder.add_root_certificate(cert);
        }
    }
    if let (Some(cert), Some(key)) = (&cfg.tls.client_cert_file, &cfg.tls.client_key_file) {
        let mut pem = std::fs::read(cert).map_err(|e| err(format!("tls.client_cert_file: {e}")))?;
        pem.extend(std::fs::read(key).map_err(|e| err(format!("tls.client_key_file: {e}")))?);
        let identity = reqwest::Identity::from_pem(&pem).map_err(|e| err(format!("tls client identity: {e}")))?;
        builder = builder.identity(identity);
    }
    builder.build().map_err(|e| err(format!("HTTP client: {e}")))
}

/// The endpoint's Standard Webhooks signer. Errors: [`RelayError::Endpoint`] for a missing or invalid
/// secret.
pub(super) fn signer(cfg: &WebhookConfig) -> Result<standardwebhooks::Webhook, RelayError> {
    let err = |what: String| RelayError::Endpoint { name: cfg.name.clone(), reason: what };
    let secret = cfg.resolve_secret().map_err(|e| err(e.to_string()))?;
    standardwebhooks::Webhook::new(secret.expose()).map_err(|e| err(format!("secret: {e}")))
}

/// Reads a response: status, at most [`MAX_BODY_READ`] body bytes, and the plain-webhook verdict
/// (2xx success, 410 gone, else retry with `Retry-After`). An answer whose body does not arrive whole
/// (the status line came, then the body stalled past the timeout or the connection broke) is no
/// answer: the receiver may not have finished, so it is a failure of the transport's class
/// (`timeout`, `connect`), retried, whatever its status said. Values kept from the answer are bounded
/// ([`crate::model::bounded`]).
pub(super) async fn read_response(mut response: reqwest::Response) -> AttemptResult {
    let status = response.status();
    let headers = response.headers().clone();
    let mut body = Vec::new();
    while body.len() < MAX_BODY_READ {
        match response.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            Ok(None) => break,
            Err(e) => return incomplete(status, &e),
        }
    }
    body.truncate(MAX_BODY_READ);
    drop(response);
    let kept = bound(String::from_utf8_lossy(&body).into_owned(), MAX_BODY_KEPT);
    let header = |name| headers.get(name).map(|v: &HeaderValue| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let mut record = AttemptRecord {
        status_code: Some(status.as_u16()),
        response_body: (!kept.is_empty()).then_some(kept),
        ..AttemptRecord::default()
    };
    let verdict = if status.is_success() {
        Verdict::Success
    } else if status.is_redirection() {
        record.error_class = Some("redirect");
        record.location = header(LOCATION).map(|l| bound(l, bounded::HEADER));
        record.error = Some(format!("HTTP {status}: redirects are not followed"));
        Verdict::Retry { retry_after: None }
    } else if status == reqwest::StatusCode::GONE {
        record.error_class = Some("http");
        record.error = Some("HTTP 410 Gone: endpoint disabled".into());
        Verdict::Gone
    } else {
        record.error_class = Some("http");
        record.error = Some(match bounded::reason(&body) {
            Some(why) => format!("HTTP {status}: {why}"),
            None => format!("HTTP {status}"),
        });
        Verdict::Retry { retry_after: header(RETRY_AFTER).and_then(|v| retry_after(status.as_u16(), &v)) }
    };
    AttemptResult { record, verdict, body, told: None }
}

/// The attempt whose answer began (`status`) but whose body did not arrive whole (`e`).
fn incomplete(status: reqwest::StatusCode, e: &reqwest::Error) -> AttemptResult {
    let why = format!("HTTP {status} began, but its body did not arrive whole: {}", error_chain(e));
    failure(classify(e), why)
}

/// A receiver's `Retry-After` (on `status`): the delay it asks for, or `None` with a log line when
/// the value is neither delay-seconds nor an HTTP date.
fn retry_after(status: u16, value: &str) -> Option<Duration> {
    let parsed = parse_retry_after(value, SystemTime::now());
    if parsed.is_none() {
        let value = bounded::bounded(value, bounded::QUOTE);
        warn!(status, value = %value, "Retry-After not understood (neither seconds nor an HTTP date); using the retry schedule");
    }
    parsed
}

/// Installs rustls' `ring` provider as the process default (idempotent). reqwest is built without a
/// provider of its own (kube already brings `ring`; a second provider would make rustls refuse to pick).
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A failed attempt of error class `class` (retried); the message is bounded.
pub(super) fn failure(class: &'static str, error: String) -> AttemptResult {
    let error = Some(bound(bounded::one_line(&error).into_owned(), bounded::MESSAGE));
    let record = AttemptRecord { error_class: Some(class), error, ..AttemptRecord::default() };
    AttemptResult { record, verdict: Verdict::Retry { retry_after: None }, body: Vec::new(), told: None }
}

/// `timeout`, `forbidden_address`, `tls` or `connect` for a transport error.
pub(super) fn classify(e: &reqwest::Error) -> &'static str {
    if e.is_timeout() {
        "timeout"
    } else if in_chain::<ForbiddenAddress>(e) {
        "forbidden_address"
    } else if in_chain::<rustls::Error>(e) {
        "tls"
    } else {
        "connect"
    }
}

/// Whether some error in `e`'s source chain is a `T`. An `io::Error` wrapping another error is
/// looked into (its `source()` skips the wrapped error itself): hyper-util reports a rustls
/// certificate error as `io::Error(Other, io::Error(InvalidData, rustls::Error))`.
fn in_chain<T: std::error::Error + 'static>(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if err.downcast_ref::<T>().is_some() {
            return true;
        }
        cur = match err.downcast_ref::<std::io::Error>().and_then(std::io::Error::get_ref) {
            Some(inner) => Some(inner),
            None => err.source(),
        };
    }
    false
}

/// `e` and its sources, `: `-separated.
pub(super) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(err) = cur {
        out.push_str(": ");
        out.push_str(&err.to_string());
        cur = err.source();
    }
    out
}
