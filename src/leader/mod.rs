//! Leader election over the PostgreSQL lease row: which replica watches, allocates, delivers and
//! writes to Kubernetes, and for how long it may act as leader before its deadline passes (see
//! docs/explanation/leader-election.md).
//!
//! - [`Elector::campaign`] waits until this replica holds the lease: it bids every
//!   `database.leader_renew`, and at once when a leader resigns (`NOTIFY vipwatch_leader`).
//! - A [`Term`] renews the lease every `leader_renew` and keeps its [`LeaderDeadline`]: the local monotonic
//!   deadline up to which this replica may act, the start of its last successful renewal plus
//!   `leader_ttl` minus a margin (the larger of 1 s and `leader_renew`; River, the Go job queue,
//!   measures it the same way). The lease itself expires on the database's clock `leader_ttl` after
//!   that renewal, so this replica stops acting before any other may start.
//! - The term ends ([`Term::lost`]) when a renewal finds the lease gone, or the leader deadline passes
//!   without a successful renewal (the database unreachable, the process paused). Its writes are
//!   fenced by the database independently ([`crate::store::Fence`]).
//!
//! On SQLite there is no election: the one instance leads for good ([`LeaderDeadline::unbounded`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::DatabaseConfig;
use crate::store::{Fence, LEADER_CHANNEL, Store, StoreError};

/// What this replica does now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// SQLite: the one instance, leading for good.
    Single,
    /// PostgreSQL: serves the API; another replica (or none yet) leads.
    Follower,
    /// PostgreSQL: leads, elected with this epoch.
    Leader {
        /// The lease epoch of its term.
        epoch: i64,
    },
}

impl Role {
    /// Whether this replica watches, allocates, delivers and writes to Kubernetes now.
    pub fn leads(self) -> bool {
        !matches!(self, Self::Follower)
    }

    /// `single`, `follower` or `leader`, as the API and the metrics show it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Single => "single",
            Self::Follower => "follower",
            Self::Leader { .. } => "leader",
        }
    }
}

/// Until when this replica may act as leader: send webhooks, write to Kubernetes. Cheap to clone;
/// every clone sees the same deadline.
#[derive(Debug, Clone)]
pub struct LeaderDeadline {
    base: Instant,
    /// Deadline as nanoseconds after `base`; `u64::MAX` = for good; 0 = not at all.
    until_ns: Arc<AtomicU64>,
    /// Cancelled by [`LeaderDeadline::revoke`]: wakes [`LeaderDeadline::passed`] at once, and no renewal extends a
    /// revoked leader deadline again.
    revoked: CancellationToken,
}

impl LeaderDeadline {
    /// A deadline that never passes (SQLite: the only instance leads for good).
    pub fn unbounded() -> Self {
        Self { base: Instant::now(), until_ns: Arc::new(AtomicU64::new(u64::MAX)), revoked: CancellationToken::new() }
    }

    /// A deadline at `deadline`.
    fn until(deadline: Instant) -> Self {
        let base = Instant::now();
        let ns = u64::try_from(deadline.saturating_duration_since(base).as_nanos()).unwrap_or(u64::MAX - 1);
        Self { base, until_ns: Arc::new(AtomicU64::new(ns)), revoked: CancellationToken::new() }
    }

    /// Moves the deadline on to `deadline`; nothing once the leader deadline is revoked or passed (an expired
    /// term ends, even if a late renewal then succeeds).
    fn extend(&self, deadline: Instant) {
        if self.revoked.is_cancelled() || !self.is_ahead() {
            return;
        }
        let ns = deadline.saturating_duration_since(self.base).as_nanos();
        self.until_ns.fetch_max(u64::try_from(ns).unwrap_or(u64::MAX - 1), Ordering::SeqCst);
    }

    /// Makes the leader deadline pass now (the lease was found gone, or the term resigned).
    fn revoke(&self) {
        self.revoked.cancel();
        self.until_ns.store(0, Ordering::SeqCst);
    }

    fn deadline(&self) -> Option<Instant> {
        match self.until_ns.load(Ordering::SeqCst) {
            u64::MAX => None,
            ns => Some(self.base + Duration::from_nanos(ns)),
        }
    }

    /// Whether this replica may still act.
    pub fn is_ahead(&self) -> bool {
        self.deadline().is_none_or(|d| Instant::now() < d)
    }

    /// Resolves once the leader deadline passed (never for [`LeaderDeadline::unbounded`]). A renewal that moves the
    /// deadline on is taken into account.
    pub async fn passed(&self) {
        loop {
            let Some(deadline) = self.deadline() else { return std::future::pending().await };
            if Instant::now() >= deadline {
                return;
            }
            tokio::select! {
                _ = self.revoked.cancelled() => return,
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
    }
}

/// Campaigns for the lease on behalf of one replica.
#[derive(Debug, Clone)]
pub struct Elector {
    store: Store,
    /// This replica's name in the lease.
    pub holder: String,
    ttl: Duration,
    renew: Duration,
    url: String,
}

impl Elector {
    /// An elector for `config` (`leader_ttl`, `leader_renew`, `replica`; `url` for the
    /// notification listener) on `store`.
    pub fn new(store: Store, config: &DatabaseConfig) -> Self {
        Self {
            store,
            holder: replica_name(config),
            ttl: config.leader_ttl,
            renew: config.leader_renew,
            url: config.url.as_ref().map(|u| u.expose().to_owned()).unwrap_or_default(),
        }
    }

    /// How much earlier than the lease's expiry this replica stops acting.
    fn margin(&self) -> Duration {
        self.renew.max(Duration::from_secs(1))
    }

    /// Waits until this replica holds the lease and returns its term; `None` when `cancel` fires
    /// first. A database that fails is retried every `leader_renew` (logged once per outage). A bid
    /// may take up to `leader_ttl`, connecting included: cut at `leader_renew`, it would drop every
    /// new connection half-made over a slow link, and nobody would ever be elected. The server still
    /// ends the bid's statement within 400 ms (`Store::open_postgres`).
    pub async fn campaign(&self, cancel: &CancellationToken) -> Option<Term> {
        let mut listener = None;
        let mut failing = false;
        loop {
            if listener.is_none() {
                // Again at every round: a follower that started while the database was down has none.
                // Bounded, so an unreachable server does not hold up the bid.
                listener = tokio::time::timeout(self.margin(), self.listen()).await.ok().flatten();
            }
            let started = Instant::now();
            let bid = tokio::select! {
                _ = cancel.cancelled() => return None,
                bid = tokio::time::timeout(self.ttl, self.store.lease_acquire(&self.holder, self.ttl)) => bid,
            };
            match bid {
                Ok(Ok(Some(epoch))) => {
                    info!(replica = %self.holder, epoch, "elected leader");
                    return Some(self.term(epoch, started));
                }
                Ok(Ok(None)) => failing = false,
                Ok(Err(e)) if !failing => {
                    failing = true;
                    warn!(error = %e, reason = %e.reason(), "cannot bid for the leader lease; retrying");
                }
                Ok(Err(_)) => {}
                Err(_) if !failing => {
                    failing = true;
                    warn!(timeout = ?self.ttl, "bid for the leader lease timed out; retrying");
                }
                Err(_) => {}
            }
            tokio::select! {
                _ = cancel.cancelled() => return None,
                _ = tokio::time::sleep_until(started + self.renew) => {}
                _ = resigned(&mut listener) => {}
            }
        }
    }

    /// A listener for resignations; `None` when it cannot connect (then bids only every
    /// `leader_renew`).
    async fn listen(&self) -> Option<sqlx::postgres::PgListener> {
        let mut listener = sqlx::postgres::PgListener::connect(&self.url).await.ok()?;
        listener.listen(LEADER_CHANNEL).await.ok()?;
        Some(listener)
    }

    fn term(&self, epoch: i64, started: Instant) -> Term {
        let leader_deadline = LeaderDeadline::until(started + self.ttl - self.margin());
        let lost = CancellationToken::new();
        let renewer = tokio::spawn(renew_loop(self.clone(), epoch, leader_deadline.clone(), lost.clone()));
        Term { elector: self.clone(), epoch, leader_deadline, lost, renewer }
    }
}

/// Resolves on the next notification on `listener`; never when there is none (a lost connection
/// is re-established by sqlx's listener).
async fn resigned(listener: &mut Option<sqlx::postgres::PgListener>) {
    match listener {
        Some(l) => {
            if l.recv().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

/// One term as leader.
#[derive(Debug)]
pub struct Term {
    elector: Elector,
    /// The epoch it was elected with (the fence of its writes).
    pub epoch: i64,
    /// Until when it may act.
    pub leader_deadline: LeaderDeadline,
    lost: CancellationToken,
    renewer: tokio::task::JoinHandle<()>,
}

impl Term {
    /// The store whose writes are fenced by this term.
    pub fn fenced(&self, store: &Store) -> Store {
        let leader_deadline = self.leader_deadline.clone();
        store.fenced(
            Fence { holder: self.elector.holder.clone(), epoch: self.epoch },
            Box::new(move || leader_deadline.is_ahead()),
        )
    }

    /// Resolves when the term is over: the lease was found gone, or the leader deadline passed.
    pub async fn lost(&self) {
        self.lost.cancelled().await;
    }

    /// Ends the term: stops renewing, makes its leader deadline pass, and (graceful stop) gives the lease up
    /// at once so a follower takes over without waiting for it to expire.
    pub async fn resign(self) -> Result<(), StoreError> {
        self.renewer.abort();
        self.leader_deadline.revoke();
        self.elector.store.lease_resign(&self.elector.holder, self.epoch).await
    }

    /// Ends the term after it was lost: stops renewing and makes its leader deadline pass.
    pub fn abandon(self) {
        self.renewer.abort();
        self.leader_deadline.revoke();
    }
}

/// Renews every `leader_renew` until the lease is found gone or the leader deadline passes; then makes
/// the leader deadline pass and fires `lost`.
async fn renew_loop(e: Elector, epoch: i64, leader_deadline: LeaderDeadline, lost: CancellationToken) {
    let mut next = Instant::now() + e.renew;
    loop {
        tokio::select! {
            // First: a process resumed after a pause finds both ready, and its leader deadline passed.
            biased;
            _ = leader_deadline.passed() => {
                warn!(replica = %e.holder, epoch, "leader lease not renewed in time; standing down");
                break;
            }
            _ = tokio::time::sleep_until(next) => {}
        }
        let started = Instant::now();
        next = started + e.renew;
        // A renewal may take until the leader deadline passes (a slow link, a new connection): the deadline
        // counts from its start, so its length never extends what this replica may do.
        let renewal = tokio::select! {
            biased;
            _ = leader_deadline.passed() => {
                warn!(replica = %e.holder, epoch, "leader lease not renewed in time; standing down");
                break;
            }
            renewal = e.store.lease_renew(&e.holder, epoch, e.ttl) => renewal,
        };
        match renewal {
            Ok(true) => leader_deadline.extend(started + e.ttl - e.margin()),
            Ok(false) => {
                warn!(replica = %e.holder, epoch, "leader lease lost to another replica; standing down");
                break;
            }
            Err(err) => warn!(error = %err, reason = %err.reason(), epoch, "cannot renew the leader lease"),
        }
    }
    leader_deadline.revoke();
    lost.cancel();
}

/// This replica's name: `database.replica`, else the host name plus a random suffix.
fn replica_name(config: &DatabaseConfig) -> String {
    if let Some(name) = &config.replica {
        return name.clone();
    }
    let host = hostname().unwrap_or_else(|| "vipwatch".to_owned());
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    format!("{host}-{}", &suffix[..6])
}

fn hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates within it on success.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    std::str::from_utf8(&buf[..end]).ok().filter(|h| !h.is_empty()).map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_leader_deadline_passes_when_due_and_moves_with_renewals() {
        let start = Instant::now();
        let leader_deadline = LeaderDeadline::until(start + Duration::from_millis(200));
        assert!(leader_deadline.is_ahead());
        leader_deadline.extend(start + Duration::from_millis(400));
        leader_deadline.extend(start + Duration::from_millis(300)); // never moves back
        assert_eq!(leader_deadline.deadline().map(|d| d - start), Some(Duration::from_millis(400)));
        tokio::time::timeout(Duration::from_secs(5), leader_deadline.passed()).await.expect("over at 400 ms");
        assert!(Instant::now() >= start + Duration::from_millis(400));
        assert!(!leader_deadline.is_ahead());
        leader_deadline.extend(Instant::now() + Duration::from_secs(60)); // a renewal that ended too late
        assert!(!leader_deadline.is_ahead());
    }

    #[tokio::test]
    async fn a_revoked_leader_deadline_has_passed_at_once_for_every_waiter_and_stays_passed() {
        let leader_deadline = LeaderDeadline::until(Instant::now() + Duration::from_secs(60));
        let waiting = tokio::spawn({
            let leader_deadline = leader_deadline.clone();
            async move { leader_deadline.passed().await }
        });
        leader_deadline.revoke();
        tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("woken by the revocation").unwrap();
        leader_deadline.extend(Instant::now() + Duration::from_secs(60)); // a renewal that finished too late
        assert!(!leader_deadline.is_ahead());
        assert!(LeaderDeadline::unbounded().is_ahead());
    }
}
