//! The recorder: keeps an in-memory mirror of the current-state table, decides events with
//! [`crate::model`], and hands each batch of observations to the [`Writer`] as one transaction.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use tokio::sync::mpsc;
use tracing::info;

use super::stream::{Observation, ScopeSpec};
use super::writer::{Plan, Signals, Writer};
use crate::model::{Cause, ChangeKind, Decision, Recorded, ServiceKey, Tracked, decide_apply, decide_delete};
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
    ) -> Result<Self, StoreError> {
        let mut mirror = store.load_tracked().await?;
        let mut vip_refs = HashMap::new();
        for t in mirror.values() {
            count_vips(&mut vip_refs, t, 1);
        }
        let uncovered: BTreeSet<ServiceKey> =
            mirror.keys().filter(|k| !scopes.iter().any(|s| s.covers(k))).cloned().collect();
        let pending_startup = uncovered
            .into_iter()
            .filter_map(|key| mirror.remove(&key).map(|t| (key, t)))
            .map(|(key, t)| {
                count_vips(&mut vip_refs, &t, -1);
                deleted(key, Cause::Startup, &t)
            })
            .collect();
        info!(services = mirror.len(), "loaded current state");
        let writer = Writer::new(store, outbox, scopes, signals);
        Ok(Self { mirror, vip_refs, pending_startup, writer })
    }

    /// Consumes observations until every sender is gone, one transaction per batch of up to
    /// [`MAX_BATCH`] queued observations. Planning the next batch overlaps with writing the previous
    /// one (the [`Writer`] runs as its own task); writes stay in order.
    pub async fn run(mut self, mut rx: mpsc::Receiver<Observation>) {
        let (plans, writer) = self.writer.spawn();
        let mut queued = Vec::with_capacity(MAX_BATCH);
        while rx.recv_many(&mut queued, MAX_BATCH).await > 0 {
            let mut plan = Plan { changes: std::mem::take(&mut self.pending_startup), ..Plan::default() };
            for observation in queued.drain(..) {
                self.plan(observation, &mut plan);
            }
            plan.services_in_scope = self.mirror.len();
            plan.vips_in_use = self.vip_refs.len();
            if plans.send(plan).await.is_err() {
                break;
            }
        }
        drop(plans);
        let _ = writer.await;
    }

    fn plan(&mut self, observation: Observation, plan: &mut Plan) {
        match observation {
            Observation::Apply(scope, obs) => {
                let decision = decide_apply(self.mirror.get(&obs.key), &obs);
                self.note_progress(plan, &scope, &obs.resource_version, None);
                self.take(plan, obs.key, Cause::Watch, decision);
            }
            Observation::Delete(scope, obs) => {
                let decision = decide_delete(self.mirror.get(&obs.key), &obs);
                self.note_progress(plan, &scope, &obs.resource_version, None);
                self.take(plan, obs.key, Cause::Watch, decision);
            }
            Observation::Listed { scope, objects, first } => self.plan_list(plan, scope, objects, first),
        }
    }

    /// A (re)list: apply every listed object, then DELETE what we track in the scope but was not listed.
    fn plan_list(&mut self, plan: &mut Plan, scope: ScopeSpec, objects: Vec<crate::model::Observed>, first: bool) {
        let cause = if first { Cause::Startup } else { Cause::Relist };
        let listed: HashSet<ServiceKey> = objects.iter().map(|o| o.key.clone()).collect();
        for obs in objects {
            let decision = decide_apply(self.mirror.get(&obs.key), &obs);
            self.take(plan, obs.key, cause, decision);
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

    fn take(&mut self, plan: &mut Plan, key: ServiceKey, cause: Cause, decision: Decision) {
        match decision {
            Decision::Nothing => {}
            Decision::Refresh(tracked) => {
                self.mirror_set(key.clone(), (*tracked).clone());
                plan.changes.push(StateChange::Refresh { key, tracked });
            }
            Decision::Record(events) => {
                for event in events {
                    self.mirror_event(&key, &event);
                    plan.changes.push(StateChange::Event { key: key.clone(), cause, event: Box::new(event) });
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
        if let Some(old) = self.mirror.insert(key, tracked) {
            count_vips(&mut self.vip_refs, &old, -1);
        }
    }

    fn unmirror(&mut self, key: &ServiceKey) -> Option<Tracked> {
        let old = self.mirror.remove(key)?;
        count_vips(&mut self.vip_refs, &old, -1);
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

fn deleted(key: ServiceKey, cause: Cause, t: &Tracked) -> StateChange {
    StateChange::Event { key, cause, event: Box::new(Recorded::deleted(&t.uid, &t.resource_version, &t.view)) }
}
