//! What every watch scope last heard from the apiserver: the source of the watch checks of `/readyz`,
//! of `GET /api/v1/status` and of the `X-Vipwatch-Last-Synced` header. Fed by the Kubernetes client's
//! watchdog layer ([`super::watchdog`]), which sees every list and watch request of the watcher.
//!
//! "In sync" rule: a scope holding an open, healthy watch is in sync *now*, however quiet (kube-runtime's
//! watcher drops a stream that sent no event for `watch_timeout + 5 s`, and the watchdog reports that
//! as a stall). Once the watch ends, fails or is dropped, the scope stays in sync as of that moment;
//! once a stream is found stalled, as of its last byte. A scope not watching whose sync time is older
//! than `kubernetes.stale_after` makes `/readyz` answer 503.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tracing::{error, warn};
use utoipa::ToSchema;

use super::stream::{Resource, ScopeSpec};
use crate::metrics::{Metrics, ScopeLabels, WatchErrorLabels};
use crate::model::bounded::{MESSAGE, bound};
use crate::model::rfc3339;
use crate::store::now_ms;

/// Consecutive 401/403 answers on a scope after which `/readyz` answers 503 at once.
pub const AUTH_FAILURES_NOT_READY: u32 = 3;

/// Which request of a scope: the (paged) list or the watch stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    /// `GET` of the collection without `watch=true`.
    List,
    /// `GET` of the collection with `watch=true`.
    Watch,
}

impl Verb {
    /// `list` or `watch`: the RBAC verb the request needs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::List => "list",
            Self::Watch => "watch",
        }
    }
}

/// What a scope is doing, as `GET /api/v1/status` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ScopeState {
    /// A list was answered 2xx and its pages are being read.
    Listing,
    /// A watch stream is open and healthy.
    Watching,
    /// The last request got no byte within its deadline and was dropped.
    Stalled,
    /// The last request failed (connection error or a non-2xx answer).
    Failing,
}

/// One scope in `GET /api/v1/status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct ScopeStatus {
    /// `services`, `nodes` or `endpointslices`.
    pub resource: &'static str,
    /// The namespace, or `null` for a cluster-wide scope.
    pub namespace: Option<String>,
    /// What the scope is doing now.
    pub state: ScopeState,
    /// When the apiserver last answered 2xx or sent a byte on this scope (RFC 3339, UTC, ms).
    pub last_activity_at: Option<String>,
    /// Up to when this scope's data is known current (RFC 3339): now while watching; the end of the
    /// last healthy watch or the last byte of a stalled one otherwise.
    pub synced_at: Option<String>,
    /// The last failure on this scope (stall, HTTP status, connection error), kept after recovery.
    pub last_error: Option<String>,
}

#[derive(Debug, Clone)]
struct Scope {
    state: ScopeState,
    activity_ms: i64,
    synced_ms: Option<i64>,
    last_error: Option<String>,
    auth_failures: u32,
    last_auth: String,
}

/// Scopes by (resource, namespace), each with its spec and health.
type Scopes = BTreeMap<(String, Option<String>), (ScopeSpec, Scope)>;

/// Shared, cheap to clone: the per-scope health of the watch.
#[derive(Clone)]
pub struct WatchHealth {
    scopes: Arc<Mutex<Scopes>>,
    metrics: Arc<Metrics>,
    stale_after: Duration,
}

impl WatchHealth {
    /// An empty tracker; scopes appear with their first request. `stale_after` is
    /// `kubernetes.stale_after`; stalls are counted in `metrics.watch_errors` (`kind="stalled"`).
    pub fn new(metrics: Arc<Metrics>, stale_after: Duration) -> Self {
        Self { scopes: Arc::default(), metrics, stale_after }
    }

    fn update(&self, spec: &ScopeSpec, f: impl FnOnce(&mut Scope, i64)) {
        let now = now_ms();
        let key = (spec.resource.as_str().to_owned(), spec.namespace.clone());
        let mut scopes = self.scopes.lock().expect("watch health lock");
        let (_, scope) = scopes.entry(key).or_insert_with(|| {
            let fresh = Scope {
                state: ScopeState::Listing,
                activity_ms: now,
                synced_ms: None,
                last_error: None,
                auth_failures: 0,
                last_auth: String::new(),
            };
            (spec.clone(), fresh)
        });
        f(scope, now);
    }

    /// A list or watch was answered 2xx.
    pub(crate) fn opened(&self, spec: &ScopeSpec, verb: Verb) {
        self.update(spec, |s, now| {
            s.state = if verb == Verb::Watch { ScopeState::Watching } else { ScopeState::Listing };
            s.activity_ms = now;
            s.auth_failures = 0;
        });
    }

    /// Bytes arrived on a list or watch body.
    pub(crate) fn received(&self, spec: &ScopeSpec) {
        self.update(spec, |s, now| s.activity_ms = now);
    }

    /// A list or watch body ended cleanly: the scope was in sync up to now.
    pub(crate) fn finished(&self, spec: &ScopeSpec, verb: Verb) {
        self.update(spec, |s, now| {
            s.activity_ms = now;
            if verb == Verb::List || s.state == ScopeState::Watching {
                s.synced_ms = Some(now);
            }
        });
    }

    /// A watch body was dropped before its end while events still came in time (the scope's task
    /// restarted the watcher): the scope was in sync up to now.
    pub(crate) fn left(&self, spec: &ScopeSpec) {
        self.update(spec, leave_watch);
    }

    /// A list or watch was answered `status` (not 2xx). 401/403 are logged at error level with the
    /// RBAC grant that is missing and counted towards [`AUTH_FAILURES_NOT_READY`].
    pub(crate) fn refused(&self, spec: &ScopeSpec, verb: Verb, status: u16) {
        let auth = matches!(status, 401 | 403);
        let what = format!("HTTP {status} on {} {}", verb.as_str(), describe(spec));
        if auth {
            let (resource, scope) = (spec.resource.as_str(), spec.label());
            error!(
                resource,
                scope,
                status,
                verb = verb.as_str(),
                "{what}: the service account may not `{}` `{resource}`{}; grant the RBAC verbs get, list and watch on it",
                verb.as_str(),
                spec.namespace.as_ref().map_or(String::new(), |ns| format!(" in namespace `{ns}`"))
            );
        }
        self.update(spec, |s, now| {
            leave_watch(s, now);
            s.state = ScopeState::Failing;
            s.auth_failures = if auth { s.auth_failures + 1 } else { 0 };
            if auth {
                s.last_auth = what.clone();
            }
            s.last_error = Some(bound(what, MESSAGE));
        });
    }

    /// A list or watch failed below HTTP (connect, TLS, connection reset, a body error).
    pub(crate) fn failed(&self, spec: &ScopeSpec, verb: Verb, error: &str) {
        let what = format!("{} {} failed: {error}", verb.as_str(), describe(spec));
        self.update(spec, |s, now| {
            leave_watch(s, now);
            s.state = ScopeState::Failing;
            s.last_error = Some(bound(what, MESSAGE));
        });
    }

    /// A list or watch produced nothing for `silent` and was dropped: warns, counts
    /// `vipwatch_watch_errors_total{kind="stalled"}`, and keeps the scope in sync only up to its last byte.
    pub(crate) fn stalled(&self, spec: &ScopeSpec, verb: Verb, silent: Duration) {
        let (resource, scope) = (spec.resource.as_str(), spec.label());
        warn!(
            resource,
            scope,
            verb = verb.as_str(),
            silent_secs = silent.as_secs_f64(),
            "{} of {} stalled: nothing received for {}; the connection is dropped and the watch resumes",
            verb.as_str(),
            describe(spec),
            humantime::format_duration(silent)
        );
        let labels =
            WatchErrorLabels { resource: resource.to_owned(), scope: scope.to_owned(), kind: "stalled".into() };
        self.metrics.watch_errors.get_or_create(&labels).inc();
        let what = format!("{} stalled: nothing received for {}", verb.as_str(), humantime::format_duration(silent));
        self.update(spec, |s, _| {
            if s.state == ScopeState::Watching {
                s.synced_ms = Some(s.activity_ms);
            }
            s.state = ScopeState::Stalled;
            s.last_error = Some(bound(what, MESSAGE));
        });
    }

    /// Every scope seen so far, ordered by resource then namespace.
    pub fn statuses(&self) -> Vec<ScopeStatus> {
        let now = now_ms();
        let scopes = self.scopes.lock().expect("watch health lock");
        scopes
            .values()
            .map(|(spec, s)| ScopeStatus {
                resource: spec.resource.as_str(),
                namespace: spec.namespace.clone(),
                state: s.state,
                last_activity_at: Some(rfc3339(s.activity_ms)),
                synced_at: synced(s, now).map(rfc3339),
                last_error: s.last_error.clone(),
            })
            .collect()
    }

    /// Sets `vipwatch_watch_synced_timestamp_seconds` of every scope that has synced (called on each
    /// scrape, so a healthy watch reads "now").
    pub fn refresh_metrics(&self) {
        let now = now_ms();
        let scopes = self.scopes.lock().expect("watch health lock");
        for (spec, s) in scopes.values() {
            if let Some(ms) = synced(s, now) {
                let labels =
                    ScopeLabels { resource: spec.resource.as_str().to_owned(), scope: spec.label().to_owned() };
                self.metrics.watch_synced.get_or_create(&labels).set(ms as f64 / 1000.0);
            }
        }
    }

    /// The oldest sync time over every scope (ms since the epoch), `None` before any scope synced.
    pub fn last_synced_ms(&self) -> Option<i64> {
        let now = now_ms();
        let scopes = self.scopes.lock().expect("watch health lock");
        scopes.values().map(|(_, s)| synced(s, now)).collect::<Option<Vec<i64>>>()?.into_iter().min()
    }

    /// Why the watch is not ready, `None` when it is: [`AUTH_FAILURES_NOT_READY`] consecutive 401/403
    /// on a scope, or a scope not watching and out of sync for longer than `stale_after`.
    pub fn not_ready(&self) -> Option<String> {
        let now = now_ms();
        let stale_ms = i64::try_from(self.stale_after.as_millis()).unwrap_or(i64::MAX);
        let scopes = self.scopes.lock().expect("watch health lock");
        let reasons: Vec<String> = scopes
            .values()
            .filter_map(|(spec, s)| {
                if s.auth_failures >= AUTH_FAILURES_NOT_READY {
                    return Some(format!("{} ({} times in a row)", s.last_auth, s.auth_failures));
                }
                let synced = synced(s, now)?;
                (now - synced > stale_ms).then(|| {
                    let age = Duration::from_secs(u64::try_from((now - synced) / 1000).unwrap_or(0));
                    let error = s.last_error.as_deref().unwrap_or("no error");
                    format!("{} not in sync for {} ({error})", describe(spec), humantime::format_duration(age))
                })
            })
            .collect();
        (!reasons.is_empty()).then(|| reasons.join("; "))
    }
}

/// Leaving a healthy watch: the scope was in sync until now.
fn leave_watch(s: &mut Scope, now: i64) {
    if s.state == ScopeState::Watching {
        s.synced_ms = Some(now);
    }
}

fn synced(s: &Scope, now: i64) -> Option<i64> {
    if s.state == ScopeState::Watching { Some(now) } else { s.synced_ms }
}

/// `services in all namespaces`, `services in namespace shop`, `nodes`.
fn describe(spec: &ScopeSpec) -> String {
    match (&spec.resource, &spec.namespace) {
        (Resource::Nodes, _) => "nodes".to_owned(),
        (r, None) => format!("{} in all namespaces", r.as_str()),
        (r, Some(ns)) => format!("{} in namespace {ns}", r.as_str()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health() -> WatchHealth {
        WatchHealth::new(Metrics::new(), Duration::from_secs(30))
    }

    #[test]
    fn three_forbidden_answers_in_a_row_make_the_watch_not_ready_and_a_success_resets_them() {
        let h = health();
        let spec = ScopeSpec::services(None);
        h.refused(&spec, Verb::List, 403);
        h.refused(&spec, Verb::List, 403);
        assert_eq!(h.not_ready(), None);
        h.refused(&spec, Verb::List, 403);
        assert_eq!(h.not_ready().as_deref(), Some("HTTP 403 on list services in all namespaces (3 times in a row)"));
        h.opened(&spec, Verb::List);
        assert_eq!(h.not_ready(), None);
    }

    #[test]
    fn a_stalled_watch_is_in_sync_only_up_to_its_last_byte() {
        let h = health();
        let spec = ScopeSpec::services(Some("shop".into()));
        h.opened(&spec, Verb::Watch);
        let activity = h.statuses()[0].last_activity_at.clone();
        h.stalled(&spec, Verb::Watch, Duration::from_secs(7));
        let status = &h.statuses()[0];
        assert_eq!(status.state, ScopeState::Stalled);
        assert_eq!(status.synced_at, activity);
        assert_eq!(status.last_error.as_deref(), Some("watch stalled: nothing received for 7s"));
        assert_eq!(h.metrics.watch_error_count("shop", "stalled"), 1);
    }
}
