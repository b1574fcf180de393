//! Before every scope's first list: observations are buffered, not decided. When the last first list
//! arrives, the addresses Services already show in their status are adopted first (so nothing
//! allocated at start can take them), explicit requests are reserved next, and the buffered
//! observations are released in arrival order, Nodes and EndpointSlices first (so every Service's
//! members are computed from complete lists).

use std::collections::HashSet;

use super::super::stream::{Change, Observation, ScopeSpec};
use super::Recorder;
use crate::model::Observed;
use crate::store::StateChange;

/// What the recorder keeps until every scope's first list is in.
pub(super) struct Startup {
    /// Scopes (by key) whose first list has not arrived yet.
    pub awaiting: HashSet<String>,
    /// Observations that arrived meanwhile, in arrival order.
    pub buffered: Vec<Observation>,
    /// Changes decided at load (held deletions gone stale, DELETEDs of Services no scope covers any
    /// more): stored with the first batch.
    pub decided: Vec<StateChange>,
    /// The batch being planned contains the first lists: it computes every Service's members, so the
    /// recomputations its Node and EndpointSlice lists asked for are moot.
    pub first_batch: bool,
}

impl Startup {
    /// Waiting for the first list of every one of `scopes`, with `decided` to store first.
    pub fn new(scopes: &[ScopeSpec], decided: Vec<StateChange>) -> Self {
        let awaiting = scopes.iter().map(ScopeSpec::key).collect();
        Self { awaiting, buffered: Vec::new(), decided, first_batch: false }
    }
}

impl Recorder {
    /// While some scope's first list is missing, moves `queued` into the buffer and returns false.
    /// When the last one arrives, adopts published addresses from every first list, moves everything
    /// buffered back into `queued` (Nodes and EndpointSlices first, else in arrival order) and returns
    /// true.
    pub(super) fn release_buffered(&mut self, queued: &mut Vec<Observation>) -> bool {
        let startup = &mut self.startup;
        for o in queued.iter() {
            if let Some(scope) = first_list(o) {
                startup.awaiting.remove(&scope.key());
            }
        }
        startup.buffered.append(queued);
        if !startup.awaiting.is_empty() {
            return false;
        }
        let mut buffered = std::mem::take(&mut startup.buffered);
        // Nodes and EndpointSlices first: every Service's members are then computed from complete lists.
        buffered.sort_by_key(|o| !matches!(o, Observation::Node(..) | Observation::Slice(..)));
        let first_lists = buffered.iter().filter_map(|o| match o {
            Observation::Listed { objects, first: true, .. } => Some(objects),
            _ => None,
        });
        let listed: Vec<&Observed> = first_lists.flatten().collect();
        // A terminating Service the database does not know (it was lost) keeps what it shows until
        // the appliance acknowledged its DELETED ([`Recorder::decide`] announces it with these
        // addresses).
        let terminating: Vec<&&Observed> = listed.iter().filter(|o| self.unrecorded_terminating(o)).collect();
        for obs in terminating {
            if let Some(a) = self.ownership.allocator.published(&obs.view) {
                let ips: Vec<std::net::IpAddr> = a.addresses.iter().filter_map(|s| s.parse().ok()).collect();
                self.ownership.allocator.withdraw(&obs.key, &obs.uid, &ips, Some(&obs.view));
            }
        }
        for obs in &listed {
            self.ownership.adopt(self.mirror.get(&obs.key), obs);
        }
        for obs in &listed {
            self.ownership.reserve_requested(self.mirror.get(&obs.key), obs);
        }
        *queued = buffered;
        self.startup.first_batch = true;
        true
    }
}

/// The scope of a first list, if `o` is one.
fn first_list(o: &Observation) -> Option<&ScopeSpec> {
    match o {
        Observation::Listed { scope, first: true, .. }
        | Observation::Node(scope, Change::Listed { first: true, .. })
        | Observation::Slice(scope, Change::Listed { first: true, .. }) => Some(scope),
        _ => None,
    }
}
