//! The writer: the single writer of the event log and current-state table. Paces the recorder's plans
//! into group commits ([`crate::store::Pacing`]), prepares each chunk and hands it to the store's
//! owner of the write connection, retried with backoff until it commits (the recorder's mirror
//! already reflects it, so giving up would lose events), then reports it: counters, Kubernetes
//! Events, readiness and the commit signal. The recorder's shell sets the gauges.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, Retryable};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tracing::{debug, error, info, warn};

use super::recorder::Batch;
use super::stream::ScopeSpec;
use crate::metrics::Metrics;
use crate::model::Notice;
use crate::store::{Chunk, Outbox, Prepared, Recorded, StateChange, Store, StoreError, WatchProgress};

/// How many planned batches may wait for the writer (the recorder plans ahead by this much).
const QUEUED_PLANS: usize = 2;

/// Most changes per transaction while other writes share the write connection. A plan with more (a
/// first list of many Services, a burst) is committed as several transactions in order, so the
/// relay's claims and completions, which share the one write connection, wait for one chunk rather
/// than for the whole plan; the `committed` signal is pulsed after each chunk, so
/// deliveries start while the rest is written. The watch progress (resourceVersion) goes with the
/// last chunk: a crash between chunks resumes from the previous resourceVersion and the re-seen
/// changes diff as already recorded.
const CHUNK_CHANGES: usize = 128;

/// Most changes per transaction while the watch's writer has the write connection to itself (its
/// last transaction carried no other write and none waited when it ended: [`Recorded::shared`]) and
/// the last transaction that recorded events enqueued no delivery for them: a guess that the next
/// ones will not either, which is right while no endpoint subscribes to these Services. With an
/// endpoint subscribed the relay claims after every commit, and the writer stays at
/// [`CHUNK_CHANGES`].
///
/// Each commit has a cost of its own (the pages it touched go into the WAL once per commit;
/// statements are bound and stepped per chunk), so larger chunks store changes faster. But the larger
/// size whenever the connection is free raises peak RSS in a burst (the bigger transactions' rows and
/// payloads at once), and the larger size always delays deliveries, as the relay's rounds wait for
/// the longer transactions (the trade-off: docs/explanation/design-decisions.md). On PostgreSQL the
/// same rule applies, and the writes it sees are this process's only (another replica does not
/// write: only the leader does).
pub(super) const CHUNK_CHANGES_ALONE: usize = 512;

/// What the writer takes: one batch of the recorder, what to store and what to report once it is
/// stored. Plans sent together are stored together ([`Batch::append`]).
pub(super) type Plan = Batch;

/// Takes the plans that arrive before `due` into `plan`, until it has [`CHUNK_CHANGES`] changes
/// or the recorder is gone. Receiving them while it waits, rather than only once `due` passed, keeps
/// the recorder from blocking on the [`QUEUED_PLANS`] plans already waiting: what it kept back then
/// would miss this commit and wait for the next, so a change would wait up to two intervals instead
/// of at most one.
async fn gather_until(rx: &mut mpsc::Receiver<Plan>, plan: &mut Plan, due: tokio::time::Instant) {
    let deadline = tokio::time::sleep_until(due);
    tokio::pin!(deadline);
    while plan.changes.len() < CHUNK_CHANGES {
        tokio::select! {
            // A plan already waiting is taken even when `due` passed too.
            biased;
            more = rx.recv() => match more {
                Some(more) => plan.append(more),
                None => return,
            },
            _ = &mut deadline => return,
        }
    }
}

/// Changes from which a chunk is prepared off the runtime's worker ([`off_the_worker`]).
const OFFLOAD_CHANGES: usize = 32;

/// Runs `work` (preparing a chunk of `changes` changes: each event's JSON, its routed and rendered
/// deliveries) in place, or, from [`OFFLOAD_CHANGES`] changes on a multi-thread runtime, through
/// [`tokio::task::block_in_place`]: this thread goes on preparing while another takes over the
/// worker's other tasks (the watch's parsing, the recorder, the relay). With one worker
/// (`server.worker_threads`), a sustained high rate of changes otherwise queues all of that behind
/// the writer's preparation on one core. The few changes of a commit at a moderate rate stay in
/// place, where handing the worker over would cost more wake-ups than it saves.
fn off_the_worker<T>(changes: usize, work: impl FnOnce() -> T) -> T {
    if changes >= OFFLOAD_CHANGES && multi_thread() { tokio::task::block_in_place(work) } else { work() }
}

/// Whether this runs on a multi-thread tokio runtime (where [`tokio::task::block_in_place`] may be
/// used).
fn multi_thread() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

/// The next chunk of `rest`, at most `size` changes, carrying `progress` if it is the last (the watch
/// progress goes with a plan's last chunk: see [`Writer::commit`]).
fn take_chunk(rest: &mut std::vec::IntoIter<StateChange>, size: usize, progress: &[WatchProgress]) -> Chunk {
    let changes: Vec<StateChange> = rest.by_ref().take(size).collect();
    let progress = if rest.len() == 0 { progress.to_vec() } else { Vec::new() };
    Chunk { changes, progress }
}

/// A chunk on its way to the store: prepared (with the ids it was prepared for), or not yet.
#[expect(clippy::large_enum_variant, reason = "one at a time, held on the stack: boxing would only add an allocation")]
enum Pending {
    Prepared(Prepared),
    Chunk(Chunk),
}

/// How the writer is wired to the rest of the process: what it reports (metrics, readiness, each
/// commit, Kubernetes Events to publish) and the term it writes in.
#[derive(Clone)]
pub struct WriterWiring {
    /// Every metric.
    pub metrics: Arc<Metrics>,
    /// Set to `true` once the first full list of every scope is stored.
    pub ready: watch::Sender<bool>,
    /// The highest event id committed so far (0 before the first); the relay wakes on it.
    pub committed: watch::Sender<i64>,
    /// Kubernetes Events to publish, sent after their change committed. Full = dropped (logged): the
    /// watch never waits for Event writes.
    pub notices: mpsc::Sender<Notice>,
    /// The leader term (on SQLite: the process) this watch runs in. A write that fails is retried
    /// until it commits, but not once this is cancelled; the writer cancels it itself when the
    /// database refuses a write for good (see [`Writer::commit`]).
    pub term: tokio_util::sync::CancellationToken,
    /// Why the writer ended the term, when it did (the database refused a batch for good): the watch
    /// then ends with [`super::WatchError::Refused`], so the process (on SQLite) exits non-zero and a
    /// supervisor restarts it, rather than stopping as if asked to.
    pub refused: Arc<std::sync::OnceLock<String>>,
}

pub(super) struct Writer {
    store: Store,
    outbox: Arc<dyn Outbox>,
    wiring: WriterWiring,
    awaiting_first_list: HashSet<String>,
    /// The id the next event gets (`None`: read it from the store first).
    next_id: Option<i64>,
    /// Whether this writer's last transaction carried other writes, or others waited when it ended
    /// ([`Recorded::shared`]; `true` before the first).
    shared: bool,
    /// Whether this writer's last write that recorded events enqueued deliveries (`true` before
    /// the first).
    routed: bool,
}

impl Writer {
    pub fn new(store: Store, outbox: Arc<dyn Outbox>, scopes: &[ScopeSpec], wiring: WriterWiring) -> Self {
        Self::starting(store, outbox, wiring, scopes.iter().map(ScopeSpec::key).collect())
    }

    /// A writer that has written nothing yet: the next id is read from the store, and the first
    /// transaction is [`CHUNK_CHANGES`] (`routed` until one recorded events without deliveries).
    fn starting(
        store: Store,
        outbox: Arc<dyn Outbox>,
        wiring: WriterWiring,
        awaiting_first_list: HashSet<String>,
    ) -> Self {
        Self { store, outbox, wiring, awaiting_first_list, next_id: None, shared: true, routed: true }
    }

    /// Starts the writer task; returns where to send plans and the task handle.
    pub fn spawn(&self) -> (mpsc::Sender<Plan>, JoinHandle<()>) {
        let (tx, mut rx) = mpsc::channel::<Plan>(QUEUED_PLANS);
        let mut writer = Writer::starting(
            self.store.clone(),
            self.outbox.clone(),
            self.wiring.clone(),
            self.awaiting_first_list.clone(),
        );
        let task = tokio::spawn(async move {
            let mut last = tokio::time::Instant::now();
            while let Some(mut plan) = rx.recv().await {
                // The group commit: see [`crate::store::Pacing`].
                let now = tokio::time::Instant::now();
                let due = writer.store.pacing().due(last, now);
                let gathered = plan.changes.len() < CHUNK_CHANGES && now < due;
                if gathered {
                    // The relay's rounds sent meanwhile wait for this commit rather than go alone.
                    writer.store.expect_record(Some(due));
                    gather_until(&mut rx, &mut plan, due).await;
                }
                while let Ok(more) = rx.try_recv() {
                    plan.append(more);
                }
                last = tokio::time::Instant::now();
                writer.commit(plan).await;
                if gathered {
                    // Its Record took the expectation back, unless none was sent.
                    writer.store.expect_record(None);
                }
            }
        });
        (tx, task)
    }

    /// Writes the plan in transactions of at most [`CHUNK_CHANGES`] changes ([`CHUNK_CHANGES_ALONE`]
    /// while no delivery is enqueued and no other write shares the connection; see
    /// [`Writer::chunk_size`]), each retried with the store's backoff ([`Store::write_backoff`], up to
    /// `database.write_retry_max_delay` apart) until it commits. Each chunk is prepared first
    /// ([`Store::prepare`]: ids, JSON, routed and rendered deliveries), so the transaction, and with it
    /// the write connection the relay shares, only runs statements. Nothing is reported (counters,
    /// log, readiness, Kubernetes Events) before the last chunk committed, and `committed` only after
    /// each chunk did; a failed attempt left nothing behind (the store rolls it back and drops the
    /// connection).
    async fn commit(&mut self, mut plan: Plan) {
        if plan.changes.is_empty() && plan.progress.is_empty() {
            // Nothing to store, only to report (counters, Kubernetes Events).
            self.after_commit(plan);
            return;
        }
        let progress: Vec<WatchProgress> = plan.progress.values().cloned().collect();
        let mut rest = std::mem::take(&mut plan.changes).into_iter();
        let mut written = Vec::with_capacity(rest.len());
        // The next chunk, prepared while the one before it was written (see `write_beside`).
        let mut ahead: Option<Pending> = None;
        loop {
            let mut pending = ahead.take().unwrap_or_else(|| {
                let size = self.chunk_size();
                Pending::Chunk(take_chunk(&mut rest, size, &progress))
            });
            let mut conflicts = self.store.write_backoff().build();
            let ids = loop {
                let Some(first_id) = self.first_id().await else { return };
                let prepared = match pending {
                    Pending::Prepared(p) if p.first_id() == first_id => p,
                    Pending::Prepared(p) => self.prepare(p.into_chunk(), first_id).await,
                    Pending::Chunk(chunk) => self.prepare(chunk, first_id).await,
                };
                let (written_now, prepared) = self.write_beside(prepared, &mut ahead, &mut rest, &progress).await;
                match written_now {
                    Ok(recorded) => {
                        self.next_id = Some(prepared.next_id());
                        self.shared = recorded.shared;
                        if prepared.events() > 0 {
                            self.routed = prepared.deliveries() > 0;
                        }
                        written.extend(prepared.into_chunk().changes);
                        break recorded.ids;
                    }
                    // Ids taken by someone else: read the next free one and prepare this chunk again.
                    Err(e) if e.is_event_id_taken() => {
                        let wait = conflicts.next().unwrap_or(Duration::from_secs(1));
                        warn!(error = %e, retry_in = ?wait, "event ids already taken; reading the next free id");
                        self.next_id = None;
                        pending = Pending::Prepared(prepared);
                        tokio::time::sleep(wait).await;
                    }
                    // The store logged the fence's refusal once; the next leader re-lists.
                    Err(e) if e.is_fenced() => {
                        debug!(error = %e, "not leading any more: changes left to the next leader (it re-lists)");
                        self.next_id = None;
                        return;
                    }
                    Err(e) if self.wiring.term.is_cancelled() => {
                        warn!(error = %e, "not leading any more: changes left to the next leader (it re-lists)");
                        self.next_id = None;
                        return;
                    }
                    // The database refused the write for good (a pool address and port for a second
                    // Service): retrying would stall every later change. The term ends; the next one
                    // reloads the allocator from the state table and re-lists.
                    Err(e) if e.is_address_taken() => {
                        error!(error = %e, "the database refused this batch; ending the term so the next one re-lists and allocates anew");
                        self.next_id = None;
                        let _ = self.wiring.refused.set(e.to_string());
                        self.wiring.term.cancel();
                        return;
                    }
                    Err(e) => {
                        error!(error = %e, "giving up storing changes");
                        self.next_id = None;
                        return;
                    }
                }
            };
            if let Some(id) = ids.last().copied() {
                self.wiring.committed.send_replace(id);
            }
            if rest.len() == 0 && ahead.is_none() {
                break;
            }
        }
        plan.changes = written;
        self.after_commit(plan);
    }

    /// Hands `prepared` to the store ([`Writer::write`]) and meanwhile, when nothing is `ahead` yet,
    /// prepares the next chunk of `rest` into it, with the ids after `prepared`'s, on this thread through
    /// [`tokio::task::block_in_place`] (the runtime's other tasks, the store's owner of the write
    /// connection among them, go on on another), when `prepared` enqueued no delivery (no endpoint
    /// takes these changes), the next chunk has [`OFFLOAD_CHANGES`] changes or more and the runtime
    /// is multi-thread: the chunks of a large plan then cost the longer of the two rather than their
    /// sum; a first list is stored faster (see docs/explanation/design-decisions.md). Not while
    /// deliveries are enqueued: the relay's rounds then share the write connection, whose thread is
    /// the bound, so there is no gain in latency, only more peak RSS (two chunks in memory at once).
    ///
    /// Returns once both are done, so the chunk's commit is signalled (`committed`) after the next
    /// chunk's preparation too; with the write's outcome and `prepared` given back. The next chunk
    /// waits in `ahead` (prepared, or given back when its preparation failed: the caller prepares it
    /// again on this thread and handles the error); the caller uses a prepared chunk only if its
    /// first id is still the next free one. A chunk already `ahead` (taken while an attempt that
    /// then met an id conflict was written) stays there: taking another would drop it.
    async fn write_beside(
        &self,
        prepared: Prepared,
        ahead: &mut Option<Pending>,
        rest: &mut std::vec::IntoIter<StateChange>,
        progress: &[WatchProgress],
    ) -> (Result<Recorded, StoreError>, Prepared) {
        let beside = ahead.is_none() && prepared.deliveries() == 0 && rest.len() >= OFFLOAD_CHANGES && multi_thread();
        let first_id = prepared.next_id();
        let first = self.store.record(prepared);
        let next = beside.then(|| {
            let chunk = take_chunk(rest, self.chunk_size(), progress);
            let (store, outbox) = (&self.store, self.outbox.as_ref());
            let prepare = move || store.prepare(chunk, outbox, first_id, crate::store::now_ms());
            match tokio::task::block_in_place(prepare) {
                Ok(p) => Pending::Prepared(p),
                Err(unprepared) => Pending::Chunk(unprepared.chunk),
            }
        });
        if next.is_some() {
            *ahead = next;
        }
        let (written, prepared) = first.await;
        match written {
            Err(e) if self.retries(&e) => self.write(prepared, e).await,
            done => (done, prepared),
        }
    }

    /// How many changes the next transaction takes: [`CHUNK_CHANGES_ALONE`] when the last one that
    /// recorded events enqueued no delivery and the last transaction carried no other write (none
    /// waited when it ended), else [`CHUNK_CHANGES`].
    fn chunk_size(&self) -> usize {
        if self.routed || self.shared { CHUNK_CHANGES } else { CHUNK_CHANGES_ALONE }
    }

    /// The id of the next event: known after the first commit, else read (retried like a write).
    async fn first_id(&mut self) -> Option<i64> {
        if let Some(id) = self.next_id {
            return Some(id);
        }
        let read = || self.store.next_event_id();
        let notify = |e: &StoreError, wait: Duration| {
            error!(error = %e, reason = %e.reason(), retry_in = ?wait, "cannot read the next event id; retrying (nothing recorded yet)");
        };
        let term = &self.wiring.term;
        match read.retry(self.store.write_backoff()).when(|_| !term.is_cancelled()).notify(notify).await {
            Ok(id) => {
                self.next_id = Some(id);
                Some(id)
            }
            Err(e) => {
                error!(error = %e, "giving up storing changes");
                None
            }
        }
    }

    /// [`Store::prepare`] of one chunk, observed now. A view that does not serialize is retried with
    /// the store's backoff, like a write that fails: giving up would lose the changes.
    async fn prepare(&self, mut chunk: Chunk, first_id: i64) -> Prepared {
        let mut backoff = self.store.write_backoff().build();
        loop {
            let changes = chunk.changes.len();
            let prepare = || self.store.prepare(chunk, self.outbox.as_ref(), first_id, crate::store::now_ms());
            match off_the_worker(changes, prepare) {
                Ok(p) => return p,
                Err(unprepared) => {
                    let wait = backoff.next().unwrap_or(Duration::from_secs(1));
                    error!(error = %unprepared.error, retry_in = ?wait, "cannot serialize changes; retrying (nothing recorded yet)");
                    chunk = unprepared.chunk;
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    /// Whether a write that failed with `e` is tried again: not an id conflict (returned at once), nor
    /// the fence's refusal (this replica's term is over: the next leader records the changes from its
    /// own lists, and retrying would only keep the term from ending), nor a refusal for good, nor
    /// once the term ended.
    fn retries(&self, e: &StoreError) -> bool {
        !e.is_event_id_taken() && !e.is_fenced() && !e.is_address_taken() && !self.wiring.term.is_cancelled()
    }

    /// Writes `prepared` again after its write failed with `failed`, with the store's backoff, until
    /// it commits or fails in a way not retried ([`Writer::retries`]).
    async fn write(&self, mut prepared: Prepared, failed: StoreError) -> (Result<Recorded, StoreError>, Prepared) {
        let mut backoff = self.store.write_backoff().build();
        let mut error = failed;
        loop {
            let wait = backoff.next().unwrap_or(Duration::from_secs(1));
            error!(error = %error, reason = %error.reason(), retry_in = ?wait, "cannot store changes; retrying (nothing recorded yet)");
            tokio::time::sleep(wait).await;
            let (written, p) = self.store.record(prepared).await;
            prepared = p;
            match written {
                Err(e) if self.retries(&e) => error = e,
                done => return (done, prepared),
            }
        }
    }

    fn after_commit(&mut self, plan: Plan) {
        let metrics = &self.wiring.metrics;
        let mut counts = [0usize; 3];
        for change in &plan.changes {
            if let StateChange::Event { key, cause, event, .. } = change {
                metrics.event(event.kind.as_str(), cause.as_str());
                counts[event.kind as usize] += 1;
                debug!(service = %key, event = event.kind.as_str(), cause = cause.as_str(), changed = ?event.changed, "recorded");
            }
        }
        if counts.iter().any(|&n| n > 0) {
            info!(added = counts[0], modified = counts[1], deleted = counts[2], "recorded events");
        }
        let report = plan.report;
        for cause in &report.guard_trips {
            metrics.guard_trips.get_or_create(&crate::metrics::GuardTripLabels { cause: (*cause).to_owned() }).inc();
        }
        for (how, n) in &report.guard_releases {
            let labels = crate::metrics::HeldReleaseLabels { how: (*how).to_owned() };
            metrics.held_released.get_or_create(&labels).inc_by(*n as u64);
        }
        metrics.backend_coalesced.inc_by(report.members_coalesced);
        metrics.backend_noop.inc_by(report.members_unchanged);
        let mut dropped = report.notices.dropped;
        for notice in report.notices.kept {
            dropped += usize::from(self.wiring.notices.try_send(notice).is_err());
        }
        if dropped > 0 {
            metrics.kube_events_dropped(dropped);
            warn!(dropped, "Kubernetes Event queue full; some Events were not published");
        }
        for scope in &report.first_lists {
            self.awaiting_first_list.remove(scope);
        }
        if !report.first_lists.is_empty() && self.awaiting_first_list.is_empty() {
            info!(services = metrics.services_in_scope.get(), "first full list stored: ready");
            self.wiring.ready.send_replace(true);
            let store = self.store.clone();
            tokio::spawn(async move {
                if let Err(e) = store.refresh_statistics().await {
                    warn!(error = %e, "refreshing the planner's statistics failed; autovacuum will do it later");
                }
            });
        }
        // Freeing a plan's changes (each event's views, and the previous views only it still referenced) is
        // a noticeable cost on this writer's path between two plans: it is done on a blocking thread
        // instead.
        if plan.changes.len() >= CHUNK_CHANGES {
            tokio::task::spawn_blocking(move || drop(plan.changes));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::sync::mpsc;
    use tokio::time::Instant;

    use super::{CHUNK_CHANGES, Plan, QUEUED_PLANS, gather_until};
    use crate::model::{NOTICE_QUEUE, Notice, ServiceKey};
    use crate::store::StateChange;

    /// A plan of `n` changes (Nodes forgotten: the simplest change there is).
    fn plan_of(n: usize) -> Plan {
        let changes = (0..n).map(|i| StateChange::Node { name: format!("node-{i}"), node: None }).collect();
        Plan { changes, ..Plan::default() }
    }

    /// While the writer waits for its commit's due time it takes every plan the recorder sends, more
    /// than the channel takes, so none waits for the next commit; it stops at a transaction's worth.
    #[tokio::test]
    async fn waiting_for_the_due_time_takes_the_plans_that_arrive_up_to_a_transaction() {
        let (tx, mut rx) = mpsc::channel::<Plan>(QUEUED_PLANS);
        let sent = tokio::spawn(async move {
            for _ in 0..5 {
                tx.send(plan_of(32)).await.unwrap();
            }
        });
        let mut plan = plan_of(1);
        gather_until(&mut rx, &mut plan, Instant::now() + Duration::from_secs(60)).await;
        assert_eq!(plan.changes.len(), 1 + 4 * 32);
        assert!(plan.changes.len() >= CHUNK_CHANGES);
        sent.await.unwrap();
        assert_eq!(rx.try_recv().map(|p| p.changes.len()).ok(), Some(32), "the fifth plan waits for the next commit");
    }

    /// At the due time (or when the recorder is gone) the writer commits what it has.
    #[tokio::test]
    async fn the_due_time_or_a_recorder_gone_ends_the_wait() {
        let (tx, mut rx) = mpsc::channel::<Plan>(QUEUED_PLANS);
        tx.send(plan_of(2)).await.unwrap();
        let mut plan = plan_of(1);
        gather_until(&mut rx, &mut plan, Instant::now() + Duration::from_millis(20)).await;
        assert_eq!(plan.changes.len(), 3);
        assert!(rx.try_recv().is_err(), "nothing else was sent");

        drop(tx);
        gather_until(&mut rx, &mut plan, Instant::now() + Duration::from_secs(60)).await;
        assert_eq!(plan.changes.len(), 3);
    }

    fn notices(n: usize) -> Vec<Notice> {
        let notice = |i: usize| Notice {
            key: ServiceKey::new("default", format!("svc-{i}")),
            uid: format!("uid-{i}"),
            reason: crate::model::Reason::UnAvailableLoadBalancer,
            note: "There are no available members for the load balancer".into(),
        };
        (0..n).map(notice).collect()
    }

    /// A plan keeps the first [`NOTICE_QUEUE`] Events (what the Event queue can take) and counts the
    /// rest, also across appended plans, so a first list of any size keeps a bounded number.
    #[test]
    fn a_plan_keeps_at_most_a_queue_of_notices_and_counts_the_rest() {
        let mut plan = Plan::default();
        plan.report.notices.note(notices(NOTICE_QUEUE - 1));
        assert_eq!((plan.report.notices.kept.len(), plan.report.notices.dropped), (NOTICE_QUEUE - 1, 0));
        plan.report.notices.note(notices(3));
        assert_eq!((plan.report.notices.kept.len(), plan.report.notices.dropped), (NOTICE_QUEUE, 2));
        assert_eq!(plan.report.notices.kept.last().map(|n| n.key.name.as_str()), Some("svc-0"));

        let mut later = Plan::default();
        later.report.notices.note(notices(NOTICE_QUEUE + 5));
        assert_eq!(later.report.notices.dropped, 5);
        plan.append(later);
        assert_eq!((plan.report.notices.kept.len(), plan.report.notices.dropped), (NOTICE_QUEUE, 2 + 5 + NOTICE_QUEUE));
    }

    /// A plan of `n` DELETED events of Services `ns/svc-<i>` (events that touch no state row).
    fn deletions(n: usize) -> Plan {
        let change = |i: usize| {
            let name = format!("svc-{i}");
            let k8s =
                serde_json::json!({"metadata": {"name": name, "namespace": "ns"}, "spec": {"type": "LoadBalancer"}});
            let view =
                std::sync::Arc::new(crate::model::ServiceView::from_service(&serde_json::from_value(k8s).unwrap()));
            let event = Box::new(crate::model::Recorded::deleted("uid", "1", &view, &std::sync::Arc::default()));
            let (key, cause) = (ServiceKey::new("ns", name), crate::model::Cause::Watch);
            StateChange::Event { key, cause, event, awaits_finalizer: false, cleanup: None }
        };
        Plan { changes: (0..n).map(change).collect(), ..Plan::default() }
    }

    /// Another writer takes an id inside the first chunk while the next chunk is prepared beside its
    /// write: the first chunk is prepared again after that id, and the chunk prepared beside it is
    /// still written (not replaced by the one after it), so every change of the plan is recorded.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_id_conflict_while_the_next_chunk_is_prepared_beside_loses_no_chunk() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let store = crate::store::Store::open(&path).await.unwrap();
        let foreign = sqlx::SqlitePool::connect(&format!("sqlite://{}", path.display())).await.unwrap();
        sqlx::query(
            "INSERT INTO events (id, observed_at, type, namespace, name, uid, resource_version, cause, view) \
             VALUES (10, 1, 'ADDED', 'foreign', 'x', 'u', '1', 'watch', '{}')",
        )
        .execute(&foreign)
        .await
        .unwrap();
        let (ready, _) = tokio::sync::watch::channel(false);
        let (committed, _) = tokio::sync::watch::channel(0);
        let (notices, _keep) = mpsc::channel(1);
        let wiring = super::WriterWiring {
            metrics: crate::metrics::Metrics::new(),
            ready,
            committed,
            notices,
            term: tokio_util::sync::CancellationToken::new(),
            refused: std::sync::Arc::default(),
        };
        let outbox = std::sync::Arc::new(crate::store::NoOutbox);
        let mut writer = super::Writer::starting(store.clone(), outbox, wiring, Default::default());
        // As if it had read the next id before the other writer took id 10.
        writer.next_id = Some(1);
        let n = 3 * CHUNK_CHANGES;
        writer.commit(deletions(n)).await;
        let count: (i64, i64) =
            sqlx::query_as("SELECT COUNT(*), COUNT(DISTINCT name) FROM events WHERE namespace = 'ns'")
                .fetch_one(&foreign)
                .await
                .unwrap();
        assert_eq!(count, (n as i64, n as i64));
    }
}
