//! A real HTTP webhook receiver on 127.0.0.1:0 that records every request and answers as the test
//! scripts it (status, headers, hang forever, endless body).

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::stream;
use serde_json::Value;

/// One request as received.
#[derive(Debug, Clone)]
pub struct Hit {
    pub headers: HeaderMap,
    pub body: Bytes,
    pub at: Instant,
}

impl Hit {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("body is JSON")
    }
    pub fn header(&self, name: &str) -> String {
        self.headers.get(name).map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default()
    }
    /// `(event, event_id)` of the payload.
    pub fn event(&self) -> (String, i64) {
        let v = self.json();
        (v["data"]["event"].as_str().unwrap().to_owned(), v["data"]["event_id"].as_i64().unwrap_or(0))
    }
}

/// How to answer one request.
#[derive(Debug, Clone)]
pub enum Reply {
    Status(u16),
    WithHeaders(u16, Vec<(&'static str, String)>),
    /// Never answer.
    Hang,
    /// Status then an endless body.
    Endless(u16),
    /// Status then a body that trickles, one byte every 100 ms, and never ends.
    Trickle(u16),
    /// Answer `status` after a delay (a slow appliance).
    After(Duration, u16),
    /// Answer `status` with a JSON body.
    Body(u16, String),
}

type Script = Arc<dyn Fn(usize, &Hit) -> Reply + Send + Sync>;

#[derive(Clone)]
struct Shared {
    hits: Arc<Mutex<Vec<(Hit, u16)>>>,
    script: Script,
}

pub struct Receiver {
    pub url: String,
    shared: Shared,
}

impl Receiver {
    /// Starts a receiver answering per `script(request_index, hit)`.
    pub async fn start(script: impl Fn(usize, &Hit) -> Reply + Send + Sync + 'static) -> Self {
        let shared = Shared { hits: Arc::default(), script: Arc::new(script) };
        let app = Router::new().fallback(handle).with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hooks/vip", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self { url, shared }
    }

    /// Always 204.
    pub async fn ok() -> Self {
        Self::start(|_, _| Reply::Status(204)).await
    }

    /// Every request so far.
    pub fn hits(&self) -> Vec<Hit> {
        self.shared.hits.lock().unwrap().iter().map(|(h, _)| h.clone()).collect()
    }

    /// Requests answered 2xx, in arrival order.
    pub fn accepted(&self) -> Vec<Hit> {
        self.shared
            .hits
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, s)| (200..300).contains(s))
            .map(|(h, _)| h.clone())
            .collect()
    }
}

async fn handle(State(shared): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    let hit = Hit { headers, body, at: Instant::now() };
    let reply = {
        let mut hits = shared.hits.lock().unwrap();
        let reply = (shared.script)(hits.len(), &hit);
        let status = match &reply {
            Reply::Status(s)
            | Reply::WithHeaders(s, _)
            | Reply::Endless(s)
            | Reply::Trickle(s)
            | Reply::After(_, s)
            | Reply::Body(s, _) => *s,
            Reply::Hang => 0,
        };
        hits.push((hit, status));
        reply
    };
    match reply {
        Reply::Status(s) => StatusCode::from_u16(s).unwrap().into_response(),
        Reply::WithHeaders(s, headers) => {
            let mut resp = StatusCode::from_u16(s).unwrap().into_response();
            for (k, v) in headers {
                resp.headers_mut().insert(k, v.parse().unwrap());
            }
            resp
        }
        Reply::After(delay, s) => {
            tokio::time::sleep(delay).await; // ok: simulates a slow receiver, not synchronisation
            StatusCode::from_u16(s).unwrap().into_response()
        }
        Reply::Body(s, body) => {
            let mut resp = (StatusCode::from_u16(s).unwrap(), body).into_response();
            resp.headers_mut().insert("content-type", "application/json".parse().unwrap());
            resp
        }
        Reply::Hang => {
            std::future::pending::<()>().await;
            unreachable!()
        }
        Reply::Trickle(s) => {
            let body = stream::unfold((), |()| async {
                tokio::time::sleep(Duration::from_millis(100)).await; // ok: the trickle's pace
                Some((Ok::<_, Infallible>(Bytes::from_static(b"x")), ()))
            });
            Response::builder().status(s).body(Body::from_stream(body)).unwrap()
        }
        Reply::Endless(s) => {
            let chunk = Bytes::from(vec![b'x'; 8192]);
            let body = stream::repeat_with(move || Ok::<_, Infallible>(chunk.clone()));
            Response::builder().status(s).body(Body::from_stream(body)).unwrap()
        }
    }
}

/// A Standard Webhooks test secret: `whsec_` + base64 of 32 bytes.
pub const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// How long a test waits for deliveries.
pub const WAIT: Duration = Duration::from_secs(20);
