//! The watch survives what real apiservers and networks do: in-band 410, streams cut mid-line,
//! malformed lines, refused connections, and `kubectl proxy` in between. Nothing lost, nothing doubled.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::*;
use tokio::io::{AsyncBufReadExt, BufReader};
use vipwatch::metrics::Metrics;

fn sorted(mut v: Vec<(String, String, String)>) -> Vec<(String, String, String)> {
    v.sort();
    v
}

#[tokio::test]
async fn in_band_410_relists_and_records_each_missed_change_exactly_once() {
    let h = Harness::new().await;
    h.api.apply(lb_service("shop", "a", 80));
    h.api.apply(lb_service("shop", "b", 81));
    let vw = h.start(h.config()).await;
    wait_events(&vw.store, 2).await;
    h.api.apply(lb_service("shop", "c", 82));
    wait_events(&vw.store, 3).await;

    // 410 on the open watch and history compacted; the next changes are only visible to a re-list.
    wait_watching(&h.api).await;
    h.api.faults().force_gone();
    h.api.apply(lb_service("shop", "d", 83));
    assert!(h.api.delete("shop", "a"));
    h.api.update("shop", "b", |o| o["spec"]["ports"][0]["port"] = serde_json::json!(8081));

    let rows = wait_events(&vw.store, 6).await;
    assert_eq!(
        sorted(summary(&rows[3..])),
        vec![
            (s("ADDED"), s("relist"), s("shop/d")),
            (s("DELETED"), s("relist"), s("shop/a")),
            (s("MODIFIED"), s("relist"), s("shop/b"))
        ]
    );
    let keys: Vec<String> = services(&vw.store).await.iter().map(|r| r.key.to_string()).collect();
    assert_eq!(keys, vec![s("shop/b"), s("shop/c"), s("shop/d")]);
    assert_eq!(Metrics::scope_count(&vw.metrics.watch_gone, "*"), 1);
    let progress = vw.store.watch_progress().await.unwrap();
    assert_eq!(progress[0].relist_count, 1);

    // Watching goes on after the relist.
    h.api.apply(lb_service("shop", "e", 84));
    let rows = wait_events(&vw.store, 7).await;
    assert_eq!(summary(&rows[6..]), vec![(s("ADDED"), s("watch"), s("shop/e"))]);
    assert_eq!(events(&vw.store).await.len(), 7);
    vw.stop().await.unwrap();
}

/// The service lists the apiserver got, in order, each with when it arrived.
fn service_lists(api: &vipwatch::fake_apiserver::FakeApiServer) -> Vec<std::time::Instant> {
    let lists = api.requests().into_iter().filter(|r| r.path == "/api/v1/services" && !r.query.contains("watch="));
    lists.map(|r| r.at).collect()
}

/// A `410 Gone` at every watch start (an apiserver or proxy that answers every new watch with the
/// expired resourceVersion) makes each relist useless: the next one waits kube-runtime's backoff,
/// growing from 0.8 s, as client-go's reflector does, instead of following at once; it is logged and
/// counted, and nothing is lost once a watch works again.
#[tokio::test]
async fn relists_that_give_no_working_watch_back_off_and_lose_nothing() {
    let h = Harness::new().await;
    h.api.apply(lb_service("shop", "a", 80));
    let mut config = h.config();
    config.backends.mode = vipwatch::model::backends::ModeSetting::None; // one watch scope: Services
    let vw = h.start(config).await;
    wait_events(&vw.store, 1).await;
    wait_watching(&h.api).await;
    let before = service_lists(&h.api).len();

    // The open watch ends with an in-band 410; the next two watch starts are answered 410 too.
    h.api.faults().gone_at_watch_start(2);
    h.api.faults().force_gone();
    h.api.apply(lb_service("shop", "b", 81));
    let rows = wait_events(&vw.store, 2).await;
    assert_eq!(summary(&rows[1..]), vec![(s("ADDED"), s("relist"), s("shop/b"))]);
    wait_until("a working watch again", || async { (h.api.open_watches() >= 1).then_some(()) }).await;

    // kube-runtime's own relist after the in-band 410, then one after each failed watch start.
    let lists = service_lists(&h.api)[before..].to_vec();
    assert_eq!(lists.len(), 3, "{lists:?}");
    let gaps: Vec<Duration> = lists.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(gaps[0] >= Duration::from_millis(800), "first backoff at least 0.8 s: {gaps:?}");
    assert!(gaps[1] >= Duration::from_millis(1600), "then at least 1.6 s: {gaps:?}");
    assert_eq!(Metrics::scope_count(&vw.metrics.watch_backoffs, "*"), 2);
    assert_eq!(Metrics::scope_count(&vw.metrics.watch_gone, "*"), 3);

    h.api.apply(lb_service("shop", "c", 82));
    let rows = wait_events(&vw.store, 3).await;
    assert_eq!(summary(&rows[2..]), vec![(s("ADDED"), s("watch"), s("shop/c"))]);
    vw.stop().await.unwrap();
}

#[tokio::test]
async fn a_stream_cut_mid_line_resumes_from_the_last_resource_version_without_loss() {
    let h = Harness::new().await;
    let vw = h.start(h.config()).await;
    wait_watching(&h.api).await;
    h.api.faults().cut_next_event_mid_line();
    h.api.apply(lb_service("shop", "a", 80));
    let rows = wait_events(&vw.store, 1).await;
    assert_eq!(summary(&rows), vec![(s("ADDED"), s("watch"), s("shop/a"))]);
    h.api.apply(lb_service("shop", "b", 81));
    let rows = wait_events(&vw.store, 2).await;
    assert_eq!(summary(&rows[1..]), vec![(s("ADDED"), s("watch"), s("shop/b"))]);
    vw.stop().await.unwrap();
}

#[tokio::test]
async fn a_malformed_watch_line_is_counted_and_forces_a_relist() {
    let h = Harness::new().await;
    h.api.apply(lb_service("shop", "a", 80));
    let vw = h.start(h.config()).await;
    wait_events(&vw.store, 1).await;
    wait_watching(&h.api).await;
    h.api.faults().send_garbage_line();
    wait_until("decode error counted", || async { (vw.metrics.watch_error_count("*", "decode") == 1).then_some(()) })
        .await;
    wait_until("relist after the malformed line", || async {
        (Metrics::scope_count(&vw.metrics.relists, "*") == 1).then_some(())
    })
    .await;
    h.api.apply(lb_service("shop", "b", 81));
    let rows = wait_events(&vw.store, 2).await;
    assert_eq!(summary(&rows), vec![(s("ADDED"), s("startup"), s("shop/a")), (s("ADDED"), s("watch"), s("shop/b"))]);
    vw.stop().await.unwrap();
}

#[tokio::test]
async fn a_truncated_line_the_client_drops_silently_is_recovered_by_the_periodic_relist() {
    // kube-client discards a line that ends mid-JSON as if it were a partial final line; the change it
    // carried is invisible to the watch. The safety-net relist (kubernetes.relist_interval) finds it.
    let h = Harness::new().await;
    let mut config = h.config();
    config.kubernetes.relist_interval = Duration::from_secs(1);
    let vw = h.start(config).await;
    wait_watching(&h.api).await;
    h.api.faults().corrupt_next_event();
    h.api.apply(lb_service("shop", "a", 80));
    let rows = wait_events(&vw.store, 1).await;
    assert_eq!(summary(&rows), vec![(s("ADDED"), s("relist"), s("shop/a"))]);
    vw.stop().await.unwrap();
}

#[tokio::test]
async fn refused_connections_are_retried_with_backoff_and_nothing_is_lost() {
    let h = Harness::new().await;
    h.api.apply(lb_service("shop", "a", 80));
    let vw = h.start(h.config()).await;
    wait_events(&vw.store, 1).await;

    h.api.faults().refuse_connections(true);
    h.api.apply(lb_service("shop", "b", 81));
    assert!(h.api.delete("shop", "a"));
    wait_until("connection errors counted", || async {
        let m = &vw.metrics;
        let errors: u64 = ["list", "watch_start", "stream"].iter().map(|k| m.watch_error_count("*", k)).sum();
        (errors >= 2).then_some(())
    })
    .await;
    assert_eq!(events(&vw.store).await.len(), 1, "nothing recorded while the apiserver is unreachable");
    h.api.faults().refuse_connections(false);

    let rows = wait_events(&vw.store, 3).await;
    let mut tail: Vec<(String, String)> = rows[1..].iter().map(|r| (r.event_type.clone(), r.key.to_string())).collect();
    tail.sort();
    assert_eq!(tail, vec![(s("ADDED"), s("shop/b")), (s("DELETED"), s("shop/a"))]);
    assert_eq!(events(&vw.store).await.len(), 3);
    vw.stop().await.unwrap();
}

/// `kubectl proxy` in front of the fake apiserver, as the classic tutorial connects.
struct KubectlProxy {
    child: tokio::process::Child,
    url: String,
    _home: tempfile::TempDir,
}

impl KubectlProxy {
    async fn start(server: &str) -> Self {
        let home = tempfile::tempdir().unwrap();
        let mut child = tokio::process::Command::new("kubectl")
            .args(["--server", server, "proxy", "--port=0"])
            .env("HOME", home.path())
            .env_remove("KUBECONFIG")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("kubectl is installed");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = tokio::time::timeout(DEADLINE, lines.next_line()).await.expect("kubectl proxy starts").unwrap();
        let line = line.expect("kubectl proxy prints its address");
        let addr = line.rsplit(' ').next().unwrap().trim().to_owned();
        assert!(line.starts_with("Starting to serve on "), "unexpected kubectl output: {line}");
        Self { child, url: format!("http://{addr}"), _home: home }
    }
}

#[tokio::test]
async fn create_modify_delete_through_kubectl_proxy() {
    let Some(_kubectl) = require_tool("kubectl") else { return };
    let h = Harness::new().await;
    let mut proxy = KubectlProxy::start(&h.api.url()).await;
    let vw = h.start(h.config_for(&proxy.url)).await;

    h.api.apply(lb_service("shop", "web", 80));
    wait_events(&vw.store, 1).await;
    h.api.update("shop", "web", |o| o["metadata"]["labels"]["tier"] = serde_json::json!("front"));
    wait_events(&vw.store, 2).await;
    assert!(h.api.delete("shop", "web"));
    let rows = wait_events(&vw.store, 3).await;
    assert_eq!(
        summary(&rows),
        vec![
            (s("ADDED"), s("watch"), s("shop/web")),
            (s("MODIFIED"), s("watch"), s("shop/web")),
            (s("DELETED"), s("watch"), s("shop/web"))
        ]
    );
    assert_eq!(rows[1].changed, vec![s("labels")]);
    assert!(h.api.requests().iter().any(|r| r.query.contains("watch=true")), "the watch went through the proxy");
    vw.stop().await.unwrap();
    proxy.child.kill().await.unwrap();
}
