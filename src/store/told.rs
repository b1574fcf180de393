//! What each templated event-mode endpoint was last told about each Service and acknowledged (table
//! `told`): the `service` value of its last delivery of that Service that succeeded. Its templates
//! see it as `told`, so a `MODIFIED` can remove the ports and members a later view no longer has,
//! and a `DELETED` everything that was sent and never withdrawn: the current view alone cannot say
//! what the appliance still holds.
//!
//! Written in the transaction that records the successful attempt ([`record_told`], from
//! `record_attempts`, whether that transaction is the relay's own or the watch's that carries it), so
//! an attempt recorded as succeeded always has its row and the next delivery of the Service (claimed
//! only after that transaction) reads it. Its own table, so pruning finished deliveries
//! (`database.event_retention`) leaves it alone; it survives restarts. Only templated event-mode
//! endpoints write or read it: a plain webhook's completions carry nothing for it.

use super::db::Backend;
use super::script::{Script, Stmt};
use super::{Completion, Store, StoreError};
use crate::model::ServiceKey;

/// What an acknowledged delivery leaves the endpoint holding for its Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToldValue {
    /// The delivery's `service` value (JSON text of the payload's `data.service`): a `service.added`,
    /// `service.modified` or `service.synced`.
    Service(String),
    /// A `DELETED`: the endpoint holds nothing for the Service any more; its row goes.
    Withdrawn,
}

/// A change to the `told` table, made with the completion that carries it, and only when that
/// completion's outcome is [`super::Outcome::Succeeded`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Told {
    /// Endpoint name.
    pub webhook: String,
    /// The Service.
    pub key: ServiceKey,
    /// What the endpoint holds now.
    pub value: ToldValue,
}

/// Columns of a `told` row, in [`super::db::values_sql`] order.
const TOLD_INSERT: &str = "INSERT INTO told (webhook, namespace, name, service, delivery_id, told_at)";

/// The rest of [`TOLD_INSERT`]: a newer acknowledgement replaces the row.
const TOLD_UPSERT: &str = " ON CONFLICT (webhook, namespace, name) DO UPDATE SET service = excluded.service, \
    delivery_id = excluded.delivery_id, told_at = excluded.told_at";

/// Rows per upsert: pieces of 16, 4 and 1 rows (6 parameters each; [`super::db::row_chunks`]).
const TOLD_ROWS: usize = 16;

/// Records the `told` changes of the succeeded completions among `done` at `now` (Unix ms): upserts
/// each [`ToldValue::Service`], deletes each [`ToldValue::Withdrawn`]. Per (endpoint, Service) the
/// last completion in `done` wins (a queue has one delivery in flight, so there is at most one; an
/// upsert must not touch a row twice on PostgreSQL). No statement when none carries a change.
pub(super) async fn record_told(s: &mut Script<'_>, now: i64, done: &[Completion]) -> Result<(), StoreError> {
    let mut changes: Vec<(&Told, i64)> = Vec::new();
    for c in done.iter().filter(|c| c.outcome == super::Outcome::Succeeded) {
        let Some(told) = &c.told else { continue };
        changes.retain(|(t, _)| (t.webhook.as_str(), &t.key) != (told.webhook.as_str(), &told.key));
        changes.push((told, c.delivery_id));
    }
    if changes.is_empty() {
        return Ok(());
    }
    let (set, withdrawn): (Vec<_>, Vec<_>) =
        changes.into_iter().partition(|(t, _)| matches!(t.value, ToldValue::Service(_)));
    for (t, _) in withdrawn {
        let sql = "DELETE FROM told WHERE webhook = $1 AND namespace = $2 AND name = $3";
        s.run(Stmt::new(sql).bind(t.webhook.as_str()).bind(&t.key.namespace).bind(&t.key.name)).await?;
    }
    let pieces: Vec<&[(&Told, i64)]> = match s.backend() {
        Backend::Sqlite => super::db::row_chunks(&set, TOLD_ROWS).collect(),
        Backend::Postgres => set.chunks(TOLD_ROWS).collect(),
    };
    for rows in pieces {
        let mut q = Stmt::values(s.backend(), TOLD_INSERT, rows.len(), 6, TOLD_UPSERT);
        for (t, delivery_id) in rows {
            let ToldValue::Service(service) = &t.value else { unreachable!("partitioned above") };
            q = q
                .bind(t.webhook.as_str())
                .bind(&t.key.namespace)
                .bind(&t.key.name)
                .bind(service)
                .bind(*delivery_id)
                .bind(now);
        }
        s.run(q).await?;
    }
    Ok(())
}

impl Store {
    /// What endpoint `webhook` was last told about Service `key` and acknowledged: the JSON text of
    /// that delivery's `service` value, or `None` when it never acknowledged one or acknowledged its
    /// `DELETED` since. One read by primary key.
    pub async fn told(&self, webhook: &str, key: &ServiceKey) -> Result<Option<String>, StoreError> {
        let sql = "SELECT service FROM told WHERE webhook = $1 AND namespace = $2 AND name = $3";
        let q = self.backend.query(sql).bind(webhook).bind(key.namespace.as_str()).bind(key.name.as_str());
        Ok(self.read_optional(q).await?.map(|r| r.get(0)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{AttemptRecord, NewDelivery, Outcome, now_ms};

    /// A store on a fresh SQLite file with one delivery to endpoint `w` for Service `ns/a`; its id.
    async fn with_delivery() -> (tempfile::TempDir, Store, i64) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("t.db")).await.unwrap();
        let d = NewDelivery {
            webhook: "w".into(),
            kind: "SYNCED",
            msg_id: crate::store::new_msg_id(),
            payload: "{}".into(),
            coalesce_ms: None,
        };
        store.enqueue_synced(vec![(d, ServiceKey::new("ns", "a"))]).await.unwrap();
        let id = store.claim("w", now_ms(), 60_000, 1).await.unwrap()[0].id;
        (dir, store, id)
    }

    fn done(id: i64, outcome: Outcome, value: ToldValue) -> Completion {
        let told = Told { webhook: "w".into(), key: ServiceKey::new("ns", "a"), value };
        Completion { delivery_id: id, attempt: AttemptRecord::default(), outcome, told: Some(told) }
    }

    fn service(v: &str) -> ToldValue {
        ToldValue::Service(v.into())
    }

    /// Only a success writes what was told; a later success replaces it, an acknowledged DELETED
    /// removes it (the last change of a round wins); pruning every finished delivery leaves it.
    #[tokio::test]
    async fn a_success_records_what_was_told_a_deleted_removes_it_and_pruning_leaves_it() {
        let (_dir, store, id) = with_delivery().await;
        let key = ServiceKey::new("ns", "a");
        let told = || async { store.told("w", &key).await.unwrap() };
        store.complete(&[done(id, Outcome::Retry(now_ms() + 60_000), service(r#"{"v":1}"#))]).await.unwrap();
        store.complete(&[done(id, Outcome::Failed, service(r#"{"v":1}"#))]).await.unwrap();
        assert_eq!(told().await, None, "not acknowledged: nothing told");

        store.complete(&[done(id, Outcome::Succeeded, service(r#"{"v":1}"#))]).await.unwrap();
        assert_eq!(told().await.as_deref(), Some(r#"{"v":1}"#));
        assert_eq!(store.told("other", &key).await.unwrap(), None, "per endpoint");
        store.complete(&[done(id, Outcome::Succeeded, service(r#"{"v":2}"#))]).await.unwrap();
        assert_eq!(told().await.as_deref(), Some(r#"{"v":2}"#), "replaced");

        let round =
            [done(id, Outcome::Succeeded, service(r#"{"v":3}"#)), done(id, Outcome::Succeeded, ToldValue::Withdrawn)];
        store.complete(&round).await.unwrap();
        assert_eq!(told().await, None, "withdrawn");
        let round =
            [done(id, Outcome::Succeeded, ToldValue::Withdrawn), done(id, Outcome::Succeeded, service(r#"{"v":4}"#))];
        store.complete(&round).await.unwrap();
        assert_eq!(told().await.as_deref(), Some(r#"{"v":4}"#));

        store.prune_events(now_ms() + 1).await.unwrap();
        assert_eq!(store.delivery(id).await.unwrap(), None, "the delivery is pruned");
        assert_eq!(told().await.as_deref(), Some(r#"{"v":4}"#), "what was told is not");
    }
}
