//! One endpoint's dispatcher: claims due queue heads (one per Service, so per-Service order holds),
//! sends them concurrently, records each attempt, and retries per the policy. While the endpoint's
//! circuit is open (see [`super::circuit`]) it sends one probe at a time instead. Stops claiming on
//! shutdown and lets in-flight attempts finish within `relay.shutdown_grace`.
//!
//! What to do next is decided by a state machine without IO ([`super::dispatch`]); this is its
//! shell: it turns the machine's actions into store calls, attempts, logs and metrics, and what
//! happens (a commit, attempts finishing, a standing claim's answer, an answer to a catch-up probe,
//! the timer, the stop) into the machine's events, one at a time.
//!
//! When the database cannot be written (disk full, locked), the dispatcher backs off
//! ([`Store::write_backoff`]) instead of claiming again at once, and keeps the outcomes it could not
//! record in memory, recording them before it claims anything else: an attempt that succeeded is not
//! sent again just because recording it failed (only a restart before it is recorded re-sends it,
//! with the same `webhook-id`).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use super::assign::assignment;
use super::circuit::Transition;
use super::dispatch::{Action, Dispatch, Event, Finished, Now, Observed, Settings};
use super::sender::AttemptResult;
use super::templated::Transport;
use crate::config::{RelayConfig, RetryConfig};
use crate::metrics::Metrics;
use crate::model::Feedback;
use crate::store::{CircuitView, Circuits, Claimed, Outcome, StandingClaim, Store, now_ms};

/// Everything one endpoint's loop needs.
pub(super) struct Dispatcher {
    pub name: String,
    pub url: String,
    pub store: Store,
    pub sender: Arc<Transport>,
    pub retry: RetryConfig,
    pub relay: RelayConfig,
    pub metrics: Arc<Metrics>,
    /// Where addresses from the response body go, for an endpoint with `assigns_vip`.
    pub assignments: Option<mpsc::Sender<Feedback>>,
    /// Pulsed after attempts succeeded: the publisher writes statuses and removes finalizers then.
    pub acked: watch::Sender<u64>,
    /// Consecutive down attempts that open the circuit (0: never).
    pub circuit_failures: u32,
    /// Where the circuit's state is published for the API.
    pub circuits: Circuits,
    /// Until when this replica leads: no attempt starts after it, and one still running then is
    /// abandoned (its lease runs out; the next leader sends it again under the same `webhook-id`).
    pub leading_until: crate::leader::LeaderDeadline,
    /// Pulsed when the endpoint answered a probe of [`super::catch_up`]: while the circuit is open,
    /// the next probe goes at once ([`Event::Reachable`]). `None` for a templated endpoint (not
    /// probed).
    pub reachable: Option<watch::Receiver<u64>>,
    /// How many deliveries the receiver says it takes in at once ([`super::catch_up`]), for an
    /// endpoint without a `concurrency` of its own (`None` otherwise); while it says nothing,
    /// `relay.concurrency` holds ([`Event::Concurrency`]).
    pub advertised: Option<watch::Receiver<Option<usize>>>,
}

/// The next value of `rx` (the `reachable` pulse, the `advertised` concurrency); never without a
/// receiver, nor once its sender is gone (then it is dropped).
async fn next<T: Clone>(rx: &mut Option<watch::Receiver<T>>) -> T {
    if let Some(r) = rx.as_mut() {
        if r.changed().await.is_ok() {
            return r.borrow_and_update().clone();
        }
        *rx = None;
    }
    std::future::pending().await
}

/// Attempts in flight; one abandoned when this replica stopped leading ends as `None`.
type InFlight = JoinSet<Option<(Claimed, AttemptResult)>>;

/// How long an attempt starting at `now` (Unix ms) may run: until `margin` ms (a tenth of
/// `relay.lease`) before its claim's lease ends at `claimed_until`. Counted from the claim, not from
/// the start: a claim that waited for the write connection or for a worker has that much less time
/// (counted from the start, an attempt could outlive its lease); zero when that
/// time has passed (the attempt is not made, and not recorded).
fn time_left(claimed_until: i64, margin: i64, now: i64) -> Duration {
    Duration::from_millis(u64::try_from(claimed_until.saturating_sub(margin).saturating_sub(now)).unwrap_or(0))
}

/// The outcome of an attempt cut off a tenth of `relay.lease` before its claim's lease ends
/// ([`RelayConfig::attempt_limit`]): a `timeout`, retried. (One whose time had passed before it
/// started is not made at all.)
fn cut_off_attempt(started_at: i64, clock: Instant) -> AttemptResult {
    let mut out = super::sender::failure(
        "timeout",
        "attempt cut off at nine tenths of relay.lease after its claim, so that it is recorded while leased".into(),
    );
    out.record.started_at = started_at;
    out.record.duration_ms = i64::try_from(clock.elapsed().as_millis()).unwrap_or(i64::MAX);
    out
}

/// `joined` as the machine sees it: a task that panicked or was aborted is abandoned.
fn finished(joined: Result<Option<(Claimed, AttemptResult)>, tokio::task::JoinError>) -> Finished {
    match joined {
        Ok(Some((claimed, result))) => Finished::Done(claimed, result),
        Ok(None) | Err(_) => Finished::Abandoned,
    }
}

/// What a standing claim's answer brings (then the claim is gone from `standing`). Never resolves
/// without one.
async fn answered(standing: &mut Option<StandingClaim>) -> Event {
    let Some(claim) = standing.as_mut() else { return std::future::pending().await };
    let heads = claim.answered().await;
    *standing = None;
    Event::Answered(heads)
}

/// The shell's own state: what the machine asked it to keep.
struct Shell {
    in_flight: InFlight,
    standing: Option<StandingClaim>,
    /// When to fire [`Event::Timer`] ([`Action::SleepUntil`]).
    timer: Option<Instant>,
    /// When the first attempt not yet in a round finished (`vipwatch_relay_round_seconds`).
    finished_at: Option<Instant>,
}

impl Dispatcher {
    /// The machine's view of the endpoint and configuration.
    fn settings(&self) -> Settings {
        Settings {
            name: self.name.clone(),
            url: self.url.clone(),
            concurrency: self.relay.concurrency,
            shutdown_grace: self.relay.shutdown_grace,
            poll_interval: self.relay.poll_interval,
            retry: self.retry.clone(),
            circuit_failures: self.circuit_failures,
            write_backoff: self.store.write_backoff(),
            assigns: self.assignments.is_some(),
        }
    }

    /// The time now, as the machine takes it.
    fn now(&self) -> Now {
        Now {
            ms: now_ms(),
            at: Instant::now(),
            interval: self.store.commit_interval(),
            leading: self.leading_until.is_ahead(),
        }
    }

    /// Runs until `cancel` and then stops as the machine says; wakes on every commit (`committed`),
    /// on finished attempts, on a standing claim's answer, when the endpoint answered a catch-up
    /// probe (`reachable`), and at the machine's timer (a round due, the next retry, the backoff,
    /// `relay.poll_interval` for work enqueued by another process).
    pub async fn run(mut self, mut committed: watch::Receiver<i64>, cancel: CancellationToken) {
        let mut reachable = self.reachable.take();
        let mut said = self.advertised.take();
        let mut machine = Dispatch::new(self.settings(), Instant::now());
        let mut shell = Shell { in_flight: InFlight::new(), standing: None, timer: None, finished_at: None };
        let mut event = Event::Start;
        let mut stopping = false;
        loop {
            if self.step(&mut machine, &mut shell, event).await {
                return;
            }
            let timer = shell.timer.unwrap_or_else(|| Instant::now() + self.relay.poll_interval);
            let listens = machine.listens(Instant::now());
            event = tokio::select! {
                biased;
                () = cancel.cancelled(), if !stopping => {
                    stopping = true;
                    Event::Stop
                }
                // Before the commit's own wake-up: the machine then knows the commit was claimed.
                event = answered(&mut shell.standing) => event,
                Some(joined) = shell.in_flight.join_next(), if !shell.in_flight.is_empty() => {
                    let mut done = vec![finished(joined)];
                    while let Some(more) = shell.in_flight.try_join_next() {
                        done.push(finished(more));
                    }
                    shell.finished_at.get_or_insert_with(Instant::now);
                    Event::Finished(done)
                }
                _ = next(&mut reachable) => Event::Reachable,
                // A receiver that stopped saying gets `relay.concurrency` (or the endpoint's) again.
                n = next(&mut said) => Event::Concurrency(n.unwrap_or(self.relay.concurrency)),
                changed = committed.changed(), if listens => match changed {
                    Ok(()) => Event::Commit(*committed.borrow_and_update()),
                    Err(_) => Event::CommitsClosed,
                },
                () = tokio::time::sleep_until(timer) => {
                    shell.timer = None;
                    Event::Timer
                }
            };
        }
    }

    /// Gives `event` to the machine and carries out what it returns, feeding the answers of store
    /// operations back in, until it waits for something from outside. Returns whether it stopped.
    async fn step(&self, machine: &mut Dispatch, shell: &mut Shell, event: Event) -> bool {
        let mut actions: VecDeque<Action> = machine.on(event, self.now()).into();
        while let Some(action) = actions.pop_front() {
            if matches!(action, Action::Stopped) {
                return true;
            }
            if let Some(answer) = self.act(action, shell).await {
                actions.extend(machine.on(answer, self.now()));
            }
        }
        false
    }

    /// Carries out `action`; returns the answer of a store operation.
    async fn act(&self, action: Action, shell: &mut Shell) -> Option<Event> {
        let lease_ms = i64::try_from(self.relay.lease.as_millis()).unwrap_or(i64::MAX);
        match action {
            Action::ReadDisabled => {
                let state = self.store.webhook_state(&self.name).await;
                return Some(Event::Disabled(matches!(state, Ok(Some(s)) if s.disabled_reason.is_some())));
            }
            Action::Claim { limit } => {
                return Some(Event::Claimed(self.store.claim(&self.name, now_ms(), lease_ms, limit).await));
            }
            Action::Round { done, claim } => {
                let sent = Instant::now();
                if let Some(finished) = shell.finished_at.take() {
                    self.metrics.relay_round(&self.name, "waiting", (sent - finished).as_secs_f64());
                }
                let claim = (claim > 0).then(|| (self.name.as_str(), now_ms(), lease_ms, claim));
                let rounded = self.store.complete_and_claim(&done, claim).await;
                self.metrics.relay_round(&self.name, "store", sent.elapsed().as_secs_f64());
                return Some(Event::Rounded(rounded));
            }
            Action::Record(done) => return Some(Event::Recorded(self.store.complete(&done).await)),
            Action::Offer { limit } => shell.standing = Some(self.store.offer_claim(&self.name, lease_ms, limit)),
            Action::Amend { limit, hurry } => {
                if let Some(standing) = &shell.standing {
                    if hurry { standing.hurry(limit) } else { standing.amend(limit) }
                }
            }
            Action::Withdraw => {
                let heads = match shell.standing.take() {
                    Some(standing) => standing.withdraw().await,
                    None => None,
                };
                return Some(Event::Withdrawn(heads));
            }
            Action::Send(claimed) => self.send(claimed, &mut shell.in_flight),
            Action::NextDue => return Some(Event::NextDue(self.store.next_due(&self.name).await.ok().flatten())),
            Action::SleepUntil(at) => shell.timer = Some(at),
            Action::Publish(view, transition) => self.publish(view, transition),
            Action::Observe(observed) => self.observe(&observed),
            Action::Throttled { status, until, now } => self.throttled(status, until, now),
            Action::Failing { error } => {
                warn!(webhook = %self.name, url = %self.url, error = %error, "endpoint failing; retrying with backoff (each failed attempt is in the delivery log)");
            }
            Action::Disable => self.disable().await,
            Action::Assign(claimed, body) => self.assign(&claimed, &body).await,
            Action::Acked => self.acked.send_modify(|n| *n = n.wrapping_add(1)),
            Action::CatchUp { now } => {
                self.catch_up(now).await;
                return Some(Event::CaughtUp);
            }
            Action::Abort => shell.in_flight.abort_all(),
            Action::Stopped => {}
        }
        None
    }

    /// Starts an attempt for each of `claimed`, each ending by its claim's cut-off, or abandoned when
    /// this replica stops leading.
    fn send(&self, claimed: Vec<Claimed>, in_flight: &mut InFlight) {
        let margin = i64::try_from((self.relay.lease - self.relay.attempt_limit()).as_millis()).unwrap_or(i64::MAX);
        for c in claimed {
            let (sender, leading_until) = (self.sender.clone(), self.leading_until.clone());
            in_flight.spawn(async move {
                let (started_at, clock) = (now_ms(), Instant::now());
                let left = time_left(c.claimed_until, margin, started_at);
                if left.is_zero() {
                    // Not made, so not an attempt: nothing recorded, no retry counted, no failure for
                    // the circuit; the delivery is claimed again once its lease ends (within a tenth
                    // of the lease).
                    debug!(delivery = c.id, "claimed too long ago to be sent within its lease; claimed again later");
                    return None;
                }
                tokio::select! {
                    result = sender.send(&c) => Some((c, result)),
                    () = tokio::time::sleep(left) => Some((c, cut_off_attempt(started_at, clock))),
                    _ = leading_until.passed() => None,
                }
            });
        }
    }

    /// The endpoint asked to slow down (a 429 or 503 with `Retry-After`): logs and counts it; the
    /// circuit holds every delivery until `until`.
    fn throttled(&self, status: Option<u16>, until: i64, now: i64) {
        self.metrics.webhook_throttled(&self.name, until);
        let until_at = crate::model::rfc3339(until);
        warn!(webhook = %self.name, url = %self.url, status, wait_ms = until - now, until = %until_at, "endpoint asked to slow down (Retry-After): no delivery to it before then");
    }

    /// Publishes the circuit's view (API, gauge) and logs and counts `transition`, once per change.
    fn publish(&self, view: CircuitView, transition: Option<Transition>) {
        self.circuits.set(&self.name, view);
        self.metrics.circuit(&self.name, view.state.as_str(), transition.is_some());
        match transition {
            Some(Transition::Opened) => {
                let retry_in_ms = view.next_probe_at.map(|at| at - now_ms());
                warn!(webhook = %self.name, url = %self.url, consecutive_failures = view.consecutive_failures, ?retry_in_ms, "circuit open: endpoint down; one probe at a time on the backoff schedule, other deliveries wait");
            }
            Some(Transition::Closed) => {
                info!(webhook = %self.name, url = %self.url, "circuit closed: the endpoint answered a probe; waiting deliveries go out")
            }
            Some(Transition::Probing | Transition::Reopened) | None => {}
        }
    }

    /// For an `assigns_vip` endpoint: passes the addresses in a 2xx body to the recorder.
    async fn assign(&self, claimed: &Claimed, body: &[u8]) {
        let Some(tx) = &self.assignments else { return };
        match assignment(claimed, body) {
            Ok(Some(a)) => {
                let _ = tx.send(Feedback::Assigned(a)).await;
            }
            Ok(None) => {}
            Err(e) => {
                warn!(webhook = %self.name, service = %claimed.key, error = %e, "ignoring the VIP in the response")
            }
        }
    }

    /// A 410: records the endpoint as disabled.
    async fn disable(&self) {
        warn!(webhook = %self.name, url = %self.url, "receiver answered 410 Gone: endpoint disabled until re-enabled");
        match self.store.disable_webhook(&self.name, "receiver answered 410 Gone", &self.url).await {
            Err(e) if e.is_fenced() => {
                debug!(webhook = %self.name, error = %e, "endpoint not recorded as disabled: not the leader any more");
            }
            Err(e) => error!(webhook = %self.name, error = %e, "cannot record the endpoint as disabled"),
            Ok(()) => {}
        }
    }

    fn observe(&self, o: &Observed) {
        let label = match o.outcome {
            Outcome::Succeeded => "succeeded",
            Outcome::Retry(_) => "retrying",
            Outcome::Failed => "failed",
        };
        self.metrics.delivery(&self.name, label);
        match o.outcome {
            Outcome::Succeeded => {
                self.metrics.delivery_latency(&self.name, (o.now - o.created_at) as f64 / 1000.0);
                debug!(webhook = %self.name, delivery = o.delivery, service = %o.key, kind = %o.kind, status = ?o.status, "delivered");
            }
            Outcome::Retry(at) => {
                debug!(webhook = %self.name, delivery = o.delivery, service = %o.key, error = ?o.error, retry_in_ms = at - o.now, "attempt failed")
            }
            Outcome::Failed => {
                warn!(webhook = %self.name, delivery = o.delivery, service = %o.key, kind = %o.kind, error = ?o.error, attempts = o.attempts + 1, "delivery failed for good; replay it through the API when the receiver is fixed")
            }
        }
    }

    /// The endpoint answered 2xx after failures: every waiting delivery is due now (order is kept,
    /// since only queue heads are ever claimed).
    async fn catch_up(&self, now: i64) {
        match self.store.make_due(&self.name, now).await {
            Ok(0) => {}
            Ok(n) => info!(webhook = %self.name, deliveries = n, "endpoint recovered: waiting deliveries are due now"),
            Err(e) if e.is_fenced() => {
                debug!(webhook = %self.name, error = %e, "waiting deliveries not rescheduled: not the leader any more");
            }
            Err(e) => error!(webhook = %self.name, error = %e, "cannot reschedule waiting deliveries"),
        }
    }
}

#[cfg(test)]
mod tests {

    /// Lease 1.5 s (margin 150 ms), claimed at 10,000 ms: an attempt starting at once may run
    /// 1.35 s; one starting 1.2 s after the claim only 150 ms; one starting past the cut-off not at
    /// all.
    #[test]
    fn an_attempt_may_run_until_a_tenth_of_the_lease_before_its_claim_ends() {
        use std::time::Duration;
        let (claimed_until, margin) = (10_000 + 1_500, 150);
        assert_eq!(super::time_left(claimed_until, margin, 10_000), Duration::from_millis(1_350));
        assert_eq!(super::time_left(claimed_until, margin, 11_200), Duration::from_millis(150));
        assert_eq!(super::time_left(claimed_until, margin, 11_350), Duration::ZERO);
        assert_eq!(super::time_left(claimed_until, margin, 12_000), Duration::ZERO);
    }
}
