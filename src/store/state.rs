//! Writing changes (event rows + state rows in one transaction) and reading the current-state table.
//!
//! A batch is written with a constant number of statements whatever its size: rows travel as one JSON
//! array parameter expanded by SQLite's `json_each`, so 10,000 events cost one INSERT, not 10,000.

use std::collections::HashMap;

use serde::Serialize;
use sqlx::Connection as _;
use sqlx::{QueryBuilder, Row, Sqlite, Transaction};

use super::outbox::{Outbox, RecordedEvent, enqueue};
use super::progress::{WatchProgress, write_progress};
use super::{Store, StoreError, now_ms};
use crate::model::backends::{BackendSets, ObservedNode};
use crate::model::{Cause, ChangeKind, IngressView, Recorded, ServiceKey, ServiceView, Tracked};

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
        event: Box<Recorded>,
        /// Its deliveries wait until vipwatch's finalizer is on the Service (see [`Store::held_services`]).
        hold: bool,
        /// For a DELETED of a Service that still exists: what to undo in Kubernetes once every
        /// endpoint acknowledged it (see [`Store::cleanups`]).
        cleanup: Option<Cleanup>,
    },
    /// Update the state row without an event (status-only or resourceVersion-only update).
    Refresh {
        /// The Service.
        key: ServiceKey,
        /// Its new tracked state.
        tracked: Box<Tracked>,
    },
    /// Store a Node's projection (`Some`) or forget the Node (`None`); no event.
    Node {
        /// `metadata.name`.
        name: String,
        /// The Node as observed.
        node: Option<Box<ObservedNode>>,
    },
    /// Hold the deletion of a Service (`Some`) or stop holding it (`None`); no event (see
    /// [`Store::held_deletions`]).
    Held {
        /// The Service.
        key: ServiceKey,
        /// The held deletion.
        held: Option<Box<super::HeldDeletion>>,
    },
}

/// What to undo on a Service that still exists after its DELETED was acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cleanup {
    /// Remove vipwatch's finalizer (it was on the object).
    pub remove_finalizer: bool,
    /// The `status.loadBalancer.ingress` vipwatch published, to clear if the Service still shows it
    /// (empty = leave the status alone).
    pub clear_ingress: Vec<IngressView>,
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
    /// Its members per backend mode, as last announced.
    pub backends: BackendSets,
    /// When the Service entered scope (Unix ms).
    pub first_seen_at: i64,
    /// When the row last changed (Unix ms).
    pub updated_at: i64,
}

/// An event row, serialized for binding.
struct EventJson<'a> {
    kind: &'static str,
    ns: &'a str,
    name: &'a str,
    uid: &'a str,
    rv: &'a str,
    cause: &'static str,
    view: String,
    previous: Option<String>,
    changed: Option<String>,
    backends: Option<String>,
    backends_diff: Option<String>,
}

/// A state row upsert as it travels in the JSON array parameter.
#[derive(Serialize)]
struct UpsertJson<'a> {
    ns: &'a str,
    name: &'a str,
    uid: &'a str,
    rv: &'a str,
    ty: &'a str,
    class: Option<&'a str>,
    view: String,
    publish: Option<String>,
    backends: Option<String>,
}

/// The last state-table operation per Service in a batch.
enum Final<'a> {
    Upsert { uid: &'a str, rv: &'a str, view: &'a ServiceView, backends: &'a BackendSets },
    Delete,
}

const UPSERT_SERVICES: &str = "INSERT INTO services (namespace, name, uid, resource_version, type, \
     load_balancer_class, view, publish, backends, first_seen_at, updated_at) SELECT j.value->>'ns', \
     j.value->>'name', j.value->>'uid', j.value->>'rv', j.value->>'ty', j.value->>'class', j.value->>'view', \
     j.value->>'publish', j.value->>'backends', ?1, ?1 \
     FROM json_each(?2) AS j WHERE true ON CONFLICT (namespace, name) DO UPDATE SET \
     first_seen_at = CASE WHEN services.uid = excluded.uid THEN services.first_seen_at ELSE excluded.first_seen_at END, \
     uid = excluded.uid, resource_version = excluded.resource_version, type = excluded.type, \
     load_balancer_class = excluded.load_balancer_class, view = excluded.view, publish = excluded.publish, \
     backends = excluded.backends, updated_at = excluded.updated_at";

const INSERT_RELEASES: &str = "INSERT OR REPLACE INTO releases (event_id, namespace, name, uid, addresses, created_at) \
     SELECT j.value->>'id', j.value->>'ns', j.value->>'name', j.value->>'uid', j.value->>'addresses', ?1 \
     FROM json_each(?2) AS j";

const INSERT_CLEANUPS: &str = "INSERT OR REPLACE INTO cleanups (event_id, namespace, name, uid, remove_finalizer, \
     clear_ingress, created_at) SELECT j.value->>'id', j.value->>'ns', j.value->>'name', j.value->>'uid', \
     j.value->>'fin', j.value->>'clear', ?1 FROM json_each(?2) AS j";

const DELETE_SERVICES: &str = "DELETE FROM services WHERE (namespace, name) IN \
     (SELECT j.value->>0, j.value->>1 FROM json_each(?1) AS j)";

impl Store {
    /// Persists `changes` and `progress` in ONE transaction (one commit): all or nothing. Event rows
    /// get ids in the order given, and `outbox` turns each into its deliveries in the same transaction;
    /// the state table ends as if each change were applied in order. Returns the new event ids,
    /// ascending. Errors: [`StoreError`]; nothing is written then.
    pub async fn apply(
        &self,
        changes: &[StateChange],
        progress: &[WatchProgress],
        outbox: &dyn Outbox,
    ) -> Result<Vec<i64>, StoreError> {
        let now = now_ms();
        let mut conn = self.writer().await?;
        let result = async {
            let mut tx = conn.begin().await?;
            let ids = insert_events(&mut tx, now, changes).await?;
            let recorded: Vec<(RecordedEvent<'_>, Option<i64>, bool)> = changes
                .iter()
                .filter_map(|c| match c {
                    StateChange::Event { key, cause, event, hold, .. } => Some((key, *cause, event.as_ref(), *hold)),
                    StateChange::Refresh { .. } | StateChange::Node { .. } | StateChange::Held { .. } => None,
                })
                .zip(&ids)
                .map(|((key, cause, event, hold), id)| {
                    (RecordedEvent { id: *id, observed_at: now, key, cause, event }, Some(*id), hold)
                })
                .collect();
            enqueue(&mut tx, now, outbox, &recorded).await?;
            insert_cleanups(&mut tx, now, changes, &ids).await?;
            write_state(&mut tx, now, changes).await?;
            super::nodes::write_nodes(&mut tx, now, changes).await?;
            super::held::write_held(&mut tx, changes).await?;
            for p in progress {
                write_progress(&mut tx, now, p).await?;
            }
            tx.commit().await?;
            Ok(ids)
        }
        .await;
        self.settle(conn, result)
    }

    /// Every row of the current-state table, keyed by Service: what the recorder diffs against.
    pub async fn load_tracked(&self) -> Result<HashMap<ServiceKey, Tracked>, StoreError> {
        let rows = self.services().await?;
        Ok(rows
            .into_iter()
            .map(|r| {
                let tracked = Tracked {
                    uid: r.uid,
                    resource_version: r.resource_version,
                    view: r.view.into(),
                    backends: r.backends,
                };
                (r.key, tracked)
            })
            .collect())
    }

    /// The whole current-state table ordered by namespace, name.
    pub async fn services(&self) -> Result<Vec<ServiceRow>, StoreError> {
        let sql = "SELECT namespace, name, uid, resource_version, view, backends, first_seen_at, updated_at \
                   FROM services ORDER BY namespace, name";
        let rows = sqlx::query(sql).fetch_all(&self.pool).await?;
        rows.iter().map(service_row).collect()
    }
}

pub(super) fn service_row(r: &sqlx::sqlite::SqliteRow) -> Result<ServiceRow, StoreError> {
    Ok(ServiceRow {
        key: ServiceKey::new(r.get::<String, _>("namespace"), r.get::<String, _>("name")),
        uid: r.get("uid"),
        resource_version: r.get("resource_version"),
        view: serde_json::from_str(r.get::<&str, _>("view"))?,
        backends: r.get::<Option<&str>, _>("backends").map(serde_json::from_str).transpose()?.unwrap_or_default(),
        first_seen_at: r.get("first_seen_at"),
        updated_at: r.get("updated_at"),
    })
}

/// Rows per multi-row INSERT: 12 parameters each, far below SQLite's 32,766-parameter limit. Batches
/// are cut into chunks of 128, 64, ..., 1 rows so at most 8 distinct statements get prepared.
const EVENT_CHUNK: usize = 128;

async fn insert_events(
    tx: &mut Transaction<'_, Sqlite>,
    now: i64,
    changes: &[StateChange],
) -> Result<Vec<i64>, StoreError> {
    let mut rows = Vec::new();
    for change in changes {
        if let StateChange::Event { key, cause, event: e, .. } = change {
            rows.push(EventJson {
                kind: e.kind.as_str(),
                ns: &key.namespace,
                name: &key.name,
                uid: &e.uid,
                rv: &e.resource_version,
                cause: cause.as_str(),
                view: serde_json::to_string(&e.view)?,
                previous: e.previous.as_ref().map(serde_json::to_string).transpose()?,
                changed: (e.kind == ChangeKind::Modified).then(|| serde_json::to_string(&e.changed)).transpose()?,
                backends: (e.kind != ChangeKind::Modified && !e.backends.is_empty())
                    .then(|| serde_json::to_string(&e.backends))
                    .transpose()?,
                backends_diff: (!e.backends_diff.is_empty())
                    .then(|| serde_json::to_string(&e.backends_diff))
                    .transpose()?,
            });
        }
    }
    let mut ids = Vec::with_capacity(rows.len());
    let mut rest = &rows[..];
    while !rest.is_empty() {
        let n = if rest.len() >= EVENT_CHUNK { EVENT_CHUNK } else { 1 << rest.len().ilog2() };
        let (chunk, tail) = rest.split_at(n);
        ids.extend(insert_event_chunk(tx, now, chunk).await?);
        rest = tail;
    }
    ids.sort_unstable();
    Ok(ids)
}

async fn insert_event_chunk(
    tx: &mut Transaction<'_, Sqlite>,
    now: i64,
    chunk: &[EventJson<'_>],
) -> Result<Vec<i64>, StoreError> {
    let mut q: QueryBuilder<Sqlite> = QueryBuilder::new(
        "INSERT INTO events (observed_at, type, namespace, name, uid, resource_version, cause, view, previous, changed, \
         backends, backends_diff) ",
    );
    q.push_values(chunk, |mut b, r| {
        b.push_bind(now)
            .push_bind(r.kind)
            .push_bind(r.ns)
            .push_bind(r.name)
            .push_bind(r.uid)
            .push_bind(r.rv)
            .push_bind(r.cause)
            .push_bind(&r.view)
            .push_bind(&r.previous)
            .push_bind(&r.changed)
            .push_bind(&r.backends)
            .push_bind(&r.backends_diff);
    });
    q.push(" RETURNING id");
    Ok(q.build_query_scalar().fetch_all(&mut **tx).await?)
}

/// Records the follow-up work of events (ids in event order, as [`insert_events`] returns):
/// cleanups of objects that still exist, and the pool addresses to release once acknowledged (of
/// DELETED events and of MODIFIED events that withdrew some, see [`crate::ipam::withdrawn`]).
async fn insert_cleanups(
    tx: &mut Transaction<'_, Sqlite>,
    now: i64,
    changes: &[StateChange],
    ids: &[i64],
) -> Result<(), StoreError> {
    let events = changes.iter().filter_map(|c| match c {
        StateChange::Event { key, event, cleanup, .. } => Some((key, event, cleanup)),
        StateChange::Refresh { .. } | StateChange::Node { .. } | StateChange::Held { .. } => None,
    });
    let mut rows = Vec::new();
    let mut releases = Vec::new();
    for ((key, event, cleanup), id) in events.zip(ids) {
        let withdrawn = crate::ipam::withdrawn(event);
        if !withdrawn.is_empty() {
            releases.push(serde_json::json!({"id": id, "ns": key.namespace, "name": key.name, "uid": event.uid,
                "addresses": serde_json::to_string(&withdrawn)?}));
        }
        if let Some(c) = cleanup {
            let clear = (!c.clear_ingress.is_empty()).then(|| serde_json::to_string(&c.clear_ingress)).transpose()?;
            rows.push(serde_json::json!({"id": id, "ns": key.namespace, "name": key.name, "uid": event.uid,
                "fin": i64::from(c.remove_finalizer), "clear": clear}));
        }
    }
    if !rows.is_empty() {
        sqlx::query(INSERT_CLEANUPS).bind(now).bind(serde_json::to_string(&rows)?).execute(&mut **tx).await?;
    }
    if !releases.is_empty() {
        sqlx::query(INSERT_RELEASES).bind(now).bind(serde_json::to_string(&releases)?).execute(&mut **tx).await?;
    }
    Ok(())
}

/// Folds the batch into the last operation per Service, then runs one upsert and one delete.
async fn write_state(tx: &mut Transaction<'_, Sqlite>, now: i64, changes: &[StateChange]) -> Result<(), StoreError> {
    let mut last: HashMap<&ServiceKey, Final<'_>> = HashMap::new();
    for change in changes {
        let (key, op) = match change {
            StateChange::Event { key, event: e, .. } if e.kind == ChangeKind::Deleted => (key, Final::Delete),
            StateChange::Event { key, event: e, .. } => {
                (key, Final::Upsert { uid: &e.uid, rv: &e.resource_version, view: &e.view, backends: &e.backends })
            }
            StateChange::Refresh { key, tracked: t } => {
                (key, Final::Upsert { uid: &t.uid, rv: &t.resource_version, view: &t.view, backends: &t.backends })
            }
            StateChange::Node { .. } | StateChange::Held { .. } => continue,
        };
        last.insert(key, op);
    }
    let mut upserts = Vec::new();
    let mut deletes = Vec::new();
    for (key, op) in last {
        match op {
            Final::Delete => deletes.push((&key.namespace, &key.name)),
            Final::Upsert { uid, rv, view, backends } => upserts.push(UpsertJson {
                ns: &key.namespace,
                name: &key.name,
                uid,
                rv,
                ty: &view.service_type,
                class: view.load_balancer_class.as_deref(),
                view: serde_json::to_string(view)?,
                publish: view.status_to_publish().map(|i| serde_json::to_string(&i)).transpose()?,
                backends: (!backends.is_empty()).then(|| serde_json::to_string(backends)).transpose()?,
            }),
        }
    }
    if !deletes.is_empty() {
        sqlx::query(DELETE_SERVICES).bind(serde_json::to_string(&deletes)?).execute(&mut **tx).await?;
    }
    if !upserts.is_empty() {
        sqlx::query(UPSERT_SERVICES).bind(now).bind(serde_json::to_string(&upserts)?).execute(&mut **tx).await?;
    }
    Ok(())
}
