//! The owner of the write connection: one task takes every write of this process, as typed commands
//! over a channel, and runs whatever waits in ONE transaction (group commit by construction).
//!
//! # Commands
//!
//! - **Record** a prepared chunk of the watch ([`Store::write`]): events, state rows, deliveries.
//! - **Round** of the relay ([`Store::complete_and_claim`], [`Store::complete`], [`Store::claim`]):
//!   record finished attempts, then claim up to N due queue heads of one endpoint.
//! - **Offer** a standing claim ([`Store::offer_claim`]): claim up to N heads after the inserts of the
//!   next transaction that records a chunk of the watch, so the deliveries of a commit come back with
//!   the commit itself. It never starts a transaction by itself; [`StandingClaim::hurry`] makes it run
//!   in the next one, with a new limit, [`StandingClaim::amend`] only changes the limit, and
//!   [`StandingClaim::withdraw`] takes it back.
//! - **Expect** a Record ([`Store::expect_record`]): the watch's writer holds changes it will record by
//!   a due time (its group-commit interval, see [`Pacing`]).
//! - **Write**: any other write (the publisher's rows, the API's writes, pruning, the `/readyz`
//!   probe, a resync) as a boxed job on the transaction ([`Store::transact`]); and **Read**: the two
//!   reads that must see the write connection ([`Store::next_event_id`], [`Store::write_generation`]),
//!   run between transactions.
//!
//! # One transaction for what waits
//!
//! The owner takes every command already sent, then starts a transaction when [`start`] says so:
//! at once for a Record, a Write or a hurried claim; for Rounds, at once too, unless the watch's
//! writer said it will record soon: then they wait for that Record (at most its due time plus its
//! group-commit interval), so a relay round and the commit it would otherwise follow become one
//! transaction. Offers wait for a Record.
//!
//! A transaction runs Records first, then Writes, then Rounds, then standing claims (so a claim sees
//! the deliveries the same transaction enqueued, and a finished head lets the next one of its Service
//! be claimed). With more than one command, each runs inside a savepoint of its own: one that fails
//! (a round whose attempt names a delivery that is gone: a foreign-key error) is rolled back alone
//! and its sender gets its error, while the others commit. When SQLite rolls the whole transaction
//! back (a full disk, an I/O error: the savepoint is gone too), or the commit fails, every command of
//! it fails, and each sender retries as it always does. A claim whose sender went away (its task
//! ended) claims nothing. Each transaction holds commands of one fence only (a leader's store and
//! the follower's API store share the connection, [`Store::fenced`]).
//!
//! Answers go out once the transaction ended: standing claims and rounds before the Record, so a
//! relay woken by the commit the Record's writer then announces already holds what its standing claim
//! took, and knows that a claim still standing missed that commit.
//!
//! The owner also keeps the write health ([`super::health`]): a failed transaction closes the
//! connection (the next one opens a new one), and its error is recorded once.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use super::db::{Backend, Exec, Pools};
use super::deliveries::record_attempts;
use super::health::Health;
use super::lease::Fencing;
use super::script::{Script, Stmt};
use super::state::{Prepared, record_chunk};
use super::{Claimed, Completion, Outcome, Store, StoreError, now_ms};

/// What a claim took.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Heads {
    /// The heads claimed, by id (leased: start them).
    pub claimed: Vec<Claimed>,
    /// The highest event id the transaction that ran the claim recorded, after which the claim ran
    /// (`None`: it recorded no event). The relay need not claim again when woken for that commit.
    pub through: Option<i64>,
}

/// What recording a chunk did ([`Store::record`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// The event ids, ascending.
    pub ids: Vec<i64>,
    /// Whether its transaction carried other writes, or others waited for the connection when it
    /// ended: the watch's writer then keeps its transactions small.
    pub shared: bool,
}

/// A claim of up to `limit` due heads of endpoint `webhook`, leased for `lease_ms` from `at` or
/// from when it runs, if later.
#[derive(Debug, Clone)]
struct ClaimSpec {
    webhook: String,
    at: i64,
    lease_ms: i64,
    limit: usize,
}

/// A statement job on the owner's transaction, returning `T` once committed.
pub(super) type Job<T> = Box<dyn for<'a, 'c> FnOnce(&'a mut Script<'c>) -> BoxFuture<'a, Result<T, StoreError>> + Send>;

/// `f` as a [`Job`] (the closure's signature, a future borrowing the script, is taken from here).
pub(super) fn job<T, F>(f: F) -> Job<T>
where
    F: for<'a, 'c> FnOnce(&'a mut Script<'c>) -> BoxFuture<'a, Result<T, StoreError>> + Send + 'static,
{
    Box::new(f)
}

/// `f` as a [`ReadJob`].
pub(super) fn read_job<T, F>(f: F) -> ReadJob<T>
where
    F: for<'c> FnOnce(Backend, Exec<'c>) -> BoxFuture<'c, Result<T, StoreError>> + Send + 'static,
{
    Box::new(f)
}

/// A read job on the write connection, outside any transaction.
pub(super) type ReadJob<T> = Box<dyn for<'c> FnOnce(Backend, Exec<'c>) -> BoxFuture<'c, Result<T, StoreError>> + Send>;

/// A write of any kind, typed by the job that made it.
trait Work: Send {
    /// Runs its statements in the transaction.
    fn run<'a, 'c>(&'a mut self, s: &'a mut Script<'c>) -> BoxFuture<'a, Result<(), StoreError>>;
    /// The transaction committed (`Ok`) or this write failed.
    fn answer(self: Box<Self>, outcome: Result<(), StoreError>);
}

struct Typed<T> {
    job: Option<Job<T>>,
    out: Option<T>,
    reply: oneshot::Sender<Result<T, StoreError>>,
}

impl<T: Send + 'static> Work for Typed<T> {
    fn run<'a, 'c>(&'a mut self, s: &'a mut Script<'c>) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            if let Some(job) = self.job.take() {
                self.out = Some(job(s).await?);
            }
            Ok(())
        })
    }

    fn answer(self: Box<Self>, outcome: Result<(), StoreError>) {
        let Typed { out, reply, .. } = *self;
        let _ = reply.send(outcome.and_then(|()| out.ok_or_else(gone)));
    }
}

/// A read on the write connection, typed by its job.
trait ReadWork: Send {
    fn run<'c>(self: Box<Self>, backend: Backend, conn: Result<Exec<'c>, StoreError>) -> BoxFuture<'c, ()>;
}

struct TypedRead<T> {
    job: ReadJob<T>,
    reply: oneshot::Sender<Result<T, StoreError>>,
}

impl<T: Send + 'static> ReadWork for TypedRead<T> {
    fn run<'c>(self: Box<Self>, backend: Backend, conn: Result<Exec<'c>, StoreError>) -> BoxFuture<'c, ()> {
        Box::pin(async move {
            let out = match conn {
                Ok(exec) => (self.job)(backend, exec).await,
                Err(e) => Err(e),
            };
            let _ = self.reply.send(out);
        })
    }
}

/// The watch's writer will record a chunk by `due` ([`Store::expect_record`]); rounds wait for it
/// until `due + patience` at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Expected {
    due: Instant,
    patience: Duration,
}

/// A command to the owner.
enum Command {
    Record { chunk: Prepared, fence: Fence, reply: oneshot::Sender<(Result<Recorded, StoreError>, Prepared)> },
    Round { round: Round, fence: Fence, urgent: bool },
    Offer { id: u64, claim: ClaimSpec, fence: Fence, reply: oneshot::Sender<Option<Heads>> },
    Amend { id: u64, limit: usize, hurry: bool },
    Withdraw { id: u64 },
    Expect(Option<Expected>),
    Write { work: Box<dyn Work>, fence: Fence, counts: bool },
    Read(Box<dyn ReadWork>),
}

/// The fence a command's transaction must pass (`None`: the order lock only, on PostgreSQL).
type Fence = Option<Arc<Fencing>>;

fn same_fence(a: &Fence, b: &Fence) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        (None, None) => true,
        _ => false,
    }
}

/// A relay round: attempts to record, then a claim.
struct Round {
    done: Vec<Completion>,
    claim: Option<ClaimSpec>,
    /// The configured group-commit interval of the store that sent it ([`backlogged`]).
    interval: Duration,
    reply: oneshot::Sender<Result<Heads, StoreError>>,
}

/// A standing claim, kept until a Record's transaction (or a hurry) runs it.
struct Offer {
    id: u64,
    claim: ClaimSpec,
    fence: Fence,
    hurried: bool,
    reply: oneshot::Sender<Option<Heads>>,
}

/// When the owner starts its next transaction ([`start`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Start {
    /// Now.
    Now,
    /// At this time, unless a command that starts one at once comes first.
    At(Instant),
    /// When a command comes that starts one.
    Idle,
}

/// When to start the next transaction, from what waits: `urgent` (a Record, a Write or a hurried
/// claim: at once), `rounds` (relay rounds: at once, or, while the watch's writer said it will record
/// by `expected.due`, with that Record, waiting until `due + patience` at most), nothing else (standing
/// claims wait for a Record): idle.
pub(super) fn start(urgent: bool, rounds: bool, expected: Option<(Instant, Duration)>, now: Instant) -> Start {
    if urgent {
        return Start::Now;
    }
    if !rounds {
        return Start::Idle;
    }
    match expected {
        Some((due, patience)) if now < due + patience => Start::At(due + patience),
        _ => Start::Now,
    }
}

pub use crate::config::DEFAULT_COMMIT_INTERVAL;

/// The group-commit interval while the relay is backlogged ([`Pacing::interval`]): at most this, or
/// `database.commit_interval` when that is shorter.
///
/// A delivery holds its slot from its claim until the round that records its outcome and claims
/// the next head, and rounds share the watch's commits, so while every slot is busy an endpoint
/// delivers about `relay.concurrency` per interval or two. When many Services change at a high rate,
/// that is the bound, and a 5 ms interval delivers far more per second, at a much lower latency,
/// than 15 ms. But a fixed shorter interval costs CPU at a steady rate
/// ([`DEFAULT_COMMIT_INTERVAL`]; see docs/explanation/design-decisions.md). So the interval is short
/// only while the relay's rounds show that it is the bound ([`backlogged`]): at a steady rate each
/// claim finds fewer heads than it asks for.
pub const BACKLOG_COMMIT_INTERVAL: Duration = Duration::from_millis(5);

/// How long one round that [`backlogged`] counts keeps the relay marked backlogged: several rounds,
/// so that the mark holds while such rounds keep coming, and runs out soon after they stop.
const BACKLOG_HOLD: Duration = Duration::from_millis(100);

/// The fewest heads a round must ask for, and get, to count as backlogged ([`backlogged`]). A claim
/// asks for a power of two of the free slots, at least half of them (the relay's dispatcher): an
/// endpoint with `concurrency` of 8 or more asks for 8 or more when busy, while a probe of an open
/// circuit, or an endpoint held to 1–4 in flight (an appliance API with a rate limit), asks for so few
/// that a trickle of changes fills every claim.
const BACKLOG_MIN_CLAIM: usize = 8;

/// Whether a relay round shows that the group-commit interval bounds its endpoint's deliveries: it
/// asked for at least [`BACKLOG_MIN_CLAIM`] heads and got them all (more are likely waiting), at
/// least one of the attempts it recorded succeeded, and all of them, failed ones included, took
/// less than `interval` on average (the slots turn over faster than the rounds come: a slower
/// receiver, answering or timing out, is its own bound, and a shorter interval would only cost CPU).
pub(super) fn backlogged(asked: usize, got: usize, done: &[Completion], interval: Duration) -> bool {
    if asked < BACKLOG_MIN_CLAIM || got < asked || !done.iter().any(|c| c.outcome == Outcome::Succeeded) {
        return false;
    }
    let total = done.iter().fold(0i64, |sum, c| sum.saturating_add(c.attempt.duration_ms));
    let limit = i64::try_from(interval.as_millis()).unwrap_or(i64::MAX);
    let count = i64::try_from(done.len()).unwrap_or(i64::MAX);
    total < limit.saturating_mul(count)
}

/// The watch's group-commit pacing: the least time between the starts of two of its commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pacing {
    /// `database.commit_interval`.
    pub configured: Duration,
    /// Until when the relay counts as backlogged (a round within the last 100 ms showed the interval
    /// to be its bound: [`backlogged`]).
    pub backlogged_until: Option<Instant>,
}

impl Pacing {
    /// The interval at `now`: the configured one, or at most [`BACKLOG_COMMIT_INTERVAL`] while the
    /// relay is backlogged.
    pub fn interval(&self, now: Instant) -> Duration {
        match self.backlogged_until {
            Some(until) if until > now => self.configured.min(BACKLOG_COMMIT_INTERVAL),
            _ => self.configured,
        }
    }

    /// When a commit may start, the last one having started at `last`: `last` plus the interval at
    /// `now`.
    pub fn due(&self, last: Instant, now: Instant) -> Instant {
        last + self.interval(now)
    }
}

/// The store's side of the owner: where commands go. Cheap to clone.
#[derive(Debug, Clone)]
pub(super) struct Handle {
    commands: mpsc::UnboundedSender<Command>,
    backlogged_until: watch::Receiver<Option<Instant>>,
    offers: Arc<AtomicU64>,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self {
            Self::Record { .. } => "Record",
            Self::Round { .. } => "Round",
            Self::Offer { .. } => "Offer",
            Self::Amend { .. } => "Amend",
            Self::Withdraw { .. } => "Withdraw",
            Self::Expect(_) => "Expect",
            Self::Write { .. } => "Write",
            Self::Read(_) => "Read",
        };
        f.write_str(name)
    }
}

/// The error of a write the owner never answered: it is gone (the runtime that ran it shut down).
fn gone() -> StoreError {
    StoreError::Sqlx(sqlx::Error::PoolClosed)
}

/// Starts the owner of `pools`' write connection on the current tokio runtime. It ends when every
/// [`Handle`] is dropped.
pub(super) fn spawn(backend: Backend, pools: Pools, health: Arc<Health>) -> Handle {
    let (commands, rx) = mpsc::unbounded_channel();
    let (backlog, backlogged_until) = watch::channel(None);
    let owner = Owner {
        backend,
        pools,
        health,
        rx,
        backlog,
        queue: VecDeque::new(),
        offers: Vec::new(),
        reads: Vec::new(),
        expected: None,
    };
    tokio::spawn(owner.run());
    Handle { commands, backlogged_until, offers: Arc::new(AtomicU64::new(0)) }
}

/// The owner task's state.
struct Owner {
    backend: Backend,
    pools: Pools,
    health: Arc<Health>,
    rx: mpsc::UnboundedReceiver<Command>,
    /// Until when the relay counts as backlogged ([`Pacing`]).
    backlog: watch::Sender<Option<Instant>>,
    /// Records, Rounds and Writes, in the order they came.
    queue: VecDeque<Command>,
    /// Standing claims.
    offers: Vec<Offer>,
    reads: Vec<Box<dyn ReadWork>>,
    expected: Option<Expected>,
}

/// One command of a transaction, with what it did.
enum Entry {
    Record { chunk: Prepared, reply: oneshot::Sender<(Result<Recorded, StoreError>, Prepared)> },
    Round { round: Round, heads: Vec<Claimed> },
    Offer { offer: Offer, heads: Vec<Claimed> },
    Write { work: Box<dyn Work>, counts: bool },
}

impl Entry {
    /// Runs its statements (sent, so that an error is its own), at `now`; `through`: the highest
    /// event id this transaction recorded so far.
    async fn run(&mut self, s: &mut Script<'_>, now: i64) -> Result<(), StoreError> {
        match self {
            Self::Record { chunk, .. } => record_chunk(s, now, chunk).await,
            Self::Round { round, heads } => {
                record_attempts(s, now, &round.done).await?;
                if let Some(c) = &round.claim
                    && !round.reply.is_closed()
                {
                    *heads = claim(s, c).await?;
                }
                s.flush().await
            }
            Self::Offer { offer, heads } => {
                if !offer.reply.is_closed() {
                    *heads = claim(s, &offer.claim).await?;
                }
                s.flush().await
            }
            Self::Write { work, .. } => {
                work.run(s).await?;
                s.flush().await
            }
        }
    }

    /// Whether its outcome says something about the write health (not the `/readyz` probe's, which
    /// its caller records itself).
    fn counts(&self) -> bool {
        !matches!(self, Self::Write { counts: false, .. })
    }

    /// The order of kinds in a transaction: Records, Writes, Rounds, standing claims.
    fn rank(&self) -> u8 {
        match self {
            Self::Record { .. } => 0,
            Self::Write { .. } => 1,
            Self::Round { .. } => 2,
            Self::Offer { .. } => 3,
        }
    }
}

/// Runs claim `c` in `s`'s transaction: the heads it leased.
async fn claim(s: &mut Script<'_>, c: &ClaimSpec) -> Result<Vec<Claimed>, StoreError> {
    if c.limit == 0 {
        return Ok(Vec::new());
    }
    let stmt = super::outbox::claim_stmt(s.backend(), &c.webhook, c.at, c.lease_ms, c.limit);
    Ok(super::outbox::claimed(&s.fetch_all(stmt).await?))
}

/// The error each of `n` commands of a failed transaction gets: `e` itself when alone, else the
/// fence's refusal for each, or `e` shared.
fn shared(e: StoreError, n: usize) -> Vec<StoreError> {
    if n <= 1 {
        return vec![e];
    }
    if let StoreError::Fenced { epoch } = e {
        return (0..n).map(|_| StoreError::Fenced { epoch }).collect();
    }
    let e = Arc::new(e);
    (0..n).map(|_| StoreError::Shared(e.clone())).collect()
}

impl Owner {
    async fn run(mut self) {
        let mut open = true;
        loop {
            while let Ok(command) = self.rx.try_recv() {
                self.accept(command);
            }
            self.read().await;
            let urgent = self.queue.iter().any(|c| !matches!(c, Command::Round { urgent: false, .. }))
                || self.offers.iter().any(|o| o.hurried);
            let rounds = !self.queue.is_empty();
            let expected = self.expected.map(|e| (e.due, e.patience));
            match start(urgent, rounds, expected, Instant::now()) {
                Start::Now => self.transact().await,
                Start::At(at) => {
                    tokio::select! {
                        biased;
                        command = self.rx.recv(), if open => match command {
                            Some(command) => self.accept(command),
                            None => open = false,
                        },
                        () = tokio::time::sleep_until(at) => self.transact().await,
                    }
                }
                Start::Idle if open => match self.rx.recv().await {
                    Some(command) => self.accept(command),
                    None => open = false,
                },
                Start::Idle => return,
            }
        }
    }

    fn accept(&mut self, command: Command) {
        match command {
            Command::Record { .. } => {
                self.expected = None;
                self.queue.push_back(command);
            }
            Command::Round { .. } | Command::Write { .. } => self.queue.push_back(command),
            Command::Offer { id, claim, fence, reply } => {
                self.offers.push(Offer { id, claim, fence, hurried: false, reply });
            }
            Command::Amend { id, limit, hurry } => {
                if let Some(offer) = self.offers.iter_mut().find(|o| o.id == id) {
                    offer.hurried |= hurry;
                    offer.claim.limit = limit;
                    offer.claim.at = now_ms();
                }
            }
            // Dropping its reply answers `None`: nothing claimed.
            Command::Withdraw { id } => self.offers.retain(|o| o.id != id),
            Command::Expect(expected) => self.expected = expected,
            Command::Read(work) => self.reads.push(work),
        }
    }

    /// Runs the reads waiting, each on the write connection.
    async fn read(&mut self) {
        for work in std::mem::take(&mut self.reads) {
            match self.pools.write().await {
                Ok(mut conn) => work.run(self.backend, Ok(conn.exec())).await,
                Err(e) => work.run(self.backend, Err(e.into())).await,
            }
        }
    }

    /// Takes the next transaction's commands out of what waits: those of the first command's fence,
    /// with the standing claims of that fence when one of them records a chunk.
    fn batch(&mut self) -> (Fence, Vec<Entry>) {
        let fence = match self.queue.front() {
            Some(Command::Record { fence, .. } | Command::Round { fence, .. } | Command::Write { fence, .. }) => {
                fence.clone()
            }
            _ => self.offers.iter().find(|o| o.hurried).and_then(|o| o.fence.clone()),
        };
        let mut entries = Vec::new();
        let mut rest = VecDeque::new();
        for command in std::mem::take(&mut self.queue) {
            match command {
                Command::Record { chunk, fence: f, reply } if same_fence(&f, &fence) => {
                    entries.push(Entry::Record { chunk, reply })
                }
                Command::Round { round, fence: f, .. } if same_fence(&f, &fence) => {
                    entries.push(Entry::Round { round, heads: Vec::new() })
                }
                Command::Write { work, fence: f, counts } if same_fence(&f, &fence) => {
                    entries.push(Entry::Write { work, counts })
                }
                other => rest.push_back(other),
            }
        }
        self.queue = rest;
        let records = entries.iter().any(|e| matches!(e, Entry::Record { .. }));
        let (running, kept) = std::mem::take(&mut self.offers)
            .into_iter()
            .partition::<Vec<_>, _>(|o| same_fence(&o.fence, &fence) && (records || o.hurried));
        self.offers = kept;
        entries.extend(running.into_iter().map(|offer| Entry::Offer { offer, heads: Vec::new() }));
        entries.sort_by_key(Entry::rank);
        (fence, entries)
    }

    /// Runs the next transaction and answers its commands.
    async fn transact(&mut self) {
        let (fence, mut entries) = self.batch();
        if entries.is_empty() {
            return;
        }
        let now = now_ms();
        let mut conn = match self.pools.write().await {
            Ok(conn) => conn,
            Err(e) => return self.failed(&fence, entries, e.into()),
        };
        let outcome = run(&mut conn, fence.as_deref(), now, &mut entries).await;
        match outcome {
            Ok(outcomes) => {
                let through = committed_through(&entries, &outcomes);
                let shared = entries.len() > 1 || !self.queue.is_empty();
                self.answer(&fence, entries, outcomes, through, shared);
            }
            Err(e) => {
                conn.close_on_drop();
                self.failed(&fence, entries, e);
            }
        }
    }

    /// The transaction failed as a whole with `e`: recorded once, and every command gets it.
    fn failed(&self, fence: &Fence, entries: Vec<Entry>, e: StoreError) {
        let e = judge(fence, e);
        if entries.iter().any(Entry::counts) {
            self.health.failed(self.backend, &e);
        }
        let errors = shared(e, entries.len());
        for (entry, e) in entries.into_iter().zip(errors) {
            match entry {
                Entry::Record { chunk, reply } => {
                    let _ = reply.send((Err(e), chunk));
                }
                Entry::Round { round, .. } => {
                    let _ = round.reply.send(Err(e));
                }
                Entry::Offer { offer, .. } => {
                    let _ = offer.reply.send(None);
                }
                Entry::Write { work, .. } => work.answer(Err(e)),
            }
        }
    }

    /// The transaction committed: each command gets its own outcome (`Err`: it was rolled back
    /// alone), standing claims and rounds before the Record.
    fn answer(
        &self,
        fence: &Fence,
        entries: Vec<Entry>,
        outcomes: Vec<Result<(), StoreError>>,
        through: Option<i64>,
        shared: bool,
    ) {
        let mut records = Vec::new();
        let mut succeeded = false;
        for (entry, outcome) in entries.into_iter().zip(outcomes) {
            let outcome = outcome.map_err(|e| judge(fence, e));
            match &outcome {
                Ok(()) => succeeded |= entry.counts(),
                Err(e) if entry.counts() => self.health.failed(self.backend, e),
                Err(_) => {}
            }
            match entry {
                Entry::Record { chunk, reply } => records.push((chunk, reply, outcome)),
                Entry::Round { round, heads } => {
                    if outcome.is_ok()
                        && let Some(c) = &round.claim
                        && backlogged(c.limit, heads.len(), &round.done, round.interval)
                    {
                        self.backlog.send_replace(Some(Instant::now() + BACKLOG_HOLD));
                    }
                    let _ = round.reply.send(outcome.map(|()| Heads { claimed: heads, through }));
                }
                Entry::Offer { offer, heads } => {
                    let _ = offer.reply.send(outcome.ok().map(|()| Heads { claimed: heads, through }));
                }
                Entry::Write { work, .. } => work.answer(outcome),
            }
        }
        if succeeded {
            self.health.succeeded();
        }
        for (chunk, reply, outcome) in records {
            let recorded = outcome.map(|()| Recorded { ids: chunk.ids().to_vec(), shared });
            let _ = reply.send((recorded, chunk));
        }
    }
}

/// The highest event id of the Records that committed, if any.
fn committed_through(entries: &[Entry], outcomes: &[Result<(), StoreError>]) -> Option<i64> {
    entries
        .iter()
        .zip(outcomes)
        .filter_map(|(e, o)| match (e, o) {
            (Entry::Record { chunk, .. }, Ok(())) => chunk.ids().last().copied(),
            _ => None,
        })
        .max()
}

/// `e` as the outcome of a write under `fence`: its refusal once the term is over.
fn judge(fence: &Fence, e: StoreError) -> StoreError {
    match fence {
        Some(f) => f.judge(e),
        None => e,
    }
}

/// Runs `entries` in one transaction on `conn` (each in a savepoint of its own when there are
/// several) and commits. Returns each one's outcome; errors: the transaction failed as a whole.
async fn run(
    conn: &mut super::db::Pooled,
    fence: Option<&Fencing>,
    now: i64,
    entries: &mut [Entry],
) -> Result<Vec<Result<(), StoreError>>, StoreError> {
    let alone = entries.len() == 1;
    let mut s = Script::new(begin(conn, fence).await?);
    let mut outcomes = Vec::with_capacity(entries.len());
    for entry in entries.iter_mut() {
        if alone {
            entry.run(&mut s, now).await?;
            outcomes.push(Ok(()));
            continue;
        }
        s.run(Stmt::new("SAVEPOINT entry")).await?;
        match entry.run(&mut s, now).await {
            Ok(()) => {
                s.run(Stmt::new("RELEASE entry")).await?;
                outcomes.push(Ok(()));
            }
            Err(e) => {
                tracing::debug!(error = %e, reason = %e.reason(), "a write rolled back alone; the others of its transaction go on");
                // Rolled back by SQLite with the whole transaction (a full disk): that is the error.
                let undone = async {
                    s.run(Stmt::new("ROLLBACK TO entry")).await?;
                    s.run(Stmt::new("RELEASE entry")).await?;
                    s.flush().await
                };
                if undone.await.is_err() {
                    return Err(e);
                }
                outcomes.push(Err(e));
            }
        }
    }
    s.commit().await?;
    Ok(outcomes)
}

/// Starts a write transaction on `conn`. On PostgreSQL its first statement is the guard: the order
/// lock and, under a leader's `fence`, the fence. Errors: [`StoreError::Fenced`] when the fence
/// finds the lease over (the transaction is rolled back), or at once, before anything is sent, when
/// the term's leader deadline passed (it stopped acting: no write starts, as no webhook attempt does).
async fn begin<'c>(conn: &'c mut super::db::Pooled, fence: Option<&Fencing>) -> Result<super::db::Tx<'c>, StoreError> {
    if let Some(f) = fence.filter(|f| !f.still_leading()) {
        return Err(f.refusal());
    }
    let mut tx = conn.begin().await?;
    if tx.backend() == Backend::Postgres {
        let fenced = super::lease::guard(fence.map(|f| &f.fence)).fetch_optional(tx.exec()).await?.is_none();
        if fenced {
            tx.rollback().await?;
            return Err(fence.map_or(StoreError::Fenced { epoch: 0 }, Fencing::refusal));
        }
    }
    Ok(tx)
}

/// A relay claim waiting for the next transaction that records a chunk of the watch
/// ([`Store::offer_claim`]).
#[derive(Debug)]
pub struct StandingClaim {
    id: u64,
    /// `None` once answered.
    answer: Option<oneshot::Receiver<Option<Heads>>>,
    commands: mpsc::UnboundedSender<Command>,
}

impl StandingClaim {
    /// Resolves once a transaction ran the claim: `Some` with what it took (the heads are leased:
    /// start them) when it committed, `None` when it failed and claimed nothing; never again after
    /// that. Cancel-safe.
    pub async fn answered(&mut self) -> Option<Heads> {
        let answer = self.answer.as_mut()?;
        let heads = answer.await.ok().flatten();
        self.answer = None;
        heads
    }

    /// Whether it was answered ([`StandingClaim::answered`] returned).
    pub fn is_answered(&self) -> bool {
        self.answer.is_none()
    }

    /// Makes the claim run in the next transaction, whatever it records, for up to `limit` heads
    /// (nothing when it ran already: its answer is on the way).
    pub fn hurry(&self, limit: usize) {
        let _ = self.commands.send(Command::Amend { id: self.id, limit, hurry: true });
    }

    /// Changes the claim's limit to `limit` heads; it still waits for a transaction that records a
    /// chunk of the watch (or a hurry). Nothing when it ran already.
    pub fn amend(&self, limit: usize) {
        let _ = self.commands.send(Command::Amend { id: self.id, limit, hurry: false });
    }

    /// Takes the claim back: `None` when no transaction ran it, else what it took (the heads are
    /// leased: start them), unless [`StandingClaim::answered`] returned it already.
    pub async fn withdraw(mut self) -> Option<Heads> {
        let answer = self.answer.take()?;
        let _ = self.commands.send(Command::Withdraw { id: self.id });
        answer.await.ok().flatten()
    }
}

impl Store {
    fn send(&self, command: Command) -> Result<(), StoreError> {
        self.owner.commands.send(command).map_err(|_| gone())
    }

    /// Runs `job` in the write connection's next transaction (with what else waits, in a savepoint
    /// of its own when not alone); sent to the owner at once. Resolves to its output once committed.
    /// Errors: the job's own, or the transaction's ([`StoreError`]); nothing of the job is committed
    /// then.
    pub(super) fn transact<T: Send + 'static>(
        &self,
        job: Job<T>,
    ) -> impl Future<Output = Result<T, StoreError>> + Send + 'static {
        self.write_work(job, true)
    }

    /// [`Store::transact`] for `/readyz`'s probe: its outcome is not recorded in the write health
    /// (its caller does that).
    pub(super) fn transact_probe(&self, job: Job<()>) -> impl Future<Output = Result<(), StoreError>> + Send + 'static {
        self.write_work(job, false)
    }

    fn write_work<T: Send + 'static>(
        &self,
        job: Job<T>,
        counts: bool,
    ) -> impl Future<Output = Result<T, StoreError>> + Send + 'static {
        let (reply, answer) = oneshot::channel();
        let work = Box::new(Typed { job: Some(job), out: None, reply });
        let sent = self.send(Command::Write { work, fence: self.fence.clone(), counts });
        async move {
            sent?;
            answer.await.unwrap_or_else(|_| Err(gone()))
        }
    }

    /// Runs `job` on the write connection between two transactions (a read that must see what this
    /// process wrote, in the order it wrote it).
    pub(super) async fn read_on_writer<T: Send + 'static>(&self, job: ReadJob<T>) -> Result<T, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::Read(Box::new(TypedRead { job, reply })))?;
        answer.await.unwrap_or_else(|_| Err(gone()))
    }

    /// Records `chunk` in the next transaction, before anything else it runs ([`Store::write`]); sent
    /// to the owner at once, so the caller may prepare the next chunk before it awaits the answer.
    /// Resolves to what it recorded and the chunk, given back (to retry it, or once written).
    pub fn record(
        &self,
        chunk: Prepared,
    ) -> impl Future<Output = (Result<Recorded, StoreError>, Prepared)> + Send + 'static {
        let (reply, answer) = oneshot::channel();
        let sent = self.owner.commands.send(Command::Record { chunk, fence: self.fence.clone(), reply });
        let statistics = self.statistics.clone();
        async move {
            match sent {
                Err(mpsc::error::SendError(Command::Record { chunk, .. })) => (Err(gone()), chunk),
                Err(_) => unreachable!("a Record was sent"),
                Ok(()) => {
                    let (recorded, chunk) =
                        answer.await.expect("the owner answers every Record it took, giving the chunk back");
                    if let (Ok(_), Some(statistics)) = (&recorded, statistics) {
                        statistics.wrote((chunk.ids().len() + chunk.deliveries()) as u64);
                    }
                    (recorded, chunk)
                }
            }
        }
    }

    /// Tells the owner that the watch's writer will record a chunk by `due` (`None`: it holds
    /// nothing now): relay rounds sent meanwhile wait for that transaction, until `due` plus the
    /// configured group-commit interval at most, rather than commit alone.
    pub fn expect_record(&self, due: Option<Instant>) {
        let expected = due.map(|due| Expected { due, patience: self.commit_interval });
        let _ = self.send(Command::Expect(expected));
    }

    /// A relay round: records `done`, then claims with `claim = (webhook, now, lease_ms, limit)`.
    /// `urgent`: in a transaction at once; else with the watch's next Record when one is expected.
    /// Sent to the owner at once; resolves to what the claim took.
    pub(super) fn round(
        &self,
        done: Vec<Completion>,
        claim: Option<(&str, i64, i64, usize)>,
        urgent: bool,
    ) -> impl Future<Output = Result<Heads, StoreError>> + Send + 'static {
        let (reply, answer) = oneshot::channel();
        let claim =
            claim.map(|(webhook, at, lease_ms, limit)| ClaimSpec { webhook: webhook.to_owned(), at, lease_ms, limit });
        let round = Round { done, claim, interval: self.commit_interval, reply };
        let sent = self.send(Command::Round { round, fence: self.fence.clone(), urgent });
        async move {
            sent?;
            answer.await.unwrap_or_else(|_| Err(gone()))
        }
    }

    /// Offers a claim of up to `limit` due heads of `webhook`, leased for `lease_ms` from when it
    /// runs, to run after the inserts of the next transaction that records a chunk of the watch:
    /// the relay gets the deliveries of a commit from the commit itself, instead of claiming them in
    /// a transaction of its own once woken by it. See [`StandingClaim`].
    pub fn offer_claim(&self, webhook: &str, lease_ms: i64, limit: usize) -> StandingClaim {
        let id = self.owner.offers.fetch_add(1, Ordering::Relaxed);
        let (reply, answer) = oneshot::channel();
        let claim = ClaimSpec { webhook: webhook.to_owned(), at: 0, lease_ms, limit };
        let _ = self.send(Command::Offer { id, claim, fence: self.fence.clone(), reply });
        StandingClaim { id, answer: Some(answer), commands: self.owner.commands.clone() }
    }

    /// The group-commit pacing now ([`Pacing`]): `database.commit_interval` ([`DEFAULT_COMMIT_INTERVAL`]
    /// unless [`Store::with_commit_interval`] set another), and until when the relay counts as
    /// backlogged.
    pub fn pacing(&self) -> Pacing {
        Pacing { configured: self.commit_interval, backlogged_until: *self.owner.backlogged_until.borrow() }
    }

    /// The group-commit interval now ([`Pacing::interval`]).
    pub fn commit_interval(&self) -> Duration {
        self.pacing().interval(Instant::now())
    }

    /// This store with group-commit interval `interval` (`database.commit_interval`), for the clones
    /// made from it.
    pub fn with_commit_interval(mut self, interval: Duration) -> Self {
        self.commit_interval = interval;
        self
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::time::Instant;

    use super::{BACKLOG_COMMIT_INTERVAL, DEFAULT_COMMIT_INTERVAL, Pacing, Start, backlogged, start};
    use crate::model::{Cause, Recorded, ServiceKey, ServiceView};
    use crate::store::{
        AttemptRecord, Chunk, Completion, NewDelivery, NoOutbox, Outbox, Outcome, Prepared, RecordedEvent, StateChange,
        Store, StoreError, now_ms,
    };

    /// Enqueues a `SYNCED` delivery to endpoint `webhook` on the queue of Service `ns/name`.
    async fn enqueue(store: &Store, webhook: &str, name: &str) {
        let d = NewDelivery {
            webhook: webhook.into(),
            kind: "SYNCED",
            msg_id: crate::store::new_msg_id(),
            payload: "{}".into(),
            coalesce_ms: None,
        };
        store.enqueue_synced(vec![(d, ServiceKey::new("ns", name))]).await.unwrap();
    }

    /// A store on a fresh SQLite file.
    async fn fresh() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("t.db")).await.unwrap();
        (dir, store)
    }

    /// A store on a fresh SQLite file with one delivery of endpoint `w` (Service `ns/a`), claimed
    /// with a lease that is already over; its id.
    async fn one_pending() -> (tempfile::TempDir, Store, i64) {
        let (dir, store) = fresh().await;
        enqueue(&store, "w", "a").await;
        let claimed = store.claim("w", now_ms(), 0, 1).await.unwrap();
        (dir, store, claimed[0].id)
    }

    fn succeeded(delivery_id: i64) -> Completion {
        Completion { delivery_id, attempt: AttemptRecord::default(), outcome: Outcome::Succeeded, told: None }
    }

    /// Routes every event to endpoint `w`.
    struct ToW;

    impl Outbox for ToW {
        fn route(&self, event: RecordedEvent<'_>) -> Vec<NewDelivery> {
            let payload = format!("{{\"event\":{}}}", event.id);
            vec![NewDelivery {
                webhook: "w".into(),
                kind: "DELETED",
                msg_id: crate::store::new_msg_id(),
                payload,
                coalesce_ms: None,
            }]
        }
    }

    /// A chunk of the watch recording a DELETED of Service `ns/<name>` (an event that touches no
    /// state row), prepared with the next free id and routed by `outbox`.
    async fn chunk_of(store: &Store, name: &str, outbox: &dyn Outbox) -> Prepared {
        let k8s = serde_json::json!({"metadata": {"name": name, "namespace": "ns"}, "spec": {"type": "LoadBalancer"}});
        let view = Arc::new(ServiceView::from_service(&serde_json::from_value(k8s).unwrap()));
        let event = Box::new(Recorded::deleted("uid", "1", &view, &Arc::default()));
        let change = StateChange::Event {
            key: ServiceKey::new("ns", name),
            cause: Cause::Watch,
            event,
            awaits_finalizer: false,
            cleanup: None,
        };
        let first = store.next_event_id().await.unwrap();
        store.prepare(Chunk { changes: vec![change], progress: Vec::new() }, outbox, first, now_ms()).unwrap()
    }

    /// Says the watch's writer will record within a minute, so rounds wait for its Record.
    fn expect(store: &Store) {
        store.expect_record(Some(Instant::now() + Duration::from_secs(60)));
    }

    async fn attempts(store: &Store) -> i64 {
        store.read_one(store.backend.query("SELECT COUNT(*) FROM attempts")).await.unwrap().get(0)
    }

    /// A round sent while the watch's writer is expected to record waits for that Record and commits
    /// in its transaction: its claim ran after the Record's inserts (`through` is the Record's event).
    #[tokio::test]
    async fn a_round_sent_while_a_record_is_expected_goes_in_the_records_transaction() {
        let (_dir, store, first) = one_pending().await;
        enqueue(&store, "w", "a").await;
        expect(&store);
        let round = store.complete_and_claim(&[succeeded(first)], Some(("w", now_ms(), 60_000, 8)));
        let record = store.record(chunk_of(&store, "gone", &NoOutbox).await);
        let ((recorded, _), heads) = tokio::join!(record, round);
        let (recorded, heads) = (recorded.unwrap(), heads.unwrap());
        let claimed: Vec<i64> = heads.claimed.iter().map(|c| c.id).collect();
        assert_eq!((claimed, heads.through, recorded.shared), (vec![first + 1], recorded.ids.last().copied(), true));
        assert_eq!(attempts(&store).await, 1);
    }

    /// A round with nothing expected runs at once, alone (no event before its claim).
    #[tokio::test]
    async fn a_round_alone_runs_at_once() {
        let (_dir, store, first) = one_pending().await;
        enqueue(&store, "w", "a").await;
        let heads = store.complete_and_claim(&[succeeded(first)], Some(("w", now_ms(), 60_000, 8))).await.unwrap();
        assert_eq!((heads.claimed.len(), heads.through), (1, None));
    }

    /// A standing claim runs after the inserts of the next Record's transaction, so it takes the
    /// deliveries that transaction enqueued; one withdrawn before any Record claims nothing.
    #[tokio::test]
    async fn a_standing_claim_takes_what_its_records_transaction_enqueued_and_one_withdrawn_claims_nothing() {
        let (_dir, store) = fresh().await;
        enqueue(&store, "w", "a").await;
        let withdrawn = store.offer_claim("w", 60_000, 4);
        assert_eq!(withdrawn.withdraw().await, None);

        let mut standing = store.offer_claim("w", 60_000, 4);
        let (recorded, _) = store.record(chunk_of(&store, "b", &ToW).await).await;
        let recorded = recorded.unwrap();
        let heads = standing.answered().await.unwrap();
        let claimed: Vec<(i64, Option<i64>)> = heads.claimed.iter().map(|c| (c.id, c.event_id)).collect();
        assert_eq!(claimed, vec![(1, None), (2, Some(recorded.ids[0]))]);
        assert_eq!(heads.through, Some(recorded.ids[0]));
        assert!(standing.is_answered());
        assert_eq!(store.claim("w", now_ms(), 60_000, 4).await.unwrap(), vec![]);
    }

    /// A standing claim never starts a transaction by itself; hurried, it runs in the next one,
    /// with the new limit.
    #[tokio::test]
    async fn a_hurried_standing_claim_runs_without_a_record() {
        let (_dir, store) = fresh().await;
        for name in ["a", "b", "c"] {
            enqueue(&store, "w", name).await;
        }
        let mut standing = store.offer_claim("w", 60_000, 1);
        let waited = tokio::time::timeout(Duration::from_millis(50), standing.answered()).await;
        assert!(waited.is_err(), "answered without a Record");
        standing.hurry(2);
        let heads = standing.answered().await.unwrap();
        assert_eq!((heads.claimed.iter().map(|c| c.id).collect::<Vec<_>>(), heads.through), (vec![1, 2], None));
    }

    /// A standing claim whose requester went away (its task ended) claims nothing: no one would send
    /// what it took.
    #[tokio::test]
    async fn a_standing_claim_whose_requester_went_away_claims_nothing() {
        let (_dir, store) = fresh().await;
        enqueue(&store, "w", "a").await;
        drop(store.offer_claim("w", 60_000, 4));
        let (recorded, _) = store.record(chunk_of(&store, "gone", &NoOutbox).await).await;
        recorded.unwrap();
        assert_eq!(store.claim("w", now_ms(), 60_000, 4).await.unwrap().len(), 1);
    }

    /// In one transaction each write has a savepoint of its own: a round that fails (endpoint `w`, an
    /// attempt of a delivery that does not exist breaks the attempts' foreign key) gets its own error
    /// and is rolled back alone; the watch's Record and another endpoint's round (`v`) commit.
    #[tokio::test]
    async fn a_failing_round_does_not_fail_the_records_write_or_another_endpoints_round() {
        let (_dir, store, first) = one_pending().await;
        enqueue(&store, "v", "b").await;
        expect(&store);
        let failing = store.complete_and_claim(&[succeeded(first), succeeded(999)], Some(("w", now_ms(), 60_000, 8)));
        let other = store.complete_and_claim(&[], Some(("v", now_ms(), 60_000, 8)));
        let record = store.record(chunk_of(&store, "gone", &NoOutbox).await);
        let (failing, other, (recorded, _)) = tokio::join!(failing, other, record);
        match failing {
            Err(StoreError::Sqlx(sqlx::Error::Database(db))) => {
                assert_eq!(db.message(), "FOREIGN KEY constraint failed")
            }
            other => panic!("not the round's own error: {other:?}"),
        }
        let recorded = recorded.unwrap();
        let other = other.unwrap();
        assert_eq!(
            (other.claimed.iter().map(|c| c.id).collect::<Vec<_>>(), other.through),
            (vec![first + 1], recorded.ids.last().copied())
        );
        assert_eq!(attempts(&store).await, 0);
        assert_eq!(store.event_count().await.unwrap(), 1);
    }

    /// A transaction that fails as a whole (here a write that ends it under the others' feet, as
    /// SQLite does on a full disk) fails every write it carried: the Record gets the shared error and
    /// its chunk back, the round the same error, and nothing is committed.
    #[tokio::test]
    async fn a_transaction_that_fails_as_a_whole_fails_every_write_it_carried() {
        let (_dir, store, first) = one_pending().await;
        let chunk = chunk_of(&store, "gone", &NoOutbox).await;
        // Sent one after the other, before the owner looks (this test's runtime has one thread).
        expect(&store);
        let round = store.complete(&[succeeded(first)]);
        let backend = store.backend;
        let breaking = store.transact(super::job(move |s| {
            Box::pin(async move {
                let tx = s.tx().await?;
                backend.query("ROLLBACK").execute(tx.exec()).await.map(drop)
            })
        }));
        let record = store.record(chunk);
        let ((recorded, chunk), round, breaking) = tokio::join!(record, round, breaking);
        assert!(matches!(recorded, Err(StoreError::Shared(_))), "{recorded:?}");
        assert!(matches!(round, Err(StoreError::Shared(_))), "{round:?}");
        assert!(breaking.is_err());
        assert_eq!((chunk.events(), attempts(&store).await, store.event_count().await.unwrap()), (1, 0, 0));
        // The next transaction runs on a fresh connection.
        let (recorded, _) = store.record(chunk).await;
        assert_eq!(recorded.unwrap().ids.len(), 1);
    }

    /// A Record, a Write or a hurried claim starts a transaction at once; rounds wait for a Record
    /// the watch's writer said is coming, until its due time plus the patience, and run at once
    /// without one (or past it); standing claims alone start nothing.
    #[test]
    fn only_an_expected_record_makes_rounds_wait_for_it() {
        let now = Instant::now();
        let (due, patience) = (now + Duration::from_millis(10), Duration::from_millis(15));
        assert_eq!(start(true, true, Some((due, patience)), now), Start::Now);
        assert_eq!(start(false, true, None, now), Start::Now);
        assert_eq!(start(false, true, Some((due, patience)), now), Start::At(due + patience));
        assert_eq!(start(false, true, Some((due, patience)), due + patience), Start::Now);
        assert_eq!(start(false, false, Some((due, patience)), now), Start::Idle);
        assert_eq!(start(false, false, None, now), Start::Idle);
    }

    /// A round counts as backlogged only when it asked for at least 8 heads, got them all, and its
    /// attempts took less than the configured interval on average, one at least succeeding.
    #[test]
    fn only_a_full_claim_of_eight_or_more_after_quick_attempts_counts_as_backlogged() {
        let quick = |ms| Completion {
            delivery_id: 1,
            attempt: AttemptRecord { duration_ms: ms, ..AttemptRecord::default() },
            outcome: Outcome::Succeeded,
            told: None,
        };
        let failed = Completion { outcome: Outcome::Retry(now_ms() + 1_000), ..quick(1) };
        let interval = Duration::from_millis(15);
        assert!(backlogged(8, 8, &[quick(3), quick(20)], interval));
        assert!(backlogged(16, 16, &[quick(14)], interval));
        assert!(!backlogged(4, 4, &[quick(3)], interval), "a claim of 4 or fewer");
        assert!(!backlogged(1, 1, &[quick(0)], interval), "a probe, or concurrency 1");
        assert!(!backlogged(16, 15, &[quick(3)], interval), "fewer heads than asked for");
        assert!(!backlogged(16, 16, &[quick(15)], interval), "attempts as slow as the interval");
        assert!(!backlogged(16, 16, &[quick(2), quick(40)], interval), "a slow receiver on average");
        assert!(!backlogged(16, 16, &[], interval), "no attempt recorded");
        assert!(!backlogged(16, 16, std::slice::from_ref(&failed), interval), "no attempt succeeded");
        let timed_out =
            Completion { attempt: AttemptRecord { duration_ms: 9_000, ..AttemptRecord::default() }, ..failed };
        assert!(!backlogged(16, 16, &[quick(2), timed_out], interval), "slow failures count too");
    }

    /// The interval is the configured one, or at most 5 ms until the backlog mark runs out; a
    /// configured interval shorter than that stays as it is. The next commit is due that long after
    /// the last one started. (Pure: the time is an argument.)
    #[test]
    fn the_commit_interval_is_short_while_the_relay_is_backlogged() {
        let start = Instant::now();
        let mut pacing = Pacing { configured: DEFAULT_COMMIT_INTERVAL, backlogged_until: None };
        assert_eq!(pacing.due(start, start), start + DEFAULT_COMMIT_INTERVAL);
        pacing.backlogged_until = Some(start + Duration::from_millis(100));
        assert_eq!(pacing.interval(start), BACKLOG_COMMIT_INTERVAL);
        assert_eq!(pacing.due(start, start), start + BACKLOG_COMMIT_INTERVAL);
        let short = Pacing { configured: Duration::from_millis(2), ..pacing };
        assert_eq!(short.interval(start), Duration::from_millis(2));
        let later = start + Duration::from_millis(100);
        assert_eq!(pacing.interval(later), DEFAULT_COMMIT_INTERVAL, "the mark ran out");
    }

    /// A round that records a quick success and claims all 8 heads it asked for marks the relay
    /// backlogged; one that finds fewer heads than it asked for does not.
    #[tokio::test]
    async fn a_backlogged_round_marks_the_relay_and_a_partial_one_does_not() {
        for (pending, marked) in [(8, true), (7, false)] {
            let (_dir, store, first) = one_pending().await;
            for i in 0..pending {
                enqueue(&store, "w", &format!("s{i}")).await;
            }
            let heads = store.complete_and_claim(&[succeeded(first)], Some(("w", now_ms(), 60_000, 8))).await.unwrap();
            assert_eq!(heads.claimed.len(), pending);
            let until = store.pacing().backlogged_until;
            assert_eq!(until.is_some_and(|u| u > Instant::now()), marked, "{pending} of 8");
            if marked {
                assert_eq!(store.commit_interval(), BACKLOG_COMMIT_INTERVAL);
            }
        }
    }
}
