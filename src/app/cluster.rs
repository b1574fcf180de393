//! Which cluster this vipwatch serves (`data.cluster` of every delivery): `cluster.name` when set;
//! else the name derived from the cluster before and kept in the database; else one derived now
//! from the `kube-system` namespace's uid (and kept); else, when that namespace cannot be read, one
//! derived from the event log's id (not kept, so a later start that can read it derives the
//! cluster's own).

use k8s_openapi::api::core::v1::Namespace;
use tracing::{info, warn};

use crate::config::Config;
use crate::model::bounded::{MESSAGE, bounded};
use crate::model::cluster;
use crate::store::{Store, StoreError};

/// The cluster name to serve under (see the module docs). `client` is asked only when neither the
/// configuration nor the database names it. Errors: the database failed.
pub async fn resolve(config: &Config, store: &Store, client: Option<&kube::Client>) -> Result<String, StoreError> {
    let kept = store.derived_cluster_name(None).await?;
    if let Some(name) = &config.cluster.name {
        if let Some(old) = kept.as_ref().filter(|old| *old != name) {
            info!(cluster = %name, derived = %old, "cluster.name is set; the name derived earlier is not used");
        }
        return Ok(name.clone());
    }
    if let Some(name) = kept {
        return Ok(name);
    }
    let uid = match client {
        Some(client) => kube_system_uid(client).await,
        None => Err("no Kubernetes client (a one-shot command)".to_owned()),
    };
    match uid {
        Ok(uid) => {
            let derived = cluster::from_namespace_uid(&uid);
            let kept = store.derived_cluster_name(Some(&derived)).await?.unwrap_or(derived);
            info!(cluster = %kept, "cluster name derived from the kube-system namespace (set cluster.name to choose one)");
            Ok(kept)
        }
        Err(why) => {
            let name = cluster::from_log_id(store.log_id());
            warn!(cluster = %name, reason = %bounded(&why, MESSAGE), "cannot read the kube-system namespace to name the cluster; naming it after the event log (set cluster.name, or allow `get` on namespace kube-system)");
            Ok(name)
        }
    }
}

async fn kube_system_uid(client: &kube::Client) -> Result<String, String> {
    let ns = kube::Api::<Namespace>::all(client.clone()).get("kube-system").await.map_err(|e| e.to_string())?;
    ns.metadata.uid.filter(|u| !u.is_empty()).ok_or_else(|| "the kube-system namespace has no uid".to_owned())
}
