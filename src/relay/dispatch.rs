//! One endpoint's dispatcher as a state machine: what to do next, decided from what happened, with
//! no IO and no clock of its own. [`Dispatch::on`] takes an [`Event`] (a commit seen, attempts
//! finished, a store answer, the timer, a stop) with the time it happened ([`Now`]), and returns the
//! [`Action`]s the shell ([`super::dispatcher`]) carries out: claim, send, record, sleep, publish.
//!
//! The rules, as the shell sees them:
//! - **One store operation at a time.** An action that reads or writes the database (a claim, a
//!   round, recording kept outcomes, reading whether the endpoint is disabled, the next due time,
//!   making waiting deliveries due, taking back a standing claim) is answered by the shell with its
//!   result event before anything else happens; the machine asks for no other until then.
//! - **One claim at a time.** Either a standing claim ([`Action::Offer`]: it runs after the watch's
//!   next commit, so the deliveries of a commit come with the commit) or a claim of its own. When it
//!   needs heads now while a claim stands (a commit the claim did not see, a retry due, a round), it
//!   hurries the standing claim ([`Action::Amend`]) instead of claiming again, so no commit is
//!   claimed twice. A commit the standing claim saw comes with its answer, before the commit's
//!   wake-up: that wake-up then claims nothing.
//! - **Rounds.** Finished attempts wait for the others in flight until the group-commit interval
//!   since the last round has passed (or none is in flight), then go as one round: their outcomes
//!   recorded and, in the same transaction, the next heads claimed for the freed slots. A claim
//!   standing then is taken back first, so the round's is the one claim.
//! - **The database refusing writes.** A failed claim or round starts a backoff
//!   ([`crate::store::Store::write_backoff`]); outcomes not recorded stay in memory and are recorded
//!   first, before any new claim: an attempt that succeeded is not sent again just because
//!   recording it failed.
//! - **The circuit** ([`super::circuit`]) decides how many attempts may start: while open, one probe
//!   at a time; the probe that closes it makes every waiting delivery due ([`Action::CatchUp`]).
//!   When the endpoint answers a catch-up probe ([`super::catch_up`]) while the circuit is open,
//!   the next probe goes at once rather than at the next backoff step ([`Event::Reachable`]): the
//!   waiting deliveries are made due so that there is one to probe with. An answer that brings
//!   nothing forward (the circuit closed, half-open or its probe due already) changes nothing, not
//!   even the timer.
//! - **Concurrency.** At most `concurrency` attempts are in flight: the endpoint's own, or
//!   `relay.concurrency`, or, for an endpoint without its own, what the receiver says it takes in at
//!   once ([`Event::Concurrency`]); raised, the new free slots are claimed at once.
//! - **The leader's term.** No attempt starts once [`Now::leading`] is false (the heads stay leased
//!   and are claimed again once the lease ends); an attempt still running then is abandoned by the
//!   shell ([`Finished::Abandoned`]) and not recorded.
//! - **Stop.** The standing claim is taken back (heads it took go out), kept outcomes are recorded,
//!   attempts in flight get `relay.shutdown_grace` to finish, the rest are abandoned, and the
//!   finished ones are recorded.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use super::circuit::{Circuit, Transition};
use super::policy::{Verdict, after_failure, already_gone};
use super::sender::AttemptResult;
use crate::config::RetryConfig;
use crate::store::{CircuitView, Claimed, Completion, Heads, Outcome, StoreError, Told};

/// What the machine knows of its endpoint and configuration.
#[derive(Debug, Clone)]
pub(super) struct Settings {
    /// The endpoint's name (logs, and the `told` rows of templated endpoints).
    pub name: String,
    /// Its URL, redacted (logs).
    pub url: String,
    /// Most attempts in flight (`relay.concurrency`, or the endpoint's own).
    pub concurrency: usize,
    /// How long an attempt may take before the shutdown grace abandons it (`relay.shutdown_grace`).
    pub shutdown_grace: Duration,
    /// The longest wait when nothing else wakes the dispatcher (`relay.poll_interval`).
    pub poll_interval: Duration,
    /// The endpoint's retry schedule.
    pub retry: RetryConfig,
    /// Consecutive down attempts that open the circuit (0: never).
    pub circuit_failures: u32,
    /// The backoff of a write the database refused ([`crate::store::Store::write_backoff`]).
    pub write_backoff: ExponentialBuilder,
    /// Whether a 2xx body may assign the Service's VIP (`assigns_vip`).
    pub assigns: bool,
}

/// When an event happened, and what was true then.
#[derive(Debug, Clone, Copy)]
pub(super) struct Now {
    /// Wall-clock time, Unix ms (the unit of the delivery rows).
    pub ms: i64,
    /// Monotonic time, for timers.
    pub at: Instant,
    /// The store's group-commit interval now ([`crate::store::Store::commit_interval`]).
    pub interval: Duration,
    /// Whether this replica may still act as leader (its term's deadline has not passed).
    pub leading: bool,
}

/// An attempt out of flight.
#[derive(Debug)]
#[expect(clippy::large_enum_variant, reason = "nearly every attempt is Done: boxing would only add an allocation")]
pub(super) enum Finished {
    /// It ended with this result.
    Done(Claimed, AttemptResult),
    /// It was abandoned (the leader's term ran out, or its task failed): nothing to record.
    Abandoned,
}

/// What happened.
#[derive(Debug)]
pub(super) enum Event {
    /// The dispatcher starts.
    Start,
    /// The watch committed up to this event id, or the publisher released deliveries that waited
    /// for a Service's finalizer (the same id again).
    Commit(i64),
    /// No more commits will be signalled.
    CommitsClosed,
    /// Attempts left flight.
    Finished(Vec<Finished>),
    /// The answer to [`Action::Claim`].
    Claimed(Result<Vec<Claimed>, StoreError>),
    /// The answer to [`Action::Round`].
    Rounded(Result<Heads, StoreError>),
    /// The answer to [`Action::Record`].
    Recorded(Result<(), StoreError>),
    /// The standing claim ran: what it took, or `None` when its transaction failed.
    Answered(Option<Heads>),
    /// The answer to [`Action::Withdraw`]: what the standing claim took, if it ran first.
    Withdrawn(Option<Heads>),
    /// The answer to [`Action::NextDue`]: when the next queue head becomes claimable (Unix ms).
    NextDue(Option<i64>),
    /// The answer to [`Action::ReadDisabled`]: whether the endpoint is disabled (a 410).
    Disabled(bool),
    /// [`Action::CatchUp`] is done.
    CaughtUp,
    /// The endpoint answered a catch-up probe ([`super::catch_up`]): while the circuit is open, its
    /// next probe may go now ([`super::circuit::Circuit::reachable`]).
    Reachable,
    /// The receiver takes this many deliveries at once (it said so, or stopped saying and the
    /// configured number holds again): the most attempts in flight from now on. Raised, it claims for
    /// the new free slots at once.
    Concurrency(usize),
    /// The timer ([`Action::SleepUntil`]) fired.
    Timer,
    /// Stop (shutdown, or the end of the leader's term).
    Stop,
}

/// What to do.
#[derive(Debug)]
pub(super) enum Action {
    /// Read whether the endpoint is disabled: answer [`Event::Disabled`].
    ReadDisabled,
    /// Claim up to `limit` due heads now: answer [`Event::Claimed`].
    Claim { limit: usize },
    /// Record `done`, then claim up to `claim` heads (0: none), in one transaction: answer
    /// [`Event::Rounded`].
    Round { done: Vec<Completion>, claim: usize },
    /// Record outcomes kept in memory: answer [`Event::Recorded`].
    Record(Vec<Completion>),
    /// Leave a standing claim of up to `limit` heads; its answer comes as [`Event::Answered`].
    Offer { limit: usize },
    /// Change the standing claim's limit; `hurry`: make it run in the next transaction.
    Amend { limit: usize, hurry: bool },
    /// Take the standing claim back: answer [`Event::Withdrawn`].
    Withdraw,
    /// Start an attempt for each of these heads; each comes back as [`Event::Finished`].
    Send(Vec<Claimed>),
    /// Read when the next queue head becomes claimable: answer [`Event::NextDue`].
    NextDue,
    /// Fire [`Event::Timer`] at this time (replacing the timer set before).
    SleepUntil(Instant),
    /// Publish the circuit's view (API, gauge), logging and counting the transition.
    Publish(CircuitView, Option<Transition>),
    /// Count and log an attempt's outcome.
    Observe(Observed),
    /// The endpoint asked to slow down: count and log it (Unix ms).
    Throttled { status: Option<u16>, until: i64, now: i64 },
    /// The endpoint started failing: log it once.
    Failing { error: String },
    /// Record the endpoint as disabled (a 410); nothing to answer.
    Disable,
    /// Pass the VIP in this successful attempt's body on (`assigns_vip`).
    Assign(Claimed, Vec<u8>),
    /// Tell the publisher that attempts succeeded.
    Acked,
    /// Make every waiting delivery due at `now` (Unix ms): answer [`Event::CaughtUp`]. After a probe
    /// closed the circuit, or an answer to a catch-up probe brought the next probe forward.
    CatchUp { now: i64 },
    /// Abandon every attempt in flight (the shutdown grace is over).
    Abort,
    /// Done: the dispatcher ends.
    Stopped,
}

/// An attempt's outcome, for its metrics and log line.
#[derive(Debug)]
pub(super) struct Observed {
    /// The delivery.
    pub delivery: i64,
    /// Its Service.
    pub key: crate::model::ServiceKey,
    /// Its kind.
    pub kind: String,
    /// Attempts before this one.
    pub attempts: i64,
    /// When it was enqueued (Unix ms).
    pub created_at: i64,
    /// The answer's status, if any.
    pub status: Option<u16>,
    /// The error, if any.
    pub error: Option<String>,
    /// What the delivery becomes.
    pub outcome: Outcome,
    /// When (Unix ms).
    pub now: i64,
}

/// The store operation the machine waits for.
#[derive(Debug)]
enum Op {
    ReadDisabled,
    Claim,
    /// A round: its outcomes (kept in memory if it fails), whether it claimed, whether a success
    /// closed the circuit or ended a failing streak (then waiting deliveries are made due).
    Round {
        done: Vec<Completion>,
        claimed: bool,
        recovered: bool,
    },
    Record,
    NextDue,
    Withdraw,
    CatchUp,
}

/// The standing claim, as last asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Standing {
    limit: usize,
    hurried: bool,
}

/// The database's backoff after a refused write.
#[derive(Debug)]
struct Backoff {
    builder: ExponentialBuilder,
    /// The backoff since the first failed write; `None` while writes succeed.
    steps: Option<ExponentialBackoff>,
    /// No database write before this.
    until: Option<Instant>,
    /// The last failure was the fence's refusal: this replica's term is over.
    fenced: bool,
}

impl Backoff {
    /// A write failed with `e` at `now`: the next one waits the next delay.
    fn failed(&mut self, e: &StoreError, now: Instant) -> Duration {
        self.fenced = e.is_fenced();
        let delay = self.steps.get_or_insert_with(|| self.builder.build()).next().unwrap_or_default();
        self.until = Some(now + delay);
        delay
    }

    fn succeeded(&mut self) {
        self.steps = None;
        self.until = None;
    }

    /// True while the backoff says to leave the database alone.
    fn waiting(&self, now: Instant) -> bool {
        self.until.is_some_and(|u| u > now)
    }
}

/// Where the stop stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stopping {
    /// Take the standing claim back.
    Withdraw,
    /// Record what the database refused earlier.
    Record,
    /// Wait for the attempts in flight, until the deadline once set.
    Wait(Option<Instant>),
    /// Record the attempts that finished.
    Finish,
}

/// One endpoint's dispatcher state ([`Dispatch::on`]).
#[derive(Debug)]
pub(super) struct Dispatch {
    settings: Settings,
    circuit: Circuit,
    /// An attempt failed since the last success (logged once; a success then makes waiting
    /// deliveries due at once).
    failing: bool,
    /// Whether the endpoint is disabled; `None`: to be read (at the start, and on every wake-up
    /// while disabled: only the API enables it again).
    disabled: Option<bool>,
    /// A 410 disabled the endpoint during the last round: read it again.
    disabled_now: bool,
    /// An answer to a catch-up probe brought the circuit's next probe forward: make the waiting
    /// deliveries due ([`Action::CatchUp`]) before anything else.
    reached: bool,
    /// Attempts started and not finished.
    in_flight: usize,
    /// Attempts finished and not in a round yet, and when they go even if others are still in flight.
    finished: Vec<(Claimed, AttemptResult)>,
    round_due: Option<Instant>,
    /// Outcomes the database refused (oldest first).
    unrecorded: Vec<Completion>,
    backoff: Backoff,
    /// When the last round (or claim of its own) started: the next waits a group-commit interval.
    last_round: Instant,
    standing: Option<Standing>,
    op: Option<Op>,
    /// A wake-up that may bring new heads (a commit no claim of ours saw, a due retry, the poll):
    /// claim, unless a claim just ran.
    want_claim: bool,
    /// The highest event id whose commit ran a claim of ours after its inserts: woken for that
    /// commit, there is nothing new to claim.
    claimed_through: i64,
    /// The last commit seen: a wake-up that does not raise it (the publisher's pulse) is no new
    /// commit, and claims.
    seen_commit: i64,
    commits_open: bool,
    /// When to look again with nothing else waking us, once worked out for this wake-up.
    nap: Option<Instant>,
    timer: Option<Instant>,
    stopping: Option<Stopping>,
    stopped: bool,
}

/// The largest power of two not above `n` (0 for 0). A claim's `LIMIT` is a literal, so each
/// distinct limit is a statement SQLite prepares and keeps on the write connection (store module
/// docs), and the claim's, with its head check, is among the largest. Claims of any size from half
/// the slots up kept up to 17 of them with the default 32 slots; powers of two keep at most six, for
/// less resident memory (see docs/explanation/design-decisions.md). A claim that leaves a few slots
/// free until the next round brings no measurable loss.
pub(super) fn power_of_two_within(n: usize) -> usize {
    n.checked_ilog2().map_or(0, |log| 1 << log)
}

impl Dispatch {
    /// A dispatcher that has done nothing yet, at `now`.
    pub fn new(settings: Settings, now: Instant) -> Self {
        let backoff = Backoff { builder: settings.write_backoff, steps: None, until: None, fenced: false };
        Self {
            circuit: Circuit::new(settings.circuit_failures, settings.retry.clone()),
            settings,
            failing: false,
            disabled: None,
            disabled_now: false,
            reached: false,
            in_flight: 0,
            finished: Vec::new(),
            round_due: None,
            unrecorded: Vec::new(),
            backoff,
            last_round: now,
            standing: None,
            op: None,
            want_claim: false,
            claimed_through: 0,
            seen_commit: 0,
            commits_open: true,
            nap: None,
            timer: None,
            stopping: None,
            stopped: false,
        }
    }

    /// Whether a commit should wake the dispatcher now: not while the database is backed off (the
    /// backoff's timer does), nor once commits are no longer signalled.
    pub fn listens(&self, now: Instant) -> bool {
        self.commits_open && !self.backoff.waiting(now) && self.stopping.is_none()
    }

    /// Takes `event`, at `now`; returns what to do, in order.
    pub fn on(&mut self, event: Event, now: Now) -> Vec<Action> {
        let mut out = Vec::new();
        if matches!(event, Event::Reachable) && (self.stopping.is_some() || !self.circuit.reachable(now.ms)) {
            // Nothing brought forward (it answers every catch-up probe, open circuit or not): no
            // store read, no new timer.
            return out;
        }
        if !matches!(event, Event::NextDue(_)) {
            self.nap = None;
        }
        match event {
            Event::Start => {
                self.last_round = now.at;
                self.want_claim = true;
                out.push(Action::Publish(self.circuit.view(), None));
            }
            Event::Commit(id) => {
                // Woken only for a new commit whose deliveries a claim of ours already saw: nothing
                // to claim. Any other wake-up (a later commit, the publisher's pulse) claims.
                self.want_claim |= !(id > self.seen_commit && id <= self.claimed_through);
                self.seen_commit = id;
                self.reread_disabled();
            }
            Event::CommitsClosed => self.commits_open = false,
            Event::Finished(finished) => {
                for f in finished {
                    self.in_flight = self.in_flight.saturating_sub(1);
                    if let Finished::Done(claimed, result) = f {
                        self.finished.push((claimed, result));
                    }
                }
                if !self.finished.is_empty() && self.round_due.is_none() {
                    self.round_due = Some(self.last_round + now.interval);
                }
            }
            Event::Claimed(result) => {
                self.op = None;
                match result {
                    Ok(claimed) => {
                        self.backoff.succeeded();
                        self.start(claimed, now, &mut out);
                    }
                    Err(e) => {
                        let retry_in = self.backoff.failed(&e, now.at);
                        let (name, url) = (&self.settings.name, &self.settings.url);
                        if e.is_fenced() {
                            debug!(webhook = %name, error = %e, "no claim: not the leader any more");
                        } else {
                            error!(webhook = %name, url = %url, error = %e, reason = %e.reason(), ?retry_in, "cannot claim deliveries; backing off");
                        }
                    }
                }
            }
            Event::Rounded(result) => self.rounded(result, now, &mut out),
            Event::Recorded(result) => self.recorded(result, now, &mut out),
            Event::Answered(heads) => {
                self.standing = None;
                if let Some(heads) = heads {
                    self.backoff.succeeded();
                    self.claimed_through = self.claimed_through.max(heads.through.unwrap_or(0));
                    self.start(heads.claimed, now, &mut out);
                    // This wake-up's claim is made; the commit's own wake-up follows.
                    self.want_claim = false;
                }
            }
            Event::Withdrawn(heads) => {
                self.op = None;
                self.standing = None;
                if let Some(heads) = heads {
                    self.claimed_through = self.claimed_through.max(heads.through.unwrap_or(0));
                    self.start(heads.claimed, now, &mut out);
                }
            }
            Event::NextDue(due) => {
                self.op = None;
                let poll = self.settings.poll_interval;
                let wait = due.map_or(poll, |at| until(at, now.ms).min(poll));
                self.nap = Some(now.at + wait);
            }
            Event::Disabled(disabled) => {
                self.op = None;
                self.disabled = Some(disabled);
            }
            Event::CaughtUp => {
                self.op = None;
                self.want_claim = true;
            }
            Event::Reachable => {
                let (name, url) = (&self.settings.name, &self.settings.url);
                info!(webhook = %name, url = %url, "the endpoint answers again: probing it now, not at the next backoff step");
                out.push(Action::Publish(self.circuit.view(), None));
                self.reached = true;
            }
            Event::Concurrency(n) => {
                let (name, was) = (&self.settings.name, self.settings.concurrency);
                if n != was {
                    info!(webhook = %name, concurrency = n, was, "the endpoint takes this many deliveries at once: keeping up to that many in flight");
                    self.settings.concurrency = n;
                    self.want_claim |= n > was;
                }
            }
            Event::Timer => {
                self.timer = None;
                self.want_claim = true;
                self.reread_disabled();
            }
            Event::Stop => {
                if self.stopping.is_none() {
                    self.stopping = Some(Stopping::Withdraw);
                }
            }
        }
        self.next(now, &mut out);
        out
    }

    /// While disabled, every wake-up reads the state again (the API's enable).
    fn reread_disabled(&mut self) {
        if self.disabled == Some(true) {
            self.disabled = None;
        }
    }

    /// Decides what comes next, once no store operation is awaited.
    fn next(&mut self, now: Now, out: &mut Vec<Action>) {
        if self.op.is_some() || self.stopped {
            return;
        }
        if let Some(stopping) = self.stopping {
            return self.stop(stopping, now, out);
        }
        if std::mem::take(&mut self.reached) {
            self.op = Some(Op::CatchUp);
            out.push(Action::CatchUp { now: now.ms });
            return;
        }
        let waiting = self.backoff.waiting(now.at);
        // Outcomes the database refused go first, before any claim.
        if !self.unrecorded.is_empty() && !waiting {
            self.op = Some(Op::Record);
            out.push(Action::Record(self.unrecorded.clone()));
            return;
        }
        if self.disabled.is_none() || self.disabled_now {
            self.disabled_now = false;
            self.op = Some(Op::ReadDisabled);
            out.push(Action::ReadDisabled);
            return;
        }
        let disabled = self.disabled == Some(true);
        if !self.finished.is_empty() {
            match self.round_due {
                Some(due) if self.in_flight > 0 && now.at < due => self.sleep_until(due, out),
                _ => return self.round(now, out),
            }
            return;
        }
        let may_claim = !disabled && !waiting && self.unrecorded.is_empty();
        if std::mem::take(&mut self.want_claim) && may_claim {
            let due = self.last_round + now.interval;
            if now.at < due {
                // Spaced from the last round by the group-commit interval.
                self.want_claim = true;
                return self.sleep_until(due, out);
            }
            self.last_round = now.at;
            let free = self.free_slots(now.ms);
            match &mut self.standing {
                _ if free == 0 => {}
                Some(standing) if standing.hurried => {}
                Some(standing) => {
                    *standing = Standing { limit: free, hurried: true };
                    out.push(Action::Amend { limit: free, hurry: true });
                }
                None => {
                    self.op = Some(Op::Claim);
                    out.push(Action::Claim { limit: free });
                    return;
                }
            }
        }
        // How long until we look again when nothing else wakes us: while the database is backed
        // off, the backoff; with attempts in flight, their completion (or the poll); when idle, the
        // next retry due (or, while the circuit is open, the next probe), at most the poll.
        let poll = self.settings.poll_interval;
        let wake = match self.backoff.until.filter(|u| *u > now.at) {
            Some(until) => until,
            None if self.in_flight > 0 => now.at + poll,
            None => match self.nap {
                Some(at) => at,
                None if disabled => now.at + poll,
                None => match self.circuit.wake_at().filter(|at| *at > now.ms) {
                    Some(at) => now.at + until(at, now.ms).min(poll),
                    None => {
                        self.op = Some(Op::NextDue);
                        out.push(Action::NextDue);
                        return;
                    }
                },
            },
        };
        self.sleep_until(wake, out);
        self.stand(may_claim, now, out);
    }

    /// Leaves a standing claim for the free slots (or brings its limit in line with them): not while
    /// disabled, backed off or holding unrecorded outcomes (then it is taken back: a claim must not
    /// run before those are recorded).
    fn stand(&mut self, may_claim: bool, now: Now, out: &mut Vec<Action>) {
        if !may_claim {
            if self.standing.is_some() {
                self.op = Some(Op::Withdraw);
                out.push(Action::Withdraw);
            }
            return;
        }
        let free = self.free_slots(now.ms);
        match &mut self.standing {
            None if free > 0 => {
                self.standing = Some(Standing { limit: free, hurried: false });
                out.push(Action::Offer { limit: free });
            }
            Some(standing) if !standing.hurried && standing.limit != free => {
                standing.limit = free;
                out.push(Action::Amend { limit: free, hurry: false });
            }
            _ => {}
        }
    }

    fn sleep_until(&mut self, at: Instant, out: &mut Vec<Action>) {
        if self.timer != Some(at) {
            self.timer = Some(at);
            out.push(Action::SleepUntil(at));
        }
    }

    /// How many heads to claim now: the free slots (the circuit's allowance), but only when at least
    /// half are free or none is busy (each claim scans the queue heads), rounded down to a power of
    /// two ([`power_of_two_within`]); 0 = claim nothing.
    fn free_slots(&self, now_ms: i64) -> usize {
        let concurrency = self.settings.concurrency;
        let free = self.circuit.allowance(now_ms, self.in_flight, concurrency);
        if self.in_flight > 0 && free < concurrency.div_ceil(2) { 0 } else { power_of_two_within(free) }
    }

    /// Starts an attempt for each of `claimed`, while this replica leads.
    fn start(&mut self, claimed: Vec<Claimed>, now: Now, out: &mut Vec<Action>) {
        if claimed.is_empty() {
            return;
        }
        let probing = self.circuit.probe_started();
        out.push(Action::Publish(self.circuit.view(), probing));
        if !now.leading {
            // Not made: their leases run out and the next leader sends them.
            return;
        }
        self.in_flight += claimed.len();
        out.push(Action::Send(claimed));
    }

    /// The finished attempts as one round: each outcome decided and reported, then recorded with a
    /// claim for the freed slots (or kept in memory while the database is backed off or earlier
    /// outcomes wait).
    fn round(&mut self, now: Now, out: &mut Vec<Action>) {
        if self.standing.is_some() && self.unrecorded.is_empty() && !self.backoff.waiting(now.at) {
            // The standing claim is taken back first (its heads, if it ran, count against the free
            // slots), so that the round claims for the freed slots in its own transaction, after
            // recording the attempts that freed them.
            self.op = Some(Op::Withdraw);
            out.push(Action::Withdraw);
            return;
        }
        self.round_due = None;
        self.last_round = now.at;
        let done = std::mem::take(&mut self.finished);
        let mut completions = Vec::with_capacity(done.len());
        let mut recovered = false;
        for (claimed, mut result) in done {
            let told = result.told.take();
            let outcome = self.outcome(&claimed, &result, now.ms, out);
            self.disabled_now |= result.verdict == Verdict::Gone;
            let r = &result.record;
            out.push(Action::Observe(Observed {
                delivery: claimed.id,
                key: claimed.key.clone(),
                kind: claimed.kind.clone(),
                attempts: claimed.attempts,
                created_at: claimed.created_at,
                status: r.status_code,
                error: r.error.clone(),
                outcome,
                now: now.ms,
            }));
            let retry_after = match result.verdict {
                Verdict::Retry { retry_after } => retry_after,
                Verdict::Success | Verdict::Gone | Verdict::Permanent => None,
            };
            let transition = self.circuit.record_result(&result, retry_after, now.ms);
            recovered |= transition == Some(Transition::Closed);
            if let Some(until) = self.circuit.throttle(r.status_code, retry_after, now.ms) {
                out.push(Action::Throttled { status: r.status_code, until, now: now.ms });
            }
            out.push(Action::Publish(self.circuit.view(), transition));
            let attempt = result.record.clone();
            match outcome {
                Outcome::Succeeded => {
                    recovered |= std::mem::replace(&mut self.failing, false);
                    if self.settings.assigns && claimed.kind != "DELETED" && result.verdict == Verdict::Success {
                        out.push(Action::Assign(claimed.clone(), result.body));
                    }
                }
                _ => {
                    if !std::mem::replace(&mut self.failing, true) {
                        let error = attempt.error.clone().unwrap_or_else(|| format!("HTTP {:?}", attempt.status_code));
                        out.push(Action::Failing { error });
                    }
                }
            }
            // What a templated event-mode endpoint holds now: recorded with the success only.
            let told = told.filter(|_| outcome == Outcome::Succeeded).map(|value| Told {
                webhook: self.settings.name.clone(),
                key: claimed.key.clone(),
                value,
            });
            completions.push(Completion { delivery_id: claimed.id, attempt, outcome, told });
        }
        if !self.unrecorded.is_empty() || self.backoff.waiting(now.at) {
            // Earlier outcomes still wait for the database, or it is backed off: keep the order and
            // record them together later.
            self.unrecorded.extend(completions);
            if recovered {
                self.op = Some(Op::CatchUp);
                out.push(Action::CatchUp { now: now.ms });
            }
            return;
        }
        let disabled = self.disabled_now || self.disabled == Some(true);
        let claim = if disabled || self.stopping.is_some() { 0 } else { self.free_slots(now.ms) };
        self.op = Some(Op::Round { done: completions.clone(), claimed: claim > 0, recovered });
        out.push(Action::Round { done: completions, claim });
    }

    /// The answer to a round.
    fn rounded(&mut self, result: Result<Heads, StoreError>, now: Now, out: &mut Vec<Action>) {
        let Some(Op::Round { done, claimed, recovered }) = self.op.take() else {
            unreachable!("a round's answer follows a round")
        };
        let (name, url) = (&self.settings.name, &self.settings.url);
        match result {
            Err(e) => {
                let retry_in = self.backoff.failed(&e, now.at);
                if e.is_fenced() {
                    debug!(webhook = %name, error = %e, attempts = done.len(), "attempts not recorded: not the leader any more");
                } else {
                    error!(webhook = %name, url = %url, error = %e, reason = %e.reason(), ?retry_in, attempts = done.len(), "cannot record attempts; kept in memory and recorded when the database takes writes again (not sent again)");
                }
                self.unrecorded = done;
                self.want_claim = false;
            }
            Ok(heads) => {
                self.backoff.succeeded();
                if done.iter().any(|c| c.outcome == Outcome::Succeeded) {
                    out.push(Action::Acked);
                }
                if !heads.claimed.is_empty() || heads.through.is_some() {
                    self.claimed_through = self.claimed_through.max(heads.through.unwrap_or(0));
                }
                // Whether this round claimed: then the next wake-up need not claim again.
                self.want_claim = !claimed;
                if self.stopping.is_none() {
                    self.start(heads.claimed, now, out);
                }
            }
        }
        if recovered {
            self.op = Some(Op::CatchUp);
            out.push(Action::CatchUp { now: now.ms });
        }
    }

    /// The answer to recording outcomes kept in memory.
    fn recorded(&mut self, result: Result<(), StoreError>, now: Now, out: &mut Vec<Action>) {
        self.op = None;
        let name = &self.settings.name;
        match result {
            Ok(()) => {
                info!(webhook = %name, attempts = self.unrecorded.len(), "recorded attempts the database refused earlier");
                self.backoff.succeeded();
                if std::mem::take(&mut self.unrecorded).iter().any(|c| c.outcome == Outcome::Succeeded) {
                    out.push(Action::Acked);
                }
            }
            Err(e) => {
                let retry_in = self.backoff.failed(&e, now.at);
                if e.is_fenced() {
                    debug!(webhook = %name, error = %e, attempts = self.unrecorded.len(), "attempts not recorded: not the leader any more");
                } else {
                    warn!(webhook = %name, error = %e, reason = %e.reason(), ?retry_in, attempts = self.unrecorded.len(), "still cannot record attempts; kept in memory, not sent again");
                }
            }
        }
    }

    /// What `result` makes of `claimed`'s delivery at `now` (Unix ms); a 410 disables the endpoint.
    fn outcome(&self, claimed: &Claimed, result: &AttemptResult, now: i64, out: &mut Vec<Action>) -> Outcome {
        if already_gone(&claimed.kind, result.record.status_code) {
            return Outcome::Succeeded;
        }
        match result.verdict {
            Verdict::Success => Outcome::Succeeded,
            Verdict::Permanent => Outcome::Failed,
            Verdict::Gone => {
                out.push(Action::Disable);
                Outcome::Retry(now)
            }
            Verdict::Retry { retry_after } => {
                let attempts = u32::try_from(claimed.attempts + 1).unwrap_or(u32::MAX);
                let age = Duration::from_millis(u64::try_from(now - claimed.created_at).unwrap_or(0));
                after_failure(&self.settings.retry, attempts, age, now, retry_after)
            }
        }
    }

    /// The stop, from where it stands.
    fn stop(&mut self, stopping: Stopping, now: Now, out: &mut Vec<Action>) {
        match stopping {
            Stopping::Withdraw => {
                // Heads a commit claimed for us meanwhile go out within the shutdown grace rather
                // than stay leased.
                self.stopping = Some(Stopping::Record);
                if self.standing.is_some() {
                    self.op = Some(Op::Withdraw);
                    out.push(Action::Withdraw);
                    return;
                }
                self.stop(Stopping::Record, now, out)
            }
            Stopping::Record => {
                self.stopping = Some(Stopping::Wait(None));
                if !self.unrecorded.is_empty() {
                    self.op = Some(Op::Record);
                    out.push(Action::Record(self.unrecorded.clone()));
                    return;
                }
                self.stop(Stopping::Wait(None), now, out)
            }
            Stopping::Wait(_) if self.in_flight == 0 => {
                self.stopping = Some(Stopping::Finish);
                self.stop(Stopping::Finish, now, out)
            }
            Stopping::Wait(deadline) => {
                let deadline = deadline.unwrap_or_else(|| {
                    let name = &self.settings.name;
                    info!(webhook = %name, in_flight = self.in_flight, "waiting for attempts in flight");
                    now.at + self.settings.shutdown_grace
                });
                self.stopping = Some(Stopping::Wait(Some(deadline)));
                if self.in_flight > 0 && now.at < deadline {
                    return self.sleep_until(deadline, out);
                }
                if self.in_flight > 0 {
                    let name = &self.settings.name;
                    warn!(webhook = %name, abandoned = self.in_flight, "shutdown grace over; unfinished deliveries stay pending");
                    self.in_flight = 0;
                    out.push(Action::Abort);
                }
                self.stopping = Some(Stopping::Finish);
                self.stop(Stopping::Finish, now, out)
            }
            Stopping::Finish if !self.finished.is_empty() => self.round(now, out),
            Stopping::Finish => self.stopped(out),
        }
    }

    /// The end: warns about outcomes the database never took.
    fn stopped(&mut self, out: &mut Vec<Action>) {
        self.stopped = true;
        if !self.unrecorded.is_empty() {
            let (name, n) = (&self.settings.name, self.unrecorded.len());
            if self.backoff.fenced {
                // A deposed leader: the next one sends them again, as it would after a crash.
                info!(webhook = %name, attempts = n, "standing down with attempts this term could not record; the next leader sends those deliveries again (same webhook-id)");
            } else {
                warn!(webhook = %name, attempts = n, "stopping with attempts the database did not take; those deliveries are sent again after the restart (same webhook-id)");
            }
        }
        out.push(Action::Stopped);
    }
}

/// The time from `now` until `at` (both Unix ms); zero when it passed.
fn until(at: i64, now: i64) -> Duration {
    Duration::from_millis(u64::try_from(at - now).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use backon::ExponentialBuilder;
    use tokio::time::Instant;

    use super::{Action, Dispatch, Event, Finished, Now, Settings, power_of_two_within};
    use crate::config::RetryConfig;
    use crate::model::ServiceKey;
    use crate::relay::policy::Verdict;
    use crate::relay::sender::{AttemptResult, failure};
    use crate::store::{AttemptRecord, Claimed, Heads, Outcome, StoreError};

    /// The poll interval and the group-commit interval of these tests.
    const POLL: Duration = Duration::from_secs(1);
    const INTERVAL: Duration = Duration::from_millis(15);

    /// Time as the tests move it: `at` and `ms` advance together from their start.
    struct Clock {
        start: Instant,
        start_ms: i64,
        elapsed: Duration,
        leading: bool,
    }

    impl Clock {
        fn new() -> Self {
            Self { start: Instant::now(), start_ms: 1_000_000, elapsed: Duration::ZERO, leading: true }
        }

        fn now(&self) -> Now {
            let ms = self.start_ms + i64::try_from(self.elapsed.as_millis()).unwrap();
            Now { ms, at: self.start + self.elapsed, interval: INTERVAL, leading: self.leading }
        }

        fn advance(&mut self, by: Duration) {
            self.elapsed += by;
        }

        /// Advances to `at`, when it is later.
        fn advance_to(&mut self, at: Instant) {
            self.elapsed = self.elapsed.max(at - self.start);
        }
    }

    fn machine(concurrency: usize, circuit_failures: u32) -> (Dispatch, Clock) {
        let clock = Clock::new();
        let write_backoff = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(100))
            .with_max_delay(Duration::from_secs(5))
            .without_max_times();
        let settings = Settings {
            name: "w".into(),
            url: "http://receiver.invalid/".into(),
            concurrency,
            shutdown_grace: Duration::from_secs(5),
            poll_interval: POLL,
            retry: RetryConfig::default(),
            circuit_failures,
            write_backoff,
            assigns: false,
        };
        (Dispatch::new(settings, clock.now().at), clock)
    }

    fn head(id: i64, clock: &Clock) -> Claimed {
        let now = clock.now().ms;
        Claimed {
            id,
            key: ServiceKey::new("ns", format!("s{id}")),
            kind: "MODIFIED".into(),
            msg_id: format!("msg_{id}"),
            payload: "{}".into(),
            attempts: 0,
            created_at: now,
            event_id: Some(id),
            claimed_until: now + 60_000,
        }
    }

    fn delivered() -> AttemptResult {
        let record = AttemptRecord { status_code: Some(204), duration_ms: 1, ..AttemptRecord::default() };
        AttemptResult { record, verdict: Verdict::Success, body: Vec::new(), told: None }
    }

    fn refused() -> AttemptResult {
        failure("connect", "connection refused".into())
    }

    fn heads(claimed: Vec<Claimed>, through: Option<i64>) -> Heads {
        Heads { claimed, through }
    }

    /// Each action in a few words, the times relative to the clock's start, for exact assertions.
    fn brief(actions: &[Action], clock: &Clock) -> Vec<String> {
        let ids = |c: &[Claimed]| c.iter().map(|c| c.id).collect::<Vec<_>>();
        let done = |d: &[crate::store::Completion]| {
            d.iter()
                .map(|c| {
                    let outcome = match c.outcome {
                        Outcome::Succeeded => "ok",
                        Outcome::Retry(_) => "retry",
                        Outcome::Failed => "failed",
                    };
                    format!("{}:{outcome}", c.delivery_id)
                })
                .collect::<Vec<_>>()
                .join(",")
        };
        actions
            .iter()
            .map(|a| match a {
                Action::ReadDisabled => "ReadDisabled".into(),
                Action::Claim { limit } => format!("Claim {limit}"),
                Action::Round { done: d, claim } => format!("Round [{}] claim {claim}", done(d)),
                Action::Record(d) => format!("Record [{}]", done(d)),
                Action::Offer { limit } => format!("Offer {limit}"),
                Action::Amend { limit, hurry } => format!("Amend {limit}{}", if *hurry { " hurry" } else { "" }),
                Action::Withdraw => "Withdraw".into(),
                Action::Send(c) => format!("Send {:?}", ids(c)),
                Action::NextDue => "NextDue".into(),
                Action::SleepUntil(at) => format!("SleepUntil {}ms", (*at - clock.start).as_millis()),
                Action::Publish(view, transition) => format!("Publish {} {transition:?}", view.state.as_str()),
                Action::Observe(o) => format!("Observe {}", o.delivery),
                Action::Throttled { .. } => "Throttled".into(),
                Action::Failing { .. } => "Failing".into(),
                Action::Disable => "Disable".into(),
                Action::Assign(c, _) => format!("Assign {}", c.id),
                Action::Acked => "Acked".into(),
                Action::CatchUp { .. } => "CatchUp".into(),
                Action::Abort => "Abort".into(),
                Action::Stopped => "Stopped".into(),
            })
            .collect()
    }

    /// Steps `m` with `event` at the clock's time; the actions, in brief.
    fn on(m: &mut Dispatch, clock: &Clock, event: Event) -> Vec<String> {
        let actions = m.on(event, clock.now());
        brief(&actions, clock)
    }

    /// Starts `m` and brings it to rest with an empty queue and a standing claim for every slot
    /// (`concurrency` a power of two): the first claim finds nothing, the next due time is unknown.
    fn idle(m: &mut Dispatch, clock: &mut Clock, concurrency: usize) {
        assert_eq!(on(m, clock, Event::Start), ["Publish closed None", "ReadDisabled"]);
        assert_eq!(on(m, clock, Event::Disabled(false)), ["SleepUntil 15ms"], "the first claim is spaced too");
        clock.advance(INTERVAL);
        assert_eq!(on(m, clock, Event::Timer), [format!("Claim {concurrency}")]);
        assert_eq!(on(m, clock, Event::Claimed(Ok(Vec::new()))), ["NextDue"]);
        let offer = format!("Offer {concurrency}");
        assert_eq!(on(m, clock, Event::NextDue(None)), ["SleepUntil 1015ms", offer.as_str()]);
    }

    /// A receiver that says it takes more at once has the new free slots claimed at once; a lower number stops claiming until the attempts in flight are
    /// below it; the same number again changes nothing.
    #[test]
    fn a_receiver_that_takes_more_at_once_gets_the_new_slots_filled_at_once() {
        let (mut m, mut clock) = machine(4, 0);
        idle(&mut m, &mut clock, 4);
        clock.advance(Duration::from_millis(100));
        let four = (1..=4).map(|i| head(i, &clock)).collect();
        let answered = on(&mut m, &clock, Event::Answered(Some(heads(four, Some(10)))));
        assert_eq!(answered, ["Publish closed None", "Send [1, 2, 3, 4]", "SleepUntil 1115ms"]);

        assert_eq!(on(&mut m, &clock, Event::Concurrency(16)), ["Claim 8"], "12 free: 8, a power of two");
        let eight = (5..=12).map(|i| head(i, &clock)).collect();
        let sent = on(&mut m, &clock, Event::Claimed(Ok(eight)));
        assert_eq!(sent, ["Publish closed None", "Send [5, 6, 7, 8, 9, 10, 11, 12]"], "the timer stands");
        assert_eq!(on(&mut m, &clock, Event::Concurrency(16)), Vec::<String>::new(), "the same number");

        assert_eq!(on(&mut m, &clock, Event::Concurrency(4)), Vec::<String>::new(), "12 in flight, 4 allowed");
        let done: Vec<_> = (1..=10).map(|i| Finished::Done(head(i, &clock), delivered())).collect();
        clock.advance(INTERVAL);
        let round = on(&mut m, &clock, Event::Finished(done));
        assert_eq!(
            round.last().map(String::as_str),
            Some("Round [1:ok,2:ok,3:ok,4:ok,5:ok,6:ok,7:ok,8:ok,9:ok,10:ok] claim 2"),
            "2 in flight, 2 free"
        );
    }

    /// A commit whose deliveries the standing claim took (its answer comes first) claims nothing
    /// when it wakes the dispatcher; a later commit the claim did not see hurries the claim standing
    /// for the free slots rather than claiming beside it (one claim at a time).
    #[test]
    fn a_commit_wake_up_while_a_claim_stands_hurries_it_unless_the_claim_saw_that_commit() {
        let (mut m, mut clock) = machine(4, 0);
        idle(&mut m, &mut clock, 4);

        clock.advance(Duration::from_millis(100));
        let answered = Event::Answered(Some(heads(vec![head(1, &clock)], Some(10))));
        assert_eq!(on(&mut m, &clock, answered), ["Publish closed None", "Send [1]", "SleepUntil 1115ms", "Offer 2"]);
        assert_eq!(on(&mut m, &clock, Event::Commit(10)), Vec::<String>::new(), "the commit the claim ran in");

        clock.advance(Duration::from_millis(1));
        assert_eq!(on(&mut m, &clock, Event::Commit(12)), ["Amend 2 hurry", "SleepUntil 1116ms"]);
        let spaced = on(&mut m, &clock, Event::Commit(13));
        assert_eq!(spaced, ["SleepUntil 131ms"], "spaced from the last claim; the claim is hurried already");
        let answered = Event::Answered(Some(heads(vec![head(2, &clock)], Some(13))));
        let sent = on(&mut m, &clock, answered);
        assert_eq!(
            sent,
            ["Publish closed None", "Send [2]", "SleepUntil 1116ms", "Offer 2"],
            "claimed: no spacing wait"
        );
    }

    /// A round the database refuses keeps its outcomes in memory: nothing else is written or claimed
    /// while it backs off, and then those same outcomes are recorded first (a success is never sent
    /// again because recording it failed), before the next claim.
    #[test]
    fn a_round_the_database_refuses_is_kept_in_memory_and_recorded_before_any_claim() {
        let (mut m, mut clock) = machine(4, 0);
        idle(&mut m, &mut clock, 4);
        let answered = Event::Answered(Some(heads(vec![head(1, &clock)], Some(10))));
        assert_eq!(on(&mut m, &clock, answered), ["Publish closed None", "Send [1]", "Offer 2"]);

        clock.advance(INTERVAL);
        let finished = Event::Finished(vec![Finished::Done(head(1, &clock), delivered())]);
        assert_eq!(on(&mut m, &clock, finished), ["Withdraw"], "the claim standing goes first");
        assert_eq!(
            on(&mut m, &clock, Event::Withdrawn(None)),
            ["Observe 1", "Publish closed None", "Round [1:ok] claim 4"]
        );
        let refused = Event::Rounded(Err(StoreError::Sqlx(sqlx::Error::PoolTimedOut)));
        assert_eq!(on(&mut m, &clock, refused), ["SleepUntil 130ms"], "backed off 100 ms; no claim stands");
        assert!(!m.listens(clock.now().at), "commits do not wake it while backed off");

        clock.advance(Duration::from_millis(100));
        assert_eq!(on(&mut m, &clock, Event::Timer), ["Record [1:ok]"]);
        assert_eq!(on(&mut m, &clock, Event::Recorded(Ok(()))), ["Acked", "Claim 4"]);
    }

    /// With the circuit open nothing is claimed until the next probe is due; then one head is
    /// claimed and sent alone; its success closes the circuit, the round claims for every slot, and
    /// every waiting delivery is made due.
    #[test]
    fn an_open_circuit_sends_one_probe_and_its_success_makes_waiting_deliveries_due() {
        let (mut m, mut clock) = machine(4, 1);
        idle(&mut m, &mut clock, 4);
        let answered = Event::Answered(Some(heads(vec![head(1, &clock)], Some(10))));
        on(&mut m, &clock, answered);
        clock.advance(INTERVAL);
        assert_eq!(on(&mut m, &clock, Event::Finished(vec![Finished::Done(head(1, &clock), refused())])), ["Withdraw"]);
        let actions = m.on(Event::Withdrawn(None), clock.now());
        let probe_at = actions
            .iter()
            .find_map(|a| match a {
                Action::Publish(view, Some(super::Transition::Opened)) => view.next_probe_at,
                _ => None,
            })
            .expect("the circuit opened");
        assert_eq!(
            brief(&actions, &clock),
            ["Observe 1", "Publish open Some(Opened)", "Failing", "Round [1:retry] claim 0"],
            "no claim while open"
        );
        let rounded = on(&mut m, &clock, Event::Rounded(Ok(Heads::default())));
        assert_eq!(rounded, ["SleepUntil 45ms"], "the next claim is spaced from the round");
        clock.advance(INTERVAL);
        let wait = Duration::from_millis(u64::try_from(probe_at - clock.now().ms).unwrap()).min(POLL);
        let sleep = format!("SleepUntil {}ms", (clock.now().at + wait - clock.start).as_millis());
        assert_eq!(on(&mut m, &clock, Event::Timer), [sleep], "until the probe, no claim and no claim standing");

        clock.advance_to(clock.start + Duration::from_millis(u64::try_from(probe_at - clock.start_ms).unwrap()));
        assert_eq!(on(&mut m, &clock, Event::Timer), ["Claim 1"], "one probe");
        let probe = head(2, &clock);
        let sent = on(&mut m, &clock, Event::Claimed(Ok(vec![probe.clone()])));
        assert_eq!(sent[..2], ["Publish half_open Some(Probing)", "Send [2]"]);
        assert!(!sent.iter().any(|a| a.starts_with("Offer") || a.starts_with("Claim")), "{sent:?}");

        clock.advance(Duration::from_millis(20));
        let finished = on(&mut m, &clock, Event::Finished(vec![Finished::Done(probe, delivered())]));
        assert_eq!(finished, ["Observe 2", "Publish closed Some(Closed)", "Round [2:ok] claim 4"]);
        let rounded = on(&mut m, &clock, Event::Rounded(Ok(heads(vec![head(3, &clock)], None))));
        assert_eq!(rounded, ["Acked", "Publish closed None", "Send [3]", "CatchUp"]);
    }

    /// An answer to a catch-up probe while the circuit is open brings its next probe forward: the
    /// waiting deliveries are made due and one is claimed as the probe at once, not at the next
    /// backoff step. An answer while the circuit is closed, or while the probe is out, changes
    /// nothing (no store read, no timer).
    #[test]
    fn an_answer_to_a_catch_up_probe_while_the_circuit_is_open_probes_at_once() {
        let (mut m, mut clock) = machine(4, 1);
        idle(&mut m, &mut clock, 4);
        assert_eq!(on(&mut m, &clock, Event::Reachable), Vec::<String>::new(), "closed: nothing to bring forward");

        let answered = Event::Answered(Some(heads(vec![head(1, &clock)], Some(10))));
        on(&mut m, &clock, answered);
        clock.advance(INTERVAL);
        assert_eq!(on(&mut m, &clock, Event::Finished(vec![Finished::Done(head(1, &clock), refused())])), ["Withdraw"]);
        let opened_at = clock.now().ms;
        let opened = on(&mut m, &clock, Event::Withdrawn(None));
        assert_eq!(opened, ["Observe 1", "Publish open Some(Opened)", "Failing", "Round [1:retry] claim 0"]);
        assert_eq!(on(&mut m, &clock, Event::Rounded(Ok(Heads::default()))), ["SleepUntil 45ms"]);
        clock.advance(INTERVAL);
        let probe_at = m.circuit.view().next_probe_at.expect("open: a probe is scheduled");
        assert!(probe_at - opened_at >= 1_000, "the first backoff step, 1 s or more: {}", probe_at - opened_at);
        let wait = Duration::from_millis(u64::try_from(probe_at - clock.now().ms).unwrap()).min(POLL);
        let sleep = format!("SleepUntil {}ms", (clock.now().at + wait - clock.start).as_millis());
        assert_eq!(on(&mut m, &clock, Event::Timer), [sleep], "until the probe (at most the poll), no claim");

        clock.advance(Duration::from_millis(55));
        let now_ms = clock.now().ms;
        assert_eq!(on(&mut m, &clock, Event::Reachable), ["Publish open None", "CatchUp"]);
        assert_eq!(m.circuit.view().next_probe_at, Some(now_ms), "the probe is due now");
        assert_eq!(on(&mut m, &clock, Event::CaughtUp), ["Claim 1"], "one probe, at once");
        let probe = head(2, &clock);
        let sent = on(&mut m, &clock, Event::Claimed(Ok(vec![probe.clone()])));
        assert_eq!(sent[..2], ["Publish half_open Some(Probing)", "Send [2]"]);
        assert_eq!(on(&mut m, &clock, Event::Reachable), Vec::<String>::new(), "half-open: the probe is out");

        clock.advance(Duration::from_millis(20));
        let finished = on(&mut m, &clock, Event::Finished(vec![Finished::Done(probe, delivered())]));
        assert_eq!(finished, ["Observe 2", "Publish closed Some(Closed)", "Round [2:ok] claim 4"]);
    }

    /// Once this replica's term is over no attempt starts (the heads stay leased until the next
    /// leader claims them again), an attempt abandoned then is not recorded, and the stop takes the
    /// standing claim back and ends with nothing to record.
    #[test]
    fn no_attempt_starts_once_the_term_is_over_and_an_abandoned_one_is_not_recorded() {
        let (mut m, mut clock) = machine(4, 0);
        idle(&mut m, &mut clock, 4);
        let answered = Event::Answered(Some(heads(vec![head(1, &clock)], Some(10))));
        assert_eq!(on(&mut m, &clock, answered), ["Publish closed None", "Send [1]", "Offer 2"]);

        clock.leading = false;
        clock.advance(Duration::from_millis(5));
        let answered = Event::Answered(Some(heads(vec![head(2, &clock)], Some(11))));
        let out = on(&mut m, &clock, answered);
        assert_eq!(out, ["Publish closed None", "SleepUntil 1020ms", "Offer 2"], "no Send");
        assert_eq!(on(&mut m, &clock, Event::Finished(vec![Finished::Abandoned])), ["NextDue"], "nothing to record");
        assert_eq!(on(&mut m, &clock, Event::NextDue(None)), ["Amend 4"], "no round, no record");

        assert_eq!(on(&mut m, &clock, Event::Stop), ["Withdraw"]);
        assert_eq!(on(&mut m, &clock, Event::Withdrawn(None)), ["Stopped"]);
    }

    #[test]
    fn a_claim_takes_the_largest_power_of_two_within_the_free_slots() {
        let claims: Vec<usize> = [0, 1, 2, 3, 16, 17, 31, 32, 4096].into_iter().map(power_of_two_within).collect();
        assert_eq!(claims, [0, 1, 2, 2, 16, 16, 16, 32, 4096]);
    }
}
