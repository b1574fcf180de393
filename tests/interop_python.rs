//! Interop: the PyPI `standardwebhooks` package (installed by `.ci/run`) verifies vipwatch's signature,
//! and rejects a tampered body.

mod common;

use std::collections::BTreeMap;
use std::process::Command;

use common::receiver::{Receiver, SECRET};
use common::*;

fn verify_with_python(body: &[u8], headers: &BTreeMap<String, String>) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let body_file = dir.path().join("body");
    let headers_file = dir.path().join("headers.json");
    std::fs::write(&body_file, body).unwrap();
    std::fs::write(&headers_file, serde_json::to_vec(headers).unwrap()).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/interop/verify_standardwebhooks.py");
    Command::new("python3")
        .args([script, SECRET])
        .arg(&body_file)
        .arg(&headers_file)
        .output()
        .expect("python3 runs (see README: pip install standardwebhooks)")
}

#[tokio::test]
async fn python_standardwebhooks_verifies_the_signature() {
    let h = Harness::new().await;
    let rx = Receiver::ok().await;
    let vw = h.start(h.config_with(vec![webhook("lab", &rx.url)])).await;
    h.api.apply(lb_service("shop", "web", 80));
    let hit = wait_until("a delivery", || async { rx.accepted().into_iter().next() }).await;
    let headers: BTreeMap<String, String> = ["webhook-id", "webhook-timestamp", "webhook-signature"]
        .iter()
        .map(|k| (k.to_string(), hit.header(k)))
        .collect();

    let out = verify_with_python(&hit.body, &headers);
    assert!(out.status.success(), "python verify failed: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "service.added");

    let mut tampered = hit.body.to_vec();
    tampered.extend_from_slice(b" ");
    let out = verify_with_python(&tampered, &headers);
    assert!(!out.status.success(), "a tampered body must be rejected");
    assert!(String::from_utf8_lossy(&out.stderr).contains("WebhookVerificationError"));
    vw.stop().await.unwrap();
}
