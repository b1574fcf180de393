//! The recorder's member planning: Node and EndpointSlice changes update the index and mark the
//! Services they feed as pending; pending Services that came due are recomputed, and a changed hash
//! becomes one MODIFIED (`changed: ["backends"]`, cause `backends`); ADDEDs deferred for their
//! endpoints are recorded when their window is over.

use tokio::time::Instant;

use super::super::stream::{Change, ScopeSpec};
use super::{Batch, Recorder};
use crate::model::backends::{BackendSets, ObservedNode, ObservedSlice, changed};
use crate::model::{Cause, Observed, decide_apply};
use crate::store::StateChange;

impl Recorder {
    /// A Node change at `now`: its `nodes` row, and when the Node set changed, every Service in mode
    /// `nodePort` is pending (one transaction of MODIFIEDs once the window is over).
    pub(super) fn plan_node(
        &mut self,
        batch: &mut Batch,
        scope: &ScopeSpec,
        change: Change<ObservedNode>,
        now: Instant,
    ) {
        let (rv, listed) = progress(&change, |n| &n.resource_version);
        let (rows, node_set_changed) = self.members.node(change);
        for node in rows.upserts {
            batch.changes.push(StateChange::Node { name: node.name.clone(), node: Some(Box::new(node)) });
        }
        for name in rows.deletes {
            batch.changes.push(StateChange::Node { name, node: None });
        }
        if node_set_changed {
            let fed: Vec<_> = self
                .mirror
                .iter()
                .filter(|(k, t)| self.members.uses_nodes(&t.view) && !self.guard.holds(k))
                .map(|(k, _)| k.clone())
                .collect();
            for key in fed {
                batch.report.members_coalesced += u64::from(self.members.touch(&key, now));
            }
        }
        self.note_list(batch, scope, &rv, listed);
    }

    /// An EndpointSlice change at `now`: the Services whose slices changed (and whose members depend
    /// on them) are pending.
    pub(super) fn plan_slice(
        &mut self,
        batch: &mut Batch,
        scope: &ScopeSpec,
        change: Change<ObservedSlice>,
        now: Instant,
    ) {
        let (rv, listed) = progress(&change, |s| &s.resource_version);
        for key in self.members.slice(scope, change) {
            if self.mirror.get(&key).is_some_and(|t| self.members.uses_slices(&t.view)) {
                batch.report.members_coalesced += u64::from(self.members.touch(&key, now));
            }
        }
        self.note_list(batch, scope, &rv, listed);
    }

    fn note_list(&mut self, batch: &mut Batch, scope: &ScopeSpec, rv: &str, listed: Option<bool>) {
        self.note_progress(batch, scope, rv, listed);
        if listed == Some(false) {
            batch.report.first_lists.push(scope.key());
        }
    }

    /// Recomputes the pending Services that came due at `now` and records the ADDEDs whose wait for
    /// endpoints is over.
    pub(super) fn flush_members(&mut self, batch: &mut Batch, now: Instant) {
        let (due, deferred) = self.members.take_due(now);
        for key in due {
            // A Service whose deletion is held is gone from the cluster: its members are not news.
            let Some(t) = self.mirror.get(&key).filter(|_| !self.guard.holds(&key)) else { continue };
            let backends = self.members.compute(&key, &t.view, &t.backends);
            if !changed(&t.backends, &backends) {
                batch.report.members_unchanged += 1;
                continue;
            }
            let obs = Observed { backends: backends.into(), ..super::observed(&key, t) };
            let decision = decide_apply(Some(t), &obs);
            self.take(batch, &key, Cause::Backends, decision, Some(&obs));
        }
        for mut obs in deferred {
            obs.backends = self.members.compute(&obs.key, &obs.view, &BackendSets::new()).into();
            let decision = self.decide(&obs);
            let key = obs.key.clone();
            self.take(batch, &key, Cause::Watch, decision, Some(&obs));
        }
    }
}

/// The resourceVersion a change carries (none for a list) and, for a list, whether it was a re-list.
fn progress<T>(change: &Change<T>, rv: impl Fn(&T) -> &String) -> (String, Option<bool>) {
    match change {
        Change::Apply(t) | Change::Delete(t) => (rv(t).clone(), None),
        Change::Listed { first, .. } => (String::new(), Some(!first)),
    }
}
