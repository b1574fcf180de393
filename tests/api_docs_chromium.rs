//! Headless Chromium (Debian package `chromium`, installed by `.ci/run`) opens `/docs` from the running
//! server and Swagger UI renders every operation, with every host but 127.0.0.1 unresolvable: the
//! assets are vendored into the binary and nothing is fetched from elsewhere.

mod common;

use std::time::Duration;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swagger_ui_renders_the_operations_offline() {
    let Some(_chromium) = require_tool("chromium") else { return };
    let h = Harness::new().await;
    let vw = h.start(h.config()).await;
    let profile = h.dir.path().join("chromium-profile");
    let mut chromium = tokio::process::Command::new("chromium");
    chromium
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--disable-background-networking"])
        .args(["--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"])
        .arg("--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1")
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(["--dump-dom", "--virtual-time-budget=10000"])
        .arg(format!("http://{}/docs/", vw.addr))
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(90), chromium.output())
        .await
        .expect("chromium finishes within 90 s")
        .expect("chromium runs (apt-get install chromium)");
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "chromium failed: {}", String::from_utf8_lossy(&out.stderr));
    for path in [
        "/api/v1/vips/{ip}",
        "/api/v1/services/{namespace}/{name}",
        "/api/v1/events/stream",
        "/api/v1/deliveries/{id}/retry",
        "/api/v1/webhooks/{name}/resync",
        "/healthz",
    ] {
        let rendered = format!("data-path=\"{path}\"");
        assert!(dom.contains(&rendered), "Swagger UI did not render {path}:\n{dom}");
    }
    assert!(dom.contains("opblock-summary-method") && dom.contains(">vipwatch"), "{dom}");
    vw.stop().await.unwrap();
}
