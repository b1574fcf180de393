//! Relay rounds and claims carried by the watch's write transaction.
//!
//! A relay round ([`Store::complete_and_claim`]: record the finished attempts, claim the next heads)
//! and a relay claim ([`Store::claim`], after a commit woke the relay) as transactions of their own
//! on the one write connection would about double the transactions per change (the watch's commits,
//! and about as many of the relay's), each writing into the WAL the pages it touched: the delivery
//! rows a round claims and completes are the ones the writer just inserted, on the same pages.
//!
//! So the relay's writes first wait as [`Rider`]s: the watch's writer, at the end of its transaction
//! and before its commit ([`Store::write`]), takes every rider waiting and runs their statements in
//! its own transaction, after its inserts, so a claim takes the deliveries that very transaction
//! enqueued. Two kinds ride:
//! - a round waits while it stands in line for its turn, and, when the writer said it will commit
//!   within one group-commit interval ([`Store::expect_write`], [`Store::commit_interval`]), until
//!   then; a round whose turn comes first withdraws its rider and runs on its own;
//! - a standing claim ([`Store::stand_claim`]): a relay with free slots leaves one while it waits, so
//!   the next commit hands it its own deliveries; it is withdrawn when the relay wakes for anything
//!   else.
//!
//! Riding is only ever an opportunity: a rider whose carrying transaction fails, or whose own
//! statements fail (each rider runs inside a savepoint of its own, rolled back alone), is told so
//! ([`Ride::NotCarried`]) and the round runs on its own, so it sees its own error. A rider's failed
//! statement does not fail the writer's transaction, unless SQLite rolled the whole transaction back
//! (a full disk, an I/O error), which the writer's own statements would have met all the same; the
//! writer retries then, as always. Riding makes fewer transactions per change, and lowers the
//! steady-state latency and the bytes written per change (see docs/explanation/design-decisions.md).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::deliveries::record_attempts;
use super::script::{Script, Stmt};
use super::{Claimed, Completion, Outcome, Store, StoreError, now_ms};

/// A relay round waiting for a transaction to carry it.
#[derive(Debug)]
pub(super) struct Rider {
    /// Its place in the queue, for [`Riders::withdraw`].
    ticket: u64,
    /// The finished attempts to record.
    done: Vec<Completion>,
    /// The claim after them: `(webhook, lease_ms, limit)`, timed when it runs.
    claim: Option<(String, i64, usize)>,
    /// Where the outcome goes.
    reply: oneshot::Sender<Ride>,
}

/// What a carried claim took.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Taken {
    /// The heads claimed, by id (leased).
    pub heads: Vec<Claimed>,
    /// The highest event id the watch's transaction that carried the claim recorded (`None`: it ran
    /// in a transaction of its own, or one that recorded no event). The relay need not claim again
    /// when woken for that commit (the `committed` signal): the claim ran after its inserts.
    pub through: Option<i64>,
}

/// What became of a rider.
#[derive(Debug)]
pub(super) enum Ride {
    /// Carried and committed: what its claim took.
    Done(Taken),
    /// Not committed (the carrying transaction failed, or this rider's statements did): the round
    /// is still to be made, on its own.
    NotCarried,
}

/// The rounds waiting for a carrying transaction, in the order they asked.
#[derive(Debug, Default)]
pub(super) struct Riders {
    waiting: Mutex<Vec<Rider>>,
    tickets: AtomicU64,
    /// When the watch's writer will commit the changes it holds ([`Store::expect_write`]).
    expected: Mutex<Option<Instant>>,
    /// Until when the relay counts as backlogged ([`Store::note_round`], [`Store::commit_interval`]).
    backlogged_until: Mutex<Option<Instant>>,
}

impl Riders {
    /// Queues a round; returns its ticket and where its [`Ride`] will arrive.
    pub(super) fn board(
        &self,
        done: Vec<Completion>,
        claim: Option<(String, i64, usize)>,
    ) -> (u64, oneshot::Receiver<Ride>) {
        let ticket = self.tickets.fetch_add(1, Ordering::Relaxed);
        let (reply, rx) = oneshot::channel();
        self.lock().push(Rider { ticket, done, claim, reply });
        (ticket, rx)
    }

    /// Takes the round `ticket` back out of the queue; `false` when a transaction already took it
    /// (its [`Ride`] arrives then, whatever became of that transaction).
    pub(super) fn withdraw(&self, ticket: u64) -> bool {
        let mut waiting = self.lock();
        let before = waiting.len();
        waiting.retain(|r| r.ticket != ticket);
        waiting.len() != before
    }

    /// Every round waiting, to be carried by the caller's transaction.
    pub(super) fn take(&self) -> Vec<Rider> {
        std::mem::take(&mut *self.lock())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Rider>> {
        // The queue holds plain data: a panic while it was locked leaves it consistent.
        self.waiting.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Until when a round waits for the watch's next commit before it asks for a turn of its own:
    /// the commit's due time plus [`RIDE_SLACK`], when that commit is due within `ride_wait` (the
    /// configured group-commit interval, `database.commit_interval`).
    pub(super) fn wait_until(&self, ride_wait: Duration) -> Option<Instant> {
        let expected = *self.expected.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        expected.filter(|at| *at <= Instant::now() + ride_wait).map(|at| at + RIDE_SLACK)
    }

    /// Marks the relay backlogged for [`BACKLOG_HOLD`] from now ([`Store::note_round`]).
    fn mark_backlogged(&self) {
        *self.backlogged_until.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some(Instant::now() + BACKLOG_HOLD);
    }

    /// Whether a round within the last [`BACKLOG_HOLD`] showed the interval to be its bound
    /// ([`interval_bound`]).
    fn backlogged(&self) -> bool {
        let until = *self.backlogged_until.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        until.is_some_and(|until| until > Instant::now())
    }
}

pub use crate::config::DEFAULT_COMMIT_INTERVAL;

/// The group-commit interval while the relay is backlogged ([`Store::commit_interval`]): at most
/// this, or `database.commit_interval` when that is shorter.
///
/// A delivery holds its slot from its claim until the round that records its outcome and claims
/// the next head, and rounds ride the watch's commits, so while every slot is busy an endpoint
/// delivers about `relay.concurrency` per interval or two. When many Services change at a high rate,
/// that is the bound, and a 5 ms interval delivers far more per second, at a much lower latency,
/// than 15 ms. But a fixed shorter interval costs CPU at a steady rate
/// ([`DEFAULT_COMMIT_INTERVAL`]; see docs/explanation/design-decisions.md). So the interval is short
/// only while the relay's rounds show that it is the bound ([`interval_bound`]): at a steady rate
/// each claim finds fewer heads than it asks for.
pub const BACKLOG_COMMIT_INTERVAL: Duration = Duration::from_millis(5);

/// How long one round that [`interval_bound`] counts keeps the relay marked backlogged
/// ([`Store::note_round`]): several rounds, so that the mark holds while such rounds keep coming,
/// and runs out soon after they stop.
const BACKLOG_HOLD: Duration = Duration::from_millis(100);

/// The fewest heads a round must ask for, and get, to count as backlogged ([`interval_bound`]).
/// A claim asks for a power of two of the free slots, at least half of them (the relay's
/// dispatcher): an endpoint with `concurrency` of 8 or more asks for 8 or more when busy, while a
/// probe of an open circuit, or an endpoint held to 1–4 in flight (an appliance API with a rate
/// limit), asks for so few that a trickle of changes fills every claim.
const BACKLOG_MIN_CLAIM: usize = 8;

/// Whether a relay round shows that the group-commit interval bounds its endpoint's deliveries: it
/// asked for at least [`BACKLOG_MIN_CLAIM`] heads and got them all (more are likely waiting), at
/// least one of the attempts it recorded succeeded, and all of them, failed ones included, took
/// less than `interval` on average (the slots turn over faster than the rounds come: a slower
/// receiver, answering or timing out, is its own bound, and a shorter interval would only cost CPU).
fn interval_bound(asked: usize, got: usize, done: &[Completion], interval: Duration) -> bool {
    if asked < BACKLOG_MIN_CLAIM || got < asked || !done.iter().any(|c| c.outcome == Outcome::Succeeded) {
        return false;
    }
    let total = done.iter().fold(0i64, |sum, c| sum.saturating_add(c.attempt.duration_ms));
    let limit = i64::try_from(interval.as_millis()).unwrap_or(i64::MAX);
    let count = i64::try_from(done.len()).unwrap_or(i64::MAX);
    total < limit.saturating_mul(count)
}

/// How long after the watch's commit was due a round still waits for it: the writer prepares its
/// rows before it asks for its turn, and a round in line first runs on its own.
const RIDE_SLACK: Duration = Duration::from_millis(1);

impl Store {
    /// The group-commit interval now: `database.commit_interval` ([`DEFAULT_COMMIT_INTERVAL`] unless
    /// [`Store::with_commit_interval`] set another), or at most [`BACKLOG_COMMIT_INTERVAL`] while the
    /// relay is backlogged (a round within the last 100 ms showed the interval to be its bound:
    /// [`interval_bound`]).
    pub fn commit_interval(&self) -> Duration {
        if self.riders.backlogged() { self.commit_interval.min(BACKLOG_COMMIT_INTERVAL) } else { self.commit_interval }
    }

    /// A relay round recorded the attempts `done` and then claimed: it asked for `asked` heads and
    /// got `got`. When the configured interval bounds that endpoint's deliveries ([`interval_bound`]),
    /// the relay counts as backlogged for [`BACKLOG_HOLD`] from now ([`Store::commit_interval`]); any
    /// other round changes nothing, and the mark runs out on its own.
    pub(super) fn note_round(&self, asked: usize, got: usize, done: &[Completion]) {
        if interval_bound(asked, got, done, self.commit_interval) {
            self.riders.mark_backlogged();
        }
    }

    /// This store with group-commit interval `interval` (`database.commit_interval`), for the clones
    /// made from it.
    pub fn with_commit_interval(mut self, interval: Duration) -> Self {
        self.commit_interval = interval;
        self
    }

    /// Tells the relay's rounds that the watch's writer will write at `at` (`None`: nothing held).
    /// A round that finishes shortly before then waits for that transaction to carry it rather than
    /// committing alone: at a steady rate this puts both in one commit.
    pub fn expect_write(&self, at: Option<Instant>) {
        *self.riders.expected.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = at;
    }
}

/// A relay claim waiting for the watch's next write transaction to run it
/// ([`Store::stand_claim`]).
#[derive(Debug)]
pub struct StandingClaim {
    ticket: u64,
    /// `None` once [`StandingClaim::carried`] resolved.
    ride: Option<oneshot::Receiver<Ride>>,
}

/// What a rider's answer says it took: `Some` when it was carried and committed.
pub(super) fn taken(outcome: Result<Ride, oneshot::error::RecvError>) -> Option<Taken> {
    match outcome {
        Ok(Ride::Done(taken)) => Some(taken),
        Ok(Ride::NotCarried) | Err(_) => None,
    }
}

impl StandingClaim {
    /// Resolves once a write transaction took the claim: `Some` with what it took (the heads are
    /// leased: start them) when it committed, `None` when it failed and claimed nothing; never
    /// again after that. Cancel-safe.
    pub async fn carried(&mut self) -> Option<Taken> {
        let ride = self.ride.as_mut()?;
        let outcome = ride.await;
        self.ride = None;
        taken(outcome)
    }
}

impl Store {
    /// Boards a claim of up to `limit` due heads of `webhook`, leased for `lease_ms` from when it
    /// runs, to ride the watch's next write transaction, after that transaction's inserts: the relay
    /// gets the deliveries of a commit from the commit itself, instead of claiming them in a
    /// transaction of its own once woken by it. Wait for it with [`StandingClaim::carried`]; take
    /// it back with [`Store::withdraw_claim`].
    pub fn stand_claim(&self, webhook: &str, lease_ms: i64, limit: usize) -> StandingClaim {
        let (ticket, ride) = self.riders.board(Vec::new(), Some((webhook.to_owned(), lease_ms, limit)));
        StandingClaim { ticket, ride: Some(ride) }
    }

    /// Takes `claim` back. Returns what it took if a write transaction ran it meanwhile and
    /// [`StandingClaim::carried`] did not return it yet (the heads are leased: start them), else
    /// `None`.
    pub async fn withdraw_claim(&self, claim: StandingClaim) -> Option<Taken> {
        if self.riders.withdraw(claim.ticket) {
            return None;
        }
        taken(claim.ride?.await)
    }
}

/// Runs each rider's statements in `s`'s transaction, each inside a savepoint of its own: its
/// attempts (a finished head lets the next one of its Service be claimed), then its claim. Returns,
/// per rider in order, the heads it claimed, or `None` when one of its statements failed and its
/// savepoint was rolled back (that rider is not carried; the others and the transaction go on).
/// Riders are of different endpoints (a dispatcher has one at a time), so their order does not
/// matter. Errors: a savepoint could not be rolled back (SQLite rolled the whole transaction back,
/// as on a full disk): the caller's transaction fails, and no rider is carried.
pub(super) async fn carry(s: &mut Script<'_>, riders: &[Rider]) -> Result<Vec<Option<Vec<Claimed>>>, StoreError> {
    if riders.is_empty() {
        return Ok(Vec::new());
    }
    // The transaction's own statements run first, so that an error below is a rider's.
    s.flush().await?;
    let now = now_ms();
    let mut heads = Vec::with_capacity(riders.len());
    for rider in riders {
        s.run(Stmt::new("SAVEPOINT rider")).await?;
        match statements(s, rider, now).await {
            Ok(claimed) => {
                s.run(Stmt::new("RELEASE rider")).await?;
                heads.push(Some(claimed));
            }
            Err(e) => {
                tracing::debug!(error = %e, reason = %e.reason(), "relay round not carried; it runs on its own");
                s.run(Stmt::new("ROLLBACK TO rider")).await?;
                s.run(Stmt::new("RELEASE rider")).await?;
                s.flush().await?;
                heads.push(None);
            }
        }
    }
    Ok(heads)
}

/// One rider's statements, run now (so that an error is its own).
async fn statements(s: &mut Script<'_>, rider: &Rider, now: i64) -> Result<Vec<Claimed>, StoreError> {
    record_attempts(s, now, &rider.done).await?;
    let claimed = match &rider.claim {
        // A round whose owner stopped waiting claims nothing: no one would send what it took.
        Some((webhook, lease_ms, limit)) if *limit > 0 && !rider.reply.is_closed() => {
            let stmt = super::outbox::claim_stmt(s.backend(), webhook, now, *lease_ms, *limit);
            super::outbox::claimed(&s.fetch_all(stmt).await?)
        }
        _ => Vec::new(),
    };
    s.flush().await?;
    Ok(claimed)
}

/// Tells each rider what became of it: what it claimed if the carrying transaction committed
/// (`committed`, recording events up to `through`) and its statements ran, else
/// [`Ride::NotCarried`]; a carried round is noted on `store` ([`Store::note_round`]).
pub(super) fn answer(
    store: &Store,
    riders: Vec<Rider>,
    heads: Option<Vec<Option<Vec<Claimed>>>>,
    through: Option<i64>,
) {
    let mut heads = heads.unwrap_or_default().into_iter();
    for rider in riders {
        let ride = match heads.next().flatten() {
            Some(heads) => {
                let asked = rider.claim.as_ref().map_or(0, |c| c.2);
                store.note_round(asked, heads.len(), &rider.done);
                Ride::Done(Taken { heads, through })
            }
            None => Ride::NotCarried,
        };
        let _ = rider.reply.send(ride);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::model::ServiceKey;
    use crate::store::{AttemptRecord, Completion, NewDelivery, NoOutbox, Outcome, Store, StoreError, now_ms};

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

    /// A store on a fresh SQLite file with one delivery of endpoint `w` (Service `ns/a`), claimed
    /// with a lease that is already over; its id.
    async fn one_pending() -> (tempfile::TempDir, Store, i64) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("t.db")).await.unwrap();
        enqueue(&store, "w", "a").await;
        let claimed = store.claim("w", now_ms(), 0, 1).await.unwrap();
        (dir, store, claimed[0].id)
    }

    /// Waits (deadline 10 s) until `ok` holds.
    async fn until(what: &str, ok: impl Fn() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !ok() {
            assert!(tokio::time::Instant::now() < deadline, "timed out waiting until {what}");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    fn succeeded(delivery_id: i64) -> Completion {
        Completion { delivery_id, attempt: AttemptRecord::default(), outcome: Outcome::Succeeded, told: None }
    }

    /// Holds the write connection's turn, lines up an (empty) watch write and then a relay round
    /// behind it, and lets go: the write's transaction carries the round. Returns the round's
    /// result, whether the write succeeded, and the turns given meanwhile.
    async fn round_behind_a_write(store: &Store, done: Vec<Completion>) -> (Result<Vec<i64>, StoreError>, bool, u64) {
        let (mut results, wrote, turns) = rounds_behind_a_write(store, vec![("w", done)]).await;
        (results.remove(0), wrote, turns)
    }

    /// [`round_behind_a_write`] with several rounds, one per `(endpoint, attempts)`, in line in
    /// that order.
    async fn rounds_behind_a_write(
        store: &Store,
        rounds: Vec<(&'static str, Vec<Completion>)>,
    ) -> (Vec<Result<Vec<i64>, StoreError>>, bool, u64) {
        let held = store.writer().await.unwrap();
        let mark = store.write_mark();
        let writer = tokio::spawn({
            let store = store.clone();
            async move {
                let prepared = store.prepare(&[], &[], &NoOutbox, 1, now_ms()).unwrap();
                store.write(&prepared).await.is_ok()
            }
        });
        until("the write is in line", || store.turns.in_line() == 2).await;
        let mut tasks = Vec::new();
        for (webhook, done) in rounds {
            tasks.push(tokio::spawn({
                let store = store.clone();
                async move {
                    let claimed = store.complete_and_claim(&done, Some((webhook, now_ms(), 60_000, 8))).await?;
                    Ok(claimed.heads.iter().map(|c| c.id).collect::<Vec<_>>())
                }
            }));
            let in_line = 2 + tasks.len();
            until("the round is in line", || store.turns.in_line() == in_line).await;
        }
        drop(held);
        let wrote = writer.await.unwrap();
        let mut results = Vec::new();
        for task in tasks {
            results.push(task.await.unwrap());
        }
        (results, wrote, store.write_mark() - mark)
    }

    async fn attempts(store: &Store) -> i64 {
        store.read_one(store.backend.query("SELECT COUNT(*) FROM attempts")).await.unwrap().get(0)
    }

    /// The round waiting behind the write is recorded and claims in the write's transaction: it
    /// takes no turn of its own (one turn given: the write's).
    #[tokio::test]
    async fn a_round_waiting_behind_a_write_is_carried_by_its_transaction() {
        let (_dir, store, first) = one_pending().await;
        enqueue(&store, "w", "a").await;

        let (claimed, wrote, turns) = round_behind_a_write(&store, vec![succeeded(first)]).await;
        assert_eq!((claimed.unwrap(), wrote, turns), (vec![first + 1], true, 1));
        assert_eq!(attempts(&store).await, 1);
        assert!(store.riders.take().is_empty());
    }

    /// A standing claim runs in the next write transaction, and one taken back before any write
    /// claims nothing.
    #[tokio::test]
    async fn a_standing_claim_rides_the_next_write_and_one_withdrawn_claims_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("t.db")).await.unwrap();
        enqueue(&store, "w", "a").await;

        let withdrawn = store.stand_claim("w", 60_000, 4);
        assert_eq!(store.withdraw_claim(withdrawn).await, None);

        let mut standing = store.stand_claim("w", 60_000, 4);
        let prepared = store.prepare(&[], &[], &NoOutbox, 1, now_ms()).unwrap();
        store.write(&prepared).await.unwrap();
        let taken = standing.carried().await.unwrap();
        assert_eq!((taken.heads.iter().map(|c| c.id).collect::<Vec<_>>(), taken.through), (vec![1], None));
        assert_eq!(store.claim("w", now_ms(), 60_000, 4).await.unwrap(), vec![]);
    }

    /// Each carried round has a savepoint of its own: one that fails (endpoint `w`, an attempt of
    /// a delivery that does not exist) runs on its own, and the other (endpoint `v`) is carried
    /// all the same: two turns given, the write's and the failing round's.
    #[tokio::test]
    async fn a_failing_round_does_not_keep_another_endpoints_round_from_being_carried() {
        let (_dir, store, first) = one_pending().await;
        enqueue(&store, "v", "b").await;

        let rounds = vec![("w", vec![succeeded(first), succeeded(999)]), ("v", vec![])];
        let (results, wrote, turns) = rounds_behind_a_write(&store, rounds).await;
        assert!(matches!(&results[0], Err(StoreError::Sqlx(sqlx::Error::Database(_)))), "{:?}", results[0]);
        assert_eq!((results[1].as_ref().unwrap(), wrote, turns), (&vec![first + 1], true, 2));
        assert_eq!(attempts(&store).await, 0);
    }

    /// A round whose statements fail in the carrying transaction is rolled back alone: the write
    /// commits, and the round then runs on its own turn and sees its own error (an attempt of a
    /// delivery that does not exist breaks the attempts' foreign key).
    #[tokio::test]
    async fn a_round_that_fails_in_the_carrying_transaction_runs_on_its_own_and_the_write_commits() {
        let (_dir, store, first) = one_pending().await;

        let (result, wrote, turns) = round_behind_a_write(&store, vec![succeeded(first), succeeded(999)]).await;
        match result {
            Err(StoreError::Sqlx(sqlx::Error::Database(db))) => {
                assert_eq!(db.message(), "FOREIGN KEY constraint failed")
            }
            other => panic!("not the round's own error: {other:?}"),
        }
        assert_eq!((wrote, turns), (true, 2));
        assert_eq!(attempts(&store).await, 0);
        assert!(store.riders.take().is_empty());
    }

    /// A round counts as backlogged only when it asked for at least 8 heads, got them all, and its
    /// successful attempts took less than the configured interval on average.
    #[test]
    fn only_a_full_claim_of_eight_or_more_after_quick_attempts_counts_as_backlogged() {
        use super::interval_bound;
        let quick = |ms| Completion {
            delivery_id: 1,
            attempt: AttemptRecord { duration_ms: ms, ..AttemptRecord::default() },
            outcome: Outcome::Succeeded,
            told: None,
        };
        let failed = Completion { outcome: Outcome::Retry(now_ms() + 1_000), ..quick(1) };
        let interval = Duration::from_millis(15);
        assert!(interval_bound(8, 8, &[quick(3), quick(20)], interval));
        assert!(interval_bound(16, 16, &[quick(14)], interval));
        assert!(!interval_bound(4, 4, &[quick(3)], interval), "a claim of 4 or fewer");
        assert!(!interval_bound(1, 1, &[quick(0)], interval), "a probe, or concurrency 1");
        assert!(!interval_bound(16, 15, &[quick(3)], interval), "fewer heads than asked for");
        assert!(!interval_bound(16, 16, &[quick(15)], interval), "attempts as slow as the interval");
        assert!(!interval_bound(16, 16, &[quick(2), quick(40)], interval), "a slow receiver on average");
        assert!(!interval_bound(16, 16, &[], interval), "no attempt recorded");
        assert!(!interval_bound(16, 16, std::slice::from_ref(&failed), interval), "no attempt succeeded");
        let timed_out =
            Completion { attempt: AttemptRecord { duration_ms: 9_000, ..AttemptRecord::default() }, ..failed };
        assert!(!interval_bound(16, 16, &[quick(2), timed_out], interval), "slow failures count too");
    }

    /// A store on a fresh SQLite file with `n` pending deliveries of endpoint `w`, one per Service,
    /// after a first one claimed (lease over) whose id it returns.
    async fn pending_behind_one(n: usize) -> (tempfile::TempDir, Store, i64) {
        let (dir, store, first) = one_pending().await;
        for i in 0..n {
            enqueue(&store, "w", &format!("s{i}")).await;
        }
        (dir, store, first)
    }

    /// A round on its own that records a quick attempt and claims all 8 heads it asked for shortens
    /// the group-commit interval to `BACKLOG_COMMIT_INTERVAL` until the mark runs out; a configured
    /// interval shorter than that stays as it is.
    #[tokio::test]
    async fn a_backlogged_round_on_its_own_shortens_the_commit_interval_for_a_while() {
        use super::{BACKLOG_COMMIT_INTERVAL, DEFAULT_COMMIT_INTERVAL};
        let (_dir, store, first) = pending_behind_one(8).await;
        assert_eq!(store.commit_interval(), DEFAULT_COMMIT_INTERVAL);

        let taken = store.complete_and_claim(&[succeeded(first)], Some(("w", now_ms(), 60_000, 8))).await.unwrap();
        assert_eq!((taken.heads.len(), taken.through), (8, None));
        assert!(store.riders.backlogged_until.lock().unwrap().is_some(), "marked backlogged");
        let short = store.clone().with_commit_interval(Duration::from_millis(2));
        assert_eq!(short.commit_interval(), Duration::from_millis(2));

        until("the backlog mark ran out", || store.commit_interval() == DEFAULT_COMMIT_INTERVAL).await;
        assert!(!store.riders.backlogged());
        *store.riders.backlogged_until.lock().unwrap() = Some(tokio::time::Instant::now() + Duration::from_secs(60));
        assert_eq!(store.commit_interval(), BACKLOG_COMMIT_INTERVAL);
    }

    /// A round carried by the watch's write transaction marks the relay backlogged the same way; one
    /// that finds fewer heads than it asked for does not.
    #[tokio::test]
    async fn a_backlogged_round_carried_by_a_write_marks_the_relay_and_a_partial_one_does_not() {
        let (_dir, store, first) = pending_behind_one(8).await;
        let (claimed, wrote, turns) = round_behind_a_write(&store, vec![succeeded(first)]).await;
        assert_eq!((claimed.unwrap().len(), wrote, turns), (8, true, 1));
        assert!(store.riders.backlogged_until.lock().unwrap().is_some(), "marked backlogged");

        let (_dir, store, first) = pending_behind_one(7).await;
        let (claimed, wrote, turns) = round_behind_a_write(&store, vec![succeeded(first)]).await;
        assert_eq!((claimed.unwrap().len(), wrote, turns), (7, true, 1));
        assert!(store.riders.backlogged_until.lock().unwrap().is_none(), "7 of 8: not marked");
    }
}
