//! Metadata-only responses: a client that sends `Accept: application/json;as=PartialObjectMetadata;
//! g=meta.k8s.io;v=v1` (kube's `Api::get_metadata`, `patch_metadata`) gets the object's `metadata` in a
//! `meta.k8s.io/v1` `PartialObjectMetadata` instead of the whole object, as from a real apiserver
//! (`apimachinery/pkg/apis/meta/v1/types.go`). Table rows carry the same shape.

use axum::http::HeaderMap;
use axum::http::header::ACCEPT;
use serde_json::{Value, json};

/// Whether the client asked for `PartialObjectMetadata` (and not a list of them or a Table).
pub(crate) fn wanted(headers: &HeaderMap) -> bool {
    let accept = headers.get(ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or_default();
    accept.split(',').flat_map(|media| media.split(';')).any(|param| param.trim() == "as=PartialObjectMetadata")
}

/// `obj`'s metadata as a `PartialObjectMetadata`.
pub(crate) fn of(obj: &Value) -> Value {
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]})
}
