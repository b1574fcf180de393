//! The transactional outbox: deliveries enqueued with their event, claimed with a lease by the relay,
//! completed with an attempt row. Per (endpoint, Service) the pending deliveries form a FIFO queue
//! whose head (lowest id) is the only one ever claimed, which is what keeps per-Service order.

use std::collections::HashSet;
use std::sync::LazyLock;
use vipwatch_contract::CompactString;

use super::db::{PerBackend, Tx};
use super::script::{Script, Stmt};
use super::{Backend, Store, StoreError};
use crate::model::{Cause, Recorded, ServiceKey};

/// A newly recorded event, as the [`Outbox`] router sees it.
#[derive(Debug, Clone, Copy)]
pub struct RecordedEvent<'a> {
    /// Its event-log id.
    pub id: i64,
    /// When it was observed (Unix ms).
    pub observed_at: i64,
    /// The Service.
    pub key: &'a ServiceKey,
    /// Why it was recorded.
    pub cause: Cause,
    /// The event.
    pub event: &'a Recorded,
}

/// A fresh `webhook-id`: `msg_` + 32 hex digits (no `.`, as the Standard Webhooks spec requires), a
/// UUIDv7 (RFC 9562): 48 bits of Unix milliseconds, then a counter seeded at random each
/// millisecond, then random bits; ordered by creation within this process (the `uuid` crate's shared
/// context, which also holds the order when the clock steps back). An id shows when it was made.
///
/// The ordering is for SQLite, where `deliveries.msg_id` is a unique index: a random id would put
/// every new delivery on a random leaf page of it, one more page in the WAL per change; ordered ids go
/// to its last page. (PostgreSQL keeps no index on it, so that a rewritten queued delivery stays on
/// its page: migration 0008.) Receivers must still treat it as opaque: only its uniqueness is
/// promised.
pub fn new_msg_id() -> String {
    format!("msg_{}", uuid::Uuid::now_v7().simple())
}

/// One delivery to enqueue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewDelivery {
    /// Endpoint name.
    pub webhook: String,
    /// `ADDED`, `MODIFIED`, `DELETED` or `SYNCED`.
    pub kind: &'static str,
    /// The `webhook-id`: unique, without `.`.
    pub msg_id: String,
    /// The exact JSON body.
    pub payload: String,
    /// `Some(debounce_ms)`: a full-state delivery (request templates). It goes on the endpoint's own
    /// queue ([`ENDPOINT_QUEUE`]), never awaits the finalizer, and at most one such delivery
    /// waits there outside an attempt: a newer one only pushes that one's due time to at least
    /// `now + debounce_ms` (it renders the current state when sent anyway).
    pub coalesce_ms: Option<i64>,
}

/// The queue key of deliveries that belong to an endpoint rather than a Service (`sync.completed`,
/// full-state declarations): empty namespace and name.
pub static ENDPOINT_QUEUE: ServiceKey =
    ServiceKey { namespace: CompactString::const_new(""), name: CompactString::const_new("") };

/// Pushes back the waiting (pending, not leased) full-state delivery of endpoint $1 to at least $3
/// (its retry schedule still wins when later); returns its id.
const COALESCE: PerBackend = PerBackend {
    lite: "UPDATE deliveries SET next_attempt_at = MAX(next_attempt_at, $3) WHERE id = ( \
    SELECT id FROM deliveries WHERE webhook = $1 AND namespace = '' AND name = '' AND state = 'pending' \
      AND (claimed_until IS NULL OR claimed_until < $2) ORDER BY id DESC LIMIT 1) RETURNING id",
    pg: "UPDATE deliveries SET next_attempt_at = GREATEST(next_attempt_at, $3) WHERE id = ( \
    SELECT id FROM deliveries WHERE webhook = $1 AND namespace = '' AND name = '' AND state = 'pending' \
      AND (claimed_until IS NULL OR claimed_until < $2) ORDER BY id DESC LIMIT 1) RETURNING id",
};

/// Routes a recorded event to endpoints; called inside the event's transaction, so it must not block.
pub trait Outbox: Send + Sync {
    /// Deliveries to enqueue for `event` (empty when no endpoint subscribes).
    fn route(&self, event: RecordedEvent<'_>) -> Vec<NewDelivery>;
}

/// An [`Outbox`] with no endpoints.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoOutbox;

impl Outbox for NoOutbox {
    fn route(&self, _: RecordedEvent<'_>) -> Vec<NewDelivery> {
        Vec::new()
    }
}

/// A pending delivery claimed for one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    /// Delivery id.
    pub id: i64,
    /// The Service.
    pub key: ServiceKey,
    /// `ADDED`, `MODIFIED`, `DELETED` or `SYNCED`.
    pub kind: String,
    /// The `webhook-id`.
    pub msg_id: String,
    /// The exact body.
    pub payload: String,
    /// Attempts made before this one.
    pub attempts: i64,
    /// When it was enqueued (Unix ms).
    pub created_at: i64,
    /// The event it carries (`None` for `service.synced`).
    pub event_id: Option<i64>,
    /// When this claim's lease ends (Unix ms): the claim's time plus `relay.lease`. The attempt is
    /// cut off a tenth of the lease before ([`crate::config::RelayConfig::attempt_limit`]), counted
    /// from the claim, not from when the attempt got to start.
    pub claimed_until: i64,
}

/// Columns of a delivery row, in [`super::db::values_sql`] order.
const DELIVERY_INSERT: &str = "INSERT INTO deliveries (webhook, event_id, namespace, name, kind, msg_id, payload, \
    created_at, next_attempt_at, held)";

/// Rows per multi-row delivery INSERT (10 parameters each), cut as 128, 32, 8, 2, 1 ([`super::db::row_chunks`]).
const CHUNK: usize = 128;

/// Supersedes, among deliveries touched by this batch (a newer pending MODIFIED with id >= $2), every
/// pending MODIFIED followed by a newer pending MODIFIED with no pending ADDED/DELETED/SYNCED in
/// between (`collapses!`): one behind its queue's head, and the head itself while no attempt has
/// touched it (none made, none in flight at $1) and it awaits the finalizer exactly as the newer
/// one is. ADDED, DELETED and SYNCED are never superseded. Run after [`INHERIT_PLACE`], which gives the
/// newer delivery the place in line of those it supersedes.
///
/// The newer deliveries `m` drive the join (`CROSS JOIN` fixes SQLite's loop order: a rowid range
/// over this batch's rows, then each one's queue by index `deliveries_queue`); the planner's own
/// choice scans every pending delivery, slow with thousands pending during a burst. PostgreSQL has
/// neither hint; its planner takes the same path (a plain join).
///
/// Why an untouched head is superseded too: in a burst of changes to many Services, the head each
/// Service's queue shows the relay would hold the state frozen at the moment the previous delivery
/// finished, so every change would wait for the relay to reach that stale head and then the one
/// behind it, about two sweeps over every busy Service, and the stale one would be sent for nothing.
const SUPERSEDE: PerBackend = superseding!(collapses!());

/// When a pending MODIFIED `d` (older) collapses into the newer pending MODIFIED `m` of the same
/// queue ([`SUPERSEDE`]), with $1 the time now: no pending ADDED/DELETED/SYNCED between them, and `d`
/// is not the queue's head or is a head no attempt has touched.
macro_rules! collapses {
    () => {
        "m.kind = 'MODIFIED' AND d.kind = 'MODIFIED' \
      AND (EXISTS (SELECT 1 FROM deliveries p WHERE p.webhook = d.webhook AND p.namespace = d.namespace \
                   AND p.name = d.name AND p.state = 'pending' AND p.id < d.id) \
           OR (d.attempts = 0 AND (d.claimed_until IS NULL OR d.claimed_until < $1) AND d.held = m.held)) \
      AND NOT EXISTS (SELECT 1 FROM deliveries x WHERE x.webhook = d.webhook AND x.namespace = d.namespace \
                  AND x.name = d.name AND x.state = 'pending' AND x.kind <> 'MODIFIED' \
                  AND x.id > d.id AND x.id < m.id)"
    };
}
use collapses;

/// Gives each of this batch's pending MODIFIEDs (`m`, id >= $2) the earliest place in line
/// (`next_attempt_at`, the claim's order) among the deliveries it is about to supersede
/// ([`SUPERSEDE`], same condition, $1 the time now): a collapsed change is sent when the oldest
/// change it carries would have been, instead of going to the back of the line each time a newer one
/// replaces it. Those deliveries were never attempted or are behind the head, so their
/// `next_attempt_at` is when they were enqueued (or let go by the finalizer), never a retry's backoff.
/// Without it a Service that keeps changing during a burst would keep a fresh delivery id and wait
/// for every other Service's turn again.
const INHERIT_PLACE: PerBackend = PerBackend {
    lite: concat!(
        "UPDATE deliveries AS m SET next_attempt_at = MIN(m.next_attempt_at, COALESCE(( \
    SELECT MIN(d.next_attempt_at) FROM deliveries d INDEXED BY deliveries_queue WHERE ",
        inherit_from!(),
        "), m.next_attempt_at)) WHERE m.id >= $2 AND m.state = 'pending' AND m.kind = 'MODIFIED'"
    ),
    pg: concat!(
        "UPDATE deliveries AS m SET next_attempt_at = LEAST(m.next_attempt_at, ( \
    SELECT MIN(d.next_attempt_at) FROM deliveries d WHERE ",
        inherit_from!(),
        ")) WHERE m.id >= $2 AND m.state = 'pending' AND m.kind = 'MODIFIED'"
    ),
};

/// The deliveries `d` that `m` will supersede ([`INHERIT_PLACE`]).
macro_rules! inherit_from {
    () => {
        concat!(older_in_queue!(), " AND ", collapses!())
    };
}
use inherit_from;

/// `d` is a pending delivery of `m`'s queue (endpoint and Service) older than `m`: the join of the
/// superseding statements and of [`INHERIT_PLACE`].
macro_rules! older_in_queue {
    () => {
        "d.webhook = m.webhook AND d.namespace = m.namespace AND d.name = m.name AND d.state = 'pending' \
      AND d.id < m.id"
    };
}
use older_in_queue;

/// A superseding UPDATE on both backends: the join of this batch's newer pending deliveries `m`
/// (ids >= $2) to the older pending deliveries `d` of the same queue, finished at $1, narrowed by
/// `$which` (a literal condition on `m` and `d`, or a macro giving one). SQLite's text pins the loop
/// order (`CROSS JOIN`) and `d`'s index; PostgreSQL's is a plain join.
macro_rules! superseding {
    (@on) => {
        concat!(older_in_queue!(), " WHERE m.id >= $2 AND m.state = 'pending' AND ")
    };
    ($($which:tt)+) => {
        PerBackend {
            lite: concat!(
                "UPDATE deliveries SET state = 'superseded', finished_at = $1 WHERE id IN ( \
    SELECT d.id FROM deliveries m CROSS JOIN deliveries d INDEXED BY deliveries_queue ON ",
                superseding!(@on),
                $($which)+,
                ")"
            ),
            pg: concat!(
                "UPDATE deliveries SET state = 'superseded', finished_at = $1 WHERE id IN ( \
    SELECT d.id FROM deliveries m JOIN deliveries d ON ",
                superseding!(@on),
                $($which)+,
                ")"
            ),
        }
    };
}
use superseding;

/// Supersedes every pending ADDED or MODIFIED that is not in flight (no live lease at $1) and is
/// followed in its queue by a pending DELETED or SYNCED with id >= $2: those carry the whole state, so
/// what was queued before them says nothing the receiver still needs — and a delivery the receiver
/// refuses for good (a 422 retried for a day) no longer holds back the Service's DELETED or its
/// resync. A DELETED or SYNCED is never superseded. Driven by the batch's rows like [`SUPERSEDE`].
const SUPERSEDE_BY_FULL: PerBackend = superseding!(
    "m.kind IN ('DELETED', 'SYNCED') AND d.kind IN ('ADDED', 'MODIFIED') \
      AND (d.claimed_until IS NULL OR d.claimed_until < $1)"
);

/// [`SUPERSEDE_BY_FULL`] for the deliveries whose ids are in the JSON array $2 (attempts that just
/// failed and were in flight when a DELETED or SYNCED queued behind them).
const SUPERSEDE_RETRIED: PerBackend = PerBackend {
    lite: concat!(
        "UPDATE deliveries SET state = 'superseded', finished_at = $1 WHERE id IN ( \
    SELECT d.id FROM deliveries d WHERE d.id IN (SELECT value FROM json_each($2)) AND ",
        retried_tail!()
    ),
    pg: concat!(
        "UPDATE deliveries SET state = 'superseded', finished_at = $1 WHERE id IN ( \
    SELECT d.id FROM deliveries d WHERE d.id IN (SELECT jsonb_array_elements_text($2::jsonb)::bigint) AND ",
        retried_tail!()
    ),
};

/// The rest of [`SUPERSEDE_RETRIED`], after the ids.
macro_rules! retried_tail {
    () => {
        "d.state = 'pending' \
      AND d.kind IN ('ADDED', 'MODIFIED') \
      AND EXISTS (SELECT 1 FROM deliveries m WHERE m.webhook = d.webhook AND m.namespace = d.namespace \
                  AND m.name = d.name AND m.state = 'pending' AND m.kind IN ('DELETED', 'SYNCED') AND m.id > d.id))"
    };
}
use retried_tail;

/// Supersedes the retried deliveries `ids` that a DELETED or SYNCED queued behind makes redundant
/// ([`SUPERSEDE_RETRIED`]); part of recording their attempts.
pub(super) async fn supersede_retried(s: &mut Script<'_>, now: i64, ids: &[i64]) -> Result<(), StoreError> {
    if ids.is_empty() {
        return Ok(());
    }
    let ids = serde_json::to_string(ids).unwrap_or_else(|_| "[]".into());
    s.run(Stmt::dual(s.backend(), &SUPERSEDE_RETRIED).bind(now).bind(ids)).await
}

/// The deliveries `outbox` routes the events to (ids in order): pure CPU work, done before the
/// transaction that inserts them ([`insert_deliveries`]).
pub(super) fn route(outbox: &dyn Outbox, events: &[(RecordedEvent<'_>, Option<i64>, bool)]) -> Vec<DeliveryInsert> {
    events
        .iter()
        .flat_map(|(e, event_id, held)| {
            outbox.route(*e).into_iter().map(move |d| match d.coalesce_ms {
                Some(_) => (d, *event_id, ENDPOINT_QUEUE.clone(), false),
                None => (d, *event_id, e.key.clone(), *held),
            })
        })
        .collect()
}

/// A delivery to insert: what, for which event, which Service, awaiting the finalizer or not.
pub(super) type DeliveryInsert = (NewDelivery, Option<i64>, ServiceKey, bool);

/// Rewrites queued MODIFIEDs in place, then inserts the other deliveries (multi-row) and supersedes
/// what they make redundant.
///
/// A MODIFIED that is the first delivery of its queue in this batch goes into the pending MODIFIED
/// its queue ends with, when no attempt ever touched that one ([`REWRITE`]): the row keeps its id and
/// place in line, and takes this delivery's event id, body, `msg_id` and `created_at`. That is what
/// superseding it would have come to, for one row update instead of an insert into the table and its
/// six indexes plus the update that supersedes the older row.
///
/// The superseding statements are driven by this batch's rows: ids from the first one inserted. On
/// PostgreSQL the inserts return their ids; on SQLite they join the script (no result to wait for)
/// and the first id is `last_insert_rowid() + 1 - n` for the batch's `n` rows (AUTOINCREMENT gives
/// one connection's rows of one transaction consecutive ids). Superseding from the batch's first
/// row rather than its first `MODIFIED` (or `DELETED`/`SYNCED`) is the same: both statements filter
/// the newer rows by kind.
pub(super) async fn insert_deliveries(s: &mut Script<'_>, now: i64, rows: &[DeliveryInsert]) -> Result<(), StoreError> {
    for (d, event_id, _, _) in rows.iter().filter(|r| r.0.coalesce_ms.is_some()) {
        coalesce(s.tx().await?, now, d, *event_id).await?;
    }
    let mut rows: Vec<&DeliveryInsert> = rows.iter().filter(|r| r.0.coalesce_ms.is_none()).collect();
    let rewritten = rewrite(s, now, &rewritable(&rows)).await?;
    rows.retain(|(d, event_id, _, _)| !event_id.is_some_and(|id| rewritten.contains(&(d.webhook.as_str(), id))));
    match s.backend() {
        Backend::Sqlite => insert_in_script(s, now, &rows).await,
        Backend::Postgres => insert_returning(s.tx().await?, now, &rows).await,
    }
}

/// The MODIFIEDs among `rows` that may go into a queued one ([`REWRITE`]): each the first delivery
/// of its queue (endpoint and Service) in the batch, and carrying an event. A later one of the same
/// queue is inserted, and supersedes the rewritten row as it would any older MODIFIED.
fn rewritable<'r>(rows: &[&'r DeliveryInsert]) -> Vec<&'r DeliveryInsert> {
    let mut queues = HashSet::new();
    rows.iter()
        .copied()
        .filter(|(d, event_id, key, _)| {
            queues.insert((d.webhook.as_str(), key)) && d.kind == "MODIFIED" && event_id.is_some()
        })
        .collect()
}

/// Rows of [`REWRITE`]'s VALUES: endpoint, event id, body, namespace, name, held, `msg_id`,
/// `created_at` (eight parameters).
const REWRITE_COLUMNS: usize = 8;

/// The start of [`REWRITE`], before its VALUES.
const REWRITE_HEAD: &str = "UPDATE deliveries AS d SET event_id = n.column2, payload = n.column3, msg_id = n.column7, \
    created_at = n.column8 FROM (";

/// Rewrites in place, for each row `n` of its VALUES ([`REWRITE_COLUMNS`]), the pending delivery its
/// queue ends with (the highest pending id of endpoint and Service, by index `deliveries_queue`) when
/// that is a MODIFIED held as `n` is, never claimed (`claimed_until` NULL: an attempt whose outcome
/// is not recorded yet keeps its lease, so a late outcome never marks the new body delivered) and
/// never attempted, and its event frees no pool address ([`Store::event_settled`] follows a
/// withdrawing change's own delivery). Returns the endpoint and new event id of each row rewritten.
/// Being the last pending one, nothing non-MODIFIED follows it: the [`collapses!`] condition holds.
///
/// The row takes the new delivery's `msg_id` (the `webhook-id`): "never claimed" cannot be told
/// from "claimed before a restart" ([`Store::release_leases`] clears the lease of an attempt whose
/// outcome was never recorded, which the receiver may have applied), and receivers dedupe on it, so
/// the newer body must not go out under an id that may have been sent. And its `created_at`, from
/// which `retry.max_age` and the delivery latency count, as a delivery of its own would have.
///
/// [`Store::release_leases`]: super::Store::release_leases
/// [`Store::event_settled`]: super::Store::event_settled
const REWRITE: &str = ") AS n WHERE d.id = (SELECT MAX(p.id) FROM deliveries p WHERE p.webhook = n.column1 \
    AND p.namespace = n.column4 AND p.name = n.column5 AND p.state = 'pending') \
    AND d.kind = 'MODIFIED' AND d.attempts = 0 AND d.claimed_until IS NULL AND d.held = n.column6 \
    AND NOT EXISTS (SELECT 1 FROM releases r WHERE r.event_id = d.event_id) RETURNING webhook, event_id";

/// Runs [`REWRITE`] for `rows` ([`rewritable`]); returns `(endpoint, event id)` of each one that went
/// into a queued delivery (and is not to be inserted).
async fn rewrite<'r>(
    s: &mut Script<'_>,
    now: i64,
    rows: &[&'r DeliveryInsert],
) -> Result<HashSet<(&'r str, i64)>, StoreError> {
    let mut done = HashSet::new();
    for chunk in super::db::row_chunks(rows, CHUNK) {
        let mut q = Stmt::values(s.backend(), REWRITE_HEAD, chunk.len(), REWRITE_COLUMNS, REWRITE);
        for (d, event_id, key, held) in chunk.iter().copied() {
            q = q.bind(&d.webhook).bind(*event_id).bind(&d.payload).bind(&key.namespace).bind(&key.name);
            q = q.bind(i64::from(*held)).bind(&d.msg_id).bind(now);
        }
        for row in s.fetch_all(q).await? {
            let (webhook, event_id): (String, i64) = (row.get(0), row.get(1));
            if let Some((d, _, _, _)) = chunk.iter().find(|r| r.1 == Some(event_id) && r.0.webhook == webhook) {
                done.insert((d.webhook.as_str(), event_id));
            }
        }
    }
    Ok(done)
}

/// [`INHERIT_PLACE`], [`SUPERSEDE`] and [`SUPERSEDE_BY_FULL`] on SQLite right after a batch's
/// inserts, with $2 the number of rows the batch inserted (see [`insert_deliveries`]).
static SUPERSEDE_AFTER_INSERT: LazyLock<[String; 3]> = LazyLock::new(|| {
    [INHERIT_PLACE.lite, SUPERSEDE.lite, SUPERSEDE_BY_FULL.lite].map(|sql| {
        // Once, or the statement would compare ids with a row count.
        assert_eq!(sql.matches(NEWER).count(), 1, "the batch's condition in {sql}");
        sql.replace(NEWER, NEWER_AFTER_INSERT)
    })
});

/// The condition of the superseding statements on the batch's newer rows (`superseding!`).
const NEWER: &str = "m.id >= $2";

/// [`NEWER`] on SQLite right after the batch's inserts, $2 the number of rows they inserted.
const NEWER_AFTER_INSERT: &str = "m.id >= last_insert_rowid() + 1 - $2";

/// SQLite's [`insert_deliveries`]: the inserts and the superseding statements join the script.
async fn insert_in_script(s: &mut Script<'_>, now: i64, rows: &[&DeliveryInsert]) -> Result<(), StoreError> {
    for chunk in super::db::row_chunks(rows, CHUNK) {
        s.run(delivery_chunk(s.backend(), now, chunk, "")).await?;
    }
    let n = rows.len() as i64;
    let [inherit, modified, full] = &*SUPERSEDE_AFTER_INSERT;
    if rows.iter().any(|r| r.0.kind == "MODIFIED") {
        s.run(Stmt::new(inherit.as_str()).bind(now).bind(n)).await?;
        s.run(Stmt::new(modified.as_str()).bind(now).bind(n)).await?;
    }
    if rows.iter().any(|r| matches!(r.0.kind, "DELETED" | "SYNCED")) {
        s.run(Stmt::new(full.as_str()).bind(now).bind(n)).await?;
    }
    Ok(())
}

/// PostgreSQL's [`insert_deliveries`]: each insert returns its ids, from which the superseding
/// statements start.
async fn insert_returning(tx: &mut Tx<'_>, now: i64, rows: &[&DeliveryInsert]) -> Result<(), StoreError> {
    let mut first_modified: Option<i64> = None;
    let mut first_full: Option<i64> = None;
    for chunk in super::db::row_chunks(rows, CHUNK) {
        let q = delivery_chunk(tx.backend(), now, chunk, " RETURNING id, kind").into_query(tx.backend());
        for row in q.fetch_all(tx.exec()).await? {
            let id: i64 = row.get("id");
            let first = match row.get::<&str, _>("kind") {
                "MODIFIED" => &mut first_modified,
                "DELETED" | "SYNCED" => &mut first_full,
                _ => continue,
            };
            *first = Some(first.map_or(id, |f| f.min(id)));
        }
    }
    if let Some(first) = first_modified {
        tx.backend().dual(&INHERIT_PLACE).bind(now).bind(first).execute(tx.exec()).await?;
        tx.backend().dual(&SUPERSEDE).bind(now).bind(first).execute(tx.exec()).await?;
    }
    if let Some(first) = first_full {
        tx.backend().dual(&SUPERSEDE_BY_FULL).bind(now).bind(first).execute(tx.exec()).await?;
    }
    Ok(())
}

/// One multi-row delivery insert of `chunk`, followed by `tail`.
fn delivery_chunk(backend: Backend, now: i64, chunk: &[&DeliveryInsert], tail: &str) -> Stmt {
    let mut q = Stmt::values(backend, DELIVERY_INSERT, chunk.len(), 10, tail);
    for (d, event_id, key, held) in chunk.iter().copied() {
        q = q
            .bind(&d.webhook)
            .bind(*event_id)
            .bind(&key.namespace)
            .bind(&key.name)
            .bind(d.kind)
            .bind(&d.msg_id)
            .bind(&d.payload)
            .bind(now)
            .bind(now)
            .bind(i64::from(*held));
    }
    q
}

/// The claim statement of [`Store::claim`]; its rows read with [`claimed`].
pub(super) fn claim_stmt(backend: Backend, webhook: &str, now: i64, lease_ms: i64, limit: usize) -> Stmt {
    // The lease counts from when the statement is made, if that is later than `now` (a claim that
    // waited for the write connection): the attempt's cut-off counts from `claimed_until`.
    let now = now.max(super::now_ms());
    let sql =
        format!("{}{limit}{}{CLAIM_RETURNING}", backend.pick(CLAIM.lite, CLAIM.pg), backend.pick(")", CLAIM_LOCK));
    Stmt::new(sql).bind(webhook).bind(now).bind(now + lease_ms)
}

/// The deliveries a claim statement returned, by id.
pub(super) fn claimed(rows: &[super::db::Row]) -> Vec<Claimed> {
    let mut claimed: Vec<Claimed> = rows
        .iter()
        .map(|r| Claimed {
            id: r.get("id"),
            key: ServiceKey::new(r.get::<String, _>("namespace"), r.get::<String, _>("name")),
            kind: r.get("kind"),
            msg_id: r.get("msg_id"),
            payload: r.get("payload"),
            attempts: r.get("attempts"),
            created_at: r.get("created_at"),
            event_id: r.get("event_id"),
            claimed_until: r.get("claimed_until"),
        })
        .collect();
    claimed.sort_by_key(|c| c.id);
    claimed
}

/// Enqueues full-state delivery `d` on its endpoint's queue, or pushes back the one already waiting.
async fn coalesce(tx: &mut Tx<'_>, now: i64, d: &NewDelivery, event_id: Option<i64>) -> Result<(), StoreError> {
    let due = now + d.coalesce_ms.unwrap_or(0);
    let q = tx.backend().dual(&COALESCE).bind(&d.webhook).bind(now).bind(due);
    let waiting = q.fetch_optional(tx.exec()).await?;
    if waiting.is_none() {
        let sql = "INSERT INTO deliveries (webhook, event_id, namespace, name, kind, msg_id, payload, created_at, \
                   next_attempt_at, held) VALUES ($1, $2, '', '', $3, $4, $5, $6, $7, 0)";
        tx.backend()
            .query(sql)
            .bind(&d.webhook)
            .bind(event_id)
            .bind(d.kind)
            .bind(&d.msg_id)
            .bind(&d.payload)
            .bind(now)
            .bind(due)
            .execute(tx.exec())
            .await?;
    }
    Ok(())
}

/// A pending delivery `d` is its queue's head when no pending delivery of the same (endpoint, Service)
/// has a lower id. Walking the pending deliveries not held by due time, then id (index
/// `deliveries_ready`), and probing that (index `deliveries_queue`) finds the earliest due heads
/// without scanning every queue.
macro_rules! is_head {
    () => {
        "NOT EXISTS (SELECT 1 FROM deliveries p WHERE p.webhook = d.webhook AND p.namespace = d.namespace \
         AND p.name = d.name AND p.state = 'pending' AND p.id < d.id)"
    };
}

/// The claim, up to its LIMIT (a literal, see the `store` module docs; one cached statement per limit,
/// at most `relay.concurrency` of them). On PostgreSQL the candidate rows are locked `FOR UPDATE SKIP
/// LOCKED` ([`CLAIM_LOCK`]): under read committed, two claims running at once would otherwise both
/// read the same heads and both lease them.
const CLAIM: PerBackend = PerBackend {
    lite: concat!(
        "UPDATE deliveries SET claimed_until = $3 WHERE id IN (SELECT d.id FROM deliveries d INDEXED BY deliveries_ready \
     WHERE ",
        claim_where!(),
        " ORDER BY d.next_attempt_at, d.id LIMIT "
    ),
    pg: concat!(
        "UPDATE deliveries SET claimed_until = $3 WHERE id = ANY(ARRAY(SELECT d.id FROM deliveries d WHERE ",
        claim_where!(),
        " ORDER BY d.next_attempt_at, d.id LIMIT "
    ),
};

/// The end of the claim's candidate list on PostgreSQL, after its LIMIT: the row locks, and the
/// `ARRAY(…)` that makes the candidates an InitPlan, run once. As `id IN (SELECT … LIMIT n FOR
/// UPDATE SKIP LOCKED)` the planner may run the subquery again per outer row (a semi join), and a
/// run after rows were updated by the same statement skips them as locked and returns the next: a
/// claim of 2 could lease 5, and an endpoint with `concurrency = 2` have 3 attempts in flight
/// (`relay::an_endpoint_with_its_own_concurrency_has_no_more_deliveries_in_flight`, on PostgreSQL).
const CLAIM_LOCK: &str = " FOR UPDATE SKIP LOCKED))";

/// Which deliveries of endpoint $1 a claim at $2 may take: pending, not held, due, not leased, heads.
macro_rules! claim_where {
    () => {
        concat!(
            "d.webhook = $1 AND d.state = 'pending' AND d.held = 0 AND d.next_attempt_at <= $2 \
     AND (d.claimed_until IS NULL OR d.claimed_until < $2) AND ",
            is_head!()
        )
    };
}
use claim_where;

const CLAIM_RETURNING: &str =
    " RETURNING id, namespace, name, kind, msg_id, payload, attempts, created_at, event_id, claimed_until";

const NEXT_DUE: PerBackend = PerBackend {
    lite: concat!(
        "SELECT MIN(MAX(d.next_attempt_at, COALESCE(d.claimed_until, 0))) FROM deliveries d INDEXED BY deliveries_ready \
     WHERE d.webhook = $1 AND d.state = 'pending' AND d.held = 0 AND ",
        is_head!()
    ),
    pg: concat!(
        "SELECT MIN(GREATEST(d.next_attempt_at, COALESCE(d.claimed_until, 0))) FROM deliveries d \
     WHERE d.webhook = $1 AND d.state = 'pending' AND d.held = 0 AND ",
        is_head!()
    ),
};

impl Store {
    /// Claims up to `limit` due queue heads of `webhook` for `lease_ms`: each is the lowest pending id
    /// of its Service, due (`next_attempt_at <= now`) and not leased. Ordered by due time. The lease
    /// runs from `now`, or from when the statement runs if that is later (after waiting for the write
    /// connection). Each [`Claimed::claimed_until`] says when it ends. Runs in the write
    /// connection's next transaction, at once.
    pub async fn claim(
        &self,
        webhook: &str,
        now: i64,
        lease_ms: i64,
        limit: usize,
    ) -> Result<Vec<Claimed>, StoreError> {
        Ok(self.round(Vec::new(), Some((webhook, now, lease_ms, limit)), true).await?.claimed)
    }

    /// When the next queue head of `webhook` becomes claimable (Unix ms), if any is pending.
    pub async fn next_due(&self, webhook: &str) -> Result<Option<i64>, StoreError> {
        Ok(self.read_one(self.backend.dual(&NEXT_DUE).bind(webhook)).await?.get(0))
    }

    /// Clears every lease: after a crash the attempts that were in flight are due again at once.
    pub async fn release_leases(&self) -> Result<u64, StoreError> {
        let sql = "UPDATE deliveries SET claimed_until = NULL WHERE state = 'pending' AND claimed_until IS NOT NULL";
        self.execute(self.backend.query(sql)).await
    }

    /// Makes every pending delivery of `webhook` due at `now` (the endpoint recovered).
    pub async fn make_due(&self, webhook: &str, now: i64) -> Result<u64, StoreError> {
        let sql = "UPDATE deliveries SET next_attempt_at = $2 WHERE webhook = $1 AND state = 'pending' AND next_attempt_at > $2";
        self.execute(self.backend.query(sql).bind(webhook).bind(now)).await
    }

    /// Pending deliveries per endpoint: `(webhook, count, oldest created_at)`.
    pub async fn outbox_depth(&self) -> Result<Vec<(String, i64, i64)>, StoreError> {
        let sql = "SELECT webhook, COUNT(*), MIN(created_at) FROM deliveries WHERE state = 'pending' GROUP BY webhook";
        let rows = self.read_all(self.backend.query(sql)).await?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn message_ids_are_msg_and_32_hex_digits_unique_and_ordered_by_creation() {
        let ids: Vec<String> = (0..10_000).map(|_| super::new_msg_id()).collect();
        for id in &ids {
            let hex = id.strip_prefix("msg_").unwrap();
            assert_eq!(hex.len(), 32, "{id}");
            assert!(hex.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()), "{id}");
        }
        let mut sorted = ids.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted, ids, "unique and already in creation order");
    }

    use super::*;
    use crate::store::{AttemptRecord, Completion, Outcome, now_ms};

    /// Enqueues a delivery of `kind` carrying event `event_id` (body `{"event": <id>}`) to endpoint
    /// `w` for Service `ns/a`, in a transaction of its own.
    async fn enqueue(store: &Store, kind: &'static str, event_id: i64) {
        let key = ServiceKey::new("ns", "a");
        let payload = serde_json::json!({ "event": event_id }).to_string();
        let d = NewDelivery { webhook: "w".into(), kind, msg_id: new_msg_id(), payload, coalesce_ms: None };
        let rows = vec![(d, Some(event_id), key, false)];
        let job =
            crate::store::owner::job(move |s| Box::pin(async move { insert_deliveries(s, now_ms(), &rows).await }));
        store.transact(job).await.unwrap();
    }

    /// `(id, kind, event id, state, body)` of every delivery, by id.
    async fn rows(store: &Store) -> Vec<(i64, String, Option<i64>, String, String)> {
        let rows = store.deliveries(&Default::default()).await.unwrap();
        let mut rows: Vec<_> = rows.into_iter().map(|r| (r.id, r.kind, r.event_id, r.state, r.payload)).collect();
        rows.sort();
        rows
    }

    fn row(id: i64, kind: &str, event_id: i64, state: &str) -> (i64, String, Option<i64>, String, String) {
        let body = serde_json::json!({ "event": event_id }).to_string();
        (id, kind.into(), Some(event_id), state.into(), body)
    }

    async fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("t.db")).await.unwrap();
        (dir, store)
    }

    /// A MODIFIED queued behind another change, never claimed, takes each newer MODIFIED in place:
    /// one row, its id kept, the newest event, body and `webhook-id` in it ([`REWRITE`]).
    #[tokio::test]
    async fn a_queued_modified_takes_the_newer_ones_in_place() {
        let (_dir, store) = store().await;
        for (kind, event) in [("ADDED", 1), ("MODIFIED", 2), ("MODIFIED", 3), ("MODIFIED", 4)] {
            enqueue(&store, kind, event).await;
        }
        let before = store.delivery(2).await.unwrap().unwrap().msg_id;
        enqueue(&store, "MODIFIED", 5).await;
        assert_eq!(rows(&store).await, [row(1, "ADDED", 1, "pending"), row(2, "MODIFIED", 5, "pending")]);
        assert_ne!(store.delivery(2).await.unwrap().unwrap().msg_id, before);
    }

    /// A head claimed for an attempt whose outcome is not recorded yet is never rewritten, even with
    /// its lease run out: a late `succeeded` would mark the newer change delivered unsent. The newer
    /// change is queued as a row of its own (superseding the head), and the late outcome leaves the
    /// head superseded and the newer one pending.
    #[tokio::test]
    async fn a_head_whose_attempt_is_not_recorded_is_not_rewritten_and_its_late_outcome_loses_nothing() {
        let (_dir, store) = store().await;
        enqueue(&store, "MODIFIED", 1).await;
        let claimed = store.claim("w", now_ms(), 1, 1).await.unwrap().remove(0);
        while now_ms() <= claimed.claimed_until {
            tokio::task::yield_now().await; // the 1 ms lease running out
        }
        enqueue(&store, "MODIFIED", 2).await;
        let done = Completion {
            delivery_id: claimed.id,
            attempt: AttemptRecord::default(),
            outcome: Outcome::Succeeded,
            told: None,
        };
        store.complete(&[done]).await.unwrap();
        let [first, second] = <[_; 2]>::try_from(rows(&store).await).unwrap();
        assert_eq!((first.0, first.2, first.3.as_str()), (1, Some(1), "superseded"));
        assert_eq!(second, row(2, "MODIFIED", 2, "pending"));
    }

    /// A head that was claimed and sent, but whose outcome was never recorded because vipwatch stopped
    /// (a crash, or a graceful stop past `relay.shutdown_grace`), has its lease cleared at the next
    /// start ([`Store::release_leases`]): `claimed_until` NULL and `attempts` 0 again, although the
    /// receiver may already have applied it under its `webhook-id`. A newer MODIFIED must not go out
    /// under that `webhook-id` (receivers dedupe on it and would drop the newer change): it needs a
    /// `webhook-id` of its own (the row takes it with the newer body).
    #[tokio::test]
    async fn a_head_sent_before_a_restart_does_not_lend_its_webhook_id_to_a_newer_change() {
        let (_dir, store) = store().await;
        enqueue(&store, "MODIFIED", 1).await;
        let sent = store.claim("w", now_ms(), 60_000, 1).await.unwrap().remove(0);
        assert_eq!(store.release_leases().await.unwrap(), 1); // the restart
        enqueue(&store, "MODIFIED", 2).await;

        let next = store.claim("w", now_ms(), 60_000, 1).await.unwrap().remove(0);
        assert_eq!((next.event_id, next.payload.as_str()), (Some(2), r#"{"event":2}"#));
        assert_ne!(next.msg_id, sent.msg_id, "the newer change went out under the webhook-id already sent");
        assert_eq!(rows(&store).await, [row(1, "MODIFIED", 2, "pending")]);
    }
}
