//! Read-only queries for the REST API: keyset-paged Services, single rows, per-Service and
//! per-endpoint delivery summaries, and the event history the VIP index starts from. Every query is
//! bounded by an index range and a SQL `LIMIT`, except [`Store::for_each_current_event`] (streamed,
//! once per process start).

use super::db::{Filter, PerBackend};
use super::deliveries::attempt_row;
use super::state::service_row;
use super::{AttemptRow, DeliveryFilter, DeliveryRow, EventFilter, EventRow, ServiceRow, Store, StoreError};
use crate::model::{ServiceKey, ServiceView};

/// One page of the current-state table, ordered by (namespace, name).
#[derive(Debug, Clone, Default)]
pub struct ServicePageQuery {
    /// Only keys strictly after this one.
    pub after: Option<ServiceKey>,
    /// Only this namespace.
    pub namespace: Option<String>,
    /// Only this `spec.type`.
    pub service_type: Option<String>,
    /// At most this many rows.
    pub limit: i64,
}

/// What the deliveries of one Service to one endpoint look like.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceDeliveryState {
    /// Endpoint name.
    pub webhook: String,
    /// Pending deliveries.
    pub pending: i64,
    /// Pending deliveries with at least one failed attempt.
    pub retrying: i64,
    /// Whether the newest finished (not superseded) delivery gave up (`failed`).
    pub last_finished_failed: bool,
    /// Start of the newest 2xx attempt (Unix ms).
    pub last_success_at: Option<i64>,
    /// Start of the newest failed attempt (Unix ms).
    pub last_failure_at: Option<i64>,
    /// Why the Service's newest delivery to the endpoint is failing (its last attempt's error, the
    /// receiver's reason included); `None` when that delivery succeeded or was not tried yet.
    pub last_error: Option<String>,
}

/// Newest attempt outcomes of one endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WebhookActivity {
    /// Start of the newest 2xx attempt (Unix ms).
    pub last_success_at: Option<i64>,
    /// Start of the newest failed attempt (Unix ms).
    pub last_failure_at: Option<i64>,
}

macro_rules! service_columns {
    () => {
        "SELECT namespace, name, uid, resource_version, view, backends, first_seen_at, updated_at FROM services"
    };
}

const SERVICE_BY_KEY: &str = concat!(service_columns!(), " WHERE namespace = $1 AND name = $2");

/// Each Service events in an id range changed, with its row's columns (`NULL` when it has none)
/// ([`Store::services_changed`]).
const SERVICES_CHANGED: &str = "SELECT e.namespace, e.name, s.uid, s.resource_version, s.view, s.backends, \
    s.first_seen_at, s.updated_at FROM (SELECT DISTINCT namespace, name FROM events WHERE id > $1 AND id <= $2) e \
    LEFT JOIN services s ON s.namespace = e.namespace AND s.name = e.name";

macro_rules! newest_attempt {
    ($cond:literal) => {
        concat!(
            "SELECT a.started_at FROM attempts a JOIN deliveries d ON d.id = a.delivery_id WHERE d.webhook = $1 \
             AND a.error_class ",
            $cond,
            " ORDER BY a.id DESC LIMIT 1"
        )
    };
}

const DELIVERY_STATES: &str = "SELECT webhook, COUNT(*) FILTER (WHERE state = 'pending') AS pending, \
    COUNT(*) FILTER (WHERE state = 'pending' AND attempts > 0) AS retrying, \
    (SELECT x.state = 'failed' FROM deliveries x WHERE x.webhook = d.webhook AND x.namespace = $1 AND x.name = $2 \
       AND x.state IN ('succeeded', 'failed') ORDER BY x.id DESC LIMIT 1) AS last_failed, \
    (SELECT MAX(a.started_at) FROM attempts a JOIN deliveries y ON y.id = a.delivery_id WHERE y.webhook = d.webhook \
       AND y.namespace = $1 AND y.name = $2 AND a.error_class IS NULL) AS last_success, \
    (SELECT MAX(a.started_at) FROM attempts a JOIN deliveries y ON y.id = a.delivery_id WHERE y.webhook = d.webhook \
       AND y.namespace = $1 AND y.name = $2 AND a.error_class IS NOT NULL) AS last_failure, \
    (SELECT CASE WHEN x.state <> 'succeeded' THEN x.last_error END FROM deliveries x WHERE x.webhook = d.webhook \
       AND x.namespace = $1 AND x.name = $2 AND x.state <> 'superseded' ORDER BY x.id DESC LIMIT 1) AS last_error \
    FROM deliveries d WHERE namespace = $1 AND name = $2 GROUP BY webhook ORDER BY webhook";

/// A number that changes whenever anything was written: SQLite's `total_changes()` on the write
/// connection; PostgreSQL's WAL insert position. That one moves with every write to the server,
/// the lease renewals included (every `leader_renew`), so on PostgreSQL the VIP index is rebuilt
/// about once per check while it is polled: a cost, not a fault.
const WRITE_GENERATION: PerBackend =
    PerBackend { lite: "SELECT total_changes()", pg: "SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint" };

/// The attempts of the deliveries whose ids are in the JSON array $1.
const ATTEMPTS_OF: PerBackend = PerBackend {
    lite: "SELECT delivery_id, started_at, duration_ms, status_code, error_class, error, location, \
           response_body, request FROM attempts WHERE delivery_id IN (SELECT value FROM json_each($1)) \
           ORDER BY delivery_id, id",
    pg: "SELECT delivery_id, started_at, duration_ms, status_code, error_class, error, location, \
         response_body, request FROM attempts \
         WHERE delivery_id IN (SELECT jsonb_array_elements_text($1::jsonb)::bigint) ORDER BY delivery_id, id",
};

impl Store {
    /// A number that changes whenever this process wrote anything (SQLite `total_changes()` of the one
    /// write connection): a cheap "did anything change since" check for caches.
    pub async fn write_generation(&self) -> Result<i64, StoreError> {
        self.read_on_writer(super::owner::read_job(|backend, exec| {
            Box::pin(async move { Ok(backend.dual(&WRITE_GENERATION).fetch_one(exec).await?.get(0)) })
        }))
        .await
    }

    /// The highest event id in the log (0 when empty).
    pub async fn max_event_id(&self) -> Result<i64, StoreError> {
        Ok(self.read_one(self.backend.query("SELECT COALESCE(MAX(id), 0) FROM events")).await?.get(0))
    }

    /// Event `id`, if it exists (not pruned).
    pub async fn event(&self, id: i64) -> Result<Option<EventRow>, StoreError> {
        let filter = EventFilter { after_id: Some(id.saturating_sub(1)), limit: Some(1), ..Default::default() };
        Ok(self.events(&filter).await?.into_iter().find(|e| e.id == id))
    }

    /// A page of the current-state table: keys after `q.after`, by (namespace, name).
    pub async fn services_page(&self, q: &ServicePageQuery) -> Result<Vec<ServiceRow>, StoreError> {
        let mut w = Filter::default();
        if let Some(after) = &q.after {
            w.pair_after("namespace", "name", &after.namespace, &after.name);
        }
        w.eq_opt("namespace", &q.namespace).eq_opt("type", &q.service_type);
        // LIMIT as a literal: see the `store` module docs.
        let tail = format!(" ORDER BY namespace, name LIMIT {}", q.limit);
        let rows = self.read_all(w.query(self.backend, service_columns!(), &tail)).await?;
        rows.iter().map(service_row).collect()
    }

    /// One row of the current-state table.
    pub async fn service(&self, key: &ServiceKey) -> Result<Option<ServiceRow>, StoreError> {
        let row = self
            .read_optional(self.backend.query(SERVICE_BY_KEY).bind(key.namespace.as_str()).bind(key.name.as_str()))
            .await?;
        row.as_ref().map(service_row).transpose()
    }

    /// The Services that events `after` < id ≤ `through` recorded a change of, each with its current
    /// row (`None`: no longer in the state table, deleted or out of scope). Reads the events by id and
    /// the rows by key: the cost follows the number of events in the range, not of Services.
    /// Errors: [`StoreError`].
    pub async fn services_changed(
        &self,
        after: i64,
        through: i64,
    ) -> Result<Vec<(ServiceKey, Option<ServiceRow>)>, StoreError> {
        let rows = self.read_all(self.backend.query(SERVICES_CHANGED).bind(after).bind(through)).await?;
        let changed = rows.iter().map(|r| {
            let row = match r.get::<Option<String>, _>("uid") {
                Some(_) => Some(service_row(r)?),
                None => None,
            };
            Ok((ServiceKey::new(r.get::<String, _>("namespace"), r.get::<String, _>("name")), row))
        });
        changed.collect()
    }

    /// The lowest event id in the log (0 when empty): events below it were pruned.
    pub async fn min_event_id(&self) -> Result<i64, StoreError> {
        Ok(self.read_one(self.backend.query("SELECT COALESCE(MIN(id), 0) FROM events")).await?.get(0))
    }

    /// Delivery `id`, if it exists.
    pub async fn delivery(&self, id: i64) -> Result<Option<DeliveryRow>, StoreError> {
        let filter = DeliveryFilter { after_id: Some(id.saturating_sub(1)), limit: Some(1), ..Default::default() };
        Ok(self.deliveries(&filter).await?.into_iter().find(|d| d.id == id))
    }

    /// The attempt logs of several deliveries in one query: `(delivery_id, attempt)`, by delivery then
    /// attempt, oldest first.
    pub async fn attempts_of(&self, delivery_ids: &[i64]) -> Result<Vec<(i64, AttemptRow)>, StoreError> {
        if delivery_ids.is_empty() {
            return Ok(Vec::new());
        }
        let ids = serde_json::to_string(delivery_ids)?;
        let rows = self.read_all(self.backend.dual(&ATTEMPTS_OF).bind(ids)).await?;
        Ok(rows.iter().map(|r| (r.get("delivery_id"), attempt_row(r))).collect())
    }

    /// Per endpoint, the delivery state of one Service (endpoints that never got one are absent).
    pub async fn service_delivery_states(&self, key: &ServiceKey) -> Result<Vec<ServiceDeliveryState>, StoreError> {
        let rows = self
            .read_all(self.backend.query(DELIVERY_STATES).bind(key.namespace.as_str()).bind(key.name.as_str()))
            .await?;
        Ok(rows
            .iter()
            .map(|r| ServiceDeliveryState {
                webhook: r.get("webhook"),
                pending: r.get("pending"),
                retrying: r.get("retrying"),
                last_finished_failed: r.get::<Option<bool>, _>("last_failed").unwrap_or(false),
                last_success_at: r.get("last_success"),
                last_failure_at: r.get("last_failure"),
                last_error: r.get("last_error"),
            })
            .collect())
    }

    /// The newest successful and failed attempt of endpoint `webhook` (walks attempts newest first).
    pub async fn webhook_activity(&self, webhook: &str) -> Result<WebhookActivity, StoreError> {
        let newest = |sql: &'static str| async move {
            let row = self.read_optional(self.backend.query(sql).bind(webhook)).await?;
            Ok::<_, StoreError>(row.map(|r| r.get::<i64, _>(0)))
        };
        let success = newest(newest_attempt!("IS NULL")).await?;
        let failure = newest(newest_attempt!("IS NOT NULL")).await?;
        Ok(WebhookActivity { last_success_at: success, last_failure_at: failure })
    }

    /// Calls `visit(row)` for every Service in the current-state table, by namespace and name. Streams
    /// the table (memory stays flat, whatever the number of Services). Errors: [`StoreError`].
    pub async fn for_each_service(&self, mut visit: impl FnMut(ServiceRow)) -> Result<(), StoreError> {
        let mut conn = self.pools.read().await?;
        let each = |r: super::db::Row| {
            visit(service_row(&r)?);
            Ok(())
        };
        self.backend.query(super::state::SERVICES_SNAPSHOT).for_each(conn.exec(), each).await
    }

    /// Calls `visit(key, observed_at, view)` for every event of every Service in the current-state
    /// table that carries the Service's current uid, by (namespace, name, id): the history the VIP
    /// index dates each VIP from. Streams the whole log (memory stays flat); run once per process start.
    pub async fn for_each_current_event(
        &self,
        mut visit: impl FnMut(ServiceKey, i64, ServiceView),
    ) -> Result<(), StoreError> {
        let sql = "SELECT e.namespace, e.name, e.observed_at, e.view FROM events e JOIN services s \
                   ON s.namespace = e.namespace AND s.name = e.name AND s.uid = e.uid \
                   ORDER BY e.namespace, e.name, e.id";
        let mut conn = self.pools.read().await?;
        let each = |r: super::db::Row| {
            let key = ServiceKey::new(r.get::<String, _>("namespace"), r.get::<String, _>("name"));
            visit(key, r.get("observed_at"), serde_json::from_str(r.get::<&str, _>("view"))?);
            Ok(())
        };
        self.backend.query(sql).for_each(conn.exec(), each).await
    }
}
