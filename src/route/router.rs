//! Routing recorded events to endpoints (the store's [`Outbox`]): which endpoints get an event, and
//! the exact body each gets. An endpoint gets the members in its backend mode (annotation, else its
//! `backend_mode`, else `[backends] mode`); a MODIFIED that only changed members of other modes is
//! not sent to it at all, and `backends` is listed in its `changed` only when its own mode's members
//! changed. When the Service's `vipwatch.io/backend-mode` annotation switches an endpoint's mode, the
//! endpoint gets `backends` in `changed` and a diff from the members it had (the old mode's) to the
//! new mode's.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use vipwatch_contract::{BackendMode, Cause, EventKind, SyncMarker};

use super::payload::{PayloadInput, render};
use super::{RouteError, declaration};
use crate::config::{Config, TemplateMode, WebhookConfig};
use crate::model::backends::{self, ModePlan};
use crate::model::{ChangeKind, LabelSelector};
use crate::store::{NewDelivery, Outbox, RecordedEvent, ServiceRow, new_msg_id};

/// One enabled endpoint's routing rules.
pub struct Route {
    /// Endpoint name.
    pub name: String,
    assigns_vip: bool,
    events: HashSet<String>,
    namespaces: Vec<String>,
    selector: LabelSelector,
    /// A full-state template endpoint: every accepted event enqueues (or pushes back) one
    /// declaration, due after this debounce.
    pub full_state: Option<Duration>,
    /// A templated endpoint (gets no `sync.completed`: appliance APIs have no use for it).
    pub templated: bool,
}

impl Route {
    /// The routing rules of endpoint `w`. Errors: [`RouteError::Endpoint`] for a label selector that
    /// does not parse (already rejected by config validation).
    pub fn new(w: &WebhookConfig) -> Result<Self, RouteError> {
        let selector = LabelSelector::parse(&w.label_selector)
            .map_err(|e| RouteError::Endpoint { name: w.name.clone(), reason: e.to_string() })?;
        let full_state = w.template.as_ref().filter(|t| t.mode == TemplateMode::FullState).map(|t| t.debounce);
        Ok(Route {
            name: w.name.clone(),
            assigns_vip: w.assigns_vip,
            events: w.events.iter().cloned().collect(),
            namespaces: w.namespaces.clone(),
            selector,
            full_state,
            templated: w.template.is_some(),
        })
    }

    fn accepts(&self, e: &RecordedEvent<'_>) -> bool {
        // The assigning appliance already knows the address it chose; echoing it back would let an
        // appliance that answers every request with a new address loop forever.
        if self.assigns_vip && e.cause == Cause::Appliance {
            return false;
        }
        let ns_ok = self.namespaces.is_empty() || self.namespaces.iter().any(|n| *n == e.key.namespace);
        let labels_ok = self.selector.matches_pairs(&e.event.view.labels)
            || e.event.previous.as_ref().is_some_and(|p| self.selector.matches_pairs(&p.labels));
        self.events.contains(e.event.kind.as_str()) && ns_ok && labels_ok
    }

    /// Whether a full resync sends `s` to this endpoint.
    pub fn accepts_service(&self, s: &ServiceRow) -> bool {
        (self.namespaces.is_empty() || self.namespaces.iter().any(|n| *n == s.key.namespace))
            && self.selector.matches_pairs(&s.view.labels)
    }
}

/// Routes events to the enabled endpoints whose `events`, `namespaces` and `label_selector` accept
/// them (a MODIFIED is sent when the labels before or after the change match). Implements the
/// store's [`Outbox`].
pub struct Router {
    pub(super) routes: Vec<Route>,
    modes: ModePlan,
    log_id: String,
    cluster: Option<String>,
}

impl Router {
    /// The cluster the deliveries name (`data.cluster`).
    pub fn cluster(&self) -> Option<&str> {
        self.cluster.as_deref()
    }

    /// Builds the routes of every enabled endpoint of `config`, for the event log `log_id` and the
    /// cluster `config.cluster.name` (resolved at start: [`crate::app::cluster::resolve`]). Errors:
    /// [`RouteError::Endpoint`] for a label selector that does not parse (already rejected by config
    /// validation).
    pub fn new(config: &Config, log_id: &str) -> Result<Self, RouteError> {
        let routes = config.webhooks.iter().filter(|w| w.enabled).map(Route::new).collect::<Result<_, RouteError>>()?;
        Ok(Self { routes, modes: config.mode_plan(), log_id: log_id.to_owned(), cluster: config.cluster.name.clone() })
    }

    /// The body of `e` for an endpoint that had members in mode `before` and has them in `mode`
    /// now; `None` when it has nothing for that endpoint (a MODIFIED whose only change is other
    /// modes' members).
    fn body(&self, e: &RecordedEvent<'_>, before: Option<BackendMode>, mode: Option<BackendMode>) -> Option<String> {
        let switched = before != mode;
        let switch_diff = match (switched, mode) {
            (true, Some(m)) => e.event.backends.get(&m).map(|new| {
                let old = e.event.previous_backends.as_ref().and_then(|p| backends::in_mode(p, before));
                backends::diff(old, new)
            }),
            _ => None,
        };
        let diff = switch_diff.as_ref().or_else(|| mode.and_then(|m| e.event.backends_diff.get(&m)));
        let mut changed: Vec<&str> =
            e.event.changed.iter().copied().filter(|c| *c != "backends" || diff.is_some()).collect();
        if switched && !changed.contains(&"backends") {
            changed.push("backends");
        }
        if e.event.kind == ChangeKind::Modified && changed.is_empty() {
            return None;
        }
        Some(render(&PayloadInput {
            event_id: Some(e.id),
            log_id: &self.log_id,
            cluster: self.cluster.as_deref(),
            event: e.event.kind.event_kind(),
            cause: e.cause,
            observed_at: e.observed_at,
            key: e.key,
            uid: &e.event.uid,
            resource_version: &e.event.resource_version,
            view: &e.event.view,
            previous: e.event.previous.as_ref(),
            changed: &changed,
            backends: backends::in_mode(&e.event.backends, mode),
            backends_diff: diff,
            sync: None,
        }))
    }

    /// The `service.synced` delivery of `s` for endpoint `route`, item `sync.index` of a resync.
    pub(super) fn synced(&self, route: &Route, s: &ServiceRow, now: i64, sync: SyncMarker) -> NewDelivery {
        let mode = self.modes.mode_for(&s.view, &route.name);
        let view = Arc::new(s.view.clone());
        let payload = render(&PayloadInput {
            event_id: None,
            log_id: &self.log_id,
            cluster: self.cluster.as_deref(),
            event: EventKind::Synced,
            cause: Cause::Resync,
            observed_at: now,
            key: &s.key,
            uid: &s.uid,
            resource_version: &s.resource_version,
            view: &view,
            previous: None,
            changed: &[],
            backends: backends::in_mode(&s.backends, mode),
            backends_diff: None,
            sync: Some(sync),
        });
        NewDelivery { webhook: route.name.clone(), kind: "SYNCED", msg_id: new_msg_id(), payload, coalesce_ms: None }
    }
}

impl Outbox for Router {
    fn route(&self, e: RecordedEvent<'_>) -> Vec<NewDelivery> {
        let mut bodies: HashMap<(Option<BackendMode>, Option<BackendMode>), Option<String>> = HashMap::new();
        let mut out = Vec::new();
        for r in self.routes.iter().filter(|r| r.accepts(&e)) {
            if let Some(debounce) = r.full_state {
                out.push(declaration(&r.name, "MODIFIED", debounce, "event", Some(e.id)));
                continue;
            }
            let mode = self.modes.mode_for(&e.event.view, &r.name);
            // The mode the endpoint had before this change: another only when the annotation moved.
            let before = match (&e.event.previous, &e.event.previous_backends) {
                (Some(previous), Some(_)) => self.modes.mode_for(previous, &r.name),
                _ => mode,
            };
            let body = bodies.entry((before, mode)).or_insert_with(|| self.body(&e, before, mode));
            if let Some(payload) = body {
                let (webhook, kind) = (r.name.clone(), e.event.kind.as_str());
                let payload = payload.clone();
                out.push(NewDelivery { webhook, kind, msg_id: new_msg_id(), payload, coalesce_ms: None });
            }
        }
        out
    }
}
