//! `GET /api/v1/nodes`: the Nodes vipwatch knows, with whether each may carry load-balancer traffic
//! (mode `nodePort` members) and, when not, why.

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::ApiState;
use super::error::ApiError;
use super::extract::Query;
use super::pagination::{self, page, rfc3339};
use crate::store::NodeRow;

/// One address of a Node.
#[derive(Debug, Serialize, ToSchema)]
pub struct NodeAddressDto {
    /// `InternalIP` or `ExternalIP`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The address.
    pub address: String,
}

/// One Node.
#[derive(Debug, Serialize, ToSchema)]
pub struct NodeDto {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid`.
    pub uid: String,
    /// Whether it is a member of every Service in mode `nodePort` (readiness does not count: the
    /// appliance's health check decides that).
    pub eligible: bool,
    /// Why not (being deleted, the exclusion label, the cluster autoscaler's taint); `null` when
    /// eligible.
    pub reason: Option<String>,
    /// Its `InternalIP` and `ExternalIP` addresses, in the Node's order.
    pub addresses: Vec<NodeAddressDto>,
    /// `topology.kubernetes.io/zone`.
    pub zone: Option<String>,
    /// When vipwatch last saw a change that matters here (RFC 3339).
    #[schema(format = DateTime)]
    pub updated_at: String,
}

impl From<NodeRow> for NodeDto {
    fn from(r: NodeRow) -> Self {
        let addresses =
            r.view.addresses.into_iter().map(|a| NodeAddressDto { kind: a.kind, address: a.address }).collect();
        Self {
            name: r.name,
            uid: r.uid,
            eligible: r.view.excluded_by.is_none(),
            reason: r.view.excluded_by,
            addresses,
            zone: r.view.zone,
            updated_at: rfc3339(r.updated_at),
        }
    }
}

page!(NodePage, NodeDto, "A page of Nodes, by name.");

/// Query of `GET /api/v1/nodes`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct NodeQuery {
    /// Only eligible (`true`) or only excluded (`false`) Nodes.
    pub eligible: Option<bool>,
    /// Page size, 1 to 1000.
    #[param(minimum = 1, maximum = 1000, default = 100)]
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

/// List the Nodes, with their eligibility for load-balancer traffic. Empty when no backend mode is
/// configured (`[backends] mode = "none"`): Nodes are not watched then.
#[utoipa::path(get, path = "/api/v1/nodes", tag = "nodes", params(NodeQuery),
    responses((status = 200, description = "A page of Nodes", body = NodePage)))]
pub async fn list_nodes(State(state): State<ApiState>, Query(q): Query<NodeQuery>) -> Result<Json<NodePage>, ApiError> {
    let limit = pagination::limit(q.limit)?;
    let mut after: Option<String> = pagination::after("nodes", q.cursor.as_deref())?;
    let mut items = Vec::new();
    loop {
        let rows = state.store.nodes_page(after.as_deref(), 1001).await?;
        let exhausted = rows.len() < 1001;
        for row in rows {
            after = Some(row.name.clone());
            if q.eligible.is_none_or(|want| want == row.view.eligible()) {
                items.push(row);
            }
        }
        if items.len() > limit || exhausted {
            break;
        }
    }
    let (rows, next_cursor) = pagination::cut(items, limit, "nodes", |r| r.name.clone());
    Ok(Json(NodePage { items: rows.into_iter().map(NodeDto::from).collect(), next_cursor }))
}
