//! Every Kubernetes fixture in tests/data/kubernetes parses the way kube-rs will read it off the wire,
//! and normalizes without panicking.

use std::path::Path;

use k8s_openapi::api::core::v1::Service;
use kube::api::{ObjectList, WatchEvent};
use vipwatch::model::{Scope, ServiceView};

fn data(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/kubernetes").join(path)).unwrap()
}

fn watch_lines(path: &str) -> Vec<WatchEvent<Service>> {
    data(path).lines().filter(|l| !l.trim().is_empty()).map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn every_real_world_service_parses_and_normalizes() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/kubernetes/real-world");
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".json"))
        .collect();
    names.sort();
    assert_eq!(names.len(), 34);
    let scope = Scope {
        service_types: vec!["LoadBalancer".into()],
        load_balancer_class: "vipwatch.io/lb".into(),
        manage_classless: true,
    };
    let mut in_scope = Vec::new();
    for name in &names {
        let svc: Service =
            serde_json::from_str(&data(&format!("real-world/{name}"))).unwrap_or_else(|e| panic!("{name}: {e}"));
        let view = ServiceView::from_service(&svc);
        if scope.contains(&view) {
            in_scope.push(name[..2].to_owned());
        }
    }
    // The LoadBalancer fixtures without a foreign loadBalancerClass (07 is AWS's).
    assert_eq!(
        in_scope,
        [
            "01", "05", "06", "08", "12", "13", "14", "15", "16", "17", "18", "19", "20", "21", "22", "23", "24", "25",
            "30", "31", "33", "34"
        ]
    );
}

#[test]
fn bookmarks_with_null_fields_parse_as_bookmarks() {
    let events = watch_lines("watch-bookmark.jsonl");
    let rvs: Vec<String> = events
        .iter()
        .map(|e| match e {
            WatchEvent::Bookmark(b) => b.metadata.resource_version.clone(),
            other => panic!("not a bookmark: {other:?}"),
        })
        .collect();
    assert_eq!(rvs, vec!["12746", "3845"]);
}

#[test]
fn in_band_410_errors_parse_with_both_reasons() {
    let codes: Vec<(u16, String)> = watch_lines("watch-error-410.jsonl")
        .iter()
        .map(|e| match e {
            WatchEvent::Error(s) => (s.code, s.reason.clone()),
            other => panic!("not an error: {other:?}"),
        })
        .collect();
    assert_eq!(codes, vec![(410, "Gone".to_owned()), (410, "Expired".to_owned())]);
}

#[test]
fn modified_then_deleted_lb_events_normalize() {
    let events = watch_lines("watch-lb-modified-deleted.jsonl");
    let kinds: Vec<(&str, Vec<String>)> = events
        .iter()
        .map(|e| match e {
            WatchEvent::Modified(s) => ("MODIFIED", ServiceView::from_service(s).vips()),
            WatchEvent::Deleted(s) => ("DELETED", ServiceView::from_service(s).vips()),
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(kinds.len(), 2);
    assert_eq!(kinds[0].0, "MODIFIED");
    assert_eq!(kinds[1].0, "DELETED");
}

#[test]
fn clusterip_added_event_parses_and_is_out_of_scope() {
    let events = watch_lines("watch-added-clusterip.jsonl");
    let WatchEvent::Added(svc) = &events[0] else { panic!("not ADDED") };
    assert_eq!(ServiceView::from_service(svc).service_type, "ClusterIP");
}

#[test]
fn list_items_without_kind_parse() {
    let list: ObjectList<Service> = serde_json::from_str(&data("servicelist-no-kind-items.json")).unwrap();
    assert!(!list.items.is_empty());
    assert!(list.items.iter().all(|s| s.metadata.name.is_some()));
}

#[test]
fn documented_lb_service_and_endpointslice_parse() {
    let svc: Service = serde_json::from_str(&data("service-loadbalancer-docs.json")).unwrap();
    assert_eq!(ServiceView::from_service(&svc).service_type, "LoadBalancer");
    let slice: k8s_openapi::api::discovery::v1::EndpointSlice =
        serde_json::from_str(&data("endpointslice-docs.json")).unwrap();
    assert!(!slice.endpoints.unwrap_or_default().is_empty());
}
