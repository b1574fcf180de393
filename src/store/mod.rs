//! The SQLite store: event log, current-state table, watch bookkeeping. Owns every SQL statement;
//! other modules call its typed methods. Schema under `migrations/`, applied at open.

mod deliveries;
mod error;
mod events;
mod open;
mod outbox;
mod progress;
mod state;

pub use deliveries::{AttemptRecord, AttemptRow, Completion, DeliveryFilter, DeliveryRow, Outcome, WebhookState};
pub use error::StoreError;
pub use events::{EventFilter, EventRow};
pub use outbox::{Claimed, NewDelivery, NoOutbox, Outbox, RecordedEvent};
pub use progress::{ProgressRow, WatchProgress};
pub use state::{ServiceRow, StateChange};

use sqlx::SqlitePool;

/// Handle on the SQLite database. Cheap to clone (a connection pool inside). Writers should be few:
/// SQLite has one writer at a time; the recorder batches its writes.
#[derive(Debug, Clone)]
pub struct Store {
    pool: SqlitePool,
}

/// Current time as Unix milliseconds (UTC), the unit of every `*_at` column.
pub fn now_ms() -> i64 {
    jiff::Timestamp::now().as_millisecond()
}
