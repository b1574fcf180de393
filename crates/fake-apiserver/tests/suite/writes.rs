//! Writes to the fake apiserver over real sockets: kube-rs create/replace/patch/delete, finalizers with
//! deletionTimestamp semantics (also through kube-runtime's `finalizer` helper), and the Rust API's
//! `delete` / `delete_now`.

use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use serde_json::json;
use tokio::time::timeout;
use vipwatch_fake_apiserver::FakeApiServer;

const WAIT: Duration = Duration::from_secs(10);

fn client(server: &FakeApiServer) -> kube::Client {
    kube::Client::try_from(kube::Config::new(server.url().parse().expect("url"))).expect("kube client")
}

fn svc(name: &str, finalizers: &[&str]) -> Service {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "default", "finalizers": finalizers},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP"}]},
    }))
    .unwrap()
}

type Events = std::pin::Pin<Box<dyn Stream<Item = kube::Result<WatchEvent<Service>>> + Send>>;

async fn watch_from(api: &Api<Service>, rv: &str) -> Events {
    api.watch(&WatchParams::default(), rv).await.expect("watch request").boxed()
}

/// Next non-bookmark event as `("ADDED"|"MODIFIED"|"DELETED", object)`.
async fn next(events: &mut Events) -> (&'static str, Service) {
    loop {
        let item = timeout(WAIT, events.next()).await.expect("timed out waiting for a watch event");
        match item.expect("watch ended").expect("watch error") {
            WatchEvent::Added(s) => return ("ADDED", s),
            WatchEvent::Modified(s) => return ("MODIFIED", s),
            WatchEvent::Deleted(s) => return ("DELETED", s),
            WatchEvent::Bookmark(_) => continue,
            WatchEvent::Error(e) => panic!("watch ERROR {e:?}"),
        }
    }
}

fn api_error(e: kube::Error) -> Box<kube::core::Status> {
    match e {
        kube::Error::Api(s) => s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn create_replace_patch_delete_over_http() {
    let server = FakeApiServer::start().await.unwrap();
    let api: Api<Service> = Api::namespaced(client(&server), "default");
    let mut events = watch_from(&api, &server.resource_version()).await;

    let created = api.create(&PostParams::default(), &svc("web", &[])).await.unwrap();
    let (uid, rv) = (created.metadata.uid.clone().unwrap(), created.metadata.resource_version.clone().unwrap());
    assert!(created.metadata.creation_timestamp.is_some());
    assert_eq!(rv, server.resource_version());
    let (ty, obj) = next(&mut events).await;
    assert_eq!((ty, obj.metadata.uid.as_deref()), ("ADDED", Some(uid.as_str())));
    let dup = api_error(api.create(&PostParams::default(), &svc("web", &[])).await.unwrap_err());
    assert_eq!((dup.code, dup.reason.as_str()), (409, "AlreadyExists"));

    // generateName: 5 random characters appended.
    let mut gen_svc = svc("", &[]);
    gen_svc.metadata.name = None;
    gen_svc.metadata.generate_name = Some("gen-".into());
    let generated = api.create(&PostParams::default(), &gen_svc).await.unwrap();
    let gen_name = generated.metadata.name.clone().unwrap();
    assert!(gen_name.starts_with("gen-") && gen_name.len() == 9, "{gen_name}");
    assert_eq!(next(&mut events).await.0, "ADDED");

    // Replace: a stale resourceVersion conflicts; the current one (or none) replaces; status is kept.
    server.update("default", "web", |o| o["status"] = json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}}));
    assert_eq!(next(&mut events).await.0, "MODIFIED");
    let mut new = svc("web", &[]);
    new.metadata.resource_version = Some(rv.clone());
    let stale = api_error(api.replace("web", &PostParams::default(), &new).await.unwrap_err());
    assert_eq!((stale.code, stale.reason.as_str()), (409, "Conflict"));
    new.metadata.resource_version = Some(server.resource_version());
    new.spec.as_mut().unwrap().type_ = Some("NodePort".into());
    let replaced = api.replace("web", &PostParams::default(), &new).await.unwrap();
    assert_eq!(replaced.metadata.uid.as_deref(), Some(uid.as_str()), "uid survives a replace");
    let stored = server.get("default", "web").unwrap();
    assert_eq!(stored["spec"]["type"], "NodePort");
    assert_eq!(stored["status"]["loadBalancer"]["ingress"][0]["ip"], "192.0.2.1", "PUT keeps status");
    assert_eq!(next(&mut events).await.0, "MODIFIED");

    // PUT /status changes only the status.
    let mut st = api.get("web").await.unwrap();
    st.status = serde_json::from_value(json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.9"}]}})).unwrap();
    st.spec.as_mut().unwrap().type_ = Some("ClusterIP".into());
    api.replace_status("web", &PostParams::default(), &st).await.unwrap();
    let stored = server.get("default", "web").unwrap();
    assert_eq!(
        (stored["spec"]["type"].as_str(), stored["status"]["loadBalancer"]["ingress"][0]["ip"].as_str()),
        (Some("NodePort"), Some("192.0.2.9"))
    );
    assert_eq!(next(&mut events).await.0, "MODIFIED");

    // A patch that changes nothing keeps the resourceVersion and emits nothing.
    let before = server.resource_version();
    let same = json!({"spec": {"type": "NodePort"}});
    api.patch("web", &PatchParams::default(), &Patch::Strategic(&same)).await.unwrap();
    assert_eq!(server.resource_version(), before);

    // Delete preconditions, then delete (no finalizers): DELETED at once, answered with the object.
    let wrong = DeleteParams {
        preconditions: Some(kube::api::Preconditions { uid: Some("nope".into()), resource_version: None }),
        ..Default::default()
    };
    assert_eq!(api_error(api.delete("web", &wrong).await.unwrap_err()).code, 409);
    let gone = api.delete("web", &DeleteParams::default()).await.unwrap();
    assert!(gone.is_left(), "the deleted object is returned");
    let (ty, obj) = next(&mut events).await;
    assert_eq!((ty, obj.metadata.name.as_deref()), ("DELETED", Some("web")));
    assert_eq!(obj.metadata.resource_version, Some(server.resource_version()));
    assert_eq!(api_error(api.delete("web", &DeleteParams::default()).await.unwrap_err()).code, 404);
}

/// A client asking for `PartialObjectMetadata` (kube's `get_metadata`, `patch_metadata`) gets only the
/// object's metadata, as from a real apiserver, and for a `PartialObjectMetadataList` (`list_metadata`)
/// the metadata of each item; the patch itself applies to the whole object.
#[tokio::test]
async fn metadata_only_requests_are_answered_with_the_metadata_alone() {
    let server = FakeApiServer::start().await.unwrap();
    let client = client(&server);
    let api: Api<Service> = Api::namespaced(client.clone(), "default");
    api.create(&PostParams::default(), &svc("web", &[])).await.unwrap();
    let request = kube::core::Request::new("/api/v1/namespaces/default/services");
    let patch = Patch::Strategic(json!({"metadata": {"finalizers": ["example.com/x"]}, "spec": {"type": "NodePort"}}));

    let raw = request.patch_metadata("web", &PatchParams::default(), &patch).unwrap();
    let answer: serde_json::Value = serde_json::from_str(&client.request_text(raw).await.unwrap()).unwrap();
    let stored = server.get("default", "web").unwrap();
    let partial =
        json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": stored["metadata"]});
    assert_eq!(answer, partial);
    assert_eq!(
        (stored["metadata"]["finalizers"][0].as_str(), stored["spec"]["type"].as_str()),
        (Some("example.com/x"), Some("NodePort"))
    );

    let raw = request.get_metadata("web", &kube::api::GetParams::default()).unwrap();
    let answer: serde_json::Value = serde_json::from_str(&client.request_text(raw).await.unwrap()).unwrap();
    assert_eq!(answer, partial);
    let typed = api.patch_metadata("web", &PatchParams::default(), &patch).await.unwrap();
    assert_eq!(typed.metadata.finalizers, Some(vec!["example.com/x".to_string()]));
    assert_eq!(
        api.get("web").await.unwrap().spec.unwrap().type_.as_deref(),
        Some("NodePort"),
        "a full GET is unchanged"
    );

    let raw = request.list_metadata(&ListParams::default()).unwrap();
    let answer: serde_json::Value = serde_json::from_str(&client.request_text(raw).await.unwrap()).unwrap();
    let list = json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1",
                      "metadata": {"resourceVersion": server.resource_version()}, "items": [partial]});
    assert_eq!(answer, list);
    let typed = api.list_metadata(&ListParams::default()).await.unwrap();
    assert_eq!(typed.items.iter().map(|o| o.metadata.name.as_deref()).collect::<Vec<_>>(), [Some("web")]);
    assert!(api.list(&ListParams::default()).await.unwrap().items[0].spec.is_some(), "a full list is unchanged");
}

#[tokio::test]
async fn finalizer_lifecycle_over_http() {
    let server = FakeApiServer::start().await.unwrap();
    let api: Api<Service> = Api::namespaced(client(&server), "default");
    api.create(&PostParams::default(), &svc("lb", &["example.com/cleanup"])).await.unwrap();
    let mut events = watch_from(&api, &server.resource_version()).await;

    // DELETE with a finalizer: MODIFIED with deletionTimestamp, the object stays.
    let answer = api.delete("lb", &DeleteParams::default()).await.unwrap();
    let terminating = answer.left().expect("object returned");
    assert!(terminating.metadata.deletion_timestamp.is_some());
    let (ty, obj) = next(&mut events).await;
    assert_eq!(ty, "MODIFIED");
    assert!(obj.metadata.deletion_timestamp.is_some());
    assert_eq!(obj.metadata.deletion_grace_period_seconds, Some(0));
    assert_eq!(obj.metadata.resource_version, Some(server.resource_version()));
    let listed = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(listed.items.len(), 1, "a terminating object is still listed");
    let stamp = server.get("default", "lb").unwrap()["metadata"]["deletionTimestamp"].clone();
    assert!(stamp.as_str().is_some_and(|s| s.len() == 20 && s.ends_with('Z')), "RFC 3339: {stamp}");

    // Deleting again changes nothing.
    let rv = server.resource_version();
    api.delete("lb", &DeleteParams::default()).await.unwrap();
    assert_eq!(server.resource_version(), rv);

    // Adding a finalizer to a terminating object: 422 Invalid; other changes are fine.
    let add = json!({"metadata": {"finalizers": ["example.com/cleanup", "example.com/other"]}});
    let err = api_error(api.patch("lb", &PatchParams::default(), &Patch::Merge(&add)).await.unwrap_err());
    assert_eq!((err.code, err.reason.as_str()), (422, "Invalid"));
    assert!(
        err.message.contains("Forbidden: no new finalizers can be added if the object is being deleted"),
        "{}",
        err.message
    );
    let label = json!({"metadata": {"labels": {"phase": "cleanup"}, "deletionTimestamp": null}});
    api.patch("lb", &PatchParams::default(), &Patch::Merge(&label)).await.unwrap();
    let (ty, obj) = next(&mut events).await;
    assert_eq!(ty, "MODIFIED");
    assert!(obj.metadata.deletion_timestamp.is_some(), "deletionTimestamp cannot be removed");

    // A merge patch removing the last finalizer deletes the object.
    let remove = json!({"metadata": {"finalizers": null}});
    api.patch("lb", &PatchParams::default(), &Patch::Merge(&remove)).await.unwrap();
    let (ty, obj) = next(&mut events).await;
    assert_eq!((ty, obj.metadata.name.as_deref()), ("DELETED", Some("lb")));
    assert!(server.get("default", "lb").is_none());
    assert!(api.list(&ListParams::default()).await.unwrap().items.is_empty());
}

#[tokio::test]
async fn kube_runtime_finalizer_helper_round_trip() {
    let server = FakeApiServer::start().await.unwrap();
    let api: Api<Service> = Api::namespaced(client(&server), "default");
    api.create(&PostParams::default(), &svc("web", &[])).await.unwrap();
    let mut events = watch_from(&api, &server.resource_version()).await;
    const NAME: &str = "vipwatch.example.com/vip";
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let run = |obj: Service| {
        let (api, seen) = (api.clone(), seen.clone());
        async move {
            finalizer(&api, NAME, Arc::new(obj), |ev| async move {
                seen.lock().unwrap().push(match ev {
                    FinalizerEvent::Apply(_) => "apply",
                    FinalizerEvent::Cleanup(_) => "cleanup",
                });
                Ok::<_, std::io::Error>(Action::await_change())
            })
            .await
            .expect("finalizer step")
        }
    };
    run(api.get("web").await.unwrap()).await; // adds the finalizer (JSON patch: test null + add)
    let (ty, obj) = next(&mut events).await;
    assert_eq!((ty, obj.metadata.finalizers.clone()), ("MODIFIED", Some(vec![NAME.to_string()])));
    run(obj).await; // apply
    assert!(server.delete("default", "web"), "Rust delete honours the finalizer");
    let (ty, obj) = next(&mut events).await;
    assert!(ty == "MODIFIED" && obj.metadata.deletion_timestamp.is_some());
    run(obj).await; // cleanup, then removes the finalizer (JSON patch: test + remove)
    assert_eq!(next(&mut events).await.0, "DELETED");
    assert_eq!(*seen.lock().unwrap(), vec!["apply", "cleanup"]);
    assert!(server.get("default", "web").is_none());
}

#[tokio::test]
async fn rust_api_finalizer_rules_and_delete_now() {
    let server = FakeApiServer::start().await.unwrap();
    let with = |name: &str| json!({"metadata": {"name": name, "finalizers": ["f"]}, "spec": {}});
    server.seed([with("a"), with("b")]);
    let api: Api<Service> = Api::all(client(&server));
    let mut events = watch_from(&api, &server.resource_version()).await;

    assert!(server.delete("default", "a"));
    assert!(server.get("default", "a").unwrap()["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(next(&mut events).await.0, "MODIFIED");
    // apply() of a terminating object keeps the deletionTimestamp ...
    server.apply(json!({"metadata": {"name": "a", "finalizers": ["f"], "labels": {"x": "y"}}}));
    assert!(server.get("default", "a").unwrap()["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(next(&mut events).await.0, "MODIFIED");
    // ... and update() leaving no finalizers deletes it.
    server.update("default", "a", |o| o["metadata"]["finalizers"] = json!([]));
    let (ty, obj) = next(&mut events).await;
    assert_eq!((ty, obj.metadata.name.as_deref()), ("DELETED", Some("a")));
    assert!(server.get("default", "a").is_none());

    assert!(server.delete_now("default", "b"), "delete_now ignores finalizers");
    assert_eq!(next(&mut events).await.0, "DELETED");
    assert!(!server.delete_now("default", "b") && !server.delete("default", "b"));
    assert!(server.list().is_empty());
}
