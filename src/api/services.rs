//! `GET /api/v1/services` (the current-state table, keyset-paged in SQL, label and VIP filters applied
//! in memory) and `GET /api/v1/services/{namespace}/{name}` (one Service, its last 20 events and its
//! delivery state per endpoint).

use std::collections::HashSet;
use std::sync::LazyLock;

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::ApiState;
use super::error::{ApiError, Problem};
use super::events::EventDto;
use super::extract::{Path, Query};
use super::pagination::{self, page, rfc3339};
use vipwatch_contract::{Backends, IpFamily};

use crate::model::backends::BackendSets;
use crate::model::{LabelSelector, ServiceKey, ServiceView};
use crate::store::{ServiceDeliveryState, ServicePageQuery, ServiceRow};

/// Rows read from the database per request at most when in-memory filters skip rows; a page may then
/// hold fewer than `limit` items with a `next_cursor` to go on from.
const SCAN_BUDGET: usize = 5000;

/// The label-selector syntax the API accepts (Kubernetes equality- and set-based terms); the same
/// literal is the `label_selector` pattern of the OpenAPI document (checked by a test below).
pub const SELECTOR_PATTERN: &str = r"^(|(!?[A-Za-z0-9._/-]+|[A-Za-z0-9._/-]+(=|==|!=)[A-Za-z0-9._-]*|[A-Za-z0-9._/-]+ (in|notin) \([A-Za-z0-9._-]*(,[A-Za-z0-9._-]*)*\))(,(!?[A-Za-z0-9._/-]+|[A-Za-z0-9._/-]+(=|==|!=)[A-Za-z0-9._-]*|[A-Za-z0-9._/-]+ (in|notin) \([A-Za-z0-9._-]*(,[A-Za-z0-9._-]*)*\)))*)$";

/// A VIP of a Service and where it comes from.
#[derive(Debug, Serialize, ToSchema)]
pub struct VipRef {
    /// IP address or hostname.
    pub address: String,
    /// `pool` (allocated by vipwatch from a `[[pools]]` entry) or `appliance` (returned by an endpoint
    /// with `assigns_vip`); for Services whose addresses vipwatch does not assign: `status` (published
    /// ingress), `annotation` (requested IPs) or `spec` (`spec.loadBalancerIP`).
    #[schema(pattern = "^(status|annotation|spec|pool|appliance)$")]
    pub source: String,
    /// `IPv4` or `IPv6`; `null` for a hostname.
    pub family: Option<IpFamily>,
    /// The pool this address was allocated from (`source = pool`), else `null`: each address its own,
    /// since a Service may hold an IPv4 and an IPv6 address of two pools.
    pub pool: Option<String>,
}

/// One in-scope Service: identity, VIPs and the normalized view.
#[derive(Debug, Serialize, ToSchema)]
pub struct ServiceDto {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `metadata.uid`.
    pub uid: String,
    /// Last seen `metadata.resourceVersion`.
    pub resource_version: String,
    /// When the Service entered scope (RFC 3339).
    #[schema(format = DateTime)]
    pub first_seen_at: String,
    /// When its row last changed (RFC 3339).
    #[schema(format = DateTime)]
    pub updated_at: String,
    /// Its VIPs: those vipwatch assigned (`pool`, `appliance`) when it assigns them; otherwise published
    /// ingress first, then requested by annotation, then `spec.loadBalancerIP`.
    pub vips: Vec<VipRef>,
    /// The normalized view.
    pub view: ServiceView,
    /// Its pool members per backend mode in use (`nodePort`, `pod`), as last announced: what is behind
    /// its VIPs.
    #[schema(value_type = std::collections::BTreeMap<String, Backends>)]
    #[serde(serialize_with = "vipwatch_contract::object")]
    pub backends: BackendSets,
    /// `true` when the mass-deletion guard holds this Service's deletion: a list missed it together
    /// with too many others (see `GET /api/v1/deletions/held`).
    pub held_deletion: bool,
}

impl From<ServiceRow> for ServiceDto {
    fn from(r: ServiceRow) -> Self {
        let allocation = r.view.allocation.as_ref();
        let vips = r.view.vip_sources().into_iter().map(|(address, s)| VipRef {
            family: IpFamily::of_address(&address),
            pool: allocation.and_then(|a| a.pool_of(&address)).map(str::to_owned),
            source: s.to_owned(),
            address,
        });
        Self {
            namespace: r.key.namespace.into(),
            name: r.key.name.into(),
            uid: r.uid,
            resource_version: r.resource_version,
            first_seen_at: rfc3339(r.first_seen_at),
            updated_at: rfc3339(r.updated_at),
            vips: vips.collect(),
            view: r.view,
            backends: r.backends,
            held_deletion: false,
        }
    }
}

page!(ServicePage, ServiceDto, "A page of in-scope Services, by namespace and name.");

/// `type` filter values.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
pub enum ServiceType {
    /// `ClusterIP`.
    ClusterIP,
    /// `NodePort`.
    NodePort,
    /// `LoadBalancer`.
    LoadBalancer,
    /// `ExternalName`.
    ExternalName,
}

/// Query of `GET /api/v1/services`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ServiceQuery {
    /// Only this namespace.
    pub namespace: Option<String>,
    /// Only Services whose labels match (Kubernetes syntax, e.g. `app=web,tier in (a,b),!legacy`).
    #[param(
        pattern = r"^(|(!?[A-Za-z0-9._/-]+|[A-Za-z0-9._/-]+(=|==|!=)[A-Za-z0-9._-]*|[A-Za-z0-9._/-]+ (in|notin) \([A-Za-z0-9._-]*(,[A-Za-z0-9._-]*)*\))(,(!?[A-Za-z0-9._/-]+|[A-Za-z0-9._/-]+(=|==|!=)[A-Za-z0-9._-]*|[A-Za-z0-9._/-]+ (in|notin) \([A-Za-z0-9._-]*(,[A-Za-z0-9._-]*)*\)))*)$"
    )]
    pub label_selector: Option<String>,
    /// Only this `spec.type`.
    #[serde(rename = "type")]
    #[param(rename = "type", inline)]
    pub service_type: Option<ServiceType>,
    /// `true`: only Services with at least one VIP; `false`: only those without.
    pub has_vip: Option<bool>,
    /// Page size, 1 to 1000.
    #[param(minimum = 1, maximum = 1000, default = 100)]
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

fn selector(q: &ServiceQuery) -> Result<Option<LabelSelector>, ApiError> {
    let Some(s) = &q.label_selector else { return Ok(None) };
    static PATTERN: LazyLock<regex::Regex> =
        LazyLock::new(|| regex::Regex::new(SELECTOR_PATTERN).expect("the selector pattern compiles"));
    if !PATTERN.is_match(s) {
        return Err(ApiError::InvalidQuery(format!("label_selector: `{s}` is not a label selector")));
    }
    LabelSelector::parse(s).map(Some).map_err(|e| ApiError::InvalidQuery(format!("label_selector: {e}")))
}

/// List the in-scope Services. With `label_selector` or `has_vip` (applied in memory), at most 5,000
/// rows are examined per request, so a page may hold fewer than `limit` items: follow `next_cursor`
/// until it is `null`.
#[utoipa::path(get, path = "/api/v1/services", tag = "services", params(ServiceQuery),
    responses((status = 200, description = "A page of Services", body = ServicePage)))]
pub async fn list_services(
    State(state): State<ApiState>,
    Query(q): Query<ServiceQuery>,
) -> Result<Json<ServicePage>, ApiError> {
    let limit = pagination::limit(q.limit)?;
    let selector = selector(&q)?;
    let after: Option<(String, String)> = pagination::after("services", q.cursor.as_deref())?;
    let mut query = ServicePageQuery {
        after: after.map(|(ns, name)| ServiceKey::new(ns, name)),
        namespace: q.namespace.clone(),
        service_type: q.service_type.map(|t| format!("{t:?}")),
        limit: i64::try_from(limit.max(200) + 1).unwrap_or(i64::MAX),
    };
    let keep = |r: &ServiceRow| {
        selector.as_ref().is_none_or(|s| s.matches_pairs(&r.view.labels))
            && q.has_vip.is_none_or(|want| want != r.view.vips().is_empty())
    };
    let (mut items, mut scanned) = (Vec::new(), 0usize);
    loop {
        let rows = state.store.services_page(&query).await?;
        let exhausted = rows.len() < query.limit as usize;
        scanned += rows.len();
        for row in rows {
            query.after = Some(row.key.clone());
            if keep(&row) {
                items.push(row);
            }
            if items.len() > limit {
                break;
            }
        }
        if items.len() > limit || exhausted {
            let (rows, next_cursor) =
                pagination::cut(items, limit, "services", |r| (r.key.namespace.clone(), r.key.name.clone()));
            return Ok(Json(ServicePage { items: dtos(&state, rows).await?, next_cursor }));
        }
        if scanned >= SCAN_BUDGET {
            let next_cursor =
                query.after.as_ref().map(|k| pagination::encode_cursor("services", &(&k.namespace, &k.name)));
            return Ok(Json(ServicePage { items: dtos(&state, items).await?, next_cursor }));
        }
    }
}

/// The rows as DTOs, `held_deletion` set from the guard's table.
async fn dtos(state: &ApiState, rows: Vec<ServiceRow>) -> Result<Vec<ServiceDto>, ApiError> {
    let held = state.store.held_keys().await?;
    Ok(rows.into_iter().map(|r| dto(r, &held)).collect())
}

/// The Service of `row`, with whether its deletion is held (`held`: the keys of the held ones).
fn dto(row: ServiceRow, held: &HashSet<ServiceKey>) -> ServiceDto {
    let held_deletion = held.contains(&row.key);
    ServiceDto { held_deletion, ..ServiceDto::from(row) }
}

/// Delivery state of one Service at one endpoint.
#[derive(Debug, Serialize, ToSchema)]
pub struct EndpointSync {
    /// Endpoint name.
    pub webhook: String,
    /// `in_sync` (nothing pending, last delivery succeeded), `pending` (deliveries waiting, none failed
    /// yet), `failing` (the head delivery failed an attempt, or the newest finished one gave up).
    #[schema(pattern = "^(in_sync|pending|failing)$")]
    pub state: String,
    /// Pending deliveries.
    pub pending: i64,
    /// Start of the newest 2xx attempt (RFC 3339).
    #[schema(format = DateTime)]
    pub last_success_at: Option<String>,
    /// Start of the newest failed attempt (RFC 3339).
    #[schema(format = DateTime)]
    pub last_failure_at: Option<String>,
    /// Why the Service's newest delivery to this endpoint is failing: its last attempt's error,
    /// with the receiver's own reason (e.g. the HAProxy agent's `422` naming the cluster and Service
    /// that hold a VIP:port); `null` while it is not failing.
    pub last_error: Option<String>,
}

/// One Service with its recent history.
#[derive(Debug, Serialize, ToSchema)]
pub struct ServiceDetail {
    /// The Service.
    pub service: ServiceDto,
    /// Its last 20 events, oldest first.
    pub events: Vec<EventDto>,
    /// Per configured endpoint (and any other that got deliveries for it), by name.
    pub deliveries: Vec<EndpointSync>,
}

/// One in-scope Service, its last 20 events and its delivery state per endpoint.
#[utoipa::path(get, path = "/api/v1/services/{namespace}/{name}", tag = "services",
    params(("namespace" = String, Path, description = "Namespace"), ("name" = String, Path, description = "Name")),
    responses((status = 200, description = "The Service", body = ServiceDetail),
        (status = 404, description = "Not in scope (never seen, or deleted)", body = Problem, content_type = "application/problem+json")))]
pub async fn get_service(
    State(state): State<ApiState>,
    Path((namespace, name)): Path<(String, String)>,
) -> Result<Json<ServiceDetail>, ApiError> {
    let key = ServiceKey::new(namespace, name);
    // Four reads that need nothing of each other, each on a read connection of its own: on
    // PostgreSQL each is a round trip to the server, so the answer waits for the slowest, not the sum.
    let store = &state.store;
    let (row, events, mut states, held) = tokio::try_join!(
        store.service(&key),
        store.recent_events(&key, 20),
        store.service_delivery_states(&key),
        store.held_keys(),
    )?;
    let row = row.ok_or_else(|| ApiError::NotFound(format!("Service `{key}`")))?;
    let events = events.into_iter().map(EventDto::from).collect();
    for w in &state.config.webhooks {
        if !states.iter().any(|s| s.webhook == w.name) {
            states.push(ServiceDeliveryState { webhook: w.name.clone(), ..Default::default() });
        }
    }
    states.sort_by(|a, b| a.webhook.cmp(&b.webhook));
    let deliveries = states
        .into_iter()
        .map(|s| EndpointSync {
            state: if s.retrying > 0 || s.last_finished_failed {
                "failing"
            } else if s.pending > 0 {
                "pending"
            } else {
                "in_sync"
            }
            .to_owned(),
            webhook: s.webhook,
            pending: s.pending,
            last_success_at: s.last_success_at.map(rfc3339),
            last_failure_at: s.last_failure_at.map(rfc3339),
            last_error: s.last_error,
        })
        .collect();
    let service = dto(row, &held);
    Ok(Json(ServiceDetail { service, events, deliveries }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_pattern_is_the_enforced_one() {
        let doc = serde_json::to_value(crate::api::openapi::document()).unwrap();
        let params = &doc["paths"]["/api/v1/services"]["get"]["parameters"];
        let selector = params.as_array().unwrap().iter().find(|p| p["name"] == "label_selector").unwrap();
        assert_eq!(selector["schema"]["pattern"], SELECTOR_PATTERN);
    }

    #[test]
    fn the_pattern_accepts_kubernetes_selectors_only() {
        let re = regex::Regex::new(SELECTOR_PATTERN).unwrap();
        for ok in ["", "app=web", "app==web,tier!=db", "env in (prod,stage)", "!legacy", "a.b/c notin (x)"] {
            assert!(re.is_match(ok) && LabelSelector::parse(ok).is_ok(), "{ok}");
        }
        for bad in ["a b=c", " app=web", "app=web,", "env in prod", "é=1"] {
            assert!(!re.is_match(bad), "{bad}");
        }
    }
}
