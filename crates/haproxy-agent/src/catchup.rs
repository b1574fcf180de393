//! Whether the agent may be trusted with traffic: "caught up". An agent that just started could not
//! receive what vipwatch sent while it was down, and one that lost its state knows nothing at all; a
//! full resync (every Service as `service.synced`, then `sync.completed`, see [`crate::sync`]) brings
//! a cluster up to date. So, after a start:
//!
//! - a cluster is **caught up** once a full resync of it has gone live in this run; until then, a
//!   cluster the agent had Services or a binding of at start is not (they may be stale), and neither
//!   is any cluster when the agent started without a state it can trust (none at all, or one made
//!   while it held a HAProxy it did not configure). A cluster first heard of in this run, by an agent
//!   with a trusted state, is caught up: everything of it came in this run.
//! - the **agent** is caught up once every cluster it waits for is, and at least one resync went
//!   live in this run. It waits for the clusters in `clusters` when that key is set, else for every
//!   cluster `state.json` binds at start (none when it has no state: then the first resync decides).
//!   `/healthz` answers 503 until then, so keepalived does not give it the VIPs.
//!
//! vipwatch learns both through the answers' headers ([`vipwatch_contract::receiver`]): the identity
//! of the state (`generation`, made with the state and kept in `state.json`), the run (`instance`)
//! and, per delivery, whether the delivery's cluster is caught up.

use std::collections::{BTreeMap, BTreeSet};

use vipwatch_contract::{ReceiverIdentity, ReceiverState};

/// A fresh state identity, `gen_` + 32 hex digits.
pub fn new_generation() -> String {
    format!("gen_{:032x}", rand::random::<u128>())
}

/// A fresh run identity, `run_` + 32 hex digits.
pub fn new_instance() -> String {
    format!("run_{:032x}", rand::random::<u128>())
}

/// What the agent found at start.
#[derive(Debug, Clone, Default)]
pub struct Start {
    /// The state's identity (`state.json`'s `generation`).
    pub generation: String,
    /// Whether `state.json` describes what HAProxy runs: it existed, and was not made while the
    /// agent held a HAProxy it had not configured.
    pub trusted: bool,
    /// The clusters `state.json` binds.
    pub bound: BTreeSet<String>,
    /// The `clusters` key of the configuration.
    pub expected: Vec<String>,
}

/// The catch-up state of one run (module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CatchUp {
    generation: String,
    instance: String,
    /// The clusters whose Services may be stale; `None`: every cluster (no trusted state).
    stale: Option<BTreeSet<String>>,
    /// The clusters the agent waits for.
    waiting: BTreeSet<String>,
    /// The clusters whose full resync went live in this run.
    resynced: BTreeSet<String>,
    /// HAProxy runs a configuration the agent did not make and is left alone until caught up.
    pub held: bool,
}

impl CatchUp {
    /// The state of a run started as `start` says, with identity `instance`, holding HAProxy when
    /// `held`.
    pub fn new(start: Start, instance: String, held: bool) -> Self {
        let waiting =
            if start.expected.is_empty() { start.bound.clone() } else { start.expected.iter().cloned().collect() };
        let stale = start.trusted.then_some(start.bound);
        Self { generation: start.generation, instance, stale, waiting, resynced: BTreeSet::new(), held }
    }

    /// The state's identity.
    pub fn generation(&self) -> &str {
        &self.generation
    }

    /// Whether `cluster` is caught up.
    pub fn cluster(&self, cluster: &str) -> bool {
        self.resynced.contains(cluster) || self.stale.as_ref().is_some_and(|s| !s.contains(cluster))
    }

    /// Whether the agent is caught up.
    pub fn caught_up(&self) -> bool {
        self.caught_up_with(&BTreeSet::new())
    }

    /// Whether the agent would be caught up once the resyncs of `more` clusters go live too.
    pub fn caught_up_with(&self, more: &BTreeSet<String>) -> bool {
        let done = |c: &String| self.resynced.contains(c) || more.contains(c);
        (!self.resynced.is_empty() || !more.is_empty()) && self.waiting.iter().all(done)
    }

    /// Records that a full resync of `cluster` went live.
    pub fn resynced(&mut self, cluster: &str) {
        self.resynced.insert(cluster.to_owned());
    }

    /// Follows a cluster renamed from `from` to `to` (its event log now delivers under `to`).
    pub fn renamed(&mut self, from: &str, to: &str) {
        for set in [Some(&mut self.waiting), Some(&mut self.resynced), self.stale.as_mut()].into_iter().flatten() {
            if set.remove(from) {
                set.insert(to.to_owned());
            }
        }
    }

    /// The clusters still waited for.
    pub fn waiting_for(&self) -> Vec<String> {
        self.waiting.difference(&self.resynced).cloned().collect()
    }

    /// The answers' headers; `cluster` is the one the answer is about (a delivery's, a probe's).
    pub fn identity(&self, cluster: Option<&str>) -> ReceiverIdentity {
        ReceiverIdentity {
            generation: self.generation.clone(),
            instance: self.instance.clone(),
            caught_up: cluster.map(|c| self.cluster(c)),
            concurrency: None,
        }
    }

    /// The answer to a probe for `cluster`; `known` are the clusters the agent knows.
    pub fn probe(&self, cluster: &str, known: impl IntoIterator<Item = String>) -> ReceiverState {
        let clusters: BTreeMap<String, bool> = known
            .into_iter()
            .chain(self.waiting.iter().cloned())
            .map(|c| {
                let up = self.cluster(&c);
                (c, up)
            })
            .collect();
        ReceiverState {
            generation: self.generation.clone(),
            instance: self.instance.clone(),
            cluster: cluster.to_owned(),
            cluster_caught_up: self.cluster(cluster),
            caught_up: self.caught_up(),
            waiting_for: self.waiting_for(),
            clusters,
        }
    }

    /// Why the agent is not caught up, for `/healthz`; `None` when it is.
    pub fn reason(&self) -> Option<String> {
        if self.caught_up() {
            return None;
        }
        let waiting = self.waiting_for();
        let what = if waiting.is_empty() {
            "waiting for the first full resync (this run has none yet, and its state names no cluster to wait for)"
                .to_owned()
        } else {
            format!("waiting for a full resync of cluster {}", waiting.join(", "))
        };
        let held = if self.held {
            "; HAProxy keeps the configuration it runs (the agent's state was lost) until then"
        } else {
            ""
        };
        Some(format!("not caught up: {what}{held}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| (*s).to_owned()).collect()
    }

    fn start(trusted: bool, bound: &[&str], expected: &[&str]) -> Start {
        Start {
            generation: "gen_1".into(),
            trusted,
            bound: set(bound),
            expected: expected.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    #[test]
    fn a_restarted_agent_waits_for_every_cluster_it_had_and_trusts_clusters_new_to_it() {
        let mut c = CatchUp::new(start(true, &["east", "west"], &[]), "run_1".into(), false);
        assert!(!c.caught_up());
        assert_eq!((c.cluster("east"), c.cluster("west"), c.cluster("north")), (false, false, true));
        assert_eq!(c.reason().as_deref(), Some("not caught up: waiting for a full resync of cluster east, west"));
        c.resynced("east");
        assert_eq!((c.caught_up(), c.cluster("east"), c.waiting_for()), (false, true, vec!["west".to_owned()]));
        assert!(c.caught_up_with(&set(&["west"])));
        c.resynced("west");
        assert_eq!((c.caught_up(), c.reason()), (true, None));
    }

    #[test]
    fn an_agent_without_a_state_trusts_no_cluster_and_waits_for_a_first_resync() {
        let mut c = CatchUp::new(start(false, &[], &[]), "run_1".into(), true);
        assert_eq!((c.caught_up(), c.cluster("default"), c.cluster("east")), (false, false, false));
        assert_eq!(
            c.reason().as_deref(),
            Some(
                "not caught up: waiting for the first full resync (this run has none yet, and its state names no \
                 cluster to wait for); HAProxy keeps the configuration it runs (the agent's state was lost) until then"
            )
        );
        assert!(!c.caught_up_with(&BTreeSet::new()));
        c.resynced("east");
        assert_eq!((c.caught_up(), c.cluster("east"), c.cluster("west")), (true, true, false));
    }

    #[test]
    fn the_configured_clusters_are_waited_for_instead_of_those_in_the_state() {
        // A cluster whose vipwatch is gone for good is left out of `clusters`: it does not block.
        let mut c = CatchUp::new(start(true, &["east", "gone"], &["east"]), "run_1".into(), false);
        c.resynced("east");
        assert!(c.caught_up());
        assert!(!c.cluster("gone"), "its Services may still be stale");
        // Without a state, every configured cluster is needed.
        let mut c = CatchUp::new(start(false, &[], &["east", "west"]), "run_1".into(), false);
        c.resynced("east");
        assert!(!c.caught_up());
        c.resynced("west");
        assert!(c.caught_up());
    }

    #[test]
    fn a_rename_carries_what_the_cluster_waits_for() {
        let mut c = CatchUp::new(start(true, &["east"], &[]), "run_1".into(), false);
        c.renamed("east", "east-1");
        assert_eq!((c.cluster("east-1"), c.waiting_for()), (false, vec!["east-1".to_owned()]));
        c.resynced("east-1");
        assert!(c.caught_up());
    }

    #[test]
    fn identities_and_the_probe_say_the_same() {
        let c = CatchUp::new(start(true, &["east"], &[]), "run_9".into(), false);
        let id = c.identity(Some("east"));
        assert_eq!((id.generation.as_str(), id.instance.as_str(), id.caught_up), ("gen_1", "run_9", Some(false)));
        assert_eq!(c.identity(None).caught_up, None);
        let probe = c.probe("north", ["east".to_owned()]);
        assert_eq!(
            serde_json::to_value(&probe).unwrap(),
            serde_json::json!({"generation": "gen_1", "instance": "run_9", "cluster": "north",
                               "clusterCaughtUp": true, "caughtUp": false, "waitingFor": ["east"],
                               "clusters": {"east": false}})
        );
        assert!(new_generation().starts_with("gen_") && new_generation().len() == 36);
        assert_ne!(new_instance(), new_instance());
    }
}
