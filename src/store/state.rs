//! Writing changes (event row + state row in one transaction) and reading the current-state table.

use std::collections::HashMap;

use sqlx::{Row, Sqlite, Transaction};

use super::progress::{WatchProgress, write_progress};
use super::{Store, StoreError, now_ms};
use crate::model::{Cause, ChangeKind, Recorded, ServiceKey, ServiceView, Tracked};

/// One change to persist, in the order given to [`Store::apply`].
#[derive(Debug, Clone)]
pub enum StateChange {
    /// Append an event and apply it to the state row: ADDED/MODIFIED upsert, DELETED removes.
    Event {
        /// The Service.
        key: ServiceKey,
        /// Why it was recorded.
        cause: Cause,
        /// The event itself.
        event: Recorded,
    },
    /// Update the state row without an event (status-only or resourceVersion-only update).
    Refresh {
        /// The Service.
        key: ServiceKey,
        /// Its new tracked state.
        tracked: Tracked,
    },
}

/// One row of the current-state table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceRow {
    /// Namespace and name.
    pub key: ServiceKey,
    /// `metadata.uid`.
    pub uid: String,
    /// Last seen `metadata.resourceVersion`.
    pub resource_version: String,
    /// The normalized view.
    pub view: ServiceView,
    /// When the Service entered scope (Unix ms).
    pub first_seen_at: i64,
    /// When the row last changed (Unix ms).
    pub updated_at: i64,
}

impl Store {
    /// Persists `changes` and `progress` in ONE transaction (one fsync): all or nothing. Returns the
    /// ids of the inserted event rows, in order. Errors: [`StoreError`]; nothing is written then.
    pub async fn apply(&self, changes: &[StateChange], progress: &[WatchProgress]) -> Result<Vec<i64>, StoreError> {
        let now = now_ms();
        let mut tx = self.pool.begin().await?;
        let mut ids = Vec::new();
        for change in changes {
            match change {
                StateChange::Event { key, cause, event } => {
                    ids.push(insert_event(&mut tx, now, key, *cause, event).await?);
                    apply_to_state(&mut tx, now, key, event).await?;
                }
                StateChange::Refresh { key, tracked } => refresh(&mut tx, now, key, tracked).await?,
            }
        }
        for p in progress {
            write_progress(&mut tx, now, p).await?;
        }
        tx.commit().await?;
        Ok(ids)
    }

    /// Every row of the current-state table, keyed by Service: what the recorder diffs against.
    pub async fn load_tracked(&self) -> Result<HashMap<ServiceKey, Tracked>, StoreError> {
        let rows = self.services().await?;
        Ok(rows
            .into_iter()
            .map(|r| (r.key, Tracked { uid: r.uid, resource_version: r.resource_version, view: r.view }))
            .collect())
    }

    /// The whole current-state table ordered by namespace, name.
    pub async fn services(&self) -> Result<Vec<ServiceRow>, StoreError> {
        let sql = "SELECT namespace, name, uid, resource_version, view, first_seen_at, updated_at \
                   FROM services ORDER BY namespace, name";
        let rows = sqlx::query(sql).fetch_all(&self.pool).await?;
        rows.iter().map(service_row).collect()
    }
}

fn service_row(r: &sqlx::sqlite::SqliteRow) -> Result<ServiceRow, StoreError> {
    Ok(ServiceRow {
        key: ServiceKey::new(r.get::<String, _>("namespace"), r.get::<String, _>("name")),
        uid: r.get("uid"),
        resource_version: r.get("resource_version"),
        view: serde_json::from_str(r.get::<&str, _>("view"))?,
        first_seen_at: r.get("first_seen_at"),
        updated_at: r.get("updated_at"),
    })
}

async fn insert_event(
    tx: &mut Transaction<'_, Sqlite>,
    now: i64,
    key: &ServiceKey,
    cause: Cause,
    e: &Recorded,
) -> Result<i64, StoreError> {
    let previous = e.previous.as_ref().map(serde_json::to_string).transpose()?;
    let changed = (e.kind == ChangeKind::Modified).then(|| serde_json::to_string(&e.changed)).transpose()?;
    let sql = "INSERT INTO events (observed_at, type, namespace, name, uid, resource_version, cause, view, \
               previous, changed) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id";
    let id: i64 = sqlx::query_scalar(sql)
        .bind(now)
        .bind(e.kind.as_str())
        .bind(&key.namespace)
        .bind(&key.name)
        .bind(&e.uid)
        .bind(&e.resource_version)
        .bind(cause.as_str())
        .bind(serde_json::to_string(&e.view)?)
        .bind(previous)
        .bind(changed)
        .fetch_one(&mut **tx)
        .await?;
    Ok(id)
}

async fn apply_to_state(
    tx: &mut Transaction<'_, Sqlite>,
    now: i64,
    key: &ServiceKey,
    e: &Recorded,
) -> Result<(), StoreError> {
    if e.kind == ChangeKind::Deleted {
        let sql = "DELETE FROM services WHERE namespace = ? AND name = ?";
        sqlx::query(sql).bind(&key.namespace).bind(&key.name).execute(&mut **tx).await?;
        return Ok(());
    }
    let sql = "INSERT INTO services (namespace, name, uid, resource_version, type, load_balancer_class, view, \
               first_seen_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) \
               ON CONFLICT (namespace, name) DO UPDATE SET uid = excluded.uid, \
               resource_version = excluded.resource_version, type = excluded.type, \
               load_balancer_class = excluded.load_balancer_class, view = excluded.view, \
               updated_at = excluded.updated_at";
    sqlx::query(sql)
        .bind(&key.namespace)
        .bind(&key.name)
        .bind(&e.uid)
        .bind(&e.resource_version)
        .bind(&e.view.service_type)
        .bind(&e.view.load_balancer_class)
        .bind(serde_json::to_string(&e.view)?)
        .bind(now)
        .bind(now)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

async fn refresh(
    tx: &mut Transaction<'_, Sqlite>,
    now: i64,
    key: &ServiceKey,
    t: &Tracked,
) -> Result<(), StoreError> {
    let sql = "UPDATE services SET uid = ?, resource_version = ?, view = ?, updated_at = ? \
               WHERE namespace = ? AND name = ?";
    sqlx::query(sql)
        .bind(&t.uid)
        .bind(&t.resource_version)
        .bind(serde_json::to_string(&t.view)?)
        .bind(now)
        .bind(&key.namespace)
        .bind(&key.name)
        .execute(&mut **tx)
        .await?;
    Ok(())
}
