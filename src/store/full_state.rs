//! Full-state template endpoints: what the appliance last accepted (the removal guard's reference), a
//! declaration the guard holds, the operator's confirmation, and enqueueing a declaration outside an
//! event (start, periodic resend, resync).

use super::outbox::{ENDPOINT_QUEUE, NewDelivery, insert_deliveries};
use super::{Store, StoreError, now_ms};

/// An endpoint's full-state record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FullStateRow {
    /// The Services (`namespace/name`, sorted) of the last declaration the appliance accepted.
    pub told: Vec<String>,
    /// When it accepted it (Unix ms).
    pub told_at: Option<i64>,
    /// The held declaration: sha256 (hex) of its Service set, Services it would remove, of how many.
    pub held: Option<(String, i64, i64)>,
    /// The Service-set digest an operator confirmed (sent even though it removes too much).
    pub confirmed: Option<String>,
}

impl Store {
    /// The full-state record of `webhook` (empty when it never declared anything).
    pub async fn full_state(&self, webhook: &str) -> Result<FullStateRow, StoreError> {
        let sql = "SELECT told, told_at, held_digest, held_removed, held_total, confirmed_digest FROM full_state \
                   WHERE webhook = $1";
        let Some(r) = self.read_optional(self.backend.query(sql).bind(webhook)).await? else {
            return Ok(FullStateRow::default());
        };
        let digest: Option<String> = r.get("held_digest");
        Ok(FullStateRow {
            told: serde_json::from_str(r.get::<&str, _>("told"))?,
            told_at: r.get("told_at"),
            held: digest.map(|d| (d, r.get("held_removed"), r.get("held_total"))),
            confirmed: r.get("confirmed_digest"),
        })
    }

    /// Records that the appliance accepted a declaration of `told` (sorted `namespace/name`); clears
    /// any hold and confirmation.
    pub async fn full_state_told(&self, webhook: &str, told: &[String]) -> Result<(), StoreError> {
        let told = serde_json::to_string(told)?;
        let sql = "INSERT INTO full_state (webhook, told, told_at) VALUES ($1, $2, $3) ON CONFLICT (webhook) DO UPDATE \
                   SET told = excluded.told, told_at = excluded.told_at, held_digest = NULL, held_removed = NULL, \
                   held_total = NULL, held_at = NULL, confirmed_digest = NULL";
        self.execute(self.backend.query(sql).bind(webhook).bind(told).bind(now_ms())).await.map(drop)
    }

    /// Records that the removal guard holds a declaration (Service-set `digest`, removing `removed` of
    /// `total` told Services).
    pub async fn full_state_hold(
        &self,
        webhook: &str,
        digest: &str,
        removed: i64,
        total: i64,
    ) -> Result<(), StoreError> {
        let sql = "INSERT INTO full_state (webhook, held_digest, held_removed, held_total, held_at) \
                   VALUES ($1, $2, $3, $4, $5) ON CONFLICT (webhook) DO UPDATE SET held_digest = excluded.held_digest, \
                   held_removed = excluded.held_removed, held_total = excluded.held_total, \
                   held_at = COALESCE(CASE WHEN full_state.held_digest = excluded.held_digest THEN full_state.held_at END, \
                   excluded.held_at)";
        let q = self.backend.query(sql).bind(webhook).bind(digest).bind(removed).bind(total).bind(now_ms());
        self.execute(q).await.map(drop)
    }

    /// Confirms the held declaration of `webhook` (it goes out at its next attempt, made due now).
    /// Returns `(removed, total)` of what was held, or `None` when nothing is held.
    pub async fn full_state_confirm(&self, webhook: &str) -> Result<Option<(i64, i64)>, StoreError> {
        let sql = "UPDATE full_state SET confirmed_digest = held_digest WHERE webhook = $1 AND held_digest IS NOT NULL \
                   RETURNING held_removed, held_total";
        let held = self.execute_returning(self.backend.query(sql).bind(webhook)).await?;
        let held = held.map(|r| (r.get(0), r.get(1)));
        if held.is_some() {
            self.make_due(webhook, now_ms()).await?;
        }
        Ok(held)
    }

    /// Enqueues a full-state declaration of `webhook` (`kind` `MODIFIED` or `SYNCED`) due in
    /// `debounce_ms`, or pushes back the one waiting (see [`NewDelivery::coalesce_ms`]).
    pub async fn enqueue_full_state(&self, d: NewDelivery) -> Result<(), StoreError> {
        let rows = [(d, None, ENDPOINT_QUEUE.clone(), false)];
        self.transact(super::owner::job(move |s| Box::pin(async move { insert_deliveries(s, now_ms(), &rows).await })))
            .await
    }
}
