//! Routing: which webhook endpoints take a recorded change, and the exact body each gets. The
//! store's writer calls the [`Router`] (its [`crate::store::Outbox`]) inside the transaction that
//! records the change, so every delivery row is written with its event; a full resync
//! ([`resync`]) writes its rows from a snapshot of the state table the same way. Nothing here sends
//! anything: the relay reads the rows and delivers them.

mod full_state;
pub mod payload;
mod resync;
mod router;

pub use full_state::declaration;
pub use resync::{resync, resync_switched_modes};
pub use router::{Route, Router};

use crate::store::StoreError;

/// Errors of routing and of a resync.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    /// An endpoint's routing rules cannot be built (a label selector that does not parse; config
    /// validation refuses it first).
    #[error("webhook `{name}`: {reason}")]
    Endpoint {
        /// Endpoint name.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// `--webhook NAME` (or the API's `{name}`) names no configured, enabled endpoint.
    #[error("no enabled webhook named `{0}` in the configuration")]
    UnknownWebhook(String),
}
