//! The circuit breakers' state as each endpoint's dispatcher last published it, for the API to read.
//! Kept in the leader's memory, not in the database: a follower shows every circuit `closed`, and a
//! restart starts closed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The breaker's state, as the API shows it (`closed`, `open`, `half_open`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CircuitState {
    /// Deliveries go out as usual (up to the endpoint's concurrency).
    #[default]
    Closed,
    /// Nothing goes out until `next_probe_at`; then one probe.
    Open,
    /// The probe is in flight; nothing else goes out.
    HalfOpen,
}

impl CircuitState {
    /// `closed`, `open` or `half_open`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::Open => "open",
            Self::HalfOpen => "half_open",
        }
    }
}

/// A snapshot of one endpoint's breaker for the API. Times are Unix milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CircuitView {
    /// Current state.
    pub state: CircuitState,
    /// Attempts in a row that said the endpoint is down (reset by any answer that says it is up).
    pub consecutive_failures: u32,
    /// When the circuit opened (`None` while closed).
    pub open_since: Option<i64>,
    /// When the next probe may go out (`None` while closed or while the probe is in flight).
    pub next_probe_at: Option<i64>,
    /// Until when the endpoint asked not to be sent anything (a 429 or 503 with `Retry-After`): no
    /// attempt to it starts before then. `None` when it never asked; a time in the past once over.
    pub throttled_until: Option<i64>,
}

/// Every endpoint's breaker view, by endpoint name: written by the dispatchers, read by the API.
/// Cheap to clone (shared). An endpoint without a running dispatcher reads as closed.
#[derive(Debug, Clone, Default)]
pub struct Circuits(Arc<Mutex<HashMap<String, CircuitView>>>);

impl Circuits {
    /// The view of endpoint `name` (closed with no failures when unknown).
    pub fn get(&self, name: &str) -> CircuitView {
        self.0.lock().map(|m| m.get(name).copied().unwrap_or_default()).unwrap_or_default()
    }

    /// Publishes endpoint `name`'s view (the endpoint's dispatcher calls it on every change).
    pub fn set(&self, name: &str, view: CircuitView) {
        if let Ok(mut m) = self.0.lock() {
            m.insert(name.to_owned(), view);
        }
    }
}
