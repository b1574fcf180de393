//! The REST API over real sockets, on exact results: every list and filter, the detail endpoints, and
//! the write endpoints. vipwatch runs in-process against the fake apiserver (see tests/common).

mod common;

use common::api::{Api, TOKEN, assert_problem, seeded};
use common::receiver::Receiver;
use common::*;
use serde_json::{Value, json};

fn names(items: &Value) -> Vec<String> {
    items
        .as_array()
        .unwrap()
        .iter()
        .map(|i| format!("{}/{}", i["namespace"].as_str().unwrap(), i["name"].as_str().unwrap()))
        .collect()
}

fn field(items: &Value, key: &str) -> Vec<Value> {
    items.as_array().unwrap().iter().map(|i| i[key].clone()).collect()
}

#[tokio::test]
async fn vips_list_one_item_per_vip_with_source_ports_and_filters() {
    let h = Harness::new().await;
    let rx = Receiver::ok().await;
    let vw = seeded(&h, &rx, h.config()).await;
    let api = Api::new(&vw);

    let page = api.ok("/api/v1/vips").await;
    assert_eq!(page["next_cursor"], Value::Null);
    let items = page["items"].as_array().unwrap();
    assert_eq!(items.len(), 2);
    assert_eq!(
        (&items[0]["ip"], &items[0]["hostname"], &items[0]["namespace"], &items[0]["name"], &items[0]["source"]),
        (&json!("192.0.2.9"), &Value::Null, &json!("shop"), &json!("db"), &json!("annotation"))
    );
    assert_eq!(
        items[0]["ports"],
        json!([{"name": "http", "protocol": "TCP", "port": 5432, "targetPort": "8080", "nodePort": 35432, "appProtocol": null}])
    );
    assert_eq!(
        (&items[1]["ip"], &items[1]["name"], &items[1]["source"]),
        (&json!("192.0.2.10"), &json!("web"), &json!("status"))
    );
    assert_eq!(items[1]["ports"][0]["port"], 81, "the index follows the MODIFIED");
    let added = api.ok("/api/v1/events?type=ADDED").await["items"].clone();
    assert_eq!(items[1]["since"], added[1]["observed_at"], "dated from shop/web's ADDED (the MODIFIED kept it)");
    assert_eq!(items[0]["since"], added[0]["observed_at"]);

    assert_eq!(api.ok("/api/v1/vips?namespace=tools").await["items"], json!([]));
    let first = api.ok("/api/v1/vips?limit=1").await;
    assert_eq!(names(&first["items"]), ["shop/db"]);
    let cursor = first["next_cursor"].as_str().unwrap();
    let second = api.ok(&format!("/api/v1/vips?limit=1&cursor={cursor}")).await;
    assert_eq!((names(&second["items"]), &second["next_cursor"]), (vec!["shop/web".to_owned()], &Value::Null));

    let one = api.ok("/api/v1/vips/192.0.2.10").await;
    assert_eq!(
        (&one["ip"], &one["hostname"], names(&one["services"])),
        (&json!("192.0.2.10"), &Value::Null, vec!["shop/web".to_owned()])
    );
    assert_problem(&api.get("/api/v1/vips/198.51.100.1").await, 404, "not_found");
    // What the client sent is echoed in `detail` only up to DETAIL_MAX_CHARS characters.
    let long = "é".repeat(5000);
    let a = api.get(&format!("/api/v1/vips/{long}")).await;
    assert_problem(&a, 404, "not_found");
    let detail = a.body["detail"].as_str().unwrap();
    let kept = vipwatch::api::error::DETAIL_MAX_CHARS - "VIP `".len();
    assert_eq!(detail, format!("VIP `{}…", "é".repeat(kept)));

    h.api.update("tools", "ci", |s| {
        s["status"] = json!({"loadBalancer": {"ingress": [{"hostname": "ci.example.net"}]}})
    });
    let host = wait_until("a status-only VIP shows", || async {
        let a = api.get("/api/v1/vips/ci.example.net").await;
        (a.status == 200).then_some(a.body)
    })
    .await;
    assert_eq!(
        (&host["ip"], &host["hostname"], &host["services"][0]["source"]),
        (&Value::Null, &json!("ci.example.net"), &json!("status"))
    );
    vw.stop().await.unwrap();
}

#[tokio::test]
async fn services_list_the_normalized_view_with_vips_and_every_filter() {
    let h = Harness::new().await;
    let rx = Receiver::ok().await;
    let mut config = h.config();
    config.kubernetes.service_types = vec!["*".into()];
    let vw = seeded(&h, &rx, config).await;
    let api = Api::new(&vw);

    let all = api.ok("/api/v1/services").await;
    assert_eq!(names(&all["items"]), ["shop/db", "shop/web", "tools/ci", "tools/np"]);
    let web = &all["items"][1];
    assert_eq!(web["vips"], json!([{"address": "192.0.2.10", "source": "status", "family": "IPv4", "pool": null}]));
    assert_eq!(web["view"]["type"], "LoadBalancer");
    assert_eq!(web["uid"], h.api.get("shop", "web").unwrap()["metadata"]["uid"]);
    assert_eq!(web["resource_version"], h.api.get("shop", "web").unwrap()["metadata"]["resourceVersion"]);
    assert_eq!(
        all["items"][0]["vips"],
        json!([{"address": "192.0.2.9", "source": "annotation", "family": "IPv4", "pool": null}])
    );

    assert_eq!(names(&api.ok("/api/v1/services?namespace=tools").await["items"]), ["tools/ci", "tools/np"]);
    assert_eq!(names(&api.ok("/api/v1/services?type=NodePort").await["items"]), ["tools/np"]);
    assert_eq!(names(&api.ok("/api/v1/services?has_vip=true").await["items"]), ["shop/db", "shop/web"]);
    assert_eq!(names(&api.ok("/api/v1/services?has_vip=false").await["items"]), ["tools/ci", "tools/np"]);
    assert_eq!(names(&api.ok("/api/v1/services?label_selector=app%3Dweb").await["items"]), ["shop/web"]);
    assert_eq!(
        names(&api.ok("/api/v1/services?label_selector=app%20in%20(db,ci)").await["items"]),
        ["shop/db", "tools/ci"]
    );
    assert_eq!(names(&api.ok("/api/v1/services?label_selector=!app").await["items"]), ["tools/np"]);
    let paged = api.all("/api/v1/services?namespace=shop", 1).await;
    assert_eq!(paged.iter().map(|s| s["name"].as_str().unwrap()).collect::<Vec<_>>(), ["db", "web"]);
    assert_problem(&api.get("/api/v1/services?label_selector=a%20b").await, 400, "invalid_query");
    assert_problem(&api.get("/api/v1/services?type=Bogus").await, 400, "invalid_query");
    assert_problem(&api.get("/api/v1/services?has_vip=yes").await, 400, "invalid_query");
    vw.stop().await.unwrap();
}

#[tokio::test]
async fn one_service_shows_its_last_events_and_delivery_state_per_endpoint() {
    let h = Harness::new().await;
    let rx = Receiver::ok().await;
    let vw = seeded(&h, &rx, h.config()).await;
    let api = Api::new(&vw);

    let web = api.ok("/api/v1/services/shop/web").await;
    assert_eq!((&web["service"]["namespace"], &web["service"]["name"]), (&json!("shop"), &json!("web")));
    assert_eq!(field(&web["events"], "type"), [json!("ADDED"), json!("MODIFIED")]);
    assert_eq!(field(&web["events"], "cause"), [json!("startup"), json!("watch")]);
    assert_eq!(web["events"][1]["changed"], json!(["ports", "backends"]), "members are keyed by Service port");
    let lab = &web["deliveries"][0];
    assert_eq!(
        (&lab["webhook"], &lab["state"], &lab["pending"], &lab["last_failure_at"]),
        (&json!("lab"), &json!("in_sync"), &json!(0), &Value::Null)
    );
    assert!(lab["last_success_at"].as_str().unwrap().ends_with('Z'));
    assert_eq!(web["deliveries"].as_array().unwrap().len(), 1);

    for _ in 0..25 {
        h.api.update("shop", "web", |s| {
            let n = s["metadata"]["labels"]["n"].as_str().unwrap_or("0").parse::<i32>().unwrap() + 1;
            s["metadata"]["labels"]["n"] = json!(n.to_string());
        });
    }
    wait_events(&vw.store, 29).await;
    let web = api.ok("/api/v1/services/shop/web").await;
    let ids = field(&web["events"], "id");
    assert_eq!(ids.len(), 20);
    assert_eq!((ids[0].as_i64().unwrap(), ids[19].as_i64().unwrap()), (10, 29), "the last 20, oldest first");
    assert_problem(&api.get("/api/v1/services/shop/nope").await, 404, "not_found");
    vw.stop().await.unwrap();
}

#[tokio::test]
async fn events_list_filters_and_detail() {
    let h = Harness::new().await;
    let rx = Receiver::ok().await;
    let vw = seeded(&h, &rx, h.config()).await;
    let api = Api::new(&vw);

    let all = api.ok("/api/v1/events").await;
    assert_eq!(field(&all["items"], "id"), [json!(1), json!(2), json!(3), json!(4)]);
    assert_eq!(names(&all["items"]), ["shop/db", "shop/web", "tools/ci", "shop/web"]);
    assert_eq!(field(&all["items"], "type"), [json!("ADDED"), json!("ADDED"), json!("ADDED"), json!("MODIFIED")]);
    let ids = |v: Value| field(&v["items"], "id");
    assert_eq!(ids(api.ok("/api/v1/events?namespace=shop").await), [json!(1), json!(2), json!(4)]);
    assert_eq!(ids(api.ok("/api/v1/events?name=web").await), [json!(2), json!(4)]);
    assert_eq!(ids(api.ok("/api/v1/events?type=MODIFIED").await), [json!(4)]);
    assert_eq!(ids(api.ok("/api/v1/events?cause=startup").await), [json!(1), json!(2), json!(3)]);
    assert_eq!(ids(api.ok("/api/v1/events?after_id=2").await), [json!(3), json!(4)]);
    let t4 = all["items"][3]["observed_at"].as_str().unwrap().to_owned();
    assert_eq!(ids(api.ok(&format!("/api/v1/events?since={t4}")).await), [json!(4)]);
    assert_eq!(ids(api.ok(&format!("/api/v1/events?until={t4}&namespace=tools")).await), [json!(3)]);
    assert_eq!(ids(api.ok("/api/v1/events?until=2000-01-01T00:00:00Z").await), Vec::<Value>::new());
    assert_problem(&api.get("/api/v1/events?since=yesterday").await, 400, "invalid_query");
    assert_problem(&api.get("/api/v1/events?type=ADDDED").await, 400, "invalid_query");
    assert_problem(&api.get("/api/v1/events?limit=0").await, 400, "invalid_query");
    assert_problem(&api.get("/api/v1/events?limit=1001").await, 400, "invalid_query");

    let one = api.ok("/api/v1/events/4").await;
    let changed = json!(["ports", "backends"]);
    assert_eq!((&one["id"], &one["type"], &one["changed"]), (&json!(4), &json!("MODIFIED"), &changed));
    assert_eq!((&one["previous"]["ports"][0]["port"], &one["view"]["ports"][0]["port"]), (&json!(80), &json!(81)));
    assert_eq!(api.ok("/api/v1/events/1").await["previous"], Value::Null);
    assert_problem(&api.get("/api/v1/events/99").await, 404, "not_found");
    assert_problem(&api.get("/api/v1/events/abc").await, 400, "invalid_path");
    vw.stop().await.unwrap();
}

#[tokio::test]
async fn deliveries_webhooks_and_the_write_endpoints() {
    let h = Harness::new().await;
    let rx = Receiver::ok().await;
    let vw = seeded(&h, &rx, h.config()).await;
    let api = Api::new(&vw);

    let all = api.ok("/api/v1/deliveries").await;
    assert_eq!(field(&all["items"], "event_id"), [json!(1), json!(2), json!(3), json!(4)]);
    assert_eq!(field(&all["items"], "state"), vec![json!("succeeded"); 4]);
    let first = &all["items"][0];
    assert_eq!(
        (&first["webhook"], &first["kind"], &first["next_attempt_at"]),
        (&json!("lab"), &json!("ADDED"), &Value::Null)
    );
    assert_eq!(first["attempts"].as_array().unwrap().len(), 1);
    assert_eq!(
        (&first["attempts"][0]["status_code"], &first["attempts"][0]["error_class"]),
        (&json!(204), &Value::Null)
    );
    let ids = |v: Value| field(&v["items"], "id");
    assert_eq!(ids(api.ok("/api/v1/deliveries?event_id=4").await), [json!(4)]);
    assert_problem(&api.get("/api/v1/deliveries?event_id=-1").await, 400, "invalid_query");
    assert_eq!(ids(api.ok("/api/v1/deliveries?event_id=18446744073709551615").await), Vec::<Value>::new());
    assert_eq!(ids(api.ok("/api/v1/deliveries?name=web").await), [json!(2), json!(4)]);
    assert_eq!(ids(api.ok("/api/v1/deliveries?namespace=tools").await), [json!(3)]);
    assert_eq!(ids(api.ok("/api/v1/deliveries?webhook=lab&state=succeeded").await).len(), 4);
    assert_eq!(ids(api.ok("/api/v1/deliveries?state=failed").await), Vec::<Value>::new());
    assert_eq!(ids(api.ok("/api/v1/deliveries?webhook=other").await), Vec::<Value>::new());
    let detail = api.ok("/api/v1/deliveries/4").await;
    assert_eq!(
        (&detail["payload"]["type"], &detail["payload"]["data"]["event_id"]),
        (&json!("service.modified"), &json!(4))
    );
    assert_problem(&api.get("/api/v1/deliveries/77").await, 404, "not_found");

    let hooks = api.ok("/api/v1/webhooks").await;
    assert_eq!(hooks["items"].as_array().unwrap().len(), 1);
    let lab = api.ok("/api/v1/webhooks/lab").await;
    assert_eq!(hooks["items"][0], lab);
    assert_eq!(
        (&lab["url"], &lab["secret"], &lab["enabled"], &lab["disabled_reason"]),
        (&json!(rx.url), &json!("<redacted>"), &json!(true), &Value::Null)
    );
    assert_eq!(
        (&lab["pending"], &lab["oldest_pending_age_seconds"], &lab["last_failure_at"]),
        (&json!(0), &Value::Null, &Value::Null)
    );
    assert!(!api.get("/api/v1/webhooks/lab").await.text.contains(common::receiver::SECRET));
    assert_problem(&api.get("/api/v1/webhooks/nope").await, 404, "not_found");

    let replay = api.post("/api/v1/deliveries/2/retry", Some(TOKEN)).await;
    assert_eq!((replay.status.as_u16(), &replay.body), (202, &json!({"replayed": 2, "delivery_id": 5})));
    wait_until("the replay is delivered", || async { (rx.accepted().len() >= 5).then_some(()) }).await;
    // Different Services go out concurrently, so the original is found by its event, not by arrival.
    let accepted = rx.accepted();
    let event_of = |h: &common::receiver::Hit| h.json()["data"]["event_id"].clone();
    let original = accepted[..4].iter().find(|h| event_of(h) == event_of(&accepted[4])).expect("the original");
    assert_eq!(accepted[4].body, original.body, "same body");
    assert_ne!(accepted[4].header("webhook-id"), original.header("webhook-id"), "new webhook-id");
    assert_problem(&api.post("/api/v1/deliveries/99/retry", Some(TOKEN)).await, 404, "not_found");

    let resync = api.post("/api/v1/webhooks/lab/resync", Some(TOKEN)).await;
    assert_eq!((resync.status.as_u16(), &resync.body), (202, &json!({"webhook": "lab", "enqueued": 3})));
    wait_until("3 service.synced and sync.completed delivered", || async { (rx.accepted().len() >= 9).then_some(()) })
        .await;
    let mut types: Vec<Value> = rx.accepted()[5..].iter().map(|h| h.json()["type"].clone()).collect();
    types.sort_by_key(|t| t.to_string());
    assert_eq!(
        types,
        vec![json!("service.synced"), json!("service.synced"), json!("service.synced"), json!("sync.completed")]
    );
    assert_problem(&api.post("/api/v1/webhooks/nope/resync", Some(TOKEN)).await, 404, "not_found");

    vw.store.disable_webhook("lab", "410 Gone", &rx.url).await.unwrap();
    let lab = api.ok("/api/v1/webhooks/lab").await;
    assert_eq!((&lab["enabled"], &lab["disabled_reason"]), (&json!(false), &json!("410 Gone")));
    let enable = api.post("/api/v1/webhooks/lab/enable", Some(TOKEN)).await;
    assert_eq!((enable.status.as_u16(), &enable.body), (200, &json!({"webhook": "lab", "was_disabled": true})));
    assert_eq!(api.ok("/api/v1/webhooks/lab").await["enabled"], true);
    vw.stop().await.unwrap();
}

#[tokio::test]
async fn no_secret_appears_in_any_webhook_response() {
    let h = Harness::new().await;
    let rx = Receiver::ok().await;
    let mut config = h.config();
    let mut vault = webhook("vault", "http://user:hunter2@127.0.0.1:9/hook?token=s3cr3t-query");
    vault.enabled = false;
    vault.headers.insert("X-Api-Key".into(), vipwatch::config::Secret::new("s3cr3t-header"));
    config.webhooks.push(vault);
    let vw = seeded(&h, &rx, config).await;
    let api = Api::new(&vw);

    let list = api.get("/api/v1/webhooks").await;
    assert_eq!(names_of(&list.body["items"]), ["lab", "vault"]);
    let vault = api.ok("/api/v1/webhooks/vault").await;
    assert_eq!(vault["url"], "http://user:REDACTED@127.0.0.1:9/hook?token=REDACTED");
    assert_eq!(vault["headers"], json!({"X-Api-Key": "<redacted>"}));
    assert_eq!((&vault["enabled"], &vault["disabled_reason"]), (&json!(false), &json!("config")));
    for text in [list.text, api.get("/api/v1/webhooks/vault").await.text, api.get("/metrics").await.text] {
        for secret in ["hunter2", "s3cr3t-query", "s3cr3t-header", common::receiver::SECRET, TOKEN] {
            assert!(!text.contains(secret), "`{secret}` leaked: {text}");
        }
    }
    assert_problem(&api.post("/api/v1/webhooks/vault/resync", Some(TOKEN)).await, 409, "webhook_disabled");
    let second = api.ok("/api/v1/webhooks?limit=1").await;
    let cursor = second["next_cursor"].as_str().unwrap();
    assert_eq!(names_of(&api.ok(&format!("/api/v1/webhooks?limit=1&cursor={cursor}")).await["items"]), ["vault"]);
    vw.stop().await.unwrap();
}

fn names_of(items: &Value) -> Vec<String> {
    field(items, "name").into_iter().map(|v| v.as_str().unwrap().to_owned()).collect()
}
