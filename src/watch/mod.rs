//! The Kubernetes side: connect, list + watch Services with kube-runtime's watcher over the
//! configured scope, and record every LB-relevant change through the [`Recorder`].
//!
//! Flow: one [`stream`] task per scope (all namespaces, or each configured namespace) turns watcher
//! events into [`Observation`]s; the single [`Recorder`], a pure index, diffs them against its mirror
//! of the current-state table and decides the events, allocations and members of each batch; its
//! async shell ([`recorder::run`]) hands every batch to the [`writer`], which stores it in batched
//! transactions.

mod client;
mod health;
mod members;
mod ownership;
mod recorder;
mod stream;
mod watchdog;
mod writer;

pub use client::{connect, connect_watched};
pub use health::{AUTH_FAILURES_NOT_READY, ScopeState, ScopeStatus, Verb, WatchHealth};
pub use ownership::Ownership;
pub use recorder::{Batch, Gauges, Listing, Loaded, Notices, Now, Recorder, Report};
pub use stream::{Change, Observation, Resource, ScopeSpec};
pub use watchdog::{Stalled, WATCH_SLACK, Watchdog, is_stall};
pub use writer::WriterWiring;

use std::sync::Arc;

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
    /// The database refused a batch of changes for good (a pool address and port for two Services),
    /// and the writer ended the term (see [`WriterWiring::refused`]).
    #[error("the database refused a batch of changes; the term ended: {0}")]
    Refused(String),
}

/// Capacity of the observation channel between the stream tasks and the recorder (messages): how
/// far the watch reads ahead of the recorder. Beyond it the stream tasks wait and the changes wait
/// in the socket and the apiserver's watch buffer instead of this process's heap. Larger, a burst of
/// changes peaks higher at the same latency and CPU; smaller, the transactions get smaller, with more
/// bytes written and more CPU per change (the measurements: docs/explanation/design-decisions.md).
const CHANNEL_CAPACITY: usize = 512;

/// Runs the watch until `cancel` fires: one stream task per scope plus the recorder and its writer.
/// Each recorded event is routed to its deliveries by `outbox` in the same transaction. VIPs are
/// allocated from `config.pools`; `feedback` brings addresses chosen by appliances and releases
/// acknowledged by every appliance.
/// Through `wiring` the writer reports readiness (first full list of every scope stored) and each commit. Errors: only
/// start-up failures ([`WatchError::Store`]), and [`WatchError::Refused`] once the writer ended the
/// term; watch errors are logged, counted in `wiring.metrics` and retried with backoff.
pub async fn run(
    client: kube::Client,
    config: &Config,
    store: Store,
    outbox: Arc<dyn Outbox>,
    wiring: WriterWiring,
    feedback: mpsc::Receiver<Feedback>,
    cancel: CancellationToken,
) -> Result<(), WatchError> {
    let cfg = &config.kubernetes;
    let pools = Pools::new(&config.pools).map_err(|e| WatchError::Config(e.to_string()))?;
    let ownership = Ownership { allocator: Allocator::new(pools), finalizer: cfg.finalizer };
    let loaded = Loaded::read(&store).await?;
    let scopes = scopes(cfg, config.mode_plan().any());
    let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
    let mut tasks = tokio::task::JoinSet::new();
    for scope in &scopes {
        let spawn = Spawn { client: &client, cfg, scope, tx: &tx, metrics: &wiring.metrics };
        match scope.resource {
            Resource::Services => tasks.spawn(spawn.task(stream::Services(cfg.scope())).run(cancel.clone())),
            Resource::Nodes => tasks.spawn(spawn.task(stream::Nodes).run(cancel.clone())),
            Resource::EndpointSlices => tasks.spawn(spawn.task(stream::Slices).run(cancel.clone())),
        };
    }
    tasks.spawn(forward(feedback, tx, cancel.clone()));
    let (refused, metrics) = (wiring.refused.clone(), wiring.metrics.clone());
    let recorder = Recorder::new(config, ownership, loaded, &scopes, Now::read());
    recorder::run(recorder, rx, writer::Writer::new(store, outbox, &scopes, wiring), metrics).await;
    tasks.join_all().await;
    match refused.get() {
        Some(why) => Err(WatchError::Refused(why.clone())),
        None => Ok(()),
    }
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

/// The scopes to watch: Services cluster-wide or per configured namespace; with `members` (some backend
/// mode is configured), the Nodes and the EndpointSlices of the same namespaces too.
pub fn scopes(cfg: &KubernetesConfig, members: bool) -> Vec<ScopeSpec> {
    let namespaces: Vec<Option<String>> =
        if cfg.namespaces.is_empty() { vec![None] } else { cfg.namespaces.iter().cloned().map(Some).collect() };
    let mut out: Vec<ScopeSpec> = namespaces.iter().cloned().map(ScopeSpec::services).collect();
    if members {
        out.push(ScopeSpec { resource: Resource::Nodes, namespace: None });
        out.extend(namespaces.into_iter().map(|namespace| ScopeSpec { resource: Resource::EndpointSlices, namespace }));
    }
    out
}

/// What a scope's task is built from.
struct Spawn<'a> {
    client: &'a kube::Client,
    cfg: &'a KubernetesConfig,
    scope: &'a ScopeSpec,
    tx: &'a mpsc::Sender<Observation>,
    metrics: &'a Arc<crate::metrics::Metrics>,
}

impl Spawn<'_> {
    /// The task watching `kind` in this scope. `kubernetes.label_selector` narrows Services only.
    fn task<K: stream::Kind>(&self, kind: K) -> stream::ScopeTask<K> {
        let api = K::api(self.client.clone(), self.scope.namespace.as_deref());
        let timeout = u32::try_from(self.cfg.watch_timeout.as_secs().max(1)).unwrap_or(u32::MAX);
        let mut watcher_config = watcher::Config::default().timeout(timeout);
        if self.scope.resource == Resource::Services && !self.cfg.label_selector.is_empty() {
            watcher_config = watcher_config.labels(&self.cfg.label_selector);
        }
        stream::ScopeTask {
            kind,
            api,
            spec: self.scope.clone(),
            watcher_config,
            relist_interval: self.cfg.relist_interval,
            tx: self.tx.clone(),
            metrics: self.metrics.clone(),
        }
    }
}
