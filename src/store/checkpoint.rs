//! Moving the write-ahead log back into the database file off the write path.
//!
//! SQLite checkpoints by itself at the commit that takes the WAL past `wal_autocheckpoint` pages
//! (1,000 by default), inside that commit: during a burst the one write connection would spend much
//! of its time copying pages into the database file while the watch and the relay wait for it.
//! vipwatch's write connection checkpoints only past [`WRITER_AUTOCHECKPOINT_BYTES`] (a safety net),
//! and [`Store::checkpoint`] runs a `PASSIVE` checkpoint on a read connection every
//! [`CHECKPOINT_INTERVAL`]: it runs beside the writer (WAL mode lets one checkpointer, readers and the
//! writer work at once) and never waits for a lock.

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{Store, StoreError};

/// WAL size after which the write connection checkpoints by itself, in bytes (64 MiB): reached only
/// when the background checkpoints fail or cannot keep up. Set as `wal_autocheckpoint`, which counts
/// pages, so divided by the database's page size (8 KiB for a new one, 4 KiB for one an earlier
/// version created: `store::open`).
pub const WRITER_AUTOCHECKPOINT_BYTES: u32 = 64 << 20;

/// Time between two background checkpoints. A checkpoint copies each page once (its newest version),
/// so a longer interval copies pages rewritten by many transactions fewer times: at 1 s vipwatch
/// writes a few per cent fewer bytes, but each checkpoint takes longer and the steady latency is
/// worse (see docs/explanation/design-decisions.md).
pub const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(250);

/// What one checkpoint did (the three numbers `PRAGMA wal_checkpoint` returns).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checkpointed {
    /// Whether a lock held it back (never waits, so this only says "try again later").
    pub busy: bool,
    /// Frames in the WAL.
    pub wal_frames: i64,
    /// Frames copied into the database file so far (all of them = the WAL can start over).
    pub checkpointed_frames: i64,
}

impl Store {
    /// One `PASSIVE` checkpoint on a read connection: copies what the WAL holds into the database file
    /// as far as no reader still needs it, without blocking the writer. Errors: [`StoreError`] (a full
    /// disk, an I/O error); nothing is lost then, the WAL keeps the pages. On PostgreSQL, which
    /// checkpoints by itself, nothing to do: all zero.
    pub async fn checkpoint(&self) -> Result<Checkpointed, StoreError> {
        if self.backend == super::Backend::Postgres {
            return Ok(Checkpointed { busy: false, wal_frames: 0, checkpointed_frames: 0 });
        }
        let row = self.read_one(self.backend.query("PRAGMA wal_checkpoint(PASSIVE)")).await?;
        Ok(Checkpointed { busy: row.get::<i64, _>(0) != 0, wal_frames: row.get(1), checkpointed_frames: row.get(2) })
    }

    /// Checkpoints every [`CHECKPOINT_INTERVAL`] until `cancel`. A failure is logged once (warning)
    /// and its end once (info); the write connection's own checkpoint stays as the fallback. Returns
    /// at once on PostgreSQL.
    pub async fn checkpoint_loop(self, cancel: CancellationToken) {
        if self.backend == super::Backend::Postgres {
            return;
        }
        let mut tick = tokio::time::interval(CHECKPOINT_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            match self.checkpoint().await {
                Ok(_) if std::mem::take(&mut failing) => info!("WAL checkpoints work again"),
                Ok(_) => {}
                Err(e) if !failing => {
                    failing = true;
                    warn!(error = %e, reason = %e.reason(), "cannot checkpoint the WAL; retrying (the writer checkpoints past 64 MiB)");
                }
                Err(_) => {}
            }
        }
    }
}
