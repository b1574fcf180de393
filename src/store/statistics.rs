//! Planner statistics on PostgreSQL.
//!
//! The schema is created empty, and PostgreSQL plans a table it has never analysed as if it held a
//! row or two. Autovacuum analyses it only after a minute (`autovacuum_naptime`) and a tenth of its
//! rows changed, so through a first sync every statement would run on those guesses. The relay's
//! claim then tests "no older pending delivery of this Service" by reading every pending delivery of
//! the endpoint per candidate: with thousands pending, each claim is many times slower than once
//! analysed, and it holds the write connection the watch's writer needs meanwhile. The store
//! therefore analyses the tables a first sync fills each time the rows it wrote since the last time
//! reach what they held then ([`Growth`]): a few times while a table grows from empty, with the
//! statistics never more than twice off, and then about never. SQLite needs none of this: its claim
//! names its index (`INDEXED BY`).

use std::sync::{Arc, Mutex};

use super::db::Pools;
use super::{Backend, Store, StoreError};

/// Rows written before the first refresh: below this the guesses for a nearly empty table cost
/// nothing noticeable.
pub(super) const GROWTH_MIN: u64 = 1_000;

/// The tables a sync fills and the relay's hot statements plan on.
const GROWING_TABLES: &str = "ANALYZE deliveries, events, services";

/// When the rows written call for fresh statistics: the pure part of [`Refresher`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Growth {
    /// Rows written up to the last refresh that finished.
    analysed: u64,
    /// Rows written since then.
    since: u64,
    /// A refresh runs now.
    running: bool,
}

impl Growth {
    /// Notes `rows` more rows written. True when a refresh is to start now: none runs, and the rows
    /// written since the last one reach [`GROWTH_MIN`] and what had been written before it.
    pub(super) fn wrote(&mut self, rows: u64) -> bool {
        self.since += rows;
        if self.running || self.since < self.analysed.max(GROWTH_MIN) {
            return false;
        }
        self.running = true;
        true
    }

    /// The refresh [`Growth::wrote`] started ended (`ok`: it finished; else the same rows call for
    /// the next try at the next write).
    pub(super) fn refreshed(&mut self, ok: bool) {
        self.running = false;
        if ok {
            self.analysed += std::mem::take(&mut self.since);
        }
    }
}

/// Refreshes PostgreSQL's statistics as a store's tables grow ([`Growth`]); the ANALYZE runs on a
/// read connection, beside the writes.
#[derive(Debug)]
pub(super) struct Refresher {
    growth: Mutex<Growth>,
    pools: Pools,
}

impl Refresher {
    /// A refresher for a PostgreSQL store's `pools`; `None` on SQLite.
    pub(super) fn new(backend: Backend, pools: &Pools) -> Option<Arc<Self>> {
        (backend == Backend::Postgres).then(|| Arc::new(Self { growth: Mutex::default(), pools: pools.clone() }))
    }

    /// Notes `rows` written in a committed transaction; starts a refresh in the background when due.
    pub(super) fn wrote(self: &Arc<Self>, rows: u64) {
        if !self.growth.lock().unwrap_or_else(|p| p.into_inner()).wrote(rows) {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let result = async {
                let mut conn = this.pools.read().await?;
                Backend::Postgres.query(GROWING_TABLES).execute(conn.exec()).await
            }
            .await;
            match &result {
                Ok(_) => {
                    tracing::debug!(elapsed = ?started.elapsed(), "planner statistics refreshed as the tables grew")
                }
                Err(e) => {
                    tracing::warn!(error = %e, "refreshing the planner's statistics failed; tried again after the next write")
                }
            }
            this.growth.lock().unwrap_or_else(|p| p.into_inner()).refreshed(result.is_ok());
        });
    }
}

impl Store {
    /// Refreshes the planner's statistics of every table (`ANALYZE`) on PostgreSQL; nothing on
    /// SQLite. Called once the first full list of a term is stored, when the tables hold what they
    /// will hold. Reads a sample of each table (30,000 rows at most by default) on a read
    /// connection and writes no data, so it needs no fence. Errors: [`StoreError`] from the
    /// database.
    pub async fn refresh_statistics(&self) -> Result<(), StoreError> {
        if self.backend == Backend::Postgres {
            self.backend.query("ANALYZE").execute(self.pools.read().await?.exec()).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statistics_are_refreshed_each_time_the_rows_written_double_and_one_at_a_time() {
        let mut g = Growth::default();
        assert!(!g.wrote(GROWTH_MIN - 1), "below the minimum");
        assert!(g.wrote(1), "the minimum reached");
        assert!(!g.wrote(5_000), "one refresh at a time");
        g.refreshed(true);
        assert_eq!(g, Growth { analysed: 6_000, since: 0, running: false });
        assert!(!g.wrote(5_999), "not yet twice what was analysed");
        assert!(g.wrote(1));
        g.refreshed(false);
        assert_eq!(g, Growth { analysed: 6_000, since: 6_000, running: false }, "a failed refresh keeps its rows due");
        assert!(g.wrote(0), "tried again at the next write");
        g.refreshed(true);
        assert_eq!(g, Growth { analysed: 12_000, since: 0, running: false });
    }
}
