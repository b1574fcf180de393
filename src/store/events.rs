//! Reading the event log, and pruning it by age.

use serde::Serialize;
use std::collections::BTreeMap;

use vipwatch_contract::{BackendMode, BackendsDiff};

use super::db::{Filter, Row};
use super::{Store, StoreError};
use crate::model::backends::BackendSets;
use crate::model::{ServiceKey, ServiceView};

/// One event-log row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EventRow {
    /// Monotonically increasing id (never reused).
    pub id: i64,
    /// When vipwatch observed the change (Unix ms).
    pub observed_at: i64,
    /// `ADDED`, `MODIFIED` or `DELETED`.
    pub event_type: String,
    /// Namespace and name.
    pub key: ServiceKey,
    /// `metadata.uid` of the object.
    pub uid: String,
    /// `metadata.resourceVersion` at the change.
    pub resource_version: String,
    /// `watch`, `relist` or `startup`.
    pub cause: String,
    /// The view after the change (the last view for DELETED).
    pub view: ServiceView,
    /// MODIFIED: the view before.
    pub previous: Option<ServiceView>,
    /// MODIFIED: changed field names; empty otherwise.
    pub changed: Vec<String>,
    /// ADDED and DELETED: the members per mode (empty when none are computed); otherwise empty.
    pub backends: BackendSets,
    /// MODIFIED whose members changed: what changed, per mode; otherwise empty.
    pub backends_diff: BTreeMap<BackendMode, BackendsDiff>,
}

/// Filters for [`Store::events`]; `None` / empty = no filter. Results are ordered by id ascending.
#[derive(Debug, Clone, Default)]
pub struct EventFilter {
    /// Only ids strictly greater than this.
    pub after_id: Option<i64>,
    /// Only this namespace.
    pub namespace: Option<String>,
    /// Only this Service name.
    pub name: Option<String>,
    /// Only this type (`ADDED`, `MODIFIED`, `DELETED`).
    pub event_type: Option<String>,
    /// Only this cause (`watch`, `relist`, `startup`).
    pub cause: Option<String>,
    /// Only events observed at or after this time (Unix ms).
    pub since_ms: Option<i64>,
    /// Only events observed before this time (Unix ms).
    pub until_ms: Option<i64>,
    /// At most this many rows; `None` = all.
    pub limit: Option<i64>,
}

const EVENT_COLUMNS: &str = "SELECT id, observed_at, type, namespace, name, uid, resource_version, cause, view, \
     previous, changed, backends, backends_diff FROM events";

impl Store {
    /// Events matching `filter`, by id ascending.
    pub async fn events(&self, filter: &EventFilter) -> Result<Vec<EventRow>, StoreError> {
        let mut w = Filter::default();
        if let Some(v) = filter.after_id {
            w.int("id", ">", v);
        }
        w.eq_opt("namespace", &filter.namespace).eq_opt("name", &filter.name);
        w.eq_opt("type", &filter.event_type).eq_opt("cause", &filter.cause);
        if let Some(v) = filter.since_ms {
            w.int("observed_at", ">=", v);
        }
        if let Some(v) = filter.until_ms {
            w.int("observed_at", "<", v);
        }
        // LIMIT as a literal: see the `store` module docs.
        let limit = filter.limit.map(|l| format!(" LIMIT {l}")).unwrap_or_default();
        let rows = self.read_all(w.query(self.backend, EVENT_COLUMNS, &format!(" ORDER BY id{limit}"))).await?;
        rows.iter().map(event_row).collect()
    }

    /// The last `n` events of one Service (any uid), oldest first: one statement, newest first on the
    /// `(namespace, name, id)` index, so its cost follows `n`, not the size of the log.
    pub async fn recent_events(&self, key: &ServiceKey, n: i64) -> Result<Vec<EventRow>, StoreError> {
        // LIMIT as a literal: see the `store` module docs.
        let sql = format!("{EVENT_COLUMNS} WHERE namespace = $1 AND name = $2 ORDER BY id DESC LIMIT {n}");
        let q = self.backend.query_dyn(sql).bind(key.namespace.as_str()).bind(key.name.as_str());
        let mut events = self.read_all(q).await?.iter().map(event_row).collect::<Result<Vec<_>, _>>()?;
        events.reverse();
        Ok(events)
    }

    /// Number of rows in the event log.
    pub async fn event_count(&self) -> Result<i64, StoreError> {
        Ok(self.read_one(self.backend.query("SELECT COUNT(*) FROM events")).await?.get(0))
    }

    /// Deletes events observed before `cutoff_ms` (Unix ms), and finished deliveries (succeeded,
    /// superseded, failed) that finished before it, with their attempts; pending deliveries are never
    /// pruned. Returns how many events were deleted. Rows go in transactions of at most
    /// [`PRUNE_BATCH`], each its own write: a month of events in one
    /// transaction would hold the writer (and, on PostgreSQL, the leader's lease row, which its
    /// renewal must update) for seconds.
    pub async fn prune_events(&self, cutoff_ms: i64) -> Result<u64, StoreError> {
        // LIMIT as a literal: see the `store` module docs.
        let events = format!(
            "DELETE FROM events WHERE id IN (SELECT id FROM events WHERE observed_at < $1 ORDER BY id LIMIT {PRUNE_BATCH})"
        );
        let finished = format!(
            "DELETE FROM deliveries WHERE id IN (SELECT id FROM deliveries WHERE state <> 'pending' \
             AND finished_at < $1 ORDER BY id LIMIT {PRUNE_BATCH})"
        );
        let mut pruned = 0;
        loop {
            let n = self.prune_batch(&events, cutoff_ms).await?;
            pruned += n;
            if n < PRUNE_BATCH {
                break;
            }
        }
        while self.prune_batch(&finished, cutoff_ms).await? == PRUNE_BATCH {}
        Ok(pruned)
    }

    async fn prune_batch(&self, sql: &str, cutoff_ms: i64) -> Result<u64, StoreError> {
        self.execute(self.backend.query_dyn(sql.to_owned()).bind(cutoff_ms)).await
    }
}

/// Rows per pruning transaction ([`Store::prune_events`]).
pub const PRUNE_BATCH: u64 = 5_000;

fn event_row(r: &Row) -> Result<EventRow, StoreError> {
    let previous: Option<&str> = r.get("previous");
    let changed: Option<&str> = r.get("changed");
    let backends: Option<&str> = r.get("backends");
    let backends_diff: Option<&str> = r.get("backends_diff");
    Ok(EventRow {
        id: r.get("id"),
        observed_at: r.get("observed_at"),
        event_type: r.get("type"),
        key: ServiceKey::new(r.get::<String, _>("namespace"), r.get::<String, _>("name")),
        uid: r.get("uid"),
        resource_version: r.get("resource_version"),
        cause: r.get("cause"),
        view: serde_json::from_str(r.get::<&str, _>("view"))?,
        previous: previous.map(serde_json::from_str).transpose()?,
        changed: changed.map(serde_json::from_str).transpose()?.unwrap_or_default(),
        backends: backends.map(serde_json::from_str).transpose()?.unwrap_or_default(),
        backends_diff: backends_diff.map(serde_json::from_str).transpose()?.unwrap_or_default(),
    })
}
