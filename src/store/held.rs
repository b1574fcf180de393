//! Deletions held by the mass-deletion guard (`held_deletions`): written with the batch that holds or
//! releases them, read back at start and by the API.

use std::collections::HashSet;

use super::db::PerBackend;
use super::script::{Script, Stmt};
use super::state::StateChange;
use super::{Store, StoreError};
use crate::model::{Cause, ServiceKey};

/// One held deletion: a Service a list would have deleted in bulk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldDeletion {
    /// The Service.
    pub key: ServiceKey,
    /// `metadata.uid` of the object last seen.
    pub uid: String,
    /// The watch scope whose list missed it (`*` or a namespace), or `startup` when no configured
    /// scope covers its namespace any more.
    pub scope: String,
    /// Cause of its DELETED once released: `startup` or `relist`.
    pub cause: Cause,
    /// Why it is held, for humans (counts and threshold).
    pub reason: String,
    /// When it was held (Unix ms).
    pub held_at: i64,
}

const UPSERT: PerBackend = PerBackend {
    lite: "INSERT OR REPLACE INTO held_deletions (namespace, name, uid, scope, cause, reason, held_at) \
     SELECT j.value->>'ns', j.value->>'name', j.value->>'uid', j.value->>'scope', j.value->>'cause', \
     j.value->>'reason', j.value->>'at' FROM json_each($1) AS j",
    pg: "INSERT INTO held_deletions (namespace, name, uid, scope, cause, reason, held_at) \
     SELECT j.ns, j.name, j.uid, j.scope, j.cause, j.reason, j.at FROM jsonb_to_recordset($1::jsonb) \
     AS j(ns text, name text, uid text, scope text, cause text, reason text, at bigint) \
     ON CONFLICT (namespace, name) DO UPDATE SET uid = excluded.uid, scope = excluded.scope, \
     cause = excluded.cause, reason = excluded.reason, held_at = excluded.held_at",
};

const DELETE: PerBackend = PerBackend {
    lite: "DELETE FROM held_deletions WHERE (namespace, name) IN \
     (SELECT j.value->>0, j.value->>1 FROM json_each($1) AS j)",
    pg: "DELETE FROM held_deletions WHERE (namespace, name) IN \
     (SELECT j->>0, j->>1 FROM jsonb_array_elements($1::jsonb) AS j)",
};

/// Applies the [`StateChange::Held`] changes of a batch, in order (the last one per Service wins).
pub(super) async fn write_held(s: &mut Script<'_>, changes: &[StateChange]) -> Result<(), StoreError> {
    let mut last = std::collections::HashMap::new();
    for change in changes {
        if let StateChange::Held { key, held } = change {
            last.insert(key, held.as_deref());
        }
    }
    let (mut upserts, mut deletes) = (Vec::new(), Vec::new());
    for (key, held) in last {
        match held {
            Some(h) => upserts.push(serde_json::json!({"ns": key.namespace, "name": key.name, "uid": h.uid,
                "scope": h.scope, "cause": h.cause.as_str(), "reason": h.reason, "at": h.held_at})),
            None => deletes.push((&key.namespace, &key.name)),
        }
    }
    if !deletes.is_empty() {
        s.run(Stmt::dual(s.backend(), &DELETE).bind(serde_json::to_string(&deletes)?)).await?;
    }
    if !upserts.is_empty() {
        s.run(Stmt::dual(s.backend(), &UPSERT).bind(serde_json::to_string(&upserts)?)).await?;
    }
    Ok(())
}

impl Store {
    /// Every held deletion ordered by namespace, name.
    pub async fn held_deletions(&self) -> Result<Vec<HeldDeletion>, StoreError> {
        let sql = "SELECT namespace, name, uid, scope, cause, reason, held_at FROM held_deletions \
                   ORDER BY namespace, name";
        let rows = self.read_all(self.backend.query(sql)).await?;
        Ok(rows
            .iter()
            .map(|r| HeldDeletion {
                key: ServiceKey::new(r.get::<String, _>("namespace"), r.get::<String, _>("name")),
                uid: r.get("uid"),
                scope: r.get("scope"),
                cause: if r.get::<&str, _>("cause") == "startup" { Cause::Startup } else { Cause::Relist },
                reason: r.get("reason"),
                held_at: r.get("held_at"),
            })
            .collect())
    }

    /// The Services whose deletion is held (for `held_deletion` in the API).
    pub async fn held_keys(&self) -> Result<HashSet<ServiceKey>, StoreError> {
        let rows = self.read_all(self.backend.query("SELECT namespace, name FROM held_deletions")).await?;
        Ok(rows.iter().map(|r| ServiceKey::new(r.get::<String, _>("namespace"), r.get::<String, _>("name"))).collect())
    }
}
