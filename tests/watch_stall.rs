//! A watch behind a network path that stops forwarding bytes without closing anything is noticed
//! (logged, counted, `/readyz` 503), dropped and resumed without loss; repeated 403 answers make
//! `/readyz` say so; every API response says how current its data is.

mod common;

use std::time::Duration;

use common::api::Api;
use common::*;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use vipwatch::model::backends::ModeSetting;

/// A TCP proxy between vipwatch and the fake apiserver that can be switched to blackhole: every
/// connection (open or new) stays open, but no byte is forwarded either way until switched back.
struct BlackholeProxy {
    url: String,
    blackhole: watch::Sender<bool>,
}

impl BlackholeProxy {
    async fn start(upstream: &str) -> Self {
        let upstream = upstream.trim_start_matches("http://").trim_end_matches('/').to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (blackhole, switch) = watch::channel(false);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(&upstream).await else { continue };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(pump(cr, sw, switch.clone()));
                tokio::spawn(pump(sr, cw, switch.clone()));
            }
        });
        Self { url, blackhole }
    }

    fn blackhole(&self, on: bool) {
        self.blackhole.send_replace(on);
    }
}

/// Copies `from` to `to` while the blackhole is off; while on, neither reads nor writes (what was
/// read just before is held until it is off again).
async fn pump(
    mut from: impl AsyncReadExt + Unpin,
    mut to: impl AsyncWriteExt + Unpin,
    mut hole: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if hole.wait_for(|on| !*on).await.is_err() {
            return;
        }
        let n = tokio::select! {
            n = from.read(&mut buf) => match n { Ok(0) | Err(_) => return, Ok(n) => n },
            _ = hole.wait_for(|on| *on) => continue,
        };
        if hole.wait_for(|on| !*on).await.is_err() || to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

async fn status(api: &Api) -> Value {
    api.ok("/api/v1/status").await
}

#[tokio::test]
async fn a_blackholed_watch_is_counted_makes_readyz_fail_and_resumes_without_loss() {
    let h = Harness::new().await;
    let proxy = BlackholeProxy::start(&h.api.url()).await;
    let mut config = h.config_for(&proxy.url);
    config.kubernetes.watch_timeout = Duration::from_secs(2);
    config.kubernetes.list_timeout = Duration::from_secs(2);
    config.kubernetes.stale_after = Duration::from_secs(3);
    config.backends.mode = ModeSetting::None; // the Service watch only
    h.api.apply(lb_service("shop", "a", 80));
    let vw = h.start(config).await;
    let api = Api::new(&vw);
    wait_events(&vw.store, 1).await;
    wait_until("the scope is watching", || async {
        (status(&api).await["scopes"][0]["state"] == "watching").then_some(())
    })
    .await;
    assert_eq!(vw.metrics.watch_error_count("*", "stalled"), 0);

    proxy.blackhole(true);
    h.api.apply(lb_service("shop", "b", 81));
    // Nothing for watch_timeout + 5 s: the watchdog drops the stream.
    wait_until("the stall is counted", || async { (vw.metrics.watch_error_count("*", "stalled") == 1).then_some(()) })
        .await;
    let ready = api.get("/readyz").await;
    assert_eq!(ready.status, 503, "{}", ready.text);
    let detail = ready.body["detail"].as_str().unwrap();
    assert!(
        detail.starts_with("not ready: watch: services in all namespaces not in sync for ")
            && detail.ends_with(" (watch stalled: nothing received for 7s)"),
        "{detail}"
    );
    let answer = api.get("/api/v1/status").await;
    let scope = &answer.body["scopes"][0];
    assert_eq!(scope["state"], "stalled");
    assert_eq!(scope["resource"], "services");
    assert_eq!(scope["namespace"], Value::Null);
    assert_eq!(scope["last_error"], "watch stalled: nothing received for 7s");
    // Known current only up to the stalled stream's last byte, and every response says so.
    assert_eq!(scope["synced_at"], scope["last_activity_at"]);
    assert_eq!(answer.body["last_synced_at"], scope["synced_at"]);
    assert_eq!(answer.headers["x-vipwatch-last-synced"].to_str().unwrap(), scope["synced_at"].as_str().unwrap());
    assert_eq!(answer.body["not_ready"].as_str(), detail.strip_prefix("not ready: watch: "));
    assert_eq!(events(&vw.store).await.len(), 1, "nothing recorded during the stall");

    proxy.blackhole(false);
    let rows = wait_events(&vw.store, 2).await;
    assert_eq!(summary(&rows[1..]), vec![(s("ADDED"), s("watch"), s("shop/b"))]);
    wait_until("ready again", || async { (api.get("/readyz").await.status == 200).then_some(()) }).await;
    h.api.apply(lb_service("shop", "c", 82));
    let rows = wait_events(&vw.store, 3).await;
    assert_eq!(summary(&rows[2..]), vec![(s("ADDED"), s("watch"), s("shop/c"))]);
    assert_eq!(events(&vw.store).await.len(), 3, "the change made during the stall is recorded exactly once");
    assert_eq!(vw.metrics.watch_error_count("*", "stalled"), 1);
    assert_eq!(vw.metrics.watch_error_count("*", "stream"), 0, "a stall is not also counted as a stream error");
    vw.stop().await.unwrap();
}

#[tokio::test]
async fn three_forbidden_lists_in_a_row_make_readyz_fail_with_the_status_until_one_succeeds() {
    let h = Harness::new().await;
    h.api.apply(lb_service("shop", "a", 80));
    let mut config = h.config();
    config.backends.mode = ModeSetting::None; // the Service watch only
    let vw = h.start(config).await;
    let api = Api::new(&vw);
    wait_events(&vw.store, 1).await;
    wait_watching(&h.api).await;

    h.api.faults().fail_requests_with(403, 3);
    h.api.faults().force_gone();
    let ready = wait_until("readyz reports the 403s", || async {
        let a = api.get("/readyz").await;
        (a.status == 503).then_some(a)
    })
    .await;
    assert_eq!(
        ready.body["detail"],
        "not ready: watch: HTTP 403 on list services in all namespaces (3 times in a row)"
    );
    assert_eq!(status(&api).await["scopes"][0]["state"], "failing");

    let ready = wait_until("ready after a list succeeds", || async {
        let a = api.get("/readyz").await;
        (a.status == 200).then_some(a)
    })
    .await;
    assert_eq!(ready.text, "ready");
    assert_eq!(vw.metrics.watch_error_count("*", "list"), 3);
    h.api.apply(lb_service("shop", "b", 81));
    let rows = wait_events(&vw.store, 2).await;
    assert_eq!(summary(&rows[1..]), vec![(s("ADDED"), s("watch"), s("shop/b"))]);
    vw.stop().await.unwrap();
}

#[tokio::test]
async fn every_api_response_carries_the_last_synced_time_and_status_lists_each_scope() {
    let h = Harness::new().await;
    let mut config = h.config();
    config.kubernetes.namespaces = vec![s("blue"), s("shop")];
    config.backends.mode = ModeSetting::None;
    let vw = h.start(config).await;
    let api = Api::new(&vw);
    wait_until("both scopes watching", || async {
        let body = status(&api).await;
        let states: Vec<Value> = body["scopes"].as_array().unwrap().iter().map(|s| s["state"].clone()).collect();
        (states == vec![json!("watching"), json!("watching")]).then_some(())
    })
    .await;

    let before = jiff::Timestamp::now();
    let answer = api.get("/api/v1/status").await;
    let missing = api.get("/api/v1/nope").await;
    let after = jiff::Timestamp::now();
    let scopes = answer.body["scopes"].as_array().unwrap();
    let shape: Vec<(Value, Value, Value, Value)> = scopes
        .iter()
        .map(|s| (s["resource"].clone(), s["namespace"].clone(), s["state"].clone(), s["last_error"].clone()))
        .collect();
    assert_eq!(
        shape,
        vec![
            (json!("services"), json!("blue"), json!("watching"), Value::Null),
            (json!("services"), json!("shop"), json!("watching"), Value::Null)
        ]
    );
    assert_eq!(answer.body["not_ready"], Value::Null);
    // A healthy open watch is in sync now, however quiet.
    for a in [&answer, &missing] {
        let header = a.headers["x-vipwatch-last-synced"].to_str().unwrap();
        let at: jiff::Timestamp = header.parse().unwrap();
        assert!(before.checked_sub(jiff::SignedDuration::from_millis(1)).unwrap() <= at && at <= after, "{header}");
    }
    assert_eq!(missing.status, 404);
    vw.stop().await.unwrap();
}
