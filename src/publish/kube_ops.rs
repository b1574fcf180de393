//! The Kubernetes writes vipwatch makes on a Service: finalizer add/remove (strategic merge patch,
//! so concurrent finalizers of other controllers are never overwritten), the status patch, a read.

use k8s_openapi::api::core::v1::{LoadBalancerIngress, Service};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::json;

use crate::model::{FINALIZER, IngressView, ServiceKey};

/// What a write came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Written {
    /// Done.
    Ok,
    /// The Service does not exist (404): nothing left to do.
    Gone,
    /// The apiserver refused it for good (422, e.g. "no new finalizers can be added if the object is
    /// being deleted"): nothing left to do either.
    Refused(String),
}

fn api(client: &kube::Client, key: &ServiceKey) -> Api<Service> {
    Api::namespaced(client.clone(), &key.namespace)
}

/// Maps a kube error: 404 → [`Written::Gone`], 409/422 → [`Written::Refused`], others are errors to
/// retry.
fn settle<T>(result: Result<T, kube::Error>) -> Result<Written, kube::Error> {
    match result {
        Ok(_) => Ok(Written::Ok),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Written::Gone),
        Err(kube::Error::Api(s)) if s.code == 422 => Ok(Written::Refused(s.message)),
        Err(e) => Err(e),
    }
}

/// Adds vipwatch's finalizer (`metadata.finalizers` merges as a set). Errors: transport or apiserver
/// errors other than 404/422.
pub async fn add_finalizer(client: &kube::Client, key: &ServiceKey) -> Result<Written, kube::Error> {
    patch_finalizers(client, key, json!({"metadata": {"finalizers": [FINALIZER]}})).await
}

/// Removes vipwatch's finalizer and no other. Errors: as [`add_finalizer`].
pub async fn remove_finalizer(client: &kube::Client, key: &ServiceKey) -> Result<Written, kube::Error> {
    patch_finalizers(client, key, json!({"metadata": {"$deleteFromPrimitiveList/finalizers": [FINALIZER]}})).await
}

/// A strategic merge patch of the metadata, answered with the metadata only (`PartialObjectMetadata`):
/// the answer is not used, and the whole Service would be sent, parsed and dropped on every first
/// sync of every Service (these patches bound the initial sync).
async fn patch_finalizers(
    client: &kube::Client,
    key: &ServiceKey,
    patch: serde_json::Value,
) -> Result<Written, kube::Error> {
    settle(api(client, key).patch_metadata(&key.name, &PatchParams::default(), &Patch::Strategic(patch)).await)
}

/// Sets `status.loadBalancer.ingress` (JSON merge patch on the `status` subresource; an empty list
/// removes the field). Errors: as [`add_finalizer`].
pub async fn patch_status(
    client: &kube::Client,
    key: &ServiceKey,
    ingress: &[IngressView],
) -> Result<Written, kube::Error> {
    let list: Vec<LoadBalancerIngress> = ingress
        .iter()
        .map(|i| LoadBalancerIngress {
            ip: i.ip.clone(),
            hostname: i.hostname.clone(),
            ip_mode: i.ip_mode.clone(),
            ..LoadBalancerIngress::default()
        })
        .collect();
    let value = if list.is_empty() { serde_json::Value::Null } else { json!(list) };
    let patch = json!({"status": {"loadBalancer": {"ingress": value}}});
    settle(api(client, key).patch_status(&key.name, &PatchParams::default(), &Patch::Merge(patch)).await)
}

/// The Service, or `None` when it does not exist. Errors: transport or apiserver errors.
pub async fn get(client: &kube::Client, key: &ServiceKey) -> Result<Option<Service>, kube::Error> {
    api(client, key).get_opt(&key.name).await
}

/// Every Service carrying vipwatch's finalizer in `namespaces` (empty = all), by key. Lists the
/// metadata only (`PartialObjectMetadataList`): the finalizers are all it reads.
pub async fn with_finalizer(client: &kube::Client, namespaces: &[String]) -> Result<Vec<ServiceKey>, kube::Error> {
    let apis: Vec<Api<Service>> = if namespaces.is_empty() {
        vec![Api::all(client.clone())]
    } else {
        namespaces.iter().map(|ns| Api::namespaced(client.clone(), ns)).collect()
    };
    let mut out = Vec::new();
    for api in apis {
        for svc in api.list_metadata(&ListParams::default()).await? {
            let ours = svc.metadata.finalizers.as_ref().is_some_and(|f| f.iter().any(|f| f == FINALIZER));
            if ours {
                let ns = svc.metadata.namespace.clone().unwrap_or_else(|| "default".into());
                out.push(ServiceKey::new(ns, svc.metadata.name.clone().unwrap_or_default()));
            }
        }
    }
    Ok(out)
}
