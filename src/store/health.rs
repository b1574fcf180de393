//! Write health: what kind of storage fault an error is, whether the database can be written right now
//! (fed by the outcome of every write and by `/readyz`'s probe), and the backoff every writer uses while
//! it cannot.
//!
//! Every write runs in a transaction of the write connection's owner ([`super::owner`]), which records
//! its outcome here: a failed transaction closes that connection (SQLite may leave a transaction
//! active after a failed statement or COMMIT under `SQLITE_FULL`/`SQLITE_BUSY`, and sqlx's own
//! transaction bookkeeping can then disagree with SQLite's, turning the next `BEGIN` into a savepoint
//! that never commits), so a fresh connection serves the next write.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use backon::ExponentialBuilder;
use tracing::{error, info};

use super::{Store, StoreError, now_ms};
use crate::metrics::Metrics;

/// Longest time `/readyz`'s database probe may take; past it the database counts as locked.
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(800);

/// How long a probe's answer is reused while the database is failing (a probe stuck on a lock
/// occupies the writer connection until the busy timeout, so probes are not stacked).
const PROBE_REUSE: Duration = Duration::from_secs(1);

/// First delay of [`Store::write_backoff`].
const RETRY_MIN_DELAY: Duration = Duration::from_millis(100);

/// Added to `database.write_retry_max_delay`: how long no write may have failed before a success
/// clears a fault (see `Health::succeeded`).
const QUIET_MARGIN: Duration = Duration::from_secs(1);

/// The kind of a storage fault: the `kind` label of `vipwatch_store_write_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// `SQLITE_FULL`: the filesystem (or a size limit) has no room.
    Full,
    /// `SQLITE_IOERR`/`SQLITE_CANTOPEN` or an OS I/O error.
    Io,
    /// `SQLITE_BUSY`: another connection holds the write lock past the busy timeout.
    Busy,
    /// `SQLITE_LOCKED`: a conflict inside a shared cache.
    Locked,
    /// `SQLITE_READONLY`: the file or its directory cannot be written.
    ReadOnly,
    /// No connection within the pool's acquire timeout, or the probe took longer than [`PROBE_TIMEOUT`].
    Timeout,
    /// The leader's lease is over (PostgreSQL): its writes are refused until it stands down. Retried
    /// like the others (the write is not lost: the next leader makes it), but the database is not
    /// reported unwritable for it.
    Fenced,
    /// Any other database failure (corruption, a crashed connection worker, a failed migration).
    Other,
}

impl FaultKind {
    /// The metric label: `full`, `io`, `busy`, `locked`, `readonly`, `timeout`, `other`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Full => "full",
            Self::Io => "io",
            Self::Busy => "busy",
            Self::Locked => "locked",
            Self::ReadOnly => "readonly",
            Self::Timeout => "timeout",
            Self::Fenced => "fenced",
            Self::Other => "other",
        }
    }

    /// True for faults that clear by themselves (space freed, lock released): worth retrying.
    pub fn is_transient(self) -> bool {
        self != Self::Other
    }

    /// True for faults about the write lock, which a lock probe (`BEGIN IMMEDIATE`) can see clear.
    fn is_lock(self) -> bool {
        matches!(self, Self::Busy | Self::Locked | Self::Timeout)
    }
}

impl StoreError {
    /// The storage fault behind this error; `None` for errors that are not the storage's fault
    /// (a constraint violation, an undecodable row, a row not found).
    pub fn fault(&self) -> Option<FaultKind> {
        match self {
            Self::Shared(e) => e.fault(),
            Self::Sqlx(e) => sqlx_fault(e),
            Self::Open { source, .. } => source.fault().or(Some(FaultKind::Other)),
            Self::Json(_) => None,
            Self::Locked { .. } | Self::LockFile { .. } | Self::Migrate(_) => Some(FaultKind::Other),
            Self::Fenced { .. } => Some(FaultKind::Fenced),
            Self::AddressTaken(_) => None,
        }
    }

    /// True when retrying later may succeed ([`FaultKind::is_transient`]).
    pub fn is_transient(&self) -> bool {
        self.fault().is_some_and(FaultKind::is_transient)
    }

    /// True when an event id given by [`Store::prepare`] is already in the log: someone else wrote
    /// events since the writer read [`Store::next_event_id`] (the lock file rules that out; the writer
    /// then reads the next id again and prepares anew rather than retrying the same ids).
    pub fn is_event_id_taken(&self) -> bool {
        match self {
            Self::Shared(e) => e.is_event_id_taken(),
            Self::Sqlx(sqlx::Error::Database(e)) => {
                e.is_unique_violation() && (e.message().contains("events.id") || e.constraint() == Some("events_pkey"))
            }
            _ => false,
        }
    }

    /// True when the fence refused a leader's write: its term is over ([`StoreError::Fenced`]).
    pub fn is_fenced(&self) -> bool {
        match self {
            Self::Shared(e) => e.is_fenced(),
            other => matches!(other, Self::Fenced { .. }),
        }
    }

    /// True when the database refused to give a pool address and port to a second Service
    /// ([`StoreError::AddressTaken`]).
    pub fn is_address_taken(&self) -> bool {
        match self {
            Self::Shared(e) => e.is_address_taken(),
            other => matches!(other, Self::AddressTaken(_)),
        }
    }

    /// True when the connection failed rather than the database: the socket broke (an I/O error),
    /// or PostgreSQL ended the session (SQLSTATE class 08, `57P01`–`57P03`, `57P05`, and `25P03`,
    /// the idle-in-transaction limit). The pool replaces such a connection before it is used again
    /// (see `Store::open_postgres`), so one write that succeeds afterwards shows the database
    /// writable.
    pub fn is_connection_lost(&self) -> bool {
        match self {
            Self::Shared(e) => e.is_connection_lost(),
            Self::Sqlx(sqlx::Error::Io(_)) => true,
            Self::Sqlx(sqlx::Error::Database(db))
                if db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>().is_some() =>
            {
                let code = db.code();
                let code = code.as_deref().unwrap_or("");
                code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03" | "57P05" | "25P03")
            }
            _ => false,
        }
    }

    /// The underlying reason in a few words, e.g. SQLite's `database or disk is full`.
    pub fn reason(&self) -> String {
        match self {
            Self::Shared(e) => e.reason(),
            Self::Sqlx(sqlx::Error::Database(e)) => e.message().to_owned(),
            Self::Sqlx(sqlx::Error::PoolTimedOut) => "no database connection within the acquire timeout".to_owned(),
            Self::Sqlx(e) => e.to_string(),
            Self::Open { source, .. } => source.reason(),
            other => other.to_string(),
        }
    }
}

fn sqlx_fault(e: &sqlx::Error) -> Option<FaultKind> {
    match e {
        sqlx::Error::Database(db) if db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>().is_some() => {
            postgres_fault(db.code().as_deref().unwrap_or(""))
        }
        sqlx::Error::Database(db) => {
            let code: i32 = db.code().and_then(|c| c.parse().ok()).unwrap_or(0);
            // Primary result codes (the low byte of the extended code), from sqlite3.h.
            match code & 0xff {
                13 => Some(FaultKind::Full),
                10 | 14 => Some(FaultKind::Io),
                5 => Some(FaultKind::Busy),
                6 => Some(FaultKind::Locked),
                8 => Some(FaultKind::ReadOnly),
                19 | 20 | 25 => None,
                _ => Some(FaultKind::Other),
            }
        }
        sqlx::Error::PoolTimedOut => Some(FaultKind::Timeout),
        sqlx::Error::Io(_) => Some(FaultKind::Io),
        sqlx::Error::RowNotFound
        | sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnIndexOutOfBounds { .. }
        | sqlx::Error::TypeNotFound { .. }
        | sqlx::Error::Decode(_) => None,
        _ => Some(FaultKind::Other),
    }
}

/// The fault of a PostgreSQL error by its SQLSTATE (PostgreSQL manual, appendix A "Error Codes").
fn postgres_fault(sqlstate: &str) -> Option<FaultKind> {
    match sqlstate {
        "53100" => Some(FaultKind::Full),                     // disk_full
        "25006" => Some(FaultKind::ReadOnly),                 // read_only_sql_transaction (a standby)
        "55P03" => Some(FaultKind::Locked),                   // lock_not_available
        "40001" | "40P01" | "53300" => Some(FaultKind::Busy), // serialization, deadlock, too many connections
        "57014" => Some(FaultKind::Timeout),                  // query_canceled (statement_timeout)
        // connection, shutdown, system; a session the server ended for idling in a transaction
        s if s.starts_with("08") || s.starts_with("57P") || s.starts_with("58") || s == "25P03" => Some(FaultKind::Io),
        s if s.starts_with("23") || s.starts_with("22") => None, // constraint, data exception: not the storage's fault
        _ => Some(FaultKind::Other),
    }
}

/// Why the database cannot be written, as `/readyz` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unwritable {
    /// The fault.
    pub kind: FaultKind,
    /// SQLite's words, e.g. `database or disk is full`.
    pub reason: String,
    /// How long writes have been failing.
    pub since: Duration,
}

impl std::fmt::Display for Unwritable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "not writable: {} (since {} s)", self.reason, self.since.as_secs())
    }
}

#[derive(Debug)]
struct Failure {
    kind: FaultKind,
    reason: String,
    since: Instant,
    last: Instant,
    /// Whether a success clears it only after a quiet window (see `Health::succeeded`): false while
    /// every failure of this outage was a lost connection, which a new connection replaces.
    quiet: bool,
}

/// Shared write-health state of one [`Store`] (every clone shares it).
pub(super) struct Health {
    failure: Mutex<Option<Failure>>,
    metrics: OnceLock<Arc<Metrics>>,
    retry_max_delay: Mutex<Duration>,
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health").field("failure", &*self.failure()).finish_non_exhaustive()
    }
}

impl Default for Health {
    fn default() -> Self {
        Self {
            failure: Mutex::new(None),
            metrics: OnceLock::new(),
            retry_max_delay: Mutex::new(Duration::from_secs(5)),
        }
    }
}

impl Health {
    fn failure(&self) -> std::sync::MutexGuard<'_, Option<Failure>> {
        self.failure.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A write succeeded: the database is writable again — once no write has failed for the longest
    /// retry delay plus a second. A small write (a claim, the probe's one row) can succeed in the space a
    /// full disk still has while the bigger batches keep failing; every failing writer retries within
    /// `database.write_retry_max_delay`, so a quiet window that long means they succeed too. Without it
    /// readiness and `vipwatch_store_writable` flapped, and an alert on `== 0 for 1m` never fired.
    /// An outage of lost PostgreSQL connections only (a restart of the server, a session it ended)
    /// clears at the first success: that write went over a new connection, as every later one will.
    pub(super) fn succeeded(&self) {
        let quiet = *self.retry_max_delay.lock().unwrap_or_else(std::sync::PoisonError::into_inner) + QUIET_MARGIN;
        let mut failure = self.failure();
        if let Some(f) = failure.as_ref() {
            if f.quiet && f.last.elapsed() < quiet {
                return;
            }
            info!(after_s = f.since.elapsed().as_secs(), "database writable again");
            *failure = None;
        }
        drop(failure);
        if let Some(m) = self.metrics.get() {
            m.store_writable.set(1);
        }
    }

    /// A write on `backend` failed with `e`: counted; a transient fault marks the database
    /// unwritable. A lost PostgreSQL connection clears at the next success ([`Health::succeeded`]).
    pub(super) fn failed(&self, backend: super::Backend, e: &StoreError) {
        let lost = backend == super::Backend::Postgres && e.is_connection_lost();
        self.record_failure(e, !lost);
    }

    /// [`Health::failed`], `quiet`: whether a success clears it only after the quiet window
    /// ([`Health::succeeded`]).
    fn record_failure(&self, e: &StoreError, quiet: bool) {
        let Some(kind) = e.fault() else { return };
        if let Some(m) = self.metrics.get() {
            m.store_write_error(kind.as_str());
        }
        if kind.is_transient() && kind != FaultKind::Fenced {
            self.unwritable(kind, e.reason(), quiet);
        }
    }

    fn unwritable(&self, kind: FaultKind, reason: String, quiet: bool) {
        let now = Instant::now();
        let mut failure = self.failure();
        match failure.as_mut() {
            Some(f) => {
                (f.kind, f.reason, f.last) = (kind, reason, now);
                f.quiet |= quiet;
            }
            None => {
                error!(kind = kind.as_str(), %reason, "database not writable; writes are retried with backoff");
                *failure = Some(Failure { kind, reason, since: now, last: now, quiet });
            }
        }
        if let Some(m) = self.metrics.get() {
            m.store_writable.set(0);
        }
    }

    fn report(&self) -> Option<Unwritable> {
        self.failure().as_ref().map(|f| Unwritable { kind: f.kind, reason: f.reason.clone(), since: f.since.elapsed() })
    }
}

impl Store {
    /// Reports write faults to `metrics` (`vipwatch_store_write_errors_total`, `vipwatch_store_writable`)
    /// and makes [`Store::write_backoff`] wait at most `retry_max_delay` (`database.write_retry_max_delay`).
    pub fn monitored(self, metrics: Arc<Metrics>, retry_max_delay: Duration) -> Self {
        metrics.store_writable.set(i64::from(self.health.report().is_none()));
        let _ = self.health.metrics.set(metrics);
        *self.health.retry_max_delay.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = retry_max_delay;
        self
    }

    /// The backoff of every writer whose write failed: 100 ms doubling, never giving up, each wait at
    /// most `database.write_retry_max_delay` (default 5 s). backon's jitter adds up to the step itself,
    /// so the steps stop at half the maximum (stopping at the maximum, a wait could reach twice it).
    pub fn write_backoff(&self) -> ExponentialBuilder {
        let max = *self.health.retry_max_delay.lock().unwrap_or_else(std::sync::PoisonError::into_inner) / 2;
        ExponentialBuilder::default()
            .with_min_delay(RETRY_MIN_DELAY.min(max))
            .with_max_delay(max)
            .with_jitter()
            .without_max_times()
    }

    /// Why the database cannot be written, as last seen by a write or a probe; `None` when the last
    /// one succeeded. Never touches the database.
    pub fn unwritable(&self) -> Option<Unwritable> {
        self.health.report()
    }

    /// `/readyz`'s check: probes the database (at most [`PROBE_TIMEOUT`], never waiting on a lock
    /// longer) and returns why it cannot be written, or `None`. The probe takes the write lock
    /// (SQLite's `BEGIN IMMEDIATE`, rolled back; on PostgreSQL a transaction on the write
    /// connection); while a disk fault is reported it also writes one small row,
    /// so recovery is seen even when no other write runs.
    pub async fn check_writable(&self) -> Option<Unwritable> {
        let (write, recent) = match self.health.report() {
            Some(u) => {
                let last = self.health.failure().as_ref().map(|f| f.last.elapsed());
                (!u.kind.is_lock(), last.is_some_and(|l| l < PROBE_REUSE))
            }
            None => (false, false),
        };
        if recent {
            return self.health.report();
        }
        match tokio::time::timeout(PROBE_TIMEOUT, self.probe(write)).await {
            Ok(Ok(())) => {
                // A lock probe proves nothing about disk space: it clears lock faults only.
                let clears = write || self.health.report().is_none_or(|u| u.kind.is_lock());
                if clears {
                    self.health.succeeded();
                }
            }
            Ok(Err(e)) => self.failed(&e),
            Err(_) => {
                if let Some(m) = self.health.metrics.get() {
                    m.store_write_error(FaultKind::Timeout.as_str());
                }
                let reason =
                    format!("write lock not obtained within {} ms (database is locked)", PROBE_TIMEOUT.as_millis());
                self.health.unwritable(FaultKind::Timeout, reason, true);
            }
        }
        self.health.report()
    }

    /// `/readyz`'s database check on a PostgreSQL follower, which writes nothing of its own: one
    /// read on a read connection (at most [`PROBE_TIMEOUT`]; the pool replaces a connection the
    /// server ended). Returns why the database cannot be read, or `None`. Never looks at the write
    /// health: a writer's fault is not what a follower serves.
    pub async fn check_readable(&self) -> Option<String> {
        match tokio::time::timeout(PROBE_TIMEOUT, self.read_one(self.backend.query("SELECT 1"))).await {
            Ok(Ok(_)) => None,
            Ok(Err(e)) => Some(format!("not readable: {}", e.reason())),
            Err(_) => Some(format!("not readable: no answer within {} ms", PROBE_TIMEOUT.as_millis())),
        }
    }

    /// The probe: a transaction of the write connection's owner (`BEGIN IMMEDIATE` on SQLite, the
    /// guard on PostgreSQL: the order lock, and the fence on a leader's store) that writes one row
    /// when `write`, else nothing. Its outcome is recorded by the caller, once.
    async fn probe(&self, write: bool) -> Result<(), StoreError> {
        let backend = self.backend;
        self.transact_probe(super::owner::job(move |s| {
            Box::pin(async move {
                if write {
                    let sql = "INSERT INTO meta (key, value) VALUES ('write_probe', $1) \
                               ON CONFLICT (key) DO UPDATE SET value = excluded.value";
                    let tx = s.tx().await?;
                    backend.query(sql).bind(now_ms().to_string()).execute(tx.exec()).await?;
                }
                Ok(())
            })
        }))
        .await
    }

    /// Records the failed write `e` in the write health.
    fn failed(&self, e: &StoreError) {
        self.health.failed(self.backend, e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transient_kinds_are_the_storage_faults_and_other_is_not() {
        let kinds = [
            FaultKind::Full,
            FaultKind::Io,
            FaultKind::Busy,
            FaultKind::Locked,
            FaultKind::ReadOnly,
            FaultKind::Timeout,
        ];
        assert!(kinds.iter().all(|k| k.is_transient()));
        assert!(!FaultKind::Other.is_transient());
        let labels: Vec<_> = kinds.iter().map(|k| k.as_str()).collect();
        assert_eq!(labels, ["full", "io", "busy", "locked", "readonly", "timeout"]);
    }

    #[test]
    fn a_pool_timeout_is_a_timeout_and_a_missing_row_is_no_fault() {
        assert_eq!(StoreError::Sqlx(sqlx::Error::PoolTimedOut).fault(), Some(FaultKind::Timeout));
        assert_eq!(StoreError::Sqlx(sqlx::Error::RowNotFound).fault(), None);
        let io = std::io::Error::from_raw_os_error(28);
        assert_eq!(StoreError::Sqlx(sqlx::Error::Io(io)).fault(), Some(FaultKind::Io));
    }

    #[test]
    fn unwritable_reads_as_readyz_reports_it() {
        let u = Unwritable {
            kind: FaultKind::Full,
            reason: "database or disk is full".into(),
            since: Duration::from_millis(12_400),
        };
        assert_eq!(u.to_string(), "not writable: database or disk is full (since 12 s)");
    }

    #[test]
    fn a_success_clears_a_fault_only_after_a_quiet_window() {
        let health = Health::default();
        health.unwritable(FaultKind::Full, "database or disk is full".into(), true);
        health.succeeded();
        assert!(health.report().is_some(), "a small write right after a failed batch proves nothing");
        let past = Instant::now() - Duration::from_secs(7);
        health.failure().as_mut().unwrap().last = past;
        health.succeeded();
        assert!(health.report().is_none(), "no failure for 5 s + 1 s: writable again");
    }

    /// A PostgreSQL connection the server ended (or whose socket broke) is replaced by the pool: the
    /// first write that succeeds after it clears the fault. An outage that also had a disk fault
    /// keeps the quiet window.
    #[test]
    fn a_lost_connection_clears_at_the_next_success_unless_the_outage_had_another_fault() {
        let broken = StoreError::Sqlx(sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::BrokenPipe)));
        assert!(broken.is_connection_lost());
        assert!(!StoreError::Sqlx(sqlx::Error::PoolTimedOut).is_connection_lost());
        let health = Health::default();
        health.record_failure(&broken, false);
        assert_eq!(health.report().map(|u| u.kind), Some(FaultKind::Io));
        health.succeeded();
        assert_eq!(health.report(), None, "writable again at the first success");

        health.unwritable(FaultKind::Full, "could not extend file".into(), true);
        health.record_failure(&broken, false);
        health.succeeded();
        assert!(health.report().is_some(), "the disk fault of this outage keeps the quiet window");
    }

    /// The server ending a session left idle in a transaction (SQLSTATE 25P03) is a lost connection
    /// (`io`), retried like one, not `other`.
    #[test]
    fn a_session_ended_for_idling_in_a_transaction_is_an_io_fault() {
        assert_eq!(postgres_fault("25P03"), Some(FaultKind::Io));
        assert_eq!(postgres_fault("57P01"), Some(FaultKind::Io));
        assert_eq!(postgres_fault("23505"), None);
    }
}
