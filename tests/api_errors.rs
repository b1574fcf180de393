//! Auth, problem+json errors (extractor rejections, unknown paths, wrong methods), hardening, health,
//! metrics, and paging through 2,500 events with a tampered cursor.

mod common;

use common::api::{Api, TOKEN, assert_problem};
use common::*;
use vipwatch::config::Secret;

#[tokio::test]
async fn posts_need_the_bearer_token_and_are_refused_without_one_configured() {
    let h = Harness::new().await;
    let mut config = h.config();
    config.server.api_token = Some(Secret::new(TOKEN));
    let vw = h.start(config).await;
    let api = Api::new(&vw);
    let missing = api.post("/api/v1/deliveries/1/retry", None).await;
    assert_problem(&missing, 401, "unauthorized");
    assert_eq!(missing.headers["www-authenticate"], "Bearer");
    assert_problem(&api.post("/api/v1/deliveries/1/retry", Some("wrong")).await, 401, "unauthorized");
    assert_problem(&api.post("/api/v1/deliveries/1/retry", Some(TOKEN)).await, 404, "not_found");
    assert_eq!(api.get("/api/v1/events").await.status, 200, "reads are open by default");
    vw.stop().await.unwrap();

    let vw = h.start(h.config()).await;
    let api = Api::new(&vw);
    assert_problem(&api.post("/api/v1/webhooks/lab/resync", Some("anything")).await, 403, "writes_disabled");
    assert_problem(&api.post("/api/v1/webhooks/lab/enable", None).await, 403, "writes_disabled");
    vw.stop().await.unwrap();
}

#[tokio::test]
async fn reads_can_require_the_token_and_the_env_variable_sets_it() {
    let h = Harness::new().await;
    let mut config = h.config();
    config.server.api_token = Some(Secret::new(TOKEN));
    config.server.require_auth_for_reads = true;
    let vw = h.start(config).await;
    let api = Api::new(&vw);
    assert_problem(&api.get("/api/v1/vips").await, 401, "unauthorized");
    assert_problem(&api.get("/metrics").await, 401, "unauthorized");
    assert_eq!(api.send(reqwest::Method::GET, "/api/v1/vips", Some(TOKEN)).await.status, 200);
    assert_eq!(api.get("/healthz").await.text, "ok");
    assert_eq!(api.get("/readyz").await.text, "ready");
    vw.stop().await.unwrap();

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vipwatch"))
        .arg("check-config")
        .current_dir(h.dir.path())
        .env("VIPWATCH_API_TOKEN", "from-env")
        .env("VIPWATCH_SERVER__REQUIRE_AUTH_FOR_READS", "true")
        .output()
        .unwrap();
    let printed = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(printed.contains("api_token = \"<redacted>\"\n"), "{printed}");
    assert!(printed.contains("require_auth_for_reads = true\n") && !printed.contains("from-env"), "{printed}");
}

#[tokio::test]
async fn every_error_is_problem_json_with_a_stable_code() {
    let h = Harness::new().await;
    let mut config = h.config();
    config.server.api_token = Some(Secret::new(TOKEN));
    config.server.body_limit = 16;
    let vw = h.start(config).await;
    let api = Api::new(&vw);
    assert_problem(&api.get("/nope").await, 404, "no_route");
    assert_problem(&api.get("/api/v1/events?limit=x").await, 400, "invalid_query");
    assert_problem(&api.get("/api/v1/events?after_id=-1").await, 400, "invalid_query");
    assert_problem(&api.get("/api/v1/deliveries/1.5").await, 400, "invalid_path");
    let wrong = api.send(reqwest::Method::DELETE, "/api/v1/events", Some(TOKEN)).await;
    assert_problem(&wrong, 405, "method_not_allowed");
    assert_eq!(wrong.headers["allow"], "GET,HEAD");
    let get_retry = api.get("/api/v1/deliveries/1/retry").await;
    assert_problem(&get_retry, 405, "method_not_allowed");
    assert_eq!(get_retry.headers["allow"], "POST");
    let big = reqwest::Client::new()
        .post(format!("{}/api/v1/deliveries/1/retry", api.base))
        .bearer_auth(TOKEN)
        .body(vec![b'x'; 1024])
        .send()
        .await
        .unwrap();
    assert_eq!(big.status(), 413);
    assert_eq!(big.headers()["content-type"], "application/problem+json");
    assert_eq!(big.json::<serde_json::Value>().await.unwrap()["code"], "payload_too_large");
    assert!(api.get("/api/v1/events").await.headers.get("access-control-allow-origin").is_none(), "CORS off");
    let no_follow = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let root = no_follow.get(format!("{}/", api.base)).send().await.unwrap();
    assert_eq!(
        (root.status().as_u16(), &root.headers()["location"]),
        (303, &"/docs/".parse::<reqwest::header::HeaderValue>().unwrap()),
        "/ points at the Swagger UI"
    );
    vw.stop().await.unwrap();
}

/// Every GET route of the OpenAPI document answers a query parameter it does not take with 400
/// `invalid_query` naming it (and the ones it takes): a typo or a filter the server lacks never looks
/// like an empty or unfiltered answer. The routes are listed here exactly, so a new one is seen.
#[tokio::test]
async fn every_get_route_refuses_a_query_parameter_it_does_not_take() {
    let h = Harness::new().await;
    let mut config = h.config();
    config.server.api_token = Some(Secret::new(TOKEN));
    config.server.require_auth_for_reads = true;
    let vw = h.start(config).await;
    let api = Api::new(&vw);
    let get = |path: String| {
        let api = api.clone();
        async move { api.send(reqwest::Method::GET, &path, Some(TOKEN)).await }
    };
    let doc = get("/openapi.json".into()).await.body;
    let mut routes = Vec::new();
    let param = regex::Regex::new(r"\{[^}]+\}").unwrap();
    for (path, item) in doc["paths"].as_object().unwrap() {
        let Some(op) = item.get("get") else { continue };
        let takes: Vec<String> = op["parameters"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["in"] == "query")
            .map(|p| format!("`{}`", p["name"].as_str().unwrap()))
            .collect();
        let concrete = param.replace_all(path, "1").into_owned();
        let answer = get(format!("{concrete}?vipwatch_typo=1")).await;
        assert_problem(&answer, 400, "invalid_query");
        let takes = if takes.is_empty() { "none".to_owned() } else { takes.join(", ") };
        assert_eq!(
            answer.body["detail"],
            format!("invalid query parameter: `vipwatch_typo` is not a parameter of GET {path} (it takes {takes})"),
            "{path}"
        );
        routes.push(path.clone());
    }
    assert_eq!(
        routes,
        [
            "/api/v1/deletions/held",
            "/api/v1/deliveries",
            "/api/v1/deliveries/{id}",
            "/api/v1/events",
            "/api/v1/events/stream",
            "/api/v1/events/{id}",
            "/api/v1/nodes",
            "/api/v1/services",
            "/api/v1/services/{namespace}/{name}",
            "/api/v1/status",
            "/api/v1/vips",
            "/api/v1/vips/{ip}",
            "/api/v1/webhooks",
            "/api/v1/webhooks/{name}",
            "/healthz",
            "/metrics",
            "/openapi.json",
            "/readyz",
        ]
    );
    let typo = get("/api/v1/events?event_id=1".into()).await;
    assert_problem(&typo, 400, "invalid_query");
    assert!(
        typo.body["detail"].as_str().unwrap().starts_with("invalid query parameter: `event_id` is not"),
        "{}",
        typo.text
    );
    // A known parameter after an unknown one, an encoded name, and a parameter given without a value.
    assert_problem(&get("/api/v1/vips?bogus&limit=1".into()).await, 400, "invalid_query");
    let encoded = get("/api/v1/vips?fam%69ly=IPv6&x%20y=1".into()).await;
    assert_eq!(
        encoded.body["detail"].as_str().unwrap().split(" is not").next(),
        Some("invalid query parameter: `x y`")
    );
    assert_eq!(get("/api/v1/vips?family=IPv6&limit=5".into()).await.status, 200);
    assert_problem(&get("/api/v1/vips?family=IPv5".into()).await, 400, "invalid_query");
    vw.stop().await.unwrap();
}

#[tokio::test]
async fn cors_allows_only_the_configured_origins() {
    let h = Harness::new().await;
    let mut config = h.config();
    config.server.cors_origins = vec!["https://ops.example.net".parse().unwrap()];
    let vw = h.start(config).await;
    let client = reqwest::Client::new();
    let get =
        |origin: &'static str| client.get(format!("http://{}/api/v1/vips", vw.addr)).header("origin", origin).send();
    let allowed = get("https://ops.example.net").await.unwrap();
    assert_eq!(allowed.headers()["access-control-allow-origin"], "https://ops.example.net");
    let other = get("https://evil.example").await.unwrap();
    assert!(other.headers().get("access-control-allow-origin").is_none());
    vw.stop().await.unwrap();
}

#[tokio::test]
async fn paging_through_2500_events_returns_each_once_and_a_tampered_cursor_is_rejected() {
    let h = Harness::new().await;
    h.api.seed((0..2500).map(|i| lb_service("bulk", &format!("svc-{i:04}"), 80)));
    let vw = h.start(h.config()).await;
    wait_events(&vw.store, 2500).await;
    let api = Api::new(&vw);
    let items = api.all("/api/v1/events", 1000).await;
    let ids: Vec<i64> = items.iter().map(|e| e["id"].as_i64().unwrap()).collect();
    assert_eq!(ids, (1..=2500).collect::<Vec<i64>>());
    let with_filter = api.all("/api/v1/events?namespace=bulk&type=ADDED", 333).await;
    assert_eq!(with_filter.len(), 2500);

    let page = api.ok("/api/v1/events?limit=10").await;
    let cursor = page["next_cursor"].as_str().unwrap().to_owned();
    let next = api.ok(&format!("/api/v1/events?limit=10&cursor={cursor}")).await;
    assert_eq!(next["items"][0]["id"], 11);
    let mut tampered = cursor.into_bytes();
    tampered[3] = if tampered[3] == b'A' { b'B' } else { b'A' };
    let tampered = String::from_utf8(tampered).unwrap();
    assert_problem(&api.get(&format!("/api/v1/events?cursor={tampered}")).await, 400, "invalid_cursor");
    let foreign = api.ok("/api/v1/services?limit=1").await["next_cursor"].as_str().unwrap().to_owned();
    assert_problem(&api.get(&format!("/api/v1/events?cursor={foreign}")).await, 400, "invalid_cursor");
    vw.stop().await.unwrap();
}

#[tokio::test]
async fn metrics_count_http_requests_and_outbox_depth() {
    let h = Harness::new().await;
    let rx = common::receiver::Receiver::start(|_, _| common::receiver::Reply::Status(500)).await;
    let mut config = h.config_with(vec![webhook("lab", &rx.url)]);
    config.webhooks[0].retry.initial_delay = std::time::Duration::from_secs(60);
    let vw = h.start(config).await;
    h.api.apply(lb_service("shop", "web", 80));
    wait_until("a failed attempt", || async { (!rx.hits().is_empty()).then_some(()) }).await;
    let api = Api::new(&vw);
    api.get("/api/v1/events/1").await;
    api.get("/nope").await;
    let text = api.get("/metrics").await.text;
    for line in [
        "vipwatch_http_requests_total{route=\"/api/v1/events/{id}\",method=\"GET\",status=\"200\"} 1",
        "vipwatch_http_requests_total{route=\"unmatched\",method=\"GET\",status=\"404\"} 1",
        "vipwatch_outbox_depth{webhook=\"lab\"} 1",
        "vipwatch_events_total{type=\"ADDED\",cause=\"watch\"} 1",
        "vipwatch_services_in_scope 1",
    ] {
        assert!(text.lines().any(|l| l == line), "missing `{line}` in:\n{text}");
    }
    assert!(text.contains("vipwatch_http_request_duration_seconds_bucket{"));
    assert!(text.lines().any(|l| l.starts_with("vipwatch_outbox_oldest_pending_age_seconds{webhook=\"lab\"} ")));
    vw.stop().await.unwrap();
}
