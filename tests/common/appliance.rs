//! A fake appliance API on 127.0.0.1:0 for request templates: records every request (method, path
//! with query, headers, body) and answers with what the test's handler returns.

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

/// One request as received.
#[derive(Debug, Clone)]
pub struct Req {
    pub method: String,
    /// Path and query, e.g. `/vips/shop/web` or `/nitro/v1/config/lbvserver?idempotent=yes`.
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Req {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("body is JSON")
    }
    pub fn header(&self, name: &str) -> String {
        self.headers.get(name).map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default()
    }
    /// `METHOD path`.
    pub fn line(&self) -> String {
        format!("{} {}", self.method, self.path)
    }
}

type Handler = Arc<dyn Fn(&Req) -> (u16, String) + Send + Sync>;

#[derive(Clone)]
struct Shared {
    seen: Arc<Mutex<Vec<(Req, u16)>>>,
    handler: Handler,
}

pub struct Appliance {
    /// Base URL (`http://127.0.0.1:PORT`).
    pub url: String,
    shared: Shared,
}

impl Appliance {
    /// Starts answering each request with `handler(request)` = (status, JSON body or empty).
    pub async fn start(handler: impl Fn(&Req) -> (u16, String) + Send + Sync + 'static) -> Self {
        let shared = Shared { seen: Arc::default(), handler: Arc::new(handler) };
        let app = axum::Router::new().fallback(handle).with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self { url, shared }
    }

    /// Every request so far with the status answered.
    pub fn requests(&self) -> Vec<(Req, u16)> {
        self.shared.seen.lock().unwrap().clone()
    }

    /// `METHOD path -> status` of every request so far.
    pub fn lines(&self) -> Vec<String> {
        self.requests().iter().map(|(r, s)| format!("{} -> {s}", r.line())).collect()
    }
}

async fn handle(State(shared): State<Shared>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let body: Bytes = axum::body::to_bytes(body, 16 << 20).await.unwrap_or_default();
    let path = parts.uri.path_and_query().map(|p| p.as_str().to_owned()).unwrap_or_default();
    let req = Req { method: parts.method.to_string(), path, headers: parts.headers, body };
    let (status, answer) = (shared.handler)(&req);
    shared.seen.lock().unwrap().push((req, status));
    let status = StatusCode::from_u16(status).unwrap();
    if answer.is_empty() {
        status.into_response()
    } else {
        (status, [("content-type", "application/json")], answer).into_response()
    }
}
