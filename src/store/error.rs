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
    /// This replica's lease ended (another replica leads now, or it expired): the fence refused the
    /// leader's write and nothing of it was committed; or the write failed after the term's leader deadline
    /// ran out (what it committed, if anything, came before the next leader's first write: the
    /// fence orders them). Either way the term's writes are over; the next leader makes them.
    #[error("not the leader any more (lease epoch {epoch} is over)")]
    Fenced {
        /// The epoch this replica led with.
        epoch: i64,
    },
    /// A write would give a pool address and port to a second Service: the database refused it
    /// (`vip_addresses`), and nothing of the transaction was committed.
    #[error("refused: a pool address and port would belong to two Services ({0})")]
    AddressTaken(String),
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
    /// The transaction that carried this write, with other writes of this process, failed as a
    /// whole (a full disk, an I/O error, a failed commit): nothing of it was committed. The error is
    /// that transaction's, shared by every write it carried ([`StoreError::fault`] and the other
    /// questions answer for it).
    #[error(transparent)]
    Shared(std::sync::Arc<StoreError>),
}
