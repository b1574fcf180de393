//! The agent's HTTP side: a `POST` on any path is a delivery (Standard Webhooks signature checked
//! against every configured secret, duplicate `webhook-id`s answered without applying twice), a
//! `GET` on it a probe ([`vipwatch_contract::receiver`]); `GET /healthz`, `GET /state` and
//! `GET /metrics`. Every answer carries the agent's identity headers (the state's generation, the
//! run), and answers about a cluster whether the agent is caught up with it ([`crate::catchup`]).
//!
//! Answers (docs/reference/agent-api.md): 200 once the change is live (or when it is a duplicate or
//! stale, with the reason); 202 `held` while the agent holds a HAProxy it did not configure (its
//! state was lost): recorded, live with the full resync that makes it caught up; 401 for a bad or old signature; 400 for a signed body that is not a
//! vipwatch delivery; 409 (problem+json, with the reason) for a cluster name another vipwatch holds
//! (see [`crate::clusters`]); 422 (problem+json, with the reason) for a Service HAProxy can never
//! serve; 503 with `Retry-After` for transient trouble. Never 410, which would make vipwatch disable the
//! endpoint.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use vipwatch_contract::WebhookPayload;

use crate::apply::{Job, Outcome, Status};
use crate::metrics::{AnswerLabels, Metrics};
use crate::supervise::Health;

/// Largest delivery body, in bytes (a Service with 10,000 members is about 1.5 MB); larger ones get
/// a 413 problem.
pub const MAX_BODY: usize = 16 * 1024 * 1024;

/// `webhook-id`s remembered for deduplication.
const SEEN: usize = 10_000;

/// What the handlers share.
#[derive(Clone)]
pub struct Http {
    /// One verifier per configured secret.
    pub verifiers: Arc<Vec<standardwebhooks::Webhook>>,
    /// The applier's queue.
    pub jobs: mpsc::Sender<Job>,
    /// The applier's status.
    pub status: watch::Receiver<Status>,
    /// What the supervisor last saw of HAProxy.
    pub health: watch::Receiver<Health>,
    /// HAProxy itself: `/healthz` checks that its master process still runs at every request, so a
    /// master that died since the supervisor last looked is reported at once.
    pub haproxy: Arc<crate::haproxy::Haproxy>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Recently applied `webhook-id`s.
    pub seen: Arc<Mutex<Seen>>,
    /// How long a delivery may wait for its outcome before a 503.
    pub patience: Duration,
    /// The deliveries the agent asks a sender to keep in flight (`concurrency`), on every answer.
    pub concurrency: usize,
}

/// A bounded set of recent `webhook-id`s.
#[derive(Debug, Default)]
pub struct Seen {
    order: VecDeque<String>,
    ids: HashSet<String>,
}

impl Seen {
    fn contains(&self, id: &str) -> bool {
        self.ids.contains(id)
    }

    fn insert(&mut self, id: String) {
        if self.ids.insert(id.clone()) {
            self.order.push_back(id);
        }
        while self.order.len() > SEEN {
            if let Some(old) = self.order.pop_front() {
                self.ids.remove(&old);
            }
        }
    }
}

/// The agent's routes.
pub fn router(http: Http) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/state", get(state))
        .route("/metrics", get(metrics))
        .fallback(deliver)
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
        .layer(axum::middleware::map_response_with_state(http.clone(), identify))
        .with_state(http)
}

/// Adds the identity headers (generation, instance) to every answer; the caught-up header is added
/// where an answer is about a cluster.
async fn identify(State(http): State<Http>, mut response: Response) -> Response {
    let identity = http.status.borrow().catch_up.identity(None);
    set_headers(&mut response, identity, &http);
    response
}

fn set_headers(response: &mut Response, mut identity: vipwatch_contract::ReceiverIdentity, http: &Http) {
    identity.concurrency = Some(http.concurrency);
    for (name, value) in identity.headers() {
        if let Ok(value) = header::HeaderValue::from_str(&value) {
            response.headers_mut().insert(name, value);
        }
    }
}

/// `caught-up` for `cluster` on `response`.
fn about(mut response: Response, cluster: &str, http: &Http) -> Response {
    let identity = http.status.borrow().catch_up.identity(Some(cluster));
    set_headers(&mut response, identity, http);
    response
}

async fn deliver(
    State(http): State<Http>,
    method: axum::http::Method,
    headers: HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    if method == axum::http::Method::GET || method == axum::http::Method::HEAD {
        return probe(&http, &headers);
    }
    if method != axum::http::Method::POST {
        return problem(StatusCode::METHOD_NOT_ALLOWED, "deliveries are POSTed (a GET is a probe)", &http);
    }
    let body = match body {
        Ok(b) => b,
        Err(e) => {
            tracing::warn!(error = %e, "refused: the body could not be read (larger than 16 MiB?)");
            return problem(e.status(), &e.body_text(), &http);
        }
    };
    let received = Instant::now();
    if !http.verifiers.iter().any(|v| v.verify(&body, &headers).is_ok()) {
        let id = headers.get("webhook-id").and_then(|v| v.to_str().ok()).unwrap_or_default();
        tracing::warn!(webhook_id = %id, "refused: the signature does not verify (wrong secret, or a clock more than 5 min off)");
        return problem(
            StatusCode::UNAUTHORIZED,
            "the Standard Webhooks signature does not verify (wrong secret, or a timestamp more than 5 minutes off)",
            &http,
        );
    }
    let id = headers.get("webhook-id").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    if http.seen.lock().unwrap_or_else(|p| p.into_inner()).contains(&id) {
        return answer(StatusCode::OK, json!({"status": "duplicate"}), &http);
    }
    // A `type` this agent does not know is acknowledged, as the contract asks of every receiver:
    // vipwatch may add types without a new version.
    if let Some(kind) = unknown_type(&body) {
        tracing::info!(webhook_id = %id, kind = %kind, "ignored: a delivery type this agent does not know");
        http.seen.lock().unwrap_or_else(|p| p.into_inner()).insert(id);
        return answer(StatusCode::OK, json!({"status": "ignored", "reason": format!("unknown type `{kind}`")}), &http);
    }
    let payload: WebhookPayload = match serde_json::from_slice(&body) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(webhook_id = %id, error = %e, "refused: signed, but not a vipwatch delivery");
            return problem(StatusCode::BAD_REQUEST, &format!("not a vipwatch delivery: {e}"), &http);
        }
    };
    let cluster = payload.data.cluster.clone().unwrap_or_else(|| crate::state::DEFAULT_CLUSTER.to_owned());
    let (reply, outcome) = oneshot::channel();
    if http.jobs.send(Job { payload, received, reply }).await.is_err() {
        return unavailable("the agent is stopping", &http);
    }
    let response = outcome_response(tokio::time::timeout(http.patience, outcome).await, id, &http);
    about(response, &cluster, &http)
}

/// The answer to a delivery, from its outcome (`Err`: not in time).
fn outcome_response(
    outcome: Result<Result<Outcome, oneshot::error::RecvError>, tokio::time::error::Elapsed>,
    id: String,
    http: &Http,
) -> Response {
    match outcome {
        Ok(Ok(Outcome::Applied)) => {
            http.seen.lock().unwrap_or_else(|p| p.into_inner()).insert(id);
            answer(StatusCode::OK, json!({"status": "applied"}), http)
        }
        Ok(Ok(Outcome::Ignored(why))) => {
            http.seen.lock().unwrap_or_else(|p| p.into_inner()).insert(id);
            answer(StatusCode::OK, json!({"status": "ignored", "reason": why}), http)
        }
        Ok(Ok(Outcome::Rejected(why))) => problem(StatusCode::UNPROCESSABLE_ENTITY, &why, http),
        Ok(Ok(Outcome::Conflict(why))) => problem(StatusCode::CONFLICT, &why, http),
        Ok(Ok(Outcome::Unavailable(why))) => unavailable(&why, http),
        Ok(Ok(Outcome::Held(why))) => answer(StatusCode::ACCEPTED, json!({"status": "held", "reason": why}), http),
        Ok(Err(_)) => unavailable("the agent is stopping", http),
        Err(_) => unavailable("the change was not live in time", http),
    }
}

/// The answer to a probe (`GET` on a delivery path): the agent's state for the cluster in the
/// `vipwatch-cluster` header (`default` when absent), as headers and as JSON.
fn probe(http: &Http, headers: &HeaderMap) -> Response {
    let cluster = headers
        .get(vipwatch_contract::receiver::CLUSTER_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .unwrap_or(crate::state::DEFAULT_CLUSTER)
        .to_owned();
    let body = {
        let status = http.status.borrow();
        status.catch_up.probe(&cluster, status.desired.clusters.keys().cloned())
    };
    let body = serde_json::to_string(&body).unwrap_or_default();
    about(([(header::CONTENT_TYPE, "application/json")], body).into_response(), &cluster, http)
}

/// The `type` of a JSON body when it is a string this agent does not know.
fn unknown_type(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Typed {
        #[serde(rename = "type")]
        kind: String,
    }
    let typed: Typed = serde_json::from_slice(body).ok()?;
    let known = serde_json::from_value::<vipwatch_contract::PayloadType>(json!(typed.kind)).is_ok();
    (!known).then_some(typed.kind)
}

fn answer(status: StatusCode, body: serde_json::Value, http: &Http) -> Response {
    http.metrics.deliveries.get_or_create(&AnswerLabels { status: status.as_u16().to_string() }).inc();
    (status, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

fn problem(status: StatusCode, detail: &str, http: &Http) -> Response {
    http.metrics.deliveries.get_or_create(&AnswerLabels { status: status.as_u16().to_string() }).inc();
    let body =
        json!({"type": "about:blank", "title": status.canonical_reason(), "status": status.as_u16(), "detail": detail});
    (status, [(header::CONTENT_TYPE, "application/problem+json")], body.to_string()).into_response()
}

fn unavailable(detail: &str, http: &Http) -> Response {
    let mut r = problem(StatusCode::SERVICE_UNAVAILABLE, detail, http);
    r.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    r
}

/// `200 ok` while HAProxy answers with a worker and the agent is caught up; else `503` with the
/// first reason that holds: `not healthy: the applier stopped`, `not healthy: <HAProxy's trouble>`
/// (what the supervisor last saw, or a master process gone since),
/// `not caught up: <what it waits for>` (docs/reference/agent-api.md).
async fn healthz(State(http): State<Http>) -> Response {
    let unhealthy = |why: String| (StatusCode::SERVICE_UNAVAILABLE, why).into_response();
    if http.jobs.is_closed() {
        return unhealthy("not healthy: the applier stopped".into());
    }
    let health = http.health.borrow().clone();
    if !health.up {
        return unhealthy(format!(
            "not healthy: {}",
            health.reason.unwrap_or_else(|| "HAProxy is not answering".into())
        ));
    }
    // The pid file, else the master pid `show proc` last gave (a pid file removed while HAProxy ran).
    match http.haproxy.pid().or(health.pid) {
        Some(pid) if !http.haproxy.is_master(pid) => {
            return unhealthy(format!("not healthy: the HAProxy master (pid {pid}) exited; the agent starts it again"));
        }
        None => return unhealthy("not healthy: no HAProxy master runs (no pid file)".into()),
        Some(_) => {}
    }
    match http.status.borrow().catch_up.reason() {
        Some(why) => unhealthy(why),
        None => (StatusCode::OK, "ok").into_response(),
    }
}

/// The applied state: per cluster its bound event log, Service count, last delivery and the
/// refusals of its name; per Service its cluster, uid, version, VIPs, ports and member count; the
/// config hash (shape: docs/reference/agent-api.md).
async fn state(State(http): State<Http>) -> Response {
    let s = http.status.borrow().clone();
    let now = Instant::now();
    let ago = |t: Instant| now.duration_since(t).as_secs();
    let counts = s.desired.services_per_cluster();
    let clusters: Vec<serde_json::Value> = s
        .desired
        .clusters
        .iter()
        .map(|(name, b)| {
            let live = s.liveness.get(name).cloned().unwrap_or_default();
            let last_conflict = live.last_conflict.map(|c| {
                json!({"logId": c.log_id, "secondsAgo": ago(c.at), "reason": c.reason})
            });
            json!({"cluster": name, "logId": b.log_id, "services": counts.get(&Some(name.clone())).copied().unwrap_or(0),
                   "caughtUp": s.catch_up.cluster(name),
                   "lastDeliverySecondsAgo": live.last_delivery.map(ago),
                   "formerNames": b.former_names.keys().collect::<Vec<_>>(),
                   "conflicts": live.conflicts, "lastConflict": last_conflict, "takeovers": live.takeovers})
        })
        .collect();
    let services: Vec<serde_json::Value> = s
        .desired
        .services
        .iter()
        .map(|(key, a)| {
            let members = a.service.backends.as_ref().map_or(0, |b| b.members().count());
            let ports: Vec<String> =
                a.service.view.ports.iter().map(|p| format!("{}/{}", p.port, p.protocol)).collect();
            json!({"cluster": key.cluster, "service": key.service(), "uid": a.service.uid,
                   "resourceVersion": a.version.resource_version, "eventId": a.version.event_id,
                   "logId": a.version.log_id, "vips": a.service.vips, "ports": ports, "members": members})
        })
        .collect();
    let health = http.health.borrow().clone();
    let c = &s.catch_up;
    let body = json!({"haproxyUp": health.up, "haproxyPid": health.pid, "haproxyRestarts": health.restarts,
                      "lastError": s.last_error, "configSha256": s.config_sha256,
                      "generation": c.generation(), "caughtUp": c.caught_up(), "waitingFor": c.waiting_for(),
                      "holding": c.held, "clusters": clusters, "services": services});
    ([(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

async fn metrics(State(http): State<Http>) -> Response {
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], http.metrics.render())
        .into_response()
}
