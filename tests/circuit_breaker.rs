//! The circuit breaker per webhook endpoint over real sockets: 30 Services pending against a receiver
//! that answers 500 → the circuit opens, one probe at a time goes out, and the first answered probe
//! closes it and lets everything go out in order. The probes' timing (the backoff schedule) is
//! asserted on paused time by the breaker's unit tests (`src/relay/circuit.rs`), not here on the wall
//! clock of a loaded machine.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use common::api::Api;
use common::*;
use serde_json::{Value, json};
use vipwatch::config::RetryConfig;
use vipwatch::metrics::{CircuitLabels, WebhookLabels};

/// One request as the receiver saw it.
#[derive(Debug, Clone)]
struct Seen {
    /// Requests in flight at the receiver when it arrived, itself included.
    in_flight: usize,
    status: u16,
    body: Value,
}

#[derive(Clone, Default)]
struct Recorder {
    seen: Arc<Mutex<Vec<Seen>>>,
    in_flight: Arc<AtomicUsize>,
}

/// A receiver on 127.0.0.1:0 answering 500 to its first `failures` requests and 204 after that.
async fn failing_receiver(failures: usize) -> (String, Recorder) {
    async fn handle(State((rec, failures)): State<(Recorder, usize)>, body: Bytes) -> StatusCode {
        let in_flight = rec.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        let status = {
            let mut seen = rec.seen.lock().unwrap();
            let status = if seen.len() < failures { 500 } else { 204 };
            let body = serde_json::from_slice(&body).unwrap();
            seen.push(Seen { in_flight, status, body });
            status
        };
        rec.in_flight.fetch_sub(1, Ordering::SeqCst);
        StatusCode::from_u16(status).unwrap()
    }
    let rec = Recorder::default();
    let app = Router::new().fallback(handle).with_state((rec.clone(), failures));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hooks/vip", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, rec)
}

fn service_of(body: &Value) -> String {
    body["data"]["service"]["name"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn an_endpoint_answering_500_gets_one_probe_at_a_time_then_everything_in_order() {
    const SERVICES: usize = 30;
    const FAILURES: usize = 36; // the first wave (30) opens the circuit; 6 failed probes follow
    let initial = Duration::from_millis(200);
    let h = Harness::new().await;
    for i in 0..SERVICES {
        h.api.apply(lb_service("shop", &format!("web{i:02}"), 80));
    }
    let (url, rec) = failing_receiver(FAILURES).await;
    let mut w = webhook("lab", &url);
    w.retry = RetryConfig {
        max_attempts: 100,
        max_age: Duration::from_secs(600),
        initial_delay: initial,
        max_delay: Duration::from_millis(400),
    };
    let mut config = h.config_with(vec![w]);
    config.relay.circuit_failures = 5;
    let vw = h.start(config).await;
    let api = Api::new(&vw);

    let open = wait_until("the API shows the circuit open", || async {
        let w = api.ok("/api/v1/webhooks/lab").await;
        (w["circuit"] != "closed").then_some(w)
    })
    .await;
    assert!(open["consecutive_failures"].as_u64().unwrap() >= 5, "{open}");
    assert!(open["open_since"].is_string(), "{open}");
    let gauge = WebhookLabels { webhook: "lab".into() };
    assert_eq!(vw.metrics.circuit_open.get(&gauge).map(|g| g.get()), Some(1));
    // While open, a change waits behind its Service's ADDED (per-Service order after recovery).
    for i in 0..3 {
        let mut s = lb_service("shop", &format!("web{i:02}"), 80);
        s["metadata"]["labels"]["tier"] = json!("front");
        h.api.apply(s);
    }

    let accepted = |rec: &Recorder| rec.seen.lock().unwrap().iter().filter(|s| s.status == 204).count();
    wait_until("every ADDED and MODIFIED accepted", || async { (accepted(&rec) == SERVICES + 3).then_some(()) }).await;
    let seen = rec.seen.lock().unwrap().clone();
    let first_ok = seen.iter().position(|s| s.status == 204).unwrap();
    assert_eq!(first_ok, FAILURES, "exactly the scripted failures came first");
    // Each probe is a half-open transition. A probe leaves only when nothing is in flight (attempts
    // started before the circuit opened have all been answered), and nothing goes out beside it: the
    // probes are the last requests up to the first answered one.
    let half_open = CircuitLabels { webhook: "lab".into(), to: "half_open".into() };
    let transitions = |to: &str| {
        let labels = CircuitLabels { to: to.into(), ..half_open.clone() };
        vw.metrics.circuit_transitions.get(&labels).map(|c| c.get())
    };
    let n = transitions("half_open").expect("the circuit went half-open");
    let probes = &seen[first_ok + 1 - usize::try_from(n).unwrap()..=first_ok];
    assert!(probes.len() > FAILURES - SERVICES, "{} probes", probes.len());
    assert!(probes.iter().all(|p| p.in_flight == 1), "one request in flight while open: {probes:?}");
    assert!(probes[..probes.len() - 1].iter().all(|p| p.status == 500), "{probes:?}");
    assert_eq!(transitions("open"), Some(n), "opened once, then again after each failed probe");
    assert_eq!(transitions("closed"), Some(1));

    // After the first 2xx: each Service's ADDED, then (for three of them) its MODIFIED.
    for i in 0..SERVICES {
        let name = format!("web{i:02}");
        let events: Vec<(String, i64)> = seen[first_ok..]
            .iter()
            .filter(|s| service_of(&s.body) == name)
            .map(|s| {
                (s.body["data"]["event"].as_str().unwrap().to_owned(), s.body["data"]["event_id"].as_i64().unwrap())
            })
            .collect();
        let kinds: Vec<&str> = events.iter().map(|e| e.0.as_str()).collect();
        let expected: &[&str] = if i < 3 { &["ADDED", "MODIFIED"] } else { &["ADDED"] };
        assert_eq!(kinds, expected, "{name}");
        assert!(events.windows(2).all(|p| p[0].1 < p[1].1), "{name}: event ids ascend");
    }
    assert_eq!(seen.len(), FAILURES + SERVICES + 3, "no request beyond the schedule and the deliveries");

    let closed = api.ok("/api/v1/webhooks/lab").await;
    assert_eq!(
        (&closed["circuit"], &closed["consecutive_failures"], &closed["open_since"], &closed["next_probe_at"]),
        (&json!("closed"), &json!(0), &Value::Null, &Value::Null)
    );
    assert_eq!(vw.metrics.circuit_open.get(&gauge).map(|g| g.get()), Some(0));
    vw.stop().await.unwrap();
}
