//! Paged lists (`limit` / `continue`) shared by every stored resource and by Events. A continue token (opaque hex)
//! encodes the snapshot resourceVersion and the last `(namespace, name)` served; the following pages are
//! read from the current state after that key but report the snapshot resourceVersion.

use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Value, json};

use super::Shared;
use super::errors::{ApiError, json_response};
use super::http::Params;
use super::resource::Resource;
use super::selector::Matcher;

/// A decoded continue token: `(snapshot rv, namespace, name)` of the last item served.
pub(crate) type Token = (u64, String, String);

/// Continue tokens: hex of `"{snapshot rv}\n{namespace}\n{name}"` (last key served).
pub(crate) fn encode_token(rv: u64, ns: &str, name: &str) -> String {
    format!("{rv}\n{ns}\n{name}").bytes().map(|b| format!("{b:02x}")).collect()
}

/// The inverse of [`encode_token`]; `None` for anything else.
pub(crate) fn decode_token(tok: &str) -> Option<Token> {
    if !tok.len().is_multiple_of(2) || !tok.is_ascii() {
        return None;
    }
    let bytes: Option<Vec<u8>> =
        (0..tok.len()).step_by(2).map(|i| u8::from_str_radix(&tok[i..i + 2], 16).ok()).collect();
    let text = String::from_utf8(bytes?).ok()?;
    let mut parts = text.splitn(3, '\n');
    let rv = parts.next()?.parse().ok()?;
    Some((rv, parts.next()?.to_string(), parts.next()?.to_string()))
}

/// `limit` (0 = no limit) and the decoded `continue` token of a list request. Errors: 400 for a
/// malformed `limit` or token; 410 `Expired` for any token while [`super::Faults::expire_continue_tokens`]
/// is on.
pub(crate) fn paging(shared: &Arc<Shared>, params: &Params) -> Result<(usize, Option<Token>), ApiError> {
    let limit = params.number("limit").map_err(ApiError::bad_request)?.unwrap_or(0) as usize;
    let token = match params.get("continue").filter(|c| !c.is_empty()) {
        None => None,
        Some(_) if shared.faults.continue_expired() => {
            return Err(ApiError::new(
                410,
                "Expired",
                "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
            ));
        }
        Some(c) => {
            Some(decode_token(c).ok_or_else(|| ApiError::bad_request(format!("continue key is not valid: {c:?}")))?)
        }
    };
    Ok((limit, token))
}

/// One page of a list: the objects of `objects` (already in key order, after the token's key) that
/// `matcher` accepts, at most `limit` (0 = all), each shown through `view` and without
/// `kind`/`apiVersion`, plus the continue token when more remain.
pub(crate) fn page<'a>(
    objects: impl Iterator<Item = &'a Value>,
    matcher: &Matcher,
    limit: usize,
    rv: u64,
    view: impl Fn(&Value) -> Value,
) -> (Vec<Value>, Option<String>) {
    let mut items = Vec::new();
    let mut last: Option<&Value> = None;
    for obj in objects.filter(|o| matcher.matches(o)) {
        if limit > 0 && items.len() == limit {
            let key = |p: &str| last.and_then(|l| l.pointer(p)).and_then(Value::as_str).unwrap_or("").to_string();
            return (items, Some(encode_token(rv, &key("/metadata/namespace"), &key("/metadata/name"))));
        }
        let mut item = view(obj);
        if let Some(map) = item.as_object_mut() {
            map.remove("kind");
            map.remove("apiVersion");
        }
        items.push(item);
        last = Some(obj);
    }
    (items, None)
}

/// A 200 list response `{"kind":…,"apiVersion":…,"metadata":{"resourceVersion":…[,"continue":…]},"items":…}`.
pub(crate) fn list_response(
    kind: &str,
    api_version: &str,
    rv: u64,
    items: Vec<Value>,
    next: Option<String>,
) -> Response {
    let mut metadata = json!({ "resourceVersion": rv.to_string() });
    if let Some(next) = next {
        metadata["continue"] = Value::String(next);
    }
    json_response(
        StatusCode::OK,
        &json!({ "kind": kind, "apiVersion": api_version, "metadata": metadata, "items": items }),
    )
}

/// `GET` of a collection of `res` (not a watch): `{Kind}List` with the page of matching objects, or
/// with `metadata_only` a `meta.k8s.io/v1` `PartialObjectMetadataList` of their metadata.
pub(crate) fn objects(
    shared: &Arc<Shared>,
    res: Resource,
    matcher: &Matcher,
    params: &Params,
    metadata_only: bool,
) -> Response {
    let (limit, token) = match paging(shared, params) {
        Ok(p) => p,
        Err(e) => return e.response(),
    };
    let store = shared.store.lock().expect("store lock");
    let (rv, after) = match token {
        Some((rv, ns, name)) => (rv, Some((ns, name))),
        None => (store.rv(), None),
    };
    let objects = store.objects_after(res, matcher.namespace.as_deref(), after);
    if metadata_only {
        // Each item keeps its kind and apiVersion here, as the real apiserver's
        // `asPartialObjectMetadataList` sets them (`page` drops those of typed items).
        let (items, next) = page(objects, matcher, limit, rv, |obj| json!({"metadata": obj["metadata"]}));
        let items = items.iter().map(super::partial::of).collect();
        return list_response("PartialObjectMetadataList", "meta.k8s.io/v1", rv, items, next);
    }
    let (items, next) = page(objects, matcher, limit, rv, Value::clone);
    list_response(res.list_kind(), res.api_version(), rv, items, next)
}

/// `GET` of a collection of `res` as a `meta.k8s.io/v1` Table (`kubectl get svc|nodes|endpointslices`),
/// unpaged.
pub(crate) fn table(shared: &Arc<Shared>, res: Resource, matcher: &Matcher) -> Response {
    let store = shared.store.lock().expect("store lock");
    let rv = store.rv();
    let objects = store.objects_after(res, matcher.namespace.as_deref(), None);
    let (items, _) = page(objects, matcher, 0, rv, Value::clone);
    json_response(StatusCode::OK, &super::table::of(res, &items, rv))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_roundtrip() {
        let t = encode_token(42, "ns", "a-b");
        assert_eq!(decode_token(&t), Some((42, "ns".into(), "a-b".into())));
        assert_eq!(decode_token("zz"), None);
    }
}
