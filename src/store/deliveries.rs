//! Completing deliveries (attempt log + new state), endpoint state, replay, resync, and the delivery
//! log queries.

use serde::Serialize;
use std::collections::BTreeMap;

use super::db::{Backend, Filter, PerBackend, Row};
use super::outbox::{DeliveryInsert, NewDelivery, insert_deliveries};
use super::script::{Script, Stmt};
use super::{Heads, Store, StoreError, now_ms};
use crate::model::ServiceKey;

/// What one attempt did, for the attempt log.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct AttemptRecord {
    /// When the attempt started (Unix ms).
    pub started_at: i64,
    /// How long it took, in milliseconds.
    pub duration_ms: i64,
    /// HTTP status, when a response arrived.
    pub status_code: Option<u16>,
    /// One of [`ERROR_CLASSES`]; `None` on success.
    pub error_class: Option<&'static str>,
    /// Human-readable error.
    pub error: Option<String>,
    /// `Location` of a 3xx answer.
    pub location: Option<String>,
    /// At most 4 KiB of the response body (UTF-8, lossy).
    pub response_body: Option<String>,
    /// Templated endpoints: the requests rendered and their answers, a JSON array of `{name, method,
    /// url, headers, body, status, response, error}` (secrets redacted). `None` for plain webhooks,
    /// whose request is the delivery's payload.
    pub request: Option<String>,
}

/// Every attempt error class the relay records (the `attempts.error_class` CHECK constraint, migration
/// 0009, allows exactly these; docs/reference/errors.md documents each): `timeout`, `connect`,
/// `tls`, `forbidden_address` (the host resolved only to refused addresses), `redirect` (3xx, not
/// followed), `http` (any other non-2xx, or a failed template response check), `template` (a request
/// template failed to render) and `held` (the full-state removal guard holds the declaration).
pub const ERROR_CLASSES: [&str; 8] =
    ["timeout", "connect", "tls", "forbidden_address", "redirect", "http", "template", "held"];

/// The delivery's state after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// 2xx: done.
    Succeeded,
    /// Try again at this time (Unix ms).
    Retry(i64),
    /// Gave up (`max_attempts` / `max_age` reached): kept, replayable; releases the Service's queue.
    Failed,
}

/// One finished attempt to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// The delivery.
    pub delivery_id: i64,
    /// What happened.
    pub attempt: AttemptRecord,
    /// What the delivery becomes.
    pub outcome: Outcome,
    /// Templated event-mode endpoints: what the endpoint holds for the Service once this attempt is
    /// acknowledged (table `told`, written only when `outcome` is [`Outcome::Succeeded`]); `None` for
    /// every other endpoint.
    pub told: Option<super::Told>,
}

/// A delivery-log row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeliveryRow {
    /// Delivery id.
    pub id: i64,
    /// Endpoint name.
    pub webhook: String,
    /// The event carried (`None` for `service.synced`).
    pub event_id: Option<i64>,
    /// The Service.
    pub key: ServiceKey,
    /// `ADDED`, `MODIFIED`, `DELETED` or `SYNCED`.
    pub kind: String,
    /// The `webhook-id` header.
    pub msg_id: String,
    /// `pending`, `succeeded`, `failed` or `superseded`.
    pub state: String,
    /// Attempts made.
    pub attempts: i64,
    /// Enqueued at (Unix ms).
    pub created_at: i64,
    /// Next attempt due at (Unix ms; meaningful while pending), the claim's order; a `MODIFIED` that
    /// superseded older ones keeps the earliest of theirs (`INHERIT_PLACE` in `store::outbox`), and
    /// one that took a newer change in place keeps its own (`REWRITE`).
    pub next_attempt_at: i64,
    /// Finished at (Unix ms).
    pub finished_at: Option<i64>,
    /// Status code of the last attempt.
    pub last_status: Option<i64>,
    /// Error of the last attempt.
    pub last_error: Option<String>,
    /// The exact body.
    pub payload: String,
}

/// Filters of [`Store::deliveries`]; results by id ascending.
#[derive(Debug, Clone, Default)]
pub struct DeliveryFilter {
    /// Only ids greater than this.
    pub after_id: Option<i64>,
    /// Only this endpoint.
    pub webhook: Option<String>,
    /// Only this state.
    pub state: Option<String>,
    /// Only this event.
    pub event_id: Option<i64>,
    /// Only this namespace.
    pub namespace: Option<String>,
    /// Only this Service name.
    pub name: Option<String>,
    /// At most this many.
    pub limit: Option<i64>,
}

/// Runtime state of an endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WebhookState {
    /// Endpoint name.
    pub name: String,
    /// Why it is disabled (`None` = enabled).
    pub disabled_reason: Option<String>,
    /// Since when (Unix ms).
    pub disabled_at: Option<i64>,
    /// The URL that answered 410.
    pub disabled_url: Option<String>,
}

const DELIVERY_COLUMNS: &str = "SELECT id, webhook, event_id, namespace, name, kind, msg_id, state, attempts, \
    created_at, next_attempt_at, finished_at, last_status, last_error, payload FROM deliveries";

impl Store {
    /// Records finished attempts and moves their deliveries on, in one transaction; a retried ADDED or
    /// MODIFIED with a DELETED or SYNCED queued behind it is superseded by that. Like a round
    /// ([`Store::complete_and_claim`]), it goes with the watch's next commit when one is expected.
    pub fn complete(&self, done: &[Completion]) -> impl Future<Output = Result<(), StoreError>> + Send + 'static {
        let round = self.complete_and_claim(done, None);
        async move { round.await.map(drop) }
    }

    /// [`Store::complete`], then — in the same transaction — [`Store::claim`] with `claim = (webhook,
    /// now, lease_ms, limit)` when given and `limit > 0`: a relay round. Both or neither happen.
    ///
    /// The round runs in the write connection's next transaction, with whatever else waits; while the
    /// watch's writer said it will record a chunk soon ([`Store::expect_record`]), it waits for that
    /// transaction, whose inserts its claim then sees ([`super::owner`]). The claim's lease runs from
    /// when it runs. Sent at once; resolves to what the claim took. Errors: [`StoreError`]; nothing
    /// of the round is committed then.
    pub fn complete_and_claim(
        &self,
        done: &[Completion],
        claim: Option<(&str, i64, i64, usize)>,
    ) -> impl Future<Output = Result<Heads, StoreError>> + Send + 'static {
        self.round(done.to_vec(), claim, false)
    }

    /// Replays delivery `id` (any state): enqueues a copy with the same body at the END of its
    /// Service's queue (so it never overtakes newer changes) under a new `webhook-id` (so receivers that
    /// dedupe still process it). Returns the new delivery id, or `None` if `id` does not exist.
    pub async fn replay(&self, id: i64, new_msg_id: &str) -> Result<Option<i64>, StoreError> {
        let sql = "INSERT INTO deliveries (webhook, event_id, namespace, name, kind, msg_id, payload, created_at, \
                   next_attempt_at) SELECT webhook, event_id, namespace, name, kind, $2, payload, $3, $3 \
                   FROM deliveries WHERE id = $1 RETURNING id";
        let now = now_ms();
        let row = self.execute_returning(self.backend.query(sql).bind(id).bind(new_msg_id).bind(now)).await?;
        Ok(row.map(|r| r.get(0)))
    }

    /// Enqueues `SYNCED` deliveries (each on the queue of its Service key), in one transaction
    /// (store tests; a resync uses [`Store::enqueue_resync`]). Returns how many were enqueued.
    #[cfg(test)]
    pub(crate) async fn enqueue_synced(&self, deliveries: Vec<(NewDelivery, ServiceKey)>) -> Result<usize, StoreError> {
        let rows: Vec<DeliveryInsert> = deliveries.into_iter().map(|(d, key)| (d, None, key, false)).collect();
        self.transact(super::owner::job(move |s| {
            Box::pin(async move {
                insert_deliveries(s, now_ms(), &rows).await?;
                Ok(rows.len())
            })
        }))
        .await
    }

    /// Enqueues a resync from a snapshot taken in the same write transaction: reads the newest event
    /// id and every Service of the state table there, lets `build(as_of_event_id, services)` make
    /// the deliveries (each on the queue of its Service key), and inserts them before committing.
    /// No change can be recorded between the snapshot and the inserts, so each `service.synced`
    /// carries its Service's state as of every change queued before it (which it supersedes when
    /// still pending), and every later change queues after it. (Read first and inserted in a
    /// transaction of their own, a change recorded in between could be superseded by a resync that
    /// did not carry it, or delivered before a resync that carried the state before it.) The
    /// `service.synced` of a Service whose deliveries await the finalizer waits too. `build`
    /// runs while the write lock is held: make it render, not wait. Returns how many were enqueued.
    /// Errors: [`StoreError`]; nothing is enqueued then.
    pub async fn enqueue_resync<F>(&self, build: F) -> Result<usize, StoreError>
    where
        F: FnOnce(i64, &[super::ServiceRow]) -> Vec<(NewDelivery, ServiceKey)> + Send + 'static,
    {
        let backend = self.backend;
        self.transact(super::owner::job(move |s| {
            Box::pin(async move {
                let tx = s.tx().await?;
                let as_of = backend.query("SELECT COALESCE(MAX(id), 0) FROM events").fetch_one(tx.exec()).await?;
                let rows = backend.query(super::state::SERVICES_SNAPSHOT).fetch_all(tx.exec()).await?;
                // A Service whose deliveries wait for the finalizer: its `service.synced` waits too (it
                // supersedes the held ones, so it may be its first delivery).
                let held: std::collections::HashSet<ServiceKey> = backend
                    .query("SELECT DISTINCT namespace, name FROM deliveries WHERE held = 1 AND state = 'pending'")
                    .fetch_all(tx.exec())
                    .await?
                    .iter()
                    .map(|r| ServiceKey::new(r.get::<String, _>(0), r.get::<String, _>(1)))
                    .collect();
                let services = rows.iter().map(super::state::service_row).collect::<Result<Vec<_>, _>>()?;
                let deliveries = build(as_of.get(0), &services);
                let rows: Vec<DeliveryInsert> = deliveries
                    .into_iter()
                    .map(|(d, key)| {
                        let held = held.contains(&key);
                        (d, None, key, held)
                    })
                    .collect();
                insert_deliveries(s, now_ms(), &rows).await?;
                Ok(rows.len())
            })
        }))
        .await
    }

    /// Deliveries matching `filter`, by id ascending.
    pub async fn deliveries(&self, filter: &DeliveryFilter) -> Result<Vec<DeliveryRow>, StoreError> {
        let mut w = Filter::default();
        if let Some(v) = filter.after_id {
            w.int("id", ">", v);
        }
        if let Some(v) = filter.event_id {
            w.int("event_id", "=", v);
            if filter.namespace.is_none()
                && filter.name.is_none()
                && let Some(key) = self.event_key(v).await?
            {
                // An event's deliveries are on its Service's queue or its endpoints' (a full-state
                // delivery); naming both lets the `(namespace, name, id)` index find them, as
                // PostgreSQL keeps no index on the event id (migration 0008). A pruned event's
                // key is unknown: then every delivery is looked at.
                let queue = &super::ENDPOINT_QUEUE;
                w.pair_in("namespace", "name", &[(&key.namespace, &key.name), (&queue.namespace, &queue.name)]);
            }
        }
        w.eq_opt("webhook", &filter.webhook).eq_opt("state", &filter.state);
        w.eq_opt("namespace", &filter.namespace).eq_opt("name", &filter.name);
        // LIMIT as a literal: see the `store` module docs.
        let limit = filter.limit.map(|l| format!(" LIMIT {l}")).unwrap_or_default();
        let rows = self.read_all(w.query(self.backend, DELIVERY_COLUMNS, &format!(" ORDER BY id{limit}"))).await?;
        Ok(rows.iter().map(delivery_row).collect())
    }

    /// The Service event `id` recorded a change of, if the event is still in the log.
    async fn event_key(&self, id: i64) -> Result<Option<ServiceKey>, StoreError> {
        let row =
            self.read_optional(self.backend.query("SELECT namespace, name FROM events WHERE id = $1").bind(id)).await?;
        Ok(row.map(|r| ServiceKey::new(r.get::<String, _>(0), r.get::<String, _>(1))))
    }

    /// The attempt log of one delivery, oldest first.
    pub async fn attempts(&self, delivery_id: i64) -> Result<Vec<AttemptRow>, StoreError> {
        let sql = "SELECT started_at, duration_ms, status_code, error_class, error, location, response_body, request \
                   FROM attempts WHERE delivery_id = $1 ORDER BY id";
        let rows = self.read_all(self.backend.query(sql).bind(delivery_id)).await?;
        Ok(rows.iter().map(attempt_row).collect())
    }

    /// Marks `webhook` disabled (a 410 from `url`).
    pub async fn disable_webhook(&self, webhook: &str, reason: &str, url: &str) -> Result<(), StoreError> {
        let sql = "INSERT INTO webhook_state (name, disabled_reason, disabled_at, disabled_url) VALUES ($1, $2, $3, $4) \
                   ON CONFLICT (name) DO UPDATE SET disabled_reason = excluded.disabled_reason, \
                   disabled_at = excluded.disabled_at, disabled_url = excluded.disabled_url";
        self.execute(self.backend.query(sql).bind(webhook).bind(reason).bind(now_ms()).bind(url)).await.map(drop)
    }

    /// Re-enables `webhook`; returns whether it was disabled.
    pub async fn enable_webhook(&self, webhook: &str) -> Result<bool, StoreError> {
        let sql = "DELETE FROM webhook_state WHERE name = $1";
        Ok(self.execute(self.backend.query(sql).bind(webhook)).await? > 0)
    }

    /// Records `modes` (endpoint name → its default backend mode) as the ones in effect and returns
    /// the endpoints whose stored mode differed, with the old mode. Endpoints seen for the first time
    /// are stored, not returned.
    pub async fn swap_endpoint_modes(
        &self,
        modes: &BTreeMap<String, String>,
    ) -> Result<Vec<(String, String)>, StoreError> {
        let (backend, modes) = (self.backend, modes.clone());
        self.transact(super::owner::job(move |s| {
            Box::pin(async move {
                let tx = s.tx().await?;
                let rows = backend.query("SELECT name, mode FROM endpoint_modes").fetch_all(tx.exec()).await?;
                let before: BTreeMap<String, String> = rows.iter().map(|r| (r.get("name"), r.get("mode"))).collect();
                let switched = modes
                    .iter()
                    .filter_map(|(name, mode)| {
                        before.get(name).filter(|old| *old != mode).map(|old| (name.clone(), old.clone()))
                    })
                    .collect();
                for (name, mode) in &modes {
                    let sql = "INSERT INTO endpoint_modes (name, mode) VALUES ($1, $2) \
                               ON CONFLICT (name) DO UPDATE SET mode = excluded.mode";
                    backend.query(sql).bind(name.as_str()).bind(mode.as_str()).execute(tx.exec()).await?;
                }
                Ok(switched)
            })
        }))
        .await
    }

    /// The stored state of `webhook` (`None` when enabled and never disabled).
    pub async fn webhook_state(&self, webhook: &str) -> Result<Option<WebhookState>, StoreError> {
        let sql = "SELECT name, disabled_reason, disabled_at, disabled_url FROM webhook_state WHERE name = $1";
        let row = self.read_optional(self.backend.query(sql).bind(webhook)).await?;
        Ok(row.map(|r| WebhookState {
            name: r.get("name"),
            disabled_reason: r.get("disabled_reason"),
            disabled_at: r.get("disabled_at"),
            disabled_url: r.get("disabled_url"),
        }))
    }
}

/// One attempt-log row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AttemptRow {
    /// Started at (Unix ms).
    pub started_at: i64,
    /// Duration in milliseconds.
    pub duration_ms: i64,
    /// HTTP status, if a response arrived.
    pub status_code: Option<i64>,
    /// One of [`ERROR_CLASSES`], or `None` on success.
    pub error_class: Option<String>,
    /// Error text.
    pub error: Option<String>,
    /// `Location` of a 3xx.
    pub location: Option<String>,
    /// At most 4 KiB of the response body.
    pub response_body: Option<String>,
    /// Templated endpoints: the rendered requests and answers (JSON, see [`AttemptRecord::request`]).
    pub request: Option<String>,
}

fn delivery_row(r: &Row) -> DeliveryRow {
    DeliveryRow {
        id: r.get("id"),
        webhook: r.get("webhook"),
        event_id: r.get("event_id"),
        key: ServiceKey::new(r.get::<String, _>("namespace"), r.get::<String, _>("name")),
        kind: r.get("kind"),
        msg_id: r.get("msg_id"),
        state: r.get("state"),
        attempts: r.get("attempts"),
        created_at: r.get("created_at"),
        next_attempt_at: r.get("next_attempt_at"),
        finished_at: r.get("finished_at"),
        last_status: r.get("last_status"),
        last_error: r.get("last_error"),
        payload: r.get("payload"),
    }
}

pub(super) fn attempt_row(r: &Row) -> AttemptRow {
    AttemptRow {
        started_at: r.get("started_at"),
        duration_ms: r.get("duration_ms"),
        status_code: r.get("status_code"),
        error_class: r.get("error_class"),
        error: r.get("error"),
        location: r.get("location"),
        response_body: r.get("response_body"),
        request: r.get("request"),
    }
}

/// Attempts per [`COMPLETE`] statement. On SQLite their rows go in inserts of 64, 16, 4 and 1 rows
/// (9 parameters each; [`super::db::row_chunks`]), so a round's few texts recur; on PostgreSQL in one.
const ATTEMPT_ROWS: usize = 64;

/// Sets each delivery's state after its attempt, from the JSON array ?1 of `{id, state, next,
/// finished, status, error}` (one per delivery; ids are unique within a call: a delivery is claimed
/// again only after its attempt was recorded). A delivery superseded meanwhile stays `superseded`
/// (its attempt still counts): its lease ran out before the outcome was recorded (the database
/// refused writes for longer than `relay.lease`), a newer `MODIFIED`, `DELETED` or resync took its
/// place, and that one is what is sent next.
const COMPLETE: PerBackend = PerBackend {
    lite: "UPDATE deliveries SET state = CASE deliveries.state WHEN 'superseded' THEN 'superseded' ELSE u.state END, \
    attempts = attempts + 1, claimed_until = NULL, \
    next_attempt_at = COALESCE(u.next, next_attempt_at), \
    finished_at = CASE deliveries.state WHEN 'superseded' THEN deliveries.finished_at ELSE u.finished END, \
    last_status = u.status, last_error = u.error FROM (SELECT json_extract(value, '$.id') AS id, json_extract(value, '$.state') AS state, \
    json_extract(value, '$.next') AS next, json_extract(value, '$.finished') AS finished, \
    json_extract(value, '$.status') AS status, json_extract(value, '$.error') AS error FROM json_each($1)) AS u \
    WHERE deliveries.id = u.id",
    pg: "UPDATE deliveries SET state = CASE deliveries.state WHEN 'superseded' THEN 'superseded' ELSE u.state END, \
    attempts = deliveries.attempts + 1, claimed_until = NULL, \
    next_attempt_at = COALESCE(u.next, deliveries.next_attempt_at), \
    finished_at = CASE deliveries.state WHEN 'superseded' THEN deliveries.finished_at ELSE u.finished END, \
    last_status = u.status, last_error = u.error FROM jsonb_to_recordset($1::jsonb) \
    AS u(id bigint, state text, next bigint, finished bigint, status bigint, error text) WHERE deliveries.id = u.id",
};

/// Columns of an attempt row, in [`super::db::values_sql`] order.
const ATTEMPT_INSERT: &str = "INSERT INTO attempts (delivery_id, started_at, duration_ms, status_code, error_class, \
    error, location, response_body, request)";

/// Records each attempt of `done` and the delivery's new state, and what the succeeded ones leave
/// their templated endpoint holding (`store::told`), then supersedes the retried ones a DELETED or
/// SYNCED queued behind makes redundant.
pub(super) async fn record_attempts(s: &mut Script<'_>, now: i64, done: &[Completion]) -> Result<(), StoreError> {
    // A few statements per round rather than two per attempt, all in the round's one script (see
    // `store::script`): a relay round of 32 attempts once made 64 round trips to SQLite's connection
    // thread while the watch's writer waited for its turn.
    let mut retried = Vec::new();
    for chunk in done.chunks(ATTEMPT_ROWS) {
        // On SQLite cut into pieces of few distinct sizes, the small ones joining the script; on
        // PostgreSQL each statement is a round trip to the server, so one insert per chunk.
        let pieces: Vec<&[Completion]> = match s.backend() {
            Backend::Sqlite => super::db::row_chunks(chunk, ATTEMPT_ROWS).collect(),
            Backend::Postgres => vec![chunk],
        };
        for rows in pieces {
            let mut q = Stmt::values(s.backend(), ATTEMPT_INSERT, rows.len(), 9, "");
            for c in rows {
                let a = &c.attempt;
                q = q
                    .bind(c.delivery_id)
                    .bind(a.started_at)
                    .bind(a.duration_ms)
                    .bind(a.status_code.map(i64::from))
                    .bind(a.error_class)
                    .bind(&a.error)
                    .bind(&a.location)
                    .bind(&a.response_body)
                    .bind(&a.request);
            }
            s.run(q).await?;
        }
        let rows: Vec<serde_json::Value> = chunk
            .iter()
            .map(|c| {
                let (state, next, finished) = match c.outcome {
                    Outcome::Succeeded => ("succeeded", None, Some(now)),
                    Outcome::Retry(at) => {
                        retried.push(c.delivery_id);
                        ("pending", Some(at), None)
                    }
                    Outcome::Failed => ("failed", None, Some(now)),
                };
                serde_json::json!({"id": c.delivery_id, "state": state, "next": next, "finished": finished,
                                   "status": c.attempt.status_code, "error": c.attempt.error})
            })
            .collect();
        let rows = serde_json::Value::Array(rows).to_string();
        s.run(Stmt::dual(s.backend(), &COMPLETE).bind(rows)).await?;
    }
    super::told::record_told(s, now, done).await?;
    super::outbox::supersede_retried(s, now, &retried).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{AttemptRecord, Outcome};

    /// A store on a fresh SQLite file with a `SYNCED` delivery to endpoint `w` for each Service
    /// `ns/<name>`, in that order.
    async fn with_synced(names: &[&str]) -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("t.db")).await.unwrap();
        for name in names {
            let d = NewDelivery {
                webhook: "w".into(),
                kind: "SYNCED",
                msg_id: crate::store::new_msg_id(),
                payload: "{}".into(),
                coalesce_ms: None,
            };
            store.enqueue_synced(vec![(d, ServiceKey::new("ns", *name))]).await.unwrap();
        }
        (dir, store)
    }

    /// The deliveries of an event are found on its Service's queue and on its endpoints' full-state
    /// queue, none of another Service's, and still when the event itself was pruned.
    #[tokio::test]
    async fn the_deliveries_of_an_event_are_those_of_its_service_and_of_its_endpoints_queue() {
        let (_dir, store) = with_synced(&[]).await;
        let event = "INSERT INTO events (id, observed_at, type, namespace, name, uid, resource_version, cause, view) \
                     VALUES ($1, 1, 'MODIFIED', 'ns', $2, 'u', '1', 'watch', '{}')";
        for (id, name) in [(7, "a"), (8, "b")] {
            store.execute(store.backend.query(event).bind(id).bind(name)).await.unwrap();
        }
        let delivery = "INSERT INTO deliveries (webhook, event_id, namespace, name, kind, msg_id, payload, created_at, \
                        next_attempt_at) VALUES ('w', $1, $2, $3, 'MODIFIED', $4, '{}', 1, 1)";
        for (event_id, ns, name) in [(7, "ns", "a"), (7, "", ""), (8, "ns", "b"), (9, "ns", "gone")] {
            let q = store.backend.query(delivery).bind(event_id).bind(ns).bind(name).bind(crate::store::new_msg_id());
            store.execute(q).await.unwrap();
        }
        let of = |event_id| {
            let store = &store;
            async move {
                let filter = DeliveryFilter { event_id: Some(event_id), ..Default::default() };
                let rows = store.deliveries(&filter).await.unwrap();
                rows.iter().map(|d| d.key.to_string()).collect::<Vec<_>>()
            }
        };
        assert_eq!(of(7).await, ["ns/a", "/"]);
        assert_eq!(of(8).await, ["ns/b"]);
        assert_eq!(of(9).await, ["ns/gone"]);
    }

    /// A claim asked for at a time long past (a round that waited for the write connection) is
    /// leased from when it runs: its lease ends `lease_ms` after the call at the earliest, both
    /// alone and in a round ([`Store::claim`], [`Store::complete_and_claim`]).
    #[tokio::test]
    async fn a_claim_is_leased_from_when_it_runs_not_from_when_it_was_asked_for() {
        let (_dir, store) = with_synced(&["a", "b"]).await;
        let before = now_ms();
        let claimed = store.claim("w", before - 10_000, 1_000, 1).await.unwrap();
        assert!(claimed[0].claimed_until >= before + 1_000, "{} < {}", claimed[0].claimed_until, before + 1_000);
        let before = now_ms();
        let heads = store.complete_and_claim(&[], Some(("w", before - 10_000, 1_000, 1))).await.unwrap();
        assert!(
            heads.claimed[0].claimed_until >= before + 1_000,
            "{} < {}",
            heads.claimed[0].claimed_until,
            before + 1_000
        );
    }

    /// An outcome recorded after its delivery was superseded (its lease ran out first, while the
    /// database refused writes) counts the attempt and leaves the delivery superseded, so it is not
    /// revived as `succeeded` or `pending` behind the delivery that replaced it.
    #[tokio::test]
    async fn an_outcome_recorded_after_its_delivery_was_superseded_leaves_it_superseded() {
        let (_dir, store) = with_synced(&["a"]).await;
        let id = store.claim("w", now_ms(), 60_000, 1).await.unwrap()[0].id;
        let supersede =
            store.backend.query("UPDATE deliveries SET state = 'superseded', finished_at = 7 WHERE id = $1");
        store.execute(supersede.bind(id)).await.unwrap();

        for outcome in [Outcome::Succeeded, Outcome::Retry(now_ms()), Outcome::Failed] {
            let done = Completion { delivery_id: id, attempt: AttemptRecord::default(), outcome, told: None };
            store.complete(&[done]).await.unwrap();
        }
        let row = store.delivery(id).await.unwrap().unwrap();
        assert_eq!((row.state.as_str(), row.finished_at, row.attempts), ("superseded", Some(7), 3));
        assert_eq!(store.attempts(id).await.unwrap().len(), 3);
    }
}
