//! Opening the database: a SQLite file (create if missing, WAL, pragmas) or a PostgreSQL database,
//! each with its own embedded migrations (`migrations/sqlite`, `migrations/postgres`).

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use sqlx::Connection as _;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use tracing::info;

use super::db::{Backend, Pools};
use super::{Store, StoreError};

/// Page size of a SQLite database this store creates, in bytes (SQLite's default is 4,096). A change
/// is an event row, a state row and a delivery row with their indexes, about 4 KB of JSON in all, and
/// every page a commit touched is written to the WAL whole: with 8 KiB pages a burst of changes is
/// delivered sooner than with 4 KiB; 16 KiB is faster still in a burst, but each small commit of a
/// steady rate then writes larger pages and the steady latency is worse (see
/// docs/explanation/design-decisions.md). Applies when the file is created: an existing database
/// keeps its page size until it is converted (docs/how-to/upgrades.md says how), and says so
/// in the log at start.
pub const PAGE_SIZE: u32 = 8192;

/// The page size of the SQLite file `options` open, in bytes: the file's own, or [`PAGE_SIZE`] for
/// one this connection creates (its first write, switching to WAL, fixes the size). Errors: whatever
/// opening the file or the pragma returns.
async fn page_size(options: &SqliteConnectOptions) -> Result<u32, sqlx::Error> {
    let mut probe = SqliteConnection::connect_with(options).await?;
    let size: i64 = sqlx::query_scalar("PRAGMA page_size").fetch_one(&mut probe).await?;
    probe.close().await?;
    // SQLite's page sizes are powers of two from 512 to 65,536.
    Ok(u32::try_from(size).unwrap_or(PAGE_SIZE))
}

/// Read connections per store.
const READ_CONNECTIONS: u32 = 4;

/// Page cache of each SQLite read connection, in KiB (SQLite's default is 2,000). A reader's cache
/// is dropped at its next transaction whenever another connection wrote meanwhile (WAL mode), which
/// under load is nearly always, so a large one buys little and costs resident memory (see
/// docs/explanation/design-decisions.md). The write connection keeps the default: its cache survives
/// its own commits.
const READ_CACHE_KIB: u32 = 256;

/// Prepared statements the write connection keeps (sqlx's default is 100). Each distinct text of a
/// transaction's script (`store::script`: the statements of a watch commit or a relay round sent as
/// one) is one entry, and a commit's text changes with its row counts, so at 100 the cache would keep
/// dozens of more or less rare ones, each costing resident memory; the texts of the steady state are
/// a few dozen, and an evicted one is prepared again when it recurs.
const WRITE_STATEMENTS: usize = 48;

/// How long opening PostgreSQL waits for the server, and each pool for a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a PostgreSQL session of vipwatch may keep what it locked once its process stops
/// answering (SIGSTOP, a frozen VM, a network partition: the server still sees the session open).
/// The leader's write transaction locks the lease row `FOR SHARE` and takes the advisory lock that
/// orders writes, and holds the row locks of what it writes (outbox, state): a follower's bid for
/// the lease waits for the first, the new leader's writes for the others. The server ends a
/// statement of the write connection after [`SessionLimits::statement`] (a wait for a lock
/// included) and any session left idle inside a transaction after
/// [`SessionLimits::idle_in_transaction`]; either way the transaction rolls back and every lock
/// goes. The lease's own statements have tighter limits (200 ms for a lock, 400 ms in all).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionLimits {
    /// `statement_timeout` of the write connection.
    pub statement: Duration,
    /// `idle_in_transaction_session_timeout` of every connection.
    pub idle_in_transaction: Duration,
}

impl SessionLimits {
    /// The limits for a lease of `ttl` renewed every `renew`: each half of `ttl - renew`. A leader
    /// that stops with a transaction open stopped at most `renew` after its last renewal, and the
    /// server ends that transaction at most `statement + idle_in_transaction = ttl - renew` after
    /// its last statement: no later than its lease expires (`ttl` after that renewal), when a
    /// follower may take the lease. So nothing the stopped leader held delays a takeover: a
    /// follower takes over within `ttl + renew` of the stop, as after a crash. The configuration's
    /// bounds (`ttl` at least 3 s and three `renew`) keep each limit at 1 s or more.
    pub fn for_lease(ttl: Duration, renew: Duration) -> Self {
        let half = ttl.saturating_sub(renew) / 2;
        Self { statement: half, idle_in_transaction: half }
    }
}

/// `d` as a PostgreSQL setting in whole milliseconds (at least 1: 0 would mean no limit).
fn millis(d: Duration) -> String {
    format!("{}ms", d.as_millis().max(1))
}

impl Store {
    /// Opens the database `config` names: PostgreSQL when `database.url` is set, else the SQLite file
    /// `database.path`. Errors: as [`Store::open`] and [`Store::open_postgres`].
    pub async fn connect(config: &crate::config::DatabaseConfig) -> Result<Self, StoreError> {
        match &config.url {
            Some(url) => {
                let limits = SessionLimits::for_lease(config.leader_ttl, config.leader_renew);
                Self::open_postgres_limited(url.expose(), limits).await
            }
            None => Self::open(&config.path).await,
        }
    }

    /// Connects to the PostgreSQL database at `url` (`postgres://user:password@host:port/db`, or a
    /// unix socket with `?host=/dir`) and applies the migrations embedded from
    /// `migrations/postgres` (sqlx holds an advisory lock meanwhile, so replicas starting together
    /// migrate once). Its sessions get the [`SessionLimits`] of the default lease (`leader_ttl` 15 s,
    /// `leader_renew` 2 s). Errors: [`StoreError::Open`] naming the URL without its password,
    /// wrapping why it cannot connect or migrate.
    pub async fn open_postgres(url: &str) -> Result<Self, StoreError> {
        let d = crate::config::DatabaseConfig::default();
        Self::open_postgres_limited(url, SessionLimits::for_lease(d.leader_ttl, d.leader_renew)).await
    }

    /// [`Store::open_postgres`] with the session limits `limits` (see [`SessionLimits`]).
    pub async fn open_postgres_limited(url: &str, limits: SessionLimits) -> Result<Self, StoreError> {
        Self::open_postgres_inner(url, limits)
            .await
            .map_err(|e| StoreError::Open { target: redact(url), source: Box::new(e) })
    }

    async fn open_postgres_inner(url: &str, limits: SessionLimits) -> Result<Self, StoreError> {
        // Every session: a transaction left idle (its process stopped, a partition) is ended by the
        // server, which releases its locks (see `SessionLimits`).
        let options = PgConnectOptions::from_str(url)?
            .application_name("vipwatch")
            .options([("idle_in_transaction_session_timeout", millis(limits.idle_in_transaction))]);
        // `test_before_acquire` (sqlx's default, stated here because the SQLite pools turn it off):
        // a connection the server ended while it sat in the pool (a restart, the idle limit above)
        // is found by a ping when it is taken, and replaced by a new one then, not handed to a
        // write or a read to fail on.
        let pool =
            |n| PgPoolOptions::new().max_connections(n).acquire_timeout(CONNECT_TIMEOUT).test_before_acquire(true);
        // One connection of its own first: a pool that cannot connect reports only "pool timed out
        // while waiting for an open connection", hiding why (refused, unknown database, password).
        let first = tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect_with(&options)).await;
        let first = first.map_err(|_| {
            let why = format!("the server did not answer within {} s", CONNECT_TIMEOUT.as_secs());
            sqlx::Error::Io(std::io::Error::new(std::io::ErrorKind::TimedOut, why))
        })??;
        // Migrations on this connection, without the writer's statement limit: a migration of a
        // large table may take longer, and it locks nothing a takeover waits for.
        let mut first = first;
        sqlx::migrate!("./migrations/postgres").run(&mut first).await?;
        let _ = first.close().await;
        // The writer's statements end within the statement limit, waits for a lock included.
        let write_options = options.clone().options([("statement_timeout", millis(limits.statement))]);
        let write = pool(1).connect_with(write_options).await?;
        // Reads hold no lock a writer or a takeover waits for, and the API's may be long (a page of
        // the event log, the VIP index's rebuild): no statement limit.
        let read = pool(READ_CONNECTIONS).connect_lazy_with(options.clone());
        // A bid or renewal gives up on a lock within 200 ms and on the statement within 400 ms,
        // server-side: one abandoned by the client's own timeout could otherwise still commit later,
        // a lease its replica never learns it holds.
        let lease_options = options
            .application_name("vipwatch-lease")
            .options([("lock_timeout", "200ms"), ("statement_timeout", "400ms")]);
        let lease = pool(1).connect_lazy_with(lease_options);
        let pools = Pools::Pg { read, write, lease };
        let log_id = log_id(Backend::Postgres, &pools).await?;
        Ok(Self::started(Backend::Postgres, pools, log_id))
    }

    /// Opens (creating if missing) the SQLite file at `path` in WAL mode with `synchronous=NORMAL`
    /// (durable across process crashes; a power loss may lose the last transactions) and a 5 s busy
    /// timeout, then applies the migrations embedded from `migrations/`.
    /// Errors: [`StoreError::Sqlx`] when the file cannot be opened, [`StoreError::Migrate`] when the
    /// schema cannot be brought up to date.
    pub async fn open(path: &Path) -> Result<Self, StoreError> {
        Self::open_inner(path)
            .await
            .map_err(|e| StoreError::Open { target: path.display().to_string(), source: Box::new(e) })
    }

    async fn open_inner(path: &Path) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::from_str("sqlite:")?
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(5))
            .foreign_keys(true)
            .page_size(PAGE_SIZE)
            .pragma("temp_store", "memory");
        let page_size = page_size(&options).await?;
        if page_size != PAGE_SIZE {
            info!(
                page_size,
                preferred = PAGE_SIZE,
                "this database keeps the page size it was created with; docs/how-to/upgrades.md (page size) says how to convert it"
            );
        }
        // The write connection leaves checkpoints to `Store::checkpoint_loop` (see store::checkpoint),
        // and cuts the WAL back to 16 MiB when it starts it over (a burst's WAL would keep its size).
        let autocheckpoint = (super::WRITER_AUTOCHECKPOINT_BYTES / page_size).to_string();
        let write_options = options
            .clone()
            .pragma("wal_autocheckpoint", autocheckpoint)
            .pragma("journal_size_limit", (16 << 20).to_string())
            .statement_cache_capacity(WRITE_STATEMENTS);
        // No ping before each acquire (sqlx's default): a SQLite connection is a file handle of this
        // process with nothing to test, and the ping is one more round trip to the connection's
        // thread per statement or transaction (see `store::script`). sqlx still pings a connection
        // as it goes back to the pool (its check after a cancelled statement). A connection a failed
        // write leaves unusable is closed by the store (`Store::settle`).
        let write =
            SqlitePoolOptions::new().max_connections(1).test_before_acquire(false).connect_with(write_options).await?;
        sqlx::migrate!("./migrations/sqlite").run(&write).await?;
        let read_options = options.pragma("cache_size", format!("-{READ_CACHE_KIB}"));
        let read = SqlitePoolOptions::new()
            .max_connections(READ_CONNECTIONS)
            .test_before_acquire(false)
            .connect_with(read_options)
            .await?;
        let pools = Pools::Lite { read, write };
        let log_id = log_id(Backend::Sqlite, &pools).await?;
        Ok(Self::started(Backend::Sqlite, pools, log_id))
    }

    /// A store on `pools` with its write connection's owner started ([`super::owner`]).
    fn started(backend: Backend, pools: Pools, log_id: std::sync::Arc<str>) -> Self {
        let health: std::sync::Arc<super::health::Health> = Default::default();
        let owner = super::owner::spawn(backend, pools.clone(), health.clone());
        let statistics = super::statistics::Refresher::new(backend, &pools);
        let commit_interval = super::DEFAULT_COMMIT_INTERVAL;
        Self { backend, pools, owner, commit_interval, log_id, health, fence: None, statistics }
    }

    /// The identity of this database's event log (`data.log_id` of every delivery): a UUID made
    /// when the database was created. Event ids compare only within one log.
    pub fn log_id(&self) -> &str {
        &self.log_id
    }

    /// The cluster name derived earlier and kept in this database, after keeping `derived` when none
    /// was (the first one kept wins: replicas deriving at once agree). `None` when none was kept and
    /// none is given. Errors: the database failed.
    pub async fn derived_cluster_name(&self, derived: Option<&str>) -> Result<Option<String>, StoreError> {
        let (backend, derived) = (self.backend, derived.map(str::to_owned));
        self.transact(super::owner::job(move |s| {
            Box::pin(async move {
                let tx = s.tx().await?;
                if let Some(name) = derived {
                    let insert =
                        "INSERT INTO meta (key, value) VALUES ('cluster_name', $1) ON CONFLICT (key) DO NOTHING";
                    backend.query(insert).bind(name).execute(tx.exec()).await?;
                }
                let row = backend.query("SELECT value FROM meta WHERE key = 'cluster_name'").fetch_optional(tx.exec());
                Ok(row.await?.map(|r| r.get::<String, _>(0)))
            })
        }))
        .await
    }

    /// Closes every connection (waits for running statements).
    pub async fn close(&self) {
        self.pools.close().await;
    }
}

/// Held while a `vipwatch serve` owns a SQLite database: an exclusive lock on `<database.path>.lock`
/// (`flock`, released by the OS when the process ends, even on `kill -9`). PostgreSQL needs none:
/// its replicas elect a leader ([`crate::leader`]).
#[derive(Debug)]
pub struct WriterLock {
    _file: std::fs::File,
}

impl WriterLock {
    /// Takes the lock for the database at `path` without waiting. Errors: [`StoreError::Locked`] when
    /// another process holds it, [`StoreError::LockFile`] when the lock file cannot be created.
    pub fn acquire(path: &Path) -> Result<Self, StoreError> {
        let mut name = path.as_os_str().to_owned();
        name.push(".lock");
        let lock = std::path::PathBuf::from(name);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock)
            .map_err(|source| StoreError::LockFile { path: lock.clone(), source })?;
        match file.try_lock() {
            Ok(()) => Ok(Self { _file: file }),
            Err(std::fs::TryLockError::WouldBlock) => Err(StoreError::Locked { path: path.to_owned(), lock }),
            Err(std::fs::TryLockError::Error(source)) => Err(StoreError::LockFile { path: lock, source }),
        }
    }
}

/// Reads the log id, making it first when the database is new: on the write connection, before its
/// owner starts.
async fn log_id(backend: Backend, pools: &Pools) -> Result<std::sync::Arc<str>, StoreError> {
    let fresh = uuid::Uuid::new_v4().to_string();
    let mut conn = pools.write().await?;
    let insert = "INSERT INTO meta (key, value) VALUES ('log_id', $1) ON CONFLICT (key) DO NOTHING";
    backend.query(insert).bind(fresh).execute(conn.exec()).await?;
    let row = backend.query("SELECT value FROM meta WHERE key = 'log_id'").fetch_one(conn.exec()).await?;
    Ok(row.get::<String, _>(0).into())
}

/// `url` for errors and logs: its password and query values redacted ([`crate::config::redact_url`]).
fn redact(url: &str) -> String {
    url::Url::parse(url).map_or_else(|_| "(unparsable database URL)".to_owned(), |u| crate::config::redact_url(&u))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use sqlx::Connection as _;
    use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection, SqliteJournalMode};

    use super::{PAGE_SIZE, SessionLimits, Store};
    use crate::store::db::Pools;

    /// `PRAGMA page_size` of the file at `path`.
    async fn page_size(path: &std::path::Path) -> i64 {
        let mut c = SqliteConnection::connect_with(&SqliteConnectOptions::new().filename(path)).await.unwrap();
        let size = sqlx::query_scalar("PRAGMA page_size").fetch_one(&mut c).await.unwrap();
        c.close().await.unwrap();
        size
    }

    /// `wal_autocheckpoint` (pages) of the store's write connection.
    async fn autocheckpoint(store: &Store) -> i64 {
        let Pools::Lite { write, .. } = &store.pools else { panic!("a SQLite store") };
        sqlx::query_scalar("PRAGMA wal_autocheckpoint").fetch_one(write).await.unwrap()
    }

    /// A database the store creates has [`PAGE_SIZE`] pages, and its writer checkpoints by itself past
    /// 64 MiB of WAL (8,192 pages of 8 KiB). One an earlier version created (WAL mode, migrated, SQLite's
    /// default 4 KiB pages) opens, keeps its page size and its records, and its writer's limit is the
    /// same 64 MiB (16,384 pages of 4 KiB).
    #[tokio::test]
    async fn a_new_database_gets_8_kib_pages_and_an_existing_one_keeps_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let new = dir.path().join("new.db");
        let store = Store::open(&new).await.unwrap();
        assert_eq!((PAGE_SIZE, autocheckpoint(&store).await), (8192, 8192));
        store.close().await;
        assert_eq!(page_size(&new).await, 8192);

        let old = dir.path().join("old.db");
        let options = SqliteConnectOptions::new()
            .filename(&old)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .page_size(4096);
        let mut c = SqliteConnection::connect_with(&options).await.unwrap();
        sqlx::migrate!("./migrations/sqlite").run(&mut c).await.unwrap();
        sqlx::query(
            "INSERT INTO events (observed_at, type, namespace, name, uid, resource_version, cause, view) \
                     VALUES (1, 'ADDED', 'shop', 'web', 'u1', '7', 'watch', '{}')",
        )
        .execute(&mut c)
        .await
        .unwrap();
        c.close().await.unwrap();
        let store = Store::open(&old).await.unwrap();
        assert_eq!((store.next_event_id().await.unwrap(), autocheckpoint(&store).await), (2, 16_384));
        store.close().await;
        assert_eq!(page_size(&old).await, 4096);
    }

    /// Each limit is half of TTL − renew: with the shortest lease the configuration accepts (3 s,
    /// renewed every 1 s) 1 s, with the defaults (15 s, 2 s) 6.5 s; their sum plus one renewal
    /// interval is the TTL, so a stopped leader's transaction is over when its lease expires.
    #[test]
    fn the_session_limits_end_a_stopped_leaders_transaction_by_the_time_its_lease_expires() {
        let (s, ms) = (Duration::from_secs, Duration::from_millis);
        assert_eq!(SessionLimits::for_lease(s(3), s(1)), SessionLimits { statement: s(1), idle_in_transaction: s(1) });
        assert_eq!(
            SessionLimits::for_lease(s(15), s(2)),
            SessionLimits { statement: ms(6_500), idle_in_transaction: ms(6_500) }
        );
        for (ttl, renew) in [(s(3), s(1)), (s(3), ms(100)), (s(15), s(2)), (s(300), s(60)), (s(300), ms(100))] {
            let l = SessionLimits::for_lease(ttl, renew);
            assert!(l.statement + l.idle_in_transaction + renew <= ttl, "{ttl:?}/{renew:?}");
            assert!(l.statement >= s(1) && l.idle_in_transaction >= s(1), "{ttl:?}/{renew:?}");
        }
    }
}
