//! The watch → event log path over real sockets: fake apiserver, real SQLite file, vipwatch in-process.

mod common;

use common::*;
use serde_json::json;
use vipwatch::model::{ServiceKey, ServiceView};
use vipwatch::store::{EventRow, ServiceRow};
use vipwatch_contract::{BackendMode, BackendsDiff};

fn view_of(api: &vipwatch::fake_apiserver::FakeApiServer, ns: &str, name: &str) -> ServiceView {
    let obj = api.get(ns, name).expect("object exists");
    ServiceView::from_service(&serde_json::from_value(obj).unwrap())
}

fn uid_of(api: &vipwatch::fake_apiserver::FakeApiServer, ns: &str, name: &str) -> String {
    api.get(ns, name).unwrap()["metadata"]["uid"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn create_modify_delete_record_exact_event_and_state_rows() {
    let h = Harness::new().await;
    let vw = h.start(h.config()).await;
    assert_eq!(events(&vw.store).await, vec![]);

    let rv1 = h.api.apply(lb_service("shop", "web", 80));
    let uid = uid_of(&h.api, "shop", "web");
    let added = wait_events(&vw.store, 1).await;
    let expected_view: ServiceView = serde_json::from_value(json!({
        "type": "LoadBalancer", "loadBalancerClass": null,
        "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": "8080", "nodePort": 30080, "appProtocol": null}],
        "selector": {"app": "web"}, "externalTrafficPolicy": null, "healthCheckNodePort": null,
        "sessionAffinity": "None", "sessionAffinityTimeoutSeconds": null, "loadBalancerSourceRanges": [],
        "externalIPs": [], "ipFamilies": [], "ipFamilyPolicy": null, "allocateLoadBalancerNodePorts": null,
        "loadBalancerIP": null, "requestedIPs": [], "ingress": [], "labels": {"app": "web"}, "annotations": {}
    }))
    .unwrap();
    let key = ServiceKey::new("shop", "web");
    let added_row = EventRow {
        id: 1,
        observed_at: 0,
        event_type: s("ADDED"),
        key: key.clone(),
        uid: uid.clone(),
        resource_version: rv1.clone(),
        cause: s("watch"),
        view: expected_view.clone(),
        previous: None,
        changed: vec![],
        backends: node_port_members(&expected_view, &[], 1),
        backends_diff: Default::default(),
    };
    assert_eq!(added, vec![added_row.clone()]);
    let state = ServiceRow {
        key: key.clone(),
        uid: uid.clone(),
        resource_version: rv1,
        view: expected_view.clone(),
        backends: node_port_members(&expected_view, &[], 1),
        first_seen_at: 0,
        updated_at: 0,
    };
    assert_eq!(services(&vw.store).await, vec![state.clone()]);

    let rv2 = h.api.update("shop", "web", |o| o["spec"]["ports"][0]["port"] = json!(8443)).unwrap();
    let rows = wait_events(&vw.store, 2).await;
    let mut modified_view = expected_view.clone();
    modified_view.ports[0].port = 8443;
    // The members are keyed by Service port, so they changed too (revision 2), though with no Node
    // there is no member to add or remove.
    let empty_diff = BackendsDiff { from_revision: 1, to_revision: 2, added: vec![], removed: vec![], changed: vec![] };
    let modified_row = EventRow {
        id: 2,
        event_type: s("MODIFIED"),
        resource_version: rv2.clone(),
        view: modified_view.clone(),
        previous: Some(expected_view.clone()),
        changed: vec![s("ports"), s("backends")],
        backends: Default::default(),
        backends_diff: [(BackendMode::NodePort, empty_diff)].into_iter().collect(),
        ..added_row.clone()
    };
    assert_eq!(rows, vec![added_row.clone(), modified_row.clone()]);
    let state2 = ServiceRow {
        resource_version: rv2,
        view: modified_view.clone(),
        backends: node_port_members(&modified_view, &[], 2),
        ..state
    };
    assert_eq!(services(&vw.store).await, vec![state2]);

    assert!(h.api.delete("shop", "web"));
    let rows = wait_events(&vw.store, 3).await;
    let deleted_rv = rows[2].resource_version.clone();
    assert_ne!(deleted_rv, modified_row.resource_version, "DELETED carries the deletion's resourceVersion");
    let deleted_row = EventRow {
        id: 3,
        event_type: s("DELETED"),
        resource_version: deleted_rv,
        view: modified_view.clone(),
        previous: None,
        changed: vec![],
        backends: node_port_members(&modified_view, &[], 2),
        backends_diff: Default::default(),
        ..added_row.clone()
    };
    assert_eq!(rows, vec![added_row, modified_row, deleted_row]);
    assert_eq!(services(&vw.store).await, vec![]);
    vw.stop().await.unwrap();
}

#[tokio::test]
async fn status_only_update_records_nothing_and_annotation_change_is_one_modified() {
    let h = Harness::new().await;
    h.api.apply(lb_service("shop", "web", 80));
    let vw = h.start(h.config()).await;
    assert_eq!(summary(&wait_events(&vw.store, 1).await), vec![(s("ADDED"), s("startup"), s("shop/web"))]);

    let status_rv = h
        .api
        .update("shop", "web", |o| o["status"] = json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.10"}]}}))
        .unwrap();
    // The state row follows the status (silently); no event is written for it.
    wait_until("state row refreshed to the status write", || async {
        let rows = vw.store.services().await.unwrap();
        (rows[0].resource_version == status_rv).then_some(())
    })
    .await;
    assert_eq!(services(&vw.store).await[0].view.vips(), vec![s("192.0.2.10")]);
    assert_eq!(events(&vw.store).await.len(), 1);

    h.api.update("shop", "web", |o| o["metadata"]["annotations"] = json!({"team": "payments"}));
    let rows = wait_events(&vw.store, 2).await;
    assert_eq!(
        summary(&rows),
        vec![(s("ADDED"), s("startup"), s("shop/web")), (s("MODIFIED"), s("watch"), s("shop/web"))]
    );
    assert_eq!(rows[1].changed, vec![s("annotations")]);
    assert_eq!(rows[1].previous.as_ref().unwrap().annotations.len(), 0);
    assert_eq!(rows[1].view, view_of(&h.api, "shop", "web"));
    vw.stop().await.unwrap();
}

#[tokio::test]
async fn changes_made_while_stopped_are_caught_on_restart_and_an_unchanged_restart_records_nothing() {
    let h = Harness::new().await;
    h.api.apply(lb_service("shop", "gone", 80));
    h.api.apply(lb_service("shop", "ports", 81));
    h.api.apply(lb_service("shop", "steady", 82));
    h.api.apply(json!({"metadata": {"name": "internal", "namespace": "shop"}, "spec": {"ports": [{"port": 5432}]}}));
    let vw = h.start(h.config()).await;
    assert_eq!(wait_events(&vw.store, 3).await.len(), 3);
    vw.stop().await.unwrap();

    assert!(h.api.delete("shop", "gone"));
    h.api.update("shop", "ports", |o| o["spec"]["ports"][0]["port"] = json!(8081));
    h.api.apply(lb_service("shop", "new", 83));

    let vw = h.start(h.config()).await;
    let rows = wait_events(&vw.store, 6).await;
    let mut tail = summary(&rows[3..]);
    tail.sort();
    assert_eq!(
        tail,
        vec![
            (s("ADDED"), s("startup"), s("shop/new")),
            (s("DELETED"), s("startup"), s("shop/gone")),
            (s("MODIFIED"), s("startup"), s("shop/ports"))
        ]
    );
    let modified = rows.iter().find(|r| r.event_type == "MODIFIED").unwrap();
    // Members are keyed by Service port: a port change is a member change too.
    assert_eq!(modified.changed, vec![s("ports"), s("backends")]);
    vw.stop().await.unwrap();

    let vw = h.start(h.config()).await;
    assert_eq!(events(&vw.store).await.len(), 6, "a restart against an unchanged cluster records nothing");
    let keys: Vec<String> = services(&vw.store).await.iter().map(|r| r.key.to_string()).collect();
    assert_eq!(keys, vec![s("shop/new"), s("shop/ports"), s("shop/steady")]);
    vw.stop().await.unwrap();
}

/// A list longer than one of the recorder's segments (512 changes) goes to the writer in several
/// plans; the log must hold each Service once, and a restart must diff against all of them.
#[tokio::test]
async fn a_first_list_of_several_segments_records_each_service_once_and_restarts_diff_against_all() {
    const N: usize = 1200;
    let h = Harness::new().await;
    h.api.seed((0..N).map(|i| lb_service("bulk", &format!("svc-{i:04}"), 80)));
    let vw = h.start(h.config()).await;
    // Ready means the whole first list is stored, not its first segments.
    let rows = events(&vw.store).await;
    let names: std::collections::BTreeSet<&str> = rows.iter().map(|r| r.key.name.as_str()).collect();
    assert_eq!((rows.len(), names.len()), (N, N));
    assert!(rows.iter().all(|r| r.event_type == "ADDED" && r.cause == "startup"));
    vw.stop().await.unwrap();

    assert!(h.api.delete("bulk", "svc-0000"));
    h.api.update("bulk", "svc-1199", |o| o["spec"]["ports"][0]["port"] = json!(8081));
    h.api.apply(lb_service("bulk", "svc-9999", 80));
    let vw = h.start(h.config()).await;
    let rows = wait_events(&vw.store, N + 3).await;
    let mut tail = summary(&rows[N..]);
    tail.sort();
    assert_eq!(
        tail,
        vec![
            (s("ADDED"), s("startup"), s("bulk/svc-9999")),
            (s("DELETED"), s("startup"), s("bulk/svc-0000")),
            (s("MODIFIED"), s("startup"), s("bulk/svc-1199"))
        ]
    );
    vw.stop().await.unwrap();

    let vw = h.start(h.config()).await;
    assert_eq!(events(&vw.store).await.len(), N + 3, "a restart against an unchanged cluster records nothing");
    assert_eq!(services(&vw.store).await.len(), N);
    vw.stop().await.unwrap();
}

/// On a multi-thread runtime, as in the binary, the writer prepares a large plan's next chunk while
/// it writes the one before (when no endpoint takes the changes): every change must still be
/// recorded once, with ids in the order the changes came, and the state table must end at the last
/// change of each Service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunks_prepared_while_the_one_before_is_written_keep_every_change_in_order() {
    const N: usize = 1500;
    let h = Harness::new().await;
    seed_bulk(&h.api, N);
    let vw = h.start(h.config()).await;
    change_bulk_twice(&h.api, N);
    assert_bulk_recorded_in_order(&vw.store, N).await;
    vw.stop().await.unwrap();
}

#[tokio::test]
async fn a_recreated_service_with_a_new_uid_is_deleted_then_added() {
    let h = Harness::new().await;
    h.api.apply(lb_service("shop", "web", 80));
    let vw = h.start(h.config()).await;
    wait_events(&vw.store, 1).await;
    let old_uid = uid_of(&h.api, "shop", "web");
    vw.stop().await.unwrap();

    h.api.delete("shop", "web");
    h.api.apply(lb_service("shop", "web", 80));
    let new_uid = uid_of(&h.api, "shop", "web");
    assert_ne!(old_uid, new_uid);

    let vw = h.start(h.config()).await;
    let rows = wait_events(&vw.store, 3).await;
    let tail: Vec<(String, String)> = rows[1..].iter().map(|r| (r.event_type.clone(), r.uid.clone())).collect();
    assert_eq!(tail, vec![(s("DELETED"), old_uid), (s("ADDED"), new_uid.clone())]);
    assert_eq!(services(&vw.store).await[0].uid, new_uid);
    vw.stop().await.unwrap();
}

#[tokio::test]
async fn type_changes_move_a_service_in_and_out_of_scope() {
    let h = Harness::new().await;
    h.api.apply(json!({"metadata": {"name": "db", "namespace": "shop"}, "spec": {"ports": [{"port": 5432}]}}));
    let vw = h.start(h.config()).await;
    assert_eq!(events(&vw.store).await.len(), 0);

    h.api.update("shop", "db", |o| o["spec"]["type"] = json!("LoadBalancer"));
    wait_events(&vw.store, 1).await;
    h.api.update("shop", "db", |o| o["spec"]["loadBalancerClass"] = json!("service.k8s.aws/nlb"));
    let rows = wait_events(&vw.store, 2).await;
    assert_eq!(summary(&rows), vec![(s("ADDED"), s("watch"), s("shop/db")), (s("DELETED"), s("watch"), s("shop/db"))]);
    assert_eq!(rows[1].view.load_balancer_class, None, "DELETED carries the view the appliance knew");
    vw.stop().await.unwrap();
}

#[tokio::test]
async fn a_second_instance_on_the_same_database_is_refused() {
    let h = Harness::new().await;
    let vw = h.start(h.config()).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let second = vipwatch::app::start(h.config(), listener).await;
    if h.pg_url.is_some() {
        // PostgreSQL: replicas share the database; the second one follows (tests/postgres/ha.rs).
        second.expect("a second replica starts").stop().await.unwrap();
        vw.stop().await.unwrap();
        return;
    }
    let err = second.err().expect("second instance refused");
    let db = h.db_path();
    assert_eq!(
        err.to_string(),
        format!(
            "database {} is in use by another `vipwatch serve` (lock file {}.lock is held); only one instance may serve a database",
            db.display(),
            db.display()
        )
    );
    vw.stop().await.unwrap();
    let again = h.start(h.config()).await; // the lock is released with the first instance
    again.stop().await.unwrap();
}

#[tokio::test]
async fn watch_and_write_back_metrics_exist_at_zero_before_the_first_error() {
    let h = Harness::new().await;
    let vw = h.start(h.config()).await;
    let text = vw.metrics.render();
    for resource in ["services", "nodes", "endpointslices"] {
        for line in [
            format!("vipwatch_watch_errors_total{{resource=\"{resource}\",scope=\"*\",kind=\"decode\"}} 0"),
            format!("vipwatch_watch_relists_total{{resource=\"{resource}\",scope=\"*\"}} 0"),
            format!("vipwatch_watch_gone_total{{resource=\"{resource}\",scope=\"*\"}} 0"),
            format!("vipwatch_watch_restarts_total{{resource=\"{resource}\",scope=\"*\"}} 0"),
        ] {
            assert!(text.lines().any(|l| l == line), "missing `{line}` in:\n{text}");
        }
    }
    // And every write back to Kubernetes, by kind and outcome (an alert on the first error or
    // dropped Event needs the series at 0 before it).
    for (kind, outcome) in vipwatch::metrics::KUBE_WRITE_SERIES {
        let line = format!("vipwatch_kubernetes_writes_total{{kind=\"{kind}\",outcome=\"{outcome}\"}} 0");
        assert!(text.lines().any(|l| l == line), "missing `{line}` in:\n{text}");
    }
    vw.stop().await.unwrap();
}
