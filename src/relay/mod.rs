//! The relay: routes every recorded event to the matching webhook endpoints (the outbox rows written in
//! the event's transaction) and runs one dispatcher per endpoint that delivers them — signed
//! (Standard Webhooks), at least once, strictly in order per (endpoint, Service), with retries.
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
pub mod circuit;
mod dispatcher;
pub mod full_state;
pub mod payload;
pub mod policy;
pub mod resolve;
mod router;
pub mod sender;
pub mod templated;

use std::sync::Arc;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::info;

pub use circuit::{CircuitState, CircuitView, Circuits};
pub use router::Router;
use vipwatch_contract::SyncMarker;

use crate::config::{Config, RelayConfig, redact_url};
use crate::metrics::Metrics;
use crate::model::{Feedback, ServiceKey};
use crate::store::{NewDelivery, Store, StoreError};

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

/// A fresh `webhook-id`: `msg_` + 32 hex digits (no `.`, as the spec requires), a UUIDv7 (RFC 9562):
/// 48 bits of Unix milliseconds, then a counter seeded at random each millisecond, then random bits;
/// ordered by creation within this process (the `uuid` crate's shared context, which also holds the
/// order when the clock steps back). An id shows when it was made.
///
/// The ordering is for the database: `deliveries.msg_id` is a unique index, and a random id put
/// every new delivery on a random leaf page of it, one more page in the WAL per change (about 110
/// distinct pages for a transaction of 128 changes); ordered ids go to its last page. Receivers must
/// still treat it as opaque: only its uniqueness is promised.
pub fn new_msg_id() -> String {
    format!("msg_{}", uuid::Uuid::now_v7().simple())
}

/// Enqueues a full resync for each named endpoint (all enabled endpoints when `only` is `None`): a
/// `service.synced` delivery with the current view and members of every in-scope Service it takes,
/// each marked with the resync's id, its index and the total, then one `sync.completed`. Returns how
/// many Services per endpoint. Each endpoint's deliveries are made from a snapshot of the state table
/// taken in the transaction that enqueues them ([`Store::enqueue_resync`]), so a change recorded
/// meanwhile is neither superseded unseen nor overtaken by an older state.
/// Errors: [`RelayError::UnknownWebhook`], [`RelayError::Store`].
pub async fn resync(store: &Store, config: &Config, only: Option<&str>) -> Result<Vec<(String, usize)>, RelayError> {
    let router = Router::new(config, store.log_id())?;
    if let Some(name) = only
        && !router.routes.iter().any(|r| r.name == name)
    {
        return Err(RelayError::UnknownWebhook(name.to_owned()));
    }
    let mut out = Vec::new();
    for route in router.routes.iter().filter(|r| only.is_none_or(|n| n == r.name)) {
        if route.full_state.is_some() {
            // One declaration of everything, due now (it renders the state table when sent).
            let n = store.services().await?.iter().filter(|s| route.accepts_service(s)).count();
            let d = full_state::declaration(&route.name, "SYNCED", std::time::Duration::ZERO, "resync", None);
            store.enqueue_full_state(d).await?;
            out.push((route.name.clone(), n));
            continue;
        }
        let mut n = 0;
        store.enqueue_resync(|as_of, services| synced(&router, route, store.log_id(), as_of, services, &mut n)).await?;
        out.push((route.name.clone(), n));
    }
    Ok(out)
}

/// A resync's deliveries to `route` from a snapshot of the state table (`services`, with the newest
/// event id `as_of`): a `service.synced` per Service the endpoint takes, then (unless templated)
/// the `sync.completed`. Sets `n` to the number of Services.
fn synced(
    router: &Router,
    route: &router::Route,
    log_id: &str,
    as_of: i64,
    services: &[crate::store::ServiceRow],
    n: &mut usize,
) -> Vec<(NewDelivery, ServiceKey)> {
    let (now, as_of_event_id) = (crate::store::now_ms(), Some(as_of));
    let matching: Vec<_> = services.iter().filter(|s| route.accepts_service(s)).collect();
    let (id, total) = (format!("sync_{}", uuid::Uuid::new_v4().simple()), matching.len() as u64);
    let mut deliveries: Vec<_> = matching
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let sync = SyncMarker { id: id.clone(), index: Some(i as u64 + 1), total, as_of_event_id };
            (router.synced(route, s, now, sync), s.key.clone())
        })
        .collect();
    *n = deliveries.len();
    // `sync.completed` goes on a queue of its own (no Service), so it does not wait for the others:
    // receivers count the `service.synced` of the same id up to `total`.
    let completed = payload::render_completed(now, log_id, SyncMarker { id, index: None, total, as_of_event_id });
    if !route.templated {
        let (webhook, msg_id) = (route.name.clone(), new_msg_id());
        let marker = NewDelivery { webhook, kind: "SYNCED", msg_id, payload: completed, coalesce_ms: None };
        deliveries.push((marker, ServiceKey::new("", "")));
    }
    deliveries
}

/// Resyncs every enabled endpoint whose default backend mode (its `backend_mode`, else `[backends]
/// mode`) is not the one it had when vipwatch last started: its receiver holds members in the old
/// mode, and a mode switch by configuration records no event of its own for every Service. Call it
/// once the first lists are stored (the resync then carries the new mode's members). Returns the
/// endpoints resynced. Errors: [`RelayError::Store`].
pub async fn resync_switched_modes(store: &Store, config: &Config) -> Result<Vec<String>, RelayError> {
    let modes = config
        .webhooks
        .iter()
        .filter(|w| w.enabled)
        .map(|w| (w.name.clone(), w.backend_mode.unwrap_or(config.backends.mode).as_str().to_owned()))
        .collect();
    let mut resynced = Vec::new();
    for (name, old) in store.swap_endpoint_modes(&modes).await? {
        let new = &modes[&name];
        let sent = resync(store, config, Some(&name)).await?;
        let services = sent.first().map_or(0, |s| s.1);
        info!(webhook = %name, from = %old, to = %new, services, "backend mode changed since the last start: resyncing the endpoint");
        resynced.push(name);
    }
    Ok(resynced)
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
    trust: crate::leader::Trust,
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
        let transport = match &w.template {
            None => templated::Transport::Plain(Box::new(sender::Sender::new(w)?)),
            Some(t) => {
                let full = (t.mode == crate::config::TemplateMode::FullState)
                    .then(|| full_state::FullState::new(config, w, store.clone(), metrics.clone()))
                    .transpose()?;
                templated::Transport::Template(Box::new(templated::TemplateSender::new(w, full)?))
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
            trust: trust.clone(),
        };
        tasks.spawn(d.run(committed.clone(), cancel.clone()));
    }
    Ok(tasks)
}

#[cfg(test)]
mod tests {
    use super::new_msg_id;

    #[test]
    fn message_ids_are_msg_and_32_hex_digits_unique_and_ordered_by_creation() {
        let ids: Vec<String> = (0..10_000).map(|_| new_msg_id()).collect();
        for id in &ids {
            let hex = id.strip_prefix("msg_").unwrap();
            assert_eq!(hex.len(), 32, "{id}");
            assert!(hex.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()), "{id}");
        }
        let mut sorted = ids.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted, ids, "unique and already in creation order");
    }
}
