//! Wiring: open the store, connect to Kubernetes, start the watch and the API; stop them in order.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch as signal;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::api::{self, ApiState};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::publish::{self, Publisher};
use crate::relay::{self, RelayError, Router};
use crate::store::{Backend, Outbox, WriterLock};
use crate::store::{Store, StoreError, now_ms};
use crate::watch::{self, WatchError};

/// Capacity of the feedback queue (relay and publisher → recorder).
const ASSIGNMENT_QUEUE: usize = 1024;

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
    /// The API listener failed.
    #[error("API server: {0}")]
    Io(#[from] std::io::Error),
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
    lock: WriterLock,
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
        self.lock.release().await;
        result
    }
}

/// Starts everything: opens the database, connects the Kubernetes client, spawns the watch, the
/// retention pruner and the API on `listener`. Errors: [`AppError`] for anything that fails at start.
pub async fn start(config: Config, listener: TcpListener) -> Result<Running, AppError> {
    relay::sender::install_crypto_provider();
    warn_blind_endpoints(&config);
    let lock = WriterLock::for_database(&config.database).await?;
    let metrics = Metrics::new();
    let store =
        Store::connect(&config.database).await?.monitored(metrics.clone(), config.database.write_retry_max_delay);
    match store.backend() {
        Backend::Sqlite => info!(path = %config.database.path.display(), "database open (SQLite)"),
        Backend::Postgres => info!("database open (PostgreSQL)"),
    }
    let watch_health = watch::WatchHealth::new(metrics.clone(), config.kubernetes.stale_after);
    let client = watch::connect_watched(&config.kubernetes, &watch_health).await?;
    let (ready_tx, ready) = signal::channel(false);
    let (committed_tx, committed) = signal::channel(0);
    // Pulsed by the relay when an endpoint acknowledged a delivery: the publisher's status write-back
    // and finalizer removal go at once instead of at the next poll.
    let (acked_tx, acked) = signal::channel(0u64);
    let wake_relay = committed_tx.clone();
    let cancel = CancellationToken::new();
    let (notices, events_task) = publish::start_events(client.clone(), metrics.clone(), cancel.clone());
    let signals =
        watch::Signals { metrics: metrics.clone(), ready: ready_tx, committed: committed_tx, notices: notices.clone() };
    let addr = listener.local_addr()?;
    let outbox: Arc<dyn Outbox> = Arc::new(Router::new(&config, store.log_id())?);
    let (assign_tx, assign_rx) = tokio::sync::mpsc::channel(ASSIGNMENT_QUEUE);
    let circuits = relay::Circuits::default();
    let mut relay_tasks = relay::start(
        &config,
        store.clone(),
        metrics.clone(),
        circuits.clone(),
        committed.clone(),
        acked_tx,
        assign_tx.clone(),
        cancel.clone(),
    )
    .await?;
    let publisher = Publisher::new(client.clone(), &config, store.clone(), metrics.clone(), notices, assign_tx.clone())
        .waking(wake_relay);
    let publisher_task = tokio::spawn(publisher.run(committed.clone(), acked, cancel.clone()));
    let checkpoint_task = tokio::spawn(store.clone().checkpoint_loop(cancel.clone()));
    let relay_task = tokio::spawn(async move {
        while relay_tasks.join_next().await.is_some() {}
        let _ = publisher_task.await;
        let _ = events_task.await;
        let _ = checkpoint_task.await;
        Ok(())
    });
    let watch_task = {
        let (store, cancel, config) = (store.clone(), cancel.clone(), config.clone());
        fatal_on_error("watch", cancel.clone(), async move {
            Ok(watch::run(client, &config, store, outbox, signals, assign_rx, cancel).await?)
        })
    };
    let prune_task = tokio::spawn(prune_loop(store.clone(), config.database.event_retention, cancel.clone()));
    let modes = resync_switched_modes(store.clone(), config.clone(), ready.clone(), cancel.clone());
    let modes_task = fatal_on_error("relay", cancel.clone(), modes);
    let state = ApiState::new(
        store.clone(),
        metrics.clone(),
        ready.clone(),
        committed.clone(),
        Arc::new(config.clone()),
        cancel.clone(),
    )
    .with_feedback(assign_tx)
    .with_watch_health(watch_health)
    .with_circuits(circuits);
    let api_task = fatal_on_error("api", cancel.clone(), serve_api(listener, api::router(state), cancel.clone()));
    info!(%addr, "API listening");
    Ok(Running {
        addr,
        store,
        metrics,
        ready,
        committed,
        cancel,
        tasks: vec![watch_task, relay_task, prune_task, api_task, modes_task],
        lock,
    })
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
}

/// Once the first lists are stored, resyncs the endpoints whose backend mode changed since the last
/// start ([`relay::resync_switched_modes`]).
async fn resync_switched_modes(
    store: Store,
    config: Config,
    mut ready: signal::Receiver<bool>,
    cancel: CancellationToken,
) -> Result<(), AppError> {
    tokio::select! {
        _ = cancel.cancelled() => return Ok(()),
        r = ready.wait_for(|r| *r) => if r.is_err() { return Ok(()) },
    }
    relay::resync_switched_modes(&store, &config).await?;
    // Full-state template endpoints: a declaration now (converges after a restart), then periodically.
    relay::full_state::resend_loop(store, &config, cancel).await;
    Ok(())
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
        if let Err(e) = &result {
            tracing::error!(task = name, error = %ErrorChain(e), "fatal error; stopping");
            cancel.cancel();
        }
        result
    })
}

/// Displays an error with its sources, `a: b: c`.
struct ErrorChain<'a>(&'a (dyn std::error::Error + 'static));

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(e) = source {
            write!(f, ": {e}")?;
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

/// Deletes events older than `retention`, at start and then hourly.
async fn prune_loop(store: Store, retention: Duration, cancel: CancellationToken) -> Result<(), AppError> {
    let mut tick = tokio::time::interval(Duration::from_secs(3600));
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            _ = tick.tick() => {}
        }
        let cutoff = now_ms().saturating_sub(i64::try_from(retention.as_millis()).unwrap_or(i64::MAX));
        match store.prune_events(cutoff).await {
            Ok(0) => {}
            Ok(n) => info!(deleted = n, "pruned events past database.event_retention"),
            Err(e) => warn!(error = %e, "cannot prune events"),
        }
    }
}
