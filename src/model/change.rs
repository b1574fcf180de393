//! The change decision: given what the state table holds for a Service and what the apiserver just
//! said, which events (if any) to record. Rules: the Kubernetes list/watch semantics (a status-only
//! write is no change; a uid flip is a DELETED and an ADDED); see docs/explanation/recording.md.

use serde::{Deserialize, Serialize};
use std::sync::Arc;

pub use vipwatch_contract::Cause;

use std::collections::BTreeMap;

use vipwatch_contract::{BackendMode, BackendsDiff};

use super::backends::{self, BackendSets};
use super::{ServiceKey, ServiceView, changed_fields};

/// Event type, as the Kubernetes watch names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum ChangeKind {
    /// The Service entered scope (created, or its type/class moved into scope).
    Added,
    /// An LB-relevant field, a label or an annotation changed.
    Modified,
    /// The Service left scope (deleted, or its type/class moved out).
    Deleted,
}

impl ChangeKind {
    /// `ADDED`, `MODIFIED` or `DELETED`: the string stored in the event log.
    pub fn as_str(self) -> &'static str {
        self.event_kind().as_str()
    }

    /// The kind as the webhook contract names it (`data.event`).
    pub fn event_kind(self) -> vipwatch_contract::EventKind {
        match self {
            Self::Added => vipwatch_contract::EventKind::Added,
            Self::Modified => vipwatch_contract::EventKind::Modified,
            Self::Deleted => vipwatch_contract::EventKind::Deleted,
        }
    }
}

/// What the current-state table holds for one Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tracked {
    /// `metadata.uid` of the object we announced.
    pub uid: String,
    /// `metadata.resourceVersion` of the last write we saw.
    pub resource_version: String,
    /// The normalized view we last stored.
    pub view: Arc<ServiceView>,
    /// Its members per backend mode, as last announced (shared with the event that announced them).
    pub backends: Arc<BackendSets>,
}

/// A Service as the apiserver just reported it, normalized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// Namespace and name.
    pub key: ServiceKey,
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.resourceVersion`.
    pub resource_version: String,
    /// The normalized view.
    pub view: Arc<ServiceView>,
    /// Whether [`super::Scope::contains`] accepts it.
    pub in_scope: bool,
    /// Its members per backend mode, computed by the recorder (empty until then); shared with the
    /// event and the mirror entry made from it (the event, the mirror and the recorder would otherwise
    /// hold three copies of every Service's members).
    pub backends: Arc<BackendSets>,
}

/// What to do for one observation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Record these events, in order (each also updates the state row). At most two: a UID change is
    /// a DELETED of the old object followed by an ADDED of the new one.
    Record(Vec<Recorded>),
    /// No event, but refresh the state row (status-only or resourceVersion-only update).
    Refresh(Box<Tracked>),
    /// Nothing to do (out of scope and untracked, or identical).
    Nothing,
}

/// One event to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// ADDED, MODIFIED or DELETED.
    pub kind: ChangeKind,
    /// uid of the object the event is about.
    pub uid: String,
    /// resourceVersion at which the change was observed.
    pub resource_version: String,
    /// The view after the change; for DELETED, the last view.
    pub view: Arc<ServiceView>,
    /// For MODIFIED: the view before, shared with the mirror entry it replaces (not a deep copy per
    /// change, which costs dozens of allocations).
    pub previous: Option<Arc<ServiceView>>,
    /// For MODIFIED: the changed field names, see [`changed_fields`], plus `backends` when the members
    /// of some mode changed.
    pub changed: Vec<&'static str>,
    /// The members after the change (for DELETED, the last ones announced).
    pub backends: Arc<BackendSets>,
    /// For MODIFIED: per mode whose members changed, what changed.
    pub backends_diff: BTreeMap<BackendMode, BackendsDiff>,
    /// For a MODIFIED that changed the `vipwatch.io/backend-mode` annotation: the members before, so
    /// an endpoint whose mode switched gets a diff from the members it had (not stored; routing only).
    pub previous_backends: Option<BackendSets>,
}

impl Recorded {
    fn added(obs: &Observed) -> Self {
        Self {
            kind: ChangeKind::Added,
            uid: obs.uid.clone(),
            resource_version: obs.resource_version.clone(),
            view: obs.view.clone(),
            previous: None,
            changed: Vec::new(),
            backends: obs.backends.clone(),
            backends_diff: BTreeMap::new(),
            previous_backends: None,
        }
    }

    /// A DELETED carrying `view` and `backends` as the last state.
    pub fn deleted(uid: &str, resource_version: &str, view: &Arc<ServiceView>, backends: &Arc<BackendSets>) -> Self {
        Self {
            kind: ChangeKind::Deleted,
            uid: uid.to_owned(),
            resource_version: resource_version.to_owned(),
            view: view.clone(),
            previous: None,
            changed: Vec::new(),
            backends: backends.clone(),
            backends_diff: BTreeMap::new(),
            previous_backends: None,
        }
    }
}

/// Decides an `Apply` (created or updated object, from a watch or a list).
///
/// - untracked + in scope → ADDED; untracked + out of scope → nothing;
/// - tracked + out of scope → DELETED carrying the last view we announced (what the appliance knows);
/// - tracked with another uid → DELETED of the old object, then ADDED of the new one;
/// - same uid → MODIFIED when [`changed_fields`] is non-empty, else a silent refresh when the
///   resourceVersion or status moved, else nothing.
pub fn decide_apply(current: Option<&Tracked>, obs: &Observed) -> Decision {
    match (current, obs.in_scope) {
        (None, false) => Decision::Nothing,
        (None, true) => Decision::Record(vec![Recorded::added(obs)]),
        (Some(cur), false) => {
            Decision::Record(vec![Recorded::deleted(&cur.uid, &obs.resource_version, &cur.view, &cur.backends)])
        }
        (Some(cur), true) if cur.uid != obs.uid => Decision::Record(vec![
            Recorded::deleted(&cur.uid, &obs.resource_version, &cur.view, &cur.backends),
            Recorded::added(obs),
        ]),
        (Some(cur), true) => modified_or_refresh(cur, obs),
    }
}

fn modified_or_refresh(cur: &Tracked, obs: &Observed) -> Decision {
    let mut changed = changed_fields(&cur.view, &obs.view);
    if backends::changed(&cur.backends, &obs.backends) {
        changed.push("backends");
    }
    if !changed.is_empty() {
        return Decision::Record(vec![Recorded {
            kind: ChangeKind::Modified,
            uid: obs.uid.clone(),
            resource_version: obs.resource_version.clone(),
            view: obs.view.clone(),
            previous: Some(cur.view.clone()),
            changed,
            backends: obs.backends.clone(),
            backends_diff: backends::diffs(&cur.backends, &obs.backends),
            previous_backends: (backends::annotated(&cur.view) != backends::annotated(&obs.view))
                .then(|| (*cur.backends).clone()),
        }]);
    }
    if cur.resource_version != obs.resource_version || cur.view != obs.view {
        return Decision::Refresh(Box::new(obs.tracked()));
    }
    Decision::Nothing
}

impl Observed {
    /// What the state table holds once this observation is taken.
    pub fn tracked(&self) -> Tracked {
        Tracked {
            uid: self.uid.clone(),
            resource_version: self.resource_version.clone(),
            view: self.view.clone(),
            backends: self.backends.clone(),
        }
    }
}

/// Decides a watch `DELETED`: a DELETED event carrying the object's last state as the apiserver sent
/// it, when we track that very object (same uid); nothing otherwise.
///
/// Its allocation is the one we announced (`current`'s): the object as deleted cannot carry it, since
/// vipwatch adds it to views it observes, and the addresses a DELETED withdraws, which stay reserved
/// until it is acknowledged, are read from it ([`crate::ipam::withdrawn`]). Without it, a Service
/// deleted with no finalizer of ours on it (`kubernetes.finalizer = false`) kept its pool address
/// reserved for a release that was never recorded, until a restart.
pub fn decide_delete(current: Option<&Tracked>, obs: &Observed) -> Decision {
    match current {
        Some(cur) if cur.uid == obs.uid => {
            let mut view = obs.view.clone();
            if view.allocation != cur.view.allocation {
                Arc::make_mut(&mut view).allocation = cur.view.allocation.clone();
            }
            Decision::Record(vec![Recorded::deleted(&obs.uid, &obs.resource_version, &view, &cur.backends)])
        }
        _ => Decision::Nothing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn observed(uid: &str, rv: &str, json: serde_json::Value, in_scope: bool) -> Observed {
        let view = ServiceView::from_service(&serde_json::from_value(json).unwrap());
        let key = ServiceKey::new("ns", "a");
        Observed {
            key,
            uid: uid.into(),
            resource_version: rv.into(),
            view: view.into(),
            in_scope,
            backends: Default::default(),
        }
    }

    fn tracked(o: &Observed) -> Tracked {
        o.tracked()
    }

    fn lb() -> serde_json::Value {
        serde_json::json!({"metadata": {"name": "a"}, "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}})
    }

    #[test]
    fn uid_change_is_deleted_then_added() {
        let old = observed("u1", "1", lb(), true);
        let new = observed("u2", "5", lb(), true);
        let Decision::Record(events) = decide_apply(Some(&tracked(&old)), &new) else { panic!() };
        let kinds: Vec<_> = events.iter().map(|e| (e.kind, e.uid.as_str())).collect();
        assert_eq!(kinds, vec![(ChangeKind::Deleted, "u1"), (ChangeKind::Added, "u2")]);
    }

    #[test]
    fn resource_version_only_is_a_silent_refresh() {
        let old = observed("u1", "1", lb(), true);
        let new = observed("u1", "2", lb(), true);
        assert_eq!(decide_apply(Some(&tracked(&old)), &new), Decision::Refresh(Box::new(tracked(&new))));
        assert_eq!(decide_apply(Some(&tracked(&new)), &new), Decision::Nothing);
    }

    #[test]
    fn leaving_scope_deletes_with_the_announced_view() {
        let old = observed("u1", "1", lb(), true);
        let new = observed("u1", "2", serde_json::json!({"metadata": {"name": "a"}}), false);
        let Decision::Record(events) = decide_apply(Some(&tracked(&old)), &new) else { panic!() };
        assert_eq!(events, vec![Recorded::deleted("u1", "2", &old.view, &Default::default())]);
    }

    #[test]
    fn delete_of_an_untracked_or_other_uid_is_ignored() {
        let old = observed("u1", "1", lb(), true);
        assert_eq!(decide_delete(None, &old), Decision::Nothing);
        let other = observed("u9", "3", lb(), true);
        assert_eq!(decide_delete(Some(&tracked(&old)), &other), Decision::Nothing);
    }
}
