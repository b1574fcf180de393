//! What vipwatch must write back to Kubernetes, and whether the appliance has acknowledged enough for
//! it: finalizers to add (deliveries awaiting it), statuses to publish, cleanups after a DELETED.

use std::collections::HashMap;

use super::db::{PerBackend, Row};
use super::{Store, StoreError, now_ms};
use crate::model::{Gates, IngressView, ServiceKey};

/// A Service whose `status.loadBalancer.ingress` must be written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusWork {
    /// The Service.
    pub key: ServiceKey,
    /// `metadata.uid` of the object the status belongs to.
    pub uid: String,
    /// The ingress list to write (empty = clear).
    pub ingress: Vec<IngressView>,
}

/// A cleanup to run once the DELETED `event_id` is acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CleanupWork {
    /// The withdrawing event.
    pub event_id: i64,
    /// The Service.
    pub key: ServiceKey,
    /// `metadata.uid` of the deleted object.
    pub uid: String,
    /// Remove vipwatch's finalizer.
    pub remove_finalizer: bool,
    /// The ingress vipwatch published, to clear when the Service still shows it.
    pub clear_ingress: Vec<IngressView>,
}

/// Pool addresses an event withdrew (a DELETED, or a MODIFIED that dropped them), free once event
/// `event_id` is acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseWork {
    /// The withdrawing event.
    pub event_id: i64,
    /// The Service.
    pub key: ServiceKey,
    /// `metadata.uid` of the object.
    pub uid: String,
    /// The addresses withdrawn.
    pub addresses: Vec<std::net::IpAddr>,
}

/// An address reservation to restore at start: a `releases` row with the view that held the
/// addresses, read from its event (`None` once the event is pruned).
#[derive(Debug, Clone)]
pub struct Reservation {
    /// The Service.
    pub key: ServiceKey,
    /// `metadata.uid` of the object.
    pub uid: String,
    /// The addresses withdrawn.
    pub addresses: Vec<std::net::IpAddr>,
    /// The view that used them: the DELETED's last view, or the withdrawing MODIFIED's previous one
    /// (its sharing key and ports decide who may share the addresses meanwhile).
    pub used_by: Option<crate::model::ServiceView>,
}

/// Where the deliveries that gate a write stand.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Acks {
    /// Every relevant delivery succeeded (or there is none): the write may go ahead.
    pub done: bool,
    /// Deliveries that failed for good or whose last attempt failed: `(webhook, delivery id, error)`.
    pub failing: Vec<(String, i64, String)>,
    /// Per gating endpoint, whether its newest delivery succeeded (what `done` is decided from).
    seen: Vec<(String, bool)>,
}

/// For the Services in the JSON array $1 of `[namespace, name]`, each row led by its Service and
/// whether it is a latest (1) or a failing (0) row: per endpoint, the newest delivery of each Service
/// that was not superseded; and the pending deliveries whose last attempt failed (they may sit behind
/// the newest one). One read per pass for every status waiting, not two per Service (with many
/// Services, reads per Service would hold the initial sync's status write-backs for seconds).
const ACKS_OF: PerBackend = PerBackend {
    lite: "WITH k(namespace, name) AS (SELECT j.value->>0, j.value->>1 FROM json_each($1) AS j) \
     SELECT d.namespace, d.name, 1, d.webhook, d.id, d.state, d.attempts, d.last_error FROM deliveries d \
     JOIN (SELECT webhook, namespace, name, MAX(id) AS id FROM deliveries WHERE (namespace, name) IN k \
           AND state <> 'superseded' GROUP BY webhook, namespace, name) l ON l.id = d.id \
     UNION ALL SELECT namespace, name, 0, webhook, id, state, attempts, last_error FROM deliveries \
     WHERE (namespace, name) IN k AND state = 'pending' AND attempts > 0",
    pg: "WITH k(namespace, name) AS (SELECT j->>0, j->>1 FROM jsonb_array_elements($1::jsonb) AS j) \
     SELECT d.namespace, d.name, 1::bigint, d.webhook, d.id, d.state, d.attempts, d.last_error FROM deliveries d \
     JOIN (SELECT webhook, namespace, name, MAX(id) AS id FROM deliveries WHERE (namespace, name) IN \
           (SELECT namespace, name FROM k) AND state <> 'superseded' GROUP BY webhook, namespace, name) l \
     ON l.id = d.id \
     UNION ALL SELECT namespace, name, 0::bigint, webhook, id, state, attempts, last_error FROM deliveries \
     WHERE (namespace, name) IN (SELECT namespace, name FROM k) AND state = 'pending' AND attempts > 0",
};

/// The deliveries of event $1 of Service ($2, $3): on its own queue or its endpoints' (a full-state
/// delivery). Naming the queues lets the `(namespace, name, id)` index find them: PostgreSQL keeps no
/// index on the event id (migration 0008).
macro_rules! of_event {
    () => {
        "event_id = $1 AND (namespace, name) IN (($2, $3), ('', ''))"
    };
}

const OF_EVENT: &str = concat!("SELECT webhook, id, state, attempts, last_error FROM deliveries WHERE ", of_event!());

/// Per delivery of an event: its endpoint, and whether the endpoint has it — it succeeded, or it was
/// superseded and a later delivery of the same Service to that endpoint succeeded (that one carries
/// the Service's whole view as of a later event).
const HAS_EVENT: &str = concat!(
    "SELECT d.webhook, d.state = 'succeeded' OR (d.state = 'superseded' AND EXISTS ( \
    SELECT 1 FROM deliveries s WHERE s.webhook = d.webhook AND s.namespace = d.namespace AND s.name = d.name \
      AND s.id > d.id AND s.state = 'succeeded')) FROM deliveries d WHERE ",
    of_event!()
);

/// Releases the deliveries awaiting the finalizer of the Services in the JSON array $1 of `[namespace, name]` pairs,
/// due at $2.
const RELEASE_AWAITING_FINALIZER: PerBackend = PerBackend {
    lite: "UPDATE deliveries SET held = 0, next_attempt_at = $2 WHERE held = 1 AND state = 'pending' \
           AND (namespace, name) IN (SELECT j.value->>0, j.value->>1 FROM json_each($1) AS j)",
    pg: "UPDATE deliveries SET held = 0, next_attempt_at = $2 WHERE held = 1 AND state = 'pending' \
         AND (namespace, name) IN (SELECT j->>0, j->>1 FROM jsonb_array_elements($1::jsonb) AS j)",
};

/// Which kinds of write-back work wait, from one query ([`Store::publish_work`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PublishWork {
    /// Deliveries awaiting the finalizer ([`Store::services_awaiting_finalizer`]).
    pub finalizers: bool,
    /// Services whose `status.loadBalancer` waits to be written ([`Store::status_work`]).
    pub statuses: bool,
    /// Cleanups of deleted Services ([`Store::cleanups`]).
    pub cleanups: bool,
    /// Pool addresses to release ([`Store::releases`]).
    pub releases: bool,
}

impl Store {
    /// Whether each kind of write-back work waits: one read instead of the four that list them. The
    /// write-back runs a pass after every commit and every acknowledged delivery, and in the steady
    /// state nothing waits: the four reads would be four round trips to SQLite's connection threads
    /// per pass.
    pub async fn publish_work(&self) -> Result<PublishWork, StoreError> {
        let sql = "SELECT EXISTS (SELECT 1 FROM deliveries WHERE held = 1 AND state = 'pending'), \
                   EXISTS (SELECT 1 FROM services WHERE publish IS NOT NULL), \
                   EXISTS (SELECT 1 FROM cleanups), EXISTS (SELECT 1 FROM releases)";
        let r = self.read_one(self.backend.query(sql)).await?;
        Ok(PublishWork { finalizers: r.get(0), statuses: r.get(1), cleanups: r.get(2), releases: r.get(3) })
    }

    /// Services with deliveries awaiting the finalizer (at most `limit`), by namespace and name.
    pub async fn services_awaiting_finalizer(&self, limit: i64) -> Result<Vec<ServiceKey>, StoreError> {
        // LIMIT as a literal: see the `store` module docs.
        let sql = format!(
            "SELECT DISTINCT namespace, name FROM deliveries WHERE held = 1 AND state = 'pending' \
             ORDER BY namespace, name LIMIT {limit}"
        );
        let rows = self.read_all(self.backend.query_dyn(sql)).await?;
        Ok(rows.iter().map(|r| ServiceKey::new(r.get::<String, _>(0), r.get::<String, _>(1))).collect())
    }

    /// Lets the deliveries of `keys` that await the finalizer go (due now), in one statement. Returns how many.
    pub async fn release_awaiting_finalizer(&self, keys: &[ServiceKey]) -> Result<u64, StoreError> {
        if keys.is_empty() {
            return Ok(0);
        }
        let pairs: Vec<(&str, &str)> = keys.iter().map(|k| (k.namespace.as_str(), k.name.as_str())).collect();
        let q = self.backend.dual(&RELEASE_AWAITING_FINALIZER).bind(serde_json::to_string(&pairs)?).bind(now_ms());
        self.execute(q).await
    }

    /// The Services whose status vipwatch must write (see `services.publish`), by namespace and name:
    /// at most `limit` of them, after `after` (`None` = from the first).
    pub async fn status_work(&self, after: Option<&ServiceKey>, limit: i64) -> Result<Vec<StatusWork>, StoreError> {
        // LIMIT as a literal: see the `store` module docs.
        let sql = format!(
            "SELECT namespace, name, uid, publish FROM services WHERE publish IS NOT NULL \
             AND (namespace, name) > ($1, $2) ORDER BY namespace, name LIMIT {limit}"
        );
        let (ns, name) = after.map_or(("", ""), |k| (k.namespace.as_str(), k.name.as_str()));
        let rows = self.read_all(self.backend.query_dyn(sql).bind(ns).bind(name)).await?;
        rows.iter()
            .map(|r| {
                Ok(StatusWork {
                    key: ServiceKey::new(r.get::<String, _>(0), r.get::<String, _>(1)),
                    uid: r.get(2),
                    ingress: serde_json::from_str(r.get::<&str, _>(3))?,
                })
            })
            .collect()
    }

    /// For each of `keys` (every key gets an entry), whether the newest non-superseded delivery to
    /// each endpoint in `webhooks` succeeded; `failing` also lists older pending deliveries whose last
    /// attempt failed. One read ([`ACKS_OF`]).
    pub async fn services_acks(
        &self,
        keys: &[&ServiceKey],
        gates: &Gates,
    ) -> Result<HashMap<ServiceKey, Acks>, StoreError> {
        let mut out: HashMap<ServiceKey, Acks> = keys.iter().map(|k| ((*k).clone(), Acks::new())).collect();
        if keys.is_empty() {
            return Ok(out);
        }
        let pairs: Vec<(&str, &str)> = keys.iter().map(|k| (k.namespace.as_str(), k.name.as_str())).collect();
        let rows = self.read_all(self.backend.dual(&ACKS_OF).bind(serde_json::to_string(&pairs)?)).await?;
        // The latest rows first: a failing row only adds what they did not list already.
        for latest in [1, 0] {
            for r in rows.iter().filter(|r| r.get::<i64, _>(2) == latest) {
                let key = ServiceKey::new(r.get::<String, _>(0), r.get::<String, _>(1));
                let Some(acks) = out.get_mut(&key) else { continue };
                let row = AckRow::read(r, 3);
                if latest == 1 { acks.add(row, gates) } else { acks.add_failing(row, gates) }
            }
        }
        Ok(out)
    }

    /// Whether every appliance of `gates` acknowledged event `event_id` of Service `key`
    /// ([`Gates::done`]).
    pub async fn event_acks(&self, key: &ServiceKey, event_id: i64, gates: &Gates) -> Result<Acks, StoreError> {
        Ok(acks(&self.read_all(of_event(self.backend.query(OF_EVENT), key, event_id)).await?, gates))
    }

    /// Whether every appliance of `gates` has what event `event_id` of Service `key` told it, from one of its
    /// endpoints: that endpoint's delivery succeeded, or it was superseded (a MODIFIED behind a newer
    /// one, or before a DELETED/resync) and a later delivery of the same Service succeeded. Decides
    /// when a withdrawn pool address is free.
    pub async fn event_settled(&self, key: &ServiceKey, event_id: i64, gates: &Gates) -> Result<bool, StoreError> {
        let rows = self.read_all(of_event(self.backend.query(HAS_EVENT), key, event_id)).await?;
        let has: Vec<(String, bool)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        Ok(gates.done(|w| has.iter().find(|(s, _)| s == w).map(|(_, ok)| *ok)))
    }

    /// Every pending cleanup, oldest first.
    pub async fn cleanups(&self) -> Result<Vec<CleanupWork>, StoreError> {
        let sql = "SELECT event_id, namespace, name, uid, remove_finalizer, clear_ingress FROM cleanups \
                   ORDER BY event_id";
        let rows = self.read_all(self.backend.query(sql)).await?;
        rows.iter()
            .map(|r| {
                let clear: Option<&str> = r.get(5);
                Ok(CleanupWork {
                    event_id: r.get(0),
                    key: ServiceKey::new(r.get::<String, _>(1), r.get::<String, _>(2)),
                    uid: r.get(3),
                    remove_finalizer: r.get::<i64, _>(4) != 0,
                    clear_ingress: clear.map(serde_json::from_str).transpose()?.unwrap_or_default(),
                })
            })
            .collect()
    }

    /// Every address release waiting for its event to be acknowledged, oldest first.
    pub async fn releases(&self) -> Result<Vec<ReleaseWork>, StoreError> {
        let sql = "SELECT event_id, namespace, name, uid, addresses FROM releases ORDER BY event_id";
        let rows = self.read_all(self.backend.query(sql)).await?;
        rows.iter()
            .map(|r| {
                Ok(ReleaseWork {
                    event_id: r.get(0),
                    key: ServiceKey::new(r.get::<String, _>(1), r.get::<String, _>(2)),
                    uid: r.get(3),
                    addresses: serde_json::from_str(r.get::<&str, _>(4))?,
                })
            })
            .collect()
    }

    /// Every pending release with the view that held its addresses ([`Reservation`]), by event id:
    /// what the allocator keeps reserved at start.
    pub async fn reservations(&self) -> Result<Vec<Reservation>, StoreError> {
        let sql = "SELECT r.namespace, r.name, r.uid, r.addresses, \
             CASE WHEN e.type = 'DELETED' THEN e.view ELSE e.previous END \
             FROM releases r LEFT JOIN events e ON e.id = r.event_id ORDER BY r.event_id";
        let rows = self.read_all(self.backend.query(sql)).await?;
        rows.iter()
            .map(|r| {
                Ok(Reservation {
                    key: ServiceKey::new(r.get::<String, _>(0), r.get::<String, _>(1)),
                    uid: r.get(2),
                    addresses: serde_json::from_str(r.get::<&str, _>(3))?,
                    used_by: r.get::<Option<&str>, _>(4).map(serde_json::from_str).transpose()?,
                })
            })
            .collect()
    }

    /// Marks a release done.
    pub async fn finish_release(&self, event_id: i64) -> Result<(), StoreError> {
        let sql = "DELETE FROM releases WHERE event_id = $1";
        self.execute(self.backend.query(sql).bind(event_id)).await.map(drop)
    }

    /// Marks a cleanup done.
    pub async fn finish_cleanup(&self, event_id: i64) -> Result<(), StoreError> {
        let sql = "DELETE FROM cleanups WHERE event_id = $1";
        self.execute(self.backend.query(sql).bind(event_id)).await.map(drop)
    }
}

/// Deliveries to endpoints that are no longer configured never gate anything.
fn acks(rows: &[Row], gates: &Gates) -> Acks {
    let mut out = Acks::new();
    for r in rows {
        out.add(AckRow::read(r, 0), gates);
    }
    out
}

/// One delivery row as the ack queries give it: `webhook, id, state, attempts, last_error` from
/// column `at` on.
struct AckRow {
    webhook: String,
    id: i64,
    state: String,
    attempts: i64,
    error: Option<String>,
}

impl AckRow {
    fn read(r: &Row, at: usize) -> Self {
        Self {
            webhook: r.get(at),
            id: r.get(at + 1),
            state: r.get(at + 2),
            attempts: r.get(at + 3),
            error: r.get(at + 4),
        }
    }
}

impl Acks {
    /// Nothing seen yet: done, nothing failing.
    fn new() -> Self {
        Self { done: true, failing: Vec::new(), seen: Vec::new() }
    }

    /// Takes `row` (an endpoint's newest delivery) into account when its endpoint gates, and
    /// decides `done` again.
    fn add(&mut self, row: AckRow, gates: &Gates) {
        if !gates.contains(&row.webhook) {
            return;
        }
        self.seen.push((row.webhook.clone(), row.state == "succeeded"));
        self.done = gates.done(|w| self.seen.iter().find(|(s, _)| s == w).map(|(_, ok)| *ok));
        if row.state == "failed" || (row.state == "pending" && row.attempts > 0) {
            self.failing.push((row.webhook, row.id, row.error.unwrap_or_else(|| "no response".into())));
        }
    }

    /// Lists `row` (a pending delivery whose last attempt failed) as failing, unless it is listed
    /// already or its endpoint does not gate; `done` does not change.
    fn add_failing(&mut self, row: AckRow, gates: &Gates) {
        let failing = (row.webhook, row.id, row.error.unwrap_or_else(|| "no response".into()));
        if gates.contains(&failing.0) && !self.failing.contains(&failing) {
            self.failing.push(failing);
        }
    }
}

/// `q` ([`OF_EVENT`], [`HAS_EVENT`]) bound to event `event_id` of Service `key`.
fn of_event(q: super::db::Query, key: &ServiceKey, event_id: i64) -> super::db::Query {
    q.bind(event_id).bind(key.namespace.as_str()).bind(key.name.as_str())
}
