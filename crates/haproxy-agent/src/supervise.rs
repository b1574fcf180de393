//! Watching HAProxy, in a task of its own that never waits behind a delivery or a reload: every
//! [`TICK`] it looks at the master ([`Haproxy::look`]) and publishes what it saw ([`Health`], read
//! by `/healthz`); when no master runs any more it starts one at once from `haproxy.cfg` — the last
//! applied configuration, or the one a reload in progress has just put in place, which the reload
//! then counts as confirmed ([`Haproxy::reload`]). A start that fails is tried again every
//! [`RETRY`].
//!
//! HAProxy is reported down at once when its master process is gone (killing a worker makes the
//! master stop every process and exit), when it runs no worker, and when its master CLI, or its
//! current worker asked through it, has not answered for [`SILENCE`]: a master re-executing itself
//! for a reload refuses connections for some 100 ms, which is not an outage (the workers keep
//! serving). A master or worker that is alive but silent is reported (so keepalived moves the VIPs
//! away), not killed: it may be stopped by an operator or a debugger, and may resume.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::haproxy::{Haproxy, Look};
use crate::metrics::Metrics;

/// How often the master is looked at.
pub const TICK: Duration = Duration::from_millis(100);

/// How long the master CLI may be silent before HAProxy is reported down.
pub const SILENCE: Duration = Duration::from_millis(500);

/// How long one look waits for each answer (the master's, then each worker's). Shorter than
/// [`SILENCE`], so silence is judged from when the first unanswered question went out.
const PATIENCE: Duration = Duration::from_millis(400);

/// How often a worker found silent is asked again: the master holds each question until the worker
/// answers and serves only a few at a time, so asking at every tick would wedge its CLI.
pub const WORKER_REASK: Duration = Duration::from_secs(2);

/// How long after a failed start the next one is tried.
pub const RETRY: Duration = Duration::from_secs(1);

/// What the supervisor last saw of HAProxy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Health {
    /// The master answers and runs at least one worker.
    pub up: bool,
    /// Why it is down.
    pub reason: Option<String>,
    /// The master's pid, when it answered.
    pub pid: Option<u32>,
    /// Times the agent started HAProxy again since it started.
    pub restarts: u64,
}

/// The watching task. Build with [`Supervisor::new`], run with [`Supervisor::run`].
pub struct Supervisor {
    haproxy: Arc<Haproxy>,
    start_timeout: Duration,
    tied: bool,
    metrics: Arc<Metrics>,
    health: watch::Sender<Health>,
}

impl Supervisor {
    /// Watches `haproxy`; a start may take `start_timeout`, and ties HAProxy to the agent when
    /// `tied` (`stop_haproxy_on_exit`). HAProxy is taken as up, as [`crate::apply::Applier::start`]
    /// left it.
    pub fn new(
        haproxy: Arc<Haproxy>,
        start_timeout: Duration,
        tied: bool,
        metrics: Arc<Metrics>,
    ) -> (Self, watch::Receiver<Health>) {
        let (health, rx) = watch::channel(Health { up: true, pid: haproxy.pid(), ..Health::default() });
        metrics.up.set(1);
        (Self { haproxy, start_timeout, tied, metrics, health }, rx)
    }

    /// Looks at HAProxy every [`TICK`] until `cancel`, starting it again when it is gone.
    pub async fn run(self, cancel: CancellationToken) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut silent_since: Option<Instant> = None;
        let mut next_start = Instant::now();
        // A silent worker: when it was last asked, and what that found.
        let mut worker_silence: Option<(Instant, String)> = None;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            let began = Instant::now();
            let ask_workers = worker_silence.as_ref().is_none_or(|(at, _)| began >= *at + WORKER_REASK);
            let look = match (self.haproxy.look(PATIENCE, ask_workers).await, &worker_silence) {
                (Look::Up(_), Some((_, why))) if !ask_workers => Look::WorkerSilent(why.clone()),
                (look, _) => look,
            };
            match &look {
                Look::WorkerSilent(why) if ask_workers => worker_silence = Some((began, why.clone())),
                Look::WorkerSilent(_) => {}
                _ => worker_silence = None,
            }
            match look {
                Look::Up(p) => {
                    silent_since = None;
                    self.metrics.workers.set(i64::try_from(p.workers).unwrap_or(i64::MAX));
                    if p.workers == 0 {
                        self.down(format!("HAProxy runs no worker (master pid {})", p.pid));
                    } else {
                        self.up(p.pid);
                    }
                }
                Look::Silent(why) | Look::WorkerSilent(why) => {
                    let since = *silent_since.get_or_insert(began);
                    if since.elapsed() >= SILENCE {
                        self.down(format!("HAProxy is not answering: {why}"));
                    }
                }
                Look::Gone(why) => {
                    silent_since = None;
                    self.down(format!("{why}; the agent starts it again"));
                    if Instant::now() >= next_start {
                        let started = tokio::select! {
                            _ = cancel.cancelled() => return,
                            started = self.restart(&why) => started,
                        };
                        if !started {
                            next_start = Instant::now() + RETRY;
                        }
                        tick.reset();
                    }
                }
            }
        }
    }

    /// Starts HAProxy from `haproxy.cfg`; whether it runs.
    async fn restart(&self, why: &str) -> bool {
        let began = Instant::now();
        warn!(reason = %why, "HAProxy is gone; starting it from the last applied configuration");
        match self.haproxy.start(self.start_timeout, self.tied).await {
            Ok(()) => {
                self.metrics.restarts.inc();
                self.health.send_modify(|h| h.restarts += 1);
                let pid = self.haproxy.pid();
                info!(pid, took_ms = began.elapsed().as_millis() as u64, "HAProxy started again");
                self.up(pid.unwrap_or_default());
                true
            }
            Err(e) => {
                warn!(error = %e, retry_in = ?RETRY, "cannot start HAProxy");
                self.down(format!("HAProxy cannot be started: {e}"));
                false
            }
        }
    }

    fn up(&self, pid: u32) {
        self.metrics.up.set(1);
        self.health.send_if_modified(|h| {
            let changed = !h.up || h.pid != Some(pid);
            if !h.up {
                info!(pid, "HAProxy answers again");
            }
            (h.up, h.reason, h.pid) = (true, None, Some(pid));
            changed
        });
    }

    fn down(&self, reason: String) {
        self.metrics.up.set(0);
        self.health.send_if_modified(|h| {
            let changed = h.up || h.reason.as_ref() != Some(&reason);
            if h.up {
                warn!(reason = %reason, "HAProxy is down");
            }
            (h.up, h.reason, h.pid) = (false, Some(reason), None);
            changed
        });
    }
}
