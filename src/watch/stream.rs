//! One watch scope: kube-runtime's watcher (with its default backoff) turned into [`Observation`]s.
//! Buffers a (re)list between `Init` and `InitDone` so absence can be read as deletion; restarts the
//! watcher (hence re-lists) on a malformed line and every `relist_interval`.

use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::metrics::{Metrics, ScopeLabels};
use crate::model::{Observed, Scope, ServiceKey, ServiceView};

/// A watch scope: all namespaces (`None`) or one namespace.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ScopeSpec {
    /// The namespace, or `None` for the cluster-wide watch.
    pub namespace: Option<String>,
}

impl ScopeSpec {
    /// `*` for all namespaces, else the namespace: the label in logs, metrics and `watch_progress`.
    pub fn label(&self) -> &str {
        self.namespace.as_deref().unwrap_or("*")
    }

    /// Whether a Service key falls under this scope.
    pub fn covers(&self, key: &ServiceKey) -> bool {
        self.namespace.as_ref().is_none_or(|ns| *ns == key.namespace)
    }
}

/// What a scope's stream reports to the recorder.
#[derive(Debug, Clone)]
pub enum Observation {
    /// An object was created or updated (watch `ADDED`/`MODIFIED`).
    Apply(ScopeSpec, Observed),
    /// An object was deleted (watch `DELETED`), with its last state.
    Delete(ScopeSpec, Observed),
    /// A complete (re)list: every object that exists in the scope now.
    Listed {
        /// The scope listed.
        scope: ScopeSpec,
        /// Every object listed, in the apiserver's order.
        objects: Vec<Observed>,
        /// True for the first list since the process started (cause `startup`).
        first: bool,
    },
    /// From the relay or the publisher, not a scope: an appliance chose an address, or a DELETED was
    /// acknowledged everywhere.
    Feedback(crate::model::Feedback),
}

/// Normalizes a Service for the recorder.
pub fn observe(svc: Service, rule: &Scope) -> Observed {
    let key = ServiceKey::new(svc.namespace().unwrap_or_else(|| "default".to_owned()), svc.name_any());
    let uid = svc.uid().unwrap_or_default();
    let resource_version = svc.resource_version().unwrap_or_default();
    let view = ServiceView::from_owned(svc);
    let in_scope = rule.contains(&view);
    Observed { key, uid, resource_version, view, in_scope }
}

/// Everything one scope's task needs.
pub(super) struct ScopeTask {
    pub api: Api<Service>,
    pub spec: ScopeSpec,
    pub watcher_config: watcher::Config,
    pub scope_rule: Scope,
    pub relist_interval: Duration,
    pub tx: mpsc::Sender<Observation>,
    pub metrics: Arc<Metrics>,
}

/// How one watcher run ended.
enum End {
    Cancelled,
    Restart,
}

impl ScopeTask {
    /// Runs watcher after watcher until `cancel` fires or the recorder is gone.
    pub async fn run(self, cancel: CancellationToken) {
        self.zero_metrics();
        let mut first = true;
        loop {
            info!(scope = self.spec.label(), "listing and watching Services");
            match self.run_once(&cancel, &mut first).await {
                End::Cancelled => return,
                End::Restart => {
                    self.metrics.watch_restarts.get_or_create(&self.labels()).inc();
                }
            }
        }
    }

    /// Creates this scope's series at 0 so dashboards and alerts see them before the first error.
    fn zero_metrics(&self) {
        let m = &self.metrics;
        for family in [&m.relists, &m.watch_restarts, &m.watch_gone] {
            drop(family.get_or_create(&self.labels()));
        }
        for kind in ["list", "watch_start", "gone", "status", "stream", "decode", "no_resource_version"] {
            let labels =
                crate::metrics::WatchErrorLabels { scope: self.spec.label().to_owned(), kind: kind.to_owned() };
            drop(m.watch_errors.get_or_create(&labels));
        }
    }

    fn labels(&self) -> ScopeLabels {
        ScopeLabels { scope: self.spec.label().to_owned() }
    }

    async fn run_once(&self, cancel: &CancellationToken, first: &mut bool) -> End {
        let stream = watcher(self.api.clone(), self.watcher_config.clone()).default_backoff();
        let mut stream = pin!(stream);
        let relist = tokio::time::sleep(self.relist_interval);
        let mut relist = pin!(relist);
        let mut buffer: Vec<Observed> = Vec::new();
        loop {
            let item = tokio::select! {
                _ = cancel.cancelled() => return End::Cancelled,
                _ = &mut relist => {
                    info!(scope = self.spec.label(), "periodic re-list (kubernetes.relist_interval)");
                    return End::Restart;
                }
                item = stream.next() => item,
            };
            let message = match item {
                None => return End::Restart,
                Some(Ok(event)) => self.on_event(event, &mut buffer, first),
                Some(Err(err)) if self.on_error(&err) => return End::Restart,
                Some(Err(_)) => None,
            };
            if let Some(message) = message
                && self.tx.send(message).await.is_err()
            {
                return End::Cancelled;
            }
        }
    }

    fn on_event(
        &self,
        event: watcher::Event<Service>,
        buffer: &mut Vec<Observed>,
        first: &mut bool,
    ) -> Option<Observation> {
        let scope = self.spec.clone();
        match event {
            watcher::Event::Init => {
                buffer.clear();
                None
            }
            watcher::Event::InitApply(svc) => {
                buffer.push(observe(svc, &self.scope_rule));
                None
            }
            watcher::Event::InitDone => {
                let objects = std::mem::take(buffer);
                debug!(scope = scope.label(), objects = objects.len(), "list complete");
                if !*first {
                    self.metrics.relists.get_or_create(&self.labels()).inc();
                }
                let first = std::mem::replace(first, false);
                Some(Observation::Listed { scope, objects, first })
            }
            watcher::Event::Apply(svc) => Some(Observation::Apply(scope, observe(svc, &self.scope_rule))),
            watcher::Event::Delete(svc) => Some(Observation::Delete(scope, observe(svc, &self.scope_rule))),
        }
    }

    /// Logs and counts a watcher error; returns true when the watcher must be restarted (a re-list):
    /// after a malformed watch line the event it carried is lost to this stream, and only a fresh
    /// list recovers it.
    fn on_error(&self, err: &watcher::Error) -> bool {
        let scope = self.spec.label();
        let (kind, restart) = classify(err);
        self.metrics.watch_error(scope, kind);
        match kind {
            "gone" => {
                self.metrics.watch_gone.get_or_create(&self.labels()).inc();
                warn!(scope, error = %err, "resourceVersion expired (410 Gone): re-listing");
            }
            "decode" => warn!(scope, error = %err, "malformed watch line: re-listing to recover what it carried"),
            _ => warn!(scope, kind, error = %err, "watch error; retrying with backoff"),
        }
        restart
    }
}

/// Sorts a watcher error into a metrics `kind` and whether to restart the watcher.
fn classify(err: &watcher::Error) -> (&'static str, bool) {
    match err {
        watcher::Error::WatchError(status) if status.code == 410 => ("gone", false),
        watcher::Error::WatchError(_) => ("status", false),
        watcher::Error::InitialListFailed(e) if is_gone(e) => ("gone", false),
        watcher::Error::InitialListFailed(_) => ("list", false),
        watcher::Error::WatchStartFailed(e) if is_gone(e) => ("gone", true),
        watcher::Error::WatchStartFailed(_) => ("watch_start", false),
        watcher::Error::WatchFailed(kube::Error::SerdeError(_)) => ("decode", true),
        watcher::Error::WatchFailed(_) => ("stream", false),
        watcher::Error::NoResourceVersion => ("no_resource_version", false),
    }
}

fn is_gone(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(status) if status.code == 410)
}
