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
//! serving). Silence while the agent reloads HAProxy does not count at all: the master then parses
//! the whole configuration before it answers again (about 2 s at 10,000 frontends), and the reload's
//! own timeout (`reload_timeout`) bounds that wait. A master or worker that is alive but silent is
//! reported (so keepalived moves the VIPs away), not killed: it may be stopped by an operator or a
//! debugger, and may resume.

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

/// How long HAProxy has been silent, as it counts: not while the agent reloads it.
#[derive(Debug, Default)]
struct Silence {
    /// When the silence that counts began.
    since: Option<Instant>,
}

impl Silence {
    /// A look that began at `asked` found HAProxy silent, during a reload when `reloading`; at
    /// `now`, whether it has been silent for [`SILENCE`] outside a reload.
    fn heard_nothing(&mut self, asked: Instant, reloading: bool, now: Instant) -> bool {
        if reloading {
            self.since = None;
            return false;
        }
        let since = *self.since.get_or_insert(asked);
        now.duration_since(since) >= SILENCE
    }

    /// HAProxy answered, or is gone (which is judged at once).
    fn clear(&mut self) {
        self.since = None;
    }
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
        let mut silence = Silence::default();
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
                    silence.clear();
                    self.metrics.workers.set(i64::try_from(p.workers).unwrap_or(i64::MAX));
                    if p.workers == 0 {
                        self.down(format!("HAProxy runs no worker (master pid {})", p.pid));
                    } else {
                        self.up(p.pid);
                    }
                }
                Look::Silent(why) | Look::WorkerSilent(why) => {
                    if silence.heard_nothing(began, self.haproxy.reloading(), Instant::now()) {
                        self.down(format!("HAProxy is not answering: {why}"));
                    }
                }
                Look::Gone(why) => {
                    silence.clear();
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Silence counts from the first silent look outside a reload: HAProxy is down once that lasts
    /// [`SILENCE`]; a reload in progress (the master re-executing, however long) restarts the count,
    /// and so does an answer.
    #[test]
    fn silence_counts_from_the_first_unanswered_look_outside_a_reload() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut silence = Silence::default();
        assert!(!silence.heard_nothing(at(0), false, at(400)));
        assert!(silence.heard_nothing(at(400), false, at(500)));

        let mut silence = Silence::default();
        assert!(!silence.heard_nothing(at(0), true, at(400)));
        assert!(!silence.heard_nothing(at(400), true, at(2_400)));
        assert!(!silence.heard_nothing(at(2_500), false, at(2_900)));
        assert!(silence.heard_nothing(at(2_900), false, at(3_000)));

        silence.clear();
        assert!(!silence.heard_nothing(at(3_100), false, at(3_500)));
        assert!(silence.heard_nothing(at(3_500), false, at(3_600)));
    }
}
