//! The recorder's async shell: reads what the [`Recorder`] starts from out of the store
//! ([`Loaded::read`]), then feeds it from the observation channel, hands each batch to the [`Writer`]
//! and sets the gauges the recorder reports ([`Gauges`]). Everything decided is the index's; what is
//! here is waiting, batching and sending.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use tokio::sync::mpsc;
use vipwatch_contract::MemberState;

use super::super::stream::Observation;
use super::super::writer::{CHUNK_CHANGES_ALONE, Writer};
use super::{Batch, Gauges, Now, Recorder};
use crate::metrics::{MemberLabels, Metrics, NodeLabels};
use crate::model::backends::ObservedNode;
use crate::model::{ServiceKey, Tracked};
use crate::store::{HeldDeletion, Reservation, Store, StoreError};

/// Most observations folded into one batch (the choice: docs/explanation/design-decisions.md).
const MAX_BATCH: usize = 4096;

/// Most changes a (re)list accumulates before they go to the writer as a batch of their own: the
/// most one transaction of the writer stores. A large list planned whole would keep every change
/// (its boxed event, notices, the batch's vector) until the last was decided; in segments the writer
/// stores the first while the rest is decided, and only as many segments exist at once as the
/// writer's bounded queue takes. The list's progress and readiness go with the last segment, so a
/// crash in between re-lists and diffs the stored part as already recorded. So do its notices: sent
/// per segment, the bounded Kubernetes Event queue would drain between segments, and publishing the
/// extra Events would slow the initial sync of many Services (see
/// docs/explanation/design-decisions.md).
const LIST_SEGMENT: usize = CHUNK_CHANGES_ALONE;

/// What the recorder starts from: the store's tables as the last term left them.
#[derive(Debug, Default)]
pub struct Loaded {
    /// The current-state table.
    pub tracked: HashMap<ServiceKey, Tracked>,
    /// The deletions the mass-deletion guard held.
    pub held: Vec<HeldDeletion>,
    /// The addresses reserved for withdrawals not acknowledged yet, by event id.
    pub reservations: Vec<Reservation>,
    /// The uids of objects whose DELETED was recorded and whose cleanup is pending.
    pub announced: HashSet<String>,
    /// The Nodes stored (the `nodes` table).
    pub nodes: Vec<ObservedNode>,
}

impl Loaded {
    /// Reads the tables. Errors: [`StoreError`] when they cannot be read.
    pub async fn read(store: &Store) -> Result<Self, StoreError> {
        let tracked = store.load_tracked().await?;
        let held = store.held_deletions().await?;
        let reservations = store.reservations().await?;
        let announced = store.cleanups().await?.into_iter().map(|c| c.uid).collect();
        let nodes = store.nodes().await?;
        Ok(Self { tracked, held, reservations, announced, nodes })
    }
}

/// Consumes observations until every sender is gone: each batch of up to [`MAX_BATCH`] queued
/// observations (or the member recomputations that came due) is one step of `recorder`, sent to the
/// writer as one batch (or, for a large list, several: [`LIST_SEGMENT`]); a step that decided nothing
/// sends nothing. Planning the next batch overlaps with writing the previous one (the [`Writer`] runs
/// as its own task); writes stay in order. After each batch sent the gauges in `metrics` are set as
/// the recorder reports them: they show what is decided, which the writer may still be storing.
pub(in crate::watch) async fn run(
    mut recorder: Recorder,
    mut rx: mpsc::Receiver<Observation>,
    writer: Writer,
    metrics: Arc<Metrics>,
) {
    let (plans, writer) = writer.spawn();
    let mut gauges = GaugeSetter { metrics, last: None };
    let mut queued = Vec::with_capacity(MAX_BATCH);
    loop {
        let due = recorder.next_due();
        tokio::select! {
            received = rx.recv_many(&mut queued, MAX_BATCH) => if received == 0 { break },
            _ = tokio::time::sleep_until(due.unwrap_or_else(tokio::time::Instant::now)), if due.is_some() => {}
        }
        let Some(mut batch) = recorder.begin(&mut queued) else { continue };
        let mut now = Now::read();
        for observation in queued.drain(..) {
            let Observation::Listed { scope, objects, first } = observation else {
                recorder.observe(&mut batch, observation, now);
                continue;
            };
            let listing = recorder.begin_list(scope, &objects, first);
            for obs in objects {
                recorder.list_object(&mut batch, &listing, obs);
                if batch.changes.len() >= LIST_SEGMENT {
                    let segment = Batch { changes: std::mem::take(&mut batch.changes), ..Batch::default() };
                    // A writer that is gone is noticed by the next send below.
                    let _ = plans.send(segment).await;
                    gauges.set(recorder.gauges());
                    // Planning a large list keeps this task busy for long; yielding lets the runtime's one
                    // worker (`server.worker_threads`) run the writer, the relay and the API between segments.
                    tokio::task::yield_now().await;
                }
            }
            now = Now::read();
            recorder.end_list(&mut batch, listing, now);
        }
        recorder.finish(&mut batch, Now::read());
        if !batch.is_empty() && plans.send(batch).await.is_err() {
            break;
        }
        gauges.set(recorder.gauges());
    }
    drop(plans);
    let _ = writer.await;
}

/// Sets the recorder's gauges in the metrics, when they changed.
struct GaugeSetter {
    metrics: Arc<Metrics>,
    /// What was set last.
    last: Option<Gauges>,
}

impl GaugeSetter {
    fn set(&mut self, gauges: Gauges) {
        if self.last.as_ref() == Some(&gauges) {
            return;
        }
        let metrics = &self.metrics;
        metrics.services_in_scope.set(i64::try_from(gauges.services_in_scope).unwrap_or(i64::MAX));
        metrics.vips_in_use.set(i64::try_from(gauges.vips_in_use).unwrap_or(i64::MAX));
        for u in &gauges.pool_usage {
            metrics.pool_usage(&u.pool, u.in_use, u.free);
            metrics.pool_reserved(&u.pool, u.reserved);
        }
        for ((mode, state), n) in &gauges.members {
            let state = match state {
                MemberState::Active => "active",
                MemberState::Draining => "draining",
            };
            let labels = MemberLabels { mode: mode.as_str().to_owned(), state: state.to_owned() };
            metrics.backend_members.get_or_create(&labels).set(*n);
        }
        for (eligible, n) in [("true", gauges.nodes.0), ("false", gauges.nodes.1)] {
            let labels = NodeLabels { eligible: eligible.to_owned() };
            metrics.nodes.get_or_create(&labels).set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        metrics.deletions_held.set(i64::try_from(gauges.deletions_held).unwrap_or(i64::MAX));
        self.last = Some(gauges);
    }
}
