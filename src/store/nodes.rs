//! The `nodes` table: the Node projections the members are computed from (written with each batch),
//! and their listing for `GET /api/v1/nodes`.

use std::collections::HashMap;

use super::db::PerBackend;
use super::script::{Script, Stmt};
use super::{StateChange, Store, StoreError};
use crate::model::backends::{NodeView, ObservedNode};

const UPSERT_NODES: PerBackend = PerBackend {
    lite: "INSERT INTO nodes (name, uid, resource_version, view, updated_at) \
     SELECT j.value->>'name', j.value->>'uid', j.value->>'rv', j.value->>'view', $1 FROM json_each($2) AS j WHERE true \
     ON CONFLICT (name) DO UPDATE SET uid = excluded.uid, resource_version = excluded.resource_version, \
     view = excluded.view, updated_at = excluded.updated_at",
    pg: "INSERT INTO nodes (name, uid, resource_version, view, updated_at) \
     SELECT j.name, j.uid, j.rv, j.view, $1 FROM jsonb_to_recordset($2::jsonb) AS j(name text, uid text, rv text, view text) \
     ON CONFLICT (name) DO UPDATE SET uid = excluded.uid, resource_version = excluded.resource_version, \
     view = excluded.view, updated_at = excluded.updated_at",
};

const DELETE_NODES: PerBackend = PerBackend {
    lite: "DELETE FROM nodes WHERE name IN (SELECT j.value FROM json_each($1) AS j)",
    pg: "DELETE FROM nodes WHERE name IN (SELECT jsonb_array_elements_text($1::jsonb))",
};

/// One row of the `nodes` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRow {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid`.
    pub uid: String,
    /// The resourceVersion of the last change that mattered.
    pub resource_version: String,
    /// The projection.
    pub view: NodeView,
    /// When the row last changed (Unix ms).
    pub updated_at: i64,
}

/// Folds the Node changes of a batch into the last one per Node, then one upsert and one delete.
pub(super) async fn write_nodes(s: &mut Script<'_>, now: i64, changes: &[StateChange]) -> Result<(), StoreError> {
    let mut last: HashMap<&str, Option<&ObservedNode>> = HashMap::new();
    for change in changes {
        if let StateChange::Node { name, node } = change {
            last.insert(name, node.as_deref());
        }
    }
    let mut upserts = Vec::new();
    let mut deletes = Vec::new();
    for (name, node) in last {
        match node {
            Some(n) => upserts.push(serde_json::json!({"name": name, "uid": n.uid, "rv": n.resource_version,
                "view": serde_json::to_string(&n.view)?})),
            None => deletes.push(name),
        }
    }
    if !deletes.is_empty() {
        s.run(Stmt::dual(s.backend(), &DELETE_NODES).bind(serde_json::to_string(&deletes)?)).await?;
    }
    if !upserts.is_empty() {
        s.run(Stmt::dual(s.backend(), &UPSERT_NODES).bind(now).bind(serde_json::to_string(&upserts)?)).await?;
    }
    Ok(())
}

impl Store {
    /// Every stored Node, by name (what the recorder starts from).
    pub async fn nodes(&self) -> Result<Vec<ObservedNode>, StoreError> {
        let rows = self.nodes_page(None, i64::MAX).await?;
        Ok(rows
            .into_iter()
            .map(|r| ObservedNode { name: r.name, uid: r.uid, resource_version: r.resource_version, view: r.view })
            .collect())
    }

    /// At most `limit` Nodes with a name after `after`, by name.
    pub async fn nodes_page(&self, after: Option<&str>, limit: i64) -> Result<Vec<NodeRow>, StoreError> {
        // LIMIT as a literal: see the `store` module docs.
        let sql = format!(
            "SELECT name, uid, resource_version, view, updated_at FROM nodes WHERE name > $1 ORDER BY name LIMIT {limit}"
        );
        let rows = self.read_all(self.backend.query_dyn(sql).bind(after.unwrap_or(""))).await?;
        rows.iter()
            .map(|r| {
                Ok(NodeRow {
                    name: r.get("name"),
                    uid: r.get("uid"),
                    resource_version: r.get("resource_version"),
                    view: serde_json::from_str(r.get::<&str, _>("view"))?,
                    updated_at: r.get("updated_at"),
                })
            })
            .collect()
    }
}
