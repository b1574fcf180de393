//! Building the Kubernetes client from the `[kubernetes]` table, with kube's own config loading
//! (kubeconfig, exec plugins, in-cluster tokens, TLS) and kube's own middleware (base URI, auth,
//! extra headers, retry of 429/5xx), over a connector with a connect timeout and TCP keepalive, and
//! with the [`Watchdog`] outermost.

use std::time::Duration;

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::ConfigExt;
use kube::client::retry::RetryPolicy;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tower::ServiceBuilder;
use tower::retry::RetryLayer;

use super::WatchError;
use super::health::WatchHealth;
use super::watchdog::Watchdog;
use crate::config::KubernetesConfig;

/// Idle time before the first TCP keepalive probe on an apiserver connection.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
/// Time between keepalive probes.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// Unanswered probes after which the kernel drops the connection (so a dead peer is found in ~60 s).
const KEEPALIVE_RETRIES: u32 = 3;

/// [`connect_watched`] with a health tracker nobody reads (one-shot commands).
pub async fn connect(cfg: &KubernetesConfig) -> Result<kube::Client, WatchError> {
    connect_watched(cfg, &WatchHealth::new(crate::metrics::Metrics::new(), cfg.stale_after)).await
}

/// Connects as configured:
/// - `url` set: that base URL with no credentials (the `kubectl proxy` way);
/// - else `context` set: that context of `KUBECONFIG` / `~/.kube/config`;
/// - else kube's inference: `KUBECONFIG` / `~/.kube/config` current context, then the in-cluster
///   service account.
///
/// Every list and watch of the watch scopes goes through the [`Watchdog`] (deadlines from
/// `watch_timeout` and `list_timeout`), which reports to `health`. Connections time out after
/// `connect_timeout` and carry TCP keepalive.
///
/// Errors: [`WatchError::Config`] when no source works, [`WatchError::Client`] when the client
/// cannot be built. Does not contact the apiserver.
pub async fn connect_watched(cfg: &KubernetesConfig, health: &WatchHealth) -> Result<kube::Client, WatchError> {
    let config = match (&cfg.url, &cfg.context) {
        (Some(url), _) => {
            let uri = url.as_str().parse().map_err(|e| WatchError::Config(format!("kubernetes.url: {e}")))?;
            kube::Config::new(uri)
        }
        (None, Some(context)) => {
            let options = KubeConfigOptions { context: Some(context.clone()), ..Default::default() };
            let kubeconfig = Kubeconfig::read().map_err(|e| WatchError::Config(e.to_string()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(|e| WatchError::Config(format!("kubernetes.context `{context}`: {e}")))?
        }
        (None, None) => kube::Config::infer().await.map_err(|e| WatchError::Config(e.to_string()))?,
    };
    build(config, cfg, health)
}

/// kube's default stack (`ClientBuilder::try_from`) minus what it cannot configure: our connector.
fn build(config: kube::Config, cfg: &KubernetesConfig, health: &WatchHealth) -> Result<kube::Client, WatchError> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(cfg.connect_timeout));
    http.set_keepalive(Some(KEEPALIVE_IDLE));
    http.set_keepalive_interval(Some(KEEPALIVE_INTERVAL));
    http.set_keepalive_retries(Some(KEEPALIVE_RETRIES));
    let https = config.rustls_https_connector_with_connector(http)?;
    let client: hyper_util::client::legacy::Client<_, kube::client::Body> =
        hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(https);
    let service = ServiceBuilder::new()
        .layer(Watchdog::new(health.clone(), cfg.watch_timeout, cfg.list_timeout))
        .layer(config.base_uri_layer())
        .option_layer(config.default_retry.then(|| RetryLayer::new(RetryPolicy::server_retry())))
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(tower::BoxError::from)
        .service(client);
    Ok(kube::Client::new(service, config.default_namespace))
}
