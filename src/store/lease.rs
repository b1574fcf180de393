//! The leader lease on PostgreSQL (as River, the Go job queue, does it; see
//! docs/explanation/leader-election.md): one row in `leader` with the holder, an epoch that goes up
//! at every change of holder, and an expiry on the database's clock (so the replicas' clocks never
//! matter). Followers take an expired lease, the leader renews its own, a stopping leader resigns,
//! and every write transaction of the leader is fenced by its epoch ([`Fence`], see
//! `health::WriteConn::begin`).
//!
//! The lease statements run on a connection of their own (`Pools::Pg::lease`), never behind the
//! writer's queue: a renewal must not wait for a long batch.

use std::time::Duration;

use super::db::Pools;
use super::{Backend, Store, StoreError};

/// The lease's row name: one leader per database (written into each statement).
#[cfg(test)]
const NAME: &str = "vipwatch";

/// Takes an expired lease: epoch + 1, holder $1, expiry now + $2 ms. A plain `UPDATE … WHERE`, not
/// `INSERT … ON CONFLICT DO UPDATE … WHERE`, which locks the row even when the lease is valid, so
/// every follower's bid would queue behind the leader's fenced transactions.
const ACQUIRE: &str = "UPDATE leader SET epoch = epoch + 1, holder = $1, elected_at = now(), renewed_at = now(), \
    expires_at = now() + $2 * interval '1 millisecond' WHERE name = 'vipwatch' AND expires_at < now() RETURNING epoch";

/// The first lease of a database (no row yet): epoch 1.
const FIRST: &str = "INSERT INTO leader (name, epoch, holder, elected_at, renewed_at, expires_at) \
    VALUES ('vipwatch', 1, $1, now(), now(), now() + $2 * interval '1 millisecond') \
    ON CONFLICT (name) DO NOTHING RETURNING epoch";

/// Extends the lease of holder $1 at epoch $2 to now + $3 ms, if it still holds it unexpired.
const RENEW: &str = "UPDATE leader SET renewed_at = now(), expires_at = now() + $3 * interval '1 millisecond' \
    WHERE name = 'vipwatch' AND holder = $1 AND epoch = $2 AND expires_at > now()";

/// Ends the lease of holder $1 at epoch $2 now, and tells the followers (`LISTEN vipwatch_leader`).
const RESIGN: &str = "WITH r AS (UPDATE leader SET expires_at = now() \
    WHERE name = 'vipwatch' AND holder = $1 AND epoch = $2 RETURNING epoch) \
    SELECT pg_notify('vipwatch_leader', 'resigned') FROM r";

/// The channel followers listen on to bid at once when the leader resigns.
pub const LEADER_CHANNEL: &str = "vipwatch_leader";

/// The channel the leader notifies, with the highest event id as payload, in every transaction
/// that writes events (delivered at its commit): followers' SSE tails and VIP indexes wake on it.
pub const EVENTS_CHANNEL: &str = "vipwatch_events";

/// The leader's write fence: the first statement of every leader write transaction. It locks the
/// lease row `FOR SHARE` (not `FOR KEY SHARE`, which does not conflict with an UPDATE that leaves
/// the key alone: a takeover's UPDATE must wait for the leader's transactions in flight) where
/// holder, epoch and an unexpired lease still match; no row = deposed. It also takes the
/// transaction-scoped advisory lock every writer of events and deliveries takes ([`ORDER_LOCK`]).
const FENCE: &str = "SELECT 1 FROM leader, pg_advisory_xact_lock($3) AS o \
    WHERE name = 'vipwatch' AND holder = $1 AND epoch = $2 AND expires_at > now() FOR SHARE OF leader";

/// The advisory lock every PostgreSQL write transaction takes first (released at its commit), so
/// transactions that insert events or deliveries commit one after another and ids become visible
/// in order: the relay's cursor and the SSE resume read `id > last`, and would skip an id that
/// becomes visible after a higher one. Within one replica the single write connection already
/// serializes; this orders a follower's API writes (a replay, a resync) against the leader's.
pub(super) const ORDER_LOCK: i64 = 0x7669_7077_6f72_6472;

/// Who holds the lease, as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRow {
    /// The leading replica's name (`database.replica`).
    pub holder: String,
    /// Its epoch.
    pub epoch: i64,
    /// How long until it expires without renewal (ms; negative: expired that long ago).
    pub expires_in_ms: i64,
}

/// What a leader's write transactions must still match: its name and epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    /// The replica's name.
    pub holder: String,
    /// The epoch it was elected with.
    pub epoch: i64,
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Whether a leader's term may still act, as the replica itself sees it (`crate::leader::LeaderDeadline`).
pub type StillLeading = Box<dyn Fn() -> bool + Send + Sync>;

/// A leader's fence with its term's leader deadline, as the store that writes for the term holds it.
pub(super) struct Fencing {
    /// What the database checks.
    pub fence: Fence,
    /// Whether the term may still act. Once not, the store starts no write, and a write that fails
    /// is the fence's refusal whatever its error (the paused leader's session was ended by the
    /// server, its connection is gone): the term's writes are over either way.
    still_leading: StillLeading,
    /// Set when the refusal was logged: once per term.
    told: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Fencing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fencing")
            .field("fence", &self.fence)
            .field("still_leading", &self.still_leading())
            .finish_non_exhaustive()
    }
}

impl Fencing {
    /// Whether the term may still write, as far as this replica knows (its leader deadline).
    pub(super) fn still_leading(&self) -> bool {
        (self.still_leading)()
    }

    /// The refusal of a write of this term: [`StoreError::Fenced`]. Logged once per term, at info:
    /// a deposed leader's refused writes are how it learns, or confirms, that its term is over; the
    /// loss of the lease itself is logged by `crate::leader`.
    pub(super) fn refusal(&self) -> StoreError {
        let epoch = self.fence.epoch;
        if !self.told.swap(true, std::sync::atomic::Ordering::Relaxed) {
            tracing::info!(replica = %self.fence.holder, epoch,
                "not the leader any more: this term's writes are refused and left to the next leader");
        }
        StoreError::Fenced { epoch }
    }

    /// `e` as the outcome of a write of this term: the fence's refusal when it is one, or when the
    /// term's leader deadline passed (whatever failed, the term was over); else `e`.
    pub(super) fn judge(&self, e: StoreError) -> StoreError {
        if e.is_fenced() || !self.still_leading() {
            if !e.is_fenced() {
                tracing::debug!(error = %e, epoch = self.fence.epoch, "a write failed after the term's leader_deadline ran out");
            }
            return self.refusal();
        }
        e
    }
}

impl Store {
    /// A clone whose write transactions are fenced by `fence` (PostgreSQL): once another replica took
    /// the lease, or it expired, each fails with [`StoreError::Fenced`] and commits nothing.
    /// `still_leading` is the term's own view (its leader deadline): once it says no, no write starts, and a
    /// write that fails is reported as [`StoreError::Fenced`] too (not as a database fault: the
    /// database is fine, the term is over).
    pub fn fenced(&self, fence: Fence, still_leading: StillLeading) -> Store {
        let fencing = Fencing { fence, still_leading, told: Default::default() };
        Store { fence: Some(std::sync::Arc::new(fencing)), ..self.clone() }
    }

    /// Takes the lease for `holder` for `ttl` if nobody holds it unexpired. Returns the new epoch, or
    /// `None` when another replica leads. PostgreSQL only (`None` on SQLite, which has no lease).
    pub async fn lease_acquire(&self, holder: &str, ttl: Duration) -> Result<Option<i64>, StoreError> {
        let Pools::Pg { lease, .. } = &self.pools else { return Ok(None) };
        for sql in [ACQUIRE, FIRST] {
            let q = sqlx::query_scalar::<_, i64>(sql).bind(holder).bind(millis(ttl));
            if let Some(epoch) = q.fetch_optional(lease).await? {
                return Ok(Some(epoch));
            }
        }
        Ok(None)
    }

    /// Renews `holder`'s lease at `epoch` for `ttl`. Returns `false` when it does not hold it any more
    /// (another replica took it, or it expired).
    pub async fn lease_renew(&self, holder: &str, epoch: i64, ttl: Duration) -> Result<bool, StoreError> {
        let Pools::Pg { lease, .. } = &self.pools else { return Ok(false) };
        let q = sqlx::query(RENEW).bind(holder).bind(epoch).bind(millis(ttl));
        Ok(q.execute(lease).await?.rows_affected() == 1)
    }

    /// Ends `holder`'s lease at `epoch` now and notifies the followers, so one takes over at once
    /// (graceful stop). Nothing when it does not hold it.
    pub async fn lease_resign(&self, holder: &str, epoch: i64) -> Result<(), StoreError> {
        let Pools::Pg { lease, .. } = &self.pools else { return Ok(()) };
        sqlx::query(RESIGN).bind(holder).bind(epoch).execute(lease).await?;
        Ok(())
    }

    /// The current lease, if any replica ever led (PostgreSQL; `None` on SQLite).
    pub async fn lease(&self) -> Result<Option<LeaseRow>, StoreError> {
        if self.backend != Backend::Postgres {
            return Ok(None);
        }
        let sql = "SELECT holder, epoch, \
                   (EXTRACT(EPOCH FROM (expires_at - now())) * 1000)::bigint AS expires_in_ms \
                   FROM leader WHERE name = 'vipwatch'";
        let row = self.read_optional(self.backend.query(sql)).await?;
        Ok(row.map(|r| LeaseRow {
            holder: r.get("holder"),
            epoch: r.get("epoch"),
            expires_in_ms: r.get("expires_in_ms"),
        }))
    }
}

/// The guard statement a PostgreSQL write transaction starts with: the fence when `fence` is set
/// (a leader's store), else only the order lock (a follower's API writes).
pub(super) fn guard(fence: Option<&Fence>) -> super::db::Query {
    match fence {
        Some(f) => Backend::Postgres.query(FENCE).bind(f.holder.as_str()).bind(f.epoch).bind(ORDER_LOCK),
        None => Backend::Postgres.query("SELECT pg_advisory_xact_lock($1)").bind(ORDER_LOCK),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_lease_name_is_the_one_the_statements_use() {
        for sql in [super::ACQUIRE, super::FIRST, super::RENEW, super::RESIGN, super::FENCE] {
            assert!(sql.contains(&format!("'{}'", super::NAME)), "{sql}");
        }
    }
}
