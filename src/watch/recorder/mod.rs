//! The recorder: a pure index of the Services vipwatch tracks. It takes observations (watch
//! ADDED/MODIFIED/DELETED, (re)lists, Node and EndpointSlice changes, appliance feedback) with the time
//! they are planned at ([`Now`]), and fills a [`Batch`]: the events and state rows to store, the
//! watch progress, the first lists and what to report. It keeps the mirror of the current-state
//! table, decides events with [`crate::model`], allocates VIPs ([`Ownership`]), computes members
//! ([`Members`]) and guards against bulk disappearances ([`guard`]). It does no I/O, owns no
//! channel and reads no clock: the thin async shell ([`run`]) feeds it from the observation channel
//! and sends each batch, with the [`Gauges`] as they stand, to the writer.
//!
//! One step of the shell is: [`Recorder::begin`] (which buffers everything until every scope's
//! first list is in: [`startup`]), [`Recorder::observe`] per observation (a (re)list may go through
//! [`Recorder::begin_list`], [`Recorder::list_object`] and [`Recorder::end_list`] instead, so the
//! shell can hand its changes to the writer in segments), then [`Recorder::finish`] (the member
//! recomputations that came due, retries of Services waiting for an address, the guard's report).
//!
//! The words, as in docs/reference/glossary.md: observations before the first lists are *buffered*;
//! a deletion the guard keeps from being recorded is *held*; an ADDED waiting for its first endpoints
//! is *deferred*; an address a recorded change withdrew stays *reserved* until the change is
//! acknowledged; deliveries that must wait for vipwatch's finalizer on the Service *wait for the
//! finalizer*.

mod batch;
mod guard;
mod members;
mod mirror;
mod shell;
mod startup;
#[cfg(test)]
mod tests;

pub use batch::{Batch, Gauges, Notices, Now, Report};
pub use shell::Loaded;
pub(super) use shell::run;

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

use tokio::time::Instant;
use tracing::info;

use super::members::Members;
use super::ownership::Ownership;
use super::stream::{Observation, Resource, ScopeSpec};
use crate::config::Config;
use crate::ipam;
use crate::model::backends::BackendSets;
use crate::model::{
    Cause, ChangeKind, Decision, FINALIZER, Feedback, Observed, Recorded, ServiceKey, Tracked, decide_apply,
    decide_delete,
};
use crate::store::{StateChange, WatchProgress};
use guard::DeletionGuard;
use mirror::Mirror;
use startup::Startup;

/// The index. Build with [`Recorder::new`]; step it as the module docs say.
pub struct Recorder {
    /// The current-state table as this process has decided it, with counts over it.
    mirror: Mirror,
    /// The allocator and the write-back switches.
    ownership: Ownership,
    /// Pool members: the index, pending recomputations, ADDEDs deferred for their endpoints.
    members: Members,
    /// The mass-deletion guard and the deletions it holds (those Services stay in the mirror).
    guard: DeletionGuard,
    /// What waits for every scope's first list.
    startup: Startup,
    /// uids of terminating objects carrying our finalizer whose DELETED is recorded (pending cleanups
    /// at load, then every such DELETED): they never get a second one.
    announced: HashSet<String>,
    /// An address was released since the last retry of the Services waiting for one.
    freed: bool,
}

/// A (re)list of Services in progress ([`Recorder::begin_list`]).
pub struct Listing {
    scope: ScopeSpec,
    first: bool,
    /// `startup` for a first list, else `relist`.
    cause: Cause,
    /// Tracked, not held Services the scope covered when the list began (the guard's measure).
    known: usize,
    /// The keys listed.
    listed: HashSet<ServiceKey>,
}

impl Recorder {
    /// An index configured by `config`, allocating with `ownership`, starting from `loaded` (the
    /// store's tables), watching `scopes`, at `now`. Tracked
    /// Services in namespaces no scope covers any more (the namespace list changed while vipwatch was
    /// down) get a DELETED with cause `startup` in the first batch, unless the guard holds them (too
    /// many at once). Reserved addresses are reserved again, in the order of their events: a
    /// reservation ends with the acknowledgement of the oldest change of its object still using the
    /// address (`Allocator::finish_drain`), and the DELETEDs decided here come after them.
    pub fn new(config: &Config, mut ownership: Ownership, loaded: Loaded, scopes: &[ScopeSpec], now: Now) -> Self {
        let Loaded { tracked, held, reservations, announced, nodes } = loaded;
        let members = Members::new(config, nodes);
        let mirror = Mirror::new(tracked);
        for (key, t) in mirror.iter() {
            ownership.allocator.use_addresses(key, &t.view);
        }
        let services: Vec<&ScopeSpec> = scopes.iter().filter(|s| s.resource == Resource::Services).collect();
        let uncovered: BTreeSet<ServiceKey> =
            mirror.keys().filter(|k| !services.iter().any(|s| s.covers(k))).cloned().collect();
        let (held, stale): (Vec<_>, Vec<_>) =
            held.into_iter().partition(|h| mirror.get(&h.key).is_some_and(|t| t.uid == h.uid));
        let mut decided: Vec<StateChange> =
            stale.into_iter().map(|h| StateChange::Held { key: h.key, held: None }).collect();
        let mut guard = DeletionGuard::new(config.guard.clone(), scopes, held);
        let uncovered = guard.unwatched(&mut decided, &mirror, uncovered, now.unix_ms);
        for r in reservations {
            ownership.allocator.withdraw(&r.key, &r.uid, &r.addresses, r.used_by.as_ref());
        }
        let startup = Startup::new(scopes, decided);
        let mut recorder = Self { mirror, ownership, members, guard, startup, announced, freed: false };
        for key in uncovered {
            if let Some(t) = recorder.unmirror(&key) {
                recorder.startup.decided.push(deleted(key, Cause::Startup, &t));
            }
        }
        info!(services = recorder.mirror.len(), held = recorder.guard.len(), "loaded current state");
        recorder
    }

    /// Begins a batch with `queued` (the observations that arrived together). Until every scope's
    /// first list is in, takes them into its buffer and returns `None`; then gives them back, with
    /// everything buffered before, in the order to observe them ([`startup`]). The first batch
    /// begins with the changes decided at load.
    pub fn begin(&mut self, queued: &mut Vec<Observation>) -> Option<Batch> {
        if !self.startup.awaiting.is_empty() && !self.release_buffered(queued) {
            return None;
        }
        Some(Batch { changes: std::mem::take(&mut self.startup.decided), ..Batch::default() })
    }

    /// Decides one observation at `now` into `batch`.
    pub fn observe(&mut self, batch: &mut Batch, observation: Observation, now: Now) {
        match observation {
            Observation::Apply(scope, obs) => self.plan_apply(batch, &scope, obs, now.instant),
            Observation::Delete(scope, obs) => self.plan_delete(batch, &scope, &obs),
            Observation::Listed { scope, objects, first } => {
                let listing = self.begin_list(scope, &objects, first);
                for obs in objects {
                    self.list_object(batch, &listing, obs);
                }
                self.end_list(batch, listing, now);
            }
            Observation::Node(scope, change) => self.plan_node(batch, &scope, change, now.instant),
            Observation::Slice(scope, change) => self.plan_slice(batch, &scope, change, now.instant),
            Observation::Feedback(feedback) => self.plan_feedback(batch, feedback),
        }
    }

    /// Ends a batch at `now`: recomputes the members that came due (all of them are moot after the
    /// first lists, which computed every Service's), gives the Services waiting for an address
    /// another try if one was released, and adds the guard's report.
    pub fn finish(&mut self, batch: &mut Batch, now: Now) {
        if std::mem::take(&mut self.startup.first_batch) {
            self.members.settle_all();
        }
        self.flush_members(batch, now.instant);
        self.retry_waiting(batch);
        self.guard.report(batch);
    }

    /// When the next member recomputation or deferred ADDED is due (none before every first list).
    pub fn next_due(&self) -> Option<Instant> {
        self.members.next_due().filter(|_| self.startup.awaiting.is_empty())
    }

    /// The gauges as they stand.
    pub fn gauges(&self) -> Gauges {
        Gauges {
            services_in_scope: self.mirror.len(),
            vips_in_use: self.mirror.vips_in_use(),
            pool_usage: self.ownership.allocator.usage(),
            members: self.mirror.member_counts(),
            nodes: self.members.node_counts(),
            deletions_held: self.guard.len(),
        }
    }

    /// Begins a (re)list of `scope` listing `objects`: decides the ADDEDs deferred for their
    /// endpoints in the scope (announced with the list, or dropped when not listed). Pass each object
    /// to [`Self::list_object`], then end with [`Self::end_list`].
    pub fn begin_list(&mut self, scope: ScopeSpec, objects: &[Observed], first: bool) -> Listing {
        let cause = if first { Cause::Startup } else { Cause::Relist };
        let known = self.mirror.keys().filter(|k| scope.covers(k) && !self.guard.holds(k)).count();
        let listed: HashSet<ServiceKey> = objects.iter().map(|o| o.key.clone()).collect();
        for key in self.members.deferred_keys().iter().filter(|k| scope.covers(k)) {
            // A list decides what a watch ADDED was deferred for: announced now, or gone.
            if listed.contains(key) {
                self.members.forget(key);
            } else {
                self.drop_deferred_add(key);
            }
        }
        Listing { scope, first, cause, known, listed }
    }

    /// One object of a (re)list: its allocation and members, then the decision.
    pub fn list_object(&mut self, batch: &mut Batch, listing: &Listing, mut obs: Observed) {
        self.guard_reappeared(batch, &obs.key);
        self.ownership.allocate(self.mirror.get(&obs.key), &mut obs);
        self.observe_members(&mut obs);
        let decision = self.decide(&obs);
        self.take(batch, &obs.key, listing.cause, decision, Some(&obs));
    }

    /// Ends a (re)list at `now`: DELETEs what is tracked in the scope but was not listed (unless the
    /// guard holds those deletions), and notes the list.
    pub fn end_list(&mut self, batch: &mut Batch, listing: Listing, now: Now) {
        let Listing { scope, first, cause, known, listed } = listing;
        let vanished: BTreeSet<ServiceKey> =
            self.mirror.keys().filter(|k| scope.covers(k) && !listed.contains(k)).cloned().collect();
        for (key, cause) in self.guard_list(batch, (&scope, cause), (vanished, known), now.unix_ms) {
            if let Some(t) = self.unmirror(&key) {
                batch.changes.push(deleted(key, cause, &t));
            }
        }
        // The list's own resourceVersion is internal to kube's watcher; the watch events that follow
        // carry the resume point, so only the list time and count are noted here.
        self.note_progress(batch, &scope, "", Some(!first));
        if first {
            batch.report.first_lists.push(scope.key());
        }
    }

    /// A watch ADDED/MODIFIED of a Service: its allocation and members, then the decision. The ADDED of
    /// a Service in mode `pod` without a member yet is deferred up to one window (from `now`) for its
    /// endpoints.
    fn plan_apply(&mut self, batch: &mut Batch, scope: &ScopeSpec, mut obs: Observed, now: Instant) {
        self.guard_reappeared(batch, &obs.key);
        let current = self.mirror.get(&obs.key);
        self.ownership.allocate(current, &mut obs);
        self.observe_members(&mut obs);
        let decision = self.decide(&obs);
        self.note_progress(batch, scope, &obs.resource_version, None);
        let added = matches!(&decision, Decision::Record(e) if e.len() == 1 && e[0].kind == ChangeKind::Added);
        if added && self.members.should_wait(&obs) {
            self.members.defer(obs, now);
            return;
        }
        if !added {
            self.drop_deferred_add(&obs.key);
        }
        self.members.forget(&obs.key);
        self.take(batch, &obs.key, Cause::Watch, decision, Some(&obs));
    }

    /// A watch DELETED of a Service: recorded whether or not the guard held its deletion (a live
    /// watch's deletions are never held).
    fn plan_delete(&mut self, batch: &mut Batch, scope: &ScopeSpec, obs: &Observed) {
        self.announced.remove(&obs.uid);
        self.drop_deferred_add(&obs.key);
        self.guard_watch_deleted(batch, &obs.key);
        let decision = decide_delete(self.mirror.get(&obs.key), obs);
        self.note_progress(batch, scope, &obs.resource_version, None);
        self.take(batch, &obs.key, Cause::Watch, decision, None);
    }

    /// Feedback from the relay, the publisher or the API.
    fn plan_feedback(&mut self, batch: &mut Batch, feedback: Feedback) {
        match feedback {
            Feedback::Assigned(a) => {
                // An answer for a Service that is no longer a LoadBalancer assigns nothing (no VIP).
                let Some(t) = self.mirror.get(&a.key).filter(|t| t.uid == a.uid && t.view.is_load_balancer()) else {
                    return;
                };
                let obs = Ownership::assigned(t, a);
                let decision = decide_apply(Some(t), &obs);
                self.take(batch, &obs.key, Cause::Appliance, decision, Some(&obs));
            }
            Feedback::Released { key, uid, addresses } => {
                self.freed |= self.ownership.allocator.finish_drain(&key, &uid, &addresses);
            }
            Feedback::ReleaseHeld => self.release_all_held(batch),
        }
    }

    /// Computes the members of an in-scope observation against what the mirror has; it then has no
    /// recomputation pending.
    fn observe_members(&mut self, obs: &mut Observed) {
        if obs.in_scope {
            let empty = BackendSets::new();
            let current = self.mirror.get(&obs.key).filter(|t| t.uid == obs.uid).map_or(&empty, |t| &*t.backends);
            obs.backends = self.members.compute(&obs.key, &obs.view, current).into();
        }
        self.members.settled(&obs.key);
    }

    /// Drops the ADDED of `key` deferred for its endpoints, if any, freeing the addresses it was
    /// given: it left scope (or was deleted) before it was announced.
    fn drop_deferred_add(&mut self, key: &ServiceKey) {
        if self.members.forget(key) && !self.mirror.contains(key) {
            self.ownership.allocator.release(key);
            self.freed = true;
        }
    }

    /// [`decide_apply`], plus: an object being deleted that carries our finalizer but that we have no
    /// record of (the database was lost or restored from an old backup) gets its one DELETED now, so
    /// the appliance is told and the finalizer comes off — else it would wait forever.
    ///
    /// That DELETED carries the pool addresses the object still shows in its status (reserved at start,
    /// see [`Self::release_buffered`]), so they are freed only once it is acknowledged.
    fn decide(&self, obs: &Observed) -> Decision {
        if self.unrecorded_terminating(obs) {
            let mut view = (*obs.view).clone();
            // Whatever its type now: its status may still show a pool address from before a type
            // change, which start reserved for this DELETED (`release_buffered`) and which it must free.
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
        !self.mirror.contains(&obs.key) && obs.view.deleting && ours && !self.announced.contains(&obs.uid)
    }

    /// Gives the Services still waiting for an address another try after addresses were released, in
    /// namespace/name order (deterministic).
    fn retry_waiting(&mut self, batch: &mut Batch) {
        if !std::mem::take(&mut self.freed) {
            return;
        }
        for key in self.mirror.waiting_for_address().clone() {
            let Some(t) = self.mirror.get(&key).filter(|_| !self.guard.holds(&key)) else { continue };
            let mut obs = observed(&key, t);
            self.ownership.allocate(Some(t), &mut obs);
            let decision = decide_apply(self.mirror.get(&key), &obs);
            self.take(batch, &key, Cause::Allocation, decision, Some(&obs));
        }
    }

    /// Applies a decision to the mirror and the batch. `live` is the object as observed, when it still
    /// exists (a watch DELETE and a Service missing from a list pass `None`).
    fn take(&mut self, batch: &mut Batch, key: &ServiceKey, cause: Cause, decision: Decision, live: Option<&Observed>) {
        match decision {
            Decision::Nothing => {}
            Decision::Refresh(tracked) => {
                self.mirror_set(key.clone(), (*tracked).clone());
                batch.changes.push(StateChange::Refresh { key: key.clone(), tracked });
            }
            Decision::Record(events) => {
                for event in events {
                    let before = self.mirror.get(key);
                    batch.report.notices.note(Ownership::notices(key, &event, before.map(|t| &*t.view)));
                    batch.report.notices.note(super::members::notices(key, &event, before));
                    let waits = self.ownership.waits_for_finalizer(&event);
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
                    batch.changes.push(StateChange::Event {
                        key: key.clone(),
                        cause,
                        event,
                        awaits_finalizer: waits,
                        cleanup,
                    });
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

    /// Tracks `tracked` as `key` and tells the allocator which addresses it uses; an allocation that
    /// changed may have freed an address.
    fn mirror_set(&mut self, key: ServiceKey, tracked: Tracked) {
        self.ownership.allocator.use_addresses(&key, &tracked.view);
        self.freed |= self.mirror.get(&key).is_some_and(|old| old.view.allocation != tracked.view.allocation);
        self.mirror.insert(key, tracked);
    }

    /// Stops tracking `key`; the pool addresses it had stay reserved until its DELETED is
    /// acknowledged.
    fn unmirror(&mut self, key: &ServiceKey) -> Option<Tracked> {
        let old = self.mirror.remove(key)?;
        self.ownership.allocator.drain(key, &old.uid, &ipam::pool_addresses(&old.view), Some(&old.view));
        Some(old)
    }

    fn note_progress(&self, batch: &mut Batch, scope: &ScopeSpec, rv: &str, listed: Option<bool>) {
        let entry = batch.progress.entry(scope.key()).or_insert_with(|| WatchProgress {
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

/// A DELETED of a Service whose object is gone (or out of every scope): nothing to clean up.
fn deleted(key: ServiceKey, cause: Cause, t: &Tracked) -> StateChange {
    let event = Box::new(Recorded::deleted(&t.uid, &t.resource_version, &t.view, &t.backends));
    StateChange::Event { key, cause, event, awaits_finalizer: false, cleanup: None }
}
