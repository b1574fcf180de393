//! The relay over real sockets: fake apiserver → vipwatch → real HTTP receivers on 127.0.0.1:0.

mod common;

use std::time::Duration;

use common::receiver::{Receiver, Reply, SECRET, WAIT};
use common::*;
use serde_json::json;
use vipwatch::model::ServiceView;
use vipwatch::store::{DeliveryFilter, DeliveryRow, Store};

/// Every delivery, once none is pending any more (outcomes are recorded after the receiver answered).
async fn wait_recorded(store: &Store) -> Vec<DeliveryRow> {
    wait_until("every outcome recorded", || async {
        let rows = store.deliveries(&DeliveryFilter::default()).await.unwrap();
        rows.iter().all(|d| d.state != "pending").then_some(rows)
    })
    .await
}

async fn wait_accepted(r: &Receiver, n: usize) -> Vec<receiver::Hit> {
    let what = format!("{n} accepted deliveries");
    wait_until(&what, || async { (r.accepted().len() >= n).then(|| r.accepted()) }).await
}

async fn wait_hits(r: &Receiver, n: usize) -> Vec<receiver::Hit> {
    wait_until(&format!("{n} requests"), || async { (r.hits().len() >= n).then(|| r.hits()) }).await
}

#[tokio::test]
async fn an_added_service_is_delivered_signed_with_the_documented_payload() {
    let h = Harness::new().await;
    let rx = Receiver::ok().await;
    let vw = h.start(h.config_with(vec![webhook("lab", &rx.url)])).await;
    let created_rv = h.api.apply(lb_service("shop", "web", 80));
    let hit = wait_accepted(&rx, 1).await.remove(0);

    let wh = standardwebhooks::Webhook::new(SECRET).unwrap();
    wh.verify(&hit.body, &hit.headers).expect("signature verifies with the standardwebhooks crate");
    assert_eq!(hit.header("content-type"), "application/json");
    assert_eq!(hit.header("user-agent"), format!("vipwatch/{}", env!("CARGO_PKG_VERSION")));
    assert!(hit.header("webhook-id").starts_with("msg_") && !hit.header("webhook-id").contains('.'));
    let ts: i64 = hit.header("webhook-timestamp").parse().unwrap();
    assert!((ts - jiff::Timestamp::now().as_second()).abs() < 60);

    let body = hit.json();
    let uid = h.api.get("shop", "web").unwrap()["metadata"]["uid"].clone();
    // The ADDED as recorded, before vipwatch's finalizer (added before delivery) moved the object on.
    let rv = created_rv;
    // Mode nodePort (the default) with no Node in the cluster: no member, kube-proxy's check hinted.
    let view = ServiceView::from_service(&serde_json::from_value(h.api.get("shop", "web").unwrap()).unwrap());
    let members = serde_json::to_value(node_port_members(&view, &[], 1)).unwrap();
    assert_eq!(members["nodePort"]["ports"][0]["members"], json!([]));
    assert_eq!(
        members["nodePort"]["healthCheck"],
        json!({"protocol": "HTTP", "port": 10256, "path": "/healthz", "scope": "node"})
    );
    // No cluster.name configured: named after the cluster's kube-system namespace.
    let cluster = vipwatch::model::cluster::from_namespace_uid(&h.api.namespace_uid("kube-system"));
    let expected = json!({
        "type": "service.added",
        "timestamp": body["timestamp"],
        "data": {"event_id": 1, "log_id": vw.store.log_id(), "cluster": cluster, "event": "ADDED", "cause": "watch",
                 "service": {"namespace": "shop", "name": "web", "uid": uid, "resourceVersion": rv,
                             "vips": [], "type": "LoadBalancer", "loadBalancerClass": null,
                             "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": "8080", "nodePort": 30080, "appProtocol": null}],
                             "selector": {"app": "web"}, "externalTrafficPolicy": null, "healthCheckNodePort": null,
                             "sessionAffinity": "None", "sessionAffinityTimeoutSeconds": null,
                             "loadBalancerSourceRanges": [], "externalIPs": [], "ipFamilies": [], "ipFamilyPolicy": null,
                             "allocateLoadBalancerNodePorts": null, "loadBalancerIP": null, "requestedIPs": [],
                             "ingress": [], "labels": {"app": "web"}, "annotations": {},
                             "allocation": null, "finalizers": [], "deleting": false,
                             "backends": members["nodePort"]},
                 "previous": null, "changed": []}
    });
    assert_eq!(body, expected);
    let stamp = body["timestamp"].as_str().unwrap();
    assert!(stamp.ends_with('Z') && stamp.parse::<jiff::Timestamp>().is_ok(), "RFC 3339: {stamp}");

    // The outcome is recorded once vipwatch has the receiver's answer, a moment after the hit.
    let rows = wait_recorded(&vw.store).await;
    assert_eq!(rows.len(), 1);
    assert_eq!((rows[0].state.as_str(), rows[0].attempts, rows[0].event_id), ("succeeded", 1, Some(1)));
    assert_eq!(rows[0].payload.as_bytes(), &hit.body[..], "the stored payload is the exact body sent");
    vw.stop().await.unwrap();
}

#[tokio::test]
async fn a_receiver_failing_three_times_gets_the_same_message_id_until_it_succeeds() {
    let h = Harness::new().await;
    let rx = Receiver::start(|i, _| if i < 3 { Reply::Status(500) } else { Reply::Status(200) }).await;
    let vw = h.start(h.config_with(vec![webhook("lab", &rx.url)])).await;
    h.api.apply(lb_service("shop", "web", 80));
    wait_accepted(&rx, 1).await;
    let hits = rx.hits();
    assert_eq!(hits.len(), 4);
    let ids: Vec<String> = hits.iter().map(|h| h.header("webhook-id")).collect();
    assert!(ids.iter().all(|id| *id == ids[0]), "webhook-id is stable across retries: {ids:?}");
    let wh = standardwebhooks::Webhook::new(SECRET).unwrap();
    assert!(hits.iter().all(|hit| wh.verify(&hit.body, &hit.headers).is_ok()));

    let row = wait_until("delivery recorded as succeeded", || async {
        let rows = vw.store.deliveries(&DeliveryFilter::default()).await.unwrap();
        (rows[0].state == "succeeded").then(|| rows[0].clone())
    })
    .await;
    assert_eq!(row.attempts, 4);
    let attempts = vw.store.attempts(row.id).await.unwrap();
    let summary: Vec<(Option<i64>, Option<String>)> =
        attempts.iter().map(|a| (a.status_code, a.error_class.clone())).collect();
    let http = Some("http".to_owned());
    assert_eq!(
        summary,
        vec![(Some(500), http.clone()), (Some(500), http.clone()), (Some(500), http), (Some(200), None)]
    );
    vw.stop().await.unwrap();
}

#[tokio::test]
async fn retry_after_is_honoured() {
    let h = Harness::new().await;
    let rx = Receiver::start(|i, _| {
        if i == 0 { Reply::WithHeaders(429, vec![("retry-after", "2".into())]) } else { Reply::Status(204) }
    })
    .await;
    let mut w = webhook("lab", &rx.url);
    w.retry.max_delay = Duration::from_secs(5); // Retry-After is clamped to the schedule's maximum
    let vw = h.start(h.config_with(vec![w])).await;
    h.api.apply(lb_service("shop", "web", 80));
    wait_accepted(&rx, 1).await;
    let hits = rx.hits();
    // Never sooner than asked (a slow machine only makes the gap longer); the exact schedule, within
    // `max_delay`, is the policy's unit test (`src/relay/policy.rs`).
    let gap = hits[1].at - hits[0].at;
    assert!(gap >= Duration::from_millis(1900), "second attempt {gap:?} after a 429 with Retry-After: 2");
    vw.stop().await.unwrap();
}

/// An answer whose status line came but whose body never finished within the timeout is no answer
/// (the appliance may not have finished): a `timeout`, retried, never a success.
#[tokio::test]
async fn a_2xx_whose_body_never_finishes_is_a_timeout_and_is_retried() {
    let h = Harness::new().await;
    let rx = Receiver::start(|i, _| if i == 0 { Reply::Trickle(200) } else { Reply::Status(204) }).await;
    let mut w = webhook("lab", &rx.url);
    w.timeout = Duration::from_millis(500);
    let vw = h.start(h.config_with(vec![w])).await;
    h.api.apply(lb_service("shop", "web", 80));
    let row = wait_until("delivered", || async {
        let rows = vw.store.deliveries(&DeliveryFilter::default()).await.unwrap();
        rows.first().filter(|r| r.state == "succeeded").cloned()
    })
    .await;
    let attempts = vw.store.attempts(row.id).await.unwrap();
    let classes: Vec<(Option<i64>, Option<String>)> =
        attempts.iter().map(|a| (a.status_code, a.error_class.clone())).collect();
    assert_eq!(classes, vec![(None, Some("timeout".into())), (Some(204), None)]);
    let error = attempts[0].error.as_deref().unwrap();
    assert!(error.starts_with("HTTP 200 OK began, but its body did not arrive whole: "), "{error}");
    assert_eq!(rx.hits().len(), 2);
    vw.stop().await.unwrap();
}

/// A receiver's `Retry-After` is a hint within our own policy: one in the past, of 0 s, or one we
/// cannot read never makes the next attempt come sooner than our backoff.
#[tokio::test]
async fn a_retry_after_in_the_past_or_unreadable_waits_our_backoff() {
    let h = Harness::new().await;
    let rx = Receiver::start(|i, _| match i {
        0 => Reply::WithHeaders(429, vec![("retry-after", "Sun, 06 Nov 1994 08:49:37 GMT".into())]),
        1 => Reply::WithHeaders(429, vec![("retry-after", "0".into())]),
        2 => Reply::WithHeaders(503, vec![("retry-after", "soon".into())]),
        _ => Reply::Status(204),
    })
    .await;
    let mut w = webhook("lab", &rx.url);
    w.retry.initial_delay = Duration::from_millis(400);
    w.retry.max_delay = Duration::from_secs(10);
    let vw = h.start(h.config_with(vec![w])).await;
    h.api.apply(lb_service("shop", "web", 80));
    wait_accepted(&rx, 1).await;
    let hits = rx.hits();
    let gaps: Vec<Duration> = hits.windows(2).map(|w| w[1].at - w[0].at).collect();
    // Our backoff after failure n is 400 ms × 2^(n-1), plus up to as much again of jitter.
    for (n, gap) in gaps.iter().enumerate() {
        let ours = Duration::from_millis(400 << n);
        assert!(*gap >= ours, "attempt {} came {gap:?} after the one before, sooner than our {ours:?}", n + 2);
    }
    assert_eq!(gaps.len(), 3);
    vw.stop().await.unwrap();
}

/// A 429 or 503 with `Retry-After` slows the whole endpoint: the other Services' deliveries wait
/// until then too; the API and a metric show it.
#[tokio::test]
async fn a_429_or_503_with_retry_after_holds_every_delivery_to_the_endpoint() {
    for status in [429, 503] {
        let h = Harness::new().await;
        let rx = Receiver::start(move |i, _| {
            if i == 0 { Reply::WithHeaders(status, vec![("retry-after", "2".into())]) } else { Reply::Status(204) }
        })
        .await;
        let mut w = webhook("lab", &rx.url);
        w.retry.max_delay = Duration::from_secs(10);
        let vw = h.start(h.config_with(vec![w])).await;
        let api = common::api::Api::new(&vw);
        h.api.apply(lb_service("shop", "a", 80));
        let throttled = wait_until("the endpoint throttled", || async {
            let dto = api.ok("/api/v1/webhooks/lab").await;
            dto["throttled_until"].as_str().map(str::to_owned)
        })
        .await;
        // Another Service's first delivery, due at once, waits for the throttle as well.
        h.api.apply(lb_service("shop", "b", 81));
        wait_accepted(&rx, 2).await;
        let hits = rx.hits();
        let first = hits[0].at;
        for hit in &hits[1..] {
            assert!(
                hit.at - first >= Duration::from_secs(2),
                "{status}: a delivery went out {:?} after",
                hit.at - first
            );
        }
        let until = throttled.parse::<jiff::Timestamp>().unwrap().as_millisecond();
        assert!(until > 0);
        let metrics = api.get("/metrics").await.text;
        assert!(metrics.contains("vipwatch_webhook_throttles_total{webhook=\"lab\"} 1"), "{metrics}");
        vw.stop().await.unwrap();
    }
}

/// A receiver's own reason for refusing (an RFC 9457 `detail`) reaches every place that shows the
/// failure: the attempt's error, the delivery log and the Service's endpoint state.
#[tokio::test]
async fn a_receivers_reason_is_in_the_attempt_and_the_services_endpoint_state() {
    let h = Harness::new().await;
    let detail = "127.0.100.0:8080 is already bound by cluster a's Service eval/web";
    let problem = json!({"type": "about:blank", "title": "Unprocessable Entity", "status": 422, "detail": detail});
    let rx = Receiver::start(move |_, _| Reply::Body(422, problem.to_string())).await;
    let vw = h.start(h.config_with(vec![webhook("lab", &rx.url)])).await;
    let api = common::api::Api::new(&vw);
    h.api.apply(lb_service("eval", "web", 8080));
    let shown = wait_until("the failure shown on the Service", || async {
        let answer = api.get("/api/v1/services/eval/web").await;
        let detail: serde_json::Value = serde_json::from_str(&answer.text).ok()?;
        detail["deliveries"][0]["last_error"].as_str().map(str::to_owned)
    })
    .await;
    let expected = format!("HTTP 422 Unprocessable Entity: {detail}");
    assert_eq!(shown, expected);
    let row = vw.store.deliveries(&DeliveryFilter::default()).await.unwrap()[0].clone();
    let attempts = vw.store.attempts(row.id).await.unwrap();
    assert_eq!(attempts[0].error.as_deref(), Some(expected.as_str()));
    vw.stop().await.unwrap();
}

/// Values from outside are kept within a bound, the cut marked: a 5,000-character `Location`.
#[tokio::test]
async fn a_long_location_is_kept_within_its_bound_with_a_marker() {
    let h = Harness::new().await;
    let location = format!("https://elsewhere.example/{}", "a".repeat(5034));
    let shown = location.clone();
    let rx = Receiver::start(move |i, _| {
        if i == 0 { Reply::WithHeaders(302, vec![("location", shown.clone())]) } else { Reply::Status(204) }
    })
    .await;
    let vw = h.start(h.config_with(vec![webhook("lab", &rx.url)])).await;
    h.api.apply(lb_service("shop", "web", 80));
    wait_accepted(&rx, 1).await;
    let row = vw.store.deliveries(&DeliveryFilter::default()).await.unwrap()[0].clone();
    let attempts = vw.store.attempts(row.id).await.unwrap();
    let kept = attempts[0].location.clone().unwrap();
    let marker = format!("…[cut from {} bytes]", location.len());
    assert_eq!(kept, format!("{}{marker}", &location[..1024 - marker.len()]));
    assert_eq!(kept.len(), 1024);
    vw.stop().await.unwrap();
}

#[tokio::test]
async fn timeout_redirect_and_endless_body_are_logged_and_retried() {
    let h = Harness::new().await;
    let rx = Receiver::start(|i, _| match i {
        0 => Reply::Hang,
        1 => Reply::WithHeaders(302, vec![("location", "https://elsewhere.example/hook".into())]),
        2 => Reply::Endless(500),
        _ => Reply::Endless(200),
    })
    .await;
    let mut w = webhook("lab", &rx.url);
    w.timeout = Duration::from_millis(500);
    let vw = h.start(h.config_with(vec![w])).await;
    h.api.apply(lb_service("shop", "web", 80));
    wait_hits(&rx, 4).await;
    let row = wait_until("delivered", || async {
        let rows = vw.store.deliveries(&DeliveryFilter::default()).await.unwrap();
        (rows[0].state == "succeeded").then(|| rows[0].clone())
    })
    .await;
    let attempts = vw.store.attempts(row.id).await.unwrap();
    let classes: Vec<(Option<i64>, Option<String>)> =
        attempts.iter().map(|a| (a.status_code, a.error_class.clone())).collect();
    assert_eq!(
        classes,
        vec![
            (None, Some("timeout".into())),
            (Some(302), Some("redirect".into())),
            (Some(500), Some("http".into())),
            (Some(200), None)
        ]
    );
    assert_eq!(attempts[1].location.as_deref(), Some("https://elsewhere.example/hook"));
    let body = attempts[2].response_body.clone().unwrap();
    assert_eq!(body.len(), 4096, "at most 4 KiB kept");
    assert!(body.ends_with("…[cut from 65536 bytes]"), "the cut is marked: {}", &body[4000..]);
    assert!(
        attempts[3].duration_ms < 500,
        "an endless 2xx body does not hold the worker: {} ms",
        attempts[3].duration_ms
    );
    vw.stop().await.unwrap();
}

#[tokio::test]
async fn a_410_disables_the_endpoint_until_it_is_re_enabled() {
    let h = Harness::new().await;
    let rx = Receiver::start(|i, _| if i == 0 { Reply::Status(410) } else { Reply::Status(204) }).await;
    let vw = h.start(h.config_with(vec![webhook("lab", &rx.url)])).await;
    h.api.apply(lb_service("shop", "web", 80));
    let state = wait_until("endpoint disabled", || async { vw.store.webhook_state("lab").await.unwrap() }).await;
    assert_eq!(state.disabled_reason.as_deref(), Some("receiver answered 410 Gone"));
    assert_eq!(state.disabled_url.as_deref(), Some(rx.url.as_str()));
    h.api.apply(lb_service("shop", "api", 81));
    wait_events(&vw.store, 2).await;
    let pending =
        vw.store.deliveries(&DeliveryFilter { state: Some("pending".into()), ..Default::default() }).await.unwrap();
    assert_eq!(pending.len(), 2, "deliveries wait while the endpoint is disabled");
    assert_eq!(rx.hits().len(), 1);

    assert!(vw.store.enable_webhook("lab").await.unwrap());
    let accepted = wait_accepted(&rx, 2).await;
    let names: Vec<String> =
        accepted.iter().map(|h| h.json()["data"]["service"]["name"].as_str().unwrap().to_owned()).collect();
    assert_eq!(names, vec!["web", "api"]);
    vw.stop().await.unwrap();
}

#[tokio::test]
async fn per_service_order_holds_while_the_receiver_fails_every_other_request() {
    let h = Harness::new().await;
    let rx = Receiver::start(|i, _| if i % 2 == 0 { Reply::Status(503) } else { Reply::Status(200) }).await;
    let vw = h.start(h.config_with(vec![webhook("lab", &rx.url)])).await;
    h.api.apply(lb_service("shop", "web", 80));
    for port in 1..=20 {
        h.api.update("shop", "web", |o| o["spec"]["ports"][0]["port"] = json!(8000 + port));
    }
    assert!(h.api.delete("shop", "web"));
    let recorded = wait_events(&vw.store, 22).await;
    let accepted = wait_until("DELETED delivered", || async {
        let a = rx.accepted();
        (a.last().map(|h| h.event().0) == Some("DELETED".into())).then_some(a)
    })
    .await;
    let events: Vec<(String, i64)> = accepted.iter().map(|h| h.event()).collect();
    assert_eq!(events.last().unwrap().0, "DELETED");
    let ids: Vec<i64> = events.iter().map(|e| e.1).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "strictly in event order: {ids:?}");

    // Every event was either delivered or superseded, never both, never lost. A MODIFIED that
    // found the queue's last pending delivery an untouched MODIFIED went into that row instead of
    // a row of its own (outbox `REWRITE`), so it is the older event that has no row: which ones do
    // depends on how the changes fell into the watch's batches.
    let rows = wait_recorded(&vw.store).await;
    let with_rows: Vec<i64> = rows.iter().map(|r| r.event_id.unwrap()).collect();
    let rewritten: Vec<_> = recorded.iter().filter(|e| !with_rows.contains(&e.id)).collect();
    for e in &rewritten {
        assert_eq!(e.event_type, "MODIFIED", "event {} has no delivery", e.id);
        assert!(!ids.contains(&e.id), "event {} was rewritten and delivered", e.id);
    }
    assert_eq!(with_rows.len() + rewritten.len(), 22, "one row per event at most");
    for row in &rows {
        let delivered = ids.contains(&row.event_id.unwrap());
        match row.state.as_str() {
            "succeeded" => assert!(delivered),
            // The DELETED carries the whole state, so it may supersede even the retrying ADDED.
            "superseded" => assert!(!delivered && row.kind != "DELETED", "{} {}", row.id, row.kind),
            other => panic!("delivery {} is {other}", row.id),
        }
    }
    assert!(
        !rewritten.is_empty() || rows.iter().any(|r| r.state == "superseded"),
        "MODIFIEDs queued behind a retrying head collapse"
    );
    assert_eq!(rx.hits().len(), accepted.len() * 2, "nothing sent after DELETED");
    vw.stop().await.unwrap();
}

#[tokio::test]
async fn a_dead_endpoint_does_not_delay_a_healthy_one() {
    let h = Harness::new().await;
    let healthy = Receiver::ok().await;
    let refused = Refused::new();
    let dead_url = format!("http://{}/hook", refused.addr);
    let vw = h.start(h.config_with(vec![webhook("dead", &dead_url), webhook("healthy", &healthy.url)])).await;
    for i in 0..50 {
        h.api.apply(lb_service("shop", &format!("svc-{i:02}"), 80));
    }
    let accepted = tokio::time::timeout(Duration::from_secs(10), wait_accepted(&healthy, 50))
        .await
        .expect("healthy endpoint gets all 50 on time");
    assert_eq!(accepted.len(), 50);
    let dead =
        vw.store.deliveries(&DeliveryFilter { webhook: Some("dead".into()), ..Default::default() }).await.unwrap();
    assert_eq!(dead.len(), 50);
    assert!(dead.iter().all(|d| d.state == "pending"));
    // The healthy endpoint may be done before the dead one recorded its first attempts (its rounds
    // come every 5 ms while it is backlogged): wait for one.
    let first = wait_until("an attempt of the dead endpoint recorded", || async {
        for d in &dead {
            let attempts = vw.store.attempts(d.id).await.unwrap();
            if !attempts.is_empty() {
                return Some(attempts);
            }
        }
        None
    })
    .await;
    assert_eq!(first[0].error_class.as_deref(), Some("connect"));
    vw.stop().await.unwrap();
    let _ = WAIT;
}

#[tokio::test]
async fn resync_enqueues_one_synced_delivery_per_service() {
    let h = Harness::new().await;
    let rx = Receiver::ok().await;
    h.api.apply(lb_service("shop", "a", 80));
    h.api.apply(lb_service("shop", "b", 81));
    let config = h.config_with(vec![webhook("lab", &rx.url)]);
    let vw = h.start(config.clone()).await;
    wait_accepted(&rx, 2).await;
    let counts = vipwatch::route::resync(&vw.store, &config, Some("lab")).await.unwrap();
    assert_eq!(counts, vec![("lab".to_owned(), 2)]);
    let hits = wait_accepted(&rx, 5).await;
    // (type, cause, name, sync index, sync total), plus one sync.completed with the same id.
    let mut synced: Vec<(String, String, String, Option<u64>, u64)> = hits[2..]
        .iter()
        .map(|h| {
            let v = h.json();
            let sync = &v["data"]["sync"];
            (
                s(v["type"].as_str().unwrap()),
                s(v["data"]["cause"].as_str().unwrap()),
                s(v["data"]["service"]["name"].as_str().unwrap_or("")),
                sync["index"].as_u64(),
                sync["total"].as_u64().unwrap(),
            )
        })
        .collect();
    synced.sort();
    assert_eq!(
        synced,
        vec![
            (s("service.synced"), s("resync"), s("a"), Some(1), 2),
            (s("service.synced"), s("resync"), s("b"), Some(2), 2),
            (s("sync.completed"), s("resync"), s(""), None, 2),
        ]
    );
    let ids: std::collections::BTreeSet<String> =
        hits[2..].iter().map(|h| s(h.json()["data"]["sync"]["id"].as_str().unwrap())).collect();
    assert_eq!(ids.len(), 1, "one resync, one id: {ids:?}");
    assert!(ids.iter().all(|id| id.starts_with("sync_") && id.len() == 37), "{ids:?}");
    let err = vipwatch::route::resync(&vw.store, &config, Some("nope")).await.unwrap_err();
    assert_eq!(err.to_string(), "no enabled webhook named `nope` in the configuration");
    vw.stop().await.unwrap();
}

#[tokio::test]
async fn graceful_stop_waits_for_attempts_in_flight_within_the_grace_period() {
    let h = Harness::new().await;
    let rx = Receiver::start(|_, _| Reply::After(Duration::from_millis(600), 204)).await;
    let mut config = h.config_with(vec![webhook("lab", &rx.url)]);
    config.relay.shutdown_grace = Duration::from_secs(5);
    let vw = h.start(config).await;
    h.api.apply(lb_service("shop", "web", 80));
    wait_hits(&rx, 1).await; // the attempt is in flight now
    vw.stop().await.unwrap();
    // stop() closed the database; reopen it to read what was recorded.
    let store = h.store().await;
    let rows = store.deliveries(&DeliveryFilter::default()).await.unwrap();
    assert_eq!((rows[0].state.as_str(), rows[0].attempts), ("succeeded", 1), "the in-flight attempt finished");
}

#[tokio::test]
async fn graceful_stop_leaves_an_attempt_outlasting_the_grace_period_pending() {
    let h = Harness::new().await;
    let rx = Receiver::start(|_, _| Reply::Hang).await;
    let mut w = webhook("lab", &rx.url);
    w.timeout = Duration::from_secs(4);
    let mut config = h.config_with(vec![w]);
    config.relay.shutdown_grace = Duration::from_millis(300);
    let vw = h.start(config).await;
    h.api.apply(lb_service("shop", "web", 80));
    wait_hits(&rx, 1).await;
    let started = std::time::Instant::now();
    vw.stop().await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(3), "stop took {:?}", started.elapsed());
    let store = h.store().await;
    let rows = store.deliveries(&DeliveryFilter::default()).await.unwrap();
    assert_eq!((rows[0].state.as_str(), rows[0].attempts), ("pending", 0), "left pending, sent again at next start");
    assert_eq!(store.attempts(rows[0].id).await.unwrap().len(), 0);
}

/// A `MODIFIED` whose attempt was in flight when vipwatch stopped (its outcome never recorded; the
/// receiver may well have applied it) goes out again after the restart under the same `webhook-id`.
/// A newer change queued after the restart must go out under a `webhook-id` of its own: receivers
/// dedupe on it (README, "Delivery guarantees"), so under the old one a receiver answers `duplicate`
/// and never applies the newer change, which vipwatch then counts as delivered.
#[tokio::test]
async fn a_change_after_a_restart_never_takes_the_webhook_id_of_an_attempt_in_flight_at_the_stop() {
    let h = Harness::new().await;
    // The first MODIFIED reaches the receiver and is never answered.
    let rx = Receiver::start(|i, _| if i == 1 { Reply::Hang } else { Reply::Status(204) }).await;
    let mut lab = webhook("lab", &rx.url);
    lab.timeout = Duration::from_secs(4);
    let url = vipwatch::config::redact_url(&lab.url);
    let mut config = h.config_with(vec![lab]);
    config.relay.shutdown_grace = Duration::from_millis(300);

    let vw = h.start(config.clone()).await;
    h.api.apply(lb_service("shop", "web", 80));
    wait_accepted(&rx, 1).await;
    h.api.update("shop", "web", |o| o["spec"]["ports"][0]["port"] = json!(8001));
    wait_hits(&rx, 2).await; // in flight
    // Disabled (as by a 410) so that after the restart nothing goes out before the newer change is queued.
    vw.store.disable_webhook("lab", "receiver answered 410 Gone", &url).await.unwrap();
    vw.stop().await.unwrap();

    let vw = h.start(config).await;
    h.api.update("shop", "web", |o| o["spec"]["ports"][0]["port"] = json!(8002));
    let ids: Vec<i64> = wait_events(&vw.store, 3).await.iter().map(|e| e.id).collect();
    wait_until("the newer change queued", || async {
        deliveries_of(&vw.store, "web").await.iter().any(|r| r.event_id == Some(ids[2])).then_some(())
    })
    .await;
    assert!(vw.store.enable_webhook("lab").await.unwrap());
    let hits = wait_hits(&rx, 3).await;

    let sent: Vec<(String, i64)> = hits.iter().map(receiver::Hit::event).collect();
    assert_eq!(sent, [(s("ADDED"), ids[0]), (s("MODIFIED"), ids[1]), (s("MODIFIED"), ids[2])]);
    let webhook_ids: std::collections::BTreeSet<String> = hits.iter().map(|hit| hit.header("webhook-id")).collect();
    assert_eq!(webhook_ids.len(), 3, "three bodies, three webhook-ids: {sent:?} under {webhook_ids:?}");
    vw.stop().await.unwrap();
}

#[tokio::test]
async fn retention_prunes_old_events_and_finished_deliveries_but_never_pending_ones() {
    let h = Harness::new().await;
    let ok = Receiver::ok().await;
    let refused = Refused::new();
    let dead_url = format!("http://{}/hook", refused.addr);
    let vw = h.start(h.config_with(vec![webhook("ok", &ok.url), webhook("dead", &dead_url)])).await;
    h.api.apply(lb_service("shop", "web", 80));
    wait_accepted(&ok, 1).await;
    let delivered = wait_until("delivery recorded", || async {
        let rows =
            vw.store.deliveries(&DeliveryFilter { webhook: Some("ok".into()), ..Default::default() }).await.unwrap();
        (rows[0].state == "succeeded").then(|| rows[0].id)
    })
    .await;
    let future = jiff::Timestamp::now().as_millisecond() + 60_000;
    assert_eq!(vw.store.prune_events(future).await.unwrap(), 1);
    let rows = vw.store.deliveries(&DeliveryFilter::default()).await.unwrap();
    let left: Vec<(String, String)> = rows.iter().map(|r| (r.webhook.clone(), r.state.clone())).collect();
    assert_eq!(left, vec![(s("dead"), s("pending"))], "pending deliveries survive pruning");
    assert_eq!(vw.store.attempts(delivered).await.unwrap().len(), 0, "attempts go with their delivery");
    vw.stop().await.unwrap();
}

#[tokio::test]
async fn an_endpoint_with_its_own_concurrency_has_no_more_deliveries_in_flight() {
    let h = Harness::new().await;
    let (stuck, fast) = (Receiver::start(|_, _| Reply::Hang).await, Receiver::ok().await);
    let mut narrow = webhook("narrow", &stuck.url);
    narrow.concurrency = Some(2);
    narrow.timeout = Duration::from_secs(30);
    let mut config = h.config_with(vec![narrow, webhook("wide", &fast.url)]);
    config.relay.lease = Duration::from_secs(60);
    let _vw = h.start(config).await;
    for i in 0..5 {
        h.api.apply(lb_service("shop", &format!("web-{i}"), 80));
    }
    wait_hits(&fast, 5).await; // `wide` (relay.concurrency) sends all five at once
    wait_hits(&stuck, 2).await;
    let seen: Vec<(String, String)> = stuck
        .hits()
        .iter()
        .map(|h| (h.header("webhook-id"), h.json()["data"]["service"]["name"].to_string()))
        .collect();
    assert_eq!(stuck.hits().len(), 2, "`narrow` holds two in flight and waits: {seen:?}");
}

/// A pending `MODIFIED` at the head of its Service's queue that no attempt has touched takes a newer
/// change in place, keeping its place in line: while the endpoint is disabled (one slot), `web`
/// changes, `db` is created, `web` changes again; the one `MODIFIED` row now carries the newer event
/// (same id and due time, the newer one's `webhook-id`), and once enabled `web`'s newest change goes out before `db`'s
/// ADDED and its older change not at all (a stale head that waited for its turn and was sent would
/// send the newer change to the back of the line).
#[tokio::test]
async fn an_untouched_modified_head_collapses_into_a_newer_one_that_keeps_its_place_in_line() {
    let h = Harness::new().await;
    // The second request, `api`'s ADDED, disables the endpoint.
    let rx = Receiver::start(|i, _| if i == 1 { Reply::Status(410) } else { Reply::Status(204) }).await;
    let mut lab = webhook("lab", &rx.url);
    lab.concurrency = Some(1);
    let vw = h.start(h.config_with(vec![lab])).await;
    h.api.apply(lb_service("shop", "web", 80));
    wait_accepted(&rx, 1).await;
    h.api.apply(lb_service("shop", "api", 81));
    wait_until("endpoint disabled", || async {
        vw.store.webhook_state("lab").await.unwrap().and_then(|s| s.disabled_reason)
    })
    .await;

    h.api.update("shop", "web", |o| o["spec"]["ports"][0]["port"] = json!(8001));
    let older = wait_delivery(&vw.store, "web", "MODIFIED", 1).await.remove(0);
    // `db`'s ADDED must be enqueued (or let go by the finalizer) a millisecond later at least.
    wait_until("the clock past the older change's enqueueing", || async {
        (jiff::Timestamp::now().as_millisecond() > older.next_attempt_at).then_some(())
    })
    .await;
    h.api.apply(lb_service("shop", "db", 82));
    let db = wait_until("db's ADDED let go by the finalizer", || async {
        let rows = deliveries_of(&vw.store, "db").await;
        rows.iter().find(|r| r.kind == "ADDED" && r.next_attempt_at > older.next_attempt_at).cloned()
    })
    .await;
    h.api.update("shop", "web", |o| o["spec"]["ports"][0]["port"] = json!(8002));
    let newer = wait_until("web's MODIFIED carrying the newer change", || async {
        let rows = wait_delivery(&vw.store, "web", "MODIFIED", 1).await;
        rows.into_iter().find(|r| r.event_id > older.event_id)
    })
    .await;

    let web = deliveries_of(&vw.store, "web").await;
    let states: Vec<(&str, &str)> = web.iter().map(|r| (r.kind.as_str(), r.state.as_str())).collect();
    assert_eq!(states, [("ADDED", "succeeded"), ("MODIFIED", "pending")]);
    assert_eq!(
        (newer.id, newer.next_attempt_at, newer.attempts),
        (older.id, older.next_attempt_at, 0),
        "the row the older change queued takes the newer one"
    );
    assert_ne!(newer.msg_id, older.msg_id, "with a webhook-id of its own");
    assert!(db.next_attempt_at > newer.next_attempt_at);

    assert!(vw.store.enable_webhook("lab").await.unwrap());
    let accepted = wait_accepted(&rx, 4).await;
    let sent: Vec<(String, String, i64)> = accepted
        .iter()
        .map(|hit| {
            let v = hit.json();
            let (event, id) = hit.event();
            (v["data"]["service"]["name"].as_str().unwrap().to_owned(), event, id)
        })
        .collect();
    let expected = [
        ("web".to_owned(), "ADDED".to_owned(), web[0].event_id.unwrap()),
        ("api".to_owned(), "ADDED".to_owned(), sent[1].2),
        ("web".to_owned(), "MODIFIED".to_owned(), newer.event_id.unwrap()),
        ("db".to_owned(), "ADDED".to_owned(), db.event_id.unwrap()),
    ];
    assert_eq!(sent, expected);
    vw.stop().await.unwrap();
}

/// An attempt still running at nine tenths of `relay.lease` is cut off, recorded as a `timeout` and
/// retried, so it never outlives its lease: past it, the delivery would count as not in flight, and
/// a newer change could be sent while it still is (found by a new user with a request template of
/// four requests, each within its `timeout`, against a 1.5 s lease). Here three requests, each
/// answered after 0.9 s: the attempt would take 2.7 s; it is cut off 1.35 s after its claim, during the
/// second.
#[tokio::test]
async fn an_attempt_that_would_outlive_its_lease_is_cut_off_and_retried() {
    let h = Harness::new().await;
    let rx = Receiver::start(|_, _| Reply::After(Duration::from_millis(900), 204)).await;
    let mut config = h.config_with(vec![three_requests(&rx.url)]);
    config.relay.lease = Duration::from_millis(1500);
    let vw = h.start(config).await;
    h.api.apply(lb_service("shop", "web", 80));
    let added = wait_delivery(&vw.store, "web", "ADDED", 1).await.remove(0);
    let attempts = wait_until("the first attempt recorded", || async {
        let attempts = vw.store.attempts(added.id).await.unwrap();
        (!attempts.is_empty()).then_some(attempts)
    })
    .await;
    let first = &attempts[0];
    let cut_off = "attempt cut off at nine tenths of relay.lease after its claim, so that it is recorded while leased";
    assert_eq!((first.error_class.as_deref(), first.error.as_deref()), (Some("timeout"), Some(cut_off)));
    assert!((1300..1500).contains(&first.duration_ms), "cut off within the lease: {} ms", first.duration_ms);
    let requests: Vec<String> = rx.hits().iter().map(|hit| hit.json()["step"].to_string()).collect();
    assert_eq!(requests[..2], ["1", "2"], "the attempt was cut off during its second request");
    vw.stop().await.unwrap();
}

/// An endpoint whose request template sends three PUTs per change (`/s1`…`/s3`, body `{"step": i}`).
fn three_requests(url: &str) -> vipwatch::config::WebhookConfig {
    let mut toml = format!(
        "name = \"chain\"\nurl = \"{url}\"\ntimeout = \"1s\"\n[template]\nmode = \"event\"\n\
         like = {{ MODIFIED = \"ADDED\", SYNCED = \"ADDED\" }}\n"
    );
    for step in 1..=3 {
        toml.push_str(&format!(
            "[[template.on.ADDED]]\nmethod = \"PUT\"\nurl = \"/s{step}\"\nbody = '{{\"step\": {step}}}'\n\
             success = [200, 204]\n"
        ));
    }
    toml.push_str("[[template.on.DELETED]]\nmethod = \"DELETE\"\nurl = \"/s1\"\nsuccess = [200, 204]\n");
    let mut w: vipwatch::config::WebhookConfig = toml::from_str(&toml).unwrap_or_else(|e| panic!("{e}\n{toml}"));
    w.retry = webhook("chain", url).retry;
    w
}

/// The deliveries of Service `shop/name`, oldest first.
async fn deliveries_of(store: &Store, name: &str) -> Vec<DeliveryRow> {
    let rows = store.deliveries(&DeliveryFilter::default()).await.unwrap();
    let mut rows: Vec<DeliveryRow> = rows.into_iter().filter(|r| r.key.name == name).collect();
    rows.sort_by_key(|r| r.id);
    rows
}

/// Waits for `n` deliveries of kind `kind` of Service `shop/name`; returns them, oldest first.
async fn wait_delivery(store: &Store, name: &str, kind: &str, n: usize) -> Vec<DeliveryRow> {
    wait_until(&format!("{n} {kind} of {name}"), || async {
        let rows: Vec<DeliveryRow> = deliveries_of(store, name).await.into_iter().filter(|r| r.kind == kind).collect();
        (rows.len() >= n).then_some(rows)
    })
    .await
}

/// A receiver that refuses every `ADDED` for good (422) and takes everything else.
async fn refusing_added() -> Receiver {
    Receiver::start(|_, hit| if hit.event().0 == "ADDED" { Reply::Status(422) } else { Reply::Status(204) }).await
}

#[tokio::test]
async fn a_deleted_service_whose_added_is_refused_is_deleted_without_waiting_a_day() {
    let h = Harness::new().await;
    let rx = refusing_added().await;
    let vw = h.start(h.config_with(vec![webhook("lab", &rx.url)])).await;
    h.api.apply(lb_service("shop", "web", 80));
    wait_hits(&rx, 2).await; // the ADDED, refused, and retried
    assert!(h.api.delete("shop", "web"));
    // The DELETED carries the whole last state: the refused ADDED before it is superseded, the DELETED
    // goes out, and the finalizer comes off, so the object goes away.
    wait_until("the DELETED delivered", || async {
        rx.accepted().iter().any(|hit| hit.event().0 == "DELETED").then_some(())
    })
    .await;
    wait_until("the Service gone from the apiserver", || async { h.api.get("shop", "web").is_none().then_some(()) })
        .await;
    let rows = vw.store.deliveries(&DeliveryFilter::default()).await.unwrap();
    let states: Vec<(&str, &str)> = rows.iter().map(|r| (r.kind.as_str(), r.state.as_str())).collect();
    assert_eq!(states, [("ADDED", "superseded"), ("DELETED", "succeeded")]);
    vw.stop().await.unwrap();
}

#[tokio::test]
async fn a_resync_is_not_held_back_by_a_delivery_the_receiver_refuses() {
    let h = Harness::new().await;
    let rx = refusing_added().await;
    let config = h.config_with(vec![webhook("lab", &rx.url)]);
    let vw = h.start(config.clone()).await;
    h.api.apply(lb_service("shop", "web", 80));
    wait_hits(&rx, 2).await;
    vipwatch::route::resync(&vw.store, &config, Some("lab")).await.unwrap();
    wait_until("the resync delivered", || async {
        let kinds: Vec<String> = rx.accepted().iter().map(|hit| s(hit.json()["type"].as_str().unwrap())).collect();
        (kinds.contains(&s("service.synced")) && kinds.contains(&s("sync.completed"))).then_some(())
    })
    .await;
    let rows = vw.store.deliveries(&DeliveryFilter::default()).await.unwrap();
    let added = rows.iter().find(|r| r.kind == "ADDED").unwrap();
    assert_eq!(added.state, "superseded", "the SYNCED carries the whole state the ADDED had");
    vw.stop().await.unwrap();
}

/// Every error class the relay can give an attempt is one the database accepts: a class the schema
/// refuses would leave the outcome unrecordable and the endpoint stuck behind it (found by a trial with a
/// webhook host resolving to 169.254.169.254: `forbidden_address` broke the CHECK constraint).
#[tokio::test]
async fn every_attempt_error_class_is_recorded() {
    use vipwatch::store::{AttemptRecord, Completion, ERROR_CLASSES, Outcome, now_ms};
    let h = Harness::new().await;
    let rx = Receiver::start(|_, _| Reply::Status(503)).await;
    let vw = h.start(h.config_with(vec![webhook("lab", &rx.url)])).await;
    h.api.apply(lb_service("shop", "web", 80));
    let delivery = wait_until("a pending delivery", || async {
        let rows = vw.store.deliveries(&DeliveryFilter::default()).await.unwrap();
        rows.first().map(|d| d.id)
    })
    .await;
    let done: Vec<Completion> = ERROR_CLASSES
        .iter()
        .map(|class| Completion {
            delivery_id: delivery,
            attempt: AttemptRecord {
                started_at: now_ms(),
                error_class: Some(class),
                error: Some(format!("class test {class}")),
                ..AttemptRecord::default()
            },
            outcome: Outcome::Retry(now_ms() + 60_000),
            told: None,
        })
        .collect();
    vw.store.complete(&done).await.expect("every class is accepted");
    let recorded: Vec<String> = vw
        .store
        .attempts(delivery)
        .await
        .unwrap()
        .into_iter()
        .filter(|a| a.error.as_deref().is_some_and(|e| e.starts_with("class test ")))
        .filter_map(|a| a.error_class)
        .collect();
    assert_eq!(recorded, ERROR_CLASSES);
    vw.stop().await.unwrap();
}

/// A resync takes its snapshot of the state table in the transaction that enqueues it, so a change
/// recorded while it runs is neither superseded by a `service.synced` that does not carry it (a
/// lost update: the receiver keeps the older state) nor delivered before a `service.synced` that
/// carries the state before it (found by a new user: a Service changed every 2 ms beside resyncs
/// left its receiver stale in 8 of 12 rounds). Each round starts a resync of 400 Services, changes
/// `shop/web`'s port at a slightly different point of it, and waits until nothing is pending: the
/// receiver's last `shop/web` body carries the new port, and the ports it got never go back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_made_while_a_resync_runs_is_neither_lost_nor_overtaken() {
    let h = Harness::new().await;
    let rx = Receiver::ok().await;
    let config = h.config_with(vec![webhook("lab", &rx.url)]);
    let vw = h.start(config.clone()).await;
    for i in 0..400 {
        h.api.apply(lb_service("load", &format!("s{i}"), 80));
    }
    h.api.apply(lb_service("shop", "web", 80));
    let web_port = |hit: &receiver::Hit| {
        let v = hit.json();
        (v["data"]["service"]["name"] == "web").then(|| v["data"]["service"]["ports"][0]["port"].as_i64().unwrap())
    };
    for round in 0..8u64 {
        let (store, cfg) = (vw.store.clone(), config.clone());
        let resync = tokio::spawn(async move { vipwatch::route::resync(&store, &cfg, None).await.unwrap() });
        // ok: not a synchronisation; it puts the change at a different point of the resync each round.
        tokio::time::sleep(Duration::from_millis(1 + (round % 4) * 3)).await;
        let want = 1000 + round as i64;
        h.api.apply(lb_service("shop", "web", want));
        resync.await.unwrap();
        wait_until("the change recorded and nothing pending", || async {
            let rows = vw.store.deliveries(&DeliveryFilter::default()).await.unwrap();
            let recorded = rows.iter().any(|d| d.key.name == "web" && d.payload.contains(&format!("\"port\":{want}")));
            (recorded && rows.iter().all(|d| d.state != "pending")).then_some(())
        })
        .await;
        let got: Vec<i64> = rx.accepted().iter().filter_map(web_port).collect();
        assert_eq!(got.last(), Some(&want), "round {round}: the receiver's last shop/web body");
        assert!(got.windows(2).all(|w| w[0] <= w[1]), "round {round}: shop/web's ports went back: {got:?}");
    }
    vw.stop().await.unwrap();
}

/// A Service whose deliveries wait for vipwatch's finalizer (its patch held by the apiserver): a
/// resync's `service.synced` supersedes its held ADDED and waits too, so nothing of it goes out
/// before the finalizer is on (found by a new user: the `service.synced` was inserted not held and
/// went out at once). Another Service's `service.synced` of the same resync goes out meanwhile.
#[tokio::test]
async fn a_resync_does_not_send_a_service_before_its_finalizer_is_on() {
    let h = Harness::new().await;
    let rx = Receiver::ok().await;
    let config = h.config_with(vec![webhook("lab", &rx.url)]);
    let vw = h.start(config.clone()).await;
    h.api.apply(lb_service("shop", "free", 80));
    wait_accepted(&rx, 1).await;
    h.api.faults().hold_writes_to("gated", true);
    h.api.apply(lb_service("shop", "gated", 81));
    wait_delivery(&vw.store, "gated", "ADDED", 1).await;

    vipwatch::route::resync(&vw.store, &config, None).await.unwrap();
    let synced = |name: &str| {
        rx.accepted()
            .iter()
            .filter(|hit| hit.json()["data"]["service"]["name"] == name)
            .map(|hit| hit.json()["type"].clone())
            .collect::<Vec<_>>()
    };
    wait_until("free's service.synced delivered", || async { (synced("free").len() == 2).then_some(()) }).await;
    assert_eq!(synced("gated"), Vec::<serde_json::Value>::new(), "nothing of gated before its finalizer");
    let gated = |rows: Vec<DeliveryRow>| {
        rows.into_iter().filter(|d| d.key.name == "gated").map(|d| (d.kind, d.state)).collect::<Vec<_>>()
    };
    let rows = vw.store.deliveries(&DeliveryFilter::default()).await.unwrap();
    assert_eq!(gated(rows), [(s("ADDED"), s("superseded")), (s("SYNCED"), s("pending"))]);

    h.api.faults().hold_writes_to("gated", false);
    wait_until("gated delivered", || async { (!synced("gated").is_empty()).then_some(()) }).await;
    assert_eq!(synced("gated"), [json!("service.synced")]);
    let finalizers = h.api.get("shop", "gated").unwrap()["metadata"]["finalizers"].clone();
    assert_eq!(finalizers, json!(["vipwatch.io/cleanup"]));
    vw.stop().await.unwrap();
}

/// A receiver that speaks the identity contract and says it takes `advertised` deliveries at once.
/// It holds each request until as many are in flight as its `release_at` says by arrival (the
/// `n`-th request waits for `release_at(n)`; 2 s at most), and notes the most it saw in flight at
/// once and the deliveries it accepted.
struct Batching {
    url: String,
    most: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Batching {
    async fn start(advertised: usize, release_at: fn(usize) -> usize) -> Self {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

        use axum::response::IntoResponse;
        use vipwatch_contract::receiver::ReceiverIdentity;

        #[derive(Clone, Default)]
        struct Counts {
            arrived: Arc<AtomicUsize>,
            in_flight: Arc<AtomicUsize>,
            most: Arc<AtomicUsize>,
            accepted: Arc<AtomicUsize>,
            changed: Arc<tokio::sync::Notify>,
        }
        let counts = Counts::default();
        let (most, accepted) = (counts.most.clone(), counts.accepted.clone());
        let handler = async move |axum::extract::State(c): axum::extract::State<Counts>| {
            let wanted = release_at(c.arrived.fetch_add(1, SeqCst));
            let now = c.in_flight.fetch_add(1, SeqCst) + 1;
            c.most.fetch_max(now, SeqCst);
            c.changed.notify_waiters();
            let enough = async {
                loop {
                    let next = c.changed.notified();
                    if c.in_flight.load(SeqCst) >= wanted {
                        return;
                    }
                    next.await;
                }
            };
            let _ = tokio::time::timeout(Duration::from_secs(2), enough).await;
            c.in_flight.fetch_sub(1, SeqCst);
            c.accepted.fetch_add(1, SeqCst);
            let id = ReceiverIdentity {
                generation: "gen_1".into(),
                instance: "run_1".into(),
                caught_up: None,
                concurrency: Some(advertised),
            };
            let mut response = axum::http::StatusCode::NO_CONTENT.into_response();
            for (name, value) in id.headers() {
                response.headers_mut().insert(name, value.parse().unwrap());
            }
            response
        };
        let app = axum::Router::new().fallback(axum::routing::post(handler)).with_state(counts);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hooks/vip", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self { url, most, accepted }
    }

    fn most(&self) -> usize {
        self.most.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// A receiver that says how many deliveries it takes at once (the HAProxy agent: one reload for
/// all of them) gets that many in flight, beyond `relay.concurrency`, after its first answers; an
/// endpoint with a `concurrency` of its own keeps it. 96 Services: the first 32 deliveries (all
/// that `relay.concurrency = 32` lets out) are answered together, the other 64 only once all 64 are
/// in flight — which only a dispatcher that took the receiver's word does (otherwise they go after
/// 2 s, 32 at a time).
#[tokio::test]
async fn a_receiver_that_says_it_takes_more_at_once_gets_that_many_unless_the_endpoint_sets_its_own() {
    let h = Harness::new().await;
    let takes_64 = Batching::start(64, |n| if n < 32 { 32 } else { 64 }).await;
    let own_2 = Batching::start(64, |_| 2).await;
    seed_bulk(&h.api, 96);
    // Longer than the receivers hold a request.
    let (mut takes, mut own) = (webhook("takes", &takes_64.url), webhook("own", &own_2.url));
    (takes.timeout, own.timeout) = (Duration::from_secs(5), Duration::from_secs(5));
    own.concurrency = Some(2);
    let mut config = h.config_with(vec![takes, own]);
    config.relay.concurrency = 32;
    // Every delivery claimable from the start: one still waiting for its finalizer when the 64
    // free slots are claimed would leave one free, and the dispatcher claims again only once half
    // are (on PostgreSQL's timing, one run in three).
    config.kubernetes.finalizer = false;
    let vw = h.start(config).await;
    wait_until("every delivery accepted by both", || async {
        (takes_64.accepted() == 96 && own_2.accepted() == 96).then_some(())
    })
    .await;
    assert_eq!(takes_64.most(), 64, "32 at first, then the 64 it asked for");
    assert_eq!(own_2.most(), 2, "the endpoint's own concurrency wins");
    vw.stop().await.unwrap();
}
