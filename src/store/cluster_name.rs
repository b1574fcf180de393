//! The cluster name a delivery speaks for, across a rename.

use super::db::PerBackend;
use super::{Store, StoreError};

/// Sets `data.cluster` to $1 in every per-Service delivery still to be sent that names another
/// cluster (full-state rows, namespace `''`, are rendered at send time and carry no payload of this
/// shape).
const CARRY: PerBackend = PerBackend {
    lite: "UPDATE deliveries SET payload = json_set(payload, '$.data.cluster', $1) \
           WHERE state = 'pending' AND namespace <> '' AND json_extract(payload, '$.data.cluster') IS NOT $1",
    pg: "UPDATE deliveries SET payload = jsonb_set(payload::jsonb, '{data,cluster}', to_jsonb($1::text))::text \
         WHERE state = 'pending' AND namespace <> '' AND (payload::jsonb #>> '{data,cluster}') IS DISTINCT FROM $1",
};

impl Store {
    /// Makes `name` the cluster of every delivery still to be sent, and returns how many named
    /// another one (made before `cluster.name` changed, or before deliveries named a cluster at all).
    /// A delivery keeps the body it was made with; under the old name an appliance keyed by cluster
    /// would file it with another cluster's Services (the HAProxy agent refuses it with a 409 while
    /// another vipwatch holds that name, and lets it take the name over once that one falls silent).
    /// Each keeps its `webhook-id`, so a receiver that applied one already sees a duplicate. Run at
    /// start, before the relay. Errors: the database failed.
    pub async fn carry_cluster_name(&self, name: &str) -> Result<u64, StoreError> {
        self.execute(self.backend.dual(&CARRY).bind(name)).await
    }
}

impl Store {
    /// Whether endpoint `webhook` answered with a receiver identity in an earlier run
    /// ([`crate::relay::catch_up`]): then it is probed from the start, so an agent that restarted
    /// while vipwatch did too is noticed although nothing is sent to it. Errors: the database failed.
    pub async fn speaks_identity(&self, webhook: &str) -> Result<bool, StoreError> {
        let key = format!("receiver_identity:{webhook}");
        let row = self.read_optional(self.backend.query("SELECT value FROM meta WHERE key = $1").bind(key)).await?;
        Ok(row.is_some())
    }

    /// Records that endpoint `webhook` answers with a receiver identity (see
    /// [`Store::speaks_identity`]). Errors: the database failed.
    pub async fn remember_identity(&self, webhook: &str) -> Result<(), StoreError> {
        let insert = "INSERT INTO meta (key, value) VALUES ($1, 'yes') ON CONFLICT (key) DO NOTHING";
        let key = format!("receiver_identity:{webhook}");
        self.execute(self.backend.query(insert).bind(key)).await.map(drop)
    }
}
