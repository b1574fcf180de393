//! Building the Kubernetes client from the `[kubernetes]` table, with kube's own config loading
//! (kubeconfig, exec plugins, in-cluster tokens, TLS): nothing hand-rolled.

use kube::config::{KubeConfigOptions, Kubeconfig};

use super::WatchError;
use crate::config::KubernetesConfig;

/// Connects as configured:
/// - `url` set: that base URL with no credentials (the `kubectl proxy` way);
/// - else `context` set: that context of `KUBECONFIG` / `~/.kube/config`;
/// - else kube's inference: `KUBECONFIG` / `~/.kube/config` current context, then the in-cluster
///   service account.
///
/// Errors: [`WatchError::Config`] when no source works, [`WatchError::Client`] when the client
/// cannot be built. Does not contact the apiserver.
pub async fn connect(cfg: &KubernetesConfig) -> Result<kube::Client, WatchError> {
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
    Ok(kube::Client::try_from(config)?)
}
