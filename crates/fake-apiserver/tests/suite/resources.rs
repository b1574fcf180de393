//! Nodes and EndpointSlices on the fake apiserver over real sockets: kube-rs `Api<Node>` and
//! `Api<EndpointSlice>` (paged and selected lists, watches from a resourceVersion, 410 on a compacted or
//! overrun history, bookmarks, selector transitions, the Node `status` subresource, HTTP writes), the one
//! resourceVersion counter shared with Services while each watch sees only its own resource, the Rust API
//! (`*_resource`, mixed `seed`, `read_seed_dir`), and the installed `kubectl` (discovery, `label`,
//! `cordon`, `taint`, `apply`, `get` tables, `delete`), each write checked through a watch.

use crate::require;

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::pin::Pin;
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout};
use vipwatch_fake_apiserver::{FakeApiServer, FakeApiServerOptions, Resource, read_seed_dir};

const WAIT: Duration = Duration::from_secs(20);
const EXCLUDE: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

fn client(server: &FakeApiServer) -> kube::Client {
    kube::Client::try_from(kube::Config::new(server.url().parse().expect("url"))).expect("kube client")
}

fn node(name: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"podCIDR": "10.244.0.0/24", "providerID": format!("fake://{name}")},
        "status": {"conditions": [{"type": "Ready", "status": "True"}],
                   "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname", "address": name}],
                   "nodeInfo": {"kubeletVersion": "v1.32.0"}},
    })
}

fn slice(ns: &str, name: &str, service: &str, ips: &[&str]) -> Value {
    let endpoints: Vec<Value> =
        ips.iter().map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}, "nodeName": "w1"})).collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": ns, "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "protocol": "TCP", "port": 8080}],
        "endpoints": endpoints,
    })
}

fn svc(ns: &str, name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": ns},
           "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP"}]}})
}

async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    timeout(WAIT, fut).await.unwrap_or_else(|_| panic!("timed out waiting for: {what}"))
}

/// Poll `cond` until it holds, failing after [`WAIT`].
async fn eventually(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await; // ok: poll interval of a deadline-bounded wait
    }
}

type Events<K> = Pin<Box<dyn Stream<Item = kube::Result<WatchEvent<K>>> + Send>>;

async fn watch<K>(api: &Api<K>, wp: &WatchParams, rv: &str) -> Events<K>
where
    K: Clone + DeserializeOwned + Debug + Send + 'static,
{
    api.watch(wp, rv).await.expect("watch request").boxed()
}

/// Next watch item, bookmarks included.
async fn next_raw<K: Debug>(events: &mut Events<K>) -> WatchEvent<K> {
    within("watch event", events.next()).await.expect("watch ended").expect("watch error")
}

/// Next non-bookmark event as `("ADDED"|"MODIFIED"|"DELETED"|"ERROR", object as JSON)`.
async fn next<K: Debug + Serialize>(events: &mut Events<K>) -> (&'static str, Value) {
    loop {
        let event = match next_raw(events).await {
            WatchEvent::Added(o) => ("ADDED", serde_json::to_value(o).unwrap()),
            WatchEvent::Modified(o) => ("MODIFIED", serde_json::to_value(o).unwrap()),
            WatchEvent::Deleted(o) => ("DELETED", serde_json::to_value(o).unwrap()),
            WatchEvent::Error(e) => ("ERROR", json!({"code": e.code, "reason": e.reason})),
            WatchEvent::Bookmark(_) => continue,
        };
        return event;
    }
}

/// `(type, name, resourceVersion)` of the next non-bookmark event.
async fn next_key<K: Debug + Serialize>(events: &mut Events<K>) -> (&'static str, String, String) {
    let (ty, obj) = next(events).await;
    let field = |f: &str| obj["metadata"][f].as_str().unwrap_or("").to_string();
    (ty, field("name"), field("resourceVersion"))
}

fn api_error(e: kube::Error) -> Box<kube::core::Status> {
    match e {
        kube::Error::Api(s) => s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn names<K: kube::Resource>(items: &[K]) -> Vec<String> {
    items.iter().map(|o| o.meta().name.clone().unwrap_or_default()).collect()
}

/// One HTTP/1.1 request with `Connection: close` and an optional JSON body, read until the server closes:
/// `(status, body)`, a chunked body decoded.
async fn raw_bytes(server: &FakeApiServer, method: &str, target: &str, body: Option<&Value>) -> (u16, Vec<u8>) {
    let mut stream = TcpStream::connect(server.addr()).await.expect("connect");
    let body = body.map(Value::to_string).unwrap_or_default();
    let request = format!(
        "{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: application/json\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    within("raw response", stream.read_to_end(&mut response)).await.unwrap();
    let end = response.windows(4).position(|w| w == b"\r\n\r\n").expect("response head");
    let head = String::from_utf8_lossy(&response[..end]).to_lowercase();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let mut rest = &response[end + 4..];
    if !head.contains("transfer-encoding: chunked") {
        return (status, rest.to_vec());
    }
    let mut body = Vec::new();
    loop {
        let eol = rest.windows(2).position(|w| w == b"\r\n").expect("chunk size line");
        let size = usize::from_str_radix(std::str::from_utf8(&rest[..eol]).unwrap().trim(), 16).expect("chunk size");
        if size == 0 {
            return (status, body);
        }
        body.extend_from_slice(&rest[eol + 2..eol + 2 + size]);
        rest = &rest[eol + 2 + size + 2..];
    }
}

/// [`raw_bytes`] with a JSON body.
async fn raw(server: &FakeApiServer, method: &str, target: &str, body: Option<&Value>) -> (u16, Value) {
    let (status, bytes) = raw_bytes(server, method, target, body).await;
    (status, serde_json::from_slice(&bytes).expect("JSON body"))
}

/// A whole watch stream (it must end, e.g. by `timeoutSeconds`) as `(type, kind, name)` per line.
async fn raw_watch(server: &FakeApiServer, target: &str) -> Vec<(String, String, String)> {
    let (status, bytes) = raw_bytes(server, "GET", target, None).await;
    assert_eq!(status, 200, "{target}");
    let text = String::from_utf8(bytes).unwrap();
    assert!(text.ends_with('\n'), "{text}");
    let event = |line: &str| {
        let v: Value = serde_json::from_str(line).unwrap();
        let field = |p: &str| v.pointer(p).and_then(Value::as_str).unwrap_or("").to_string();
        (field("/type"), field("/object/kind"), field("/object/metadata/name"))
    };
    text.lines().map(event).collect()
}

#[tokio::test]
async fn node_and_slice_lists_page_and_select() {
    let server = FakeApiServer::start().await.unwrap();
    let edge = |i: usize| if i % 4 == 3 { json!({"role": "edge"}) } else { json!({}) };
    let nodes = (0..12).map(|i| node(&format!("w{i:02}"), edge(i)));
    let slices = [
        slice("shop", "web-b", "web", &["10.1.0.2"]),
        slice("shop", "web-a", "web", &["10.1.0.1"]),
        slice("shop", "api-a", "api", &["10.1.0.3"]),
        slice("other", "web-x", "web", &["10.2.0.1"]),
    ];
    server.seed(nodes.chain(slices).chain([svc("shop", "web")]));
    let snapshot = server.resource_version();
    assert_eq!(snapshot, "18", "one counter over 12 nodes, 4 slices and a Service");

    let nodes: Api<Node> = Api::all(client(&server));
    let (mut seen, mut sizes, mut token) = (Vec::new(), Vec::new(), None::<String>);
    loop {
        let mut lp = ListParams::default().limit(5);
        if let Some(t) = &token {
            lp = lp.continue_token(t);
        }
        let page = nodes.list(&lp).await.expect("node page");
        assert_eq!(page.metadata.resource_version.as_deref(), Some(snapshot.as_str()));
        assert!(page.items.iter().all(|n| n.metadata.namespace.is_none()), "Nodes have no namespace");
        sizes.push(page.items.len());
        seen.extend(names(&page.items));
        // A write between pages must not change the pages' resourceVersion.
        server.update_resource(Resource::Nodes, "", "w00", |o| o["metadata"]["labels"]["touched"] = json!("yes"));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => token = Some(c),
            None => break,
        }
    }
    assert_eq!(sizes, [5, 5, 2]);
    assert_eq!(seen, (0..12).map(|i| format!("w{i:02}")).collect::<Vec<_>>());
    let edges = nodes.list(&ListParams::default().labels("role=edge")).await.unwrap();
    assert_eq!(names(&edges.items), ["w03", "w07", "w11"]);
    let one = nodes.list(&ListParams::default().fields("metadata.name=w05")).await.unwrap();
    assert_eq!(names(&one.items), ["w05"]);

    let shop: Api<EndpointSlice> = Api::namespaced(client(&server), "shop");
    let web = shop.list(&ListParams::default().labels("kubernetes.io/service-name=web")).await.unwrap();
    assert_eq!(names(&web.items), ["web-a", "web-b"]);
    let all: Api<EndpointSlice> = Api::all(client(&server));
    let every_web = all.list(&ListParams::default().labels("kubernetes.io/service-name=web")).await.unwrap();
    let keys: Vec<String> = every_web
        .items
        .iter()
        .map(|s| format!("{}/{}", s.metadata.namespace.clone().unwrap(), s.metadata.name.clone().unwrap()))
        .collect();
    assert_eq!(keys, ["other/web-x", "shop/web-a", "shop/web-b"]);
    let other = all.list(&ListParams::default().fields("metadata.namespace=other")).await.unwrap();
    assert_eq!(names(&other.items), ["web-x"]);
    let first = all.list(&ListParams::default().limit(3)).await.unwrap();
    assert_eq!(names(&first.items), ["web-x", "api-a", "web-a"]);
    let rest = all.list(&ListParams::default().limit(3).continue_token(&first.metadata.continue_.unwrap())).await;
    let rest = rest.unwrap();
    assert_eq!((names(&rest.items), rest.metadata.continue_), (vec!["web-b".to_string()], None));

    // The query exactly as vipwatch sends it, and the list shapes real servers answer.
    let target =
        "/apis/discovery.k8s.io/v1/namespaces/shop/endpointslices?labelSelector=kubernetes.io/service-name%3Dweb";
    let (code, list) = raw(&server, "GET", target, None).await;
    assert_eq!(
        (code, &list["kind"], &list["apiVersion"]),
        (200, &json!("EndpointSliceList"), &json!("discovery.k8s.io/v1"))
    );
    let items = list["items"].as_array().unwrap();
    assert_eq!(items.iter().map(|i| i["metadata"]["name"].as_str().unwrap()).collect::<Vec<_>>(), ["web-a", "web-b"]);
    assert!(items.iter().all(|i| i.get("kind").is_none() && i.get("apiVersion").is_none()));
    assert_eq!(items[0]["addressType"], "IPv4");
    let (code, list) = raw(&server, "GET", "/api/v1/nodes?limit=1", None).await;
    assert_eq!((code, &list["kind"], &list["apiVersion"]), (200, &json!("NodeList"), &json!("v1")));
    assert_eq!(list["items"][0]["metadata"]["name"], "w00");
    assert!(list["items"][0].get("kind").is_none() && list["items"][0]["metadata"].get("namespace").is_none());
    assert!(list["metadata"]["continue"].is_string());
    for (target, code) in [
        ("/api/v1/nodes?fieldSelector=spec.type%3DLoadBalancer", 400),
        ("/api/v1/namespaces/shop/nodes", 404),
        ("/api/v1/services/web", 404),
        ("/api/v1/endpointslices", 404),
        ("/apis/discovery.k8s.io/v1/namespaces/shop/endpointslices/web-a/status", 404),
        ("/api/v1/nodes/missing", 404),
    ] {
        let (got, body) = raw(&server, "GET", target, None).await;
        assert_eq!((got, &body["kind"], &body["code"]), (code, &json!("Status"), &json!(code)), "{target}");
    }
    let (_, missing) = raw(&server, "GET", "/apis/discovery.k8s.io/v1/namespaces/shop/endpointslices/nope", None).await;
    assert_eq!(missing["message"], "endpointslices.discovery.k8s.io \"nope\" not found");
    assert_eq!(missing["details"], json!({"name": "nope", "group": "discovery.k8s.io", "kind": "endpointslices"}));
    let reqs = server.requests();
    let kube_query = reqs.iter().find(|r| r.path == "/apis/discovery.k8s.io/v1/namespaces/shop/endpointslices");
    assert_eq!(kube_query.unwrap().query, "&labelSelector=kubernetes.io%2Fservice-name%3Dweb");
}

#[tokio::test]
async fn each_watch_sees_only_its_resource_from_one_counter() {
    let server = FakeApiServer::start().await.unwrap();
    let rv0 = server.resource_version();
    assert_eq!(rv0, "1");
    let mut services = watch(&Api::<Service>::all(client(&server)), &WatchParams::default(), &rv0).await;
    let mut nodes = watch(&Api::<Node>::all(client(&server)), &WatchParams::default(), &rv0).await;
    let mut slices = watch(&Api::<EndpointSlice>::all(client(&server)), &WatchParams::default(), &rv0).await;

    assert_eq!(server.apply(svc("shop", "web")), "2");
    assert_eq!(server.apply_resource(Resource::Nodes, node("w1", json!({}))), "3");
    assert_eq!(server.apply_resource(Resource::EndpointSlices, slice("shop", "web-a", "web", &["10.1.0.1"])), "4");
    let relabel = |o: &mut Value| o["metadata"]["labels"][EXCLUDE] = json!("true");
    assert_eq!(server.update_resource(Resource::Nodes, "", "w1", relabel).as_deref(), Some("5"));
    assert_eq!(server.update("shop", "web", |o| o["spec"]["type"] = json!("NodePort")).as_deref(), Some("6"));
    assert!(server.delete_resource(Resource::EndpointSlices, "shop", "web-a"));
    assert_eq!(server.resource_version(), "7");

    let key = |ty, name: &str, rv: &str| (ty, name.to_string(), rv.to_string());
    assert_eq!(next_key(&mut services).await, key("ADDED", "web", "2"));
    assert_eq!(next_key(&mut services).await, key("MODIFIED", "web", "6"));
    assert_eq!(next_key(&mut nodes).await, key("ADDED", "w1", "3"));
    assert_eq!(next_key(&mut nodes).await, key("MODIFIED", "w1", "5"));
    assert_eq!(next_key(&mut slices).await, key("ADDED", "web-a", "4"));
    assert_eq!(next_key(&mut slices).await, key("DELETED", "web-a", "7"));
    // Nothing else is queued: the next event of each watch is the next write of its own resource.
    server.apply_resource(Resource::Nodes, node("w2", json!({})));
    server.apply(svc("shop", "api"));
    server.apply_resource(Resource::EndpointSlices, slice("shop", "api-a", "api", &["10.1.0.9"]));
    assert_eq!(next_key(&mut nodes).await, key("ADDED", "w2", "8"));
    assert_eq!(next_key(&mut services).await, key("ADDED", "api", "9"));
    assert_eq!(next_key(&mut slices).await, key("ADDED", "api-a", "10"));

    // A watch from "0" starts with synthetic ADDED for its own resource only, each object's kind its own.
    let mut fresh = watch(&Api::<Node>::all(client(&server)), &WatchParams::default(), "0").await;
    let (ty, first) = next(&mut fresh).await;
    assert_eq!((ty, &first["metadata"]["name"], &first["kind"]), ("ADDED", &json!("w1"), &json!("Node")));
    assert_eq!(next_key(&mut fresh).await, key("ADDED", "w2", "8"));
    server.apply(svc("shop", "late"));
    server.apply_resource(Resource::Nodes, node("w3", json!({})));
    assert_eq!(next_key(&mut fresh).await, key("ADDED", "w3", "12"));
}

#[tokio::test]
async fn node_status_subresource_and_main_writes() {
    let server = FakeApiServer::start().await.unwrap();
    server.apply_resource(Resource::Nodes, node("w1", json!({"kubernetes.io/hostname": "w1"})));
    let api: Api<Node> = Api::all(client(&server));
    let mut events = watch(&api, &WatchParams::default(), &server.resource_version()).await;
    let stored = || server.get_resource(Resource::Nodes, "", "w1").unwrap();
    // The stored object as the watch events show it: through k8s-openapi's `Node` (defaults filled in).
    let typed = |v: Value| serde_json::to_value(serde_json::from_value::<Node>(v).unwrap()).unwrap();
    let original_spec = stored()["spec"].clone();

    // A status-only patch: MODIFIED with the new status, the spec untouched even if the patch names it.
    let not_ready = json!({"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "KubeletDown"}]},
                           "spec": {"unschedulable": true}});
    let got = api.patch_status("w1", &PatchParams::default(), &Patch::Merge(&not_ready)).await.unwrap();
    assert_eq!(got.metadata.resource_version, Some(server.resource_version()));
    let (ty, obj) = next(&mut events).await;
    assert_eq!(ty, "MODIFIED");
    assert_eq!(obj["status"]["conditions"], json!([{"type": "Ready", "status": "False", "reason": "KubeletDown"}]));
    assert_eq!(obj["spec"], original_spec);
    assert_eq!(obj["metadata"]["resourceVersion"], json!(server.resource_version()));

    // Strategic merge on status merges addresses by type.
    let moved = json!({"status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.9"}]}});
    api.patch_status("w1", &PatchParams::default(), &Patch::Strategic(&moved)).await.unwrap();
    let (ty, obj) = next(&mut events).await;
    assert_eq!(ty, "MODIFIED");
    assert_eq!(
        obj["status"]["addresses"],
        json!([{"type": "InternalIP", "address": "10.0.0.9"}, {"type": "Hostname", "address": "w1"}])
    );

    // A main-resource patch keeps the status, even if it names one.
    let status_before = stored()["status"].clone();
    let cordon = json!({"spec": {"unschedulable": true}, "status": {"conditions": []}});
    api.patch("w1", &PatchParams::default(), &Patch::Strategic(&cordon)).await.unwrap();
    let (ty, obj) = next(&mut events).await;
    assert_eq!((ty, &obj["spec"]["unschedulable"]), ("MODIFIED", &json!(true)));
    assert_eq!(obj["status"], typed(stored())["status"]);
    assert_eq!(stored()["status"], status_before);

    // A write that changes nothing: same resourceVersion, no event.
    let rv = server.resource_version();
    api.patch("w1", &PatchParams::default(), &Patch::Merge(&json!({"spec": {"unschedulable": true}}))).await.unwrap();
    api.patch_status("w1", &PatchParams::default(), &Patch::Merge(&json!({"status": status_before}))).await.unwrap();
    assert_eq!(server.resource_version(), rv);

    // PUT /status with a stale resourceVersion conflicts; with the current one it replaces the status only.
    let mut current = api.get_status("w1").await.unwrap();
    let mut stale = current.clone();
    stale.metadata.resource_version = Some("2".into());
    let err = api_error(api.replace_status("w1", &PostParams::default(), &stale).await.unwrap_err());
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
    assert_eq!(
        err.message,
        "Operation cannot be fulfilled on nodes \"w1\": the object has been modified; please apply your changes to the latest version and try again"
    );
    current.status.as_mut().unwrap().conditions = Some(vec![]);
    current.spec.as_mut().unwrap().unschedulable = Some(false);
    api.replace_status("w1", &PostParams::default(), &current).await.unwrap();
    let (ty, obj) = next(&mut events).await;
    assert_eq!((ty, &obj["spec"]["unschedulable"]), ("MODIFIED", &json!(true)));
    assert_eq!(obj["status"].get("conditions"), Some(&json!([])));

    // A patch that would change the kind is refused.
    let to_svc = json!([{"op": "replace", "path": "/kind", "value": "Service"}]);
    let err = api_error(
        api.patch("w1", &PatchParams::default(), &Patch::<()>::Json(serde_json::from_value(to_svc).unwrap()))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 400);
    let (_, body) = raw(&server, "GET", "/api/v1/nodes/w1/status", None).await;
    assert_eq!(body, stored(), "GET of /status answers the whole object");
}

#[tokio::test]
async fn compacted_or_overrun_history_gives_in_band_410() {
    let options = FakeApiServerOptions { history_limit: 3, ..Default::default() };
    let server = FakeApiServer::start_with(options).await.unwrap();
    let before = server.resource_version();
    server.apply_resource(Resource::Nodes, node("w1", json!({})));
    let node_rv = server.resource_version();
    // Writes to Services push the Node's change out of the shared history.
    for i in 0..3 {
        server.apply(svc("shop", &format!("s{i}")));
    }
    let nodes: Api<Node> = Api::all(client(&server));
    let mut expired = watch(&nodes, &WatchParams::default(), &before).await;
    assert_eq!(next(&mut expired).await, ("ERROR", json!({"code": 410, "reason": "Expired"})));
    assert!(within("end of stream", expired.next()).await.is_none());
    // From the Node's own write everything later is still kept: nothing of this resource to replay.
    let mut resumed = watch(&nodes, &WatchParams::default(), &node_rv).await;
    server.update_resource(Resource::Nodes, "", "w1", |o| o["metadata"]["labels"] = json!({"a": "b"}));
    assert_eq!(next_key(&mut resumed).await, ("MODIFIED", "w1".to_string(), server.resource_version()));

    // compact_history: an EndpointSlice watch from an older version gets the 410.
    let slice_rv = server.apply_resource(Resource::EndpointSlices, slice("shop", "web-a", "web", &["10.1.0.1"]));
    server.apply_resource(Resource::EndpointSlices, slice("shop", "web-b", "web", &["10.1.0.2"]));
    server.faults().compact_history();
    let slices: Api<EndpointSlice> = Api::all(client(&server));
    let mut old = watch(&slices, &WatchParams::default(), &slice_rv).await;
    assert_eq!(next(&mut old).await, ("ERROR", json!({"code": 410, "reason": "Expired"})));

    // force_gone reaches every open watch, whatever its resource.
    let now = server.resource_version();
    let services: Api<Service> = Api::all(client(&server));
    let mut w_svc = watch(&services, &WatchParams::default(), &now).await;
    let mut w_node = watch(&nodes, &WatchParams::default(), &now).await;
    let mut w_slice = watch(&slices, &WatchParams::default(), &now).await;
    eventually("four watches open", || server.open_watches() == 4).await;
    server.faults().force_gone();
    assert_eq!(next(&mut w_svc).await, ("ERROR", json!({"code": 410, "reason": "Expired"})));
    assert_eq!(next(&mut w_node).await, ("ERROR", json!({"code": 410, "reason": "Expired"})));
    assert_eq!(next(&mut w_slice).await, ("ERROR", json!({"code": 410, "reason": "Expired"})));
    assert!(within("node stream end", w_node.next()).await.is_none());
    assert!(within("slice stream end", w_slice.next()).await.is_none());
}

#[tokio::test]
async fn bookmarks_carry_the_watched_kind_and_advance_past_other_resources() {
    let options = FakeApiServerOptions { bookmark_interval: Duration::from_secs(3600), ..Default::default() };
    let server = FakeApiServer::start_with(options).await.unwrap();
    server.apply_resource(Resource::Nodes, node("w1", json!({})));
    server.apply_resource(Resource::EndpointSlices, slice("shop", "web-a", "web", &["10.1.0.1"]));
    let nodes: Api<Node> = Api::all(client(&server));
    let slices: Api<EndpointSlice> = Api::namespaced(client(&server), "shop");
    let rv = server.resource_version();
    let mut w_node = watch(&nodes, &WatchParams::default(), &rv).await;
    let mut w_slice = watch(&slices, &WatchParams::default(), &rv).await;
    eventually("watches open", || server.open_watches() == 2).await;
    server.apply(svc("shop", "web")); // another resource's write: no event, but the bookmark moves past it
    server.faults().bookmark_now();
    match next_raw(&mut w_node).await {
        WatchEvent::Bookmark(b) => {
            assert_eq!((b.types.kind.as_str(), b.types.api_version.as_str()), ("Node", "v1"));
            assert_eq!(b.metadata.resource_version, server.resource_version());
        }
        e => panic!("expected a BOOKMARK, got {e:?}"),
    }
    match next_raw(&mut w_slice).await {
        WatchEvent::Bookmark(b) => {
            assert_eq!((b.types.kind.as_str(), b.types.api_version.as_str()), ("EndpointSlice", "discovery.k8s.io/v1"));
            assert_eq!(b.metadata.resource_version, server.resource_version());
        }
        e => panic!("expected a BOOKMARK, got {e:?}"),
    }

    // Streaming lists: the initial ADDED events, then the initial-events-end bookmark of the kind.
    let mut streaming = watch(&slices, &WatchParams::streaming_lists(), "").await;
    assert_eq!(next_key(&mut streaming).await.1, "web-a");
    match next_raw(&mut streaming).await {
        WatchEvent::Bookmark(b) => {
            assert_eq!(b.types.kind, "EndpointSlice");
            assert_eq!(b.metadata.annotations.get("k8s.io/initial-events-end").map(String::as_str), Some("true"));
        }
        e => panic!("expected the initial-events-end BOOKMARK, got {e:?}"),
    }

    // go_silent holds Node events back until switched off; timeoutSeconds then ends the stream cleanly.
    let mut short = watch(&nodes, &WatchParams::default().timeout(3), &server.resource_version()).await;
    server.faults().go_silent(true);
    server.update_resource(Resource::Nodes, "", "w1", |o| o["spec"]["unschedulable"] = json!(true));
    assert!(timeout(Duration::from_millis(300), short.next()).await.is_err(), "a silent stream sent something");
    server.faults().go_silent(false);
    assert_eq!(next_key(&mut short).await.0, "MODIFIED");
    loop {
        match within("end after timeoutSeconds", short.next()).await {
            None => break,
            Some(Ok(WatchEvent::Bookmark(_))) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[tokio::test]
async fn deprecated_watch_paths_serve_nodes_and_slices() {
    let server = FakeApiServer::start().await.unwrap();
    server.seed([
        node("w1", json!({})),
        node("w2", json!({})),
        slice("shop", "web-a", "web", &["10.1.0.1"]),
        slice("shop", "api-a", "api", &["10.1.0.2"]),
        slice("other", "web-x", "web", &["10.2.0.1"]),
    ]);
    let ev = |ty: &str, kind: &str, name: &str| (ty.to_string(), kind.to_string(), name.to_string());
    let (one_node, shop_web, all_nodes) = tokio::join!(
        raw_watch(&server, "/api/v1/watch/nodes/w1?timeoutSeconds=1"),
        raw_watch(
            &server,
            "/apis/discovery.k8s.io/v1/watch/namespaces/shop/endpointslices?timeoutSeconds=1&labelSelector=kubernetes.io/service-name%3Dweb"
        ),
        raw_watch(&server, "/api/v1/nodes?watch=1&timeoutSeconds=1&allowWatchBookmarks=true&sendInitialEvents=true"),
    );
    assert_eq!(one_node, [ev("ADDED", "Node", "w1")]);
    assert_eq!(shop_web, [ev("ADDED", "EndpointSlice", "web-a")]);
    assert_eq!(all_nodes, [ev("ADDED", "Node", "w1"), ev("ADDED", "Node", "w2"), ev("BOOKMARK", "Node", "")]);
    let watch_reqs = server.requests().into_iter().filter(|r| r.path.contains("/watch/")).count();
    assert_eq!(watch_reqs, 2);
}

#[tokio::test]
async fn selector_transitions_become_added_and_deleted() {
    let server = FakeApiServer::start().await.unwrap();
    let shop: Api<EndpointSlice> = Api::namespaced(client(&server), "shop");
    let wp = WatchParams::default().labels("kubernetes.io/service-name=web");
    let mut web = watch(&shop, &wp, &server.resource_version()).await;
    server.apply_resource(Resource::EndpointSlices, slice("shop", "api-a", "api", &["10.1.0.3"]));
    let added = server.apply_resource(Resource::EndpointSlices, slice("shop", "web-a", "web", &["10.1.0.1"]));
    assert_eq!(next_key(&mut web).await, ("ADDED", "web-a".to_string(), added));
    let relabel =
        |to: &'static str| move |o: &mut Value| o["metadata"]["labels"]["kubernetes.io/service-name"] = json!(to);
    let left = server.update_resource(Resource::EndpointSlices, "shop", "web-a", relabel("web-old")).unwrap();
    let (ty, obj) = next(&mut web).await;
    assert_eq!((ty, &obj["metadata"]["resourceVersion"]), ("DELETED", &json!(left)));
    assert_eq!(obj["metadata"]["labels"]["kubernetes.io/service-name"], "web", "the last state that matched");
    let joined = server.update_resource(Resource::EndpointSlices, "shop", "api-a", relabel("web")).unwrap();
    assert_eq!(next_key(&mut web).await, ("ADDED", "api-a".to_string(), joined));
    server.apply_resource(Resource::EndpointSlices, slice("other", "web-x", "web", &["10.2.0.1"])); // other namespace
    let last = server.apply_resource(Resource::EndpointSlices, slice("shop", "web-b", "web", &["10.1.0.2"]));
    assert_eq!(next_key(&mut web).await, ("ADDED", "web-b".to_string(), last));

    // Nodes leaving and re-entering a `!label` selector (the LB exclusion label).
    server.apply_resource(Resource::Nodes, node("w1", json!({})));
    let nodes: Api<Node> = Api::all(client(&server));
    let mut eligible = watch(&nodes, &WatchParams::default().labels(&format!("!{EXCLUDE}")), "0").await;
    assert_eq!(next_key(&mut eligible).await.0, "ADDED");
    let excluded =
        server.update_resource(Resource::Nodes, "", "w1", |o| o["metadata"]["labels"][EXCLUDE] = json!("true"));
    assert_eq!(next_key(&mut eligible).await, ("DELETED", "w1".to_string(), excluded.unwrap()));
    let back = server.update_resource(Resource::Nodes, "", "w1", |o| o["metadata"]["labels"] = json!({}));
    assert_eq!(next_key(&mut eligible).await, ("ADDED", "w1".to_string(), back.unwrap()));
}

#[tokio::test]
async fn http_writes_for_nodes_and_slices() {
    let server = FakeApiServer::start().await.unwrap();
    let nodes: Api<Node> = Api::all(client(&server));
    let mut node_events = watch(&nodes, &WatchParams::default(), &server.resource_version()).await;

    // Create keeps a Node's status (kubelet registers that way) and drops a namespace given in the body.
    let mut body = node("w1", json!({}));
    body["metadata"]["namespace"] = json!("ignored");
    body["metadata"]["finalizers"] = json!(["example.com/drain"]);
    let created = nodes.create(&PostParams::default(), &serde_json::from_value(body.clone()).unwrap()).await.unwrap();
    assert_eq!(created.metadata.resource_version, Some(server.resource_version()));
    assert!(created.metadata.uid.is_some() && created.metadata.namespace.is_none());
    let (ty, obj) = next(&mut node_events).await;
    assert_eq!((ty, &obj["status"]["conditions"]), ("ADDED", &json!([{"type": "Ready", "status": "True"}])));
    assert!(obj["metadata"].get("namespace").is_none());
    let dup = api_error(nodes.create(&PostParams::default(), &created).await.unwrap_err());
    assert_eq!(
        (dup.code, dup.reason.as_str(), dup.message.as_str()),
        (409, "AlreadyExists", "nodes \"w1\" already exists")
    );

    // Replace: stale resourceVersion → 409; current → stored, status kept.
    let mut stale = created.clone();
    stale.metadata.resource_version = Some("1".into());
    let err = api_error(nodes.replace("w1", &PostParams::default(), &stale).await.unwrap_err());
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
    let mut next_node = created.clone();
    next_node.spec.as_mut().unwrap().unschedulable = Some(true);
    next_node.status = None;
    nodes.replace("w1", &PostParams::default(), &next_node).await.unwrap();
    let (ty, obj) = next(&mut node_events).await;
    assert_eq!((ty, &obj["spec"]["unschedulable"]), ("MODIFIED", &json!(true)));
    assert_eq!(obj["status"]["conditions"], json!([{"type": "Ready", "status": "True"}]), "PUT keeps status");

    // Finalizers: DELETE only marks; removing the finalizer deletes.
    let marked = nodes.delete("w1", &DeleteParams::default()).await.unwrap().left().expect("object returned");
    assert!(marked.metadata.deletion_timestamp.is_some());
    let (ty, obj) = next(&mut node_events).await;
    assert!(ty == "MODIFIED" && obj["metadata"]["deletionTimestamp"].is_string(), "{ty} {obj}");
    let late = json!({"metadata": {"finalizers": ["example.com/drain", "example.com/late"]}});
    let err = api_error(nodes.patch("w1", &PatchParams::default(), &Patch::Merge(&late)).await.unwrap_err());
    assert_eq!((err.code, err.reason.as_str()), (422, "Invalid"));
    nodes
        .patch("w1", &PatchParams::default(), &Patch::Merge(&json!({"metadata": {"finalizers": null}})))
        .await
        .unwrap();
    let (ty, obj) = next(&mut node_events).await;
    assert_eq!((ty, &obj["metadata"]["name"]), ("DELETED", &json!("w1")));
    assert_eq!(server.get_resource(Resource::Nodes, "", "w1"), None);

    // EndpointSlices: generateName, validation, type checks, delete.
    let shop: Api<EndpointSlice> = Api::namespaced(client(&server), "shop");
    let mut slice_events = watch(&shop, &WatchParams::default(), &server.resource_version()).await;
    let mut generated = slice("shop", "", "web", &["10.1.0.1"]);
    generated["metadata"]["name"] = Value::Null;
    generated["metadata"]["generateName"] = json!("web-");
    let made = shop.create(&PostParams::default(), &serde_json::from_value(generated).unwrap()).await.unwrap();
    let name = made.metadata.name.clone().unwrap();
    assert!(name.starts_with("web-") && name.len() == 9, "{name}");
    assert_eq!(next_key(&mut slice_events).await, ("ADDED", name.clone(), server.resource_version()));

    let mut no_type = slice("shop", "bad", "web", &[]);
    no_type["addressType"] = Value::Null;
    let (code, status) =
        raw(&server, "POST", "/apis/discovery.k8s.io/v1/namespaces/shop/endpointslices", Some(&no_type)).await;
    assert_eq!((code, &status["reason"]), (422, &json!("Invalid")));
    assert_eq!(status["message"], "EndpointSlice.discovery.k8s.io \"bad\" is invalid: addressType: Required value");
    let v6 = json!({"addressType": "IPv6"});
    let err = api_error(shop.patch(&name, &PatchParams::default(), &Patch::Merge(&v6)).await.unwrap_err());
    let immutable = "addressType: Invalid value: \"IPv6\": field is immutable";
    let want = format!("EndpointSlice.discovery.k8s.io \"{name}\" is invalid: {immutable}");
    assert_eq!((err.code, err.message), (422, want));
    let (code, status) =
        raw(&server, "POST", "/apis/discovery.k8s.io/v1/namespaces/shop/endpointslices", Some(&svc("shop", "web")))
            .await;
    assert_eq!((code, &status["reason"]), (400, &json!("BadRequest")));
    assert_eq!(
        status["message"],
        "the API version in the data (v1) does not match the expected API version (discovery.k8s.io/v1), or the kind (Service) is not EndpointSlice"
    );
    let (code, _) = raw(&server, "POST", "/api/v1/nodes", Some(&slice("", "x", "web", &[]))).await;
    assert_eq!(code, 400);
    let mut as_svc = serde_json::to_value(&made).unwrap();
    as_svc["kind"] = json!("Service");
    let target = format!("/apis/discovery.k8s.io/v1/namespaces/shop/endpointslices/{name}");
    assert_eq!(raw(&server, "PUT", &target, Some(&as_svc)).await.0, 400);
    let (code, _) =
        raw(&server, "POST", "/apis/discovery.k8s.io/v1/endpointslices", Some(&slice("shop", "y", "web", &[]))).await;
    assert_eq!(code, 405, "namespaced resources are created in a namespace");
    let other_ns = slice("other", "z", "web", &[]);
    let (code, _) =
        raw(&server, "POST", "/apis/discovery.k8s.io/v1/namespaces/shop/endpointslices", Some(&other_ns)).await;
    assert_eq!(code, 400);

    // A PUT of the endpoints (no status subresource: everything is written).
    let mut moved = shop.get(&name).await.unwrap();
    moved.endpoints.as_mut().unwrap()[0].addresses = vec!["10.1.0.7".into()];
    shop.replace(&name, &PostParams::default(), &moved).await.unwrap();
    let (ty, obj) = next(&mut slice_events).await;
    assert_eq!((ty, &obj["endpoints"][0]["addresses"]), ("MODIFIED", &json!(["10.1.0.7"])));

    let gone = shop.delete(&name, &DeleteParams::default()).await.unwrap().left().expect("object returned");
    assert_eq!(gone.metadata.name.as_deref(), Some(name.as_str()));
    assert_eq!(next_key(&mut slice_events).await, ("DELETED", name.clone(), server.resource_version()));
    let err = api_error(shop.delete(&name, &DeleteParams::default()).await.unwrap_err());
    assert_eq!((err.code, err.message), (404, format!("endpointslices.discovery.k8s.io \"{name}\" not found")));
}

#[tokio::test]
async fn rust_api_resource_methods_and_mixed_seed() {
    let server = FakeApiServer::start().await.unwrap();
    let mut w2 = node("w2", json!({}));
    w2["metadata"]["namespace"] = json!("ignored");
    let mut bare = svc("shop", "bare");
    bare.as_object_mut().unwrap().remove("kind");
    server.seed([
        node("w1", json!({})),
        slice("shop", "web-a", "web", &["10.1.0.1"]),
        svc("shop", "web"),
        w2,
        bare,
        slice("default", "api-a", "api", &["10.1.0.2"]),
    ]);
    let keys = |r: Resource| -> Vec<String> {
        server
            .list_resource(r)
            .iter()
            .map(|o| {
                assert_eq!((o["kind"].as_str(), o["apiVersion"].as_str()), (Some(r.kind()), Some(r.api_version())));
                format!(
                    "{}/{}",
                    o["metadata"]["namespace"].as_str().unwrap_or("-"),
                    o["metadata"]["name"].as_str().unwrap()
                )
            })
            .collect()
    };
    assert_eq!(keys(Resource::Nodes), ["-/w1", "-/w2"]);
    assert_eq!(keys(Resource::EndpointSlices), ["default/api-a", "shop/web-a"]);
    assert_eq!(keys(Resource::Services), ["shop/bare", "shop/web"]);
    assert_eq!(server.list(), server.list_resource(Resource::Services));
    let w1 = server.get_resource(Resource::Nodes, "", "w1").unwrap();
    assert_eq!(server.get_resource(Resource::Nodes, "anything", "w1"), Some(w1.clone()), "namespace ignored");
    assert!(w1["metadata"]["uid"].is_string() && w1["metadata"]["creationTimestamp"].is_string());
    assert_eq!(w1["metadata"]["resourceVersion"], "2");
    assert_eq!(server.get_resource(Resource::Services, "", "w1"), None);
    assert_eq!(server.get("shop", "web"), server.get_resource(Resource::Services, "shop", "web"));

    let rv = server.update_resource(Resource::EndpointSlices, "shop", "web-a", |o| o["endpoints"] = json!([]));
    assert_eq!(rv, Some(server.resource_version()));
    assert_eq!(server.get_resource(Resource::EndpointSlices, "shop", "web-a").unwrap()["endpoints"], json!([]));
    assert_eq!(server.update_resource(Resource::Nodes, "", "nope", |_| {}), None);

    // Finalizer rules as for Services.
    server.update_resource(Resource::Nodes, "", "w2", |o| o["metadata"]["finalizers"] = json!(["f"]));
    assert!(server.delete_resource(Resource::Nodes, "", "w2"));
    let w2 = server.get_resource(Resource::Nodes, "", "w2").unwrap();
    assert!(w2["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(w2["metadata"]["deletionGracePeriodSeconds"], 0);
    server.update_resource(Resource::Nodes, "", "w2", |o| o["metadata"]["finalizers"] = json!([]));
    assert_eq!(server.get_resource(Resource::Nodes, "", "w2"), None);
    assert!(server.delete_resource(Resource::EndpointSlices, "default", "api-a"));
    assert!(!server.delete_resource(Resource::EndpointSlices, "default", "api-a"));
    assert_eq!(keys(Resource::EndpointSlices), ["shop/web-a"]);

    // read_seed_dir: any of the three kinds; anything else is InvalidData naming the file.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a-node.json"), node("w9", json!({})).to_string()).unwrap();
    std::fs::write(dir.path().join("b-slice.json"), slice("shop", "s9", "web", &[]).to_string()).unwrap();
    std::fs::write(dir.path().join("c-svc.json"), svc("shop", "s9").to_string()).unwrap();
    let objects = read_seed_dir(dir.path()).unwrap();
    let kinds: Vec<&str> = objects.iter().map(|o| o["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["Node", "EndpointSlice", "Service"]);
    server.seed(objects);
    assert_eq!(keys(Resource::Nodes), ["-/w1", "-/w9"]);
    std::fs::write(dir.path().join("d-pod.json"), r#"{"kind": "Pod", "metadata": {"name": "p"}}"#).unwrap();
    let err = read_seed_dir(dir.path()).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
    let message = err.to_string();
    assert!(message.contains("d-pod.json") && message.contains("unsupported kind \"Pod\""), "{message}");
}

#[tokio::test]
#[should_panic(expected = "unsupported kind \"Pod\"")]
async fn seed_panics_on_an_unknown_kind() {
    let server = FakeApiServer::start().await.unwrap();
    server.seed([json!({"kind": "Pod", "metadata": {"name": "p"}})]);
}

#[tokio::test]
#[should_panic(expected = "an object of kind \"Service\" cannot be stored as nodes")]
async fn apply_resource_panics_on_a_kind_mismatch() {
    let server = FakeApiServer::start().await.unwrap();
    server.apply_resource(Resource::Nodes, svc("shop", "web"));
}

#[tokio::test]
async fn kube_runtime_watcher_on_nodes_survives_faults() {
    use kube::runtime::{WatchStreamExt, watcher};
    let server = FakeApiServer::start().await.unwrap();
    server.seed([node("w1", json!({})), node("w2", json!({})), svc("shop", "web")]);
    let mut stream = watcher(Api::<Node>::all(client(&server)), watcher::Config::default()).default_backoff().boxed();
    let mut next = async || loop {
        match within("watcher event", stream.next()).await.expect("watcher stream ended") {
            Ok(watcher::Event::Init) => return "init".to_string(),
            Ok(watcher::Event::InitApply(n)) => return format!("init-apply {}", n.metadata.name.unwrap()),
            Ok(watcher::Event::InitDone) => return "init-done".to_string(),
            Ok(watcher::Event::Apply(n)) => return format!("apply {}", n.metadata.name.unwrap()),
            Ok(watcher::Event::Delete(n)) => return format!("delete {}", n.metadata.name.unwrap()),
            Err(_) => continue,
        }
    };
    for want in ["init", "init-apply w1", "init-apply w2", "init-done"] {
        assert_eq!(next().await, want);
    }
    server.apply_resource(Resource::Nodes, node("w3", json!({})));
    assert_eq!(next().await, "apply w3");
    // A cut mid-line on the Node watch: the watcher re-watches and gets the change from the history.
    server.faults().cut_next_event_mid_line();
    server.apply(svc("shop", "noise")); // not this watch's: the cut waits for the next Node event
    server.update_resource(Resource::Nodes, "", "w1", |o| o["spec"]["unschedulable"] = json!(true));
    assert_eq!(next().await, "apply w1");
    assert!(server.delete_resource(Resource::Nodes, "", "w2"));
    assert_eq!(next().await, "delete w2");
    server.faults().force_gone();
    for want in ["init", "init-apply w1", "init-apply w3", "init-done"] {
        assert_eq!(next().await, want);
    }
}

// ---- kubectl --------------------------------------------------------------------------------------------

/// Run `kubectl --server URL ARGS…` with a fresh `HOME`, feeding `stdin` if given; must succeed.
async fn kubectl(server: &FakeApiServer, args: &[&str], stdin: Option<&str>) -> String {
    let home = tempfile::tempdir().unwrap();
    let mut cmd = tokio::process::Command::new("kubectl");
    cmd.env("HOME", home.path())
        .env_remove("KUBECONFIG")
        .arg("--server")
        .arg(server.url())
        .args(args)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().expect("kubectl must be installed (the README's test prerequisites)");
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().unwrap();
        pipe.write_all(input.as_bytes()).await.unwrap();
        drop(pipe);
    }
    let out = within(&format!("kubectl {args:?}"), child.wait_with_output()).await.unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "kubectl {args:?} failed:\n{stdout}\n{stderr}");
    stdout.into_owned()
}

/// Whitespace-split lines of a `kubectl get` table.
fn table(text: &str) -> Vec<Vec<String>> {
    text.lines().map(|l| l.split_whitespace().map(str::to_string).collect()).collect()
}

/// When the objects shown by `kubectl get` were created: long enough ago for an age in days.
const CREATED: &str = "2020-01-01T00:00:00Z";

/// kubectl's age of an object created at [`CREATED`] (Unix time 1 577 836 800), in days, now.
fn age_days() -> String {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
    format!("{}d", (now - 1_577_836_800) / 86_400)
}

#[tokio::test]
async fn kubectl_discovers_nodes_and_endpointslices() {
    let Some(_kubectl) = require::require_tool("kubectl") else { return };
    let server = FakeApiServer::start().await.unwrap();
    let rows: BTreeSet<Vec<String>> = table(&kubectl(&server, &["api-resources"], None).await).into_iter().collect();
    let row = |cells: &[&str]| cells.iter().map(|c| c.to_string()).collect::<Vec<_>>();
    let want: BTreeSet<Vec<String>> = [
        row(&["NAME", "SHORTNAMES", "APIVERSION", "NAMESPACED", "KIND"]),
        row(&["events", "ev", "v1", "true", "Event"]),
        row(&["nodes", "no", "v1", "false", "Node"]),
        row(&["services", "svc", "v1", "true", "Service"]),
        row(&["endpointslices", "discovery.k8s.io/v1", "true", "EndpointSlice"]),
        row(&["events", "events.k8s.io/v1", "true", "Event"]),
    ]
    .into_iter()
    .collect();
    assert_eq!(rows, want);

    // The same documents through kube-rs.
    let c = client(&server);
    let core = c.list_core_api_resources("v1").await.unwrap();
    let nodes = core.resources.iter().find(|r| r.name == "nodes").expect("nodes listed");
    assert_eq!((nodes.namespaced, nodes.short_names.clone()), (false, Some(vec!["no".to_string()])));
    assert!(core.resources.iter().any(|r| r.name == "nodes/status" && !r.namespaced));
    let groups = c.list_api_groups().await.unwrap();
    let discovery = groups.groups.iter().find(|g| g.name == "discovery.k8s.io").expect("group listed");
    assert_eq!(discovery.preferred_version.as_ref().unwrap().group_version, "discovery.k8s.io/v1");
    let list = c.list_api_group_resources("discovery.k8s.io/v1").await.unwrap();
    let slices = &list.resources[0];
    assert_eq!((list.resources.len(), slices.name.as_str(), slices.namespaced), (1, "endpointslices", true));
    assert_eq!(slices.verbs, ["create", "delete", "get", "list", "patch", "update", "watch"]);
}

#[tokio::test]
async fn kubectl_label_cordon_taint_apply_get_delete_nodes() {
    let Some(_kubectl) = require::require_tool("kubectl") else { return };
    let server = FakeApiServer::start().await.unwrap();
    let mut w1 = node("w1", json!({"kubernetes.io/hostname": "w1", "node-role.kubernetes.io/worker": ""}));
    w1["metadata"]["creationTimestamp"] = json!(CREATED);
    server.apply_resource(Resource::Nodes, w1);
    let api: Api<Node> = Api::all(client(&server));
    let mut events = watch(&api, &WatchParams::default(), &server.resource_version()).await;

    // label: a merge patch of metadata.labels.
    let out = kubectl(&server, &["label", "node", "w1", &format!("{EXCLUDE}=true")], None).await;
    assert_eq!(out.trim(), "node/w1 labeled");
    let (ty, obj) = next(&mut events).await;
    let labels = json!({"kubernetes.io/hostname": "w1", "node-role.kubernetes.io/worker": "", EXCLUDE: "true"});
    assert_eq!((ty, &obj["metadata"]["labels"]), ("MODIFIED", &labels));

    // cordon: a strategic merge patch {"spec":{"unschedulable":true}}.
    assert_eq!(kubectl(&server, &["cordon", "w1"], None).await.trim(), "node/w1 cordoned");
    let (ty, obj) = next(&mut events).await;
    assert_eq!((ty, &obj["spec"]["unschedulable"]), ("MODIFIED", &json!(true)));

    // taint: a strategic merge patch carrying the whole (atomic) spec.taints list.
    let out = kubectl(&server, &["taint", "nodes", "w1", "ToBeDeletedByClusterAutoscaler=1:NoSchedule"], None).await;
    assert_eq!(out.trim(), "node/w1 tainted");
    let (ty, obj) = next(&mut events).await;
    let taints = json!([{"effect": "NoSchedule", "key": "ToBeDeletedByClusterAutoscaler", "value": "1"}]);
    assert_eq!((ty, &obj["spec"]["taints"]), ("MODIFIED", &taints));
    assert_eq!(obj["status"]["conditions"], json!([{"type": "Ready", "status": "True"}]), "status untouched");

    let patches: Vec<String> = server
        .requests()
        .into_iter()
        .filter(|r| r.method == "PATCH")
        .map(|r| format!("{}?{}", r.path, r.query))
        .collect();
    assert_eq!(
        patches,
        [
            "/api/v1/nodes/w1?fieldManager=kubectl-label",
            "/api/v1/nodes/w1?",
            "/api/v1/nodes/w1?fieldManager=kubectl-taint&fieldValidation=Strict",
        ]
    );

    // get: the server-side Table.
    let (before, text, after) = (age_days(), kubectl(&server, &["get", "nodes"], None).await, age_days());
    let rows = table(&text);
    assert_eq!(rows[0], ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]);
    assert_eq!(rows[1][..3], ["w1", "Ready,SchedulingDisabled", "worker"]);
    assert!(rows[1][3] == before || rows[1][3] == after, "{text}");
    assert_eq!((rows[1][4].as_str(), rows.len()), ("v1.32.0", 2));

    // apply: create, then a strategic merge patch computed by kubectl.
    let mut w2 = node("w2", json!({"kubernetes.io/hostname": "w2"}));
    w2.as_object_mut().unwrap().remove("status");
    let out = kubectl(&server, &["apply", "-f", "-"], Some(&w2.to_string())).await;
    assert_eq!(out.trim(), "node/w2 created");
    let (ty, obj) = next(&mut events).await;
    assert_eq!(
        (ty, &obj["metadata"]["name"], &obj["spec"]["providerID"]),
        ("ADDED", &json!("w2"), &json!("fake://w2"))
    );
    assert!(obj["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"].is_string());
    assert!(obj["metadata"].get("namespace").is_none());
    w2["metadata"]["labels"] = json!({"kubernetes.io/hostname": "w2", "role": "edge"});
    let out = kubectl(&server, &["apply", "-f", "-"], Some(&w2.to_string())).await;
    assert_eq!(out.trim(), "node/w2 configured");
    let (ty, obj) = next(&mut events).await;
    assert_eq!(
        (ty, &obj["metadata"]["labels"]),
        ("MODIFIED", &json!({"kubernetes.io/hostname": "w2", "role": "edge"}))
    );

    // delete (kubectl waits for the object to go, through a watch with a name field selector).
    assert_eq!(kubectl(&server, &["delete", "node", "w1"], None).await.trim(), "node \"w1\" deleted");
    let (ty, obj) = next(&mut events).await;
    assert_eq!((ty, &obj["metadata"]["name"]), ("DELETED", &json!("w1")));
    let left: Vec<Value> =
        server.list_resource(Resource::Nodes).iter().map(|n| n["metadata"]["name"].clone()).collect();
    assert_eq!(left, [json!("w2")]);
}

#[tokio::test]
async fn kubectl_apply_get_delete_endpointslices() {
    let Some(_kubectl) = require::require_tool("kubectl") else { return };
    let server = FakeApiServer::start().await.unwrap();
    let api: Api<EndpointSlice> = Api::all(client(&server));
    let mut events = watch(&api, &WatchParams::default(), &server.resource_version()).await;

    let mut web = slice("shop", "web-abc", "web", &["10.1.0.1", "10.1.0.2", "10.1.0.3"]);
    let out = kubectl(&server, &["apply", "-f", "-"], Some(&web.to_string())).await;
    assert_eq!(out.trim(), "endpointslice.discovery.k8s.io/web-abc created");
    let (ty, obj) = next(&mut events).await;
    assert_eq!((ty, &obj["metadata"]["namespace"], &obj["addressType"]), ("ADDED", &json!("shop"), &json!("IPv4")));

    web["endpoints"].as_array_mut().unwrap().push(json!({"addresses": ["10.1.0.4"], "conditions": {"ready": false}}));
    let out = kubectl(&server, &["apply", "-f", "-"], Some(&web.to_string())).await;
    assert_eq!(out.trim(), "endpointslice.discovery.k8s.io/web-abc configured");
    let (ty, obj) = next(&mut events).await;
    let addresses: Vec<&str> =
        obj["endpoints"].as_array().unwrap().iter().map(|e| e["addresses"][0].as_str().unwrap()).collect();
    assert_eq!((ty, addresses), ("MODIFIED", vec!["10.1.0.1", "10.1.0.2", "10.1.0.3", "10.1.0.4"]));
    assert_eq!(obj["endpoints"][3]["conditions"], json!({"ready": false}));

    let api_slice = slice("shop", "api-1", "api", &["10.1.0.9"]);
    let out = kubectl(&server, &["create", "-f", "-"], Some(&api_slice.to_string())).await;
    assert_eq!(out.trim(), "endpointslice.discovery.k8s.io/api-1 created");
    assert_eq!(next_key(&mut events).await, ("ADDED", "api-1".to_string(), server.resource_version()));
    // The server stamps creationTimestamp on create; backdate both for an age in whole days.
    for name in ["api-1", "web-abc"] {
        let backdate = |o: &mut Value| o["metadata"]["creationTimestamp"] = json!(CREATED);
        server.update_resource(Resource::EndpointSlices, "shop", name, backdate).unwrap();
        assert_eq!(next_key(&mut events).await.0, "MODIFIED");
    }

    let (before, text, after) =
        (age_days(), kubectl(&server, &["get", "endpointslices", "-A"], None).await, age_days());
    let rows = table(&text);
    assert_eq!(rows[0], ["NAMESPACE", "NAME", "ADDRESSTYPE", "PORTS", "ENDPOINTS", "AGE"]);
    assert_eq!(rows[1][..5], ["shop", "api-1", "IPv4", "8080", "10.1.0.9"]);
    assert_eq!(rows[2][..8], ["shop", "web-abc", "IPv4", "8080", "10.1.0.1,10.1.0.2,10.1.0.3", "+", "1", "more..."]);
    assert!([&rows[1][5], &rows[2][8]].iter().all(|a| **a == before || **a == after), "{text}");
    assert_eq!((rows[1].len(), rows[2].len(), rows.len()), (6, 9, 3));

    let out = kubectl(&server, &["delete", "endpointslice", "-n", "shop", "web-abc"], None).await;
    assert_eq!(out.trim(), "endpointslice.discovery.k8s.io \"web-abc\" deleted");
    let (ty, obj) = next(&mut events).await;
    assert_eq!((ty, &obj["metadata"]["name"]), ("DELETED", &json!("web-abc")));
    assert_eq!(server.list_resource(Resource::EndpointSlices).len(), 1);
    assert!(
        server.requests().iter().any(|r| r.path == "/openapi/v3/apis/discovery.k8s.io/v1"),
        "server-side validation"
    );
}
