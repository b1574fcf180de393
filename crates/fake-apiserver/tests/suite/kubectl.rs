//! The installed `kubectl` (1.32) driving the fake apiserver: create, label, annotate, patch (strategic,
//! JSON, merge), delete and client-side apply, each checked through a kube-rs watch, and `kubectl get`
//! tables. (The `vipwatch fake-apiserver` subcommand is tested with the binary, in `tests/cli.rs`.)
//!
//! Every kubectl run gets a fresh temporary `HOME` (kubectl caches discovery under it).

use crate::require;

use std::collections::BTreeSet;
use std::process::{Output, Stdio};
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, WatchEvent, WatchParams};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::time::timeout;
use vipwatch_fake_apiserver::FakeApiServer;

const WAIT: Duration = Duration::from_secs(20);

/// Run `kubectl --server URL ARGS…` with a fresh `HOME`, feeding `stdin` if given.
async fn kubectl(server: &str, args: &[&str], stdin: Option<&str>) -> Output {
    let home = tempfile::tempdir().unwrap();
    let mut cmd = tokio::process::Command::new("kubectl");
    cmd.env("HOME", home.path())
        .env_remove("KUBECONFIG")
        .arg("--server")
        .arg(server)
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
    timeout(WAIT, child.wait_with_output()).await.unwrap_or_else(|_| panic!("kubectl {args:?} timed out")).unwrap()
}

/// [`kubectl`] that must succeed; returns its stdout.
async fn kubectl_ok(server: &str, args: &[&str], stdin: Option<&str>) -> String {
    let out = kubectl(server, args, stdin).await;
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "kubectl {args:?} failed:\n{stdout}\n{stderr}");
    stdout.into_owned()
}

fn client(server: &FakeApiServer) -> kube::Client {
    kube::Client::try_from(kube::Config::new(server.url().parse().expect("url"))).expect("kube client")
}

type Events = std::pin::Pin<Box<dyn Stream<Item = kube::Result<WatchEvent<Service>>> + Send>>;

async fn watch_from(api: &Api<Service>, rv: &str) -> Events {
    api.watch(&WatchParams::default(), rv).await.expect("watch request").boxed()
}

/// Next non-bookmark event as `("ADDED"|"MODIFIED"|"DELETED", object as JSON)`.
async fn next(events: &mut Events) -> (&'static str, Value) {
    loop {
        let item = timeout(WAIT, events.next()).await.expect("timed out waiting for a watch event");
        let (ty, svc) = match item.expect("watch ended").expect("watch error") {
            WatchEvent::Added(s) => ("ADDED", s),
            WatchEvent::Modified(s) => ("MODIFIED", s),
            WatchEvent::Deleted(s) => ("DELETED", s),
            WatchEvent::Bookmark(_) => continue,
            WatchEvent::Error(e) => panic!("watch ERROR {e:?}"),
        };
        return (ty, serde_json::to_value(svc).unwrap());
    }
}

const WEB: &str = r#"{"apiVersion": "v1", "kind": "Service",
  "metadata": {"name": "web", "labels": {"app": "web"}},
  "spec": {"type": "LoadBalancer", "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}"#;

#[tokio::test]
async fn kubectl_writes_show_up_as_watch_events() {
    let Some(_kubectl) = require::require_tool("kubectl") else { return };
    let server = FakeApiServer::start().await.unwrap();
    let url = server.url();
    let api: Api<Service> = Api::namespaced(client(&server), "default");
    let mut events = watch_from(&api, &server.resource_version()).await;

    let out = kubectl_ok(&url, &["create", "-f", "-"], Some(WEB)).await;
    assert_eq!(out.trim(), "service/web created");
    let (ty, obj) = next(&mut events).await;
    assert_eq!((ty, &obj["metadata"]["name"]), ("ADDED", &json!("web")));
    assert!(obj["metadata"]["uid"].is_string() && obj["metadata"]["creationTimestamp"].is_string());

    assert_eq!(kubectl_ok(&url, &["label", "svc", "web", "team=payments"], None).await.trim(), "service/web labeled");
    let (ty, obj) = next(&mut events).await;
    assert_eq!((ty, &obj["metadata"]["labels"]), ("MODIFIED", &json!({"app": "web", "team": "payments"})));

    let out = kubectl_ok(&url, &["annotate", "svc", "web", "vipwatch.example.com/pool=blue"], None).await;
    assert_eq!(out.trim(), "service/web annotated");
    let (ty, obj) = next(&mut events).await;
    assert_eq!((ty, &obj["metadata"]["annotations"]["vipwatch.example.com/pool"]), ("MODIFIED", &json!("blue")));

    let patch = r#"{"spec":{"loadBalancerSourceRanges":["10.0.0.0/8"],"ports":[{"port":80,"targetPort":9090}]}}"#;
    assert_eq!(kubectl_ok(&url, &["patch", "svc", "web", "-p", patch], None).await.trim(), "service/web patched");
    let (ty, obj) = next(&mut events).await;
    assert_eq!(ty, "MODIFIED");
    assert_eq!(obj["spec"]["loadBalancerSourceRanges"], json!(["10.0.0.0/8"]));
    // Strategic merge: the port is merged by its key, its name kept.
    assert_eq!(obj["spec"]["ports"], json!([{"name": "http", "port": 80, "targetPort": 9090}]));

    let add = r#"[{"op":"add","path":"/metadata/finalizers","value":["example.com/hold"]}]"#;
    kubectl_ok(&url, &["patch", "svc", "web", "--type=json", "-p", add], None).await;
    let (ty, obj) = next(&mut events).await;
    assert_eq!((ty, &obj["metadata"]["finalizers"]), ("MODIFIED", &json!(["example.com/hold"])));

    // Delete with a finalizer: terminating, still there.
    kubectl_ok(&url, &["delete", "svc", "web", "--wait=false"], None).await;
    let (ty, obj) = next(&mut events).await;
    assert!(ty == "MODIFIED" && obj["metadata"]["deletionTimestamp"].is_string(), "{ty} {obj}");
    let listed = kubectl_ok(&url, &["get", "svc", "-o", "json"], None).await;
    assert_eq!(serde_json::from_str::<Value>(&listed).unwrap()["items"].as_array().unwrap().len(), 1);
    // A new finalizer is refused; removing the label works; removing the finalizer deletes.
    let refused =
        kubectl(&url, &["patch", "svc", "web", "-p", r#"{"metadata":{"finalizers":["example.com/late"]}}"#], None)
            .await;
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("no new finalizers can be added if the object is being deleted"), "{stderr}");
    kubectl_ok(&url, &["label", "svc", "web", "team-"], None).await;
    let (ty, obj) = next(&mut events).await;
    assert_eq!((ty, &obj["metadata"]["labels"]), ("MODIFIED", &json!({"app": "web"})));
    kubectl_ok(&url, &["patch", "svc", "web", "--type=merge", "-p", r#"{"metadata":{"finalizers":null}}"#], None).await;
    assert_eq!(next(&mut events).await.0, "DELETED");

    // Plain delete (kubectl waits for the object to go, through a watch).
    kubectl_ok(&url, &["create", "-f", "-"], Some(WEB)).await;
    assert_eq!(next(&mut events).await.0, "ADDED");
    assert_eq!(kubectl_ok(&url, &["delete", "svc", "web"], None).await.trim(), "service \"web\" deleted");
    let (ty, obj) = next(&mut events).await;
    assert_eq!((ty, &obj["metadata"]["name"]), ("DELETED", &json!("web")));
    assert!(server.list().is_empty());
    let methods: BTreeSet<String> = server.requests().into_iter().map(|r| r.method).collect();
    assert!(["POST", "PATCH", "DELETE"].iter().all(|m| methods.contains(*m)), "{methods:?}");
}

#[tokio::test]
async fn kubectl_apply_creates_then_patches_strategically() {
    let Some(_kubectl) = require::require_tool("kubectl") else { return };
    let server = FakeApiServer::start().await.unwrap();
    let url = server.url();
    let api: Api<Service> = Api::namespaced(client(&server), "default");
    let mut events = watch_from(&api, &server.resource_version()).await;
    let v1 = json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "app", "namespace": "default", "labels": {"tier": "web"}},
        "spec": {"type": "LoadBalancer", "ports": [{"name": "http", "port": 80, "targetPort": 8080},
                                                    {"name": "https", "port": 443, "targetPort": 8443}]}});
    assert_eq!(kubectl_ok(&url, &["apply", "-f", "-"], Some(&v1.to_string())).await.trim(), "service/app created");
    let (ty, obj) = next(&mut events).await;
    assert_eq!(ty, "ADDED");
    assert!(obj["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"].is_string());

    // What the cluster adds on its own (node ports, cluster IP) must survive the next apply.
    server.update("default", "app", |o| {
        o["spec"]["clusterIP"] = json!("10.96.0.7");
        o["spec"]["ports"][0]["nodePort"] = json!(30080);
        o["spec"]["ports"][1]["nodePort"] = json!(30443);
    });
    assert_eq!(next(&mut events).await.0, "MODIFIED");

    let mut v2 = v1.clone();
    v2["metadata"]["labels"]["tier"] = json!("api");
    v2["spec"]["ports"] = json!([{"name": "http", "port": 80, "targetPort": 9090}]);
    assert_eq!(kubectl_ok(&url, &["apply", "-f", "-"], Some(&v2.to_string())).await.trim(), "service/app configured");
    let (ty, obj) = next(&mut events).await;
    assert_eq!(ty, "MODIFIED");
    assert_eq!(obj["metadata"]["labels"], json!({"tier": "api"}));
    assert_eq!(obj["spec"]["ports"], json!([{"name": "http", "port": 80, "targetPort": 9090, "nodePort": 30080}]));
    assert_eq!(obj["spec"]["clusterIP"], "10.96.0.7");

    let rv = server.resource_version();
    assert_eq!(kubectl_ok(&url, &["apply", "-f", "-"], Some(&v2.to_string())).await.trim(), "service/app unchanged");
    assert_eq!(server.resource_version(), rv, "an unchanged apply writes nothing");
    assert!(server.requests().iter().any(|r| r.path == "/openapi/v3"), "kubectl looked for OpenAPI v3");
}

#[tokio::test]
async fn kubectl_get_prints_the_service_columns_with_external_ips() {
    let Some(_kubectl) = require::require_tool("kubectl") else { return };
    let api = FakeApiServer::start().await.unwrap();
    api.apply(json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "shop", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.10", "selector": {"app": "web"},
                 "ports": [{"port": 80, "nodePort": 30080, "protocol": "TCP"}]},
        "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.10", "ipMode": "VIP"}]}}}));
    api.apply(json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "cart", "namespace": "shop", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 8080, "protocol": "TCP"}]}}));
    let out = kubectl(&api.url(), &["get", "svc", "-A"], None).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(rows[0], vec!["NAMESPACE", "NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)", "AGE"]);
    assert_eq!(rows[1][..6], ["shop", "cart", "LoadBalancer", "<none>", "<pending>", "8080/TCP"]);
    assert_eq!(rows[2][..6], ["shop", "web", "LoadBalancer", "10.96.0.10", "192.0.2.10", "80:30080/TCP"]);
    assert!(rows[2][6].ends_with('d'), "age in days: {text}");
}
