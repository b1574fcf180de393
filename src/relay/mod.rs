//! The relay: routes every recorded event to the matching webhook endpoints (the outbox rows written in
//! the event's transaction) and runs one dispatcher per endpoint that delivers them — signed
//! (Standard Webhooks), at least once, strictly in order per (endpoint, Service), with retries.
//!
//! Ordering and collapsing rule: per (endpoint, Service) only the oldest pending delivery (the queue
//! head) is ever sent; the next one waits until it succeeded or failed for good. While an earlier
//! delivery of a Service is pending, a newer pending MODIFIED makes older pending MODIFIEDs behind the
//! head `superseded` (the newest carries the full current view; the events stay in the log). ADDED,
//! DELETED and `service.synced` are never superseded, so a run of MODIFIEDs never swallows them.

mod assign;
mod dispatcher;
pub mod payload;
pub mod policy;
pub mod sender;

use std::collections::HashSet;
use std::sync::Arc;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::config::{Config, WebhookConfig, redact_url};
use crate::metrics::Metrics;
use vipwatch_contract::EventKind;

use crate::model::{Cause, Feedback, LabelSelector};
use crate::store::{NewDelivery, Outbox, RecordedEvent, ServiceRow, Store, StoreError};
use payload::{PayloadInput, render};

/// Errors that stop the relay from starting.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// An endpoint cannot be set up (TLS files, header values, secret).
    #[error("webhook `{name}`: {reason}")]
    Endpoint {
        /// Endpoint name.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// `--webhook NAME` names no configured, enabled endpoint.
    #[error("no enabled webhook named `{0}` in the configuration")]
    UnknownWebhook(String),
}

/// A fresh `webhook-id`: `msg_` + 32 hex digits (random; no `.`, as the spec requires).
pub fn new_msg_id() -> String {
    format!("msg_{}", uuid::Uuid::new_v4().simple())
}

struct Route {
    name: String,
    assigns_vip: bool,
    events: HashSet<String>,
    namespaces: Vec<String>,
    selector: LabelSelector,
}

impl Route {
    fn accepts(&self, e: &RecordedEvent<'_>) -> bool {
        // The assigning appliance already knows the address it chose; echoing it back would let an
        // appliance that answers every request with a new address loop forever.
        if self.assigns_vip && e.cause == Cause::Appliance {
            return false;
        }
        let ns_ok = self.namespaces.is_empty() || self.namespaces.contains(&e.key.namespace);
        let labels_ok = self.selector.matches(&e.event.view.labels)
            || e.event.previous.as_ref().is_some_and(|p| self.selector.matches(&p.labels));
        self.events.contains(e.event.kind.as_str()) && ns_ok && labels_ok
    }

    fn accepts_service(&self, s: &ServiceRow) -> bool {
        (self.namespaces.is_empty() || self.namespaces.contains(&s.key.namespace))
            && self.selector.matches(&s.view.labels)
    }
}

/// Routes events to the enabled endpoints whose `events`, `namespaces` and `label_selector` accept
/// them (a MODIFIED is sent when the labels before or after the change match). Implements the
/// store's [`Outbox`].
pub struct Router {
    routes: Vec<Route>,
}

impl Router {
    /// Builds the routes of every enabled endpoint. Errors: [`RelayError::Endpoint`] for a label
    /// selector that does not parse (already rejected by config validation).
    pub fn new(webhooks: &[WebhookConfig]) -> Result<Self, RelayError> {
        let routes = webhooks
            .iter()
            .filter(|w| w.enabled)
            .map(|w| {
                let selector = LabelSelector::parse(&w.label_selector)
                    .map_err(|e| RelayError::Endpoint { name: w.name.clone(), reason: e.to_string() })?;
                Ok(Route {
                    name: w.name.clone(),
                    assigns_vip: w.assigns_vip,
                    events: w.events.iter().cloned().collect(),
                    namespaces: w.namespaces.clone(),
                    selector,
                })
            })
            .collect::<Result<_, RelayError>>()?;
        Ok(Self { routes })
    }
}

impl Outbox for Router {
    fn route(&self, e: RecordedEvent<'_>) -> Vec<NewDelivery> {
        let targets: Vec<&Route> = self.routes.iter().filter(|r| r.accepts(&e)).collect();
        if targets.is_empty() {
            return Vec::new();
        }
        let payload = render(&PayloadInput {
            event_id: Some(e.id),
            event: e.event.kind.event_kind(),
            cause: e.cause,
            observed_at: e.observed_at,
            key: e.key,
            uid: &e.event.uid,
            resource_version: &e.event.resource_version,
            view: &e.event.view,
            previous: e.event.previous.as_ref(),
            changed: &e.event.changed,
        });
        targets
            .into_iter()
            .map(|r| NewDelivery {
                webhook: r.name.clone(),
                kind: e.event.kind.as_str(),
                msg_id: new_msg_id(),
                payload: payload.clone(),
            })
            .collect()
    }
}

/// Enqueues a `service.synced` delivery with the current view of every in-scope Service for each
/// named endpoint (all enabled endpoints when `only` is `None`). Returns how many per endpoint.
/// Errors: [`RelayError::UnknownWebhook`], [`RelayError::Store`].
pub async fn resync(store: &Store, config: &Config, only: Option<&str>) -> Result<Vec<(String, usize)>, RelayError> {
    let router = Router::new(&config.webhooks)?;
    if let Some(name) = only
        && !router.routes.iter().any(|r| r.name == name)
    {
        return Err(RelayError::UnknownWebhook(name.to_owned()));
    }
    let mut out = Vec::new();
    for route in router.routes.iter().filter(|r| only.is_none_or(|n| n == r.name)) {
        let now = crate::store::now_ms();
        let n = store.enqueue_synced(|s| route.accepts_service(s).then(|| synced(route, s, now))).await?;
        out.push((route.name.clone(), n));
    }
    Ok(out)
}

fn synced(route: &Route, s: &ServiceRow, now: i64) -> NewDelivery {
    let payload = render(&PayloadInput {
        event_id: None,
        event: EventKind::Synced,
        cause: Cause::Resync,
        observed_at: now,
        key: &s.key,
        uid: &s.uid,
        resource_version: &s.resource_version,
        view: &s.view,
        previous: None,
        changed: &[],
    });
    NewDelivery { webhook: route.name.clone(), kind: "SYNCED", msg_id: new_msg_id(), payload }
}

/// Starts one dispatcher per enabled endpoint; those with `assigns_vip` send the addresses in their
/// responses to `assignments`. Clears leases first (after a crash, what was in flight
/// is sent again) and re-enables endpoints disabled by a 410 whose configured URL changed since.
/// Errors: [`RelayError`] when an endpoint's client cannot be built or the database fails.
pub async fn start(
    config: &Config,
    store: Store,
    metrics: Arc<Metrics>,
    committed: watch::Receiver<i64>,
    assignments: mpsc::Sender<Feedback>,
    cancel: CancellationToken,
) -> Result<JoinSet<()>, RelayError> {
    let released = store.release_leases().await?;
    if released > 0 {
        info!(deliveries = released, "re-sending deliveries that were in flight when vipwatch stopped");
    }
    let mut tasks = JoinSet::new();
    for w in config.webhooks.iter().filter(|w| w.enabled) {
        if let Some(state) = store.webhook_state(&w.name).await?
            && state.disabled_url.as_deref() != Some(redact_url(&w.url).as_str())
        {
            store.enable_webhook(&w.name).await?;
            info!(webhook = %w.name, "re-enabled: its URL changed since it answered 410");
        }
        let d = dispatcher::Dispatcher {
            name: w.name.clone(),
            url: redact_url(&w.url),
            store: store.clone(),
            sender: Arc::new(sender::Sender::new(w)?),
            retry: w.retry.clone(),
            relay: config.relay.clone(),
            metrics: metrics.clone(),
            assignments: w.assigns_vip.then(|| assignments.clone()),
        };
        tasks.spawn(d.run(committed.clone(), cancel.clone()));
    }
    Ok(tasks)
}
