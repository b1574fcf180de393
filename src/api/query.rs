//! Query parameters an operation does not take are refused (400 `invalid_query`, naming the parameter
//! and the ones it takes) rather than ignored: a typo or a filter the server lacks must never look
//! like an empty or unfiltered answer. What each operation takes is read from the OpenAPI document
//! built from the same handlers, so what is documented is exactly what is accepted.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{MatchedPath, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use utoipa::openapi::path::ParameterIn;
use utoipa::openapi::{OpenApi as Document, RefOr};

use super::error::ApiError;

/// Per operation (method, path template as the router matches it, e.g. `/api/v1/events/{id}`): the
/// names of its query parameters, in the document's order.
#[derive(Debug, Default)]
pub struct KnownParams(HashMap<(Method, String), Vec<String>>);

impl KnownParams {
    /// The query parameters of every operation of `doc`.
    pub fn from_document(doc: &Document) -> Self {
        let mut known = HashMap::new();
        for (path, item) in doc.paths.paths.iter() {
            let ops = [(Method::GET, &item.get), (Method::POST, &item.post), (Method::PUT, &item.put)];
            for (method, op) in ops {
                let Some(op) = op else { continue };
                let names = op
                    .parameters
                    .iter()
                    .flatten()
                    .filter_map(|p| match p {
                        RefOr::T(p) if p.parameter_in == ParameterIn::Query => Some(p.name.clone()),
                        _ => None,
                    })
                    .collect();
                known.insert((method, path.clone()), names);
            }
        }
        Self(known)
    }

    /// The error for the first parameter of `query` (the raw query string) that `method` on `path`
    /// does not take; `None` when it takes them all, or the operation is not in the document.
    pub fn check(&self, method: &Method, path: &str, query: &str) -> Option<ApiError> {
        // axum answers HEAD with the GET handler.
        let method = if method == Method::HEAD { &Method::GET } else { method };
        let takes = self.0.get(&(method.clone(), path.to_owned()))?;
        let (name, _) =
            url::form_urlencoded::parse(query.as_bytes()).find(|(name, _)| !takes.iter().any(|t| t == name))?;
        let takes = if takes.is_empty() {
            "none".to_owned()
        } else {
            takes.iter().map(|t| format!("`{t}`")).collect::<Vec<_>>().join(", ")
        };
        Some(ApiError::InvalidQuery(format!("`{name}` is not a parameter of {method} {path} (it takes {takes})")))
    }
}

/// Middleware (on the documented routes): refuses a request whose query names a parameter its
/// operation does not take ([`KnownParams::check`]).
pub async fn refuse_unknown(State(known): State<Arc<KnownParams>>, request: Request, next: Next) -> Response {
    let path = request.extensions().get::<MatchedPath>().map(MatchedPath::as_str);
    if let (Some(path), Some(query)) = (path, request.uri().query())
        && let Some(error) = known.check(request.method(), path, query)
    {
        return error.into_response();
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_documented_parameter_is_taken_and_nothing_else() {
        let known = KnownParams::from_document(&super::super::openapi::document());
        let check = |method: Method, path: &str, query: &str| known.check(&method, path, query).map(|e| e.to_string());
        assert_eq!(check(Method::GET, "/api/v1/vips", "family=IPv6&namespace=a&limit=1&cursor=x"), None);
        assert_eq!(check(Method::HEAD, "/api/v1/vips", "family=IPv6"), None);
        assert_eq!(check(Method::GET, "/api/v1/vips", ""), None);
        assert_eq!(
            check(Method::GET, "/api/v1/events/{id}", "limit=1"),
            Some(
                "invalid query parameter: `limit` is not a parameter of GET /api/v1/events/{id} (it takes none)".into()
            )
        );
        assert_eq!(
            check(Method::GET, "/api/v1/nodes", "eligible=true&Limit=1"),
            Some(
                "invalid query parameter: `Limit` is not a parameter of GET /api/v1/nodes (it takes `eligible`, `limit`, `cursor`)"
                    .into()
            )
        );
        assert_eq!(check(Method::GET, "/not/documented", "x=1"), None);
    }
}
