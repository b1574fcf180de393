//! The recorder: keeps an in-memory mirror of the current-state table, decides events with
//! [`crate::model`], allocates VIPs ([`Ownership`]), and hands each batch of observations to the
//! [`Writer`] as one transaction.
//!
//! Until every scope delivered its first list, observations are held: the addresses Services already
//! show in their status are adopted first, so nothing allocated at start can take them, and the first
//! lists of Nodes and EndpointSlices are in before any Service's members are computed.
//!
//! Pool members: [`members`] plans the Node and EndpointSlice changes and the coalesced
//! recomputations ([`super::members::Members`]). Bulk disappearances: [`guard`].

mod guard;
mod members;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::info;
use vipwatch_contract::{BackendMode, MemberState};

use super::members::Members;
use super::ownership::Ownership;
use super::stream::{Observation, Resource, ScopeSpec};
use super::writer::{Plan, Signals, Writer};
use crate::config::GuardConfig;
use crate::ipam;
use crate::model::backends::BackendSets;
use crate::model::{
    Cause, ChangeKind, Decision, FINALIZER, Feedback, Observed, Recorded, ServiceKey, Tracked, decide_apply,
    decide_delete,
};
use crate::store::{Outbox, StateChange, Store, StoreError, WatchProgress};

/// Most observations folded into one transaction.
const MAX_BATCH: usize = 4096;

/// Most changes a (re)list accumulates before they go to the writer as a plan of their own. A large
/// list planned whole would hold every change (its boxed event, notices, the plan's vector) until the
/// last was decided; in segments the writer stores the first while the rest is decided, and at most a
/// few segments exist at once (the writer's queue is bounded).
/// The list's progress and readiness go with the last segment, so a crash in between re-lists and
/// diffs the stored part as already recorded.
const LIST_SEGMENT: usize = 512;

/// The single writer of Service events. Build with [`Recorder::load`], drive with [`Recorder::run`].
pub struct Recorder {
    mirror: HashMap<ServiceKey, Tracked>,
    /// How many mirrored Services use each VIP (for `vipwatch_vips_in_use`).
    vip_refs: HashMap<String, usize>,
    pending_startup: Vec<StateChange>,
    writer: Writer,
    ownership: Ownership,
    /// Services whose allocation is pending (no address yet), retried when an address frees up.
    pending_allocation: BTreeSet<ServiceKey>,
    /// An address was released since the last retry of the pending ones.
    freed: bool,
    /// uids of terminating objects carrying our finalizer whose DELETED is recorded (pending cleanups
    /// at load, then every such DELETED): they never get a second one.
    announced: HashSet<String>,
    /// Scopes whose first list has not arrived yet; observations wait in `held` meanwhile.
    awaiting: HashSet<String>,
    held: Vec<Observation>,
    /// Pool members: the index, pending recomputations, ADDEDs waiting for endpoints.
    members: Members,
    /// Members over the mirror, per mode and state (for `vipwatch_backend_members`).
    member_counts: BTreeMap<(BackendMode, MemberState), i64>,
    /// The batch being planned holds the first lists: it computes every Service's members, so the
    /// recomputations its Node and EndpointSlice lists asked for are moot.
    starting: bool,
    /// The mass-deletion guard and the deletions it holds (those Services stay in the mirror).
    guard: guard::Guard,
}

impl Recorder {
    /// Loads the current-state table and the held deletions. Tracked Services in namespaces no scope
    /// covers any more (the namespace list changed while vipwatch was down) are planned as DELETED
    /// with cause `startup`, unless the `guard` holds them (too many at once).
    /// Errors: [`StoreError`] when the tables cannot be read.
    pub(super) async fn load(
        store: Store,
        outbox: Arc<dyn Outbox>,
        scopes: &[ScopeSpec],
        signals: Signals,
        (mut ownership, members): (Ownership, Members),
        guard: GuardConfig,
    ) -> Result<Self, StoreError> {
        let mut mirror = store.load_tracked().await?;
        let mut vip_refs = HashMap::new();
        let mut pending_allocation = BTreeSet::new();
        let mut member_counts = BTreeMap::new();
        for (key, t) in &mirror {
            count_vips(&mut vip_refs, t, 1);
            count_members(&mut member_counts, t, 1);
            ownership.allocator.hold(key, &t.view);
            if is_pending(t) {
                pending_allocation.insert(key.clone());
            }
        }
        let services = scopes.iter().filter(|s| s.resource == Resource::Services);
        let services: Vec<&ScopeSpec> = services.collect();
        let uncovered: BTreeSet<ServiceKey> =
            mirror.keys().filter(|k| !services.iter().any(|s| s.covers(k))).cloned().collect();
        let (held, stale): (Vec<_>, Vec<_>) =
            store.held_deletions().await?.into_iter().partition(|h| mirror.get(&h.key).is_some_and(|t| t.uid == h.uid));
        let mut pending_startup: Vec<StateChange> =
            stale.into_iter().map(|h| StateChange::Held { key: h.key, held: None }).collect();
        let mut guard = guard::Guard::new(guard, scopes, held);
        let uncovered = guard.unwatched(&mut pending_startup, &mirror, uncovered);
        // The stored reservations first, in the order of their events: a reservation ends with the
        // acknowledgement of the oldest change of its object still holding the address
        // (`Allocator::finish_drain`), and the DELETEDs below come after them.
        for r in store.reservations().await? {
            ownership.allocator.withdraw(&r.key, &r.uid, &r.addresses, r.held_by.as_ref());
        }
        for key in &uncovered {
            if let Some(t) = mirror.remove(key) {
                count_vips(&mut vip_refs, &t, -1);
                count_members(&mut member_counts, &t, -1);
                ownership.allocator.drain(key, &t.uid, &ipam::pool_addresses(&t.view), Some(&t.view));
                pending_allocation.remove(key);
                pending_startup.push(deleted(key.clone(), Cause::Startup, &t));
            }
        }
        info!(services = mirror.len(), held = guard.len(), "loaded current state");
        let announced = store.cleanups().await?.into_iter().map(|c| c.uid).collect();
        let writer = Writer::new(store, outbox, scopes, signals);
        let awaiting = scopes.iter().map(ScopeSpec::key).collect();
        Ok(Self {
            mirror,
            vip_refs,
            pending_startup,
            writer,
            ownership,
            pending_allocation,
            freed: false,
            announced,
            awaiting,
            held: Vec::new(),
            members,
            member_counts,
            starting: false,
            guard,
        })
    }

    /// Consumes observations until every sender is gone, one transaction per batch of up to
    /// [`MAX_BATCH`] queued observations, plus the member recomputations that came due. Planning the
    /// next batch overlaps with writing the previous one (the [`Writer`] runs as its own task); writes
    /// stay in order.
    pub async fn run(mut self, mut rx: mpsc::Receiver<Observation>) {
        let (plans, writer) = self.writer.spawn();
        let mut queued = Vec::with_capacity(MAX_BATCH);
        loop {
            let due = self.members.next_due().filter(|_| self.awaiting.is_empty());
            tokio::select! {
                received = rx.recv_many(&mut queued, MAX_BATCH) => if received == 0 { break },
                _ = tokio::time::sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => {}
            }
            if !queued.is_empty() && !self.release_held(&mut queued) {
                continue;
            }
            let mut plan = Plan { changes: std::mem::take(&mut self.pending_startup), ..Plan::default() };
            for observation in queued.drain(..) {
                self.plan(observation, &mut plan, &plans).await;
            }
            if std::mem::take(&mut self.starting) {
                self.members.settle_all();
            }
            self.flush_members(&mut plan, Instant::now());
            self.retry_pending(&mut plan);
            self.guard.report(&mut plan);
            self.fill_gauges(&mut plan);
            if plans.send(plan).await.is_err() {
                break;
            }
        }
        drop(plans);
        let _ = writer.await;
    }

    /// Takes the changes planned so far out of `plan` as a plan of their own (with the gauges as they
    /// stand); the rest of `plan` (notices, progress, readiness, guard reports) stays for the last
    /// one. The notices wait for the whole list: sent per segment, the bounded Kubernetes Event queue
    /// would drain between segments, and publishing the extra Events would slow the initial sync of
    /// many Services (see docs/explanation/design-decisions.md).
    fn segment(&self, plan: &mut Plan) -> Plan {
        let mut segment = Plan { changes: std::mem::take(&mut plan.changes), ..Plan::default() };
        self.fill_gauges(&mut segment);
        segment
    }

    fn fill_gauges(&self, plan: &mut Plan) {
        plan.services_in_scope = self.mirror.len();
        plan.vips_in_use = self.vip_refs.len();
        plan.pool_usage = self.ownership.allocator.usage();
        plan.members = self.member_counts.iter().map(|(k, n)| (*k, *n)).collect();
        plan.nodes = self.members.node_counts();
    }

    /// While some scope's first list is missing, moves `queued` into `held` and returns false. When the
    /// last one arrives, adopts published addresses from every first list, moves everything held back
    /// into `queued` (in arrival order) and returns true.
    fn release_held(&mut self, queued: &mut Vec<Observation>) -> bool {
        if self.awaiting.is_empty() {
            return true;
        }
        for o in queued.iter() {
            if let Some(scope) = first_list(o) {
                self.awaiting.remove(&scope.key());
            }
        }
        self.held.append(queued);
        if !self.awaiting.is_empty() {
            return false;
        }
        // Nodes and EndpointSlices first: every Service's members are then computed from complete lists.
        self.held.sort_by_key(|o| !matches!(o, Observation::Node(..) | Observation::Slice(..)));
        let first_lists = self.held.iter().filter_map(|o| match o {
            Observation::Listed { objects, first: true, .. } => Some(objects),
            _ => None,
        });
        let listed: Vec<&Observed> = first_lists.flatten().collect();
        // A terminating Service the database does not know (it was lost) keeps what it shows until
        // the appliance acknowledged its DELETED ([`Self::decide`] announces it with these addresses).
        let terminating: Vec<&&Observed> = listed.iter().filter(|o| self.unrecorded_terminating(o)).collect();
        for obs in terminating {
            if let Some(a) = self.ownership.allocator.published(&obs.view) {
                let ips: Vec<std::net::IpAddr> = a.addresses.iter().filter_map(|s| s.parse().ok()).collect();
                self.ownership.allocator.withdraw(&obs.key, &obs.uid, &ips, Some(&obs.view));
            }
        }
        for obs in &listed {
            self.ownership.adopt(self.mirror.get(&obs.key), obs);
        }
        for obs in &listed {
            self.ownership.reserve_requested(self.mirror.get(&obs.key), obs);
        }
        *queued = std::mem::take(&mut self.held);
        self.starting = true;
        true
    }

    async fn plan(&mut self, observation: Observation, plan: &mut Plan, plans: &mpsc::Sender<Plan>) {
        match observation {
            Observation::Apply(scope, obs) => self.plan_apply(plan, &scope, obs),
            Observation::Delete(scope, obs) => {
                self.announced.remove(&obs.uid);
                self.drop_held_add(&obs.key);
                self.guard_watch_deleted(plan, &obs.key);
                let decision = decide_delete(self.mirror.get(&obs.key), &obs);
                self.note_progress(plan, &scope, &obs.resource_version, None);
                self.take(plan, &obs.key, Cause::Watch, decision, None);
            }
            Observation::Listed { scope, objects, first } => self.plan_list(plan, plans, scope, objects, first).await,
            Observation::Node(scope, change) => self.plan_node(plan, &scope, change),
            Observation::Slice(scope, change) => self.plan_slice(plan, &scope, change),
            Observation::Feedback(Feedback::Assigned(a)) => {
                // An answer for a Service that is no longer a LoadBalancer assigns nothing (no VIP).
                let Some(t) = self.mirror.get(&a.key).filter(|t| t.uid == a.uid && t.view.is_load_balancer()) else {
                    return;
                };
                let obs = Ownership::assigned(t, a);
                let decision = decide_apply(Some(t), &obs);
                self.take(plan, &obs.key, Cause::Appliance, decision, Some(&obs));
            }
            Observation::Feedback(Feedback::Released { key, uid, addresses }) => {
                self.freed |= self.ownership.allocator.finish_drain(&key, &uid, &addresses);
            }
            Observation::Feedback(Feedback::ReleaseHeld) => self.release_all_held(plan),
        }
    }

    /// A watch ADDED/MODIFIED of a Service: its allocation and members, then the decision. The ADDED of
    /// a Service in mode `pod` without a member yet waits up to one window for its endpoints.
    fn plan_apply(&mut self, plan: &mut Plan, scope: &ScopeSpec, mut obs: Observed) {
        self.guard_reappeared(plan, &obs.key);
        let current = self.mirror.get(&obs.key);
        self.ownership.allocate(current, &mut obs);
        self.observe_members(&mut obs);
        let decision = self.decide(&obs);
        self.note_progress(plan, scope, &obs.resource_version, None);
        let added = matches!(&decision, Decision::Record(e) if e.len() == 1 && e[0].kind == ChangeKind::Added);
        if added && self.members.should_wait(&obs) {
            self.members.defer(obs, Instant::now());
            return;
        }
        if !added {
            self.drop_held_add(&obs.key);
        }
        self.members.forget(&obs.key);
        self.take(plan, &obs.key, Cause::Watch, decision, Some(&obs));
    }

    /// Computes the members of an in-scope observation against what the mirror holds; it then has no
    /// recomputation pending.
    fn observe_members(&mut self, obs: &mut Observed) {
        if obs.in_scope {
            let empty = BackendSets::new();
            let current = self.mirror.get(&obs.key).filter(|t| t.uid == obs.uid).map_or(&empty, |t| &*t.backends);
            obs.backends = self.members.compute(&obs.key, &obs.view, current).into();
        }
        self.members.settled(&obs.key);
    }

    /// Drops the ADDED of `key` held for its endpoints, if any, freeing the addresses it was given:
    /// it left scope (or was deleted) before it was announced.
    fn drop_held_add(&mut self, key: &ServiceKey) {
        if self.members.forget(key) && !self.mirror.contains_key(key) {
            self.ownership.allocator.release(key);
            self.freed = true;
        }
    }

    /// [`decide_apply`], plus: an object being deleted that carries our finalizer but that we have no
    /// record of (the database was lost or restored from an old backup) gets its one DELETED now, so
    /// the appliance is told and the finalizer comes off — else it would wait forever.
    ///
    /// That DELETED carries the pool addresses the object still shows in its status (reserved at start,
    /// see [`Self::release_held`]), so they are freed only once it is acknowledged.
    fn decide(&self, obs: &Observed) -> Decision {
        if self.unrecorded_terminating(obs) {
            let mut view = (*obs.view).clone();
            // Whatever its type now: its status may still show a pool address from before a type
            // change, which start reserved for this DELETED (`release_held`) and which it must free.
            view.allocation = self.ownership.allocator.published(&view);
            let none = Arc::new(BackendSets::new());
            return Decision::Record(vec![Recorded::deleted(&obs.uid, &obs.resource_version, &view.into(), &none)]);
        }
        decide_apply(self.mirror.get(&obs.key), obs)
    }

    /// Whether `obs` is being deleted, carries our finalizer, and we have no record of it and have not
    /// announced its DELETED: it gets one now ([`Self::decide`]).
    fn unrecorded_terminating(&self, obs: &Observed) -> bool {
        let ours = obs.view.finalizers.iter().any(|f| f == FINALIZER);
        !self.mirror.contains_key(&obs.key) && obs.view.deleting && ours && !self.announced.contains(&obs.uid)
    }

    /// Gives the Services still waiting for an address another try after addresses were released, in
    /// namespace/name order (deterministic).
    fn retry_pending(&mut self, plan: &mut Plan) {
        if !std::mem::take(&mut self.freed) {
            return;
        }
        for key in self.pending_allocation.clone() {
            let Some(t) = self.mirror.get(&key).filter(|_| !self.guard.holds(&key)) else { continue };
            let mut obs = observed(&key, t);
            self.ownership.allocate(Some(t), &mut obs);
            let decision = decide_apply(self.mirror.get(&key), &obs);
            self.take(plan, &key, Cause::Allocation, decision, Some(&obs));
        }
    }

    /// A (re)list: apply every listed object (the changes sent to the writer every [`LIST_SEGMENT`]),
    /// then DELETE what we track in the scope but was not listed (unless the [`guard`] holds those
    /// deletions).
    async fn plan_list(
        &mut self,
        plan: &mut Plan,
        plans: &mpsc::Sender<Plan>,
        scope: ScopeSpec,
        objects: Vec<crate::model::Observed>,
        first: bool,
    ) {
        let cause = if first { Cause::Startup } else { Cause::Relist };
        let known = self.mirror.keys().filter(|k| scope.covers(k) && !self.guard.holds(k)).count();
        let listed: HashSet<ServiceKey> = objects.iter().map(|o| o.key.clone()).collect();
        for key in self.members.deferred_keys().iter().filter(|k| scope.covers(k)) {
            // A list decides what a watch ADDED was holding for: announced now, or gone.
            if listed.contains(key) {
                self.members.forget(key);
            } else {
                self.drop_held_add(key);
            }
        }
        for mut obs in objects {
            self.guard_reappeared(plan, &obs.key);
            self.ownership.allocate(self.mirror.get(&obs.key), &mut obs);
            self.observe_members(&mut obs);
            let decision = self.decide(&obs);
            self.take(plan, &obs.key, cause, decision, Some(&obs));
            if plan.changes.len() >= LIST_SEGMENT {
                // A writer that is gone is noticed by the next send in `run`.
                let _ = plans.send(self.segment(plan)).await;
                // Planning a large list keeps this task busy for long; yielding lets the runtime's one
                // worker (`server.worker_threads`) run the writer, the relay and the API between segments.
                tokio::task::yield_now().await;
            }
        }
        let vanished: BTreeSet<ServiceKey> =
            self.mirror.keys().filter(|k| scope.covers(k) && !listed.contains(k)).cloned().collect();
        for (key, cause) in self.guard_list(plan, (&scope, cause), vanished, known) {
            if let Some(t) = self.unmirror(&key) {
                plan.changes.push(deleted(key, cause, &t));
            }
        }
        // The list's own resourceVersion is internal to kube's watcher; the watch events that follow
        // carry the resume point, so only the list time and count are noted here.
        self.note_progress(plan, &scope, "", Some(!first));
        if first {
            plan.first_lists.push(scope.key());
        }
    }

    /// Applies a decision to the mirror and the plan. `live` is the object as observed, when it still
    /// exists (a watch DELETE and a Service missing from a list pass `None`).
    fn take(&mut self, plan: &mut Plan, key: &ServiceKey, cause: Cause, decision: Decision, live: Option<&Observed>) {
        match decision {
            Decision::Nothing => {}
            Decision::Refresh(tracked) => {
                self.mirror_set(key.clone(), (*tracked).clone());
                plan.changes.push(StateChange::Refresh { key: key.clone(), tracked });
            }
            Decision::Record(events) => {
                for event in events {
                    let before = self.mirror.get(key);
                    plan.note(Ownership::notices(key, &event, before.map(|t| &*t.view)));
                    plan.note(super::members::notices(key, &event, before));
                    let hold = self.ownership.hold(&event);
                    let cleanup = Ownership::cleanup(&event, live);
                    if cleanup.as_ref().is_some_and(|c| c.remove_finalizer) {
                        self.announced.insert(event.uid.clone());
                    }
                    self.mirror_event(key, &event);
                    if event.kind == ChangeKind::Modified {
                        // What the MODIFIED took away stays reserved until it is acknowledged (a DELETED's
                        // addresses are reserved by `unmirror`).
                        self.ownership.allocator.withdraw(
                            key,
                            &event.uid,
                            &ipam::withdrawn(&event),
                            event.previous.as_deref(),
                        );
                    }
                    let event = Box::new(event);
                    plan.changes.push(StateChange::Event { key: key.clone(), cause, event, hold, cleanup });
                }
            }
        }
    }

    fn mirror_event(&mut self, key: &ServiceKey, e: &Recorded) {
        if e.kind == ChangeKind::Deleted {
            self.unmirror(key);
        } else {
            let tracked = Tracked {
                uid: e.uid.clone(),
                resource_version: e.resource_version.clone(),
                view: e.view.clone(),
                backends: e.backends.clone(),
            };
            self.mirror_set(key.clone(), tracked);
        }
    }

    fn mirror_set(&mut self, key: ServiceKey, tracked: Tracked) {
        count_vips(&mut self.vip_refs, &tracked, 1);
        count_members(&mut self.member_counts, &tracked, 1);
        self.ownership.allocator.hold(&key, &tracked.view);
        if is_pending(&tracked) {
            self.pending_allocation.insert(key.clone());
        } else {
            self.pending_allocation.remove(&key);
        }
        if let Some(old) = self.mirror.insert(key.clone(), tracked) {
            count_vips(&mut self.vip_refs, &old, -1);
            count_members(&mut self.member_counts, &old, -1);
            self.freed |= old.view.allocation != self.mirror[&key].view.allocation;
        }
    }

    fn unmirror(&mut self, key: &ServiceKey) -> Option<Tracked> {
        let old = self.mirror.remove(key)?;
        count_vips(&mut self.vip_refs, &old, -1);
        count_members(&mut self.member_counts, &old, -1);
        self.ownership.allocator.drain(key, &old.uid, &ipam::pool_addresses(&old.view), Some(&old.view));
        self.pending_allocation.remove(key);
        Some(old)
    }

    fn note_progress(&self, plan: &mut Plan, scope: &ScopeSpec, rv: &str, listed: Option<bool>) {
        let entry = plan.progress.entry(scope.key()).or_insert_with(|| WatchProgress {
            scope: scope.key(),
            resource_version: None,
            listed: None,
        });
        if !rv.is_empty() {
            entry.resource_version = Some(rv.to_owned());
        }
        if listed.is_some() {
            entry.listed = listed;
        }
    }
}

/// Adds `delta` (+1 / -1) to the use count of each VIP of `t`, dropping addresses no longer used.
fn count_vips(refs: &mut HashMap<String, usize>, t: &Tracked, delta: isize) {
    for vip in t.view.vips() {
        let n = refs.entry(vip.clone()).or_default();
        *n = n.saturating_add_signed(delta);
        if *n == 0 {
            refs.remove(&vip);
        }
    }
}

/// The tracked state of `key` as an observation, for a change the recorder makes itself.
fn observed(key: &ServiceKey, t: &Tracked) -> Observed {
    Observed {
        key: key.clone(),
        uid: t.uid.clone(),
        resource_version: t.resource_version.clone(),
        view: t.view.clone(),
        in_scope: true,
        backends: t.backends.clone(),
    }
}

/// Adds `delta` (+1 / -1) times the members of `t` to the per mode and state counts.
fn count_members(counts: &mut BTreeMap<(BackendMode, MemberState), i64>, t: &Tracked, delta: i64) {
    for (mode, b) in t.backends.iter() {
        for (_, m) in b.members() {
            *counts.entry((*mode, m.state)).or_default() += delta;
        }
    }
}

/// The scope of a first list, if `o` is one.
fn first_list(o: &Observation) -> Option<&ScopeSpec> {
    use super::stream::Change;
    match o {
        Observation::Listed { scope, first: true, .. }
        | Observation::Node(scope, Change::Listed { first: true, .. })
        | Observation::Slice(scope, Change::Listed { first: true, .. }) => Some(scope),
        _ => None,
    }
}

/// A DELETED of a Service whose object is gone (or out of every scope): nothing to clean up.
fn deleted(key: ServiceKey, cause: Cause, t: &Tracked) -> StateChange {
    let event = Box::new(Recorded::deleted(&t.uid, &t.resource_version, &t.view, &t.backends));
    StateChange::Event { key, cause, event, hold: false, cleanup: None }
}

/// Whether `t` waits for an address (its allocation has a reason and no address).
fn is_pending(t: &Tracked) -> bool {
    t.view.allocation.as_ref().is_some_and(|a| a.reason.is_some())
}
