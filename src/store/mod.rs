//! The store: event log, current-state table, outbox, watch bookkeeping, on SQLite (the embedded
//! default, one process) or PostgreSQL (shared by replicas). Owns every SQL statement; other modules
//! call its typed methods. Schemas under `migrations/sqlite` and `migrations/postgres`, applied at
//! open; statements run through [`db`]'s one API over both backends, a write transaction's small
//! statements sent to SQLite as one query ([`script`]). Every write goes to the one owner of the
//! write connection ([`owner`]), which runs whatever waits in one transaction.
//!
//! Every `LIMIT` is written into the SQL as an integer literal, never bound (`LIMIT ?`): SQLite as
//! bundled by sqlx (3.5x) looks at a bound LIMIT while planning, so such a statement is prepared
//! again on every execution after new bindings, a noticeable share of vipwatch's CPU under a steady
//! stream of changes. Limits are integers, so nothing can be injected; each distinct limit is its
//! own cached statement.

mod checkpoint;
mod circuits;
mod cluster_name;
mod db;
mod deliveries;
mod error;
mod events;
mod full_state;
mod health;
mod held;
mod lease;
mod nodes;
mod open;
mod outbox;
mod owner;
mod progress;
mod publish;
mod queries;
mod script;
mod state;
mod statistics;
mod told;

pub use checkpoint::{CHECKPOINT_INTERVAL, Checkpointed, WRITER_AUTOCHECKPOINT_BYTES};
pub use circuits::{CircuitState, CircuitView, Circuits};
pub use db::Backend;
pub use deliveries::{
    AttemptRecord, AttemptRow, Completion, DeliveryFilter, DeliveryRow, ERROR_CLASSES, Outcome, WebhookState,
};
pub use error::StoreError;
pub use events::{EventFilter, EventRow};
pub use full_state::FullStateRow;
pub use health::{FaultKind, PROBE_TIMEOUT, Unwritable};
pub use held::HeldDeletion;
pub use lease::{EVENTS_CHANNEL, Fence, LEADER_CHANNEL, LeaseRow, StillLeading};
pub use nodes::NodeRow;
pub use open::{SessionLimits, WriterLock};
pub use outbox::{Claimed, ENDPOINT_QUEUE, NewDelivery, NoOutbox, Outbox, RecordedEvent, new_msg_id};
pub use owner::{BACKLOG_COMMIT_INTERVAL, DEFAULT_COMMIT_INTERVAL, Heads, Pacing, Recorded, StandingClaim};
pub use progress::{ProgressRow, WatchProgress};
pub use publish::{Acks, CleanupWork, PublishWork, ReleaseWork, Reservation, StatusWork};
pub use queries::{ServiceDeliveryState, ServicePageQuery, WebhookActivity};
pub use state::{Chunk, Cleanup, Prepared, ServiceRow, StateChange, Unprepared};
pub use told::{Told, ToldValue};

/// Handle on the database. Cheap to clone. Reads use a pool of connections; every write goes to the
/// one task that owns the write connection ([`owner`]), so writers queue in-process instead of
/// meeting SQLite's busy handler (which sleeps in steps of up to 100 ms and makes delivery latency
/// spiky), writes that wait together commit together, and on PostgreSQL event and delivery ids
/// commit in the order they were given (the relay's cursor and SSE resume read `id > last`). A
/// failed write closes that connection and marks the database unwritable until a write succeeds
/// again ([`Store::unwritable`], [`Store::check_writable`]).
#[derive(Debug, Clone)]
pub struct Store {
    backend: Backend,
    pools: db::Pools,
    /// Where writes go ([`owner`]).
    owner: owner::Handle,
    log_id: std::sync::Arc<str>,
    health: std::sync::Arc<health::Health>,
    /// Set on a leader's store (PostgreSQL): every write transaction is fenced by it ([`Store::fenced`]).
    fence: Option<std::sync::Arc<lease::Fencing>>,
    /// The configured group-commit interval ([`Store::pacing`]).
    commit_interval: std::time::Duration,
    /// Refreshes PostgreSQL's planner statistics as the tables grow; `None` on SQLite.
    statistics: Option<std::sync::Arc<statistics::Refresher>>,
}

impl Store {
    /// Which database this store runs on.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Runs `q` in the write connection's next transaction: the rows it affected.
    async fn execute(&self, q: db::Query) -> Result<u64, StoreError> {
        self.transact(owner::job(move |s| {
            Box::pin(async move {
                let tx = s.tx().await?;
                q.execute(tx.exec()).await
            })
        }))
        .await
    }

    /// Runs `q` (with `RETURNING`) in the write connection's next transaction: its first row, if any.
    async fn execute_returning(&self, q: db::Query) -> Result<Option<db::Row>, StoreError> {
        self.transact(owner::job(move |s| {
            Box::pin(async move {
                let tx = s.tx().await?;
                q.fetch_optional(tx.exec()).await
            })
        }))
        .await
    }

    /// `q` on a read connection: every row.
    async fn read_all(&self, q: db::Query) -> Result<Vec<db::Row>, StoreError> {
        q.fetch_all(self.pools.read().await?.exec()).await
    }

    /// `q` on a read connection: the first row, if any.
    async fn read_optional(&self, q: db::Query) -> Result<Option<db::Row>, StoreError> {
        q.fetch_optional(self.pools.read().await?.exec()).await
    }

    /// `q` on a read connection: exactly one row.
    async fn read_one(&self, q: db::Query) -> Result<db::Row, StoreError> {
        q.fetch_one(self.pools.read().await?.exec()).await
    }
}

/// Current time as Unix milliseconds (UTC), the unit of every `*_at` column.
pub fn now_ms() -> i64 {
    jiff::Timestamp::now().as_millisecond()
}
