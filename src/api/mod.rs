//! The HTTP API (axum): VIPs, Services, the event log (with an SSE live tail), webhook endpoints and
//! deliveries under `/api/v1`, plus `/healthz`, `/readyz`, `/metrics`, `/openapi.json` and `/docs`
//! (Swagger UI, assets vendored into the binary). Reads the store; the only writes are replaying a
//! delivery, enqueueing a resync and re-enabling an endpoint. Never writes Kubernetes state.
//!
//! Layers, outermost first: every 4xx/5xx becomes `application/problem+json`
//! ([`error::problem_for_every_error`]); HTTP metrics; CORS (only with `server.cors_origins`); request
//! timeout; body limit; bearer-token auth ([`auth`]); on each documented route, the refusal of query
//! parameters it does not take ([`query`]); the routes. Around them all,
//! `X-Vipwatch-Last-Synced` ([`status::last_synced_header`]).

pub mod auth;
pub mod deletions;
pub mod deliveries;
pub mod error;
pub mod events;
pub mod extract;
pub mod health;
pub mod nodes;
pub mod openapi;
pub mod pagination;
pub mod query;
pub mod services;
pub mod sse;
pub mod status;
pub mod vip_index;
pub mod vips;
pub mod webhooks;

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::Response;
use bytes::Bytes;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::timeout::TimeoutLayer;
use utoipa_swagger_ui::{Config as SwaggerConfig, SwaggerUi};

use crate::config::{Config, ServerConfig};
use crate::metrics::Metrics;
use crate::store::{Store, StoreError};
use error::ApiError;
use vip_index::{Index, VipIndex};

/// Shared state of every handler.
#[derive(Clone)]
pub struct ApiState {
    /// The database.
    pub store: Store,
    /// Every metric, rendered by `/metrics`.
    pub metrics: Arc<Metrics>,
    /// `true` once the first full list of every watch scope is stored.
    pub ready: watch::Receiver<bool>,
    /// The highest committed event id; the SSE stream and the VIP index wake on it.
    pub committed: watch::Receiver<i64>,
    /// The configuration (webhook endpoints, `[server]`).
    pub config: Arc<Config>,
    /// Ends open SSE streams at shutdown.
    pub cancel: CancellationToken,
    /// The VIP index behind `/api/v1/vips`.
    pub vips: Arc<VipIndex>,
    /// Each endpoint's circuit breaker, as its dispatcher publishes it (all closed when none runs).
    pub circuits: crate::store::Circuits,
    /// The OpenAPI document as served (set by [`router`]).
    pub openapi: Bytes,
    /// To the recorder: `POST /api/v1/deletions/held/release` ([`ApiState::with_feedback`]; `None`
    /// answers 503).
    pub feedback: Option<tokio::sync::mpsc::Sender<crate::model::Feedback>>,
    /// Per-scope health of the watch: `/readyz`, `/api/v1/status`, `X-Vipwatch-Last-Synced`.
    pub watch: crate::watch::WatchHealth,
    /// This replica's name (`database.replica`; `single` on SQLite).
    pub replica: Arc<str>,
    /// What this replica does now: leads, or follows (`/readyz`, `/api/v1/status`).
    pub role: watch::Receiver<crate::leader::Role>,
    /// Set once `/readyz` saw that some leader stored its first full lists in the database (they
    /// stay stored, so it is not read again).
    pub lists_stored: Arc<std::sync::atomic::AtomicBool>,
}

impl ApiState {
    /// State over `store` with an empty VIP index.
    pub fn new(
        store: Store,
        metrics: Arc<Metrics>,
        ready: watch::Receiver<bool>,
        committed: watch::Receiver<i64>,
        config: Arc<Config>,
        cancel: CancellationToken,
    ) -> Self {
        let vips = VipIndex::new(store.clone());
        let watch = crate::watch::WatchHealth::new(metrics.clone(), config.kubernetes.stale_after);
        let circuits = crate::store::Circuits::default();
        Self {
            store,
            metrics,
            ready,
            committed,
            config,
            cancel,
            vips,
            circuits,
            openapi: Bytes::new(),
            feedback: None,
            watch,
            replica: Arc::from("single"),
            role: watch::channel(crate::leader::Role::Single).1,
            lists_stored: Default::default(),
        }
    }

    /// This state for replica `name`, whose role `role` tracks (PostgreSQL: leader or follower).
    pub fn with_role(self, name: String, role: watch::Receiver<crate::leader::Role>) -> Self {
        Self { replica: Arc::from(name), role, ..self }
    }

    /// This state, passing operator requests (release held deletions) to the recorder through `tx`.
    pub fn with_feedback(mut self, tx: tokio::sync::mpsc::Sender<crate::model::Feedback>) -> Self {
        self.feedback = Some(tx);
        self
    }

    /// This state showing the relay's circuit breakers (`circuits`, shared with the dispatchers) instead of
    /// an empty set.
    pub fn with_circuits(self, circuits: crate::store::Circuits) -> Self {
        Self { circuits, ..self }
    }

    /// This state reading `watch` (the tracker the Kubernetes client reports to) instead of an empty one.
    pub fn with_watch_health(self, watch: crate::watch::WatchHealth) -> Self {
        Self { watch, ..self }
    }

    /// Runs `read` on the VIP index once it includes every committed event ([`VipIndex::read`]).
    pub async fn read_vips<T>(&self, read: impl FnOnce(&Index) -> T) -> Result<T, StoreError> {
        let committed = *self.committed.borrow();
        self.vips.read(committed, read).await
    }
}

/// The whole router with its layers (see the module docs).
pub fn router(mut state: ApiState) -> Router {
    let (routes, doc) = openapi::routes().split_for_parts();
    // On the documented routes only: the Swagger UI's own assets are not part of the API.
    let known = Arc::new(query::KnownParams::from_document(&doc));
    let routes = routes.route_layer(middleware::from_fn_with_state(known, query::refuse_unknown));
    state.openapi = Bytes::from(openapi::finish(doc).to_json().unwrap_or_default());
    let server = state.config.server.clone();
    let docs = SwaggerUi::new("/docs").config(SwaggerConfig::from("/openapi.json").validator_url("none"));
    let mut app = routes
        .merge(docs)
        // The address the demo banner and a browser start from: the Swagger UI (not in the OpenAPI
        // document: it is a pointer, not part of the API).
        .route("/", axum::routing::get(|| async { axum::response::Redirect::to("/docs/") }))
        .fallback(|| async { ApiError::NoRoute })
        .layer(middleware::from_fn_with_state(auth::AuthPolicy::new(&server), auth::require_token))
        .layer(RequestBodyLimitLayer::new(server.body_limit));
    if !server.request_timeout.is_zero() {
        app = app.layer(TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, server.request_timeout));
    }
    if let Some(cors) = cors(&server) {
        app = app.layer(cors);
    }
    app.layer(middleware::from_fn_with_state(state.metrics.clone(), track))
        .layer(middleware::from_fn(error::problem_for_every_error))
        .layer(middleware::from_fn_with_state(state.watch.clone(), status::last_synced_header))
        .with_state(state)
}

fn cors(server: &ServerConfig) -> Option<CorsLayer> {
    if server.cors_origins.is_empty() {
        return None;
    }
    let origins: Vec<HeaderValue> = server
        .cors_origins
        .iter()
        .filter_map(|u| HeaderValue::from_str(&u.origin().ascii_serialization()).ok())
        .collect();
    Some(
        CorsLayer::new()
            .allow_origin(AllowOrigin::list(origins))
            .allow_methods([Method::GET, Method::POST])
            .allow_headers([
                axum::http::header::AUTHORIZATION,
                axum::http::header::CONTENT_TYPE,
                axum::http::HeaderName::from_static("last-event-id"),
            ]),
    )
}

/// Counts each request by route template, method and status, with its latency to the response head.
async fn track(State(metrics): State<Arc<Metrics>>, request: Request, next: Next) -> Response {
    let route = request.extensions().get::<MatchedPath>().map_or("unmatched", |p| p.as_str()).to_owned();
    let method = match *request.method() {
        Method::GET | Method::HEAD | Method::POST | Method::PUT | Method::PATCH | Method::DELETE | Method::OPTIONS => {
            request.method().as_str().to_owned()
        }
        _ => "other".to_owned(),
    };
    let start = Instant::now();
    let response = next.run(request).await;
    metrics.http_request(&route, &method, response.status().as_u16(), start.elapsed().as_secs_f64());
    response
}
