//! One watch scope: kube-runtime's watcher (with its default backoff) turned into [`Observation`]s.
//! Buffers a (re)list between `Init` and `InitDone` so absence can be read as deletion; restarts the
//! watcher (hence re-lists) on a malformed line, on a `410 Gone` at watch start, and every
//! `relist_interval`. A restart forced by an error waits kube-runtime's default backoff first (as
//! client-go's reflector backs off between list-and-watch attempts; its steps are in
//! docs/explanation/recording.md): on a large cluster every relist is a full list, and an apiserver
//! or proxy that keeps answering `410` must not be listed in a loop. The same loop serves
//! Services, Nodes and EndpointSlices ([`Kind`]).

use std::fmt::Debug;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::metrics::{Metrics, ScopeLabels};
use crate::model::backends::{ObservedNode, ObservedSlice};
use crate::model::bounded::{MESSAGE, bounded};
use crate::model::{Observed, Scope, ServiceKey, ServiceView};

/// What a watch lists and watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Resource {
    /// core/v1 `services`.
    Services,
    /// core/v1 `nodes` (cluster-scoped).
    Nodes,
    /// discovery.k8s.io/v1 `endpointslices`.
    EndpointSlices,
}

impl Resource {
    /// `services`, `nodes` or `endpointslices`: the `resource` label of the watch metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Services => "services",
            Self::Nodes => "nodes",
            Self::EndpointSlices => "endpointslices",
        }
    }
}

/// A watch scope: one resource in all namespaces (`None`) or in one namespace.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ScopeSpec {
    /// What is watched.
    pub resource: Resource,
    /// The namespace, or `None` for the cluster-wide watch.
    pub namespace: Option<String>,
}

impl ScopeSpec {
    /// A Service scope (the watches vipwatch always runs).
    pub fn services(namespace: Option<String>) -> Self {
        Self { resource: Resource::Services, namespace }
    }

    /// `*` for all namespaces, else the namespace: the `scope` label of the watch metrics.
    pub fn label(&self) -> &str {
        self.namespace.as_deref().unwrap_or("*")
    }

    /// The scope's key in `watch_progress`, logs and readiness: [`Self::label`] for Services (as it
    /// always was), `nodes` and `endpointslices/<label>` for the others.
    pub fn key(&self) -> String {
        match self.resource {
            Resource::Services => self.label().to_owned(),
            Resource::Nodes => "nodes".to_owned(),
            Resource::EndpointSlices => format!("endpointslices/{}", self.label()),
        }
    }

    /// Whether a Service key falls under this scope.
    pub fn covers(&self, key: &ServiceKey) -> bool {
        self.namespace.as_ref().is_none_or(|ns| *ns == key.namespace)
    }
}

/// A change of one kind of object, as a watch reports it.
#[derive(Debug, Clone)]
pub enum Change<T> {
    /// Created or updated (watch `ADDED`/`MODIFIED`).
    Apply(T),
    /// Deleted (watch `DELETED`), with its last state.
    Delete(T),
    /// A complete (re)list: every object of the scope now; `first` for the first since start.
    Listed {
        /// Every object listed, in the apiserver's order.
        items: Vec<T>,
        /// True for the first list since the process started.
        first: bool,
    },
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
    /// A Node changed.
    Node(ScopeSpec, Change<ObservedNode>),
    /// An EndpointSlice changed.
    Slice(ScopeSpec, Change<ObservedSlice>),
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
    Observed { key, uid, resource_version, view: view.into(), in_scope, backends: Default::default() }
}

/// A kind of object a scope watches: how to project it and wrap its changes.
pub trait Kind: Send + Sync + 'static {
    /// The Kubernetes type.
    type Object: kube::Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + 'static;
    /// Its projection.
    type Item: Send + 'static;
    /// The API of the objects in `namespace` (all namespaces when `None`).
    fn api(client: kube::Client, namespace: Option<&str>) -> Api<Self::Object>;
    /// Projects one object.
    fn project(&self, obj: Self::Object) -> Self::Item;
    /// Wraps a change for the recorder.
    fn wrap(&self, scope: ScopeSpec, change: Change<Self::Item>) -> Observation;
}

/// Services, judged in or out of scope by the rule.
pub struct Services(pub Scope);

impl Kind for Services {
    type Object = Service;
    type Item = Observed;
    fn api(client: kube::Client, namespace: Option<&str>) -> Api<Service> {
        namespace.map_or_else(|| Api::all(client.clone()), |ns| Api::namespaced(client.clone(), ns))
    }
    fn project(&self, obj: Service) -> Observed {
        observe(obj, &self.0)
    }
    fn wrap(&self, scope: ScopeSpec, change: Change<Observed>) -> Observation {
        match change {
            Change::Apply(o) => Observation::Apply(scope, o),
            Change::Delete(o) => Observation::Delete(scope, o),
            Change::Listed { items, first } => Observation::Listed { scope, objects: items, first },
        }
    }
}

/// Nodes.
pub struct Nodes;

impl Kind for Nodes {
    type Object = Node;
    type Item = ObservedNode;
    fn api(client: kube::Client, _: Option<&str>) -> Api<Node> {
        Api::all(client)
    }
    fn project(&self, obj: Node) -> ObservedNode {
        ObservedNode::from_node(&obj)
    }
    fn wrap(&self, scope: ScopeSpec, change: Change<ObservedNode>) -> Observation {
        Observation::Node(scope, change)
    }
}

/// EndpointSlices.
pub struct Slices;

impl Kind for Slices {
    type Object = EndpointSlice;
    type Item = ObservedSlice;
    fn api(client: kube::Client, namespace: Option<&str>) -> Api<EndpointSlice> {
        namespace.map_or_else(|| Api::all(client.clone()), |ns| Api::namespaced(client.clone(), ns))
    }
    fn project(&self, obj: EndpointSlice) -> ObservedSlice {
        ObservedSlice::from_slice(&obj)
    }
    fn wrap(&self, scope: ScopeSpec, change: Change<ObservedSlice>) -> Observation {
        Observation::Slice(scope, change)
    }
}

/// Everything one scope's task needs.
pub(super) struct ScopeTask<K: Kind> {
    pub kind: K,
    pub api: Api<K::Object>,
    pub spec: ScopeSpec,
    pub watcher_config: watcher::Config,
    pub relist_interval: Duration,
    pub tx: mpsc::Sender<Observation>,
    pub metrics: Arc<Metrics>,
}

/// How one watcher run ended.
enum End {
    Cancelled,
    /// The periodic relist: restart at once.
    Relist,
    /// An error that only a fresh list recovers from: restart after the backoff.
    Failed,
}

impl<K: Kind> ScopeTask<K> {
    /// Runs watcher after watcher until `cancel` fires or the recorder is gone; a run that failed is
    /// followed by the backoff ([`watcher::DefaultBackoff`], which resets itself after a while without
    /// a backoff) before the next list.
    pub async fn run(self, cancel: CancellationToken) {
        self.zero_metrics();
        let mut lists = Lists::new();
        let mut backoff = watcher::DefaultBackoff::default();
        loop {
            info!(resource = self.spec.resource.as_str(), scope = self.spec.label(), "listing and watching");
            match self.run_once(&cancel, &mut lists).await {
                End::Cancelled => return,
                End::Relist => {
                    self.metrics.watch_restarts.get_or_create(&self.labels()).inc();
                }
                End::Failed => {
                    self.metrics.watch_restarts.get_or_create(&self.labels()).inc();
                    let delay = next_wait(&mut backoff);
                    self.metrics.watch_backoffs.get_or_create(&self.labels()).inc();
                    let (resource, scope) = (self.spec.resource.as_str(), self.spec.label());
                    let delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
                    warn!(
                        resource,
                        scope, delay_ms, "the last list did not give a working watch; backing off before listing again"
                    );
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
    }

    /// Creates this scope's series at 0 so dashboards and alerts see them before the first error.
    fn zero_metrics(&self) {
        let m = &self.metrics;
        for family in [&m.relists, &m.watch_restarts, &m.watch_gone, &m.watch_backoffs] {
            drop(family.get_or_create(&self.labels()));
        }
        for kind in ["list", "watch_start", "gone", "status", "stream", "decode", "no_resource_version", "stalled"] {
            drop(m.watch_errors.get_or_create(&self.error_labels(kind)));
        }
    }

    fn labels(&self) -> ScopeLabels {
        ScopeLabels { resource: self.spec.resource.as_str().to_owned(), scope: self.spec.label().to_owned() }
    }

    fn error_labels(&self, kind: &str) -> crate::metrics::WatchErrorLabels {
        crate::metrics::WatchErrorLabels {
            resource: self.spec.resource.as_str().to_owned(),
            scope: self.spec.label().to_owned(),
            kind: kind.to_owned(),
        }
    }

    async fn run_once(&self, cancel: &CancellationToken, lists: &mut Lists<K::Item>) -> End {
        let stream = watcher(self.api.clone(), self.watcher_config.clone()).default_backoff();
        let mut stream = pin!(stream);
        let relist = tokio::time::sleep(self.relist_interval);
        let mut relist = pin!(relist);
        loop {
            let item = tokio::select! {
                _ = cancel.cancelled() => return End::Cancelled,
                _ = &mut relist => {
                    info!(resource = self.spec.resource.as_str(), scope = self.spec.label(), "periodic re-list (kubernetes.relist_interval)");
                    return End::Relist;
                }
                item = stream.next() => item,
            };
            let message = match item {
                None => return End::Failed,
                Some(Ok(event)) => self.on_event(event, lists),
                Some(Err(err)) if self.on_error(&err) => return End::Failed,
                Some(Err(_)) => None,
            };
            if let Some(message) = message
                && self.tx.send(message).await.is_err()
            {
                return End::Cancelled;
            }
        }
    }

    /// One watcher event as an observation: none while a list is being buffered; a complete re-list
    /// is counted (`vipwatch_watch_relists_total`).
    fn on_event(&self, event: watcher::Event<K::Object>, lists: &mut Lists<K::Item>) -> Option<Observation> {
        let change = lists.on_event(event, |obj| self.kind.project(obj))?;
        if let Change::Listed { items, first } = &change {
            let (resource, scope) = (self.spec.resource.as_str(), self.spec.label());
            debug!(resource, scope, objects = items.len(), "list complete");
            if !first {
                self.metrics.relists.get_or_create(&self.labels()).inc();
            }
        }
        Some(self.kind.wrap(self.spec.clone(), change))
    }

    /// Logs and counts a watcher error; returns true when the watcher must be restarted (a re-list):
    /// after a malformed watch line the event it carried is lost to this stream, and only a fresh
    /// list recovers it.
    fn on_error(&self, err: &watcher::Error) -> bool {
        let (resource, scope) = (self.spec.resource.as_str(), self.spec.label());
        if super::watchdog::is_stall(err) {
            // Logged and counted (`kind="stalled"`) by the watchdog, which knows how long it was silent.
            debug!(resource, scope, error = %err, "stalled request dropped; resuming");
            return false;
        }
        let (kind, restart) = classify(err);
        self.metrics.watch_errors.get_or_create(&self.error_labels(kind)).inc();
        match kind {
            "gone" => {
                self.metrics.watch_gone.get_or_create(&self.labels()).inc();
                warn!(resource, scope, error = %bounded(&err.to_string(), MESSAGE), "resourceVersion expired (410 Gone): re-listing");
            }
            "decode" => {
                warn!(resource, scope, error = %bounded(&err.to_string(), MESSAGE), "malformed watch line: re-listing to recover what it carried")
            }
            _ => {
                warn!(resource, scope, kind, error = %bounded(&err.to_string(), MESSAGE), "watch error; retrying with backoff")
            }
        }
        restart
    }
}

/// The lists of one scope's watchers: the objects of a (re)list buffered between the watcher's
/// `Init` and `InitDone` (so that absence from a complete list can be read as deletion), and whether
/// the next complete list is the first since start. Kept across watcher restarts: a new watcher
/// begins with `Init`, which drops what an interrupted list had buffered.
pub(super) struct Lists<T> {
    buffer: Vec<T>,
    first: bool,
}

impl<T> Lists<T> {
    /// No list seen yet: the next complete one is the first.
    pub fn new() -> Self {
        Self { buffer: Vec::new(), first: true }
    }

    /// Turns one watcher event into a change, projecting its object with `project`: `None` while a
    /// list is being buffered, the whole list at `InitDone`.
    pub fn on_event<O>(&mut self, event: watcher::Event<O>, project: impl FnOnce(O) -> T) -> Option<Change<T>> {
        match event {
            watcher::Event::Init => {
                self.buffer.clear();
                None
            }
            watcher::Event::InitApply(obj) => {
                self.buffer.push(project(obj));
                None
            }
            watcher::Event::InitDone => {
                let items = std::mem::take(&mut self.buffer);
                Some(Change::Listed { items, first: std::mem::replace(&mut self.first, false) })
            }
            watcher::Event::Apply(obj) => Some(Change::Apply(project(obj))),
            watcher::Event::Delete(obj) => Some(Change::Delete(project(obj))),
        }
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

/// The wait before listing again after a run that gave no working watch: the next step of
/// kube-runtime's [`watcher::DefaultBackoff`] (0.8 s doubling to 30 s, plus jitter of up to the step
/// again, starting over once 2 minutes pass without a wait), as client-go's reflector waits.
fn next_wait(backoff: &mut watcher::DefaultBackoff) -> Duration {
    backoff.next().unwrap_or(Duration::from_secs(30))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use kube::core::Status;
    use kube::runtime::watcher::{Error, Event};

    use super::{Change, Lists, ScopeSpec, classify};
    use crate::model::ServiceKey;

    /// `Listed` as `(items, first)`, the other changes as `apply x` / `delete x`.
    fn shown(change: Option<Change<String>>) -> Option<String> {
        change.map(|c| match c {
            Change::Apply(x) => format!("apply {x}"),
            Change::Delete(x) => format!("delete {x}"),
            Change::Listed { items, first } => format!("listed [{}] first={first}", items.join(",")),
        })
    }

    #[test]
    fn a_list_is_buffered_until_init_done_and_only_the_first_since_start_is_first() {
        let mut lists = Lists::new();
        let mut step = |event: Event<&str>| shown(lists.on_event(event, str::to_owned));
        assert_eq!(step(Event::Init), None);
        assert_eq!(step(Event::InitApply("a")), None);
        assert_eq!(step(Event::InitApply("b")), None);
        assert_eq!(step(Event::InitDone).as_deref(), Some("listed [a,b] first=true"));
        assert_eq!(step(Event::Apply("c")).as_deref(), Some("apply c"));
        assert_eq!(step(Event::Delete("a")).as_deref(), Some("delete a"));
        // A relist interrupted (the watcher restarted): what it buffered is dropped at the next Init.
        assert_eq!(step(Event::Init), None);
        assert_eq!(step(Event::InitApply("x")), None);
        assert_eq!(step(Event::Init), None);
        assert_eq!(step(Event::InitApply("b")), None);
        assert_eq!(step(Event::InitApply("c")), None);
        assert_eq!(step(Event::InitDone).as_deref(), Some("listed [b,c] first=false"));
        // An empty list is a list: everything tracked in the scope is gone.
        assert_eq!(step(Event::Init), None);
        assert_eq!(step(Event::InitDone).as_deref(), Some("listed [] first=false"));
    }

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(Status::failure("x", "y").with_code(code).boxed())
    }

    /// Which errors count as what, and which restart the watcher (a re-list) at once: a `410` at
    /// watch start and a malformed line; the rest kube-runtime's watcher retries itself.
    #[test]
    fn watcher_errors_are_sorted_by_kind_and_only_two_restart_the_watcher() {
        let malformed = serde_json::from_str::<u8>("x").unwrap_err();
        let cases = [
            (Error::WatchError(Status::failure("expired", "Expired").with_code(410).boxed()), ("gone", false)),
            (Error::WatchError(Status::failure("x", "y").with_code(500).boxed()), ("status", false)),
            (Error::InitialListFailed(api(410)), ("gone", false)),
            (Error::InitialListFailed(api(403)), ("list", false)),
            (Error::WatchStartFailed(api(410)), ("gone", true)),
            (Error::WatchStartFailed(api(500)), ("watch_start", false)),
            (Error::WatchFailed(kube::Error::SerdeError(malformed)), ("decode", true)),
            (Error::WatchFailed(api(500)), ("stream", false)),
            (Error::NoResourceVersion, ("no_resource_version", false)),
        ];
        for (error, expected) in cases {
            assert_eq!(classify(&error), expected, "{error}");
        }
    }

    #[test]
    fn scope_keys_labels_and_coverage() {
        let all = ScopeSpec::services(None);
        let shop = ScopeSpec::services(Some("shop".into()));
        let nodes = ScopeSpec { resource: super::Resource::Nodes, namespace: None };
        let slices = ScopeSpec { resource: super::Resource::EndpointSlices, namespace: Some("shop".into()) };
        let keys = [&all, &shop, &nodes, &slices].map(|s| (s.label().to_owned(), s.key()));
        let expected = [("*", "*"), ("shop", "shop"), ("*", "nodes"), ("shop", "endpointslices/shop")];
        assert_eq!(keys, expected.map(|(l, k)| (l.to_owned(), k.to_owned())));
        let (web, other) = (ServiceKey::new("shop", "web"), ServiceKey::new("other", "web"));
        assert_eq!(
            [all.covers(&web), all.covers(&other), shop.covers(&web), shop.covers(&other)],
            [true, true, true, false]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn failed_runs_wait_from_0_8_s_doubling_to_30_s_and_start_over_after_2_quiet_minutes() {
        let mut backoff = kube::runtime::watcher::DefaultBackoff::default();
        let within = |wait: Duration, step_ms: u128| {
            let ms = wait.as_millis();
            assert!((step_ms..=2 * step_ms).contains(&ms), "{ms} ms for a step of {step_ms} ms");
        };
        for step_ms in [800, 1_600, 3_200, 6_400, 12_800, 25_600, 30_000, 30_000] {
            let wait = super::next_wait(&mut backoff);
            within(wait, step_ms);
            tokio::time::advance(wait).await; // the scope task's sleep, on paused time
        }
        tokio::time::advance(Duration::from_secs(121)).await;
        within(super::next_wait(&mut backoff), 800);
    }
}
