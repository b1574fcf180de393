//! PATCH bodies by `Content-Type`, computed against a copy of the stored object:
//! - `application/merge-patch+json`: JSON merge patch (RFC 7386);
//! - `application/strategic-merge-patch+json`: the strategic merge subset of [`super::smp`] (kubectl's
//!   default for `patch`, `label`, `annotate` and client-side `apply`);
//! - `application/json-patch+json`: JSON patch (RFC 6902, [`super::jsonpatch`]);
//! - `application/apply-patch+yaml` (server-side apply): the body must be JSON and is applied as a merge
//!   patch (no field ownership).
//!
//! Any other type answers 415. What a resource does with the patched object (preconditions, status vs
//! main resource, finalizer rules) is up to its write path.

use axum::http::{HeaderMap, header};
use serde_json::{Value, json};

use super::errors::ApiError;
use super::jsonpatch::{self, JsonPatchError};
use super::smp;

/// A patch format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PatchKind {
    /// `application/merge-patch+json`.
    Merge,
    /// `application/strategic-merge-patch+json`.
    Strategic,
    /// `application/json-patch+json`.
    Json,
    /// `application/apply-patch+yaml` (JSON body, applied as a merge patch).
    Apply,
}

impl PatchKind {
    /// The format named by the request's `Content-Type` (parameters ignored). Errors: 415 for any other.
    pub(crate) fn from_headers(headers: &HeaderMap) -> Result<PatchKind, ApiError> {
        let ct = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
        let ct = ct.split(';').next().unwrap_or("").trim();
        Ok(match ct {
            "application/merge-patch+json" => PatchKind::Merge,
            "application/strategic-merge-patch+json" => PatchKind::Strategic,
            "application/json-patch+json" => PatchKind::Json,
            "application/apply-patch+yaml" => PatchKind::Apply,
            _ => {
                return Err(ApiError::new(
                    415,
                    "UnsupportedMediaType",
                    format!(
                        "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml (got {ct:?})"
                    ),
                ));
            }
        })
    }
}

/// JSON merge patch (RFC 7386) of `patch` into `target`.
pub(crate) fn merge(target: &mut Value, patch: &Value) {
    let Some(p) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let t = target.as_object_mut().expect("just made an object");
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// `current` with the patch `body` applied as `kind`. Errors: 400 if the body is not JSON or not a valid
/// patch document of that kind; 422 if a JSON patch operation fails (e.g. a `test`).
pub(crate) fn patched(kind: PatchKind, current: &Value, body: &[u8]) -> Result<Value, ApiError> {
    let patch: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the patch body is not valid JSON: {e}")))?;
    let mut out = current.clone();
    match kind {
        PatchKind::Merge | PatchKind::Apply => {
            if !patch.is_object() {
                return Err(ApiError::bad_request("a merge patch must be a JSON object"));
            }
            merge(&mut out, &patch);
        }
        PatchKind::Strategic => smp::apply(&mut out, &patch).map_err(ApiError::bad_request)?,
        PatchKind::Json => match jsonpatch::apply(&mut out, &patch) {
            Ok(()) => {}
            Err(JsonPatchError::Malformed(m)) => return Err(ApiError::bad_request(m)),
            Err(JsonPatchError::Failed(m)) => return Err(ApiError::new(422, "Invalid", m)),
        },
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(ct: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, ct.parse().unwrap());
        h
    }

    #[test]
    fn kinds_by_content_type() {
        assert_eq!(PatchKind::from_headers(&headers("application/json-patch+json")), Ok(PatchKind::Json));
        assert_eq!(
            PatchKind::from_headers(&headers("application/strategic-merge-patch+json; charset=utf-8")),
            Ok(PatchKind::Strategic)
        );
        assert_eq!(PatchKind::from_headers(&headers("text/plain")).unwrap_err().code, 415);
    }

    #[test]
    fn patched_maps_errors_to_codes() {
        let cur = json!({"metadata": {"name": "a"}});
        let m = patched(PatchKind::Merge, &cur, br#"{"metadata":{"labels":{"x":"y"}}}"#).unwrap();
        assert_eq!(m["metadata"]["labels"]["x"], "y");
        assert_eq!(patched(PatchKind::Merge, &cur, b"nope").unwrap_err().code, 400);
        let failed = patched(PatchKind::Json, &cur, br#"[{"op":"test","path":"/metadata/name","value":"b"}]"#);
        assert_eq!(failed.unwrap_err().code, 422);
    }
}
