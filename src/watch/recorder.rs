//! The recorder: keeps an in-memory mirror of the current-state table, decides events with
//! [`crate::model`], allocates VIPs ([`Ownership`]), and hands each batch of observations to the
//! [`Writer`] as one transaction.
//!
//! Until every scope delivered its first list, observations are held: the addresses Services already
//! show in their status are adopted first, so nothing allocated at start can take them.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use tokio::sync::mpsc;
use tracing::info;

use super::ownership::Ownership;
use super::stream::{Observation, ScopeSpec};
use super::writer::{Plan, Signals, Writer};
use crate::model::{
    Cause, ChangeKind, Decision, FINALIZER, Feedback, Observed, Recorded, ServiceKey, Tracked, decide_apply,
    decide_delete,
};
use crate::store::{Outbox, StateChange, Store, StoreError, WatchProgress};

/// Most observations folded into one transaction.
const MAX_BATCH: usize = 4096;

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
}

impl Recorder {
    /// Loads the current-state table. Tracked Services in namespaces no scope covers any more (the
    /// namespace list changed while vipwatch was down) are planned as DELETED with cause `startup`.
    /// Errors: [`StoreError`] when the table cannot be read.
    pub async fn load(
        store: Store,
        outbox: Arc<dyn Outbox>,
        scopes: &[ScopeSpec],
        signals: Signals,
        mut ownership: Ownership,
    ) -> Result<Self, StoreError> {
        let mut mirror = store.load_tracked().await?;
        let mut vip_refs = HashMap::new();
        let mut pending_allocation = BTreeSet::new();
        for (key, t) in &mirror {
            count_vips(&mut vip_refs, t, 1);
            ownership.allocator.hold(key, &t.view);
            if is_pending(t) {
                pending_allocation.insert(key.clone());
            }
        }
        let uncovered: BTreeSet<ServiceKey> =
            mirror.keys().filter(|k| !scopes.iter().any(|s| s.covers(k))).cloned().collect();
        let pending_startup = uncovered
            .into_iter()
            .filter_map(|key| mirror.remove(&key).map(|t| (key, t)))
            .map(|(key, t)| {
                count_vips(&mut vip_refs, &t, -1);
                ownership.allocator.drain(&key, &t.uid);
                pending_allocation.remove(&key);
                deleted(key, Cause::Startup, &t)
            })
            .collect();
        info!(services = mirror.len(), "loaded current state");
        let announced = store.cleanups().await?.into_iter().map(|c| c.uid).collect();
        for r in store.releases().await? {
            ownership.allocator.restore_draining(&r.key, &r.uid, &r.addresses);
        }
        let writer = Writer::new(store, outbox, scopes, signals);
        let awaiting = scopes.iter().map(|s| s.label().to_owned()).collect();
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
        })
    }

    /// Consumes observations until every sender is gone, one transaction per batch of up to
    /// [`MAX_BATCH`] queued observations. Planning the next batch overlaps with writing the previous
    /// one (the [`Writer`] runs as its own task); writes stay in order.
    pub async fn run(mut self, mut rx: mpsc::Receiver<Observation>) {
        let (plans, writer) = self.writer.spawn();
        let mut queued = Vec::with_capacity(MAX_BATCH);
        while rx.recv_many(&mut queued, MAX_BATCH).await > 0 {
            if !self.release_held(&mut queued) {
                continue;
            }
            let mut plan = Plan { changes: std::mem::take(&mut self.pending_startup), ..Plan::default() };
            for observation in queued.drain(..) {
                self.plan(observation, &mut plan);
            }
            self.retry_pending(&mut plan);
            plan.services_in_scope = self.mirror.len();
            plan.vips_in_use = self.vip_refs.len();
            plan.pool_usage = self.ownership.allocator.usage();
            if plans.send(plan).await.is_err() {
                break;
            }
        }
        drop(plans);
        let _ = writer.await;
    }

    /// While some scope's first list is missing, moves `queued` into `held` and returns false. When the
    /// last one arrives, adopts published addresses from every first list, moves everything held back
    /// into `queued` (in arrival order) and returns true.
    fn release_held(&mut self, queued: &mut Vec<Observation>) -> bool {
        if self.awaiting.is_empty() {
            return true;
        }
        for o in queued.iter() {
            if let Observation::Listed { scope, first: true, .. } = o {
                self.awaiting.remove(scope.label());
            }
        }
        self.held.append(queued);
        if !self.awaiting.is_empty() {
            return false;
        }
        let first_lists = self.held.iter().filter_map(|o| match o {
            Observation::Listed { objects, first: true, .. } => Some(objects),
            _ => None,
        });
        let listed: Vec<&Observed> = first_lists.flatten().collect();
        for obs in &listed {
            self.ownership.adopt(self.mirror.get(&obs.key), obs);
        }
        for obs in &listed {
            self.ownership.reserve_requested(self.mirror.get(&obs.key), obs);
        }
        *queued = std::mem::take(&mut self.held);
        true
    }

    fn plan(&mut self, observation: Observation, plan: &mut Plan) {
        match observation {
            Observation::Apply(scope, mut obs) => {
                self.ownership.allocate(self.mirror.get(&obs.key), &mut obs);
                let decision = self.decide(&obs);
                self.note_progress(plan, &scope, &obs.resource_version, None);
                self.take(plan, &obs.key, Cause::Watch, decision, Some(&obs));
            }
            Observation::Delete(scope, obs) => {
                self.announced.remove(&obs.uid);
                let decision = decide_delete(self.mirror.get(&obs.key), &obs);
                self.note_progress(plan, &scope, &obs.resource_version, None);
                self.take(plan, &obs.key, Cause::Watch, decision, None);
            }
            Observation::Listed { scope, objects, first } => self.plan_list(plan, scope, objects, first),
            Observation::Feedback(Feedback::Assigned(a)) => {
                let Some(t) = self.mirror.get(&a.key).filter(|t| t.uid == a.uid) else { return };
                let obs = Ownership::assigned(t, a);
                let decision = decide_apply(Some(t), &obs);
                self.take(plan, &obs.key, Cause::Appliance, decision, Some(&obs));
            }
            Observation::Feedback(Feedback::Released { key, uid }) => {
                self.freed |= self.ownership.allocator.finish_drain(&key, &uid);
            }
        }
    }

    /// [`decide_apply`], plus: an object being deleted that carries our finalizer but that we have no
    /// record of (the database was lost or restored from an old backup) gets its one DELETED now, so
    /// the appliance is told and the finalizer comes off — else it would wait forever.
    fn decide(&self, obs: &Observed) -> Decision {
        let current = self.mirror.get(&obs.key);
        let ours = obs.view.finalizers.iter().any(|f| f == FINALIZER);
        if current.is_none() && obs.view.deleting && ours && !self.announced.contains(&obs.uid) {
            return Decision::Record(vec![Recorded::deleted(&obs.uid, &obs.resource_version, &obs.view)]);
        }
        decide_apply(current, obs)
    }

    /// Gives the Services still waiting for an address another try after addresses were released, in
    /// namespace/name order (deterministic).
    fn retry_pending(&mut self, plan: &mut Plan) {
        if !std::mem::take(&mut self.freed) {
            return;
        }
        for key in self.pending_allocation.clone() {
            let Some(t) = self.mirror.get(&key) else { continue };
            let mut obs = Observed {
                key: key.clone(),
                uid: t.uid.clone(),
                resource_version: t.resource_version.clone(),
                view: t.view.clone(),
                in_scope: true,
            };
            self.ownership.allocate(Some(t), &mut obs);
            let decision = decide_apply(self.mirror.get(&key), &obs);
            self.take(plan, &key, Cause::Allocation, decision, Some(&obs));
        }
    }

    /// A (re)list: apply every listed object, then DELETE what we track in the scope but was not listed.
    fn plan_list(&mut self, plan: &mut Plan, scope: ScopeSpec, objects: Vec<crate::model::Observed>, first: bool) {
        let cause = if first { Cause::Startup } else { Cause::Relist };
        let listed: HashSet<ServiceKey> = objects.iter().map(|o| o.key.clone()).collect();
        for mut obs in objects {
            self.ownership.allocate(self.mirror.get(&obs.key), &mut obs);
            let decision = self.decide(&obs);
            self.take(plan, &obs.key, cause, decision, Some(&obs));
        }
        let vanished: BTreeSet<ServiceKey> =
            self.mirror.keys().filter(|k| scope.covers(k) && !listed.contains(k)).cloned().collect();
        for key in vanished {
            if let Some(t) = self.unmirror(&key) {
                plan.changes.push(deleted(key, cause, &t));
            }
        }
        // The list's own resourceVersion is internal to kube's watcher; the watch events that follow
        // carry the resume point, so only the list time and count are noted here.
        self.note_progress(plan, &scope, "", Some(!first));
        if first {
            plan.first_lists.push(scope.label().to_owned());
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
                    let before = self.mirror.get(key).map(|t| &t.view);
                    plan.notices.extend(Ownership::notices(key, &event, before));
                    let hold = self.ownership.hold(&event);
                    let cleanup = Ownership::cleanup(&event, live);
                    if cleanup.as_ref().is_some_and(|c| c.remove_finalizer) {
                        self.announced.insert(event.uid.clone());
                    }
                    self.mirror_event(key, &event);
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
            let tracked =
                Tracked { uid: e.uid.clone(), resource_version: e.resource_version.clone(), view: e.view.clone() };
            self.mirror_set(key.clone(), tracked);
        }
    }

    fn mirror_set(&mut self, key: ServiceKey, tracked: Tracked) {
        count_vips(&mut self.vip_refs, &tracked, 1);
        self.ownership.allocator.hold(&key, &tracked.view);
        if is_pending(&tracked) {
            self.pending_allocation.insert(key.clone());
        } else {
            self.pending_allocation.remove(&key);
        }
        if let Some(old) = self.mirror.insert(key.clone(), tracked) {
            count_vips(&mut self.vip_refs, &old, -1);
            self.freed |= old.view.allocation != self.mirror[&key].view.allocation;
        }
    }

    fn unmirror(&mut self, key: &ServiceKey) -> Option<Tracked> {
        let old = self.mirror.remove(key)?;
        count_vips(&mut self.vip_refs, &old, -1);
        self.ownership.allocator.drain(key, &old.uid);
        self.pending_allocation.remove(key);
        Some(old)
    }

    fn note_progress(&self, plan: &mut Plan, scope: &ScopeSpec, rv: &str, listed: Option<bool>) {
        let entry = plan.progress.entry(scope.label().to_owned()).or_insert_with(|| WatchProgress {
            scope: scope.label().to_owned(),
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

/// A DELETED of a Service whose object is gone (or out of every scope): nothing to clean up.
fn deleted(key: ServiceKey, cause: Cause, t: &Tracked) -> StateChange {
    let event = Box::new(Recorded::deleted(&t.uid, &t.resource_version, &t.view));
    StateChange::Event { key, cause, event, hold: false, cleanup: None }
}

/// Whether `t` waits for an address (its allocation has a reason and no address).
fn is_pending(t: &Tracked) -> bool {
    t.view.allocation.as_ref().is_some_and(|a| a.reason.is_some())
}
