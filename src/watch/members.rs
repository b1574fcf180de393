//! Pool members on the recorder's side: the [`BackendIndex`] the Node and EndpointSlice watches keep
//! up to date, which Services must have their members recomputed and when (coalescing), and the ADDEDs
//! that wait for their first endpoints. Rules (docs/how-to/backends.md):
//!
//! - a Service whose inputs changed is recomputed once no further change came for `backends.window`,
//!   and at the latest `backends.max_wait` after the first change: one MODIFIED per
//!   window, never a storm during a rolling update;
//! - a Service whose own spec changes is recomputed at once (its MODIFIED carries the members too);
//! - a new Service in mode `pod` with no member yet is announced at most one window later, with what
//!   arrived by then, so it is not announced with an empty pool;
//! - a recomputation that finds the same members (same hash) records nothing.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use tokio::time::Instant;
use vipwatch_contract::{BackendMode, CompactString};

use super::stream::{Change, ScopeSpec};
use crate::config::Config;
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
    /// Services whose inputs changed, by when they are due.
    dirty: HashMap<ServiceKey, Pending>,
    /// ADDEDs of Services in mode `pod` waiting for their first endpoints, until when.
    deferred: HashMap<ServiceKey, (Observed, Instant)>,
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
    pub fn new(config: &Config, stored: Vec<ObservedNode>) -> Self {
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
        }
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
    /// at the latest `max_wait` after the first one. Returns whether the change was folded into one
    /// already pending (coalesced).
    pub fn touch(&mut self, key: &ServiceKey, now: Instant) -> bool {
        match self.dirty.get_mut(key) {
            Some(p) => {
                p.last = now;
                true
            }
            None => {
                self.dirty.insert(key.clone(), Pending { first: now, last: now });
                false
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

    /// Defers the ADDED of `obs` until one window after the first time it was deferred.
    pub fn defer(&mut self, obs: Observed, now: Instant) {
        let at = self.deferred.get(&obs.key).map_or(now + self.window, |(_, at)| *at);
        self.deferred.insert(obs.key.clone(), (obs, at));
    }

    /// Drops the deferred ADDED of `key`, if any; returns whether there was one.
    pub fn forget(&mut self, key: &ServiceKey) -> bool {
        self.deferred.remove(key).is_some()
    }

    /// Every deferred ADDED, by key (a relist decides them at once).
    pub fn deferred_keys(&self) -> Vec<ServiceKey> {
        self.deferred.keys().cloned().collect()
    }

    /// When the next recomputation or deferred ADDED is due.
    pub fn next_due(&self) -> Option<Instant> {
        let dirty = self.dirty.values().map(|p| self.due(p));
        dirty.chain(self.deferred.values().map(|(_, at)| *at)).min()
    }

    /// Takes the Services due at `now` (by key, deterministic) and the deferred ADDEDs due (by key).
    pub fn take_due(&mut self, now: Instant) -> (Vec<ServiceKey>, Vec<Observed>) {
        let mut due: Vec<ServiceKey> =
            self.dirty.iter().filter(|(_, p)| self.due(p) <= now).map(|(k, _)| k.clone()).collect();
        due.sort();
        for k in &due {
            self.dirty.remove(k);
        }
        let mut ready: Vec<ServiceKey> =
            self.deferred.iter().filter(|(_, (_, at))| *at <= now).map(|(k, _)| k.clone()).collect();
        ready.sort();
        let adds = ready.iter().filter_map(|k| self.deferred.remove(k)).map(|(o, _)| o).collect();
        (due, adds)
    }

    fn due(&self, p: &Pending) -> Instant {
        (p.last + self.window).min(p.first + self.max_wait)
    }

    /// The known Nodes by eligibility: `(eligible, not eligible)`.
    pub fn node_counts(&self) -> (usize, usize) {
        let eligible = self.index.nodes().values().filter(|n| n.eligible()).count();
        (eligible, self.index.nodes().len() - eligible)
    }
}

/// Kubernetes Events about the members of a recorded change: `UnAvailableLoadBalancer` (Warning, the
/// upstream service controller's reason) when a mode's members become empty, saying why; and
/// `InvalidBackendMode` (Warning) when the `vipwatch.io/backend-mode` annotation newly has a value
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

#[cfg(test)]
mod tests {
    //! The member side alone: which Node rows a change writes, and when pending recomputations and
    //! deferred ADDEDs come due (`backends.window` 250 ms, `backends.max_wait` 2 s: see [`config`]).

    use std::time::Duration;

    use serde_json::json;
    use tokio::time::Instant;

    use super::super::stream::Change;
    use super::Members;
    use crate::config::Config;
    use crate::model::backends::ObservedNode;
    use crate::model::{Observed, ServiceKey};

    /// The default config with `backends.window` 250 ms (`max_wait` is the default 2 s): the times
    /// these tests assert are multiples of it.
    fn config() -> Config {
        let mut config = Config::default();
        config.backends.window = Duration::from_millis(250);
        config
    }

    fn node(name: &str, address: &str) -> ObservedNode {
        let n = json!({"metadata": {"name": name, "resourceVersion": "1"},
                       "status": {"addresses": [{"type": "InternalIP", "address": address}]}});
        ObservedNode::from_node(&serde_json::from_value(n).expect("a Node"))
    }

    /// `(upserts, deletes, node set changed)` of one Node change.
    fn rows(members: &mut Members, change: Change<ObservedNode>) -> (Vec<String>, Vec<String>, bool) {
        let (rows, changed) = members.node(change);
        (rows.upserts.into_iter().map(|n| n.name).collect(), rows.deletes, changed)
    }

    fn strings(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn node_changes_write_only_the_rows_that_changed() {
        let stored = vec![node("n1", "10.0.0.1"), node("n2", "10.0.0.2")];
        let mut members = Members::new(&config(), stored);
        let listed = || Change::Listed { items: vec![node("n1", "10.0.0.1"), node("n3", "10.0.0.3")], first: true };
        assert_eq!(rows(&mut members, listed()), (strings(&["n3"]), strings(&["n2"]), true));
        assert_eq!(rows(&mut members, listed()), (vec![], vec![], false), "the same list again");
        assert_eq!(rows(&mut members, Change::Apply(node("n1", "10.0.0.1"))), (vec![], vec![], false));
        assert_eq!(rows(&mut members, Change::Apply(node("n1", "10.0.0.9"))), (strings(&["n1"]), vec![], true));
        assert_eq!(rows(&mut members, Change::Delete(node("n3", "10.0.0.3"))), (vec![], strings(&["n3"]), true));
        assert_eq!(rows(&mut members, Change::Delete(node("n3", "10.0.0.3"))), (vec![], vec![], false));
        assert_eq!(members.node_counts(), (1, 0));
    }

    #[test]
    fn a_pending_recomputation_is_due_a_window_after_the_last_change_and_max_wait_after_the_first() {
        let mut members = Members::new(&config(), Vec::new());
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let (web, api) = (ServiceKey::new("shop", "web"), ServiceKey::new("shop", "api"));
        assert!(!members.touch(&web, at(0)), "the first change is not coalesced");
        assert!(members.touch(&web, at(100)));
        assert!(!members.touch(&api, at(100)));
        assert_eq!(members.next_due(), Some(at(350)));
        assert_eq!(members.take_due(at(349)).0, Vec::<ServiceKey>::new());
        assert_eq!(members.take_due(at(350)).0, [api.clone(), web.clone()], "by key");
        assert_eq!(members.next_due(), None);

        // Changes that never pause for a window: due `max_wait` after the first.
        for ms in (1_000..3_000).step_by(200) {
            members.touch(&web, at(ms));
        }
        assert_eq!(members.next_due(), Some(at(3_000)));
        // Recomputed with a change of its own: nothing pending.
        members.settled(&web);
        assert_eq!(members.next_due(), None);
    }

    #[test]
    fn a_deferred_added_keeps_the_deadline_it_was_first_given() {
        let mut members = Members::new(&config(), Vec::new());
        let t0 = Instant::now();
        let service = json!({"metadata": {"namespace": "shop", "name": "web", "uid": "u-web", "resourceVersion": "1"},
                             "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}});
        let obs = |rv: &str| {
            let mut s = service.clone();
            s["metadata"]["resourceVersion"] = json!(rv);
            let s = serde_json::from_value(s).expect("a Service");
            super::super::stream::observe(s, &Config::default().kubernetes.scope())
        };
        members.defer(obs("1"), t0);
        members.defer(obs("2"), t0 + Duration::from_millis(100));
        assert_eq!(members.next_due(), Some(t0 + Duration::from_millis(250)));
        let (due, added) = members.take_due(t0 + Duration::from_millis(250));
        assert_eq!(due, Vec::<ServiceKey>::new());
        let added: Vec<String> = added.iter().map(|o: &Observed| format!("{} {}", o.key, o.resource_version)).collect();
        assert_eq!(added, ["shop/web 2"], "the last observation, at the first deadline");
        assert!(!members.forget(&ServiceKey::new("shop", "web")), "taken");
    }

    /// The recorder's loop over the coalescing rules on tokio's paused clock: a member change of
    /// `web` at each of `changes` (ms after the start), a recomputation whenever [`Members::next_due`]
    /// comes; returns when each recomputation ran (ms after the start) and how many changes were
    /// coalesced into one already pending.
    async fn recomputations(m: &mut Members, changes: &[u64]) -> (Vec<u64>, usize) {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let web = ServiceKey { namespace: "shop".into(), name: "web".into() };
        let mut changes = changes.iter().copied().peekable();
        let (mut ran, mut coalesced) = (Vec::new(), 0);
        loop {
            let next = match (changes.peek().map(|&ms| at(ms)), m.next_due()) {
                (None, None) => return (ran, coalesced),
                (Some(c), Some(d)) => c.min(d),
                (c, d) => c.or(d).unwrap(),
            };
            tokio::time::sleep_until(next).await;
            let now = Instant::now();
            if changes.next_if(|&ms| at(ms) <= now).is_some() {
                coalesced += usize::from(m.touch(&web, now));
            }
            let (due, held) = m.take_due(now);
            assert!(held.is_empty());
            if !due.is_empty() {
                assert_eq!(due, std::slice::from_ref(&web));
                ran.push(u64::try_from((now - start).as_millis()).unwrap());
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn member_changes_closer_than_the_window_are_one_recomputation_at_the_latest_max_wait_after_the_first() {
        // `backends.window` 250 ms, `backends.max_wait` 2 s.
        let mut m = Members::new(&config(), Vec::new());
        // A change every 100 ms for 3 s (a rolling update): the first at 50 ms is due at 2,050 ms
        // however many follow; the next pending change starts at 2,150 ms, and the last, at 2,950 ms,
        // is due a quiet window later.
        let rolling: Vec<u64> = (0..30).map(|k| 50 + 100 * k).collect();
        let (ran, coalesced) = recomputations(&mut m, &rolling).await;
        assert_eq!(ran, [2_050, 3_200]);
        assert_eq!(coalesced, 28, "30 changes, 2 recomputations");

        // Changes further apart than the window: one recomputation each, a window after it.
        assert_eq!(recomputations(&mut m, &[0, 300, 900]).await, (vec![250, 550, 1_150], 0));
    }
}
