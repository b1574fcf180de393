//! Events on the fake apiserver: kube-runtime's `Recorder` (events.k8s.io/v1, POST then PATCH of an
//! event series), the core/v1 events API with field selectors, both views of one store, discovery, and
//! `kubectl describe` listing a recorded event. Events never reach Service watches.

use crate::require;

use std::process::Stdio;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event as CoreEvent, ObjectReference, Service};
use k8s_openapi::api::events::v1::Event as EventsV1;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::api::{Api, DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use serde_json::json;
use tokio::time::timeout;
use vipwatch_fake_apiserver::FakeApiServer;

const WAIT: Duration = Duration::from_secs(20);

fn client(server: &FakeApiServer) -> kube::Client {
    kube::Client::try_from(kube::Config::new(server.url().parse().expect("url"))).expect("kube client")
}

fn web() -> serde_json::Value {
    json!({"metadata": {"name": "web", "namespace": "default"}, "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}})
}

fn assigned() -> Event {
    Event {
        type_: EventType::Normal,
        reason: "VipAssigned".into(),
        note: Some("VIP 192.0.2.10 assigned".into()),
        action: "Assign".into(),
        secondary: None,
    }
}

#[tokio::test]
async fn recorder_events_are_stored_and_listed_but_never_watched() {
    let server = FakeApiServer::start().await.unwrap();
    server.apply(web());
    let services: Api<Service> = Api::all(client(&server));
    let service_rv = server.resource_version();
    let mut watch = services.watch(&WatchParams::default(), &service_rv).await.unwrap().boxed();

    let svc = Api::<Service>::namespaced(client(&server), "default").get("web").await.unwrap();
    let reference = svc.object_ref(&());
    let reporter = Reporter { controller: "vipwatch".into(), instance: Some("vipwatch-0".into()) };
    let recorder = Recorder::new(client(&server), reporter);
    recorder.publish(&assigned(), &reference).await.expect("first publish (POST)");
    recorder.publish(&assigned(), &reference).await.expect("repeat publish (PATCH of the series)");
    let warning = Event { type_: EventType::Warning, reason: "ApplianceDown".into(), ..assigned() };
    recorder.publish(&warning, &reference).await.expect("second event");

    let events = server.events();
    assert_eq!(events.len(), 2, "{events:#?}");
    let first = &events[0];
    assert_eq!((first["apiVersion"].as_str(), first["kind"].as_str()), (Some("events.k8s.io/v1"), Some("Event")));
    assert_eq!(first["regarding"]["name"], "web");
    assert_eq!(first["regarding"]["uid"], json!(svc.metadata.uid.clone().unwrap()));
    assert_eq!(
        (first["reason"].as_str(), first["note"].as_str()),
        (Some("VipAssigned"), Some("VIP 192.0.2.10 assigned"))
    );
    assert_eq!(
        (first["reportingController"].as_str(), first["reportingInstance"].as_str()),
        (Some("vipwatch"), Some("vipwatch-0"))
    );
    assert_eq!(first["series"]["count"], 2, "the repeat became a series");
    assert!(first["eventTime"].is_string() && first["metadata"]["uid"].is_string());
    assert!(first["metadata"]["resourceVersion"].is_string());
    assert_eq!((events[1]["type"].as_str(), events[1]["reason"].as_str()), (Some("Warning"), Some("ApplianceDown")));
    let reqs = server.requests();
    let count = |m: &str, prefix: &str| reqs.iter().filter(|r| r.method == m && r.path.starts_with(prefix)).count();
    assert_eq!(count("POST", "/apis/events.k8s.io/v1/namespaces/default/events"), 2);
    assert_eq!(count("PATCH", "/apis/events.k8s.io/v1/namespaces/default/events/web."), 1);

    // The same events through core/v1, with a field selector on the involved object.
    let core: Api<CoreEvent> = Api::all(client(&server));
    let listed = core.list(&ListParams::default().fields("involvedObject.name=web")).await.unwrap();
    assert_eq!(listed.items.len(), 2);
    let e = &listed.items[0];
    assert_eq!((e.involved_object.name.as_deref(), e.involved_object.kind.as_deref()), (Some("web"), Some("Service")));
    assert_eq!(e.message.as_deref(), Some("VIP 192.0.2.10 assigned"));
    assert_eq!(e.reporting_component.as_deref(), Some("vipwatch"));
    assert!(core.list(&ListParams::default().fields("involvedObject.name=db")).await.unwrap().items.is_empty());
    let typed = core.list(&ListParams::default().fields("type=Warning,involvedObject.kind=Service")).await.unwrap();
    assert_eq!(typed.items.len(), 1);
    assert!(core.list(&ListParams::default().fields("spec.bogus=1")).await.is_err(), "unknown field label: 400");

    // Service watches and the Services' resourceVersion never saw any of it.
    assert_eq!(server.resource_version(), service_rv);
    server.apply(json!({"metadata": {"name": "after"}}));
    let next = timeout(WAIT, async {
        loop {
            match watch.next().await.expect("watch open").expect("watch item") {
                WatchEvent::Bookmark(_) => continue,
                other => return other,
            }
        }
    })
    .await
    .expect("service event in time");
    assert!(matches!(next, WatchEvent::Added(s) if s.metadata.name.as_deref() == Some("after")));
}

#[tokio::test]
async fn core_events_api_and_discovery() {
    let server = FakeApiServer::start().await.unwrap();
    let prod: Api<CoreEvent> = Api::namespaced(client(&server), "prod");
    let event = |name: &str, ns: &str| CoreEvent {
        metadata: ObjectMeta { generate_name: Some(format!("{name}.")), ..Default::default() },
        involved_object: ObjectReference {
            kind: Some("Service".into()),
            name: Some(name.into()),
            namespace: Some(ns.into()),
            ..Default::default()
        },
        reason: Some("Created".into()),
        message: Some(format!("hello {name}")),
        type_: Some("Normal".into()),
        ..Default::default()
    };
    let created = prod.create(&PostParams::default(), &event("web", "prod")).await.unwrap();
    let name = created.metadata.name.clone().unwrap();
    assert!(name.starts_with("web.") && name.len() == "web.".len() + 5, "{name}");
    assert!(created.metadata.uid.is_some() && created.metadata.resource_version.is_some());
    let default: Api<CoreEvent> = Api::namespaced(client(&server), "default");
    default.create(&PostParams::default(), &event("db", "default")).await.unwrap();

    let all: Api<CoreEvent> = Api::all(client(&server));
    assert_eq!(all.list(&ListParams::default()).await.unwrap().items.len(), 2);
    assert_eq!(prod.list(&ListParams::default()).await.unwrap().items.len(), 1);
    let db = all.list(&ListParams::default().fields("involvedObject.name=db")).await.unwrap();
    assert_eq!(db.items[0].message.as_deref(), Some("hello db"));
    let paged = all.list(&ListParams::default().limit(1)).await.unwrap();
    assert_eq!(paged.items.len(), 1);
    assert!(paged.metadata.continue_.is_some());

    // The events.k8s.io/v1 view of the same object.
    let v1: Api<EventsV1> = Api::namespaced(client(&server), "prod");
    let seen = v1.get(&name).await.unwrap();
    assert_eq!((seen.note.as_deref(), seen.regarding.unwrap().name.as_deref()), (Some("hello web"), Some("web")));
    prod.delete(&name, &DeleteParams::default()).await.unwrap();
    assert_eq!(server.events().len(), 1);
    assert_eq!(server.events()[0]["apiVersion"], "v1");
    assert!(server.list().is_empty(), "no Service was touched");

    // Discovery advertises both APIs.
    let c = client(&server);
    let core_resources = c.list_core_api_resources("v1").await.unwrap();
    assert!(core_resources.resources.iter().any(|r| r.name == "events" && r.namespaced));
    let groups = c.list_api_groups().await.unwrap();
    assert!(groups.groups.iter().any(|g| g.name == "events.k8s.io"));
    let group_resources = c.list_api_group_resources("events.k8s.io/v1").await.unwrap();
    assert!(group_resources.resources.iter().any(|r| r.name == "events" && r.kind == "Event"));
}

#[tokio::test]
async fn kubectl_describe_lists_recorded_events() {
    let Some(_kubectl) = require::require_tool("kubectl") else { return };
    let server = FakeApiServer::start().await.unwrap();
    server.apply(web());
    let svc = Api::<Service>::namespaced(client(&server), "default").get("web").await.unwrap();
    let recorder = Recorder::new(client(&server), "vipwatch".into());
    recorder.publish(&assigned(), &svc.object_ref(&())).await.unwrap();

    let home = tempfile::tempdir().unwrap();
    let out = tokio::process::Command::new("kubectl")
        .env("HOME", home.path())
        .env_remove("KUBECONFIG")
        .args(["--server", &server.url(), "describe", "svc", "web"])
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = timeout(WAIT, out).await.expect("kubectl in time").expect("kubectl must be installed");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("VipAssigned") && stdout.contains("VIP 192.0.2.10 assigned"), "{stdout}");
    let reqs = server.requests();
    assert!(reqs.iter().any(|r| r.path == "/api/v1/namespaces/default/events" && r.query.contains("fieldSelector=")));
}
