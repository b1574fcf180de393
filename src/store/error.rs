//! The store's error type. Messages carry no source text of their own: callers print the source
//! chain (`{:#}` in `main`), so nothing is repeated.

use std::path::PathBuf;

/// A storage failure.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database cannot be opened, created or migrated.
    #[error("cannot open database {target}")]
    Open {
        /// The configured `database.path`, or `database.url` without its password.
        target: String,
        /// Why.
        #[source]
        source: Box<StoreError>,
    },
    /// Another `vipwatch serve` holds the database (SQLite has one writer; two recorders would record
    /// every change twice).
    #[error(
        "database {} is in use by another `vipwatch serve` (lock file {} is held); only one instance may serve a database",
        path.display(),
        lock.display()
    )]
    Locked {
        /// The database.
        path: PathBuf,
        /// The lock file.
        lock: PathBuf,
    },
    /// Another `vipwatch serve` serves this PostgreSQL database (it holds the advisory lock
    /// `store::POSTGRES_LOCK_KEY`). Until leader election lands, one instance serves a database.
    #[error(
        "database {target} is in use by another `vipwatch serve` (it holds the advisory lock); only one instance may serve a database"
    )]
    InUse {
        /// `database.url` without its password.
        target: String,
    },
    /// The lock file cannot be created.
    #[error("cannot create lock file {}", path.display())]
    LockFile {
        /// The lock file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Running a statement failed (I/O, lock timeout, constraint).
    #[error("database error")]
    Sqlx(#[from] sqlx::Error),
    /// A migration under `migrations/` failed or the database is newer than this binary.
    #[error("database migration failed")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A stored JSON document does not decode (corrupt row or incompatible version).
    #[error("stored JSON does not decode")]
    Json(#[from] serde_json::Error),
}
