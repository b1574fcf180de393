//! Planner statistics on PostgreSQL.
//!
//! The schema is created empty, and PostgreSQL plans a table it has never analysed as if it held a
//! row or two. Autovacuum analyses it only after a minute (`autovacuum_naptime`) and a tenth of its
//! rows changed, so through a first sync every statement would run on those guesses. The relay's
//! claim then tests "no older pending delivery of this Service" by reading every pending delivery of
//! the endpoint per candidate: with thousands pending, each claim is many times slower than once
//! analysed. SQLite needs none of this: its claim names its index (`INDEXED BY`).

use super::{Backend, Store, StoreError};

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
