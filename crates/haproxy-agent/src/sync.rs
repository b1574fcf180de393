//! From a delivery to what it asks of the desired state ([`Intent`]s), and full resyncs: every
//! `service.synced` of one resync carries `{id, index, total}`; once all `total` of an id arrived (in
//! any order, on separate queues), the Services the resync did not include are swept — unless their
//! last change is newer than the resync's snapshot (`as_of_event_id`). `sync.completed` matters only for
//! an empty resync (`total` 0).

use std::collections::{BTreeSet, HashMap};

use vipwatch_contract::{PayloadType, SyncMarker, WebhookPayload};

use crate::state::{Intent, Version, key_of};

/// Resyncs remembered at most (the oldest incomplete one is dropped first).
const MAX_OPEN: usize = 16;

/// One resync in progress.
#[derive(Debug, Default)]
struct Round {
    total: u64,
    as_of: Option<i64>,
    seen: BTreeSet<String>,
    started: u64,
}

/// The resyncs in progress.
#[derive(Debug, Default)]
pub struct Syncs {
    open: HashMap<String, Round>,
    counter: u64,
}

impl Syncs {
    /// What `p` asks for: an upsert or a delete of its Service, plus a sweep when it completes a resync.
    pub fn intents(&mut self, p: &WebhookPayload) -> Vec<Intent> {
        let mut out = Vec::new();
        if let Some(svc) = &p.data.service {
            let version = Version { event_id: p.data.event_id, resource_version: svc.resource_version.clone() };
            match p.kind {
                PayloadType::ServiceDeleted => {
                    out.push(Intent::Delete { key: key_of(svc), uid: svc.uid.clone(), version });
                }
                _ => out.push(Intent::Upsert(Box::new(svc.clone()), version)),
            }
        }
        if let Some(sync) = &p.data.sync {
            let key = p.data.service.as_ref().filter(|_| p.kind == PayloadType::ServiceSynced).map(key_of);
            out.extend(self.note(sync, key));
        }
        out
    }

    /// Records that `key` (none for `sync.completed`) belongs to resync `sync`; the sweep when that
    /// completes it.
    fn note(&mut self, sync: &SyncMarker, key: Option<String>) -> Option<Intent> {
        self.counter += 1;
        let started = self.counter;
        let round = self.open.entry(sync.id.clone()).or_insert_with(|| Round { started, ..Round::default() });
        round.total = sync.total;
        round.as_of = sync.as_of_event_id;
        round.seen.extend(key);
        if round.seen.len() as u64 >= round.total {
            let round = self.open.remove(&sync.id)?;
            return Some(Intent::Sweep { keep: round.seen, as_of: round.as_of });
        }
        while self.open.len() > MAX_OPEN {
            let oldest = self.open.iter().min_by_key(|(_, r)| r.started).map(|(id, _)| id.clone())?;
            self.open.remove(&oldest);
        }
        None
    }
}
