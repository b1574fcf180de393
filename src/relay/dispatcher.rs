//! One endpoint's dispatcher: claims due queue heads (one per Service, so per-Service order holds),
//! sends them concurrently, records each attempt, and retries per the policy. While the endpoint's
//! circuit is open (see [`super::circuit`]) it sends one probe at a time instead. Stops claiming on
//! shutdown and lets in-flight attempts finish within `relay.shutdown_grace`.
//!
//! Its writes share the watch's write transactions where they can (`store::owner`): while it has
//! free slots it leaves a standing claim that the watch's next commit runs after its inserts, so the
//! deliveries of a commit come with the commit, and a round of finished attempts waits for a commit
//! due within a few ms rather than commit on its own.
//!
//! When the database cannot be written (disk full, locked), the dispatcher backs off
//! ([`Store::write_backoff`]) instead of claiming again at once, and keeps the outcomes it could not
//! record in memory, recording them before it claims anything else: an attempt that succeeded is not
//! sent again just because recording it failed (only a restart before it is recorded re-sends it,
//! with the same `webhook-id`).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use super::assign::assignment;
use super::circuit::{Circuit, Transition, endpoint_down};
use super::policy::{Verdict, after_failure, already_gone};
use super::sender::AttemptResult;
use super::templated::Transport;
use crate::config::{RelayConfig, RetryConfig};
use crate::metrics::Metrics;
use crate::model::Feedback;
use crate::store::{Circuits, Claimed, Completion, Heads, Outcome, StandingClaim, Store, StoreError, Told, now_ms};

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
    pub trust: crate::leader::Trust,
}

/// The endpoint's health as the loop tracks it.
struct Health {
    /// An attempt failed since the last success (logged once; a success then makes waiting
    /// deliveries due at once).
    failing: bool,
    /// The circuit breaker.
    circuit: Circuit,
    /// A 410 disabled the endpoint during the last batch of attempts.
    disabled_now: bool,
}

/// Attempts in flight; one abandoned when the leader's trust ran out ends as `None`.
type InFlight = JoinSet<Option<(Claimed, AttemptResult)>>;

/// One attempt out of [`InFlight`] (`Err`: its task panicked or was aborted).
type FinishedAttempt = Result<Option<(Claimed, AttemptResult)>, tokio::task::JoinError>;

/// Writes the dispatcher could not make yet, and when to try the database again.
#[derive(Default)]
struct StoreRetry {
    /// Finished attempts not recorded yet (oldest first).
    unrecorded: Vec<Completion>,
    /// The backoff since the first failed write; `None` while writes succeed.
    backoff: Option<backon::ExponentialBackoff>,
    /// No database write before this.
    until: Option<tokio::time::Instant>,
    /// The last failure was the fence's refusal: this replica's term is over (the store logged it
    /// once; here it is no error).
    fenced: bool,
}

impl StoreRetry {
    /// A write failed with `e`: waits the next backoff delay before the next one.
    fn failed(&mut self, store: &Store, e: &StoreError) -> Duration {
        use backon::BackoffBuilder;
        self.fenced = e.is_fenced();
        let delay = self.backoff.get_or_insert_with(|| store.write_backoff().build()).next().unwrap_or_default();
        self.until = Some(tokio::time::Instant::now() + delay);
        delay
    }

    fn succeeded(&mut self) {
        self.backoff = None;
        self.until = None;
    }

    /// True while the backoff says to leave the database alone.
    fn waiting(&self) -> bool {
        self.until.is_some_and(|u| u > tokio::time::Instant::now())
    }
}

/// The largest power of two not above `n` (0 for 0). A claim's `LIMIT` is a literal, so each
/// distinct limit is a statement SQLite prepares and keeps on the write connection (store module
/// docs), and the claim's, with its head check, is among the largest. Claims of any size from half
/// the slots up kept up to 17 of them with the default 32 slots; powers of two keep at most six, for
/// less resident memory (see docs/explanation/design-decisions.md). A claim that leaves a few slots
/// free until the next round brings no measurable loss.
fn power_of_two_within(n: usize) -> usize {
    n.checked_ilog2().map_or(0, |log| 1 << log)
}

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
fn cut_off_attempt(started_at: i64, clock: tokio::time::Instant) -> AttemptResult {
    let mut out = super::sender::failure(
        "timeout",
        "attempt cut off at nine tenths of relay.lease after its claim, so that it is recorded while leased".into(),
    );
    out.record.started_at = started_at;
    out.record.duration_ms = i64::try_from(clock.elapsed().as_millis()).unwrap_or(i64::MAX);
    out
}

/// The attempts that finished for the next round, starting with `first`: the others in flight that
/// finish within `interval` of the last round share it, and the round starts as soon as the last
/// one is out: were it to wait out the interval whenever others were still in flight, every round of
/// a first list's deliveries (sent together, answered within a few ms) would lose the rest of it.
///
/// `interval` is the least time between the starts of two rounds on the database (claims, recorded
/// outcomes): the store's group-commit interval ([`Store::commit_interval`],
/// `database.commit_interval`), so that a round can ride each of the watch's commits. Each round is
/// a transaction on the one write connection (its own, or the watch's it rides) and writes its pages
/// into the WAL; a round per finished attempt plus one per commit of the watch would cost more than
/// the attempts themselves. Adds at most this much to a delivery's wait.
async fn gather(
    first: FinishedAttempt,
    in_flight: &mut InFlight,
    last_round: &mut tokio::time::Instant,
    interval: Duration,
) -> Vec<FinishedAttempt> {
    let due = *last_round + interval;
    let mut done = vec![first];
    loop {
        while let Some(more) = in_flight.try_join_next() {
            done.push(more);
        }
        if in_flight.is_empty() || tokio::time::Instant::now() >= due {
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep_until(due) => {}
            Some(more) = in_flight.join_next() => done.push(more),
        }
    }
    *last_round = tokio::time::Instant::now();
    done
}

/// What a standing claim took once a write transaction carried it (`None` when that failed); then
/// the claim is gone from `standing`. Never resolves without one.
async fn standing_carried(standing: &mut Option<StandingClaim>) -> Option<Heads> {
    let Some(claim) = standing.as_mut() else { return std::future::pending().await };
    let taken = claim.answered().await;
    *standing = None;
    taken
}

/// Waits until `interval` (see [`gather`]) has passed since the last round started, then starts
/// this one.
async fn spaced(last_round: &mut tokio::time::Instant, interval: Duration) {
    tokio::time::sleep_until(*last_round + interval).await;
    *last_round = tokio::time::Instant::now();
}

impl Dispatcher {
    /// Runs until `cancel`; wakes on every commit (`committed`; when the commit already ran this
    /// loop's standing claim, it claims nothing more), on finished attempts, when the next retry is
    /// due, and every `relay.poll_interval` (work enqueued by another process).
    pub async fn run(self, mut committed: watch::Receiver<i64>, cancel: CancellationToken) {
        let mut in_flight = InFlight::new();
        let mut health = Health {
            failing: false,
            circuit: Circuit::new(self.circuit_failures, self.retry.clone()),
            disabled_now: false,
        };
        self.publish(&health.circuit, None);
        let mut committed_open = true;
        let mut store = StoreRetry::default();
        // Only this loop disables the endpoint (a 410); only the API enables it again. So the state is
        // read from the database at the start and, while disabled, on every pass (to see the API's
        // enable) — not on every pass of a busy endpoint.
        let mut disabled = self.is_disabled().await;
        let mut last_round = tokio::time::Instant::now();
        // Whether the last round already claimed for the free slots (then only a wake-up claims again).
        let mut claimed = false;
        // The highest event id whose commit carried a claim of ours, after its inserts: woken for
        // that commit, there is nothing new to claim. And the last `committed` value seen: a wake-up
        // that does not raise it (the publisher's pulse after letting held deliveries go, a repeated
        // notification) is not a new commit, and claims.
        let mut claimed_through = 0;
        let mut seen_commit = *committed.borrow();
        loop {
            if !store.waiting() {
                self.record(&mut store).await;
            }
            if disabled || health.disabled_now {
                disabled = self.is_disabled().await;
                health.disabled_now = false;
            }
            let just_claimed = std::mem::take(&mut claimed);
            if !disabled && !store.waiting() && store.unrecorded.is_empty() && !just_claimed {
                spaced(&mut last_round, self.store.commit_interval()).await;
                self.fill(&mut in_flight, &mut health.circuit, &mut store).await;
            }
            // With attempts in flight, their completion wakes us; the next-due query (a scan of the
            // queue heads) is only needed when idle. While the database fails, only the backoff does.
            let now = tokio::time::Instant::now();
            let nap = match store.until.filter(|until| *until > now) {
                Some(until) => until - now,
                None if in_flight.is_empty() => self.nap(disabled, &health.circuit).await,
                None => self.relay.poll_interval,
            };
            let backing_off = store.waiting();
            let mut standing = self.stand(disabled, &in_flight, &health.circuit, &store);
            let mut woken_by_commit = false;
            tokio::select! {
                _ = cancel.cancelled() => {
                    // Heads a commit claimed for us meanwhile go out within the shutdown grace
                    // (`drain`) rather than stay leased.
                    self.withdraw(standing.take(), &mut in_flight, &mut health.circuit, &mut claimed_through).await;
                    break;
                }
                Some(joined) = in_flight.join_next(), if !in_flight.is_empty() => {
                    // First the standing claim's heads, if it ran: they count against the free slots.
                    self.withdraw(standing.take(), &mut in_flight, &mut health.circuit, &mut claimed_through).await;
                    let done = gather(joined, &mut in_flight, &mut last_round, self.store.commit_interval()).await;
                    let done = done.into_iter().filter_map(|r| r.ok().flatten()).collect();
                    let refill = (!disabled).then_some(&mut in_flight);
                    claimed = self.finish(done, &mut health, &mut store, refill, &mut claimed_through).await;
                }
                Some(taken) = standing_carried(&mut standing) => {
                    store.succeeded();
                    self.start_taken(taken, &mut in_flight, &mut health.circuit, &mut claimed_through);
                    // This pass's claim is made; the commit's own wake-up follows (see below).
                    claimed = true;
                }
                changed = committed.changed(), if committed_open && !backing_off => {
                    committed_open = changed.is_ok();
                    woken_by_commit = committed_open;
                }
                _ = tokio::time::sleep(nap) => {}
            }
            self.withdraw(standing, &mut in_flight, &mut health.circuit, &mut claimed_through).await;
            // Woken only for a new commit whose deliveries a claim of ours already saw: nothing to
            // claim. Any other wake-up (a due retry, the publisher's pulse, a later commit) claims.
            if woken_by_commit {
                let commit = *committed.borrow_and_update();
                claimed |= commit > seen_commit && commit <= claimed_through;
                seen_commit = commit;
            }
        }
        self.drain(in_flight, &mut health, &mut store).await;
    }

    /// A claim for the free slots to ride the watch's next write transaction
    /// ([`Store::offer_claim`]), when this pass would claim at all: not while disabled, backing off
    /// or holding unrecorded outcomes, and only for as many slots as [`Dispatcher::fill`] would take.
    fn stand(
        &self,
        disabled: bool,
        in_flight: &InFlight,
        circuit: &Circuit,
        store: &StoreRetry,
    ) -> Option<StandingClaim> {
        if disabled || store.waiting() || !store.unrecorded.is_empty() {
            return None;
        }
        let free = self.free_slots(in_flight, circuit, now_ms());
        (free > 0).then(|| self.store.offer_claim(&self.name, self.lease_ms(), free))
    }

    /// Takes back a standing claim; if a write transaction ran it meanwhile, starts the heads it
    /// took and raises `claimed_through` to that transaction's highest event id.
    async fn withdraw(
        &self,
        standing: Option<StandingClaim>,
        in_flight: &mut InFlight,
        circuit: &mut Circuit,
        claimed_through: &mut i64,
    ) {
        let Some(standing) = standing else { return };
        if let Some(taken) = standing.withdraw().await {
            self.start_taken(taken, in_flight, circuit, claimed_through);
        }
    }

    /// Starts the heads a carried claim took and raises `claimed_through` to the carrying
    /// transaction's highest event id.
    fn start_taken(&self, taken: Heads, in_flight: &mut InFlight, circuit: &mut Circuit, claimed_through: &mut i64) {
        *claimed_through = (*claimed_through).max(taken.through.unwrap_or(0));
        self.start(taken.claimed, in_flight, circuit);
    }

    /// Records the outcomes kept in memory because the database refused them earlier.
    async fn record(&self, store: &mut StoreRetry) {
        if store.unrecorded.is_empty() {
            return;
        }
        match self.store.complete(&store.unrecorded).await {
            Ok(()) => {
                info!(webhook = %self.name, attempts = store.unrecorded.len(), "recorded attempts the database refused earlier");
                store.succeeded();
                if std::mem::take(&mut store.unrecorded).iter().any(|c| c.outcome == Outcome::Succeeded) {
                    self.acked.send_modify(|n| *n = n.wrapping_add(1));
                }
            }
            Err(e) => {
                let retry_in = store.failed(&self.store, &e);
                if e.is_fenced() {
                    debug!(webhook = %self.name, error = %e, attempts = store.unrecorded.len(), "attempts not recorded: not the leader any more");
                } else {
                    warn!(webhook = %self.name, error = %e, reason = %e.reason(), ?retry_in, attempts = store.unrecorded.len(), "still cannot record attempts; kept in memory, not sent again");
                }
            }
        }
    }

    async fn is_disabled(&self) -> bool {
        matches!(self.store.webhook_state(&self.name).await, Ok(Some(s)) if s.disabled_reason.is_some())
    }

    /// Claims as many due heads as there are free slots and starts their attempts. Claims in batches
    /// (when at least half the slots are free, or none is busy): each claim scans the queue heads.
    /// While the circuit is open: one probe when it is due and nothing is in flight, else nothing.
    async fn fill(&self, in_flight: &mut InFlight, circuit: &mut Circuit, store: &mut StoreRetry) {
        let now = now_ms();
        let free = self.free_slots(in_flight, circuit, now);
        if free == 0 {
            return;
        }
        match self.store.claim(&self.name, now, self.lease_ms(), free).await {
            Ok(claimed) => {
                store.succeeded();
                self.start(claimed, in_flight, circuit);
            }
            Err(e) => {
                let retry_in = store.failed(&self.store, &e);
                if e.is_fenced() {
                    debug!(webhook = %self.name, error = %e, "no claim: not the leader any more");
                } else {
                    error!(webhook = %self.name, error = %e, reason = %e.reason(), ?retry_in, "cannot claim deliveries; backing off");
                }
            }
        }
    }

    /// How many heads to claim now: the free slots (the circuit's allowance), but only when at least
    /// half are free or none is busy (each claim scans the queue heads), rounded down to a power of
    /// two ([`power_of_two_within`]); 0 = claim nothing.
    fn free_slots(&self, in_flight: &InFlight, circuit: &Circuit, now: i64) -> usize {
        let free = circuit.allowance(now, in_flight.len(), self.relay.concurrency);
        if !in_flight.is_empty() && free < self.relay.concurrency.div_ceil(2) { 0 } else { power_of_two_within(free) }
    }

    fn lease_ms(&self) -> i64 {
        i64::try_from(self.relay.lease.as_millis()).unwrap_or(i64::MAX)
    }

    /// Starts an attempt for each of `claimed`.
    fn start(&self, claimed: Vec<Claimed>, in_flight: &mut InFlight, circuit: &mut Circuit) {
        if !claimed.is_empty() {
            let probing = circuit.probe_started();
            self.publish(circuit, probing);
        }
        let margin = i64::try_from((self.relay.lease - self.relay.attempt_limit()).as_millis()).unwrap_or(i64::MAX);
        for c in claimed {
            if !self.trust.is_valid() {
                break;
            }
            let (sender, trust) = (self.sender.clone(), self.trust.clone());
            in_flight.spawn(async move {
                let (started_at, clock) = (now_ms(), tokio::time::Instant::now());
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
                    _ = trust.expired() => None,
                }
            });
        }
    }

    /// How long to wait when nothing else wakes us: until the next retry is due (or, while the
    /// circuit is open, the next probe), at most `poll_interval`.
    async fn nap(&self, disabled: bool, circuit: &Circuit) -> Duration {
        let poll = self.relay.poll_interval;
        if disabled {
            return poll;
        }
        let until = |at: i64| Duration::from_millis(u64::try_from(at - now_ms()).unwrap_or(0)).min(poll);
        let probe_at = circuit.wake_at();
        if let Some(at) = probe_at
            && at > now_ms()
        {
            return until(at);
        }
        // Closed, or a probe is allowed but nothing was due: until a delivery becomes due.
        match self.store.next_due(&self.name).await {
            Ok(Some(at)) => until(at.max(probe_at.unwrap_or(at))),
            _ => poll,
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
    fn publish(&self, circuit: &Circuit, transition: Option<Transition>) {
        let view = circuit.view();
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

    /// Records finished attempts in one transaction and applies their consequences. With `refill`
    /// (the attempts in flight; `None` while disabled or draining), the same transaction claims the
    /// next heads for the slots that freed ([`Store::complete_and_claim`]) and starts them. Returns
    /// whether that claim ran and nothing made more deliveries due since (a recovered endpoint's
    /// catch-up): then the next pass need not claim again.
    async fn finish(
        &self,
        mut done: Vec<(Claimed, AttemptResult)>,
        health: &mut Health,
        store: &mut StoreRetry,
        refill: Option<&mut InFlight>,
        claimed_through: &mut i64,
    ) -> bool {
        let now = now_ms();
        let mut completions = Vec::with_capacity(done.len());
        let mut recovered = false;
        for (claimed, result) in &mut done {
            let (claimed, told) = (&*claimed, result.told.take());
            let result = &*result;
            let outcome = self.outcome(claimed, result, now).await;
            health.disabled_now |= result.verdict == Verdict::Gone;
            self.observe(claimed, result, outcome, now);
            let retry_after = match result.verdict {
                Verdict::Retry { retry_after } => retry_after,
                Verdict::Success | Verdict::Gone | Verdict::Permanent => None,
            };
            let transition = health.circuit.record(endpoint_down(result), retry_after, now);
            recovered |= transition == Some(Transition::Closed);
            if let Some(until) = health.circuit.throttle(result.record.status_code, retry_after, now) {
                self.throttled(result.record.status_code, until, now);
            }
            self.publish(&health.circuit, transition);
            match outcome {
                Outcome::Succeeded => {
                    recovered |= std::mem::replace(&mut health.failing, false);
                    self.assigned(claimed, result).await;
                }
                _ => {
                    if !std::mem::replace(&mut health.failing, true) {
                        let r = &result.record;
                        let error = r.error.clone().unwrap_or_else(|| format!("HTTP {:?}", r.status_code));
                        warn!(webhook = %self.name, url = %self.url, error = %error, "endpoint failing; retrying with backoff (each failed attempt is in the delivery log)");
                    }
                }
            }
            // What a templated event-mode endpoint holds now: recorded with the success only.
            let told = told.filter(|_| outcome == Outcome::Succeeded).map(|value| Told {
                webhook: self.name.clone(),
                key: claimed.key.clone(),
                value,
            });
            completions.push(Completion { delivery_id: claimed.id, attempt: result.record.clone(), outcome, told });
        }
        let mut claimed = false;
        if !store.unrecorded.is_empty() || store.waiting() {
            // Earlier outcomes still wait for the database, or it is backed off: keep the order and
            // record them together later.
            store.unrecorded.extend(completions);
        } else {
            let free = match &refill {
                Some(in_flight) if !health.disabled_now => self.free_slots(in_flight, &health.circuit, now),
                _ => 0,
            };
            let claim = (free > 0).then(|| (self.name.as_str(), now_ms(), self.lease_ms(), free));
            match self.store.complete_and_claim(&completions, claim).await {
                Err(e) => {
                    let retry_in = store.failed(&self.store, &e);
                    if e.is_fenced() {
                        debug!(webhook = %self.name, error = %e, attempts = completions.len(), "attempts not recorded: not the leader any more");
                    } else {
                        error!(webhook = %self.name, error = %e, reason = %e.reason(), ?retry_in, attempts = completions.len(), "cannot record attempts; kept in memory and recorded when the database takes writes again (not sent again)");
                    }
                    store.unrecorded = completions;
                }
                Ok(taken) => {
                    claimed = claim.is_some();
                    if claimed {
                        *claimed_through = (*claimed_through).max(taken.through.unwrap_or(0));
                    }
                    store.succeeded();
                    if completions.iter().any(|c| c.outcome == Outcome::Succeeded) {
                        self.acked.send_modify(|n| *n = n.wrapping_add(1));
                    }
                    if let Some(in_flight) = refill {
                        self.start(taken.claimed, in_flight, &mut health.circuit);
                    }
                }
            }
        }
        if recovered {
            self.catch_up(now).await;
            claimed = false;
        }
        claimed
    }

    async fn outcome(&self, claimed: &Claimed, result: &AttemptResult, now: i64) -> Outcome {
        if already_gone(&claimed.kind, result.record.status_code) {
            return Outcome::Succeeded;
        }
        match result.verdict {
            Verdict::Success => Outcome::Succeeded,
            Verdict::Permanent => Outcome::Failed,
            Verdict::Gone => {
                warn!(webhook = %self.name, url = %self.url, "receiver answered 410 Gone: endpoint disabled until re-enabled");
                match self.disable().await {
                    Err(e) if e.is_fenced() => {
                        debug!(webhook = %self.name, error = %e, "endpoint not recorded as disabled: not the leader any more");
                    }
                    Err(e) => error!(webhook = %self.name, error = %e, "cannot record the endpoint as disabled"),
                    Ok(()) => {}
                }
                Outcome::Retry(now)
            }
            Verdict::Retry { retry_after } => {
                let attempts = u32::try_from(claimed.attempts + 1).unwrap_or(u32::MAX);
                let age = Duration::from_millis(u64::try_from(now - claimed.created_at).unwrap_or(0));
                after_failure(&self.retry, attempts, age, now, retry_after)
            }
        }
    }

    /// For an `assigns_vip` endpoint: passes the addresses in a 2xx body to the recorder.
    async fn assigned(&self, claimed: &Claimed, result: &AttemptResult) {
        let Some(tx) = &self.assignments else { return };
        if claimed.kind == "DELETED" || result.verdict != Verdict::Success {
            return;
        }
        match assignment(claimed, &result.body) {
            Ok(Some(a)) => {
                let _ = tx.send(Feedback::Assigned(a)).await;
            }
            Ok(None) => {}
            Err(e) => {
                warn!(webhook = %self.name, service = %claimed.key, error = %e, "ignoring the VIP in the response")
            }
        }
    }

    async fn disable(&self) -> Result<(), StoreError> {
        self.store.disable_webhook(&self.name, "receiver answered 410 Gone", &self.url).await
    }

    fn observe(&self, c: &Claimed, result: &AttemptResult, outcome: Outcome, now: i64) {
        let label = match outcome {
            Outcome::Succeeded => "succeeded",
            Outcome::Retry(_) => "retrying",
            Outcome::Failed => "failed",
        };
        self.metrics.delivery(&self.name, label);
        let r = &result.record;
        match outcome {
            Outcome::Succeeded => {
                self.metrics.delivery_latency(&self.name, (now - c.created_at) as f64 / 1000.0);
                debug!(webhook = %self.name, delivery = c.id, service = %c.key, kind = %c.kind, status = ?r.status_code, "delivered");
            }
            Outcome::Retry(at) => {
                debug!(webhook = %self.name, delivery = c.id, service = %c.key, error = ?r.error, retry_in_ms = at - now, "attempt failed")
            }
            Outcome::Failed => {
                warn!(webhook = %self.name, delivery = c.id, service = %c.key, kind = %c.kind, error = ?r.error, attempts = c.attempts + 1, "delivery failed for good; replay it through the API when the receiver is fixed")
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

    /// Graceful stop: waits up to `shutdown_grace` for attempts in flight, records them, abandons the
    /// rest (their leases are cleared at the next start, so they are sent again). Outcomes the database
    /// still refuses are lost with the process: those deliveries are sent again after the restart, with
    /// the same `webhook-id`.
    async fn drain(&self, mut in_flight: InFlight, health: &mut Health, store: &mut StoreRetry) {
        self.record(store).await;
        if in_flight.is_empty() {
            self.warn_unrecorded(store);
            return;
        }
        info!(webhook = %self.name, in_flight = in_flight.len(), "waiting for attempts in flight");
        let deadline = tokio::time::Instant::now() + self.relay.shutdown_grace;
        let mut done = Vec::new();
        while let Ok(Some(joined)) = tokio::time::timeout_at(deadline, in_flight.join_next()).await {
            done.extend(joined.ok().flatten());
        }
        if !in_flight.is_empty() {
            warn!(webhook = %self.name, abandoned = in_flight.len(), "shutdown grace over; unfinished deliveries stay pending");
            in_flight.abort_all();
        }
        self.finish(done, health, store, None, &mut 0).await;
        self.warn_unrecorded(store);
    }

    fn warn_unrecorded(&self, store: &StoreRetry) {
        if store.unrecorded.is_empty() {
            return;
        }
        if store.fenced {
            // A deposed leader: the next one sends them again, as it would after a crash.
            info!(webhook = %self.name, attempts = store.unrecorded.len(), "standing down with attempts this term could not record; the next leader sends those deliveries again (same webhook-id)");
        } else {
            warn!(webhook = %self.name, attempts = store.unrecorded.len(), "stopping with attempts the database did not take; those deliveries are sent again after the restart (same webhook-id)");
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
    #[test]
    fn a_claim_takes_the_largest_power_of_two_within_the_free_slots() {
        let claims: Vec<usize> =
            [0, 1, 2, 3, 16, 17, 31, 32, 4096].into_iter().map(super::power_of_two_within).collect();
        assert_eq!(claims, [0, 1, 2, 2, 16, 16, 16, 32, 4096]);
    }
}
