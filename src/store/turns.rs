//! Turns on the write connection. In-process writers take it in the order they asked (a fair FIFO
//! lock in front of the one-connection pool), and a writer can see whether anyone else used it or
//! waits for it: the watch's writer sizes its transactions by that (src/watch/writer.rs).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use tokio::sync::{Mutex, OwnedMutexGuard};

/// The turn lock and what it has seen.
#[derive(Debug, Default)]
pub(super) struct Turns {
    lock: Arc<Mutex<()>>,
    /// Writers that asked for a turn and have not ended it (waiting or writing).
    in_line: AtomicUsize,
    /// Turns given so far.
    given: AtomicU64,
}

/// One writer's place in line, from asking until its turn ends (dropped).
struct Ticket(Arc<Turns>);

impl Drop for Ticket {
    fn drop(&mut self) {
        self.0.in_line.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A turn on the write connection; the next writer in line gets it when this is dropped.
pub(super) struct Turn {
    _guard: OwnedMutexGuard<()>,
    _ticket: Ticket,
}

impl Turns {
    /// Waits for this writer's turn (FIFO). Cancel-safe: a writer dropped while waiting leaves the
    /// line.
    pub(super) async fn take(self: &Arc<Self>) -> Turn {
        self.in_line.fetch_add(1, Ordering::Relaxed);
        let ticket = Ticket(self.clone());
        let guard = self.lock.clone().lock_owned().await;
        self.given.fetch_add(1, Ordering::Relaxed);
        Turn { _guard: guard, _ticket: ticket }
    }

    /// Turns given so far: a mark to compare with later ([`Turns::shared_since`]).
    pub(super) fn mark(&self) -> u64 {
        self.given.load(Ordering::Relaxed)
    }

    /// Writers in line now, the one writing included (tests).
    #[cfg(test)]
    pub(super) fn in_line(&self) -> usize {
        self.in_line.load(Ordering::Relaxed)
    }

    /// Whether a turn was given since `mark` or a writer is in line now. Asked by a writer outside its
    /// own turn, with the mark taken before it asked for its last turn plus one (its own): `true`
    /// means someone else used or wants the connection too.
    pub(super) fn shared_since(&self, mark: u64) -> bool {
        self.mark() != mark || self.in_line.load(Ordering::Relaxed) > 0
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::Turns;

    /// A writer alone sees the connection unshared after its own turn; a turn taken by another
    /// writer, or another writer waiting or writing, shows until the next mark.
    #[tokio::test]
    async fn a_writer_sees_whether_anyone_else_took_or_waits_for_a_turn() {
        let turns = Arc::new(Turns::default());
        drop(turns.take().await);
        let mark = turns.mark();
        assert_eq!((mark, turns.shared_since(mark)), (1, false));

        drop(turns.take().await);
        assert!(turns.shared_since(mark));
        let mark = turns.mark();
        assert!(!turns.shared_since(mark));

        let held = turns.take().await;
        let mark = turns.mark();
        assert!(turns.shared_since(mark), "a writer holding its turn is in line");
        let waiting = tokio::spawn({
            let turns = turns.clone();
            async move { drop(turns.take().await) }
        });
        drop(held);
        waiting.await.unwrap();
        assert_eq!((turns.mark(), turns.shared_since(turns.mark())), (4, false));
    }

    /// A writer dropped while it waits leaves the line.
    #[tokio::test]
    async fn a_writer_that_stops_waiting_leaves_the_line() {
        let turns = Arc::new(Turns::default());
        let held = turns.take().await;
        let mark = turns.mark();
        let waiting = turns.take();
        let gave_up = tokio::time::timeout(std::time::Duration::from_millis(1), waiting).await;
        assert!(gave_up.is_err());
        drop(held);
        assert_eq!((turns.mark(), turns.shared_since(mark)), (1, false));
    }
}
