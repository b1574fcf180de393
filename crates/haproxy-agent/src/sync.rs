//! From a delivery to what it asks of the desired state ([`Intent`]s), and full resyncs: every
//! `service.synced` of one resync carries `{id, index, total}`; once all `total` of an id arrived (in
//! any order, on separate queues), the Services of that resync's cluster it did not include are
//! swept — unless their last change is newer than the resync's snapshot (`as_of_event_id`). A resync
//! speaks for its own cluster only: other clusters' Services are never swept by it. `sync.completed` matters only for
//! an empty resync (`total` 0). A Service HAProxy cannot serve still counts (it was included); a
//! completed resync's sweep waits in [`Syncs::take_sweeps`] until a batch applies it.

use std::collections::{BTreeSet, HashMap, VecDeque};

use vipwatch_contract::{PayloadType, SyncMarker, WebhookPayload};

use crate::state::{Intent, ServiceKey, Version};

/// Resyncs remembered at most (the oldest incomplete one is dropped first).
const MAX_OPEN: usize = 16;

/// Completed resync ids remembered, so a delivery of one seen again (a retry, a batch applied one by
/// one after a refusal) does not open it anew.
const MAX_FINISHED: usize = 64;

/// One resync in progress.
#[derive(Debug, Default)]
struct Round {
    total: u64,
    as_of: Option<i64>,
    log_id: Option<String>,
    seen: BTreeSet<ServiceKey>,
    started: u64,
}

/// The resyncs in progress, and the sweeps of those completed but not yet applied.
#[derive(Debug, Default)]
pub struct Syncs {
    open: HashMap<(String, String), Round>,
    finished: VecDeque<(String, String)>,
    ready: Vec<Intent>,
    counter: u64,
}

impl Syncs {
    /// What `p` asks of its Service in `cluster` (the cluster the delivery is applied under, see
    /// [`crate::clusters`]): an upsert or a delete (none for `sync.completed`). A `service.synced` or
    /// `sync.completed` is also counted towards its resync of `cluster` — whether or not the Service
    /// itself can be applied, since it was included — and a resync it completes leaves a sweep of
    /// `cluster` for [`Self::take_sweeps`].
    pub fn intents(&mut self, p: &WebhookPayload, cluster: &str) -> Vec<Intent> {
        let mut out = Vec::new();
        if let Some(svc) = &p.data.service {
            let version = Version {
                event_id: p.data.event_id,
                resource_version: svc.resource_version.clone(),
                log_id: p.data.log_id.clone(),
            };
            match p.kind {
                PayloadType::ServiceDeleted => {
                    out.push(Intent::Delete { key: ServiceKey::of(cluster, svc), uid: svc.uid.clone(), version });
                }
                _ => out.push(Intent::Upsert { cluster: cluster.to_owned(), service: Box::new(svc.clone()), version }),
            }
        }
        if let Some(sync) = &p.data.sync {
            let synced = p.data.service.as_ref().filter(|_| p.kind == PayloadType::ServiceSynced);
            self.note(cluster, sync, synced.map(|s| ServiceKey::of(cluster, s)), p.data.log_id.clone());
        }
        out
    }

    /// The sweeps of resyncs completed since the last call.
    pub fn take_sweeps(&mut self) -> Vec<Intent> {
        std::mem::take(&mut self.ready)
    }

    /// Records that `key` (none for `sync.completed`) belongs to resync `sync` of `cluster`; a sweep
    /// when that completes it.
    fn note(&mut self, cluster: &str, sync: &SyncMarker, key: Option<ServiceKey>, log_id: Option<String>) {
        let id = (cluster.to_owned(), sync.id.clone());
        if self.finished.contains(&id) {
            return;
        }
        self.counter += 1;
        let started = self.counter;
        let round = self.open.entry(id.clone()).or_insert_with(|| Round { started, ..Round::default() });
        round.total = sync.total;
        round.as_of = sync.as_of_event_id;
        round.log_id = log_id;
        round.seen.extend(key);
        if round.seen.len() as u64 >= round.total {
            if let Some(round) = self.open.remove(&id) {
                let (cluster, keep, as_of, log_id) = (cluster.to_owned(), round.seen, round.as_of, round.log_id);
                self.ready.push(Intent::Sweep { cluster, keep, as_of, log_id });
            }
            self.finished.push_back(id);
            if self.finished.len() > MAX_FINISHED {
                self.finished.pop_front();
            }
            return;
        }
        while self.open.len() > MAX_OPEN {
            let Some(oldest) = self.open.iter().min_by_key(|(_, r)| r.started).map(|(id, _)| id.clone()) else {
                break;
            };
            self.open.remove(&oldest);
        }
    }
}
