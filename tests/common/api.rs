//! HTTP helpers for the REST API tests: a reqwest client bound to a running vipwatch, returning
//! `(status, content-type, JSON body)`; and a seeded scenario shared by several API tests.

use reqwest::StatusCode;
use serde_json::{Value, json};
use vipwatch::app::Running;
use vipwatch::config::Config;

use super::receiver::Receiver;
use super::{Harness, lb_service, wait_until, webhook};

/// The token the API tests configure.
pub const TOKEN: &str = "t0ken-for-tests";

/// One answer: status, `content-type`, body parsed as JSON (`Value::Null` if it is not JSON).
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub content_type: String,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
    pub text: String,
}

/// A client for the API at `base` (`http://127.0.0.1:PORT`).
#[derive(Clone)]
pub struct Api {
    pub base: String,
    client: reqwest::Client,
}

impl Api {
    pub fn new(running: &Running) -> Self {
        Self { base: format!("http://{}", running.addr), client: reqwest::Client::new() }
    }

    pub async fn send(&self, method: reqwest::Method, path: &str, token: Option<&str>) -> Answer {
        let mut request = self.client.request(method, format!("{}{path}", self.base));
        if let Some(t) = token {
            request = request.bearer_auth(t);
        }
        let response = request.send().await.expect("request is answered");
        let status = response.status();
        let headers = response.headers().clone();
        let content_type = headers.get("content-type").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
        let text = response.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or(Value::Null);
        Answer { status, content_type, headers, body, text }
    }

    pub async fn get(&self, path: &str) -> Answer {
        self.send(reqwest::Method::GET, path, None).await
    }

    /// Every sample of the `/metrics` exposition: (`name{labels}` exactly as rendered, value).
    pub async fn samples(&self) -> Vec<(String, f64)> {
        let text = self.get("/metrics").await.text;
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.rsplit_once(' ').map(|(name, v)| (name.to_owned(), v.trim().parse().unwrap())))
            .collect()
    }

    /// One sample of the `/metrics` exposition (`name{labels}` exactly as rendered), 0 when absent.
    pub async fn metric(&self, sample: &str) -> f64 {
        self.samples().await.into_iter().find(|(name, _)| name == sample).map_or(0.0, |(_, v)| v)
    }

    /// GET that must answer 200 JSON; returns the body.
    pub async fn ok(&self, path: &str) -> Value {
        let a = self.get(path).await;
        assert_eq!(a.status, StatusCode::OK, "GET {path}: {}", a.text);
        assert_eq!(a.content_type, "application/json", "GET {path}");
        a.body
    }

    pub async fn post(&self, path: &str, token: Option<&str>) -> Answer {
        self.send(reqwest::Method::POST, path, token).await
    }

    /// Every item of a list, following `next_cursor` with `limit`; asserts each page is full but the last.
    pub async fn all(&self, path: &str, limit: usize) -> Vec<Value> {
        let sep = if path.contains('?') { '&' } else { '?' };
        let mut items = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let url = match &cursor {
                Some(c) => format!("{path}{sep}limit={limit}&cursor={c}"),
                None => format!("{path}{sep}limit={limit}"),
            };
            let page = self.ok(&url).await;
            let got = page["items"].as_array().unwrap().clone();
            match page["next_cursor"].as_str() {
                Some(c) => {
                    assert_eq!(got.len(), limit, "a page with a next_cursor is full");
                    cursor = Some(c.to_owned());
                    items.extend(got);
                }
                None => {
                    items.extend(got);
                    return items;
                }
            }
        }
    }
}

/// Asserts a problem+json answer with this status and code.
pub fn assert_problem(a: &Answer, status: u16, code: &str) {
    assert_eq!(a.status.as_u16(), status, "{}", a.text);
    assert_eq!(a.content_type, "application/problem+json", "{}", a.text);
    assert_eq!(a.body["status"], status);
    assert_eq!(a.body["code"], code);
    assert_eq!(a.body["type"], format!("urn:vipwatch:problem:{code}"));
    assert!(a.body["title"].is_string() && a.body["detail"].is_string(), "{}", a.text);
}

/// A Service with a published ingress IP (`status`), optional requested IP annotation and labels.
pub fn vip_service(ns: &str, name: &str, port: i64, ingress: Option<&str>, annotated: Option<&str>) -> Value {
    let mut svc = lb_service(ns, name, port);
    if let Some(ip) = annotated {
        svc["metadata"]["annotations"] = json!({"vipwatch.io/loadBalancerIPs": ip});
    }
    if let Some(ip) = ingress {
        svc["status"] = json!({"loadBalancer": {"ingress": [{"ip": ip}]}});
    }
    svc
}

/// The scenario of the API tests: three in-scope Services in two namespaces (one without VIP), one
/// NodePort (out of scope), a MODIFIED of `shop/web`, and an endpoint `lab` (before those already in
/// `config`) at a receiver that accepts everything. Returns after every delivery succeeded.
pub async fn seeded(h: &Harness, rx: &Receiver, mut config: Config) -> Running {
    config.webhooks.insert(0, webhook("lab", &rx.url));
    config.relay.poll_interval = std::time::Duration::from_millis(100);
    config.relay.lease = std::time::Duration::from_secs(5);
    config.server.api_token = Some(vipwatch::config::Secret::new(TOKEN));
    h.api.seed([
        vip_service("shop", "web", 80, Some("192.0.2.10"), None),
        vip_service("shop", "db", 5432, None, Some("192.0.2.9")),
        vip_service("tools", "ci", 8080, None, None),
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "np", "namespace": "tools"},
               "spec": {"type": "NodePort", "ports": [{"port": 1}]}}),
    ]);
    let vw = h.start(config).await;
    h.api.update("shop", "web", |s| s["spec"]["ports"][0]["port"] = json!(81));
    super::wait_events(&vw.store, 4).await;
    wait_until("4 deliveries accepted", || async { (rx.accepted().len() >= 4).then_some(()) }).await;
    let store = vw.store.clone();
    wait_until("deliveries recorded", || async {
        let rows = store.deliveries(&Default::default()).await.unwrap();
        let events = store.event_count().await.unwrap() as usize;
        (rows.len() == events && rows.iter().all(|d| d.state == "succeeded")).then_some(())
    })
    .await;
    vw
}
