//! Pool members on the recorder's side: the [`BackendIndex`] the Node and EndpointSlice watches keep
//! up to date, which Services must have their members recomputed and when (coalescing), and the ADDEDs
//! that wait for their first endpoints. Rules (docs/how-to/backends.md):
//!
//! - a Service whose inputs changed is recomputed once no further change came for `backends.window`
//!   (250 ms), and at the latest `backends.max_wait` (2 s) after the first change: one MODIFIED per
//!   window, never a storm during a rolling update;
//! - a Service whose own spec changes is recomputed at once (its MODIFIED carries the members too);
//! - a new Service in mode `pod` with no member yet is announced at most one window later, with what
//!   arrived by then, so it is not announced with an empty pool;
//! - a recomputation that finds the same members (same hash) records nothing.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use vipwatch_contract::{BackendMode, CompactString};

use super::stream::{Change, ScopeSpec};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::model::backends::{
    BackendIndex, BackendSets, MODE_ANNOTATION, MemberRules, ModePlan, ObservedNode, ObservedSlice, annotated,
    compute_sets,
};
use crate::model::{ChangeKind, Notice, Observed, Reason, Recorded, ServiceKey, ServiceView, Tracked};

/// When a Service with changed inputs is due.
#[derive(Debug, Clone, Copy)]
struct Pending {
    first: Instant,
    last: Instant,
}

/// The member side of the recorder. Build with [`Members::new`].
pub(super) struct Members {
    index: BackendIndex,
    plan: ModePlan,
    rules: MemberRules,
    window: Duration,
    max_wait: Duration,
    dirty: HashMap<ServiceKey, Pending>,
    deferred: HashMap<ServiceKey, (Observed, Instant)>,
    metrics: Arc<Metrics>,
}

/// What a Node change means for the state table: upserts and deletes of `nodes` rows.
pub(super) struct NodeRows {
    /// Nodes whose projection changed (new ones included).
    pub upserts: Vec<ObservedNode>,
    /// Nodes gone.
    pub deletes: Vec<String>,
}

impl Members {
    /// Members computed as `config` says, with `stored` (the `nodes` table) as the known Nodes.
    pub fn new(config: &Config, stored: Vec<ObservedNode>, metrics: Arc<Metrics>) -> Self {
        let mut index = BackendIndex::default();
        for n in stored {
            index.set_node(&n.name, n.view);
        }
        Self {
            index,
            plan: config.mode_plan(),
            rules: config.backends.rules(),
            window: config.backends.window,
            max_wait: config.backends.max_wait,
            dirty: HashMap::new(),
            deferred: HashMap::new(),
            metrics,
        }
    }

    /// Whether Nodes and EndpointSlices are watched at all (some mode but `none` is configured).
    pub fn watched(&self) -> bool {
        self.plan.any()
    }

    /// The members of `key` with `view` in every mode some endpoint may use, numbered against `current`.
    pub fn compute(&self, key: &ServiceKey, view: &ServiceView, current: &BackendSets) -> BackendSets {
        compute_sets(key, view, &self.plan.modes_for(view), &self.rules, &self.index, current)
    }

    /// Applies a Node change to the index; returns the `nodes` rows to write and whether the Node set
    /// changed (then every Service in mode `nodePort` must be recomputed).
    pub fn node(&mut self, change: Change<ObservedNode>) -> (NodeRows, bool) {
        let mut rows = NodeRows { upserts: Vec::new(), deletes: Vec::new() };
        match change {
            Change::Apply(n) => {
                if self.index.set_node(&n.name, n.view.clone()) {
                    rows.upserts.push(n);
                }
            }
            Change::Delete(n) => {
                if self.index.remove_node(&n.name) {
                    rows.deletes.push(n.name);
                }
            }
            Change::Listed { items, .. } => {
                let listed: BTreeSet<&String> = items.iter().map(|n| &n.name).collect();
                rows.deletes = self.index.nodes().keys().filter(|n| !listed.contains(n)).cloned().collect();
                rows.upserts =
                    items.iter().filter(|n| self.index.nodes().get(&n.name) != Some(&n.view)).cloned().collect();
                self.index.replace_nodes(items.into_iter().map(|n| (n.name, n.view)).collect());
            }
        }
        let changed = !rows.upserts.is_empty() || !rows.deletes.is_empty();
        (rows, changed)
    }

    /// Applies an EndpointSlice change of `scope` to the index; returns the Services whose slices changed.
    pub fn slice(&mut self, scope: &ScopeSpec, change: Change<ObservedSlice>) -> BTreeSet<ServiceKey> {
        match change {
            Change::Apply(s) => self.index.set_slice(s).into_iter().collect(),
            Change::Delete(s) => self.index.remove_slice(&s.namespace, &s.name).into_iter().collect(),
            Change::Listed { items, .. } => self.index.replace_slices(scope.namespace.as_deref(), items),
        }
    }

    /// Whether the members of a Service with `view` depend on its EndpointSlices (mode `pod`, or
    /// `externalTrafficPolicy: Local` with `local_endpoints_only`).
    pub fn uses_slices(&self, view: &ServiceView) -> bool {
        let modes = self.plan.modes_for(view);
        let local = view.external_traffic_policy.as_deref() == Some("Local") && self.rules.local_endpoints_only;
        modes.contains(&BackendMode::Pod) || (local && modes.contains(&BackendMode::NodePort))
    }

    /// Whether the members of a Service with `view` depend on the Nodes (mode `nodePort`).
    pub fn uses_nodes(&self, view: &ServiceView) -> bool {
        self.plan.modes_for(view).contains(&BackendMode::NodePort)
    }

    /// `key`'s inputs changed at `now`: it is due once the window passes without another change, and
    /// at the latest `max_wait` after the first one.
    pub fn touch(&mut self, key: &ServiceKey, now: Instant) {
        match self.dirty.get_mut(key) {
            Some(p) => {
                p.last = now;
                self.metrics.backend_coalesced.inc();
            }
            None => {
                self.dirty.insert(key.clone(), Pending { first: now, last: now });
            }
        }
    }

    /// `key` was just recomputed with its own change: nothing is pending for it any more.
    pub fn settled(&mut self, key: &ServiceKey) {
        self.dirty.remove(key);
    }

    /// Forgets every pending recomputation (after the first lists, which computed everything).
    pub fn settle_all(&mut self) {
        self.dirty.clear();
    }

    /// Whether the ADDED of `obs` (members computed) should wait for its first endpoints: some mode is
    /// `pod` and it has no member yet.
    pub fn should_wait(&self, obs: &Observed) -> bool {
        obs.backends.get(&BackendMode::Pod).is_some_and(|b| b.members().next().is_none())
    }

    /// Holds the ADDED of `obs` until one window after the first time it was held.
    pub fn defer(&mut self, obs: Observed, now: Instant) {
        let at = self.deferred.get(&obs.key).map_or(now + self.window, |(_, at)| *at);
        self.deferred.insert(obs.key.clone(), (obs, at));
    }

    /// Drops the held ADDED of `key`, if any; returns whether there was one.
    pub fn forget(&mut self, key: &ServiceKey) -> bool {
        self.deferred.remove(key).is_some()
    }

    /// Every held ADDED, by key (a relist decides them at once).
    pub fn deferred_keys(&self) -> Vec<ServiceKey> {
        self.deferred.keys().cloned().collect()
    }

    /// When the next recomputation or held ADDED is due.
    pub fn next_due(&self) -> Option<Instant> {
        let dirty = self.dirty.values().map(|p| self.due(p));
        dirty.chain(self.deferred.values().map(|(_, at)| *at)).min()
    }

    /// Takes the Services due at `now` (by key, deterministic) and the held ADDEDs due.
    pub fn take_due(&mut self, now: Instant) -> (Vec<ServiceKey>, Vec<Observed>) {
        let mut due: Vec<ServiceKey> =
            self.dirty.iter().filter(|(_, p)| self.due(p) <= now).map(|(k, _)| k.clone()).collect();
        due.sort();
        for k in &due {
            self.dirty.remove(k);
        }
        let mut held: Vec<ServiceKey> =
            self.deferred.iter().filter(|(_, (_, at))| *at <= now).map(|(k, _)| k.clone()).collect();
        held.sort();
        let adds = held.iter().filter_map(|k| self.deferred.remove(k)).map(|(o, _)| o).collect();
        (due, adds)
    }

    fn due(&self, p: &Pending) -> Instant {
        (p.last + self.window).min(p.first + self.max_wait)
    }

    /// Counts a recomputation that changed nothing.
    pub fn noop(&self) {
        self.metrics.backend_noop.inc();
    }

    /// The known Nodes by eligibility: `(eligible, not eligible)`.
    pub fn node_counts(&self) -> (usize, usize) {
        let eligible = self.index.nodes().values().filter(|n| n.eligible()).count();
        (eligible, self.index.nodes().len() - eligible)
    }
}

/// Kubernetes Events about the members of a recorded change: `UnAvailableLoadBalancer` (Warning, the
/// upstream service controller's reason) when a mode's members become empty, saying why; and
/// `InvalidBackendMode` (Warning) when the `vipwatch.io/backend-mode` annotation newly holds a value
/// that is not a mode.
pub(super) fn notices(key: &ServiceKey, e: &Recorded, before: Option<&Tracked>) -> Vec<Notice> {
    if e.kind == ChangeKind::Deleted {
        return Vec::new();
    }
    let notice = |reason, note| Notice { key: key.clone(), uid: e.uid.clone(), reason, note };
    let mut out = Vec::new();
    for (mode, b) in e.backends.iter() {
        let was_empty = before.and_then(|t| t.backends.get(mode)).is_some_and(|o| o.members().next().is_none());
        if b.members().next().is_none() && !was_empty {
            let why = b.reason.clone().unwrap_or_else(|| match mode {
                BackendMode::NodePort => "no eligible Node has an address of the Service's families".to_owned(),
                BackendMode::Pod => "no ready or draining endpoint".to_owned(),
            });
            let note = format!("There are no available members for the load balancer (mode {}): {why}", mode.as_str());
            out.push(notice(Reason::UnAvailableLoadBalancer, note));
        }
    }
    if let Err(value) = annotated(&e.view) {
        let was = before.and_then(|t| t.view.annotations.get(MODE_ANNOTATION)).map(CompactString::as_str);
        if was != Some(value) {
            let value = crate::model::bounded::bounded(value, crate::model::bounded::QUOTE);
            let note =
                format!("{MODE_ANNOTATION}: `{value}` is not nodePort, pod or none; the configured mode applies");
            out.push(notice(Reason::InvalidBackendMode, note));
        }
    }
    out
}
