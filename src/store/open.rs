//! Opening the database: create if missing, WAL, pragmas, embedded migrations.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

use super::{Store, StoreError};

impl Store {
    /// Opens (creating if missing) the SQLite file at `path` in WAL mode with `synchronous=NORMAL`
    /// (durable across process crashes; a power loss may lose the last transactions) and a 5 s busy
    /// timeout, then applies the migrations embedded from `migrations/`.
    /// Errors: [`StoreError::Sqlx`] when the file cannot be opened, [`StoreError::Migrate`] when the
    /// schema cannot be brought up to date.
    pub async fn open(path: &Path) -> Result<Self, StoreError> {
        Self::open_inner(path).await.map_err(|e| StoreError::Open { path: path.to_owned(), source: Box::new(e) })
    }

    async fn open_inner(path: &Path) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::from_str("sqlite:")?
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(5))
            .foreign_keys(true)
            .pragma("temp_store", "memory");
        // The write connection leaves checkpoints to `Store::checkpoint_loop` (see store::checkpoint),
        // and cuts the WAL back to 16 MiB when it starts it over (a burst's WAL would keep its size).
        let autocheckpoint = super::WRITER_AUTOCHECKPOINT_PAGES.to_string();
        let write_options = options
            .clone()
            .pragma("wal_autocheckpoint", autocheckpoint)
            .pragma("journal_size_limit", (16 << 20).to_string());
        let write = SqlitePoolOptions::new().max_connections(1).connect_with(write_options).await?;
        sqlx::migrate!("./migrations").run(&write).await?;
        let log_id = log_id(&write).await?;
        let pool = SqlitePoolOptions::new().max_connections(4).connect_with(options).await?;
        Ok(Self { pool, write, turn: Default::default(), log_id, health: Default::default() })
    }

    /// The identity of this database's event log (`data.log_id` of every delivery): a UUID made
    /// when the database was created. Event ids compare only within one log.
    pub fn log_id(&self) -> &str {
        &self.log_id
    }

    /// Closes every connection (waits for running statements).
    pub async fn close(&self) {
        self.write.close().await;
        self.pool.close().await;
    }
}

/// Held while a `vipwatch serve` owns a database: an exclusive lock on `<database.path>.lock`
/// (`flock`, released by the OS when the process ends, even on `kill -9`).
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

/// Reads the log id, making it first when the database is new.
async fn log_id(write: &sqlx::SqlitePool) -> Result<std::sync::Arc<str>, sqlx::Error> {
    let fresh = uuid::Uuid::new_v4().to_string();
    sqlx::query("INSERT OR IGNORE INTO meta (key, value) VALUES ('log_id', ?)").bind(fresh).execute(write).await?;
    let id: String = sqlx::query_scalar("SELECT value FROM meta WHERE key = 'log_id'").fetch_one(write).await?;
    Ok(id.into())
}
