//! Which vipwatch speaks for which cluster. Each cluster runs its own vipwatch; every delivery names
//! its cluster (`data.cluster`, [`DEFAULT_CLUSTER`] when absent) and the event log it comes from
//! (`data.log_id`: replicas of one vipwatch on PostgreSQL share one; a replaced database makes a new
//! one). The agent binds each cluster name to the event log that first delivered it (kept in
//! `state.json`), and judges every delivery by that binding ([`Clusters::claim`]):
//!
//! - **its own log**: applied.
//! - **another log, the bound one heard from within `cluster_takeover_after`**: refused, `409`,
//!   naming the other log: two vipwatch instances claim one cluster name (two clusters given the
//!   same `cluster.name`), and applying both would make each overwrite and sweep the other's
//!   Services. Counted per cluster, logged as a warning, shown in `/state`.
//! - **another log, the bound one silent for `cluster_takeover_after`** (or since the agent started):
//!   the new log takes the name over, with its Services: this is a vipwatch whose database was
//!   replaced (a new log, the same cluster). Logged as a warning and counted. Silence is the only
//!   sign the agent has (vipwatch sends nothing while nothing changes), so a quiet vipwatch can lose
//!   its name to a second one claiming it; the `409`s before that make the mistake visible at once.
//! - **an unbound name from a log bound to another name**: that vipwatch's `cluster.name` changed;
//!   its Services move under the new name (one reload, no second copy, no outage) and the old name
//!   is remembered with the event id at the rename. Deliveries still under the old name with an
//!   event id not above it (rendered before the rename, still on their way) are applied under the
//!   new name instead of renaming it back.
//! - **an unbound name from an unbound log**: the name is bound to the log.
//!
//! Services stored before clusters existed (unclaimed, see [`crate::state`]) are adopted by the
//! first cluster accepted from the event log their versions recorded, or — those that recorded none
//! — by the first cluster accepted at all; a cluster's delivery of the same uid supersedes one too.
//! Until then they serve under their old HAProxy names.
//!
//! Deliveries without `data.log_id` (vipwatch before 0.1) all count as one log: two such vipwatch
//! cannot be told apart.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::state::{Binding, DEFAULT_CLUSTER, Desired, is_dns_label};

/// Former names kept per cluster (the oldest are forgotten first).
const MAX_FORMER_NAMES: usize = 8;

/// What a delivery says about who sent it.
#[derive(Debug, Clone, Copy)]
pub struct Sender<'a> {
    /// `data.cluster`, if any.
    pub cluster: Option<&'a str>,
    /// `data.log_id`, if any.
    pub log_id: Option<&'a str>,
    /// `data.event_id`, if any.
    pub event_id: Option<i64>,
    /// `data.sync.as_of_event_id`, if any.
    pub as_of: Option<i64>,
}

impl<'a> Sender<'a> {
    /// The sender of `p`.
    pub fn of(p: &'a vipwatch_contract::WebhookPayload) -> Self {
        Self {
            cluster: p.data.cluster.as_deref(),
            log_id: p.data.log_id.as_deref(),
            event_id: p.data.event_id,
            as_of: p.data.sync.as_ref().and_then(|s| s.as_of_event_id),
        }
    }
}

/// A change of who speaks for a cluster, made by a delivery: logged and counted once the delivery's
/// batch is live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A cluster name seen for the first time, bound to the log.
    Bound {
        /// The cluster.
        cluster: String,
        /// Its log.
        log_id: Option<String>,
    },
    /// Another log took the name over after the bound one fell silent.
    TakenOver {
        /// The cluster.
        cluster: String,
        /// The log that held it.
        from: Option<String>,
        /// The log that holds it now.
        to: Option<String>,
        /// How long the old log had been silent.
        silent: Duration,
    },
    /// A log renamed its cluster.
    Renamed {
        /// The old name.
        from: String,
        /// The new name.
        to: String,
        /// Services moved.
        services: usize,
    },
    /// Services stored before clusters were adopted by a cluster.
    Adopted {
        /// The cluster.
        cluster: String,
        /// Services adopted.
        services: usize,
    },
}

/// The last refusal of a cluster name to another log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// The refused log.
    pub log_id: Option<String>,
    /// When.
    pub at: Instant,
    /// The refusal's reason.
    pub reason: String,
}

/// What the agent knows about one cluster beyond `state.json`: when its bound log last delivered,
/// and the refusals of its name to other logs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Liveness {
    /// The last delivery from the bound log (`None`: none since the agent started).
    pub last_delivery: Option<Instant>,
    /// Deliveries refused (`409`) since the agent started.
    pub conflicts: u64,
    /// The last of them.
    pub last_conflict: Option<Conflict>,
    /// Takeovers of the name since the agent started.
    pub takeovers: u64,
}

/// The outcome of [`Clusters::claim`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// Apply the delivery under `cluster` (its own name, or the current name of its log for a
    /// delivery made before a rename); `changes` were made to the state.
    Accepted {
        /// The cluster to apply it under.
        cluster: String,
        /// What changed in who speaks for which cluster.
        changes: Vec<Change>,
    },
    /// `data.cluster` is not a DNS-1123 label (`422`).
    Invalid(String),
    /// Another log holds the name (`409`), with the reason.
    Conflict(String),
}

/// The cluster rules (module docs), with the liveness of every bound log.
#[derive(Debug)]
pub struct Clusters {
    takeover_after: Duration,
    started: Instant,
    live: HashMap<String, Liveness>,
}

impl Clusters {
    /// Rules with `takeover_after` (`cluster_takeover_after`), for an agent started at `started`.
    pub fn new(takeover_after: Duration, started: Instant) -> Self {
        Self { takeover_after, started, live: HashMap::new() }
    }

    /// The liveness of `cluster`.
    pub fn liveness(&self, cluster: &str) -> Liveness {
        self.live.get(cluster).cloned().unwrap_or_default()
    }

    /// Every cluster's liveness.
    pub fn all(&self) -> &HashMap<String, Liveness> {
        &self.live
    }

    /// Judges a delivery from `sender`, received at `now`, against the bindings in `state`, changing
    /// `state` (binding a name, a rename, a takeover, adopting unclaimed Services) when it is
    /// accepted. See the module docs for the rules.
    pub fn claim(&mut self, state: &mut Desired, sender: Sender<'_>, now: Instant) -> Claim {
        let name = sender.cluster.unwrap_or(DEFAULT_CLUSTER);
        if !is_dns_label(name) {
            return Claim::Invalid(format!("data.cluster `{name}` is not a DNS-1123 label"));
        }
        let log = sender.log_id.map(str::to_owned);
        // The name this log is bound to, when it is another one (a log without an id is never
        // matched: vipwatch before 0.1 cannot be told apart).
        let own = log
            .as_ref()
            .and_then(|l| state.clusters.iter().find(|(c, b)| *c != name && b.log_id.as_ref() == Some(l)))
            .map(|(c, _)| c.clone());
        let mut changes = Vec::new();
        let cluster = match state.clusters.get(name) {
            Some(b) if b.log_id == log => name.to_owned(),
            Some(b) => {
                let last = self.live.get(name).and_then(|l| l.last_delivery);
                let silent = now.duration_since(last.unwrap_or(self.started));
                if silent < self.takeover_after {
                    let reason = self.refusal(name, b, last, now);
                    let live = self.live.entry(name.to_owned()).or_default();
                    live.conflicts += 1;
                    live.last_conflict = Some(Conflict { log_id: log, at: now, reason: reason.clone() });
                    return Claim::Conflict(reason);
                }
                let from = b.log_id.clone();
                if let Some(old) = own {
                    // The taking log was bound to another name: it brings its Services along.
                    let services = state.move_services(Some(&old), name, |_| true);
                    state.move_tombstones(Some(&old), name, |_| true);
                    state.clusters.remove(&old);
                    changes.push(Change::Renamed { from: old, to: name.to_owned(), services });
                }
                state.clusters.insert(name.to_owned(), Binding { log_id: log.clone(), ..Binding::default() });
                changes.push(Change::TakenOver { cluster: name.to_owned(), from, to: log.clone(), silent });
                name.to_owned()
            }
            None => match own {
                Some(current) if made_before_rename(&state.clusters[&current], name, sender) => current,
                Some(old) => {
                    let mut b = state.clusters.remove(&old).unwrap_or_default();
                    let point = sender.event_id.or(sender.as_of).or(b.last_event_id);
                    b.former_names.remove(name);
                    b.former_names.insert(old.clone(), point);
                    while b.former_names.len() > MAX_FORMER_NAMES {
                        let oldest = b.former_names.iter().min_by_key(|(_, p)| **p).map(|(n, _)| n.clone());
                        oldest.map(|n| b.former_names.remove(&n));
                    }
                    state.clusters.insert(name.to_owned(), b);
                    let services = state.move_services(Some(&old), name, |_| true);
                    state.move_tombstones(Some(&old), name, |_| true);
                    changes.push(Change::Renamed { from: old, to: name.to_owned(), services });
                    name.to_owned()
                }
                None => {
                    state.clusters.insert(name.to_owned(), Binding { log_id: log.clone(), ..Binding::default() });
                    changes.push(Change::Bound { cluster: name.to_owned(), log_id: log.clone() });
                    name.to_owned()
                }
            },
        };
        if let Some(b) = state.clusters.get_mut(&cluster) {
            b.last_event_id = b.last_event_id.max(sender.event_id);
        }
        if changes.is_empty() {
            // The bound log delivered: it is alive. (A new binding, a rename or a takeover counts
            // once it is live: [`Self::committed`].)
            self.live.entry(cluster.clone()).or_default().last_delivery = Some(now);
        }
        // Unclaimed Services (from before clusters) of this log, or of no recorded log.
        if state.has_unclaimed() {
            let adopt = |v: &crate::state::Version| v.log_id.is_none() || v.log_id == log;
            let services = state.move_services(None, &cluster, |a| adopt(&a.version));
            state.move_tombstones(None, &cluster, adopt);
            if services > 0 {
                changes.push(Change::Adopted { cluster: cluster.clone(), services });
            }
        }
        Claim::Accepted { cluster, changes }
    }

    /// Records that `changes` (from [`Self::claim`]) are live at `now`: the liveness of a renamed cluster
    /// follows it, a new or taken-over name starts its clock, a takeover is counted. Then forgets
    /// the liveness of names `state` (the applied state) no longer binds.
    pub fn committed(&mut self, changes: &[Change], state: &Desired, now: Instant) {
        for change in changes {
            match change {
                Change::Bound { cluster, .. } => {
                    self.live.entry(cluster.clone()).or_default().last_delivery = Some(now)
                }
                Change::TakenOver { cluster, .. } => {
                    let live = self.live.entry(cluster.clone()).or_default();
                    live.last_delivery = Some(now);
                    live.takeovers += 1;
                }
                Change::Renamed { from, to, .. } => {
                    let old = self.live.remove(from).unwrap_or_default();
                    let live = self.live.entry(to.clone()).or_default();
                    live.last_delivery = Some(now);
                    live.conflicts += old.conflicts;
                    live.takeovers += old.takeovers;
                    live.last_conflict = live.last_conflict.take().or(old.last_conflict);
                }
                Change::Adopted { .. } => {}
            }
        }
        self.live.retain(|c, _| state.clusters.contains_key(c));
    }

    /// The `409` reason for a delivery of `name`, bound to `b`, from another log.
    fn refusal(&self, name: &str, b: &Binding, last: Option<Instant>, now: Instant) -> String {
        let log = b.log_id.as_deref().unwrap_or("(none: a vipwatch before 0.1)");
        let heard = match last {
            Some(t) => format!("last delivery {} s ago", now.duration_since(t).as_secs()),
            None => {
                format!("no delivery since this agent started {} s ago", now.duration_since(self.started).as_secs())
            }
        };
        format!(
            "cluster name {name} is in use by another vipwatch: event log {log}, {heard}; give each cluster its own \
             cluster.name (a vipwatch whose database was replaced takes the name over once the other has been \
             silent for {})",
            humantime::format_duration(self.takeover_after)
        )
    }
}

/// Whether a delivery under `name` from the log bound as `b` was made before that log renamed its
/// cluster away from `name`: `name` is a former name and the delivery's event id is not above the
/// rename's (a resync, without an event id, counts as before).
fn made_before_rename(b: &Binding, name: &str, sender: Sender<'_>) -> bool {
    match b.former_names.get(name) {
        None => false,
        Some(point) => match (sender.event_id, point) {
            (Some(e), Some(p)) => e <= *p,
            (Some(_), None) => false,
            (None, _) => true,
        },
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use std::collections::BTreeMap;

    use super::*;
    use crate::state::{Accepted, Intent, ServiceKey, Version};
    use vipwatch_contract::WebhookService;

    fn svc(name: &str, uid: &str, vip: &str) -> WebhookService {
        let view = serde_json::json!({"type": "LoadBalancer", "loadBalancerClass": null,
            "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": "8080", "nodePort": null, "appProtocol": null}],
            "selector": {}, "externalTrafficPolicy": "Cluster", "healthCheckNodePort": null, "sessionAffinity": "None",
            "sessionAffinityTimeoutSeconds": null, "loadBalancerSourceRanges": [], "externalIPs": [], "ipFamilies": ["IPv4"],
            "ipFamilyPolicy": "SingleStack", "allocateLoadBalancerNodePorts": null, "loadBalancerIP": null,
            "requestedIPs": [], "ingress": [], "labels": {}, "annotations": {}, "allocation": null, "finalizers": [],
            "deleting": false});
        WebhookService {
            namespace: "eval".into(),
            name: name.into(),
            uid: uid.into(),
            resource_version: "1".into(),
            vips: vec![vip.into()],
            view: Arc::new(serde_json::from_value(view).unwrap()),
            backends: None,
        }
    }

    fn sender<'a>(cluster: &'a str, log: &'a str, event_id: Option<i64>) -> Sender<'a> {
        Sender { cluster: Some(cluster), log_id: Some(log), event_id, as_of: None }
    }

    fn upsert(state: &mut Desired, cluster: &str, s: WebhookService, log: &str) -> Result<(), String> {
        let version = Version { event_id: Some(1), resource_version: "1".into(), log_id: Some(log.into()) };
        state.apply(Intent::Upsert { cluster: cluster.into(), service: Box::new(s), version })
    }

    /// Claims for `from` and, when accepted, commits the changes as a live batch would.
    fn accept(c: &mut Clusters, s: &mut Desired, from: Sender<'_>, now: Instant) -> (String, Vec<Change>) {
        match c.claim(s, from, now) {
            Claim::Accepted { cluster, changes } => {
                c.committed(&changes, s, now);
                (cluster, changes)
            }
            other => panic!("not accepted: {other:?}"),
        }
    }

    fn key(cluster: &str, name: &str) -> ServiceKey {
        ServiceKey { cluster: Some(cluster.into()), namespace: "eval".into(), name: name.into() }
    }

    /// A batch keeps one bind index for all its deliveries: after every change it is the index of
    /// the state as built afresh, and it finds the same conflicts as a pass over every Service.
    #[test]
    fn the_bind_index_of_a_batch_follows_every_change_and_finds_the_conflicts() {
        use crate::state::Binds;
        let version =
            |n: i64| Version { event_id: Some(n), resource_version: n.to_string(), log_id: Some("log-a".into()) };
        let up = |name: &str, uid: &str, vip: &str, n: i64| Intent::Upsert {
            cluster: "east".into(),
            service: Box::new(svc(name, uid, vip)),
            version: version(n),
        };
        let mut s = Desired::default();
        let mut binds = Binds::of(&s);
        s.apply_with(up("web", "u1", "10.0.0.1", 1), &mut binds).unwrap();
        s.apply_with(up("api", "u2", "10.0.0.2", 2), &mut binds).unwrap();
        assert_eq!(binds, Binds::of(&s));
        s.apply_with(up("web", "u1", "10.0.0.3", 3), &mut binds).unwrap();
        assert_eq!(binds, Binds::of(&s), "a Service that moved to another VIP");
        let clash = s.apply_with(up("db", "u3", "10.0.0.2", 4), &mut binds).unwrap_err();
        assert_eq!(clash, "10.0.0.2:80 is already bound by Service eval/api of cluster east");
        s.apply_with(up("db", "u3", "10.0.0.1", 5), &mut binds).unwrap();
        assert_eq!(binds, Binds::of(&s), "the VIP the first one left is free");
        s.apply_with(up("web", "u1", "10.0.0.3", 6), &mut binds).unwrap();
        assert_eq!(binds, Binds::of(&s), "a Service that kept its VIP");
        s.apply_with(Intent::Delete { key: key("east", "api"), uid: "u2".into(), version: version(7) }, &mut binds)
            .unwrap();
        assert_eq!(binds, Binds::of(&s));
        s.apply_with(up("cache", "u4", "10.0.0.2", 8), &mut binds).unwrap();
        assert_eq!(binds, Binds::of(&s), "a deleted Service's VIP is free");
        assert_eq!(s.services.len(), 3);
    }

    /// The clock `secs` seconds after `t0`.
    fn at(t0: Instant, secs: u64) -> Instant {
        t0 + Duration::from_secs(secs)
    }

    #[test]
    fn a_second_log_under_a_bound_name_is_refused_until_the_first_falls_silent() {
        let t0 = Instant::now();
        let mut c = Clusters::new(Duration::from_secs(300), t0);
        let mut s = Desired::default();
        let (name, changes) = accept(&mut c, &mut s, sender("east", "log-a", Some(1)), t0);
        assert_eq!(name, "east");
        assert_eq!(changes, [Change::Bound { cluster: "east".into(), log_id: Some("log-a".into()) }]);
        let Claim::Conflict(why) = c.claim(&mut s, sender("east", "log-b", Some(1)), at(t0, 42)) else { panic!() };
        assert_eq!(
            why,
            "cluster name east is in use by another vipwatch: event log log-a, last delivery 42 s ago; give each \
             cluster its own cluster.name (a vipwatch whose database was replaced takes the name over once the \
             other has been silent for 5m)"
        );
        assert_eq!((c.liveness("east").conflicts, s.clusters["east"].log_id.as_deref()), (1, Some("log-a")));
        // The bound log keeps its name (and its silence starts again).
        assert_eq!(accept(&mut c, &mut s, sender("east", "log-a", Some(2)), at(t0, 50)).0, "east");
        assert!(matches!(c.claim(&mut s, sender("east", "log-b", Some(2)), at(t0, 349)), Claim::Conflict(_)));
        let (name, changes) = accept(&mut c, &mut s, sender("east", "log-b", Some(3)), at(t0, 350));
        assert_eq!(name, "east");
        assert_eq!(
            changes,
            [Change::TakenOver {
                cluster: "east".into(),
                from: Some("log-a".into()),
                to: Some("log-b".into()),
                silent: Duration::from_secs(300)
            }]
        );
        // Now the old log is the stranger.
        assert!(matches!(c.claim(&mut s, sender("east", "log-a", Some(9)), at(t0, 351)), Claim::Conflict(_)));
        assert_eq!((c.liveness("east").conflicts, c.liveness("east").takeovers), (3, 1));
    }

    #[test]
    fn a_bound_name_not_heard_from_since_the_agent_started_is_judged_from_the_start() {
        let t0 = Instant::now();
        let mut s = Desired::default();
        s.clusters.insert("east".into(), Binding { log_id: Some("log-a".into()), ..Binding::default() });
        let mut c = Clusters::new(Duration::from_secs(60), t0);
        let Claim::Conflict(why) = c.claim(&mut s, sender("east", "log-b", None), at(t0, 10)) else { panic!() };
        assert!(why.contains("event log log-a, no delivery since this agent started 10 s ago"), "{why}");
        assert!(matches!(c.claim(&mut s, sender("east", "log-b", None), at(t0, 60)), Claim::Accepted { .. }));
    }

    #[test]
    fn a_log_under_a_new_name_renames_its_cluster_and_late_deliveries_under_the_old_one_follow() {
        let t0 = Instant::now();
        let mut c = Clusters::new(Duration::from_secs(300), t0);
        let mut s = Desired::default();
        accept(&mut c, &mut s, sender("old", "log-a", Some(5)), t0);
        upsert(&mut s, "old", svc("web", "u1", "192.0.2.1"), "log-a").unwrap();
        s.reslot(4);
        let (name, changes) = accept(&mut c, &mut s, sender("new", "log-a", Some(9)), t0);
        assert_eq!(name, "new");
        assert_eq!(changes, [Change::Renamed { from: "old".into(), to: "new".into(), services: 1 }]);
        assert_eq!(s.services.keys().cloned().collect::<Vec<_>>(), [key("new", "web")]);
        assert_eq!(s.slots.keys().cloned().collect::<Vec<_>>(), ["be_new_eval_web_80"], "the slots moved along");
        assert_eq!(s.clusters.keys().cloned().collect::<Vec<_>>(), ["new"]);
        // A delivery rendered before the rename (event 7 < 9) goes under the new name; so does a resync.
        assert_eq!(accept(&mut c, &mut s, sender("old", "log-a", Some(7)), t0), ("new".into(), vec![]));
        assert_eq!(accept(&mut c, &mut s, sender("old", "log-a", None), t0), ("new".into(), vec![]));
        // A newer one under the old name is a rename back.
        let (name, changes) = accept(&mut c, &mut s, sender("old", "log-a", Some(10)), t0);
        assert_eq!(name, "old");
        assert_eq!(changes, [Change::Renamed { from: "new".into(), to: "old".into(), services: 1 }]);
        assert_eq!(s.clusters["old"].former_names, BTreeMap::from([("new".to_owned(), Some(10))]));
    }

    #[test]
    fn services_stored_before_clusters_are_adopted_by_the_cluster_of_their_log() {
        let mut s = Desired::default();
        for (name, log) in [("a", Some("log-a")), ("b", Some("log-b")), ("c", None)] {
            let version = Version { event_id: Some(1), resource_version: "1".into(), log_id: log.map(Into::into) };
            let unclaimed = ServiceKey { cluster: None, namespace: "eval".into(), name: name.into() };
            let service = svc(name, &format!("u-{name}"), &format!("192.0.2.{}", name.len()));
            s.services.insert(unclaimed, Accepted { service, version });
        }
        let t0 = Instant::now();
        let mut c = Clusters::new(Duration::from_secs(300), t0);
        let (_, changes) = accept(&mut c, &mut s, sender("west", "log-b", Some(1)), t0);
        assert_eq!(
            changes,
            [
                Change::Bound { cluster: "west".into(), log_id: Some("log-b".into()) },
                Change::Adopted { cluster: "west".into(), services: 2 }
            ]
        );
        let (_, changes) = accept(&mut c, &mut s, sender("east", "log-a", Some(1)), t0);
        assert_eq!(changes[1], Change::Adopted { cluster: "east".into(), services: 1 });
        let keys: Vec<String> = s.services.keys().map(ToString::to_string).collect();
        assert_eq!(keys, ["east/eval/a", "west/eval/b", "west/eval/c"]);
    }

    #[test]
    fn the_same_name_in_two_clusters_is_two_services_and_one_vip_port_is_refused_naming_the_other() {
        let mut s = Desired::default();
        upsert(&mut s, "east", svc("web", "u1", "192.0.2.1"), "log-a").unwrap();
        upsert(&mut s, "west", svc("web", "u2", "192.0.2.2"), "log-b").unwrap();
        assert_eq!(s.services.len(), 2);
        let clash = upsert(&mut s, "west", svc("other", "u3", "192.0.2.1"), "log-b").unwrap_err();
        assert_eq!(
            clash,
            "192.0.2.1:80 is already bound by Service eval/web of cluster east (clusters sharing this appliance \
             need address pools that do not overlap)"
        );
        // A resync of west sweeps only west.
        let sweep = Intent::Sweep { cluster: "west".into(), keep: Default::default(), as_of: Some(9), log_id: None };
        s.apply(sweep).unwrap();
        assert_eq!(s.services.keys().cloned().collect::<Vec<_>>(), [key("east", "web")]);
        // A delete in east leaves a tombstone for east only: a cluster restored from a copy of east's
        // etcd has the same uids, and its deliveries are not stale for it.
        let version = Version { event_id: Some(2), resource_version: "2".into(), log_id: Some("log-a".into()) };
        s.apply(Intent::Delete { key: key("east", "web"), uid: "u1".into(), version }).unwrap();
        let twin = |cluster: &str| Intent::Upsert {
            cluster: cluster.into(),
            service: Box::new(svc("web", "u1", "192.0.2.2")),
            version: Version { event_id: Some(1), resource_version: "1".into(), log_id: Some("log-b".into()) },
        };
        assert_eq!(s.ignore(&twin("west")), None);
        assert_eq!(s.ignore(&twin("east")), Some("stale: the object was deleted"));
    }

    #[test]
    fn a_cluster_name_that_is_not_a_dns_label_is_invalid() {
        let mut c = Clusters::new(Duration::from_secs(1), Instant::now());
        let claim = c.claim(&mut Desired::default(), sender("East_1", "l", None), Instant::now());
        assert_eq!(claim, Claim::Invalid("data.cluster `East_1` is not a DNS-1123 label".into()));
    }
}
