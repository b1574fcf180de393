//! The OpenAPI document: `openapi/openapi.json` is what the code generates (regenerate with
//! `UPDATE_OPENAPI=1 cargo test --test api_openapi`), `/openapi.json` and `vipwatch openapi`
//! serve exactly it, and `/docs` serves Swagger UI from vendored assets.

mod common;

use common::api::Api;
use common::*;
use serde_json::Value;

const COMMITTED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi/openapi.json");

#[test]
fn the_committed_document_is_the_generated_one() {
    let generated = vipwatch::api::openapi::document_json();
    if std::env::var_os("UPDATE_OPENAPI").is_some() {
        std::fs::write(COMMITTED, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(COMMITTED).unwrap_or_default();
    assert!(
        committed == generated,
        "openapi/openapi.json differs from the generated document; run \
         `UPDATE_OPENAPI=1 cargo test --test api_openapi` and commit it"
    );
    let doc: Value = serde_json::from_str(&generated).unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    assert!(doc["components"]["schemas"]["WebhookPayload"].is_object());
    assert_eq!(doc["components"]["securitySchemes"]["bearer"]["scheme"], "bearer");
}

#[test]
fn vipwatch_openapi_prints_the_document() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vipwatch")).arg("openapi").output().unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8(out.stdout).unwrap(), vipwatch::api::openapi::document_json());
}

#[tokio::test]
async fn the_server_serves_the_document_and_swagger_ui() {
    let h = Harness::new().await;
    let vw = h.start(h.config()).await;
    let api = Api::new(&vw);
    let served = api.ok("/openapi.json").await;
    let generated: Value = serde_json::from_str(&vipwatch::api::openapi::document_json()).unwrap();
    assert_eq!(served, generated);
    let docs = api.get("/docs/").await;
    assert_eq!((docs.status.as_u16(), docs.content_type.as_str()), (200, "text/html"));
    assert!(docs.text.contains("swagger-ui"), "{}", docs.text);
    let init = api.get("/docs/swagger-initializer.js").await;
    assert!(init.text.contains("/openapi.json"), "{}", init.text);
    assert_eq!(api.get("/docs/swagger-ui-bundle.js").await.status, 200);
    vw.stop().await.unwrap();
}
