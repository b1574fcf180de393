//! The relay: one dispatcher per webhook endpoint delivers the outbox rows ([`crate::route`] wrote
//! them in each event's transaction) — signed (Standard Webhooks), at least once, strictly in order
//! per (endpoint, Service), with retries and a circuit breaker.
//!
//! Ordering and collapsing rule: per (endpoint, Service) only the oldest pending delivery (the queue
//! head) is ever sent; the next one waits until it succeeded or failed for good. A newer pending
//! MODIFIED makes the older pending MODIFIEDs of its Service `superseded` — those behind the head, and
//! the head itself while no attempt has touched it — and takes the earliest place in line among them
//! (the claim's order is the due time, `next_attempt_at`); the newest carries the full current view,
//! and the events stay in the log. A never-claimed pending MODIFIED that ends its queue takes the
//! newer change in place instead (same outcome, one row update: `REWRITE` in `store::outbox`).
//! ADDED, DELETED and `service.synced` are never superseded by a MODIFIED, so a run of MODIFIEDs
//! never swallows them.

mod assign;
pub mod catch_up;
pub mod circuit;
mod dispatch;
mod dispatcher;
pub mod full_state;
pub mod policy;
pub mod resolve;
pub mod sender;
pub mod templated;

use std::sync::Arc;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::config::{Config, RelayConfig, redact_url};
use crate::metrics::Metrics;
use crate::model::Feedback;
use crate::store::{Circuits, Store, StoreError};

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
}

/// Starts one dispatcher per enabled endpoint; those with `assigns_vip` send the addresses in their
/// responses to `assignments`; each publishes its circuit breaker's state in `circuits`. Clears
/// leases first (after a crash, what was in flight is sent again) and re-enables endpoints
/// disabled by a 410 whose configured URL changed since.
/// Errors: [`RelayError`] when an endpoint's client cannot be built or the database fails.
#[allow(clippy::too_many_arguments)]
pub async fn start(
    config: &Config,
    store: Store,
    metrics: Arc<Metrics>,
    circuits: Circuits,
    committed: watch::Receiver<i64>,
    acked: watch::Sender<u64>,
    assignments: mpsc::Sender<Feedback>,
    leader_deadline: crate::leader::LeaderDeadline,
    cancel: CancellationToken,
) -> Result<JoinSet<()>, RelayError> {
    let released = store.release_leases().await?;
    if released > 0 {
        info!(deliveries = released, "re-sending deliveries that were in flight when vipwatch stopped");
    }
    let mut tasks = JoinSet::new();
    let shared = Arc::new(config.clone());
    for w in config.webhooks.iter().filter(|w| w.enabled) {
        if let Some(state) = store.webhook_state(&w.name).await?
            && state.disabled_url.as_deref() != Some(redact_url(&w.url).as_str())
        {
            store.enable_webhook(&w.name).await?;
            info!(webhook = %w.name, "re-enabled: its URL changed since it answered 410");
        }
        let (identity_tx, identity_rx) = watch::channel(None);
        let (reachable_tx, reachable_rx) = watch::channel(0u64);
        // A receiver's own word on how many deliveries it takes at once counts only when the
        // endpoint has no `concurrency` of its own.
        let (advertised_tx, advertised_rx) = watch::channel(None);
        let advertised = (w.template.is_none() && w.concurrency.is_none()).then_some((advertised_tx, advertised_rx));
        let (advertised_tx, advertised_rx) = advertised.unzip();
        if w.template.is_none() {
            let client = sender::client(w, resolve::system_lookup())?;
            let (store, metrics, leader_deadline) = (store.clone(), metrics.clone(), leader_deadline.clone());
            let (name, url) = (w.name.clone(), w.url.clone());
            let watch = catch_up::watch(
                name,
                url,
                client,
                identity_rx,
                reachable_tx,
                advertised_tx,
                shared.clone(),
                store,
                metrics,
                leader_deadline,
                cancel.clone(),
            );
            tasks.spawn(watch);
        }
        let transport = match &w.template {
            None => templated::Transport::Plain(Box::new(sender::Sender::new(w)?.reporting_identity(identity_tx))),
            Some(t) => {
                let full = (t.mode == crate::config::TemplateMode::FullState)
                    .then(|| full_state::FullState::new(config, w, store.clone(), metrics.clone()))
                    .transpose()?;
                templated::Transport::Template(Box::new(templated::TemplateSender::new(w, full, store.clone())?))
            }
        };
        let d = dispatcher::Dispatcher {
            name: w.name.clone(),
            url: redact_url(&w.url),
            store: store.clone(),
            sender: Arc::new(transport),
            retry: w.retry.clone(),
            relay: RelayConfig {
                concurrency: w.concurrency.unwrap_or(config.relay.concurrency),
                ..config.relay.clone()
            },
            metrics: metrics.clone(),
            assignments: w.assigns_vip.then(|| assignments.clone()),
            acked: acked.clone(),
            circuit_failures: w.circuit_failures.unwrap_or(config.relay.circuit_failures),
            circuits: circuits.clone(),
            leading_until: leader_deadline.clone(),
            reachable: w.template.is_none().then_some(reachable_rx),
            advertised: advertised_rx,
        };
        tasks.spawn(d.run(committed.clone(), cancel.clone()));
    }
    Ok(tasks)
}
