//! What the recorder gives and takes besides observations: the [`Batch`] it fills (what to store and
//! what to report once stored), the [`Gauges`] it summarizes itself in, and the clock reading
//! ([`Now`]) every step is given.

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use tokio::time::Instant;
use vipwatch_contract::{BackendMode, MemberState};

use crate::ipam::PoolUsage;
use crate::model::{NOTICE_QUEUE, Notice};
use crate::store::{StateChange, WatchProgress};

/// The time a step of the recorder happens at, read by its caller: the recorder reads no clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    /// Monotonic: when member recomputations and deferred ADDEDs come due (`backends.window`,
    /// `backends.max_wait`).
    pub instant: Instant,
    /// Wall clock, Unix ms: when a deletion is held and whether `guard.confirm_after` passed since
    /// (stored in `held_deletions.held_at`, so it outlives the process).
    pub unix_ms: i64,
}

impl Now {
    /// Both clocks, now.
    pub fn read() -> Self {
        Self { instant: Instant::now(), unix_ms: crate::store::now_ms() }
    }
}

/// What one step of the recorder decided: the changes to store in order, the watch progress per
/// scope, and what to report once they are stored. Stored as one transaction, or several in order
/// (see the writer).
#[derive(Debug, Default)]
pub struct Batch {
    /// Events, state rows, Node rows and held deletions, in the order they were decided.
    pub changes: Vec<StateChange>,
    /// Per scope key: the resourceVersion to resume from and when it was last listed.
    pub progress: HashMap<String, WatchProgress>,
    /// Everything reported once the changes are stored.
    pub report: Report,
}

impl Batch {
    /// Whether there is nothing to store and nothing to report.
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty() && self.progress.is_empty() && self.report.is_empty()
    }

    /// Appends `later` (decided after this one): its changes follow ours, its progress is folded into
    /// ours per scope ([`WatchProgress::absorb`]), its report is appended.
    pub fn append(&mut self, later: Batch) {
        self.changes.extend(later.changes);
        for (scope, progress) in later.progress {
            match self.progress.entry(scope) {
                Entry::Occupied(mut e) => e.get_mut().absorb(progress),
                Entry::Vacant(e) => {
                    e.insert(progress);
                }
            }
        }
        self.report.append(later.report);
    }
}

/// What the writer reports once a batch is stored: readiness, Kubernetes Events, counters.
#[derive(Debug, Default)]
pub struct Report {
    /// Scopes whose first list this batch completes (readiness once every scope's is stored).
    pub first_lists: Vec<String>,
    /// Kubernetes Events to publish.
    pub notices: Notices,
    /// Mass-deletion guard trips, by cause (`startup`, `relist`): `vipwatch_deletion_guard_trips_total`.
    pub guard_trips: Vec<&'static str>,
    /// Held deletions let go, `(how, count)` with how = `api`, `confirmed`, `reappeared`:
    /// `vipwatch_held_deletions_released_total`.
    pub guard_releases: Vec<(&'static str, usize)>,
    /// Node and EndpointSlice changes folded into a member update already pending:
    /// `vipwatch_backend_changes_coalesced_total`.
    pub members_coalesced: u64,
    /// Member recomputations that found the members unchanged: `vipwatch_backend_noop_total`.
    pub members_unchanged: u64,
}

impl Report {
    /// Whether there is nothing to report.
    pub fn is_empty(&self) -> bool {
        // Destructured: a field added to the report must be counted here too.
        let Self { first_lists, notices, guard_trips, guard_releases, members_coalesced, members_unchanged } = self;
        first_lists.is_empty()
            && notices.kept.is_empty()
            && notices.dropped == 0
            && guard_trips.is_empty()
            && guard_releases.is_empty()
            && *members_coalesced == 0
            && *members_unchanged == 0
    }

    /// Appends `later` (decided after this one).
    pub fn append(&mut self, later: Report) {
        self.first_lists.extend(later.first_lists);
        self.notices.append(later.notices);
        self.guard_trips.extend(later.guard_trips);
        self.guard_releases.extend(later.guard_releases);
        self.members_coalesced += later.members_coalesced;
        self.members_unchanged += later.members_unchanged;
    }
}

/// Kubernetes Events to publish once their changes are stored: at most [`NOTICE_QUEUE`] kept (add
/// with [`Notices::note`]), the rest counted. More than the Event queue takes would be dropped when
/// sent anyway, and a first list of many Services without members makes one Warning each: keeping
/// them all until the list is stored would cost memory for nothing.
#[derive(Debug, Default)]
pub struct Notices {
    /// The Events kept, in the order they were decided.
    pub kept: Vec<Notice>,
    /// Events not kept because [`NOTICE_QUEUE`] were already.
    pub dropped: usize,
}

impl Notices {
    /// Adds Events, keeping at most [`NOTICE_QUEUE`]; the rest are counted in `dropped`.
    pub fn note(&mut self, notices: impl IntoIterator<Item = Notice>) {
        for notice in notices {
            if self.kept.len() < NOTICE_QUEUE {
                self.kept.push(notice);
            } else {
                self.dropped += 1;
            }
        }
    }

    /// Appends `later`'s Events and count, keeping at most [`NOTICE_QUEUE`].
    pub fn append(&mut self, later: Notices) {
        self.note(later.kept);
        self.dropped += later.dropped;
    }
}

/// The recorder's gauges after a step: what it tracks now. Read-only; its shell sets the metrics from
/// them after each step, as the step decided it (the writer may still be storing the batch).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Gauges {
    /// Tracked Services (rows of the current-state table): `vipwatch_services_in_scope`.
    pub services_in_scope: usize,
    /// Distinct VIPs of the tracked Services: `vipwatch_vips_in_use`.
    pub vips_in_use: usize,
    /// Every pool's usage, in config order: `vipwatch_pool_addresses_in_use`,
    /// `vipwatch_pool_addresses_free`, `vipwatch_pool_addresses_reserved`.
    pub pool_usage: Vec<PoolUsage>,
    /// Members over every tracked Service, per (mode, state): `vipwatch_backend_members`.
    pub members: Vec<((BackendMode, MemberState), i64)>,
    /// Known Nodes: `(eligible, not eligible)`: `vipwatch_nodes`.
    pub nodes: (usize, usize),
    /// Deletions the mass-deletion guard holds: `vipwatch_deletions_held`.
    pub deletions_held: usize,
}
