//! Metadata-only responses: a client that sends `Accept: application/json;as=PartialObjectMetadata;
//! g=meta.k8s.io;v=v1` (kube's `Api::get_metadata`, `patch_metadata`) gets the object's `metadata` in a
//! `meta.k8s.io/v1` `PartialObjectMetadata` instead of the whole object, and a list asked for with
//! `as=PartialObjectMetadataList` (`list_metadata`) a `PartialObjectMetadataList` of them, as from a
//! real apiserver (`apimachinery/pkg/apis/meta/v1/types.go`). Table rows carry the same shape.

use axum::http::HeaderMap;
use axum::http::header::ACCEPT;
use serde_json::{Value, json};

/// Whether the client asked for one `PartialObjectMetadata` (not a list of them, nor a Table).
pub(crate) fn wanted(headers: &HeaderMap) -> bool {
    asks_for(headers, "PartialObjectMetadata")
}

/// Whether the client asked for a `PartialObjectMetadataList` (kube's `list_metadata`).
pub(crate) fn list_wanted(headers: &HeaderMap) -> bool {
    asks_for(headers, "PartialObjectMetadataList")
}

/// Whether one of the media types in `Accept` carries the parameter `as={kind}`.
fn asks_for(headers: &HeaderMap, kind: &str) -> bool {
    let accept = headers.get(ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or_default();
    accept.split(',').flat_map(|media| media.split(';')).any(|param| param.trim().strip_prefix("as=") == Some(kind))
}

/// `obj`'s metadata as a `PartialObjectMetadata`.
pub(crate) fn of(obj: &Value) -> Value {
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]})
}
