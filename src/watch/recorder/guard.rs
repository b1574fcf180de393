//! The mass-deletion guard: one list that would delete more than `guard.max_share` of the known
//! in-scope Services (and more than `guard.min_deletions`) holds those deletions instead: no DELETED
//! event, the VIPs stay allocated, nothing is relayed; an error log, a Warning Event per Service, a
//! metric and a `held_deletions` row say so. Held deletions are recorded when released through the
//! API, or when a list at least `guard.confirm_after` after they were held still misses them; a
//! Service listed again simply stops being held. Deletions seen on a live watch are never held.
//!
//! "Held" means this and only this in the recorder: a deletion the guard keeps from being recorded
//! (the API, the metrics and the `held_deletions` table use the same word).

use std::collections::{BTreeMap, BTreeSet};

use tracing::{error, info, warn};

use super::super::stream::{Resource, ScopeSpec};
use super::mirror::Mirror;
use super::{Batch, Recorder};
use crate::config::GuardConfig;
use crate::model::{Cause, Notice, Reason, ServiceKey};
use crate::store::{HeldDeletion, StateChange};

/// The `scope` of deletions held at start because no configured scope covers their namespace any
/// more (`kubernetes.namespaces` changed).
pub const UNWATCHED: &str = "unwatched";

/// The guard's settings and the deletions it holds.
pub(super) struct DeletionGuard {
    config: GuardConfig,
    /// The Service scopes watched (to tell which held Services no scope covers).
    scopes: Vec<ScopeSpec>,
    held: BTreeMap<ServiceKey, HeldDeletion>,
    /// Reported with the next batch: trips (by cause), releases (how, count), Events.
    trips: Vec<&'static str>,
    releases: Vec<(&'static str, usize)>,
    notices: Vec<Notice>,
}

impl DeletionGuard {
    /// A guard over `scopes` holding what the store held at start.
    pub fn new(config: GuardConfig, scopes: &[ScopeSpec], held: Vec<HeldDeletion>) -> Self {
        let scopes = scopes.iter().filter(|s| s.resource == Resource::Services).cloned().collect();
        let held = held.into_iter().map(|h| (h.key.clone(), h)).collect();
        Self { config, scopes, held, trips: Vec::new(), releases: Vec::new(), notices: Vec::new() }
    }

    /// Whether the deletion of `key` is held.
    pub fn holds(&self, key: &ServiceKey) -> bool {
        self.held.contains_key(key)
    }

    /// How many deletions are held.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// At load: tracked Services no configured scope covers any more. Returns those to delete now;
    /// the rest (too many at once, or already held) stay tracked and held.
    pub fn unwatched(
        &mut self,
        changes: &mut Vec<StateChange>,
        mirror: &Mirror,
        uncovered: BTreeSet<ServiceKey>,
        now_ms: i64,
    ) -> BTreeSet<ServiceKey> {
        let new: BTreeSet<ServiceKey> = uncovered.into_iter().filter(|k| !self.holds(k)).collect();
        let known = mirror.keys().filter(|k| !self.holds(k)).count();
        let judged = Judged { scope: UNWATCHED, cause: Cause::Startup, known, now_ms };
        if self.judge(changes, mirror, judged, &new) { BTreeSet::new() } else { new }
    }

    /// Moves what happened since the last batch into `batch`'s report.
    pub fn report(&mut self, batch: &mut Batch) {
        batch.report.guard_trips.append(&mut self.trips);
        batch.report.guard_releases.append(&mut self.releases);
        batch.report.notices.note(std::mem::take(&mut self.notices));
    }

    /// Decides what to do with `vanished` Services (missing from one list, or from every scope at
    /// start): false when they may be deleted, else holds them, pushing their rows onto `changes`.
    fn judge(
        &mut self,
        changes: &mut Vec<StateChange>,
        mirror: &Mirror,
        j: Judged,
        vanished: &BTreeSet<ServiceKey>,
    ) -> bool {
        let Judged { scope, cause, known, now_ms } = j;
        if !self.config.trips(vanished.len(), known) {
            return false;
        }
        let what = if cause == Cause::Startup && scope == UNWATCHED {
            "are in namespaces no longer watched (kubernetes.namespaces)".to_owned()
        } else {
            format!("vanished from one {} list of scope `{scope}`", cause.as_str())
        };
        let reason = format!("{} of {known} tracked Services {what}", vanished.len());
        error!(
            held = vanished.len(),
            known,
            scope,
            cause = cause.as_str(),
            "vipwatch held {} deletions: {reason}; nothing is deleted or relayed for them until released \
             (POST /api/v1/deletions/held/release) or confirmed by a list {} later",
            vanished.len(),
            humantime::format_duration(self.config.confirm_after),
        );
        let note = format!(
            "vipwatch holds the deletion of this Service: {reason} (more than guard.max_share {}% and \
             guard.min_deletions {}). Its VIPs stay allocated and no DELETED is sent. Release with POST \
             /api/v1/deletions/held/release, or it is recorded once a list {} later confirms it is gone.",
            self.config.max_share * 100.0,
            self.config.min_deletions,
            humantime::format_duration(self.config.confirm_after),
        );
        for key in vanished {
            let Some(t) = mirror.get(key) else { continue };
            let h = HeldDeletion {
                key: key.clone(),
                uid: t.uid.clone(),
                scope: scope.to_owned(),
                cause,
                reason: reason.clone(),
                held_at: now_ms,
            };
            changes.push(StateChange::Held { key: key.clone(), held: Some(Box::new(h.clone())) });
            self.notices.push(Notice {
                key: key.clone(),
                uid: t.uid.clone(),
                reason: Reason::DeletionHeld,
                note: note.clone(),
            });
            self.held.insert(key.clone(), h);
        }
        self.trips.push(cause.as_str());
        true
    }

    /// Stops holding `key` (it was listed or watched again, or deleted by a watch event), counting it
    /// under `how`. Returns whether it was held.
    fn release(&mut self, changes: &mut Vec<StateChange>, key: &ServiceKey, how: &'static str) -> bool {
        if self.held.remove(key).is_none() {
            return false;
        }
        changes.push(StateChange::Held { key: key.clone(), held: None });
        match self.releases.iter_mut().find(|(h, _)| *h == how) {
            Some((_, n)) => *n += 1,
            None => self.releases.push((how, 1)),
        }
        true
    }

    /// Held Services a list at `now_ms` confirms as gone: held at least `confirm_after` before, and
    /// missing from the list of `scope` (`vanished`) or covered by no scope at all.
    fn confirmed(&self, scope: &ScopeSpec, vanished: &BTreeSet<ServiceKey>, now_ms: i64) -> Vec<ServiceKey> {
        let confirm_after = i64::try_from(self.config.confirm_after.as_millis()).unwrap_or(i64::MAX);
        let cutoff = now_ms.saturating_sub(confirm_after);
        let gone =
            |k: &ServiceKey| (scope.covers(k) && vanished.contains(k)) || !self.scopes.iter().any(|s| s.covers(k));
        self.held.values().filter(|h| h.held_at <= cutoff && gone(&h.key)).map(|h| h.key.clone()).collect()
    }
}

/// What the guard judges a set of vanished Services by: the scope label and cause their DELETEDs
/// would have, how many tracked and not held Services that scope covers, and when (Unix ms).
struct Judged<'a> {
    scope: &'a str,
    cause: Cause,
    known: usize,
    now_ms: i64,
}

impl Recorder {
    /// A list of `scope` at `now_ms` missed `vanished` (tracked, covered by the scope) of `known`
    /// tracked and not held Services. Returns the Services to delete now with the cause of their
    /// DELETED: confirmed held ones, and the newly vanished unless the guard holds them.
    pub(super) fn guard_list(
        &mut self,
        batch: &mut Batch,
        (scope, cause): (&ScopeSpec, Cause),
        (vanished, known): (BTreeSet<ServiceKey>, usize),
        now_ms: i64,
    ) -> Vec<(ServiceKey, Cause)> {
        let mut delete = Vec::new();
        let confirmed = self.guard.confirmed(scope, &vanished, now_ms);
        let new: BTreeSet<ServiceKey> = vanished.into_iter().filter(|k| !self.guard.holds(k)).collect();
        if !confirmed.is_empty() {
            warn!(
                released = confirmed.len(),
                scope = scope.label(),
                "held deletions confirmed by a list: recording them"
            );
        }
        for key in confirmed {
            let cause = self.guard.held.get(&key).map_or(cause, |h| h.cause);
            self.guard.release(&mut batch.changes, &key, "confirmed");
            delete.push((key, cause));
        }
        let judged = Judged { scope: scope.label(), cause, known, now_ms };
        if !self.guard.judge(&mut batch.changes, &self.mirror, judged, &new) {
            delete.extend(new.into_iter().map(|k| (k, cause)));
        }
        delete
    }

    /// `key` was listed or watched again: no longer held (no event for that by itself).
    pub(super) fn guard_reappeared(&mut self, batch: &mut Batch, key: &ServiceKey) {
        if self.guard.release(&mut batch.changes, key, "reappeared") {
            info!(service = %key, "held deletion dropped: the Service is there again");
        }
    }

    /// A watch DELETED of `key`: if it was held, it no longer is (the DELETED is recorded as usual).
    pub(super) fn guard_watch_deleted(&mut self, batch: &mut Batch, key: &ServiceKey) {
        self.guard.release(&mut batch.changes, key, "confirmed");
    }

    /// Records the DELETED of every held Service (an operator's release through the API).
    pub(super) fn release_all_held(&mut self, batch: &mut Batch) {
        let held: Vec<HeldDeletion> = self.guard.held.values().cloned().collect();
        if held.is_empty() {
            return;
        }
        warn!(released = held.len(), "held deletions released through the API: recording them");
        for h in held {
            self.guard.release(&mut batch.changes, &h.key, "api");
            if let Some(t) = self.unmirror(&h.key) {
                batch.changes.push(super::deleted(h.key, h.cause, &t));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The guard alone, fed the vanished sets a list would give it: when it trips, what it stores and
    //! reports, and when a held deletion is let go.

    use std::collections::{BTreeSet, HashMap};
    use std::time::Duration;

    use super::super::mirror::Mirror;
    use super::super::tests::{observed, services, svc};
    use super::{DeletionGuard, Judged, UNWATCHED};
    use crate::config::GuardConfig;
    use crate::model::{Cause, ServiceKey};
    use crate::store::StateChange;
    use crate::watch::ScopeSpec;

    /// The wall clock when the guard judges (Unix ms).
    const T0: i64 = 1_700_000_000_000;

    /// A mirror of `namespace/svc-00` … `namespace/svc-<n-1>` per `(namespace, n)`.
    fn mirror(namespaces: &[(&str, usize)]) -> Mirror {
        let tracked: HashMap<ServiceKey, _> = namespaces
            .iter()
            .flat_map(|(ns, n)| (0..*n).map(move |i| observed(svc(&format!("{ns}/svc-{i:02}"), "1"))))
            .map(|o| (o.key.clone(), o.tracked()))
            .collect();
        Mirror::new(tracked)
    }

    /// `namespace/svc-<i>` for each `i` of `range`.
    fn keys(namespace: &str, range: std::ops::Range<usize>) -> BTreeSet<ServiceKey> {
        range.map(|i| ServiceKey::new(namespace, format!("svc-{i:02}"))).collect()
    }

    /// A guard with `config` over the Service scope of every namespace, holding nothing.
    fn guard(config: GuardConfig) -> DeletionGuard {
        DeletionGuard::new(config, &[services()], Vec::new())
    }

    /// Every row of `changes`: `hold namespace/name scope cause held_at` or `release namespace/name`.
    fn rows(changes: &[StateChange]) -> Vec<String> {
        let row = |c: &StateChange| match c {
            StateChange::Held { key, held: Some(h) } => {
                format!("hold {key} {} {} {}", h.scope, h.cause.as_str(), h.held_at - T0)
            }
            StateChange::Held { key, held: None } => format!("release {key}"),
            other => panic!("not a guard row: {other:?}"),
        };
        changes.iter().map(row).collect()
    }

    /// Judges `vanished` of `known` as one relist of scope `*` at `T0`: whether it tripped.
    fn relist(
        guard: &mut DeletionGuard,
        changes: &mut Vec<StateChange>,
        m: &Mirror,
        vanished: &BTreeSet<ServiceKey>,
    ) -> bool {
        let known = m.keys().filter(|k| !guard.holds(k)).count();
        guard.judge(changes, m, Judged { scope: "*", cause: Cause::Relist, known, now_ms: T0 }, vanished)
    }

    #[test]
    fn a_list_trips_only_above_both_min_deletions_and_max_share() {
        let m = mirror(&[("shop", 20)]);
        let mut changes = Vec::new();
        let mut g = guard(GuardConfig::default());
        // 5 of 20: not above `min_deletions` (5). 10 of 20: not above `max_share` (half).
        assert!(!relist(&mut g, &mut changes, &m, &keys("shop", 0..5)));
        assert!(!relist(&mut g, &mut changes, &m, &keys("shop", 0..10)));
        assert_eq!((changes.len(), g.len()), (0, 0));
        // 11 of 20: above both.
        assert!(relist(&mut g, &mut changes, &m, &keys("shop", 0..11)));
        assert_eq!(g.len(), 11);

        // Of 8, 6 are above both; 5 are not above `min_deletions`, however large a share.
        let m = mirror(&[("shop", 8)]);
        let mut g = guard(GuardConfig::default());
        assert!(!relist(&mut g, &mut Vec::new(), &m, &keys("shop", 0..5)));
        assert!(relist(&mut g, &mut Vec::new(), &m, &keys("shop", 0..6)));

        let mut off = guard(GuardConfig { enabled: false, ..GuardConfig::default() });
        assert!(!relist(&mut off, &mut Vec::new(), &m, &keys("shop", 0..8)), "guard.enabled = false");
    }

    #[test]
    fn a_trip_stores_one_row_and_one_warning_per_service_and_reports_one_trip() {
        let m = mirror(&[("shop", 10)]);
        let mut changes = Vec::new();
        let mut g = guard(GuardConfig::default());
        assert!(relist(&mut g, &mut changes, &m, &keys("shop", 4..10)));
        let held: Vec<String> = (4..10).map(|i| format!("hold shop/svc-{i:02} * relist 0")).collect();
        assert_eq!(rows(&changes), held);
        let StateChange::Held { held: Some(h), .. } = &changes[0] else { panic!("a held row") };
        assert_eq!(
            (h.uid.as_str(), h.reason.as_str()),
            ("u-svc-04", "6 of 10 tracked Services vanished from one relist list of scope `*`")
        );
        assert!((4..10).all(|i| g.holds(&ServiceKey::new("shop", format!("svc-{i:02}")))));

        let mut batch = super::super::Batch::default();
        g.report(&mut batch);
        assert_eq!(batch.report.guard_trips, ["relist"]);
        let warned: Vec<(&str, String)> =
            batch.report.notices.kept.iter().map(|n| (n.reason.as_str(), n.key.to_string())).collect();
        let expected: Vec<(&str, String)> = (4..10).map(|i| ("DeletionHeld", format!("shop/svc-{i:02}"))).collect();
        assert_eq!(warned, expected);
        assert_eq!(
            batch.report.notices.kept[0].note,
            "vipwatch holds the deletion of this Service: 6 of 10 tracked Services vanished from one relist list of \
             scope `*` (more than guard.max_share 50% and guard.min_deletions 5). Its VIPs stay allocated and no \
             DELETED is sent. Release with POST /api/v1/deletions/held/release, or it is recorded once a list 10m \
             later confirms it is gone."
        );

        // Reported once.
        let mut next = super::super::Batch::default();
        g.report(&mut next);
        assert!(next.report.is_empty());
    }

    #[test]
    fn services_no_scope_covers_at_start_are_deleted_unless_too_many() {
        // 3 of 13 in a namespace no scope covers: deleted now.
        let m = mirror(&[("shop", 10), ("old", 3)]);
        let mut changes = Vec::new();
        let mut g = DeletionGuard::new(GuardConfig::default(), &[ScopeSpec::services(Some("shop".into()))], Vec::new());
        let uncovered = keys("old", 0..3);
        assert_eq!(g.unwatched(&mut changes, &m, uncovered.clone(), T0), uncovered);
        assert_eq!((changes.len(), g.len()), (0, 0));

        // 10 of 13 (a namespace typo): held as `unwatched`, nothing deleted.
        let mut g = DeletionGuard::new(GuardConfig::default(), &[ScopeSpec::services(Some("old".into()))], Vec::new());
        assert_eq!(g.unwatched(&mut changes, &m, keys("shop", 0..10), T0), BTreeSet::new());
        let held: Vec<String> = (0..10).map(|i| format!("hold shop/svc-{i:02} {UNWATCHED} startup 0")).collect();
        assert_eq!(rows(&changes), held);
        let mut batch = super::super::Batch::default();
        g.report(&mut batch);
        assert_eq!(batch.report.guard_trips, ["startup"]);
        let StateChange::Held { held: Some(h), .. } = &changes[0] else { panic!("a held row") };
        assert_eq!(h.reason, "10 of 13 tracked Services are in namespaces no longer watched (kubernetes.namespaces)");
    }

    fn confirm_after_a_minute() -> GuardConfig {
        GuardConfig { confirm_after: Duration::from_secs(60), ..GuardConfig::default() }
    }

    #[test]
    fn a_held_deletion_is_confirmed_by_a_list_from_confirm_after_on_that_misses_it() {
        let m = mirror(&[("shop", 10)]);
        let mut g = guard(confirm_after_a_minute());
        assert!(relist(&mut g, &mut Vec::new(), &m, &keys("shop", 2..10)));
        let still_missing = keys("shop", 3..10);
        assert_eq!(g.confirmed(&services(), &still_missing, T0 + 59_999), Vec::<ServiceKey>::new());
        // svc-02 was listed again: not confirmed (a list lets it go as reappeared instead).
        let confirmed: BTreeSet<ServiceKey> =
            g.confirmed(&services(), &still_missing, T0 + 60_000).into_iter().collect();
        assert_eq!(confirmed, still_missing);
        // A list of another namespace's scope confirms nothing of `shop`.
        let other = ScopeSpec::services(Some("other".into()));
        assert_eq!(g.confirmed(&other, &BTreeSet::new(), T0 + 60_000), Vec::<ServiceKey>::new());

        // Held Services no watched scope covers are confirmed by any list once `confirm_after` passed.
        let held = g.held.values().cloned().collect();
        let only_other = DeletionGuard::new(confirm_after_a_minute(), std::slice::from_ref(&other), held);
        assert_eq!(only_other.confirmed(&other, &BTreeSet::new(), T0 + 60_000).len(), 8);
    }

    #[test]
    fn letting_go_stores_one_row_per_held_service_and_counts_each_way() {
        let m = mirror(&[("shop", 10)]);
        let mut g = guard(GuardConfig::default());
        assert!(relist(&mut g, &mut Vec::new(), &m, &keys("shop", 2..10)));
        let mut changes = Vec::new();
        let (a, b, c) =
            (ServiceKey::new("shop", "svc-02"), ServiceKey::new("shop", "svc-03"), ServiceKey::new("shop", "svc-04"));
        assert!(g.release(&mut changes, &a, "reappeared"));
        assert!(g.release(&mut changes, &b, "confirmed"));
        assert!(g.release(&mut changes, &c, "reappeared"));
        assert!(!g.release(&mut changes, &a, "reappeared"), "no longer held");
        assert!(!g.release(&mut changes, &ServiceKey::new("shop", "svc-00"), "api"), "never held");
        assert_eq!(rows(&changes), ["release shop/svc-02", "release shop/svc-03", "release shop/svc-04"]);
        assert_eq!(g.len(), 5);
        let mut batch = super::super::Batch::default();
        g.report(&mut batch);
        assert_eq!(batch.report.guard_releases, [("reappeared", 2), ("confirmed", 1)]);
    }
}
