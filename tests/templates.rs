//! Request templates over real sockets: the shipped examples (`examples/templates/`)
//! against fake appliances on 127.0.0.1:0 that check what they receive — a generic REST API, a
//! NetScaler NITRO-like API (207 partial failure; and a stateful ADC that refuses a second virtual
//! server on a VIP and port, for what the endpoint was `told`) and an F5 AS3-like API (full-state
//! tenant: 200, 202 then poll, 503 busy, 422; per application) — plus the removal guard and the
//! JSON-escaping guarantee.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::api::{Api, TOKEN};
use common::appliance::{Appliance, Req};
use common::receiver::Receiver;
use common::*;
use serde_json::{Value, json};
use vipwatch::config::{AuthConfig, BasicAuth, Config, PoolConfig, RetryConfig, Secret, SecretRef, WebhookConfig};
use vipwatch::store::{AttemptRow, DeliveryFilter, Store};

const HOSTILE: &str = "evil\", \"admin\": true, \"x\": \"\n}{";

fn example_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/templates").join(name)
}

fn inline(secret: &str) -> SecretRef {
    SecretRef { secret: Some(Secret::new(secret)), ..SecretRef::default() }
}

/// The example's `[[webhooks]]` entry pointed at `url`, secrets inline, test-friendly timings.
fn example(name: &str, url: &str) -> WebhookConfig {
    #[derive(serde::Deserialize)]
    struct File {
        webhooks: Vec<WebhookConfig>,
    }
    let dir = example_dir(name);
    let file: File = toml::from_str(&std::fs::read_to_string(dir.join("webhook.toml")).unwrap()).unwrap();
    let mut w = file.webhooks.into_iter().next().unwrap();
    w.url = url.parse().unwrap();
    w.timeout = Duration::from_secs(2);
    w.retry = RetryConfig {
        max_attempts: 50,
        max_age: Duration::from_secs(600),
        initial_delay: Duration::from_millis(50),
        max_delay: Duration::from_millis(400),
    };
    let t = w.template.as_mut().unwrap();
    t.resolve_paths(&dir);
    t.debounce = Duration::from_millis(100);
    match &mut t.auth {
        Some(AuthConfig::Bearer(s)) => *s = inline("t0ken"),
        Some(AuthConfig::Basic(BasicAuth { password, .. })) => *password = inline("pa55"),
        None => {}
    }
    for s in t.secrets.values_mut() {
        *s = inline("n1tr0-pa55");
    }
    w
}

fn pool() -> PoolConfig {
    toml::from_str("name = \"lab\"\naddresses = [\"192.0.2.10\", \"192.0.2.11\", \"192.0.2.12\"]\n").unwrap()
}

fn config(h: &Harness, webhooks: Vec<WebhookConfig>) -> Config {
    let mut c = h.config_with(webhooks);
    c.cluster.name = Some("prod".into());
    c.pools = vec![pool()];
    c.server.api_token = Some(Secret::new(TOKEN));
    c
}

/// A LoadBalancer Service whose annotation tries to break out of its JSON string.
fn hostile_service(ns: &str, name: &str, port: i64) -> Value {
    let mut s = lb_service(ns, name, port);
    s["metadata"]["annotations"] = json!({ "example.com/note": HOSTILE });
    s
}

async fn attempts_of(store: &Store, webhook: &str) -> Vec<AttemptRow> {
    let filter = DeliveryFilter { webhook: Some(webhook.into()), ..DeliveryFilter::default() };
    let mut out = Vec::new();
    for d in store.deliveries(&filter).await.unwrap() {
        out.extend(store.attempts(d.id).await.unwrap());
    }
    out
}

#[test]
fn every_shipped_example_passes_check_config() {
    for name in ["generic-rest", "f5-as3-tenant", "f5-as3-per-app", "netscaler-nitro"] {
        let c = Config { webhooks: vec![example(name, "https://appliance.example.net")], ..Config::default() };
        let lines = vipwatch::template::check_config(&c).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(!lines.is_empty(), "{name} renders requests");
    }
}

/// `vipwatch check-config`'s error for the generic REST example with its ADDED body replaced by `body`.
fn check_config_error_with_added_body(body: &str) -> String {
    let mut w = example("generic-rest", "https://lb.example.net");
    let t = w.template.as_mut().unwrap();
    let added = &mut t.on.get_mut("ADDED").unwrap()[0];
    added.body_file = None;
    added.body = Some(body.into());
    let c = Config { webhooks: vec![w], ..Config::default() };
    vipwatch::template::check_config(&c).unwrap_err().to_string()
}

#[test]
fn check_config_names_the_template_line_and_reason() {
    let e = check_config_error_with_added_body("{\n  \"name\": {{ service.nmae }}\n}");
    assert_eq!(
        e,
        "invalid value for `webhooks.ipam-rest.template`: template `on.ADDED[0].body` line 2: undefined value: \
         `service.nmae` is undefined"
    );
}

#[test]
fn check_config_renders_each_event_with_its_own_shape_so_previous_on_added_fails_there() {
    let e = check_config_error_with_added_body("{\"old\": {{ previous.vips }}}");
    assert!(e.contains("template `on.ADDED[0].body` line 1"), "an ADDED has no previous: {e}");
}

#[test]
fn like_cannot_redirect_an_event_type_that_has_requests_of_its_own() {
    let mut w = example("netscaler-nitro", "https://adc.example.net");
    let t = w.template.as_mut().unwrap();
    t.like.insert("DELETED".into(), "ADDED".into());
    let events = ["ADDED", "MODIFIED", "DELETED"].map(String::from);
    let (key, why) = t.validate(&events, false).unwrap_err();
    assert_eq!(key, "template.like.DELETED", "a DELETED must not send the ADDED's requests");
    assert_eq!(why, "DELETED has requests of its own ([[webhooks.template.on.DELETED]]); remove one of the two");
}

#[test]
fn a_dot_segment_or_an_absent_value_from_an_annotation_fails_the_render_instead_of_moving_the_url() {
    let mut w = example("generic-rest", "https://lb.example.net");
    let t = w.template.as_mut().unwrap();
    t.on.get_mut("ADDED").unwrap()[0].url =
        "/tenants/{{ service.annotations['example.com/owner']|path_segment }}/vips/{{ service.name|path_segment }}"
            .into();
    let compiled = vipwatch::template::Compiled::new(&w).unwrap();
    for (owner, ok) in [("team-a", true), ("..", false), (".", false), ("", false)] {
        let mut payload: Value = serde_json::from_str(vipwatch::template::SAMPLE_PAYLOAD).unwrap();
        payload["data"]["service"]["annotations"]["example.com/owner"] = json!(owner);
        let ctx = vipwatch::template::event_context(&payload, &w.name, &json!({}), None, &serde_json::Map::new());
        let rendered = compiled.render(&compiled.requests("ADDED")[0], &ctx);
        match rendered {
            Ok(r) if ok => assert_eq!(r.url.as_str(), "https://lb.example.net/tenants/team-a/vips/web"),
            Err(e) if !ok => assert!(e.to_string().contains("path_segment"), "{owner:?}: {e}"),
            other => panic!("{owner:?}: {:?}", other.map(|r| r.url.to_string())),
        }
    }
}

#[test]
fn a_hostile_annotation_cannot_change_the_json_structure() {
    let w = example("generic-rest", "https://lb.example.net");
    let compiled = vipwatch::template::Compiled::new(&w).unwrap();
    let payload: Value = serde_json::from_str(vipwatch::template::SAMPLE_PAYLOAD).unwrap();
    let ctx = vipwatch::template::event_context(&payload, &w.name, &json!({}), None, &serde_json::Map::new());
    let rendered = compiled.render(&compiled.requests("MODIFIED")[0], &ctx).unwrap();
    let body: Value = serde_json::from_str(rendered.body.as_deref().unwrap()).unwrap();
    let keys: Vec<&str> = body.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        ["annotations", "cluster", "event_id", "labels", "name", "namespace", "pools", "ports", "uid", "vips"]
    );
    assert_eq!(body["annotations"], json!({ "example.com/note": HOSTILE, "example.com/owner": "team-a" }));
    assert_eq!(rendered.url.as_str(), "https://lb.example.net/vips/sample-cluster/shop/web");
}

/// `METHOD url` of the DELETE requests the NITRO example renders for `event` of `payload` with `told`.
fn nitro_removals(payload: &Value, event: &str, told: Option<&Value>) -> Vec<String> {
    let w = example("netscaler-nitro", "https://adc.example.net");
    let compiled = vipwatch::template::Compiled::new(&w).unwrap();
    let secrets = compiled.secrets_value();
    let ctx = vipwatch::template::event_context(payload, &w.name, &secrets, told, &serde_json::Map::new());
    let mut out = Vec::new();
    for req in compiled.requests(event) {
        for r in compiled.render_all(req, &ctx).unwrap() {
            if r.method == reqwest::Method::DELETE {
                out.push(format!(
                    "DELETE {}",
                    r.url.as_str().trim_start_matches("https://adc.example.net/nitro/v1/config")
                ));
            }
        }
    }
    out
}

/// Against the check-config sample (`told`: one port, 8080, and one member, 10.0.0.13 on port 80,
/// more than the Service has now), the NITRO example removes exactly what went away: nothing before
/// anything was told, every virtual server when the Service lost its VIP, and on DELETED every port
/// told or in the last view.
#[test]
fn nitro_renders_the_removals_of_what_it_was_told_and_the_service_no_longer_has() {
    let payload: Value = serde_json::from_str(vipwatch::template::SAMPLE_PAYLOAD).unwrap();
    let told = vipwatch::template::sample_told();
    assert_eq!(
        nitro_removals(&payload, "MODIFIED", Some(&told)),
        [
            "DELETE /servicegroup_servicegroupmember_binding/sg_sample-cluster_shop_web_80?args=ip:10.0.0.13,port:30080",
            "DELETE /lbvserver/vs_sample-cluster_shop_web_8080",
            "DELETE /servicegroup/sg_sample-cluster_shop_web_8080"
        ]
    );
    assert_eq!(nitro_removals(&payload, "MODIFIED", None), Vec::<String>::new(), "nothing told, nothing to remove");
    assert_eq!(nitro_removals(&payload, "MODIFIED", Some(&payload["data"]["service"])), Vec::<String>::new());

    let mut withdrawn = payload.clone();
    withdrawn["data"]["service"]["vips"] = json!([]);
    assert_eq!(
        nitro_removals(&withdrawn, "MODIFIED", Some(&told)),
        [
            "DELETE /servicegroup_servicegroupmember_binding/sg_sample-cluster_shop_web_80?args=ip:10.0.0.13,port:30080",
            "DELETE /lbvserver/vs_sample-cluster_shop_web_80",
            "DELETE /lbvserver/vs_sample-cluster_shop_web_443",
            "DELETE /lbvserver/vs_sample-cluster_shop_web_8080",
            "DELETE /servicegroup/sg_sample-cluster_shop_web_8080"
        ],
        "the VIP went away: every virtual server told goes"
    );
    let mut deleted = payload.clone();
    deleted["data"]["event"] = json!("DELETED");
    assert_eq!(
        nitro_removals(&deleted, "DELETED", Some(&told)),
        [
            "DELETE /lbvserver/vs_sample-cluster_shop_web_80",
            "DELETE /lbvserver/vs_sample-cluster_shop_web_443",
            "DELETE /lbvserver/vs_sample-cluster_shop_web_8080",
            "DELETE /servicegroup/sg_sample-cluster_shop_web_80",
            "DELETE /servicegroup/sg_sample-cluster_shop_web_443",
            "DELETE /servicegroup/sg_sample-cluster_shop_web_8080"
        ]
    );
}

/// Every `label` in an AS3 body, at any depth.
fn as3_labels(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            if let Some(Value::String(l)) = m.get("label") {
                out.push(l.clone());
            }
            m.values().for_each(|v| as3_labels(v, out));
        }
        Value::Array(a) => a.iter().for_each(|v| as3_labels(v, out)),
        _ => {}
    }
}

/// AS3 allows at most 64 characters in a `label` (its schema's `Label`): the shipped examples keep
/// the longest cluster, namespace and Service names (63 characters each) within it, per application
/// and in a tenant declaration.
#[test]
fn the_as3_examples_keep_labels_within_as3s_64_characters_for_the_longest_names() {
    let mut payload: Value = serde_json::from_str(vipwatch::template::SAMPLE_PAYLOAD).unwrap();
    payload["data"]["cluster"] = json!("c".repeat(63));
    payload["data"]["service"]["namespace"] = json!("n".repeat(63));
    payload["data"]["service"]["name"] = json!("s".repeat(63));
    let mut labels = Vec::new();
    let w = example("f5-as3-per-app", "https://bigip.example.net");
    let compiled = vipwatch::template::Compiled::new(&w).unwrap();
    let ctx =
        vipwatch::template::event_context(&payload, &w.name, &compiled.secrets_value(), None, &Default::default());
    for r in compiled.requests("ADDED").iter().flat_map(|req| compiled.render_all(req, &ctx).unwrap()) {
        as3_labels(&serde_json::from_str(r.body.as_deref().unwrap_or("null")).unwrap(), &mut labels);
    }
    let w = example("f5-as3-tenant", "https://bigip.example.net");
    let compiled = vipwatch::template::Compiled::new(&w).unwrap();
    let services = vec![payload["data"]["service"].clone()];
    let cluster = "c".repeat(63);
    let ctx = vipwatch::template::full_state_context(
        services,
        Some(&cluster),
        "2026-12-07T00:00:00Z",
        &w.name,
        &compiled.secrets_value(),
        &Default::default(),
    );
    let body = compiled.render(compiled.full_state().unwrap(), &ctx).unwrap().body.unwrap();
    as3_labels(&serde_json::from_str(&body).unwrap(), &mut labels);
    let expected = format!("{}/", "c".repeat(63));
    assert_eq!(labels, [expected.clone(), expected]);
}

/// The generic REST fake: a map of `/vips/{ns}/{name}` → body; PUT stores, DELETE removes (404 when
/// absent); a request without the bearer token gets 401.
fn rest_appliance(vips: Arc<Mutex<BTreeMap<String, Value>>>) -> impl Fn(&Req) -> (u16, String) {
    move |r| {
        if r.header("authorization") != "Bearer t0ken" {
            return (401, String::new());
        }
        let mut vips = vips.lock().unwrap();
        match r.method.as_str() {
            "PUT" if r.path.starts_with("/api/vips/") => {
                vips.insert(r.path.clone(), r.json());
                (204, String::new())
            }
            "DELETE" => match vips.remove(&r.path) {
                Some(_) => (204, String::new()),
                None => (404, String::new()),
            },
            _ => (400, String::new()),
        }
    }
}

#[tokio::test]
async fn generic_rest_puts_the_vip_and_deletes_it_with_the_hostile_annotation_kept_in_its_string() {
    let h = Harness::new().await;
    let vips = Arc::new(Mutex::new(BTreeMap::new()));
    let fake = Appliance::start(rest_appliance(vips.clone())).await;
    let mut w = example("generic-rest", &format!("{}/api", fake.url));
    w.template.as_mut().unwrap().sign = true;
    w.secret = Some(Secret::new(receiver::SECRET));
    let vw = h.start(config(&h, vec![w])).await;
    h.api.apply(hostile_service("shop", "web", 80));
    let body = wait_until("the VIP PUT with its address", || async {
        let v = vips.lock().unwrap().get("/api/vips/prod/shop/web").cloned();
        v.filter(|b| b["vips"] == json!(["192.0.2.10"]))
    })
    .await;
    assert_eq!(body["annotations"], json!({ "example.com/note": HOSTILE }));
    assert_eq!(body["ports"], json!([{"name": "http", "protocol": "TCP", "port": 80}]));
    assert_eq!((body["namespace"].clone(), body["name"].clone()), (json!("shop"), json!("web")));
    let signer = standardwebhooks::Webhook::new(receiver::SECRET).unwrap();
    let (put, _) = fake.requests().into_iter().find(|(r, _)| r.method == "PUT").unwrap();
    signer.verify(&put.body, &put.headers).expect("sign = true: the Standard Webhooks signature verifies");

    // The delivery log shows the rendered request, the token redacted.
    let api = Api::new(&vw);
    // The outcome is recorded after the appliance answered (with the relay's next round).
    let id = wait_until("the delivery recorded as succeeded", || async {
        api.ok("/api/v1/deliveries?webhook=ipam-rest&state=succeeded").await["items"][0]["id"].as_i64()
    })
    .await;
    let detail = api.ok(&format!("/api/v1/deliveries/{id}")).await;
    let step = &detail["attempts"][0]["request"][0];
    assert_eq!(step["method"], "PUT");
    assert_eq!(step["url"], format!("{}/api/vips/prod/shop/web", fake.url));
    assert_eq!(step["headers"]["authorization"], "<redacted>");
    assert_eq!(step["headers"]["accept"], "application/json");
    assert_eq!(step["status"], 204);
    assert!(!detail.to_string().contains("t0ken"), "the token never reaches the log");

    h.api.delete("shop", "web");
    wait_until("the VIP deleted", || async { vips.lock().unwrap().is_empty().then_some(()) }).await;
    let deletes: Vec<String> = fake.lines().into_iter().filter(|l| l.starts_with("DELETE")).collect();
    assert_eq!(deletes, ["DELETE /api/vips/prod/shop/web -> 204"]);
    vw.stop().await.unwrap();
}

/// In a DELETED, a DELETE the appliance answers 404 found nothing to remove; the requests after it
/// still go out (ending the chain there as done would leave what they remove behind).
#[tokio::test]
async fn a_deleted_goes_on_after_a_delete_answered_404() {
    let h = Harness::new().await;
    let vips = Arc::new(Mutex::new(BTreeMap::new()));
    let fake = Appliance::start(rest_appliance(vips.clone())).await;
    let mut w = example("generic-rest", &format!("{}/api", fake.url));
    let deleted = w.template.as_mut().unwrap().on.get_mut("DELETED").unwrap();
    deleted[0].success = vec![200, 204];
    let mut pool = deleted[0].clone();
    pool.url = "/pools/{{ service.namespace|path_segment }}/{{ service.name|path_segment }}".into();
    deleted.insert(0, pool);
    let vw = h.start(config(&h, vec![w])).await;
    h.api.apply(lb_service("shop", "web", 80));
    wait_until("the VIP PUT", || async { vips.lock().unwrap().contains_key("/api/vips/prod/shop/web").then_some(()) })
        .await;
    h.api.delete("shop", "web");
    wait_until("the VIP deleted", || async { vips.lock().unwrap().is_empty().then_some(()) }).await;
    let deletes: Vec<String> = fake.lines().into_iter().filter(|l| l.starts_with("DELETE")).collect();
    assert_eq!(deletes, ["DELETE /api/pools/shop/web -> 404", "DELETE /api/vips/prod/shop/web -> 204"]);
    vw.stop().await.unwrap();
}

/// The NITRO fake: every call 201 except the first member binding, which gets 207 Multi-Status
/// (one item failed with errorcode 1243).
fn nitro_appliance() -> impl Fn(&Req) -> (u16, String) {
    let bindings = Arc::new(Mutex::new(0));
    move |r| {
        if r.header("x-nitro-user") != "vipwatch" || r.header("x-nitro-pass") != "n1tr0-pa55" {
            return (401, json!({"errorcode": 354, "message": "Invalid username or password"}).to_string());
        }
        if r.path.starts_with("/nitro/v1/config/servicegroup_servicegroupmember_binding") {
            let mut n = bindings.lock().unwrap();
            *n += 1;
            if *n == 1 {
                let answer = json!({"errorcode": 1243, "message": "Bulk operation failed", "severity": "ERROR",
                    "response": [{"errorcode": 0}, {"errorcode": 273, "message": "Resource already exists"}]});
                return (207, answer.to_string());
            }
        }
        let status = if r.method == "DELETE" { 200 } else { 201 };
        (status, json!({"errorcode": 0, "message": "Done", "severity": "NONE"}).to_string())
    }
}

#[tokio::test]
async fn nitro_treats_207_as_failure_and_retries_the_idempotent_calls_in_order() {
    let h = Harness::new().await;
    let fake = Appliance::start(nitro_appliance()).await;
    let vw = h.start(config(&h, vec![example("netscaler-nitro", &fake.url)])).await;
    h.api.apply(lb_service("shop", "web", 80));
    wait_until("the vserver bound with its VIP", || async {
        let reqs = fake.requests();
        reqs.iter()
            .any(|(r, s)| {
                *s == 201
                    && r.path.starts_with("/nitro/v1/config/lbvserver?")
                    && r.body.windows(10).any(|w| w == b"192.0.2.10")
            })
            .then_some(())
    })
    .await;
    wait_until("the binding after it", || async {
        let lines = fake.lines();
        lines.last().filter(|l| l.contains("lbvserver_servicegroup_binding")).map(drop)
    })
    .await;
    let lines = fake.lines();
    let sg = "POST /nitro/v1/config/servicegroup?idempotent=yes -> 201";
    let members207 = "POST /nitro/v1/config/servicegroup_servicegroupmember_binding?idempotent=yes -> 207";
    assert_eq!(lines[0], sg);
    assert_eq!(lines[1], members207, "the partial failure stops the chain: {lines:#?}");
    assert_eq!(lines[2], sg, "then the whole chain is retried: {lines:#?}");
    let vserver =
        fake.requests().into_iter().rev().find(|(r, _)| r.path.starts_with("/nitro/v1/config/lbvserver?")).unwrap();
    assert_eq!(
        vserver.0.json(),
        json!({"lbvserver": [{"name": "vs_prod_shop_web_80", "servicetype": "TCP", "ipv46": "192.0.2.10", "port": 80, "lbmethod": "ROUNDROBIN"}]})
    );
    let attempts = attempts_of(&vw.store, "netscaler").await;
    assert_eq!((attempts[0].status_code, attempts[0].error_class.as_deref()), (Some(207), Some("http")));
    let logged = attempts[0].request.clone().unwrap();
    assert!(logged.contains("\"x-nitro-pass\":\"<redacted>\"") && !logged.contains("n1tr0-pa55"), "{logged}");

    h.api.delete("shop", "web");
    wait_until("the deletes per port", || async {
        let lines = fake.lines();
        lines.iter().any(|l| l == "DELETE /nitro/v1/config/servicegroup/sg_prod_shop_web_80 -> 200").then_some(())
    })
    .await;
    let deletes: Vec<String> = fake.lines().into_iter().filter(|l| l.starts_with("DELETE")).collect();
    assert_eq!(
        deletes,
        [
            "DELETE /nitro/v1/config/lbvserver/vs_prod_shop_web_80 -> 200",
            "DELETE /nitro/v1/config/servicegroup/sg_prod_shop_web_80 -> 200"
        ]
    );
    vw.stop().await.unwrap();
}

/// How the AS3 fake answers the next declaration.
#[derive(Debug, Clone, Copy, PartialEq)]
enum As3Mode {
    /// 503 "configuration operation in progress".
    Busy,
    /// 202 + task; the first poll says "in progress", the next the result.
    Async,
    /// 422 "declaration is invalid".
    Invalid,
}

/// The AS3 fake's state: the applications of tenant `k8s` it accepted, and a script of answers
/// (empty: 202 + poll).
#[derive(Default)]
struct As3 {
    apps: Option<BTreeSet<String>>,
    script: Vec<As3Mode>,
    down: bool,
    tasks: BTreeMap<String, (u32, Value)>,
    declarations: u32,
}

/// Why `d` is not an AS3 declaration of tenant `k8s` as the example renders it, if it is not.
fn invalid_declaration(d: &Value) -> Option<String> {
    let decl = &d["declaration"];
    if d["class"] != "AS3" || decl["class"] != "ADC" || decl["k8s_prod"]["class"] != "Tenant" {
        return Some("not an AS3 ADC declaration of tenant k8s".into());
    }
    for (name, app) in decl["k8s_prod"].as_object()?.iter().filter(|(k, _)| *k != "class") {
        if app["class"] != "Application" || !name.starts_with("app_") {
            return Some(format!("{name} is not an Application"));
        }
        for (_, item) in app.as_object()?.iter().filter(|(k, _)| k.starts_with("vs_")) {
            let addresses = item["virtualAddresses"].as_array()?;
            let pool = item["pool"].as_str()?;
            if item["class"] != "Service_TCP" || addresses.is_empty() || !item["virtualPort"].is_u64() {
                return Some(format!("{name}: a bad Service_TCP"));
            }
            if app[pool]["class"] != "Pool" || !app[pool]["members"].is_array() {
                return Some(format!("{name}: pool {pool} missing"));
            }
        }
    }
    None
}

fn as3_appliance(state: Arc<Mutex<As3>>) -> impl Fn(&Req) -> (u16, String) {
    move |r| {
        let mut s = state.lock().unwrap();
        if r.header("authorization") != "Basic YWRtaW46cGE1NQ==" {
            return (401, String::new());
        }
        if s.down {
            return (503, json!({"code": 503, "message": "down for maintenance"}).to_string());
        }
        if let Some(task) = r.path.strip_prefix("/mgmt/shared/appsvcs/task/") {
            let Some((polls, result)) = s.tasks.get_mut(task) else { return (404, String::new()) };
            *polls += 1;
            if *polls == 1 {
                return (200, json!({"id": task, "results": [{"message": "in progress"}]}).to_string());
            }
            return (200, result.to_string());
        }
        if r.method != "POST" || r.path != "/mgmt/shared/appsvcs/declare?async=true" {
            return (404, String::new());
        }
        s.declarations += 1;
        let mode = if s.script.is_empty() { As3Mode::Async } else { s.script.remove(0) };
        let d = r.json();
        match (mode, invalid_declaration(&d)) {
            (As3Mode::Busy, _) => (503, json!({"code": 503, "message": "Configuration operation in progress on device, please try again in 2 minutes"}).to_string()),
            (As3Mode::Invalid, _) | (_, Some(_)) => (422, json!({"code": 422, "message": "declaration is invalid"}).to_string()),
            (As3Mode::Async, None) => {
                let apps = d["declaration"]["k8s_prod"].as_object().unwrap().keys().filter(|k| *k != "class").cloned().collect();
                s.apps = Some(apps);
                let task = format!("task-{}", s.declarations);
                let result = json!({"id": task, "results": [{"code": 200, "message": "success", "tenant": "k8s"}]});
                s.tasks.insert(task.clone(), (0, result));
                (202, json!({"id": task}).to_string())
            }
        }
    }
}

fn apps(names: &[&str]) -> Option<BTreeSet<String>> {
    Some(names.iter().map(|s| (*s).to_owned()).collect())
}

async fn wait_apps(state: &Arc<Mutex<As3>>, want: &[&str]) {
    let want = apps(want);
    wait_until(&format!("the tenant holds {want:?}"), || async { (state.lock().unwrap().apps == want).then_some(()) })
        .await;
}

fn as3_config(h: &Harness, url: &str) -> Config {
    let mut w = example("f5-as3-tenant", url);
    let t = w.template.as_mut().unwrap();
    t.resend_interval = Duration::from_secs(3600);
    let poll = t.full_state.as_mut().unwrap().poll.as_mut().unwrap();
    poll.every = Duration::from_millis(50);
    poll.deadline = Duration::from_secs(5);
    let mut c = config(h, vec![w]);
    c.relay.lease = Duration::from_secs(20);
    c
}

#[tokio::test]
async fn as3_full_state_converges_through_busy_async_restart_resync_and_an_outage() {
    let h = Harness::new().await;
    let state = Arc::new(Mutex::new(As3 { script: vec![As3Mode::Busy, As3Mode::Busy], ..As3::default() }));
    let fake = Appliance::start(as3_appliance(state.clone())).await;
    let vw = h.start(as3_config(&h, &fake.url)).await;
    h.api.apply(lb_service("shop", "web", 80));
    h.api.apply(lb_service("shop", "api", 8080));
    wait_apps(&state, &["app_shop_api", "app_shop_web"]).await;
    let attempts = wait_until("the accepted declaration recorded", || async {
        let a = attempts_of(&vw.store, "f5-as3").await;
        a.iter().any(|a| a.error_class.is_none()).then_some(a)
    })
    .await;
    let busy: Vec<_> = attempts.iter().filter(|a| a.status_code == Some(503)).collect();
    assert_eq!(busy.len(), 2, "503 busy is retried");
    let ok = attempts.iter().find(|a| a.error_class.is_none()).unwrap();
    let steps: Vec<String> = serde_json::from_str::<Vec<Value>>(ok.request.as_deref().unwrap())
        .unwrap()
        .iter()
        .map(|s| format!("{} {}", s["name"].as_str().unwrap(), s["status"]))
        .collect();
    assert_eq!(steps, ["full_state 202", "full_state.poll 200", "full_state.poll 200"]);
    vw.stop().await.unwrap();

    // Restart: a Service created while vipwatch was down is declared.
    h.api.apply(lb_service("shop", "db", 5432));
    let vw = h.start(as3_config(&h, &fake.url)).await;
    wait_apps(&state, &["app_shop_api", "app_shop_db", "app_shop_web"]).await;

    // Resync: the appliance lost its tenant; a resync declares it again.
    state.lock().unwrap().apps = None;
    let api = Api::new(&vw);
    let answer = api.send(reqwest::Method::POST, "/api/v1/webhooks/f5-as3/resync", Some(TOKEN)).await;
    assert_eq!(answer.status, 202, "{answer:?}");
    wait_apps(&state, &["app_shop_api", "app_shop_db", "app_shop_web"]).await;

    // Outage: changes made while the appliance is down arrive once it is back.
    state.lock().unwrap().down = true;
    h.api.delete("shop", "db");
    wait_until("a failed attempt during the outage", || async {
        let a = attempts_of(&vw.store, "f5-as3").await;
        (a.last().and_then(|a| a.status_code) == Some(503)).then_some(())
    })
    .await;
    state.lock().unwrap().down = false;
    wait_apps(&state, &["app_shop_api", "app_shop_web"]).await;
    vw.stop().await.unwrap();
}

#[tokio::test]
async fn an_as3_declaration_answered_422_fails_at_once() {
    let h = Harness::new().await;
    let state = Arc::new(Mutex::new(As3 { script: vec![As3Mode::Invalid; 10], ..As3::default() }));
    let fake = Appliance::start(as3_appliance(state.clone())).await;
    let vw = h.start(as3_config(&h, &fake.url)).await;
    h.api.apply(lb_service("shop", "web", 80));
    let failed = wait_until("a failed declaration", || async {
        let filter = DeliveryFilter { state: Some("failed".into()), ..DeliveryFilter::default() };
        vw.store.deliveries(&filter).await.unwrap().into_iter().next()
    })
    .await;
    assert_eq!((failed.attempts, failed.last_status), (1, Some(422)));
    assert_eq!(failed.last_error.as_deref(), Some("HTTP 422: permanent for this request: declaration is invalid"));
    assert_eq!(fake.requests().len(), state.lock().unwrap().declarations as usize);
    vw.stop().await.unwrap();
}

#[tokio::test]
async fn the_removal_guard_holds_a_declaration_that_would_empty_the_tenant_until_confirmed() {
    let h = Harness::new().await;
    let state = Arc::new(Mutex::new(As3::default()));
    let fake = Appliance::start(as3_appliance(state.clone())).await;
    let vw = h.start(as3_config(&h, &fake.url)).await;
    h.api.apply(lb_service("shop", "web", 80));
    h.api.apply(lb_service("shop", "api", 8080));
    wait_apps(&state, &["app_shop_api", "app_shop_web"]).await;

    h.api.delete("shop", "web");
    h.api.delete("shop", "api");
    wait_until("a held attempt", || async {
        let a = attempts_of(&vw.store, "f5-as3").await;
        a.iter().any(|a| a.error_class.as_deref() == Some("held")).then_some(())
    })
    .await;
    let held =
        attempts_of(&vw.store, "f5-as3").await.into_iter().find(|a| a.error_class.as_deref() == Some("held")).unwrap();
    assert_eq!(
        held.error.as_deref(),
        Some(
            "removal guard: the declaration removes 2 of the 2 Services the appliance was last told (more than \
             max_removal 0.5); confirm with POST /api/v1/webhooks/f5-as3/confirm-removal"
        )
    );
    // Applications per declaration received: once both were declared, none with fewer went out.
    let sizes: Vec<usize> = fake
        .requests()
        .iter()
        .filter(|(r, _)| r.method == "POST")
        .map(|(r, _)| r.json()["declaration"]["k8s_prod"].as_object().unwrap().len() - 1)
        .collect();
    let full = sizes.iter().position(|n| *n == 2).unwrap();
    assert!(sizes[full..].iter().all(|n| *n == 2), "nothing smaller was sent: {sizes:?}");
    assert_eq!(state.lock().unwrap().apps, apps(&["app_shop_api", "app_shop_web"]));
    assert!(vw.metrics.render().contains("vipwatch_template_removal_held{webhook=\"f5-as3\"} 1"));

    let api = Api::new(&vw);
    let answer = api.send(reqwest::Method::POST, "/api/v1/webhooks/f5-as3/confirm-removal", Some(TOKEN)).await;
    assert_eq!((answer.status.as_u16(), answer.body), (200, json!({"webhook": "f5-as3", "removed": 2, "of": 2})));
    wait_apps(&state, &[]).await;
    wait_until("the gauge back to 0", || async {
        vw.metrics.render().contains("vipwatch_template_removal_held{webhook=\"f5-as3\"} 0").then_some(())
    })
    .await;
    let again = api.send(reqwest::Method::POST, "/api/v1/webhooks/f5-as3/confirm-removal", Some(TOKEN)).await;
    assert_eq!(again.status, 409);
    vw.stop().await.unwrap();
}

/// A declaration gates nothing in Kubernetes, whether the change that starts it is a DELETED or not:
/// a Service that carries the finalizer because a per-Service endpoint delivers it loses the
/// finalizer, and frees its pool address, once that endpoint acknowledged its DELETED, while the
/// declaration that DELETED started still fails.
#[tokio::test]
async fn a_failing_declaration_holds_up_neither_the_finalizer_nor_the_address_of_a_deleted_service() {
    let h = Harness::new().await;
    let state = Arc::new(Mutex::new(As3::default()));
    let fake = Appliance::start(as3_appliance(state.clone())).await;
    let rx = Receiver::ok().await;
    let mut c = as3_config(&h, &fake.url);
    c.webhooks.push(webhook("appliance", &rx.url));
    let vw = h.start(c).await;
    h.api.apply(lb_service("shop", "web", 80));
    h.api.apply(lb_service("shop", "api", 8080));
    wait_apps(&state, &["app_shop_api", "app_shop_web"]).await;
    wait_until("web's finalizer", || async {
        (h.api.get("shop", "web")?["metadata"]["finalizers"] == json!(["vipwatch.io/cleanup"])).then_some(())
    })
    .await;

    state.lock().unwrap().down = true;
    let declared = fake.requests().len();
    h.api.delete("shop", "web");
    wait_until("web gone from the cluster (finalizer removed)", || async {
        h.api.get("shop", "web").is_none().then_some(())
    })
    .await;
    wait_until("web's address released", || async { vw.store.releases().await.unwrap().is_empty().then_some(()) })
        .await;
    let kinds: Vec<String> = rx.accepted().iter().map(|h| h.event().0).collect();
    assert_eq!(kinds, ["ADDED", "ADDED", "DELETED"]);
    wait_until("the declaration without web refused", || async { (fake.requests().len() > declared).then_some(()) })
        .await;
    assert_eq!(state.lock().unwrap().apps, apps(&["app_shop_api", "app_shop_web"]), "the appliance still has web");
    vw.stop().await.unwrap();
}

#[test]
fn vipwatch_check_config_prints_the_sample_requests_or_the_template_error() {
    let dir = tempfile::tempdir().unwrap();
    let example = example_dir("generic-rest");
    std::fs::copy(example.join("vip.json"), dir.path().join("vip.json")).unwrap();
    let config = dir.path().join("vipwatch.toml");
    std::fs::copy(example.join("webhook.toml"), &config).unwrap();
    let run = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_vipwatch"))
            .current_dir(dir.path())
            .arg("--config")
            .arg(&config)
            .arg("check-config")
            .env_remove("VIPWATCH_CONFIG")
            .env("VIPWATCH_LOG", "warn")
            .env("LB_TOKEN", "t0ken")
            .output()
            .unwrap()
    };
    let ok = run();
    assert_eq!(ok.status.code(), Some(0), "{}", String::from_utf8_lossy(&ok.stderr));
    let stdout = String::from_utf8_lossy(&ok.stdout);
    let samples: Vec<&str> = stdout.lines().filter(|l| l.starts_with("# template sample: ")).collect();
    assert_eq!(samples.len(), 4, "ADDED, MODIFIED and SYNCED (like ADDED), DELETED: {stdout}");
    assert!(samples[0].starts_with(
        "# template sample: ipam-rest: on.ADDED[0] PUT https://lb.example.net/api/vips/sample-cluster/shop/web, "
    ));
    assert!(!stdout.contains("t0ken"), "the token is not printed");

    std::fs::write(dir.path().join("vip.json"), "{\n  \"name\": {{ service.name }},\n  \"x\": {{ service.nmae }}\n}")
        .unwrap();
    let bad = run();
    assert_eq!(bad.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&bad.stderr),
        "vipwatch: invalid configuration: invalid value for `webhooks.ipam-rest.template`: template \
         `on.ADDED[0].body` line 3: undefined value: `service.nmae` is undefined\n"
    );
}

#[tokio::test]
async fn capture_vip_makes_the_address_in_the_appliance_answer_the_services_vip() {
    let h = Harness::new().await;
    let fake = Appliance::start(|r: &Req| match r.method.as_str() {
        "PUT" => (200, json!({"allocated": {"address": "203.0.113.7"}}).to_string()),
        _ => (204, String::new()),
    })
    .await;
    let mut w = example("generic-rest", &format!("{}/api", fake.url));
    w.assigns_vip = true;
    w.template.as_mut().unwrap().on.get_mut("ADDED").unwrap()[0].capture_vip = Some("/allocated/address".into());
    let mut c = config(&h, vec![w]);
    c.pools = Vec::new();
    let vw = h.start(c).await;
    h.api.apply(lb_service("shop", "web", 80));
    wait_until("the appliance's address in the Service's status", || async {
        let svc = h.api.get("shop", "web")?;
        (svc.pointer("/status/loadBalancer/ingress/0/ip")? == "203.0.113.7").then_some(())
    })
    .await;
    let rows = services(&vw.store).await;
    assert_eq!(rows[0].view.vips(), ["203.0.113.7"]);
    vw.stop().await.unwrap();
}

/// The AS3 per-application fake: `POST …/declare/k8s_prod/applications` adds the one Application of the
/// body (its first answer is a 200 hiding a 422 in `results`), `DELETE …/applications/<app>` removes it.
fn as3_per_app_appliance(apps: Arc<Mutex<BTreeSet<String>>>) -> impl Fn(&Req) -> (u16, String) {
    let answered = Arc::new(Mutex::new(0));
    move |r| {
        let mut apps = apps.lock().unwrap();
        if let Some(app) = r.path.strip_prefix("/mgmt/shared/appsvcs/declare/k8s_prod/applications/") {
            return match (r.method.as_str(), apps.remove(app)) {
                ("DELETE", true) => (200, json!({"results": [{"code": 200, "message": "success"}]}).to_string()),
                _ => (404, String::new()),
            };
        }
        if r.method != "POST" || r.path != "/mgmt/shared/appsvcs/declare/k8s_prod/applications" {
            return (404, String::new());
        }
        let body = r.json();
        let names: Vec<&String> = body.as_object().unwrap().keys().filter(|k| *k != "schemaVersion").collect();
        let app = &body[names[0].as_str()];
        let shaped = names.len() == 1
            && app["class"] == "Application"
            && app["vs_80_tcp"]["virtualAddresses"].as_array().is_some_and(|a| !a.is_empty());
        if !shaped {
            return (422, json!({"code": 422, "message": "declaration is invalid"}).to_string());
        }
        let mut n = answered.lock().unwrap();
        *n += 1;
        if *n == 1 {
            return (
                200,
                json!({"results": [{"code": 422, "message": "declaration failed", "tenant": "k8s"}]}).to_string(),
            );
        }
        apps.insert(names[0].clone());
        (200, json!({"results": [{"code": 200, "message": "success", "tenant": "k8s"}]}).to_string())
    }
}

#[tokio::test]
async fn as3_per_app_retries_a_200_that_hides_a_failure_and_deletes_the_application() {
    let h = Harness::new().await;
    let apps = Arc::new(Mutex::new(BTreeSet::new()));
    let fake = Appliance::start(as3_per_app_appliance(apps.clone())).await;
    let vw = h.start(config(&h, vec![example("f5-as3-per-app", &fake.url)])).await;
    h.api.apply(lb_service("shop", "web", 80));
    wait_until("the application declared", || async { apps.lock().unwrap().contains("app_shop_web").then_some(()) })
        .await;
    let attempts = attempts_of(&vw.store, "f5-as3-app").await;
    assert_eq!(attempts[0].status_code, Some(200));
    assert_eq!(attempts[0].error.as_deref(), Some("HTTP 200, but the check on /results/*/code failed (found [422])"));
    h.api.delete("shop", "web");
    wait_until("the application deleted", || async { apps.lock().unwrap().is_empty().then_some(()) }).await;
    let deletes: Vec<String> = fake.lines().into_iter().filter(|l| l.starts_with("DELETE")).collect();
    assert_eq!(deletes, ["DELETE /mgmt/shared/appsvcs/declare/k8s_prod/applications/app_shop_web -> 200"]);
    vw.stop().await.unwrap();
}

/// What the stateful NITRO fake holds: virtual servers (name → VIP and port), service groups (name →
/// members `ip:port`) and the bindings between them.
#[derive(Debug, Default, Clone, PartialEq)]
struct Adc {
    vservers: BTreeMap<String, (String, u64)>,
    groups: BTreeMap<String, BTreeSet<String>>,
    bound: BTreeSet<(String, String)>,
}

/// A NITRO ADC as the example drives it: idempotent adds of service groups, member bindings,
/// virtual servers and their bindings; DELETE of a virtual server, a service group (with its
/// bindings) or one member binding (`?args=ip:…,port:…`), 404 when absent. Like a NetScaler, it
/// refuses a virtual server on a VIP and port another virtual server already has: 409, nothing of
/// that call applied.
fn stateful_nitro(adc: Arc<Mutex<Adc>>) -> impl Fn(&Req) -> (u16, String) {
    move |r| {
        if r.header("x-nitro-user") != "vipwatch" || r.header("x-nitro-pass") != "n1tr0-pa55" {
            return (401, json!({"errorcode": 354, "message": "Invalid username or password"}).to_string());
        }
        let done = (200, json!({"errorcode": 0, "message": "Done", "severity": "NONE"}).to_string());
        let missing = (404, json!({"errorcode": 258, "message": "No such resource", "severity": "ERROR"}).to_string());
        let mut adc = adc.lock().unwrap();
        let (path, query) = r.path.split_once('?').unwrap_or((&r.path, ""));
        let text = |v: &Value| v.as_str().unwrap().to_owned();
        match (r.method.as_str(), path.strip_prefix("/nitro/v1/config/").unwrap_or_default()) {
            ("POST", "servicegroup") => {
                for g in r.json()["servicegroup"].as_array().unwrap() {
                    adc.groups.entry(text(&g["servicegroupname"])).or_default();
                }
                (201, done.1)
            }
            ("POST", "servicegroup_servicegroupmember_binding") => {
                let members = r.json()["servicegroup_servicegroupmember_binding"].as_array().unwrap().clone();
                if members.iter().any(|m| !adc.groups.contains_key(m["servicegroupname"].as_str().unwrap())) {
                    return missing;
                }
                for m in members {
                    let member = format!("{}:{}", text(&m["ip"]), m["port"]);
                    adc.groups.get_mut(m["servicegroupname"].as_str().unwrap()).unwrap().insert(member);
                }
                (201, done.1)
            }
            ("POST", "lbvserver") => {
                let vservers = r.json()["lbvserver"].as_array().unwrap().clone();
                for v in &vservers {
                    let (name, at) = (text(&v["name"]), (text(&v["ipv46"]), v["port"].as_u64().unwrap()));
                    if adc.vservers.iter().any(|(other, there)| *other != name && *there == at) {
                        let why = format!("{}:{} is in use by another virtual server", at.0, at.1);
                        return (409, json!({"errorcode": 1322, "message": why, "severity": "ERROR"}).to_string());
                    }
                }
                for v in vservers {
                    adc.vservers.insert(text(&v["name"]), (text(&v["ipv46"]), v["port"].as_u64().unwrap()));
                }
                (201, done.1)
            }
            ("POST", "lbvserver_servicegroup_binding") => {
                let bindings = r.json()["lbvserver_servicegroup_binding"].as_array().unwrap().clone();
                for b in bindings {
                    let (vs, sg) = (text(&b["name"]), text(&b["servicegroupname"]));
                    if !adc.vservers.contains_key(&vs) || !adc.groups.contains_key(&sg) {
                        return missing;
                    }
                    adc.bound.insert((vs, sg));
                }
                (201, done.1)
            }
            ("DELETE", object) => {
                let (kind, name) = object.split_once('/').unwrap();
                let found = match kind {
                    "lbvserver" => {
                        adc.bound.retain(|(vs, _)| vs != name);
                        adc.vservers.remove(name).is_some()
                    }
                    "servicegroup" => {
                        adc.bound.retain(|(_, sg)| sg != name);
                        adc.groups.remove(name).is_some()
                    }
                    "servicegroup_servicegroupmember_binding" => {
                        let args = query.strip_prefix("args=").unwrap();
                        let (ip, port) = args.strip_prefix("ip:").unwrap().split_once(",port:").unwrap();
                        adc.groups.get_mut(name).is_some_and(|g| g.remove(&format!("{ip}:{port}")))
                    }
                    _ => return (400, String::new()),
                };
                if found { done } else { missing }
            }
            _ => (400, json!({"errorcode": 1092, "message": "Invalid request"}).to_string()),
        }
    }
}

/// A Ready Node with one InternalIP.
fn node(name: &str, ip: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
        "status": {"addresses": [{"type": "InternalIP", "address": ip}],
                   "conditions": [{"type": "Ready", "status": "True"}]}})
}

/// `lb_service` with TCP ports `ports` (`p<port>`, nodePort 30000 + the port's last three digits).
fn service_on_ports(ns: &str, name: &str, ports: &[i64]) -> Value {
    let mut s = lb_service(ns, name, ports[0]);
    s["spec"]["ports"] = ports
        .iter()
        .map(|p| json!({"name": format!("p{p}"), "protocol": "TCP", "port": p, "targetPort": 8080, "nodePort": 30000 + p % 1000}))
        .collect();
    s
}

/// Waits until the fake ADC holds exactly `want`.
async fn wait_adc(adc: &Arc<Mutex<Adc>>, what: &str, want: &Adc) {
    wait_until(what, || async { (*adc.lock().unwrap() == *want).then_some(()) }).await;
}

fn adc_of(vservers: &[(&str, &str, u64)], groups: &[(&str, &[&str])], bound: &[(&str, &str)]) -> Adc {
    Adc {
        vservers: vservers.iter().map(|(n, ip, p)| ((*n).to_owned(), ((*ip).to_owned(), *p))).collect(),
        groups: groups.iter().map(|(n, m)| ((*n).to_owned(), m.iter().map(|s| (*s).to_owned()).collect())).collect(),
        bound: bound.iter().map(|(v, g)| ((*v).to_owned(), (*g).to_owned())).collect(),
    }
}

/// The ports in what endpoint `webhook` was last told about `ns/name` (`None`: nothing).
async fn told_ports(store: &Store, webhook: &str, ns: &str, name: &str) -> Option<Vec<u64>> {
    let told = store.told(webhook, &vipwatch::model::ServiceKey::new(ns, name)).await.unwrap()?;
    let told: Value = serde_json::from_str(&told).unwrap();
    Some(told["ports"].as_array().unwrap().iter().map(|p| p["port"].as_u64().unwrap()).collect())
}

/// The NITRO example removes what the ADC was told and the Service no longer has — ports dropped
/// by a MODIFIED, members that left, and on DELETED every port it was told, not only those of the
/// last view — so the freed VIP:port can go to another Service, whose virtual server the ADC would
/// otherwise refuse (409) for ever. What the endpoint was told survives a restart and the pruning of
/// finished deliveries.
#[tokio::test]
async fn nitro_removes_what_it_told_the_adc_so_a_freed_vip_port_converges_for_the_next_service() {
    let h = Harness::new().await;
    let adc = Arc::new(Mutex::new(Adc::default()));
    let fake = Appliance::start(stateful_nitro(adc.clone())).await;
    let config = || {
        let mut c = config(&h, vec![example("netscaler-nitro", &fake.url)]);
        // One address: the next Service gets the first one's VIP once the ADC let go of it.
        c.pools = vec![toml::from_str("name = \"lab\"\naddresses = [\"192.0.2.10\"]\n").unwrap()];
        c
    };
    h.api.apply_resource(vipwatch::fake_apiserver::Resource::Nodes, node("w1", "10.0.0.1"));
    h.api.apply_resource(vipwatch::fake_apiserver::Resource::Nodes, node("w2", "10.0.0.2"));
    let vw = h.start(config()).await;
    h.api.apply(service_on_ports("eval", "alpha", &[80]));
    let both = ["10.0.0.1:30080", "10.0.0.2:30080"];
    let on_80 = adc_of(
        &[("vs_prod_eval_alpha_80", "192.0.2.10", 80)],
        &[("sg_prod_eval_alpha_80", &both)],
        &[("vs_prod_eval_alpha_80", "sg_prod_eval_alpha_80")],
    );
    wait_adc(&adc, "alpha on port 80", &on_80).await;
    wait_until("port 80 recorded as told", || async {
        (told_ports(&vw.store, "netscaler", "eval", "alpha").await == Some(vec![80])).then_some(())
    })
    .await;
    vw.stop().await.unwrap();

    // What was told outlives the delivery log: prune everything finished, then start again.
    let store = h.store().await;
    store.prune_events(vipwatch::store::now_ms() + 1).await.unwrap();
    assert_eq!(store.deliveries(&DeliveryFilter::default()).await.unwrap(), []);
    assert_eq!(told_ports(&store, "netscaler", "eval", "alpha").await, Some(vec![80]));
    drop(store);
    let vw = h.start(config()).await;

    // Ports 80 → 81 and 8443: port 80's virtual server and service group go.
    h.api.apply(service_on_ports("eval", "alpha", &[81, 8443]));
    let on_81_8443 = |members_81: &[&str], members_8443: &[&str]| {
        adc_of(
            &[("vs_prod_eval_alpha_81", "192.0.2.10", 81), ("vs_prod_eval_alpha_8443", "192.0.2.10", 8443)],
            &[("sg_prod_eval_alpha_81", members_81), ("sg_prod_eval_alpha_8443", members_8443)],
            &[
                ("vs_prod_eval_alpha_81", "sg_prod_eval_alpha_81"),
                ("vs_prod_eval_alpha_8443", "sg_prod_eval_alpha_8443"),
            ],
        )
    };
    let (both_81, both_8443) = (["10.0.0.1:30081", "10.0.0.2:30081"], ["10.0.0.1:30443", "10.0.0.2:30443"]);
    wait_adc(&adc, "alpha on ports 81 and 8443 only", &on_81_8443(&both_81, &both_8443)).await;

    // A Node goes: its members are unbound.
    assert!(h.api.delete_resource(vipwatch::fake_apiserver::Resource::Nodes, "", "w2"));
    wait_adc(&adc, "w2's members unbound", &on_81_8443(&["10.0.0.1:30081"], &["10.0.0.1:30443"])).await;
    wait_until("ports 81 and 8443 recorded as told", || async {
        (told_ports(&vw.store, "netscaler", "eval", "alpha").await == Some(vec![81, 8443])).then_some(())
    })
    .await;

    // Deleted: everything told goes, and with it the record of what was told.
    h.api.delete("eval", "alpha");
    wait_adc(&adc, "nothing of alpha left", &Adc::default()).await;

    // The freed VIP:80 goes to a new Service, whose virtual server the ADC takes.
    h.api.apply(service_on_ports("eval", "beta", &[80]));
    let beta = adc_of(
        &[("vs_prod_eval_beta_80", "192.0.2.10", 80)],
        &[("sg_prod_eval_beta_80", &["10.0.0.1:30080"])],
        &[("vs_prod_eval_beta_80", "sg_prod_eval_beta_80")],
    );
    wait_adc(&adc, "beta on 192.0.2.10:80", &beta).await;
    wait_until("beta's status shows the VIP", || async {
        let svc = h.api.get("eval", "beta")?;
        (svc.pointer("/status/loadBalancer/ingress/0/ip")? == "192.0.2.10").then_some(())
    })
    .await;
    wait_until("alpha's told record removed", || async {
        told_ports(&vw.store, "netscaler", "eval", "alpha").await.is_none().then_some(())
    })
    .await;
    assert_eq!(told_ports(&vw.store, "netscaler", "eval", "beta").await, Some(vec![80]));
    let refused: Vec<String> = fake.lines().into_iter().filter(|l| l.ends_with("-> 409")).collect();
    assert_eq!(refused, Vec::<String>::new(), "no virtual server collided with a leftover");
    vw.stop().await.unwrap();
}

/// A Service that loses its VIP (its request became impossible) has nothing to declare; the
/// per-application example deletes the Application it was told instead of leaving it on the BIG-IP
/// with the address another Service may get next.
#[tokio::test]
async fn as3_per_app_deletes_the_application_of_a_service_that_lost_its_vip() {
    let h = Harness::new().await;
    let apps = Arc::new(Mutex::new(BTreeSet::new()));
    let fake = Appliance::start(as3_per_app_appliance(apps.clone())).await;
    let vw = h.start(config(&h, vec![example("f5-as3-per-app", &fake.url)])).await;
    h.api.apply(lb_service("shop", "web", 80));
    wait_until("the application declared", || async { apps.lock().unwrap().contains("app_shop_web").then_some(()) })
        .await;
    let mut impossible = lb_service("shop", "web", 80);
    impossible["metadata"]["annotations"] = json!({"vipwatch.io/loadBalancerIPs": "198.51.100.7"});
    h.api.apply(impossible);
    wait_until("the application deleted", || async { apps.lock().unwrap().is_empty().then_some(()) }).await;
    wait_until("the delivery that withdrew the VIP recorded", || async {
        let told = vw.store.told("f5-as3-app", &vipwatch::model::ServiceKey::new("shop", "web")).await.unwrap()?;
        let told: Value = serde_json::from_str(&told).unwrap();
        (told["vips"] == json!([])).then_some(())
    })
    .await;
    let lines = fake.lines();
    let deletes: Vec<&String> = lines.iter().filter(|l| l.starts_with("DELETE")).collect();
    assert_eq!(deletes, ["DELETE /mgmt/shared/appsvcs/declare/k8s_prod/applications/app_shop_web -> 200"]);
    assert!(!lines.iter().any(|l| l.ends_with("-> 422")), "no declaration without an address: {lines:#?}");
    vw.stop().await.unwrap();
}

/// A BIG-IP's AS3 as the tenant example drives it, for several tenants: a declaration replaces
/// only the tenants it names (AS3's selective update), each becoming the Applications declared.
fn multi_tenant_as3(tenants: Arc<Mutex<BTreeMap<String, BTreeSet<String>>>>) -> impl Fn(&Req) -> (u16, String) {
    move |r| {
        if let Some(task) = r.path.strip_prefix("/mgmt/shared/appsvcs/task/") {
            return (200, json!({"id": task, "results": [{"code": 200, "message": "success"}]}).to_string());
        }
        let d = r.json();
        let declared = d["declaration"].as_object().unwrap();
        let mut tenants = tenants.lock().unwrap();
        for (tenant, body) in declared.iter().filter(|(_, v)| v["class"] == "Tenant") {
            let apps = body.as_object().unwrap().keys().filter(|k| *k != "class").cloned().collect();
            tenants.insert(tenant.clone(), apps);
        }
        (202, json!({"id": "task-1"}).to_string())
    }
}

/// Two clusters deliver to one generic REST API, one NetScaler and one BIG-IP, each with a Service
/// `eval/web`: the shipped examples keep them apart by cluster (path, object names, one AS3 tenant
/// per cluster), so both are served, and a resync or a delete in one cluster leaves the other's
/// objects alone.
#[tokio::test]
async fn the_examples_keep_two_clusters_apart_on_one_appliance() {
    let vips = Arc::new(Mutex::new(BTreeMap::new()));
    let rest = Appliance::start(rest_appliance(vips.clone())).await;
    let adc = Arc::new(Mutex::new(Adc::default()));
    let nitro = Appliance::start(stateful_nitro(adc.clone())).await;
    let tenants = Arc::new(Mutex::new(BTreeMap::new()));
    let as3 = Appliance::start(multi_tenant_as3(tenants.clone())).await;
    let mut clusters = Vec::new();
    for (name, vip) in [("east", "192.0.2.10"), ("west", "192.0.2.20")] {
        let h = Harness::new().await;
        let mut tenant = example("f5-as3-tenant", &as3.url);
        let t = tenant.template.as_mut().unwrap();
        t.max_removal = 1.0;
        t.full_state.as_mut().unwrap().poll.as_mut().unwrap().every = Duration::from_millis(50);
        let hooks =
            vec![example("generic-rest", &format!("{}/api", rest.url)), example("netscaler-nitro", &nitro.url), tenant];
        let mut c = config(&h, hooks);
        c.cluster.name = Some(name.into());
        c.pools = vec![toml::from_str(&format!("name = \"lab\"\naddresses = [\"{vip}\"]\n")).unwrap()];
        c.relay.lease = Duration::from_secs(20);
        let vw = h.start(c.clone()).await;
        h.api.apply(lb_service("eval", "web", 80));
        clusters.push((h, vw, c));
    }
    let both = |vips: &BTreeMap<String, Value>| {
        vips.contains_key("/api/vips/east/eval/web") && vips.contains_key("/api/vips/west/eval/web")
    };
    wait_until("both clusters' Services on the REST API", || async { both(&vips.lock().unwrap()).then_some(()) }).await;
    let served = adc_of(
        &[("vs_east_eval_web_80", "192.0.2.10", 80), ("vs_west_eval_web_80", "192.0.2.20", 80)],
        &[("sg_east_eval_web_80", &[]), ("sg_west_eval_web_80", &[])],
        &[("vs_east_eval_web_80", "sg_east_eval_web_80"), ("vs_west_eval_web_80", "sg_west_eval_web_80")],
    );
    wait_adc(&adc, "both virtual servers on the ADC", &served).await;
    let app = |names: &[&str]| names.iter().map(|n| (*n).to_owned()).collect::<BTreeSet<String>>();
    let per_cluster = BTreeMap::from([
        ("k8s_east".to_owned(), app(&["app_eval_web"])),
        ("k8s_west".to_owned(), app(&["app_eval_web"])),
    ]);
    wait_until("one tenant per cluster", || async { (*tenants.lock().unwrap() == per_cluster).then_some(()) }).await;
    assert_eq!(vips.lock().unwrap()["/api/vips/east/eval/web"]["cluster"], "east");

    // A resync of west sends west's state again; east's objects stay.
    let (_, west, west_config) = &clusters[1];
    vipwatch::route::resync(&west.store, west_config, None).await.unwrap();
    wait_until("west's resync delivered", || async {
        let rows = west.store.deliveries(&DeliveryFilter::default()).await.unwrap();
        rows.iter().filter(|d| d.kind == "SYNCED").all(|d| d.state == "succeeded").then_some(())
    })
    .await;
    assert!(both(&vips.lock().unwrap()));
    assert_eq!(*adc.lock().unwrap(), served);
    assert_eq!(*tenants.lock().unwrap(), per_cluster);

    // West deletes its eval/web: only west's objects go.
    clusters[1].0.api.delete("eval", "web");
    wait_until("west's Service gone from the REST API", || async {
        let v = vips.lock().unwrap();
        (!v.contains_key("/api/vips/west/eval/web") && v.contains_key("/api/vips/east/eval/web")).then_some(())
    })
    .await;
    let east_only = adc_of(
        &[("vs_east_eval_web_80", "192.0.2.10", 80)],
        &[("sg_east_eval_web_80", &[])],
        &[("vs_east_eval_web_80", "sg_east_eval_web_80")],
    );
    wait_adc(&adc, "only east's virtual server on the ADC", &east_only).await;
    let east_tenant =
        BTreeMap::from([("k8s_east".to_owned(), app(&["app_eval_web"])), ("k8s_west".to_owned(), app(&[]))]);
    wait_until("west's tenant emptied, east's kept", || async {
        (*tenants.lock().unwrap() == east_tenant).then_some(())
    })
    .await;
    for (_, vw, _) in clusters {
        vw.stop().await.unwrap();
    }
}
