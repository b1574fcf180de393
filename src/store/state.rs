//! Writing changes (event rows + state rows in one transaction) and reading the current-state table.
//!
//! A batch is written with few statements whatever its size: events and state rows go in multi-row
//! INSERTs of up to 128 rows (the state rows as upserts, each Service's view JSON the one its event
//! row carries), so 10,000 changes cost about 80 upserts, not 10,000.

use std::collections::HashMap;
use std::sync::Arc;

use super::db::{Backend, PerBackend, Row, row_chunks};
use super::outbox::{Outbox, RecordedEvent};
use super::progress::{WatchProgress, write_progress};
use super::script::{Script, Stmt};
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
        /// Its deliveries wait until vipwatch's finalizer is on the Service (see [`Store::services_awaiting_finalizer`]).
        awaits_finalizer: bool,
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

/// An event row, serialized for binding; its key, uid and resourceVersion are read from its change
/// (`change`, an index into [`Prepared`]'s changes) when bound.
struct EventJson {
    change: usize,
    kind: &'static str,
    cause: &'static str,
    /// Shared with the Service's state row, if the batch upserts it from this event; bound without a
    /// copy (sqlx copies a `&str` or `&String` parameter, an `Arc<str>` it only counts).
    view: Arc<str>,
    previous: Option<String>,
    changed: Option<String>,
    backends: Option<String>,
    backends_diff: Option<String>,
}

/// A state row upsert, bound into a multi-row [`SERVICE_INSERT`] (128 rows to a statement, like
/// events: [`EVENT_CHUNK`]); its key, uid, resourceVersion, type and class are read from its change
/// (`change`, an index into [`Prepared`]'s changes) when bound ([`tracked_of`]).
struct UpsertRow {
    change: usize,
    /// The view JSON: its event row's (serialized once for both) or, for a refresh, its own.
    view: Arc<str>,
    publish: Option<String>,
    backends: Option<String>,
}

/// The last state-table operation per Service in a batch, by the index of its change; `json`: the
/// view as its event row carries it, if it has one.
enum Final<'a> {
    Upsert { change: usize, view: &'a ServiceView, backends: &'a BackendSets, json: Option<Arc<str>> },
    Delete,
}

/// Columns of a state row, in [`super::db::values_sql`] order; [`UPSERT_SERVICES`] follows the
/// values. Every Service appears at most once per statement (a batch is folded into the last
/// operation per Service first), as PostgreSQL's `ON CONFLICT DO UPDATE` requires.
const SERVICE_INSERT: &str = "INSERT INTO services (namespace, name, uid, resource_version, type, \
     load_balancer_class, view, publish, backends, first_seen_at, updated_at)";

/// The conflict clause of a state row upsert: a row replaces the Service's, keeping `first_seen_at`
/// while the uid stays the same.
const UPSERT_SERVICES: &str = " ON CONFLICT (namespace, name) DO UPDATE SET \
     first_seen_at = CASE WHEN services.uid = excluded.uid THEN services.first_seen_at ELSE excluded.first_seen_at END, \
     uid = excluded.uid, resource_version = excluded.resource_version, type = excluded.type, \
     load_balancer_class = excluded.load_balancer_class, view = excluded.view, publish = excluded.publish, \
     backends = excluded.backends, updated_at = excluded.updated_at";

const INSERT_RELEASES: PerBackend = PerBackend {
    lite: "INSERT OR REPLACE INTO releases (event_id, namespace, name, uid, addresses, created_at) \
     SELECT j.value->>'id', j.value->>'ns', j.value->>'name', j.value->>'uid', j.value->>'addresses', $1 \
     FROM json_each($2) AS j",
    pg: "INSERT INTO releases (event_id, namespace, name, uid, addresses, created_at) \
     SELECT j.id, j.ns, j.name, j.uid, j.addresses, $1 FROM jsonb_to_recordset($2::jsonb) \
     AS j(id bigint, ns text, name text, uid text, addresses text) ON CONFLICT (event_id) DO UPDATE SET \
     namespace = excluded.namespace, name = excluded.name, uid = excluded.uid, addresses = excluded.addresses, \
     created_at = excluded.created_at",
};

const INSERT_CLEANUPS: PerBackend = PerBackend {
    lite: "INSERT OR REPLACE INTO cleanups (event_id, namespace, name, uid, remove_finalizer, \
     clear_ingress, created_at) SELECT j.value->>'id', j.value->>'ns', j.value->>'name', j.value->>'uid', \
     j.value->>'fin', j.value->>'clear', $1 FROM json_each($2) AS j",
    pg: "INSERT INTO cleanups (event_id, namespace, name, uid, remove_finalizer, clear_ingress, created_at) \
     SELECT j.id, j.ns, j.name, j.uid, j.fin, j.clear, $1 FROM jsonb_to_recordset($2::jsonb) \
     AS j(id bigint, ns text, name text, uid text, fin bigint, clear text) ON CONFLICT (event_id) DO UPDATE SET \
     namespace = excluded.namespace, name = excluded.name, uid = excluded.uid, \
     remove_finalizer = excluded.remove_finalizer, clear_ingress = excluded.clear_ingress, \
     created_at = excluded.created_at",
};

const DELETE_SERVICES: PerBackend = PerBackend {
    lite: "DELETE FROM services WHERE (namespace, name) IN \
     (SELECT j.value->>0, j.value->>1 FROM json_each($1) AS j)",
    pg: "DELETE FROM services WHERE (namespace, name) IN \
     (SELECT j->>0, j->>1 FROM jsonb_array_elements($1::jsonb) AS j)",
};

/// Forgets the pool addresses of the Services in the JSON array $1 of `[namespace, name]` that the
/// JSON array $2 of `[address, protocol, port, namespace, name]` (their rows after this batch, `NULL`
/// = none) no longer holds. A row that stays is not touched: deleting and inserting it again would
/// write both of the table's B-tree pages for every state upsert, though most (a label change, a
/// status write-back) keep their addresses.
const CLEAR_VIPS: PerBackend = PerBackend {
    lite: "DELETE FROM vip_addresses WHERE (namespace, name) IN \
     (SELECT j.value->>0, j.value->>1 FROM json_each($1) AS j) \
     AND (address, protocol, port, namespace, name) NOT IN \
     (SELECT v.value->>0, v.value->>1, v.value->>2, v.value->>3, v.value->>4 FROM json_each($2) AS v)",
    pg: "DELETE FROM vip_addresses WHERE (namespace, name) IN \
     (SELECT j->>0, j->>1 FROM jsonb_array_elements($1::jsonb) AS j) \
     AND (address, protocol, port, namespace, name) NOT IN \
     (SELECT v->>0, v->>1, (v->>2)::bigint, v->>3, v->>4 FROM jsonb_array_elements(COALESCE($2::jsonb, '[]')) AS v)",
};

/// Records the pool addresses in the JSON array $1 of `[address, protocol, port, namespace, name]`
/// that the Service does not hold yet; an address and port already held by another Service violates
/// the primary key and fails the whole transaction.
const INSERT_VIPS: PerBackend = PerBackend {
    lite: "INSERT INTO vip_addresses (address, protocol, port, namespace, name) \
     SELECT j.value->>0, j.value->>1, j.value->>2, j.value->>3, j.value->>4 FROM json_each($1) AS j \
     WHERE NOT EXISTS (SELECT 1 FROM vip_addresses v WHERE v.address = j.value->>0 \
       AND v.protocol = j.value->>1 AND v.port = j.value->>2 AND v.namespace = j.value->>3 AND v.name = j.value->>4)",
    pg: "INSERT INTO vip_addresses (address, protocol, port, namespace, name) \
     SELECT j->>0, j->>1, (j->>2)::bigint, j->>3, j->>4 FROM jsonb_array_elements($1::jsonb) AS j \
     WHERE NOT EXISTS (SELECT 1 FROM vip_addresses v WHERE v.address = j->>0 AND v.protocol = j->>1 \
       AND v.port = (j->>2)::bigint AND v.namespace = j->>3 AND v.name = j->>4)",
};

/// Names a unique violation of `vip_addresses` for what it is.
fn address_taken(e: StoreError) -> StoreError {
    match e {
        StoreError::Sqlx(sqlx::Error::Database(db)) if db.is_unique_violation() => {
            StoreError::AddressTaken(db.message().to_owned())
        }
        other => other,
    }
}

/// The id the next event gets: one past the highest ever given (SQLite's `sqlite_sequence`,
/// PostgreSQL's `events_id_seq`, so ids of pruned events are never reused), or past the highest in
/// the log if that is higher.
const NEXT_EVENT_ID: PerBackend = PerBackend {
    lite: "SELECT MAX(COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'events'), 0), \
           COALESCE((SELECT MAX(id) FROM events), 0)) + 1",
    pg: "SELECT GREATEST((SELECT last_value FROM events_id_seq), COALESCE((SELECT MAX(id) FROM events), 0)) + 1",
};

/// Changes and watch progress to record in one transaction, in the order given.
#[derive(Debug, Default)]
pub struct Chunk {
    /// The changes.
    pub changes: Vec<StateChange>,
    /// The watch progress recorded with them.
    pub progress: Vec<WatchProgress>,
}

/// A chunk of changes made ready to write by [`Store::prepare`]: event ids assigned, rows serialized,
/// deliveries routed and rendered. All the CPU work of a write happens here, outside the transaction;
/// [`Store::write`] then only runs statements. Owns its chunk, so it can be handed to the store's
/// writer task and given back ([`Prepared::into_chunk`]).
pub struct Prepared {
    first_id: i64,
    chunk: Chunk,
    now: i64,
    ids: Vec<i64>,
    events: Vec<EventJson>,
    deliveries: Vec<super::outbox::DeliveryInsert>,
    cleanups: Option<String>,
    releases: Option<String>,
    state: StateRows,
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared")
            .field("first_id", &self.first_id)
            .field("changes", &self.chunk.changes.len())
            .field("deliveries", &self.deliveries.len())
            .finish_non_exhaustive()
    }
}

impl Prepared {
    /// The id this chunk's first event gets.
    pub fn first_id(&self) -> i64 {
        self.first_id
    }

    /// How many changes (of any kind) this chunk holds.
    pub fn changes(&self) -> usize {
        self.chunk.changes.len()
    }

    /// The id after this chunk's last event: where the next chunk starts.
    pub fn next_id(&self) -> i64 {
        self.first_id + self.ids.len() as i64
    }

    /// How many deliveries this chunk enqueues.
    pub fn deliveries(&self) -> usize {
        self.deliveries.len()
    }

    /// How many events this chunk records.
    pub fn events(&self) -> usize {
        self.ids.len()
    }

    /// The event ids this chunk records, ascending.
    pub fn ids(&self) -> &[i64] {
        &self.ids
    }

    /// The chunk it was prepared from (to prepare it again with other ids, or once written).
    pub fn into_chunk(self) -> Chunk {
        self.chunk
    }
}

/// What [`Store::prepare`] could not prepare: why, and the chunk, given back.
#[derive(Debug)]
pub struct Unprepared {
    /// Why ([`StoreError::Json`]: a view does not serialize).
    pub error: StoreError,
    /// The chunk, untouched.
    pub chunk: Chunk,
}

impl Store {
    /// The id the next event will get: one past the highest ever given (`sqlite_sequence`, so ids of
    /// pruned events are never reused, or the highest in the log if that is higher). Read on the
    /// write connection, by its owner.
    pub async fn next_event_id(&self) -> Result<i64, StoreError> {
        self.read_on_writer(super::owner::read_job(|backend, exec| {
            Box::pin(async move { Ok(backend.dual(&NEXT_EVENT_ID).fetch_one(exec).await?.get(0)) })
        }))
        .await
    }

    /// Makes `chunk` ready to write: events get ids `first_id`, `first_id + 1`, ... in order and `now`
    /// (Unix ms) as their `observed_at`, `outbox` routes each into its deliveries, every row is
    /// serialized. Nothing touches the database. Errors: [`Unprepared`] with the chunk given back,
    /// when a view does not serialize ([`StoreError::Json`]).
    pub fn prepare(&self, chunk: Chunk, outbox: &dyn Outbox, first_id: i64, now: i64) -> Result<Prepared, Unprepared> {
        match rows(&chunk.changes, outbox, first_id, now) {
            Ok((ids, events, deliveries, cleanups, releases, state)) => {
                Ok(Prepared { first_id, chunk, now, ids, events, deliveries, cleanups, releases, state })
            }
            Err(error) => Err(Unprepared { error, chunk }),
        }
    }

    /// Writes a prepared chunk in ONE transaction (one commit): all or nothing; the state table ends
    /// as if each change were applied in order. Rows other than the events (deliveries' `created_at`
    /// and due time, `updated_at`s) take the time of this attempt, so a write retried for hours does
    /// not enqueue deliveries that already look hours old. The write connection's owner runs it with
    /// whatever else waits for the connection ([`super::owner`]), the relay's standing claims after
    /// its inserts. Returns the event ids, ascending, and the chunk given back. Errors: [`StoreError`];
    /// nothing of the chunk is written then. An id already taken (another writer, which the lock file
    /// rules out) fails as a unique-constraint error: see [`StoreError::is_event_id_taken`].
    pub async fn write(&self, p: Prepared) -> (Result<Vec<i64>, StoreError>, Prepared) {
        let (recorded, p) = self.record(p).await;
        (recorded.map(|r| r.ids), p)
    }

    /// [`Store::prepare`] and [`Store::write`] in one go, with the next free ids (tests, tools).
    pub async fn apply(
        &self,
        changes: &[StateChange],
        progress: &[WatchProgress],
        outbox: &dyn Outbox,
    ) -> Result<Vec<i64>, StoreError> {
        let first_id = self.next_event_id().await?;
        let chunk = Chunk { changes: changes.to_vec(), progress: progress.to_vec() };
        let prepared = self.prepare(chunk, outbox, first_id, now_ms()).map_err(|u| u.error)?;
        self.write(prepared).await.0
    }

    /// Every row of the current-state table, keyed by Service: what the recorder diffs against.
    pub async fn load_tracked(&self) -> Result<HashMap<ServiceKey, Tracked>, StoreError> {
        let rows = self.services().await?;
        Ok(rows
            .into_iter()
            .map(|mut r| {
                // Kept for as long as the Service is: without the room JSON's vectors grow with.
                r.view.shrink_to_fit();
                let tracked = Tracked {
                    uid: r.uid,
                    resource_version: r.resource_version,
                    view: r.view.into(),
                    backends: crate::model::backends::shrink(r.backends).into(),
                };
                (r.key, tracked)
            })
            .collect())
    }

    /// The whole current-state table ordered by namespace, name.
    pub async fn services(&self) -> Result<Vec<ServiceRow>, StoreError> {
        let rows = self.read_all(self.backend.query(SERVICES_SNAPSHOT)).await?;
        rows.iter().map(service_row).collect()
    }
}

/// The rows [`Store::prepare`] makes of `changes`: the event ids, the event rows, the deliveries, the
/// cleanup and release rows (JSON), the state rows.
type Rows = (Vec<i64>, Vec<EventJson>, Vec<super::outbox::DeliveryInsert>, Option<String>, Option<String>, StateRows);

fn rows(changes: &[StateChange], outbox: &dyn Outbox, first_id: i64, now: i64) -> Result<Rows, StoreError> {
    let events = event_rows(changes)?;
    let ids: Vec<i64> = (first_id..).take(events.len()).collect();
    let recorded: Vec<(RecordedEvent<'_>, Option<i64>, bool)> = changes
        .iter()
        .filter_map(|c| match c {
            StateChange::Event { key, cause, event, awaits_finalizer, .. } => {
                Some((key, *cause, event.as_ref(), *awaits_finalizer))
            }
            StateChange::Refresh { .. } | StateChange::Node { .. } | StateChange::Held { .. } => None,
        })
        .zip(&ids)
        .map(|((key, cause, event, awaits_finalizer), id)| {
            (RecordedEvent { id: *id, observed_at: now, key, cause, event }, Some(*id), awaits_finalizer)
        })
        .collect();
    let deliveries = super::outbox::route(outbox, &recorded);
    let (cleanups, releases) = cleanup_rows(changes, &ids)?;
    let state = state_rows(changes, &events)?;
    Ok((ids, events, deliveries, cleanups, releases, state))
}

/// The statements of a prepared chunk, run in `s`'s transaction at `now` (Unix ms).
pub(super) async fn record_chunk(s: &mut Script<'_>, now: i64, p: &Prepared) -> Result<(), StoreError> {
    let changes = &p.chunk.changes;
    insert_events(s, p.now, changes, &p.events, &p.ids).await?;
    super::outbox::insert_deliveries(s, now, &p.deliveries).await?;
    let b = s.backend();
    if let Some(rows) = &p.cleanups {
        s.run(Stmt::dual(b, &INSERT_CLEANUPS).bind(now).bind(rows)).await?;
    }
    if let Some(rows) = &p.releases {
        s.run(Stmt::dual(b, &INSERT_RELEASES).bind(now).bind(rows)).await?;
    }
    if let Some(rows) = &p.state.deletes {
        s.run(Stmt::dual(b, &DELETE_SERVICES).bind(rows)).await?;
    }
    upsert_services(s, now, changes, &p.state.upserts).await?;
    if let Some(keys) = &p.state.touched {
        s.run(Stmt::dual(b, &CLEAR_VIPS).bind(keys).bind(&p.state.vips)).await?;
    }
    if let Some(rows) = &p.state.vips {
        // On its own, so that a unique violation is known to be this statement's.
        let tx = s.tx().await?;
        b.dual(&INSERT_VIPS).bind(rows).execute(tx.exec()).await.map_err(address_taken)?;
    }
    super::nodes::write_nodes(s, now, changes).await?;
    super::held::write_held(s, changes).await?;
    for progress in &p.chunk.progress {
        write_progress(s, now, progress).await?;
    }
    if let (Backend::Postgres, Some(last)) = (b, p.ids.last()) {
        // One statement, one round trip: the sequence follows the ids given, and listeners hear of
        // the newest at commit.
        let sql = "SELECT setval('events_id_seq', $1), pg_notify('vipwatch_events', $1::text)";
        s.run(Stmt::new(sql).bind(*last)).await?;
    }
    // Sent now, so that an error is this chunk's.
    s.flush().await
}

/// Every row of the state table, by key ([`Store::services`], [`Store::enqueue_resync`]).
pub(super) const SERVICES_SNAPSHOT: &str = "SELECT namespace, name, uid, resource_version, view, backends, \
    first_seen_at, updated_at FROM services ORDER BY namespace, name";

pub(super) fn service_row(r: &Row) -> Result<ServiceRow, StoreError> {
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
/// are cut into chunks of 128, 32, 8, 2 and 1 rows ([`row_chunks`]), so at most five distinct
/// statements per table get prepared.
const EVENT_CHUNK: usize = 128;

/// The event rows of `changes`, in order, serialized.
fn event_rows(changes: &[StateChange]) -> Result<Vec<EventJson>, StoreError> {
    let mut rows = Vec::new();
    for (i, change) in changes.iter().enumerate() {
        if let StateChange::Event { cause, event: e, .. } = change {
            rows.push(EventJson {
                change: i,
                kind: e.kind.as_str(),
                cause: cause.as_str(),
                view: serde_json::to_string(&e.view)?.into(),
                previous: e.previous.as_deref().map(serde_json::to_string).transpose()?,
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
    Ok(rows)
}

/// Inserts event rows (of `changes`) with their assigned ids (`ids[i]` for `rows[i]`). On PostgreSQL
/// [`record_chunk`] then moves `events_id_seq` up to the highest (SQLite's AUTOINCREMENT does that by
/// itself).
async fn insert_events(
    s: &mut Script<'_>,
    now: i64,
    changes: &[StateChange],
    rows: &[EventJson],
    ids: &[i64],
) -> Result<(), StoreError> {
    let rows: Vec<(&EventJson, i64)> = rows.iter().zip(ids.iter().copied()).collect();
    for chunk in row_chunks(&rows, EVENT_CHUNK) {
        s.run(event_chunk(s.backend(), now, changes, chunk)).await?;
    }
    Ok(())
}

/// Columns of an event row, in [`super::db::values_sql`] order.
const EVENT_INSERT: &str = "INSERT INTO events (id, observed_at, type, namespace, name, uid, resource_version, \
    cause, view, previous, changed, backends, backends_diff)";

fn event_chunk(backend: Backend, now: i64, changes: &[StateChange], chunk: &[(&EventJson, i64)]) -> Stmt {
    let mut q = Stmt::values(backend, EVENT_INSERT, chunk.len(), 13, "");
    for (r, id) in chunk {
        let StateChange::Event { key, event, .. } = &changes[r.change] else { unreachable!("an event row's change") };
        q = q
            .bind(*id)
            .bind(now)
            .bind(r.kind)
            .bind(key.namespace.as_str())
            .bind(key.name.as_str())
            .bind(event.uid.as_str())
            .bind(event.resource_version.as_str())
            .bind(r.cause)
            .bind(r.view.clone())
            .bind(&r.previous)
            .bind(&r.changed)
            .bind(&r.backends)
            .bind(&r.backends_diff);
    }
    q
}

/// Upserts the state rows (of `changes`), 128 to a statement.
async fn upsert_services(
    s: &mut Script<'_>,
    now: i64,
    changes: &[StateChange],
    rows: &[UpsertRow],
) -> Result<(), StoreError> {
    for chunk in row_chunks(rows, EVENT_CHUNK) {
        let mut q = Stmt::values(s.backend(), SERVICE_INSERT, chunk.len(), 11, UPSERT_SERVICES);
        for r in chunk {
            let (key, uid, rv, view) = tracked_of(&changes[r.change]);
            q = q
                .bind(key.namespace.as_str())
                .bind(key.name.as_str())
                .bind(uid)
                .bind(rv)
                .bind(view.service_type.as_str())
                .bind(view.load_balancer_class.as_deref())
                .bind(r.view.clone())
                .bind(&r.publish)
                .bind(&r.backends)
                .bind(now)
                .bind(now);
        }
        s.run(q).await?;
    }
    Ok(())
}

/// The follow-up work of events (ids in event order), as JSON arrays for [`INSERT_CLEANUPS`] and
/// [`INSERT_RELEASES`] (`None` = nothing): cleanups of objects that still exist, and the pool
/// addresses to release once acknowledged (of DELETED events and of MODIFIED events that withdrew
/// some, see [`crate::ipam::withdrawn`]).
fn cleanup_rows(changes: &[StateChange], ids: &[i64]) -> Result<(Option<String>, Option<String>), StoreError> {
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
    let json = |v: Vec<serde_json::Value>| (!v.is_empty()).then(|| serde_json::to_string(&v)).transpose();
    Ok((json(rows)?, json(releases)?))
}

/// Folds the batch into the last operation per Service: the rows of its upserts (each event's view
/// JSON shared with its row in `events`, the batch's event rows in order) and the JSON arrays of its
/// deletes ([`DELETE_SERVICES`]) and touched keys; `None` = nothing to do.
fn state_rows(changes: &[StateChange], events: &[EventJson]) -> Result<StateRows, StoreError> {
    let mut last: HashMap<&ServiceKey, Final<'_>> = HashMap::new();
    let mut event_views = events.iter().map(|e| &e.view);
    for (change, c) in changes.iter().enumerate() {
        let (key, op) = match c {
            StateChange::Event { key, event: e, .. } => {
                let json = event_views.next().cloned();
                let op = match e.kind {
                    ChangeKind::Deleted => Final::Delete,
                    _ => Final::Upsert { change, view: &e.view, backends: &e.backends, json },
                };
                (key, op)
            }
            StateChange::Refresh { key, tracked: t } => {
                (key, Final::Upsert { change, view: &t.view, backends: &t.backends, json: None })
            }
            StateChange::Node { .. } | StateChange::Held { .. } => continue,
        };
        last.insert(key, op);
    }
    let mut upserts = Vec::new();
    let mut deletes = Vec::new();
    let mut touched = Vec::with_capacity(last.len());
    let mut vips = Vec::new();
    for (key, op) in last {
        touched.push((&key.namespace, &key.name));
        match op {
            Final::Delete => deletes.push((&key.namespace, &key.name)),
            Final::Upsert { view, .. } if pool_addresses(view).next().is_some() => {
                vips.extend(address_ports(view).map(|(a, proto, port)| (a, proto, port, &key.namespace, &key.name)));
                upserts.push(upsert_row(op)?);
            }
            Final::Upsert { .. } => upserts.push(upsert_row(op)?),
        }
    }
    let json = |empty: bool, v: String| (!empty).then_some(v);
    Ok(StateRows {
        upserts,
        deletes: json(deletes.is_empty(), serde_json::to_string(&deletes)?),
        touched: json(touched.is_empty(), serde_json::to_string(&touched)?),
        vips: json(vips.is_empty(), serde_json::to_string(&vips)?),
    })
}

/// The pool addresses `view` holds.
fn pool_addresses(view: &ServiceView) -> impl Iterator<Item = &String> {
    let pool = view.allocation.as_ref().filter(|a| a.source == vipwatch_contract::VipSource::Pool);
    pool.into_iter().flat_map(|a| &a.addresses)
}

/// What `vip_addresses` keeps unique for `view`: each pool address with each port it serves there
/// (`("", 0)` for a Service without ports, which then holds the address alone), each once. Two ports
/// of one Service with the same number and protocol (which a real apiserver refuses, but a view may
/// still hold) are one row: two were one Service's address and port "held by two Services", a
/// refused write that ended the term at every start.
fn address_ports(view: &ServiceView) -> impl Iterator<Item = (&String, &str, i32)> {
    let mut ports: Vec<(&str, i32)> = match view.ports.as_slice() {
        [] => vec![("", 0)],
        ports => ports.iter().map(|p| (p.protocol.as_str(), p.port)).collect(),
    };
    ports.sort_unstable();
    ports.dedup();
    pool_addresses(view).flat_map(move |a| ports.clone().into_iter().map(move |(proto, port)| (a, proto, port)))
}

/// The state rows of a batch for its statements: the upserted rows, and as JSON arrays (`None` =
/// nothing to do) the deleted keys, every key the batch touched (their `vip_addresses` rows are
/// brought in line, [`CLEAR_VIPS`]) and the pool addresses of the upserted ones per port,
/// `[address, protocol, port, namespace, name]`.
struct StateRows {
    upserts: Vec<UpsertRow>,
    deletes: Option<String>,
    touched: Option<String>,
    vips: Option<String>,
}

/// The Service, uid, resourceVersion and view a state row of `change` upserts (an event that is not
/// a DELETED, or a refresh).
fn tracked_of(change: &StateChange) -> (&ServiceKey, &str, &str, &ServiceView) {
    match change {
        StateChange::Event { key, event, .. } => (key, &event.uid, &event.resource_version, &event.view),
        StateChange::Refresh { key, tracked } => (key, &tracked.uid, &tracked.resource_version, &tracked.view),
        StateChange::Node { .. } | StateChange::Held { .. } => unreachable!("only events and refreshes upsert"),
    }
}

/// One state row upsert: its view JSON is its event row's when it has one.
fn upsert_row(op: Final<'_>) -> Result<UpsertRow, StoreError> {
    let Final::Upsert { change, view: service, backends, json } = op else { unreachable!("only upserts") };
    let view = match json {
        Some(json) => json,
        None => serde_json::to_string(service)?.into(),
    };
    Ok(UpsertRow {
        change,
        view,
        publish: service.status_to_publish().map(|i| serde_json::to_string(&i)).transpose()?,
        backends: (!backends.is_empty()).then(|| serde_json::to_string(backends)).transpose()?,
    })
}
