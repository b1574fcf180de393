//! `GET /api/v1/vips` and `GET /api/v1/vips/{ip}`: the VIPs in use and the Services behind each,
//! served from the [`VipIndex`](super::vip_index::VipIndex).

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::ApiState;
use super::error::{ApiError, Problem};
use super::extract::{Path, Query};
use super::pagination::{self, page, rfc3339};
use super::vip_index::{Addr, Index, VipEntry};

use vipwatch_contract::{Backends, IpFamily};

use crate::model::backends::BackendSets;
use crate::model::{PortView, ServiceKey};

/// One (VIP, Service) pair.
#[derive(Debug, Serialize, ToSchema)]
pub struct VipItem {
    /// The VIP when it is an IP address (else `null`).
    pub ip: Option<String>,
    /// The VIP when it is a DNS name, from `status.loadBalancer.ingress[].hostname` (else `null`).
    pub hostname: Option<String>,
    /// Namespace of the Service.
    pub namespace: String,
    /// Name of the Service.
    pub name: String,
    /// The Service's ports.
    pub ports: Vec<PortView>,
    /// Where the VIP comes from: `pool` (allocated by vipwatch from a `[[pools]]` entry), `appliance`
    /// (returned by an endpoint with `assigns_vip`); for Services whose addresses vipwatch does not
    /// assign: `status` (published ingress), `annotation` (requested IPs), `spec` (`spec.loadBalancerIP`).
    #[schema(pattern = "^(status|annotation|spec|pool|appliance)$")]
    pub source: String,
    /// The pool this VIP was allocated from (`source = pool`), else `null`. A Service holding an IPv4
    /// and an IPv6 address of two pools has each item name its own address's pool.
    pub pool: Option<String>,
    /// `IPv4` or `IPv6`; `null` for a hostname.
    pub family: Option<IpFamily>,
    /// Since when the Service has this VIP (RFC 3339).
    #[schema(format = DateTime)]
    pub since: String,
}

page!(VipPage, VipItem, "A page of VIPs, by address (IPv4, IPv6, then hostnames), namespace, name.");

/// One Service behind a VIP, with its members.
#[derive(Debug, Serialize, ToSchema)]
pub struct VipService {
    /// The (VIP, Service) pair.
    #[serde(flatten)]
    pub item: VipItem,
    /// The Service's pool members per backend mode in use, as last announced.
    #[schema(value_type = std::collections::BTreeMap<String, Backends>)]
    #[serde(serialize_with = "vipwatch_contract::object")]
    pub backends: BackendSets,
}

/// One VIP and the Service(s) behind it.
#[derive(Debug, Serialize, ToSchema)]
pub struct VipDetail {
    /// The VIP when it is an IP address.
    pub ip: Option<String>,
    /// The VIP when it is a DNS name.
    pub hostname: Option<String>,
    /// Every Service using it, by namespace and name, with its members.
    pub services: Vec<VipService>,
}

/// Query of `GET /api/v1/vips`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct VipQuery {
    /// Only Services in this namespace.
    pub namespace: Option<String>,
    /// Only VIPs of this family (`IPv4`, `IPv6`); hostnames have none, so they are left out.
    #[param(inline)]
    pub family: Option<IpFamily>,
    /// Page size, 1 to 1000.
    #[param(minimum = 1, maximum = 1000, default = 100)]
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

fn item(e: VipEntry<'_>) -> VipItem {
    let (ip, hostname) = match e.addr {
        Addr::Ip(_) => (Some(e.address()), None),
        Addr::Host(_) => (None, Some(e.address())),
    };
    VipItem {
        ip,
        hostname,
        namespace: e.key.namespace.to_string(),
        name: e.key.name.to_string(),
        ports: e.ports().to_vec(),
        source: e.source().to_owned(),
        pool: e.pool().map(str::to_owned),
        family: e.addr.family(),
        since: rfc3339(e.since()),
    }
}

/// List the VIPs in use: one item per (VIP, Service).
///
/// A page includes every change recorded before the request. A status-only change (an ingress
/// address another controller published: it records no event) shows within a second on a small
/// cluster, and within ten times the time a read of every Service takes on a large one.
#[utoipa::path(get, path = "/api/v1/vips", tag = "vips", params(VipQuery),
    responses((status = 200, description = "A page of VIPs", body = VipPage)))]
pub async fn list_vips(State(state): State<ApiState>, Query(q): Query<VipQuery>) -> Result<Json<VipPage>, ApiError> {
    let limit = pagination::limit(q.limit)?;
    let after: Option<(String, String, String)> = pagination::after("vips", q.cursor.as_deref())?;
    let after = after.map(|(addr, ns, name)| (Addr::parse(&addr), ServiceKey::new(ns, name)));
    let page = |index: &Index| {
        let rows: Vec<VipEntry> = index
            .after(after)
            .filter(|e| q.namespace.as_ref().is_none_or(|ns| *ns == e.key.namespace))
            .filter(|e| q.family.is_none_or(|f| e.addr.family() == Some(f)))
            .take(limit + 1)
            .collect();
        let (rows, next_cursor) =
            pagination::cut(rows, limit, "vips", |e| (e.address(), e.key.namespace.as_str(), e.key.name.as_str()));
        VipPage { items: rows.into_iter().map(item).collect(), next_cursor }
    };
    Ok(Json(state.read_vips(page).await?))
}

/// The Service(s) behind one VIP (an IP address or a hostname).
#[utoipa::path(get, path = "/api/v1/vips/{ip}", tag = "vips",
    params(("ip" = String, Path, description = "The VIP: an IP address or a hostname")),
    responses((status = 200, description = "The VIP and its Services", body = VipDetail),
        (status = 404, description = "No Service uses this VIP", body = Problem, content_type = "application/problem+json")))]
pub async fn get_vip(State(state): State<ApiState>, Path(ip): Path<String>) -> Result<Json<VipDetail>, ApiError> {
    let addr = Addr::parse(&ip);
    let items = |index: &Index| index.of(&addr).into_iter().map(|e| (e.key.clone(), item(e))).collect::<Vec<_>>();
    let entries = state.read_vips(items).await?;
    let Some((ip, hostname)) = entries.first().map(|(_, first)| (first.ip.clone(), first.hostname.clone())) else {
        return Err(ApiError::NotFound(format!("VIP `{ip}`")));
    };
    let mut services = Vec::with_capacity(entries.len());
    for (key, item) in entries {
        let backends = state.store.service(&key).await?.map(|r| r.backends).unwrap_or_default();
        services.push(VipService { item, backends });
    }
    Ok(Json(VipDetail { ip, hostname, services }))
}
