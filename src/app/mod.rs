//! Wiring: open the store, connect to Kubernetes, start the API, lead (the watch, the relay and the
//! write-back, in [`lead`]); stop them in order.

pub mod cluster;
mod lead;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch as signal;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::api::{self, ApiState};
use crate::config::Config;
use crate::leader::{Elector, LeaderDeadline, Role};
use crate::metrics::Metrics;
use crate::relay::{self, RelayError};
use crate::store::{Backend, WriterLock};
use crate::store::{Store, StoreError};
use crate::watch::{self, WatchError};

/// Capacity of the feedback queue (relay and publisher → recorder).
pub(crate) const ASSIGNMENT_QUEUE: usize = 1024;

/// A failure that stops the service.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The database could not be opened or migrated.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The Kubernetes client could not be configured.
    #[error(transparent)]
    Watch(#[from] WatchError),
    /// A webhook endpoint could not be set up.
    #[error(transparent)]
    Relay(#[from] RelayError),
    /// An endpoint's routing rules could not be built, or a resync failed.
    #[error(transparent)]
    Route(#[from] crate::route::RouteError),
    /// The API listener failed.
    #[error("API server: {0}")]
    Io(#[from] std::io::Error),
}

impl AppError {
    /// True when the error is the fence's refusal of a write ([`StoreError::Fenced`]): the task's
    /// term was over, which is how a deposed leader stands down, not a failure of the task.
    pub fn is_fenced(&self) -> bool {
        let store = match self {
            Self::Store(e) | Self::Watch(WatchError::Store(e)) | Self::Relay(RelayError::Store(e)) => e,
            Self::Route(crate::route::RouteError::Store(e)) => e,
            _ => return false,
        };
        store.is_fenced()
    }
}

/// A running service, as returned by [`start`].
pub struct Running {
    /// Where the API listens.
    pub addr: SocketAddr,
    /// The database (tests read it directly).
    pub store: Store,
    /// Every metric.
    pub metrics: Arc<Metrics>,
    ready: signal::Receiver<bool>,
    committed: signal::Receiver<i64>,
    cancel: CancellationToken,
    tasks: Vec<JoinHandle<Result<(), AppError>>>,
    /// SQLite's lock file (PostgreSQL: none, the lease decides who leads).
    lock: Option<WriterLock>,
}

impl Running {
    /// Waits until the first full list of every scope is stored (what `/readyz` reports).
    pub async fn ready(&self) {
        let mut ready = self.ready.clone();
        let _ = ready.wait_for(|r| *r).await;
    }

    /// The highest event id committed so far; changes on every commit.
    pub fn committed(&self) -> signal::Receiver<i64> {
        self.committed.clone()
    }

    /// Resolves when the service is stopping on its own: a task failed for good (the error is logged
    /// and returned by [`Running::stop`]).
    pub async fn failed(&self) {
        self.cancel.cancelled().await;
    }

    /// Graceful stop: stops watching and serving, lets the recorder finish its batch, closes the
    /// database. Returns the first error a task ended with.
    pub async fn stop(self) -> Result<(), AppError> {
        self.cancel.cancel();
        let mut result = Ok(());
        for task in self.tasks {
            match task.await {
                Ok(Err(e)) if result.is_ok() => result = Err(e),
                Err(e) => warn!(error = %e, "task panicked"),
                _ => {}
            }
        }
        self.store.close().await;
        drop(self.lock);
        result
    }
}

/// Starts everything: opens the database, connects the Kubernetes client, starts the API, and leads:
/// at once on SQLite (one instance, the lock file), after winning the lease on PostgreSQL (every
/// replica serves the API; one leads, see [`crate::leader`] and [`lead`]). Errors: [`AppError`] for
/// anything that fails at start.
pub async fn start(config: Config, listener: TcpListener) -> Result<Running, AppError> {
    relay::sender::install_crypto_provider();
    warn_blind_endpoints(&config);
    let lock = match config.database.url {
        None => Some(WriterLock::acquire(&config.database.path)?),
        Some(_) => None,
    };
    let metrics = Metrics::new();
    let store = Store::connect(&config.database)
        .await?
        .monitored(metrics.clone(), config.database.write_retry_max_delay)
        .with_commit_interval(config.database.commit_interval);
    match store.backend() {
        Backend::Sqlite => info!(path = %config.database.path.display(), "database open (SQLite)"),
        Backend::Postgres => info!("database open (PostgreSQL)"),
    }
    let watch_health = watch::WatchHealth::new(metrics.clone(), config.kubernetes.stale_after);
    let client = watch::connect_watched(&config.kubernetes, &watch_health).await?;
    let mut config = config;
    let name = cluster::resolve(&config, &store, Some(&client)).await?;
    let renamed = store.carry_cluster_name(&name).await?;
    if renamed > 0 {
        info!(cluster = %name, deliveries = renamed, "deliveries waiting since before a change of the cluster name now carry this one");
    }
    config.cluster.name = Some(name);
    let (ready_tx, ready) = signal::channel(false);
    let (committed_tx, committed) = signal::channel(0);
    let cancel = CancellationToken::new();
    let addr = listener.local_addr()?;
    let (feedback_tx, feedback_rx) = tokio::sync::mpsc::channel(ASSIGNMENT_QUEUE);
    let (route_tx, route) = signal::channel(None);
    let elector = (store.backend() == Backend::Postgres).then(|| Elector::new(store.clone(), &config.database));
    let replica = elector.as_ref().map_or_else(|| "single".to_owned(), |e| e.holder.clone());
    let (role_tx, role) = signal::channel(match elector {
        Some(_) => Role::Follower,
        None => Role::Single,
    });
    let shared = lead::Shared {
        config: config.clone(),
        store: store.clone(),
        metrics: metrics.clone(),
        client,
        ready: ready_tx,
        committed: committed_tx.clone(),
        circuits: crate::store::Circuits::default(),
        route: route_tx,
        watch_health: watch_health.clone(),
    };
    let state = ApiState::new(
        store.clone(),
        metrics.clone(),
        ready.clone(),
        committed.clone(),
        Arc::new(config.clone()),
        cancel.clone(),
    )
    .with_feedback(feedback_tx)
    .with_watch_health(watch_health)
    .with_circuits(shared.circuits.clone())
    .with_role(replica, role.clone());
    let mut tasks = vec![tokio::spawn(lead::forward_feedback(feedback_rx, route, cancel.clone()))];
    tasks.push(tokio::spawn(lead::publish_role(role, metrics.clone())));
    match elector {
        None => {
            let lead = lead::lead(shared, store.clone(), LeaderDeadline::unbounded(), cancel.clone());
            tasks.push(fatal_on_error("leader", cancel.clone(), lead));
        }
        Some(elector) => {
            let follow = lead::follow_commits(store.clone(), config.database.clone(), committed_tx, cancel.clone());
            tasks.push(tokio::spawn(follow));
            tasks.push(fatal_on_error(
                "election",
                cancel.clone(),
                lead::elect(shared, elector, role_tx, cancel.clone()),
            ));
        }
    }
    tasks.push(fatal_on_error("api", cancel.clone(), serve_api(listener, api::router(state), cancel.clone())));
    info!(%addr, "API listening");
    Ok(Running { addr, store, metrics, ready, committed, cancel, tasks, lock })
}

/// With VIPs assigned by vipwatch, an endpoint that takes no MODIFIED never hears of an address that
/// changes after the ADDED (an address freed up for a pending Service), yet its acknowledgement of
/// the earlier delivery still lets the status be written.
fn warn_blind_endpoints(config: &Config) {
    let assigning = !config.pools.is_empty() || config.webhooks.iter().any(|w| w.enabled && w.assigns_vip);
    for w in config.webhooks.iter().filter(|w| w.enabled && !w.events.iter().any(|e| e == "MODIFIED")) {
        if assigning {
            warn!(webhook = %w.name, "endpoint does not take MODIFIED: it will not hear of VIPs assigned after a Service's ADDED");
        }
    }
    for (webhook, appliance) in config.lone_appliances() {
        warn!(%webhook, %appliance, "{}", crate::config::LONE_APPLIANCE);
    }
}

/// Spawns `task`; if it ends with an error, logs it and cancels everything (the process then stops
/// and exits non-zero) instead of running on half-dead.
fn fatal_on_error(
    name: &'static str,
    cancel: CancellationToken,
    task: impl Future<Output = Result<(), AppError>> + Send + 'static,
) -> JoinHandle<Result<(), AppError>> {
    tokio::spawn(async move {
        let result = task.await;
        match &result {
            // A term's task whose write the fence refused: the term is over and is being stopped.
            Err(e) if e.is_fenced() => {
                tracing::debug!(task = name, error = %ErrorChain(e), "not the leader any more; stopping the term");
                cancel.cancel();
            }
            Err(e) => {
                tracing::error!(task = name, error = %ErrorChain(e), "fatal error; stopping");
                cancel.cancel();
            }
            Ok(()) => {}
        }
        result
    })
}

/// Displays an error with its sources, `a: b: c`, leaving out a source whose text the one before
/// already ends with (sqlx's "error returned from database: X" has X as its source again).
pub struct ErrorChain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut last = self.0.to_string();
        f.write_str(&last)?;
        let mut source = self.0.source();
        while let Some(e) = source {
            let text = e.to_string();
            if !last.ends_with(&text) {
                write!(f, ": {text}")?;
            }
            last = text;
            source = e.source();
        }
        Ok(())
    }
}

/// Runs until `shutdown` resolves, then stops gracefully (see [`Running::stop`]).
pub async fn run(config: Config, listener: TcpListener, shutdown: impl Future<Output = ()>) -> Result<(), AppError> {
    let running = start(config, listener).await?;
    tokio::select! {
        _ = shutdown => info!("shutting down"),
        _ = running.failed() => {}
    }
    running.stop().await
}

async fn serve_api(listener: TcpListener, router: axum::Router, cancel: CancellationToken) -> Result<(), AppError> {
    axum::serve(listener, router).with_graceful_shutdown(cancel.cancelled_owned()).await?;
    Ok(())
}
