//! Tests of the fake Kubernetes apiserver over real sockets: kube-rs as the client, raw HTTP/1.1 for the
//! wire-level faults, and the installed `kubectl` (get and proxy).

use crate::require;

use std::collections::BTreeSet;
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, ListParams, Patch, PatchParams, WatchEvent, WatchParams};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout};
use vipwatch_fake_apiserver::{FakeApiServer, FakeApiServerOptions};

const WAIT: Duration = Duration::from_secs(10);

fn svc(ns: &str, name: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP"}], "x-unknown": {"kept": true}},
    })
}

fn client(server: &FakeApiServer) -> kube::Client {
    let config = kube::Config::new(server.url().parse().expect("url"));
    kube::Client::try_from(config).expect("kube client")
}

fn all(server: &FakeApiServer) -> Api<Service> {
    Api::all(client(server))
}

/// Poll `cond` until it holds, failing after [`WAIT`].
async fn eventually(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await; // ok: poll interval of a deadline-bounded wait
    }
}

async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    timeout(WAIT, fut).await.unwrap_or_else(|_| panic!("timed out waiting for: {what}"))
}

type Events = std::pin::Pin<Box<dyn Stream<Item = kube::Result<WatchEvent<Service>>> + Send>>;

async fn watch(api: &Api<Service>, wp: &WatchParams, rv: &str) -> Events {
    api.watch(wp, rv).await.expect("watch request").boxed()
}

/// Next event that is not a bookmark.
async fn next_event(s: &mut Events) -> WatchEvent<Service> {
    loop {
        match within("watch event", s.next()).await.expect("stream ended").expect("event") {
            WatchEvent::Bookmark(_) => continue,
            e => return e,
        }
    }
}

fn name_rv(s: &Service) -> (String, String) {
    (s.metadata.name.clone().unwrap_or_default(), s.metadata.resource_version.clone().unwrap_or_default())
}

#[tokio::test]
async fn list_pages_with_limit_carry_snapshot_rv() {
    let server = FakeApiServer::start().await.unwrap();
    server.seed((0..25).map(|i| svc(if i % 2 == 0 { "a" } else { "b" }, &format!("svc-{i:02}"), json!({}))));
    let snapshot_rv = server.resource_version();
    let api = all(&server);
    let (mut names, mut sizes, mut token) = (Vec::new(), Vec::new(), None::<String>);
    loop {
        let mut lp = ListParams::default().limit(10);
        if let Some(t) = &token {
            lp = lp.continue_token(t);
        }
        let page = api.list(&lp).await.expect("list page");
        assert_eq!(page.metadata.resource_version.as_deref(), Some(snapshot_rv.as_str()));
        sizes.push(page.items.len());
        names.extend(page.items.iter().map(|s| {
            assert!(s.metadata.resource_version.is_some() && s.metadata.uid.is_some());
            format!("{}/{}", s.metadata.namespace.clone().unwrap(), s.metadata.name.clone().unwrap())
        }));
        // A write between pages must not change the pages' resourceVersion.
        server.update("a", "svc-00", |o| o["metadata"]["labels"]["touched"] = json!("yes"));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => token = Some(c),
            None => break,
        }
    }
    assert_eq!(sizes, vec![10, 10, 5]);
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted, "stable (namespace, name) order");
    assert_eq!(names.iter().collect::<BTreeSet<_>>().len(), 25);
    let reqs = server.requests();
    assert!(reqs.iter().any(|r| r.path == "/api/v1/services" && r.query.contains("continue=")));

    // Namespaced list and a field selector.
    let ns_a: Api<Service> = Api::namespaced(client(&server), "a");
    assert_eq!(ns_a.list(&ListParams::default()).await.unwrap().items.len(), 13);
    let one = api.list(&ListParams::default().fields("metadata.name=svc-03")).await.unwrap();
    assert_eq!(one.items.len(), 1);
    server.shutdown().await;
}

#[tokio::test]
async fn watch_from_rv_sees_added_modified_deleted() {
    let server = FakeApiServer::start().await.unwrap();
    server.apply(svc("default", "old", json!({})));
    let rv = server.resource_version();
    let api = all(&server);
    let mut events = watch(&api, &WatchParams::default(), &rv).await;
    let added_rv = server.apply(svc("default", "web", json!({"app": "web"})));
    let modified_rv = server.update("default", "web", |o| o["spec"]["type"] = json!("ClusterIP")).unwrap();
    assert!(server.delete("default", "web"));
    let deleted_rv = server.resource_version();
    assert!(!server.delete("default", "web"));
    match next_event(&mut events).await {
        WatchEvent::Added(s) => assert_eq!(name_rv(&s), ("web".into(), added_rv)),
        e => panic!("expected ADDED, got {e:?}"),
    }
    match next_event(&mut events).await {
        WatchEvent::Modified(s) => {
            assert_eq!(name_rv(&s), ("web".into(), modified_rv));
            assert_eq!(s.spec.unwrap().type_.as_deref(), Some("ClusterIP"));
        }
        e => panic!("expected MODIFIED, got {e:?}"),
    }
    match next_event(&mut events).await {
        WatchEvent::Deleted(s) => assert_eq!(name_rv(&s), ("web".into(), deleted_rv)),
        e => panic!("expected DELETED, got {e:?}"),
    }
    // Without a resourceVersion: synthetic ADDED for current objects first, then live.
    let mut fresh = watch(&api, &WatchParams::default(), "0").await;
    match next_event(&mut fresh).await {
        WatchEvent::Added(s) => assert_eq!(s.metadata.name.as_deref(), Some("old")),
        e => panic!("expected synthetic ADDED, got {e:?}"),
    }
    server.apply(svc("default", "new", json!({})));
    assert!(matches!(next_event(&mut fresh).await, WatchEvent::Added(s) if s.metadata.name.as_deref() == Some("new")));
    // Stored object keeps unknown fields.
    assert_eq!(server.get("default", "new").unwrap()["spec"]["x-unknown"]["kept"], json!(true));
}

#[tokio::test]
async fn too_old_rv_gets_in_band_410() {
    let server = FakeApiServer::start().await.unwrap();
    let api = all(&server);
    let old_rv = server.apply(svc("default", "a", json!({})));
    server.apply(svc("default", "b", json!({})));
    server.faults().compact_history();
    let mut events = watch(&api, &WatchParams::default(), &old_rv).await;
    match next_event(&mut events).await {
        WatchEvent::Error(status) => {
            assert_eq!(status.code, 410);
            assert_eq!(status.reason, "Expired");
        }
        e => panic!("expected ERROR 410, got {e:?}"),
    }
    assert!(within("end of stream", events.next()).await.is_none());

    // force_gone on an open watch: in-band 410 then the stream ends.
    let mut open = watch(&api, &WatchParams::default(), &server.resource_version()).await;
    eventually("watch open", || server.open_watches() == 1).await;
    server.faults().force_gone();
    assert!(matches!(next_event(&mut open).await, WatchEvent::Error(s) if s.code == 410));
    assert!(within("end of stream", open.next()).await.is_none());

    // The bounded history also expires old resourceVersions.
    let small =
        FakeApiServer::start_with(FakeApiServerOptions { history_limit: 3, ..Default::default() }).await.unwrap();
    let first = small.apply(svc("default", "x", json!({})));
    for i in 0..5 {
        small.update("default", "x", |o| o["metadata"]["labels"] = json!({"i": i.to_string()}));
    }
    let mut events = watch(&all(&small), &WatchParams::default(), &first).await;
    assert!(matches!(next_event(&mut events).await, WatchEvent::Error(s) if s.code == 410));
}

#[tokio::test]
async fn label_selector_filters_watch_transitions() {
    let server = FakeApiServer::start().await.unwrap();
    let api = all(&server);
    let wp = WatchParams::default().labels("app=web");
    let mut events = watch(&api, &wp, &server.resource_version()).await;
    server.apply(svc("default", "db", json!({"app": "db"})));
    server.apply(svc("default", "web", json!({"app": "web"})));
    assert!(matches!(next_event(&mut events).await, WatchEvent::Added(s) if s.metadata.name.as_deref() == Some("web")));
    let stop_rv = server.update("default", "web", |o| o["metadata"]["labels"]["app"] = json!("other")).unwrap();
    match next_event(&mut events).await {
        WatchEvent::Deleted(s) => assert_eq!(name_rv(&s), ("web".into(), stop_rv)),
        e => panic!("expected DELETED on leaving the selector, got {e:?}"),
    }
    server.update("default", "db", |o| o["metadata"]["labels"]["app"] = json!("web"));
    assert!(matches!(next_event(&mut events).await, WatchEvent::Added(s) if s.metadata.name.as_deref() == Some("db")));
    let listed = api.list(&ListParams::default().labels("app in (web,x),!missing")).await.unwrap();
    assert_eq!(listed.items.len(), 1);
}

#[tokio::test]
async fn timeout_seconds_ends_the_stream_cleanly() {
    let server = FakeApiServer::start().await.unwrap();
    let api = all(&server);
    let mut events = watch(&api, &WatchParams::default().timeout(1), &server.resource_version()).await;
    loop {
        match within("stream end after timeoutSeconds", events.next()).await {
            None => break,
            Some(Ok(WatchEvent::Bookmark(_))) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    eventually("watch closed", || server.open_watches() == 0).await;
}

#[tokio::test]
async fn bookmarks_periodic_and_on_demand_and_silence() {
    let options = FakeApiServerOptions { bookmark_interval: Duration::from_secs(3600), ..Default::default() };
    let server = FakeApiServer::start_with(options).await.unwrap();
    let api = all(&server);
    server.apply(svc("default", "a", json!({})));
    let mut events = watch(&api, &WatchParams::default(), &server.resource_version()).await;
    eventually("watch open", || server.open_watches() == 1).await;
    server.faults().bookmark_now();
    match within("bookmark", events.next()).await.unwrap().unwrap() {
        WatchEvent::Bookmark(b) => assert_eq!(b.metadata.resource_version, server.resource_version()),
        e => panic!("expected BOOKMARK, got {e:?}"),
    }
    // Silence: nothing arrives while on, the queued event arrives after.
    server.faults().go_silent(true);
    server.apply(svc("default", "quiet", json!({})));
    server.faults().bookmark_now();
    assert!(timeout(Duration::from_millis(300), events.next()).await.is_err(), "silent stream sent something");
    server.faults().go_silent(false);
    assert!(
        matches!(next_event(&mut events).await, WatchEvent::Added(s) if s.metadata.name.as_deref() == Some("quiet"))
    );

    let fast = FakeApiServerOptions { bookmark_interval: Duration::from_millis(50), ..Default::default() };
    let server = FakeApiServer::start_with(fast).await.unwrap();
    let mut events = watch(&all(&server), &WatchParams::default(), "0").await;
    assert!(matches!(within("periodic bookmark", events.next()).await, Some(Ok(WatchEvent::Bookmark(_)))));
}

fn fixture_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/kubernetes/real-world")
}

fn fixtures() -> Vec<Value> {
    let mut files: Vec<_> = std::fs::read_dir(fixture_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    files.iter().map(|p| serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()).collect()
}

fn key_of(v: &Value) -> String {
    let ns = v["metadata"]["namespace"].as_str().unwrap_or("default");
    format!("{ns}/{}", v["metadata"]["name"].as_str().unwrap())
}

#[tokio::test]
async fn real_world_fixtures_seed_and_list_back() {
    let objects = fixtures();
    assert!(objects.len() >= 30, "fixtures found: {}", objects.len());
    let expected: BTreeSet<String> = objects.iter().map(key_of).collect();
    let server = FakeApiServer::start().await.unwrap();
    server.seed(objects.clone());
    let listed = all(&server).list(&ListParams::default()).await.expect("kube list of fixtures");
    let got: BTreeSet<String> = listed
        .items
        .iter()
        .map(|s| format!("{}/{}", s.metadata.namespace.clone().unwrap(), s.metadata.name.clone().unwrap()))
        .collect();
    assert_eq!(got, expected);
    assert_eq!(server.list().iter().map(key_of).collect::<BTreeSet<_>>(), expected);
    // Objects the fixtures gave a uid keep it; the rest get one.
    let kube_dns = server.get("kube-system", "kube-dns").unwrap();
    assert_eq!(kube_dns["metadata"]["uid"], json!("9b455b45-ae9f-43d1-98ca-f275b805ab95"));
    assert!(server.list().iter().all(|o| o["metadata"]["uid"].is_string()));
}

/// What the kube-rs runtime watcher sees, reduced to comparable strings.
fn describe(e: &kube::runtime::watcher::Event<Service>) -> String {
    use kube::runtime::watcher::Event;
    let name = |s: &Service| s.metadata.name.clone().unwrap_or_default();
    match e {
        Event::Init => "init".into(),
        Event::InitApply(s) => format!("init-apply {}", name(s)),
        Event::InitDone => "init-done".into(),
        Event::Apply(s) => format!("apply {}", name(s)),
        Event::Delete(s) => format!("delete {}", name(s)),
    }
}

#[tokio::test]
async fn kube_runtime_watcher_recovers_from_faults() {
    use kube::runtime::{WatchStreamExt, watcher};
    let server = FakeApiServer::start().await.unwrap();
    server.seed([svc("default", "a", json!({})), svc("default", "b", json!({}))]);
    let mut stream = watcher(all(&server), watcher::Config::default()).default_backoff().boxed();
    // Errors are stream items, not the end: skip them, as a consumer must.
    let mut next = async || loop {
        match within("watcher event", stream.next()).await.expect("watcher stream ended") {
            Ok(e) => return describe(&e),
            Err(_) => continue,
        }
    };
    let init = ["init", "init-apply a", "init-apply b", "init-done"];
    for want in init {
        assert_eq!(next().await, want);
    }
    // The watcher is a pull stream: its watch request goes out when it is polled again; "c" is then
    // replayed from the history if it was written before.
    server.apply(svc("default", "c", json!({})));
    assert_eq!(next().await, "apply c");

    // A cut mid-line: the watcher re-watches from its last rv and gets the event from the history.
    let watches = |s: &FakeApiServer| s.requests().iter().filter(|r| r.query.contains("watch=true")).count();
    let before = watches(&server);
    server.faults().cut_next_event_mid_line();
    server.apply(svc("default", "d", json!({})));
    assert_eq!(next().await, "apply d");
    assert!(watches(&server) > before, "the cut watch was re-issued");

    // An in-band 410: the watcher re-lists.
    assert!(server.delete("default", "a"));
    assert_eq!(next().await, "delete a");
    server.faults().force_gone();
    for want in ["init", "init-apply b", "init-apply c", "init-apply d", "init-done"] {
        assert_eq!(next().await, want);
    }
    let reqs = server.requests();
    assert!(reqs.iter().any(|r| r.query.starts_with("&limit=500")), "{reqs:?}");
    assert!(reqs.iter().any(|r| r.query.contains("watch=true") && r.query.contains("allowWatchBookmarks=true")));
}

// ---- raw HTTP -------------------------------------------------------------------------------------------

/// Undo chunked transfer encoding as far as the bytes go: (body so far, saw the terminating chunk).
fn dechunk(mut b: &[u8]) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    loop {
        let Some(eol) = b.windows(2).position(|w| w == b"\r\n") else { return (out, false) };
        let size_text = String::from_utf8_lossy(&b[..eol]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap().trim(), 16).expect("chunk size");
        if size == 0 {
            return (out, true);
        }
        let data = &b[eol + 2..];
        if data.len() < size + 2 {
            out.extend_from_slice(&data[..size.min(data.len())]);
            return (out, false);
        }
        out.extend_from_slice(&data[..size]);
        b = &data[size + 2..];
    }
}

/// A raw HTTP/1.1 exchange: headers (lower-cased) and the body decoded so far.
struct Raw {
    stream: TcpStream,
    buf: Vec<u8>,
    eof: bool,
}

impl Raw {
    async fn get(addr: SocketAddr, target: &str) -> Raw {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        let req = format!(
            "GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: application/json\r\nConnection: close\r\n\r\n"
        );
        // A refused connection may already be closed: then the read side reports it.
        let _ = stream.write_all(req.as_bytes()).await;
        Raw { stream, buf: Vec::new(), eof: false }
    }

    fn split(&self) -> Option<(String, &[u8])> {
        let end = self.buf.windows(4).position(|w| w == b"\r\n\r\n")?;
        Some((String::from_utf8_lossy(&self.buf[..end]).to_lowercase(), &self.buf[end + 4..]))
    }

    fn status(&self) -> u16 {
        let (head, _) = self.split().expect("headers");
        head.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    /// Body decoded so far and whether it is complete.
    fn body(&self) -> (Vec<u8>, bool) {
        let Some((head, rest)) = self.split() else { return (Vec::new(), false) };
        if head.contains("transfer-encoding: chunked") { dechunk(rest) } else { (rest.to_vec(), self.eof) }
    }

    /// Read until `done(body)` holds or the peer closes; fails after [`WAIT`].
    async fn read_until(&mut self, done: impl Fn(&[u8]) -> bool) {
        let deadline = Instant::now() + WAIT;
        while !self.eof && !done(&self.body().0) {
            let mut chunk = [0u8; 8192];
            let n = tokio::time::timeout_at(deadline, self.stream.read(&mut chunk))
                .await
                .expect("timed out reading raw response")
                .unwrap_or(0);
            if n == 0 {
                self.eof = true;
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    async fn read_to_end(&mut self) -> Vec<u8> {
        self.read_until(|_| false).await;
        self.body().0
    }
}

fn lines(body: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(body).split_inclusive('\n').map(str::to_string).collect()
}

#[tokio::test]
async fn raw_empty_query_pair_and_discovery_and_errors() {
    let server = FakeApiServer::start().await.unwrap();
    server.seed([svc("default", "a", json!({})), svc("other", "b", json!({}))]);
    let mut raw = Raw::get(server.addr(), "/api/v1/services?&limit=500").await;
    let body: Value = serde_json::from_slice(&raw.read_to_end().await).unwrap();
    assert_eq!(raw.status(), 200);
    assert_eq!(body["kind"], "ServiceList");
    assert_eq!(body["items"].as_array().unwrap().len(), 2);
    assert!(body["items"][0].get("kind").is_none() && body["items"][0].get("apiVersion").is_none());
    assert!(body["metadata"].get("continue").is_none());
    assert_eq!(server.requests()[0].query, "&limit=500");

    for (path, code, kind) in [
        ("/version", 200, None),
        ("/api", 200, Some("APIVersions")),
        ("/apis", 200, Some("APIGroupList")),
        ("/api/v1", 200, Some("APIResourceList")),
        ("/api/v1/namespaces/default/services/a", 200, Some("Service")),
        ("/api/v1/namespaces/default/services/missing", 404, Some("Status")),
        ("/api/v1/pods", 404, Some("Status")),
        ("/api/v1/services?labelSelector=a%20in%20b", 400, Some("Status")),
    ] {
        let mut raw = Raw::get(server.addr(), path).await;
        let body: Value = serde_json::from_slice(&raw.read_to_end().await).unwrap();
        assert_eq!(raw.status(), code, "{path}");
        assert_eq!(body["kind"].as_str(), kind, "{path}: {body}");
        if code != 200 {
            assert_eq!(body["code"], code, "{path}");
            assert_eq!(body["status"], "Failure");
        }
    }
    let mut raw = Raw::get(server.addr(), "/version").await;
    let version: Value = serde_json::from_slice(&raw.read_to_end().await).unwrap();
    assert_eq!((version["major"].as_str(), version["minor"].as_str()), (Some("1"), Some("32")));
}

#[tokio::test]
async fn raw_cut_next_event_mid_line_then_replay() {
    let server = FakeApiServer::start().await.unwrap();
    let rv = server.resource_version();
    let target = format!("/api/v1/services?watch=true&resourceVersion={rv}");
    let mut raw = Raw::get(server.addr(), &target).await;
    eventually("watch open", || server.open_watches() == 1).await;
    server.faults().cut_next_event_mid_line();
    server.apply(svc("default", "cut", json!({})));
    let body = raw.read_to_end().await;
    let (_, complete) = raw.body();
    assert!(!complete, "a cut stream must not end with the terminating chunk");
    assert!(!body.is_empty() && !body.contains(&b'\n'), "partial line expected: {:?}", String::from_utf8_lossy(&body));

    // A re-watch from the last good rv replays the full line.
    let mut again = Raw::get(server.addr(), &target).await;
    again.read_until(|b| b.contains(&b'\n')).await;
    let full = lines(&again.body().0)[0].clone();
    assert!(full.as_bytes().starts_with(&body), "the cut bytes are a prefix of the event line");
    let event: Value = serde_json::from_str(&full).unwrap();
    assert_eq!((event["type"].as_str(), event["object"]["metadata"]["name"].as_str()), (Some("ADDED"), Some("cut")));
    assert!(full.starts_with("{\"type\":\"ADDED\",\"object\":{"), "{full}");
    assert_eq!(event["object"]["kind"], "Service");
}

#[tokio::test]
async fn raw_corrupt_event_and_garbage_line_keep_stream_open() {
    let server = FakeApiServer::start().await.unwrap();
    let mut raw = Raw::get(server.addr(), "/api/v1/watch/services").await; // deprecated path, from "now"
    eventually("watch open", || server.open_watches() == 1).await;
    server.faults().corrupt_next_event();
    server.apply(svc("default", "a", json!({})));
    server.faults().send_garbage_line();
    server.apply(svc("default", "b", json!({})));
    raw.read_until(|b| lines(b).len() >= 3 && b.ends_with(b"\n")).await;
    assert_eq!(raw.status(), 200);
    let (head, _) = raw.split().unwrap();
    assert!(head.contains("transfer-encoding: chunked") && head.contains("content-type: application/json"), "{head}");
    let got = lines(&raw.body().0);
    assert!(serde_json::from_str::<Value>(&got[0]).is_err(), "corrupt line: {}", got[0]);
    assert_eq!(got[1], "this is not json\n");
    let b: Value = serde_json::from_str(&got[2]).unwrap();
    assert_eq!(b["object"]["metadata"]["name"], "b");
    assert!(server.get("default", "a").is_some(), "the corrupted change is still stored");
}

#[tokio::test]
async fn request_faults_continue_expiry_and_refused_connections() {
    let server = FakeApiServer::start().await.unwrap();
    server.seed((0..5).map(|i| svc("default", &format!("s{i}"), json!({}))));
    let api = all(&server);
    server.faults().fail_requests(1);
    let err = api.list(&ListParams::default()).await.unwrap_err();
    assert!(format!("{err:?}").contains("500"), "{err:?}");
    assert_eq!(api.list(&ListParams::default()).await.unwrap().items.len(), 5);

    let first = api.list(&ListParams::default().limit(2)).await.unwrap();
    let token = first.metadata.continue_.unwrap();
    server.faults().expire_continue_tokens(true);
    let err = api.list(&ListParams::default().limit(2).continue_token(&token)).await.unwrap_err();
    match err {
        kube::Error::Api(status) => assert_eq!((status.code, status.reason.as_str()), (410, "Expired")),
        e => panic!("expected a 410 Status, got {e:?}"),
    }
    server.faults().expire_continue_tokens(false);
    assert_eq!(api.list(&ListParams::default().limit(2).continue_token(&token)).await.unwrap().items.len(), 2);

    let mut events = watch(&api, &WatchParams::default(), &server.resource_version()).await;
    eventually("watch open", || server.open_watches() == 1).await;
    server.faults().refuse_connections(true);
    loop {
        match within("watch cut by refuse_connections", events.next()).await {
            None | Some(Err(_)) => break,
            Some(Ok(WatchEvent::Bookmark(_))) => {}
            Some(Ok(e)) => panic!("unexpected {e:?}"),
        }
    }
    let mut raw = Raw::get(server.addr(), "/version").await;
    assert!(raw.read_to_end().await.is_empty() && raw.buf.is_empty(), "refused connection answered");
    server.faults().refuse_connections(false);
    assert_eq!(api.list(&ListParams::default()).await.unwrap().items.len(), 5);

    server.clone().shutdown().await;
    assert!(api.list(&ListParams::default()).await.is_err(), "served after shutdown");
}

#[tokio::test]
async fn patch_status_subresource() {
    let server = FakeApiServer::start().await.unwrap();
    server.apply(svc("default", "lb", json!({})));
    let uid = server.get("default", "lb").unwrap()["metadata"]["uid"].clone();
    let api: Api<Service> = Api::namespaced(client(&server), "default");
    let mut events = watch(&api, &WatchParams::default(), &server.resource_version()).await;
    let patch = json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.10"}]}}, "spec": {"type": "NodePort"}});
    let got = api.patch_status("lb", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    assert_eq!(got.status.unwrap().load_balancer.unwrap().ingress.unwrap()[0].ip.as_deref(), Some("192.0.2.10"));
    let stored = server.get("default", "lb").unwrap();
    assert_eq!(stored["spec"]["type"], "LoadBalancer", "status patch must not touch spec");
    assert_eq!(stored["metadata"]["uid"], uid);
    assert!(matches!(next_event(&mut events).await, WatchEvent::Modified(_)));
}

// ---- kubectl --------------------------------------------------------------------------------------------

/// `kubectl` with `HOME` at `home`, or `None` without it ([`require::require_tool`]'s policy).
fn kubectl(home: &Path) -> Option<tokio::process::Command> {
    require::require_tool("kubectl")?;
    let mut cmd = tokio::process::Command::new("kubectl");
    cmd.env("HOME", home).env_remove("KUBECONFIG").kill_on_drop(true);
    Some(cmd)
}

#[tokio::test]
async fn kubectl_get_and_proxy() {
    let server = FakeApiServer::start().await.unwrap();
    server.seed([svc("default", "web", json!({})), svc("prod", "api", json!({}))]);
    let home = tempfile::tempdir().unwrap();
    let Some(mut cmd) = kubectl(home.path()) else { return };
    let out = within("kubectl get", cmd.args(["--server", &server.url(), "get", "svc", "-A", "-o", "json"]).output())
        .await
        .unwrap();
    assert!(out.status.success(), "kubectl get failed: {}", String::from_utf8_lossy(&out.stderr));
    let list: Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: BTreeSet<String> = list["items"].as_array().unwrap().iter().map(key_of).collect();
    assert_eq!(names, BTreeSet::from(["default/web".to_string(), "prod/api".to_string()]));

    let mut cmd = kubectl(home.path()).unwrap();
    let mut proxy = cmd
        .args(["--server", &server.url(), "proxy", "--port=0"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(proxy.stdout.take().unwrap()).lines();
    let line = within("kubectl proxy start", stdout.next_line()).await.unwrap().expect("proxy output");
    let port = line.rsplit(':').next().unwrap().trim();
    assert!(line.starts_with("Starting to serve on 127.0.0.1:"), "{line}");
    let proxy_addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut raw = Raw::get(proxy_addr, "/api/v1/namespaces/prod/services?&limit=500").await;
    let body: Value = serde_json::from_slice(&raw.read_to_end().await).unwrap();
    assert_eq!(raw.status(), 200);
    assert_eq!(body["items"][0]["metadata"]["name"], "api");
    // A watch through the proxy streams live.
    let mut w =
        Raw::get(proxy_addr, &format!("/api/v1/services?watch=1&resourceVersion={}", server.resource_version())).await;
    eventually("watch through proxy open", || server.open_watches() == 1).await;
    server.apply(svc("default", "late", json!({})));
    w.read_until(|b| b.contains(&b'\n')).await;
    assert!(String::from_utf8_lossy(&w.body().0).contains("\"late\""));
    proxy.kill().await.unwrap();
}

#[tokio::test]
async fn client_going_away_closes_the_watch() {
    let server = FakeApiServer::start().await.unwrap();
    let raw = Raw::get(server.addr(), "/api/v1/services?watch=true").await;
    eventually("watch open", || server.open_watches() == 1).await;
    drop(raw);
    eventually("watch forgotten after the client left", || server.open_watches() == 0).await;
}
