//! The store's error type.

/// A storage failure.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Opening the file or running a statement failed (I/O, lock timeout, constraint).
    #[error("database error: {0}")]
    Sqlx(#[from] sqlx::Error),
    /// A migration under `migrations/` failed or the database is newer than this binary.
    #[error("database migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A stored JSON document does not decode (corrupt row or incompatible version).
    #[error("stored JSON does not decode: {0}")]
    Json(#[from] serde_json::Error),
}
