//! The SSE live tail: new events arrive within a bounded wait; a reconnect with `Last-Event-ID` resumes
//! exactly after it, without gaps.

mod common;

use std::time::Duration;

use common::api::{Api, assert_problem};
use common::*;
use serde_json::Value;

/// One SSE connection, parsed into `(id, data)` events.
struct Sse {
    body: reqwest::Response,
    buf: String,
}

impl Sse {
    async fn open(base: &str, last_event_id: Option<i64>) -> Self {
        let mut request = reqwest::Client::new().get(format!("{base}/api/v1/events/stream"));
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id.to_string());
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        Self { body: response, buf: String::new() }
    }

    /// The next event, waiting at most 10 s.
    async fn next(&mut self) -> (i64, Value) {
        tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                if let Some(end) = self.buf.find("\n\n") {
                    let block: String = self.buf.drain(..end + 2).collect();
                    let (mut id, mut data) = (None, None);
                    for line in block.lines() {
                        if let Some(v) = line.strip_prefix("id:") {
                            id = Some(v.trim().parse::<i64>().unwrap());
                        } else if let Some(v) = line.strip_prefix("data:") {
                            data = Some(serde_json::from_str::<Value>(v.trim()).unwrap());
                        }
                    }
                    if let (Some(id), Some(data)) = (id, data) {
                        return (id, data);
                    }
                    continue; // a keep-alive comment
                }
                let chunk = self.body.chunk().await.unwrap().expect("stream open");
                self.buf.push_str(std::str::from_utf8(&chunk).unwrap());
            }
        })
        .await
        .expect("an event within 10 s")
    }
}

#[tokio::test]
async fn a_connected_client_sees_new_events_and_resumes_from_last_event_id_without_gaps() {
    let h = Harness::new().await;
    h.api.apply(lb_service("shop", "old", 80));
    let vw = h.start(h.config()).await;
    let base = format!("http://{}", vw.addr);
    let mut live = Sse::open(&base, None).await;

    h.api.apply(lb_service("shop", "web", 80));
    let (id, data) = live.next().await;
    assert_eq!(
        (id, &data["id"], &data["type"], &data["name"]),
        (2, &Value::from(2), &Value::from("ADDED"), &Value::from("web"))
    );
    drop(live);

    for i in 0..5 {
        h.api.apply(lb_service("shop", &format!("svc-{i}"), 80));
    }
    wait_events(&vw.store, 7).await;
    let mut resumed = Sse::open(&base, Some(2)).await;
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(resumed.next().await.0);
    }
    assert_eq!(ids, [3, 4, 5, 6, 7]);
    h.api.delete("shop", "web");
    let (id, data) = resumed.next().await;
    assert_eq!((id, &data["type"]), (8, &Value::from("DELETED")));

    let mut from_start = Sse::open(&base, Some(0)).await;
    assert_eq!(from_start.next().await.0, 1);
    let api = Api::new(&vw);
    let bad = reqwest::Client::new()
        .get(format!("{base}/api/v1/events/stream"))
        .header("last-event-id", "x")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    assert_problem(&api.get("/api/v1/events/stream?type=NOPE").await, 400, "invalid_query");
    drop(from_start);
    tokio::time::timeout(Duration::from_secs(10), vw.stop()).await.expect("stop ends open streams").unwrap();
}
