//! The Kubernetes side: connect, list + watch Services with kube-runtime's watcher over the
//! configured scope, and record every LB-relevant change through the [`Recorder`].
//!
//! Flow: one [`stream`] task per scope (all namespaces, or each configured namespace) turns watcher
//! events into [`Observation`]s; the single [`Recorder`] diffs them against the current-state table
//! and writes events + state in batched transactions.

mod client;
mod ownership;
mod recorder;
mod stream;
mod writer;

pub use client::connect;
pub use ownership::Ownership;
pub use recorder::Recorder;
pub use stream::{Observation, ScopeSpec};
pub use writer::Signals;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::runtime::watcher;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, KubernetesConfig};
use crate::ipam::{Allocator, Pools};
use crate::model::Feedback;
use crate::store::{Outbox, Store, StoreError};

/// Errors that stop the watch before it starts (once running, errors are logged and retried).
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// No usable connection settings: `kubernetes.url` absent, no kubeconfig, not in a cluster.
    #[error("cannot configure the Kubernetes client: {0}")]
    Config(String),
    /// The client could not be built (TLS material, proxy settings).
    #[error("cannot build the Kubernetes client: {0}")]
    Client(#[from] kube::Error),
    /// Loading the current-state table failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Capacity of the observation channel between the stream tasks and the recorder (messages).
const CHANNEL_CAPACITY: usize = 1024;

/// Runs the watch until `cancel` fires: one stream task per scope plus the recorder and its writer.
/// Each recorded event is routed to its deliveries by `outbox` in the same transaction. VIPs are
/// allocated from `config.pools`; `feedback` brings addresses chosen by appliances and releases
/// acknowledged by every endpoint.
/// `signals` report readiness (first full list of every scope stored) and each commit. Errors: only
/// start-up failures ([`WatchError::Store`]); watch errors are logged, counted in `signals.metrics`
/// and retried with backoff.
pub async fn run(
    client: kube::Client,
    config: &Config,
    store: Store,
    outbox: Arc<dyn Outbox>,
    signals: Signals,
    feedback: mpsc::Receiver<Feedback>,
    cancel: CancellationToken,
) -> Result<(), WatchError> {
    let cfg = &config.kubernetes;
    let pools = Pools::new(&config.pools).map_err(|e| WatchError::Config(e.to_string()))?;
    let ownership = Ownership { allocator: Allocator::new(pools), finalizer: cfg.finalizer };
    let scopes = scopes(cfg);
    let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
    let mut tasks = tokio::task::JoinSet::new();
    for scope in &scopes {
        let api: Api<Service> = match &scope.namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        let task = stream::ScopeTask {
            api,
            spec: scope.clone(),
            watcher_config: watcher_config(cfg),
            scope_rule: cfg.scope(),
            relist_interval: cfg.relist_interval,
            tx: tx.clone(),
            metrics: signals.metrics.clone(),
        };
        tasks.spawn(task.run(cancel.clone()));
    }
    tasks.spawn(forward(feedback, tx, cancel.clone()));
    let recorder = Recorder::load(store, outbox, &scopes, signals, ownership).await?;
    recorder.run(rx).await;
    tasks.join_all().await;
    Ok(())
}

/// Passes feedback (appliance-assigned addresses, acknowledged releases) to the recorder until
/// `cancel` or every sender is gone.
async fn forward(mut feedback: mpsc::Receiver<Feedback>, tx: mpsc::Sender<Observation>, cancel: CancellationToken) {
    loop {
        let next = tokio::select! {
            _ = cancel.cancelled() => return,
            next = feedback.recv() => next,
        };
        let Some(f) = next else { return };
        if tx.send(Observation::Feedback(f)).await.is_err() {
            return;
        }
    }
}

/// The scopes to watch: one cluster-wide scope, or one per configured namespace.
pub fn scopes(cfg: &KubernetesConfig) -> Vec<ScopeSpec> {
    if cfg.namespaces.is_empty() {
        return vec![ScopeSpec { namespace: None }];
    }
    cfg.namespaces.iter().map(|ns| ScopeSpec { namespace: Some(ns.clone()) }).collect()
}

fn watcher_config(cfg: &KubernetesConfig) -> watcher::Config {
    let timeout = u32::try_from(cfg.watch_timeout.as_secs().max(1)).unwrap_or(u32::MAX);
    let mut wc = watcher::Config::default().timeout(timeout);
    if !cfg.label_selector.is_empty() {
        wc = wc.labels(&cfg.label_selector);
    }
    wc
}

/// Default period of the safety-net relist, see `kubernetes.relist_interval`.
pub const DEFAULT_RELIST_INTERVAL: Duration = Duration::from_secs(30 * 60);
