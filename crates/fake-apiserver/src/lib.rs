//! An in-process fake Kubernetes API server for tests and the demo: real HTTP/1.1 (and h2c) on
//! `127.0.0.1:0`, serving three stored [`Resource`]s — core/v1 `services`, core/v1 `nodes`
//! (cluster-scoped) and discovery.k8s.io/v1 `endpointslices` — stored as `serde_json::Value` objects
//! exactly as given (unknown fields kept), plus `events` (core/v1 and events.k8s.io/v1).
//!
//! What it speaks (the Kubernetes API's list and watch semantics, as in
//! <https://kubernetes.io/docs/reference/using-api/api-concepts/>); `{prefix}` is `/api/v1` for
//! Services and Nodes and `/apis/discovery.k8s.io/v1` for EndpointSlices, and `[namespaces/{ns}/]` is
//! absent for Nodes:
//! - One global resourceVersion counter across all three resources (like etcd's revision) and one
//!   bounded history of their changes; every object carries the resourceVersion of its last write.
//! - `GET {prefix}/{plural}` (all namespaces), `GET {prefix}/namespaces/{ns}/{plural}`: list with
//!   `limit`/`continue` paging (every page carries the snapshot resourceVersion; the last page has no
//!   `continue`), `labelSelector`, `fieldSelector` (`metadata.name`, `metadata.namespace`; Services also
//!   `spec.type`, `spec.clusterIP`); `{Kind}List` whose items omit `kind`/`apiVersion`. Empty query pairs
//!   (`?&limit=500`) are ignored. A continue token (opaque hex) encodes the snapshot resourceVersion and
//!   the last key served; the following pages are read from the current state after that key but report
//!   the snapshot rv.
//! - The same paths with `watch=true|1` (and the deprecated `{prefix}/watch/...` paths, also for one
//!   object): one compact JSON line per event of that resource only, flushed at once; `resourceVersion`
//!   absent/`"0"` (or `sendInitialEvents=true`) = synthetic ADDED for current objects first, `N` = replay
//!   history after `N`, older than the oldest kept change of the shared history = HTTP 200 + in-band
//!   ERROR 410 line, then end. `timeoutSeconds`, `allowWatchBookmarks` (bookmarks carry the resource's
//!   `kind`/`apiVersion`), selectors (with ADDED/DELETED on selector transitions).
//! - Writes (details in `objects.rs`), the same rules for every resource: `POST` to the collection
//!   (create, 201; 409 `AlreadyExists`; `generateName`), `GET`/`PUT`/`PATCH {prefix}/[namespaces/{ns}/]
//!   {plural}/{name}` and, for Services and Nodes, `.../{name}/status` (409 `Conflict` on a stale
//!   `resourceVersion`; PATCH as merge patch, strategic merge patch, JSON patch or apply patch; a body of
//!   another kind/apiVersion: 400), `DELETE .../{name}` (200 with the object). A write that changes
//!   nothing keeps the resourceVersion and emits no event. A `GET` or `PATCH` that accepts
//!   `as=PartialObjectMetadata` is answered with the metadata only, a list that accepts
//!   `as=PartialObjectMetadataList` with the metadata of each item (`partial.rs`).
//! - Finalizers, for every resource: deleting an object with `metadata.finalizers` only sets
//!   `metadata.deletionTimestamp` (now, RFC 3339) and `deletionGracePeriodSeconds: 0` (MODIFIED); any
//!   later write that leaves it without finalizers deletes it (DELETED, carrying the state stored before
//!   that write); adding a new finalizer to it over HTTP answers 422 `Invalid`. [`FakeApiServer::delete`]
//!   and [`FakeApiServer::delete_resource`] follow the same rules, [`FakeApiServer::delete_now`] does not.
//! - Events (details in `events_http.rs`): `POST`/`GET /api/v1/namespaces/{ns}/events`,
//!   `GET /api/v1/events` (`fieldSelector=involvedObject.name=X` etc.), the same under
//!   `/apis/events.k8s.io/v1/...` (what kube-runtime's `Recorder` uses, including PATCH of an event
//!   series), and `GET`/`PUT`/`PATCH`/`DELETE` of one event. Both APIs share one store (field names
//!   converted), with their own resourceVersion counter; events never appear in other watches, and
//!   cannot be watched.
//! - Discovery for kubectl: `/version` (1.32), `/api`, `/apis` (groups `discovery.k8s.io`,
//!   `events.k8s.io`), `/api/v1`, `/apis/{group}[/v1]`, a minimal `/openapi/v3` so that `kubectl
//!   create`/`apply` validate server-side, and server-side Tables for `kubectl get` (`table.rs`).
//!   Anything else: 404 `Status`.
//!
//! [`Faults`] injects the failures a watcher must survive; they apply to every open watch and request,
//! whatever the resource. Every request is recorded ([`FakeApiServer::requests`]).

mod discovery;
mod errors;
mod events;
mod events_http;
mod faults;
mod http;
mod jsonpatch;
mod list;
mod meta;
mod objects;
mod partial;
mod patch;
mod resource;
mod selector;
mod smp;
mod state;
mod table;
mod watch;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

use events::EventStore;
pub use faults::Faults;
pub use resource::Resource;
use state::{SharedStore, Store};

/// Tunables of a [`FakeApiServer`]; `Default` gives the values documented per field.
#[derive(Debug, Clone)]
pub struct FakeApiServerOptions {
    /// How many change events the history keeps (oldest dropped first); a watch from a resourceVersion
    /// older than the oldest kept change gets the in-band 410. Default 10 000; at least 1 is kept.
    pub history_limit: usize,
    /// How often a watch with `allowWatchBookmarks=true` gets a BOOKMARK. Default 1 s (minimum 10 ms).
    pub bookmark_interval: Duration,
    /// CPU time the server spends (busy, on the thread serving it) on each HTTP request, and a fifth of
    /// it on each watch event it writes: a stand-in for a slower apiserver sharing the machine's CPUs
    /// (one written in Python), for benchmarks. Default zero.
    pub cpu_per_request: Duration,
}

impl Default for FakeApiServerOptions {
    fn default() -> Self {
        FakeApiServerOptions {
            history_limit: 10_000,
            bookmark_interval: Duration::from_secs(1),
            cpu_per_request: Duration::ZERO,
        }
    }
}

/// Keeps the calling thread busy for `cpu` ([`FakeApiServerOptions::cpu_per_request`]).
pub(crate) fn spend(cpu: Duration) {
    if cpu.is_zero() {
        return;
    }
    let start = std::time::Instant::now();
    while start.elapsed() < cpu {
        std::hint::spin_loop();
    }
}

/// One HTTP request as received, for assertions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedRequest {
    /// HTTP method, e.g. `"GET"`.
    pub method: String,
    /// Path without the query, e.g. `"/api/v1/services"`.
    pub path: String,
    /// Raw query string as sent, without `?` (not decoded; `""` if none), e.g. `"&limit=500"`.
    pub query: String,
    /// When it arrived.
    pub at: std::time::Instant,
}

/// State shared by the handle, the accept loop, the handlers and the watch tasks.
pub(crate) struct Shared {
    pub(crate) store: SharedStore,
    /// Events of both APIs (own lock, own resourceVersion counter).
    pub(crate) events: Mutex<EventStore>,
    pub(crate) faults: Faults,
    pub(crate) requests: Mutex<Vec<RecordedRequest>>,
    /// The uid of each namespace read so far ([`Shared::namespace`]).
    pub(crate) namespace_uids: Mutex<std::collections::HashMap<String, String>>,
    pub(crate) options: FakeApiServerOptions,
    pub(crate) addr: SocketAddr,
    /// Becomes `true` (or closes) when the server shuts down.
    pub(crate) shutdown: tokio::sync::watch::Receiver<bool>,
}

impl Shared {
    pub(crate) fn record(&self, req: RecordedRequest) {
        self.requests.lock().expect("requests lock").push(req);
    }

    /// Namespace `name` as the apiserver shows it: every name exists, each with a uid of its own,
    /// the same for the server's life (`kube-system`'s is the cluster's identity for controllers).
    pub(crate) fn namespace(&self, name: &str) -> serde_json::Value {
        let uid = self.namespace_uid(name);
        serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "uid": uid, "resourceVersion": "1"},
            "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}})
    }

    pub(crate) fn namespace_uid(&self, name: &str) -> String {
        let mut uids = self.namespace_uids.lock().expect("namespace uids lock");
        uids.entry(name.to_owned()).or_insert_with(meta::new_uid).clone()
    }
}

struct Handle {
    shared: Arc<Shared>,
    shutdown: tokio::sync::watch::Sender<bool>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.shutdown.send_replace(true);
    }
}

/// A running fake apiserver. Cheap to clone (all clones control the same server); the server stops on
/// [`FakeApiServer::shutdown`] or when the last clone is dropped.
#[derive(Clone)]
pub struct FakeApiServer {
    inner: Arc<Handle>,
}

impl std::fmt::Debug for FakeApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeApiServer").field("addr", &self.addr()).finish_non_exhaustive()
    }
}

impl FakeApiServer {
    /// Bind `127.0.0.1:0` and serve in a tokio task with default options. Errors: binding failed.
    pub async fn start() -> std::io::Result<FakeApiServer> {
        Self::start_with(FakeApiServerOptions::default()).await
    }

    /// Bind `127.0.0.1:0` and serve with `options`. Errors: binding failed.
    pub async fn start_with(options: FakeApiServerOptions) -> std::io::Result<FakeApiServer> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        Self::start_on_with(listener, options).await
    }

    /// Serve on an already bound listener with default options. Errors: its local address is unknown.
    pub async fn start_on(listener: TcpListener) -> std::io::Result<FakeApiServer> {
        Self::start_on_with(listener, FakeApiServerOptions::default()).await
    }

    /// Serve on an already bound listener with `options`. Errors: its local address is unknown.
    pub async fn start_on_with(listener: TcpListener, options: FakeApiServerOptions) -> std::io::Result<FakeApiServer> {
        let addr = listener.local_addr()?;
        let store: SharedStore = Arc::new(Mutex::new(Store::new(options.history_limit)));
        let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
        let shared = Arc::new(Shared {
            faults: Faults::new(store.clone()),
            store,
            events: Mutex::new(EventStore::default()),
            requests: Mutex::new(Vec::new()),
            namespace_uids: Mutex::default(),
            options,
            addr,
            shutdown: shutdown_rx,
        });
        let task = tokio::spawn(accept_loop(listener, shared.clone()));
        let inner = Arc::new(Handle { shared, shutdown: shutdown_tx, task: Mutex::new(Some(task)) });
        Ok(FakeApiServer { inner })
    }

    /// Base URL, `"http://127.0.0.1:PORT"` (no trailing slash).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr())
    }

    /// The bound socket address.
    pub fn addr(&self) -> SocketAddr {
        self.inner.shared.addr
    }

    /// Create or replace a Service: [`FakeApiServer::apply_resource`] with [`Resource::Services`] (same
    /// rules and panics). Returns the new resourceVersion.
    pub fn apply(&self, svc: Value) -> String {
        self.apply_resource(Resource::Services, svc)
    }

    /// Create or replace an object of `res`. The namespace comes from `metadata.namespace` (default
    /// `"default"`, written into the object; a Node's is removed: Nodes never carry one). Sets
    /// `kind`/`apiVersion` if absent; a uid if absent on create (on replace keeps the stored uid unless
    /// the given object has one); `metadata.resourceVersion` to the new global resourceVersion;
    /// `creationTimestamp` if absent (kept from the stored object on replace). Emits ADDED (new) or
    /// MODIFIED (existing) to the watches of `res`. Returns the new resourceVersion, e.g. `"42"`.
    ///
    /// No admission checks (unlike HTTP writes, this may add finalizers to a terminating object, and
    /// `status` is stored as given), but replacing a terminating object keeps its
    /// `deletionTimestamp`/`deletionGracePeriodSeconds`, and if the new object has no finalizers it is
    /// deleted instead (DELETED; the returned resourceVersion is the deletion's).
    ///
    /// Panics if `obj` is not a JSON object, has no non-empty string `metadata.name`, or has a `kind`
    /// other than `res`'s (e.g. a Service given as [`Resource::Nodes`]).
    pub fn apply_resource(&self, res: Resource, obj: Value) -> String {
        self.lock().apply(res, obj).to_string()
    }

    /// Apply many objects in order, each to the resource its `kind` names: `Service` (or no `kind`),
    /// `Node`, `EndpointSlice` (see [`FakeApiServer::apply_resource`]; same panics). Panics on any other
    /// kind, naming it, before storing anything.
    pub fn seed(&self, objects: impl IntoIterator<Item = Value>) {
        let typed: Vec<(Resource, Value)> = objects
            .into_iter()
            .map(|obj| match Resource::of_object(&obj) {
                Ok(res) => (res, obj),
                Err(e) => panic!("FakeApiServer::seed: {e}"),
            })
            .collect();
        let mut store = self.lock();
        for (res, obj) in typed {
            store.apply(res, obj);
        }
    }

    /// Modify a stored Service: [`FakeApiServer::update_resource`] with [`Resource::Services`].
    pub fn update(&self, namespace: &str, name: &str, f: impl FnOnce(&mut Value)) -> Option<String> {
        self.update_resource(Resource::Services, namespace, name, f)
    }

    /// Modify a stored object of `res` in place with `f` (name and namespace are forced back afterwards;
    /// the uid and creationTimestamp are kept if `f` removes them) and emit MODIFIED. `namespace` is
    /// ignored for Nodes (pass `""`). Returns the new resourceVersion, or `None` if there is no such
    /// object. Same finalizer rules as [`FakeApiServer::apply_resource`]: leaving a terminating object
    /// without finalizers deletes it. Panics if `f` changes `kind`.
    pub fn update_resource(
        &self,
        res: Resource,
        namespace: &str,
        name: &str,
        f: impl FnOnce(&mut Value),
    ) -> Option<String> {
        self.lock().update(res, namespace, name, f).map(|rv| rv.to_string())
    }

    /// Delete a Service: [`FakeApiServer::delete_resource`] with [`Resource::Services`].
    pub fn delete(&self, namespace: &str, name: &str) -> bool {
        self.delete_resource(Resource::Services, namespace, name)
    }

    /// Delete an object of `res` as the apiserver does (`namespace` ignored for Nodes). With a non-empty
    /// `metadata.finalizers` it only gets `metadata.deletionTimestamp` (now, RFC 3339) and
    /// `deletionGracePeriodSeconds: 0`, a new resourceVersion and a MODIFIED event, and stays (nothing
    /// happens if it already has a `deletionTimestamp`); otherwise it is removed, emitting DELETED with its
    /// last state carrying the deletion's resourceVersion. `false` if there is no such object.
    pub fn delete_resource(&self, res: Resource, namespace: &str, name: &str) -> bool {
        self.lock().delete(res, namespace, name).is_some()
    }

    /// Remove a Service at once, ignoring finalizers (DELETED with its last state carrying the
    /// deletion's resourceVersion). `false` if there is no such Service.
    pub fn delete_now(&self, namespace: &str, name: &str) -> bool {
        self.lock().remove(Resource::Services, namespace, name).is_some()
    }

    /// Every stored Event in creation order, each as shown by the API it was created through: core/v1
    /// (`apiVersion: "v1"`, `involvedObject`, `message`, …) or events.k8s.io/v1
    /// (`apiVersion: "events.k8s.io/v1"`, `regarding`, `note`, …), with `kind: "Event"` and the server-set
    /// `metadata` (`uid`, `creationTimestamp`, `resourceVersion` from the events' own counter).
    pub fn events(&self) -> Vec<Value> {
        self.inner.shared.events.lock().expect("events lock").all()
    }

    /// One stored Service (with `kind`/`apiVersion`), or `None`.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Value> {
        self.get_resource(Resource::Services, namespace, name)
    }

    /// One stored object of `res` as stored (with `kind`/`apiVersion`, `metadata.resourceVersion`, …),
    /// or `None`. `namespace` is ignored for Nodes (pass `""`).
    pub fn get_resource(&self, res: Resource, namespace: &str, name: &str) -> Option<Value> {
        self.lock().get(res, namespace, name).cloned()
    }

    /// All stored Services, ordered by `(namespace, name)`, with `kind`/`apiVersion`.
    pub fn list(&self) -> Vec<Value> {
        self.list_resource(Resource::Services)
    }

    /// All stored objects of `res`, ordered by `(namespace, name)` (Nodes by name), with
    /// `kind`/`apiVersion`.
    pub fn list_resource(&self, res: Resource) -> Vec<Value> {
        self.lock().all(res)
    }

    /// The current global resourceVersion, shared by all resources (starts at `"1"`, +1 per write).
    pub fn resource_version(&self) -> String {
        self.lock().rv().to_string()
    }

    /// Change the history bound at run time (see [`FakeApiServerOptions::history_limit`]).
    pub fn set_history_limit(&self, limit: usize) {
        self.lock().set_history_limit(limit);
    }

    /// The fault switches.
    pub fn faults(&self) -> &Faults {
        &self.inner.shared.faults
    }

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.inner.shared.requests.lock().expect("requests lock").clone()
    }

    /// The uid `GET /api/v1/namespaces/{name}` answers for namespace `name` (made at its first read
    /// and kept for the server's life): `kube-system`'s identifies the cluster.
    pub fn namespace_uid(&self, name: &str) -> String {
        self.inner.shared.namespace_uid(name)
    }

    /// Number of watch streams currently open (a stream counts until the server notices it ended).
    pub fn open_watches(&self) -> usize {
        self.lock().watcher_count()
    }

    /// Stop accepting, drop every connection (ending all watch streams) and wait for the accept loop.
    pub async fn shutdown(self) {
        self.inner.shutdown.send_replace(true);
        let task = self.inner.task.lock().expect("task lock").take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Store> {
        self.inner.shared.store.lock().expect("store lock")
    }
}

/// Accept connections until shutdown; each is served by hyper-util's auto (HTTP/1.1 + h2c) builder and
/// dropped when [`Faults::refuse_connections`] is switched on or the server shuts down.
async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let router = http::router(shared.clone());
    let mut shutdown = shared.shutdown.clone();
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            _ = until_down(&mut shutdown) => break,
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        tracing::warn!(error = %e, "fake apiserver: accept failed");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                if shared.faults.refusing() {
                    drop(stream);
                    continue;
                }
                let _ = stream.set_nodelay(true);
                let service = TowerToHyperService::new(router.clone());
                let mut epoch = shared.faults.conn_epoch();
                let mut down = shared.shutdown.clone();
                conns.spawn(async move {
                    let builder = auto::Builder::new(TokioExecutor::new());
                    let conn = builder.serve_connection(TokioIo::new(stream), service);
                    tokio::select! {
                        _ = conn => {}
                        _ = epoch.changed() => {}
                        _ = until_down(&mut down) => {}
                    }
                });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    conns.shutdown().await;
}

/// Resolves once the shutdown flag is `true` or its sender is gone.
async fn until_down(rx: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|&down| down).await;
}

/// Reads every `*.json` file of `dir` (sorted by name) as one object for [`FakeApiServer::seed`]: a
/// Service (`kind: Service` or none), a Node or an EndpointSlice. Errors: the directory or a file cannot
/// be read; a file is not JSON, or has another `kind` (`InvalidData`; the message names the file).
pub fn read_seed_dir(dir: &std::path::Path) -> std::io::Result<Vec<Value>> {
    let mut paths: Vec<_> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p)?;
            let invalid =
                |e: String| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{}: {e}", p.display()));
            let obj: Value = serde_json::from_str(&text).map_err(|e| invalid(e.to_string()))?;
            Resource::of_object(&obj).map_err(invalid)?;
            Ok(obj)
        })
        .collect()
}
