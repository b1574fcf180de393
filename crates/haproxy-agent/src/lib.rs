//! `vipwatch-haproxy`: an agent on the load-balancer host that applies vipwatch's signed deliveries
//! to a real HAProxy. It keeps the desired state on disk ([`state`]), renders a deterministic
//! `haproxy.cfg` ([`render`]), applies member changes through the Runtime API and everything else
//! through a confirmed, hitless reload ([`haproxy`], [`apply`]), and answers each delivery
//! only once the change is live ([`http`]). A task of its own watches HAProxy and starts it again
//! within a second when it dies ([`supervise`]); the agent says whether it is caught up, to
//! keepalived through `/healthz` and to vipwatch in every answer ([`catchup`]). One agent serves several clusters, each with its own
//! vipwatch: Services are keyed by cluster, namespace and name, and each cluster name is bound to
//! the vipwatch (event log) that delivers it ([`clusters`]). It depends on the webhook contract alone: no Kubernetes
//! client, no database, nothing of the controller.

pub mod apply;
pub mod catchup;
pub mod cli;
pub mod clusters;
pub mod config;
pub mod haproxy;
pub mod http;
pub mod metrics;
pub mod render;
pub mod state;
pub mod supervise;
pub mod sync;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use config::AgentConfig;

/// Capacity of the delivery queue (beyond it, deliveries wait for their HTTP handler to be taken).
const QUEUE: usize = 1024;

/// A failure that stops the agent.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The configuration cannot be used.
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    /// The state cannot be read or HAProxy cannot be started.
    #[error("{0}")]
    Start(String),
    /// The HTTP listener failed.
    #[error("HTTP server: {0}")]
    Io(#[from] std::io::Error),
    /// A part of the running agent ended on its own (see [`Running::died`]).
    #[error("{0}")]
    Died(String),
}

/// A running agent, as returned by [`start`].
pub struct Running {
    /// Where deliveries go.
    pub addr: SocketAddr,
    cancel: CancellationToken,
    server: JoinHandle<()>,
    applier: JoinHandle<()>,
    supervisor: JoinHandle<()>,
    /// HAProxy, stopped with the agent when `stop_haproxy_on_exit`.
    stop_haproxy: Option<Arc<haproxy::Haproxy>>,
}

impl Running {
    /// Stops serving, waits for the applier and the supervisor, then stops HAProxy when
    /// `stop_haproxy_on_exit` (once nothing would start it again).
    pub async fn stop(self) {
        self.cancel.cancel();
        let _ = self.server.await;
        let _ = self.supervisor.await;
        let _ = self.applier.await;
        if let Some(h) = self.stop_haproxy {
            h.stop().await;
            tracing::info!("stopped HAProxy");
        }
    }

    /// Resolves when the HTTP server, the applier or the supervisor ended without being asked to (a panic
    /// included), with which one and why: the agent can no longer do its job and must exit, so its
    /// supervisor (systemd) restarts it and keepalived stops trusting it meanwhile.
    pub async fn died(&mut self) -> String {
        let (what, ended) = tokio::select! {
            r = &mut self.server => ("the HTTP server", r),
            r = &mut self.applier => ("the applier", r),
            r = &mut self.supervisor => ("the HAProxy supervisor", r),
        };
        match ended {
            Ok(()) => format!("{what} stopped"),
            Err(e) if e.is_panic() => format!("{what} panicked"),
            Err(e) => format!("{what} ended: {e}"),
        }
    }
}

/// Starts the agent on `listener`: HAProxy running the stored state, then the HTTP side. Errors:
/// [`AgentError`].
pub async fn start(config: AgentConfig, listener: TcpListener) -> Result<Running, AgentError> {
    let secrets = config.resolve_secrets()?;
    let verifiers = secrets.iter().map(|s| standardwebhooks::Webhook::new(s)).collect::<Result<Vec<_>, _>>();
    let verifiers = verifiers.map_err(|e| AgentError::Start(format!("secret: {e}")))?;
    let metrics = Arc::new(metrics::Metrics::new());
    let (patience, concurrency) = (config.answer_timeout, config.concurrency);
    let (start_timeout, tied) = (config.reload_timeout, config.stop_haproxy_on_exit);
    let (applier, status, haproxy) = apply::Applier::start(config, metrics.clone()).await.map_err(AgentError::Start)?;
    let stop_haproxy = tied.then(|| haproxy.clone());
    let (supervisor, health) = supervise::Supervisor::new(haproxy.clone(), start_timeout, tied, metrics.clone());
    let (jobs, rx) = tokio::sync::mpsc::channel(QUEUE);
    let cancel = CancellationToken::new();
    let applier_task = tokio::spawn(applier.run(rx, cancel.clone()));
    let supervisor = tokio::spawn(supervisor.run(cancel.clone()));
    let http = http::Http {
        verifiers: Arc::new(verifiers),
        jobs,
        status,
        health,
        haproxy,
        metrics,
        seen: Arc::new(Mutex::default()),
        patience,
        concurrency,
    };
    let addr = listener.local_addr()?;
    let stop = cancel.clone();
    let server = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, http::router(http)).with_graceful_shutdown(stop.cancelled_owned()).await {
            tracing::error!(error = %e, "HTTP server stopped");
        }
    });
    tracing::info!(%addr, "accepting vipwatch deliveries");
    Ok(Running { addr, cancel, server, applier: applier_task, supervisor, stop_haproxy })
}

/// Runs until `shutdown` resolves. Errors: [`AgentError`] at start.
pub async fn run(
    config: AgentConfig,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), AgentError> {
    let mut running = start(config, listener).await?;
    tokio::select! {
        _ = shutdown => {
            tracing::info!("shutting down");
            running.stop().await;
            Ok(())
        }
        why = running.died() => {
            tracing::error!(reason = %why, "cannot go on; exiting");
            running.cancel.cancel();
            if let Some(h) = &running.stop_haproxy {
                h.stop().await;
            }
            Err(AgentError::Died(why))
        }
    }
}
