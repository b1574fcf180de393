//! Bringing a receiver up to date by itself when it says it is not: a receiver that speaks the
//! identity contract ([`vipwatch_contract::receiver`], the HAProxy agent) answers every request with
//! the identity of its stored state (a generation) and of its run (an instance), and whether it holds
//! this cluster's whole state. One that restarted (and may have missed deliveries meanwhile) or lost
//! its state says it is not caught up, and keeps its host out of service (its `/healthz` is `503`, so
//! keepalived gives it no VIP) until a full resync of this cluster has gone live there.
//!
//! vipwatch reads that identity from every answer to a delivery. Once an endpoint has answered with
//! one, it also probes it ([`PROBE_EVERY`], `GET` on its URL with the cluster's name in
//! [`CLUSTER_HEADER`]), so a receiver that restarts while nothing changes is noticed too; a plain
//! webhook receiver, which never answers with an identity, is never probed. When the receiver is not
//! caught up, vipwatch enqueues that resync ([`crate::route::resync`]) — once per run of the receiver,
//! and again only once the resync it sent is no longer pending there. [`CatchUp`] decides; [`watch`]
//! listens, probes and acts. That an endpoint speaks it is kept in the database, so it is probed from
//! vipwatch's next start on, before anything is sent to it.
//!
//! The same answers may say how many deliveries the receiver takes in at once
//! ([`vipwatch_contract::receiver::CONCURRENCY_HEADER`]): [`watch`] passes that on to the endpoint's
//! dispatcher when the endpoint has no `concurrency` of its own.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};
use vipwatch_contract::receiver::{CLUSTER_HEADER, ReceiverIdentity};

use crate::config::Config;
use crate::metrics::Metrics;
use crate::store::Store;

/// How often an endpoint that speaks the identity contract is asked whether it is caught up: the
/// longest a returning host waits for its resync, beside the time the resync takes.
pub const PROBE_EVERY: Duration = Duration::from_secs(1);

/// What to do about one answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Nothing: it is caught up, or the resync it needs was sent to this run already.
    Nothing,
    /// Enqueue a full resync of the endpoint. `lost_state`: its stored state is not the one it
    /// answered with before (a new generation: a wiped disk, a rebuilt host).
    Resync {
        /// The generation changed since the last answer.
        lost_state: bool,
    },
}

/// What vipwatch knows of one receiver's identity: the last `(generation, instance)` it answered
/// with, and the run a resync was enqueued for.
#[derive(Debug, Default)]
pub struct CatchUp {
    last: Option<(String, String)>,
    resynced: Option<(String, String)>,
}

impl CatchUp {
    /// Takes one answer's identity. `pending` is whether deliveries to the endpoint are still
    /// pending (a resync enqueued before is then still on its way). A receiver not caught up gets one
    /// resync per run (`instance`), and another only when nothing is pending any more and it still
    /// says it is not caught up (the resync was lost on the way, or superseded).
    pub fn on(&mut self, id: &ReceiverIdentity, pending: bool) -> Step {
        let lost_state = self.last.as_ref().is_some_and(|(generation, _)| *generation != id.generation);
        let run = (id.generation.clone(), id.instance.clone());
        self.last = Some(run.clone());
        if id.caught_up != Some(false) {
            return Step::Nothing;
        }
        if self.resynced.as_ref() == Some(&run) && pending {
            return Step::Nothing;
        }
        self.resynced = Some(run);
        Step::Resync { lost_state }
    }
}

/// Acts on the identities endpoint `name` answers with: those of its answers to deliveries
/// (`answers`, from its [`super::sender::Sender`]) and, once it has answered with one, those of a
/// probe every [`PROBE_EVERY`] (`GET` on `url` with `client`; each answered probe pulses
/// `reachable`, which brings an open circuit's next probe forward), while `leader_deadline` is ahead, until
/// `cancel`. The concurrency each identity carries goes to `advertised` (when given: an endpoint
/// without a `concurrency` of its own), which tells only of a change.
/// Enqueues a resync of it when [`CatchUp`] says so. Failures to reach it are left to the dispatcher's
/// circuit breaker; a failed resync is logged and tried again at the next answer.
#[allow(clippy::too_many_arguments)]
pub(super) async fn watch(
    name: String,
    url: url::Url,
    client: reqwest::Client,
    mut answers: tokio::sync::watch::Receiver<Option<ReceiverIdentity>>,
    reachable: tokio::sync::watch::Sender<u64>,
    advertised: Option<tokio::sync::watch::Sender<Option<usize>>>,
    config: Arc<Config>,
    store: Store,
    metrics: Arc<Metrics>,
    leader_deadline: crate::leader::LeaderDeadline,
    cancel: CancellationToken,
) {
    let cluster = config.cluster.name.clone().unwrap_or_default();
    let mut state = CatchUp::default();
    // An endpoint that answered with an identity in an earlier run is probed from the start.
    let mut speaks = store.speaks_identity(&name).await.unwrap_or(false);
    loop {
        let id = tokio::select! {
            () = cancel.cancelled() => return,
            changed = answers.changed() => {
                if changed.is_err() {
                    return;
                }
                answers.borrow_and_update().clone()
            }
            () = tokio::time::sleep(PROBE_EVERY), if speaks => {
                let id = probe(&client, &url, &cluster).await;
                if id.is_some() {
                    // It answers: a dispatcher whose circuit is open probes it now.
                    reachable.send_modify(|n| *n += 1);
                }
                id
            }
        };
        let Some(id) = id else { continue };
        if let Some(tx) = &advertised {
            tx.send_if_modified(|n| std::mem::replace(n, id.concurrency) != id.concurrency);
        }
        if !speaks {
            debug!(webhook = %name, "the endpoint reports whether it is caught up: probing it every second");
            speaks = store.remember_identity(&name).await.is_ok();
        }
        if !leader_deadline.is_ahead() {
            continue;
        }
        let pending = match store.outbox_depth().await {
            Ok(depth) => depth.iter().any(|(w, n, _)| *w == name && *n > 0),
            Err(_) => true, // the database will say more at the next answer
        };
        if let Step::Resync { lost_state } = state.on(&id, pending) {
            resync(&name, &id, lost_state, &config, &store, &metrics).await;
        }
    }
}

/// One probe: the identity `url` answers a `GET` with, `None` when it does not answer or answers
/// without one.
async fn probe(client: &reqwest::Client, url: &url::Url, cluster: &str) -> Option<ReceiverIdentity> {
    let answer = client.get(url.clone()).header(CLUSTER_HEADER, cluster).send().await.ok()?;
    let headers = answer.headers();
    ReceiverIdentity::from_headers(|n| headers.get(n).and_then(|v| v.to_str().ok()))
}

/// Enqueues the full resync of endpoint `name`, which answered `id`.
async fn resync(
    name: &str,
    id: &ReceiverIdentity,
    lost_state: bool,
    config: &Config,
    store: &Store,
    metrics: &Metrics,
) {
    if lost_state {
        warn!(webhook = %name, generation = %id.generation, "the endpoint lost its state (a new generation): resyncing it");
    }
    match crate::route::resync(store, config, Some(name)).await {
        Ok(sent) => {
            metrics.receiver_resync(name, lost_state);
            let services = sent.first().map_or(0, |s| s.1);
            info!(webhook = %name, instance = %id.instance, services, "the endpoint is not caught up: full resync enqueued");
        }
        Err(e) => {
            warn!(webhook = %name, error = %e, "cannot enqueue the resync of an endpoint that is not caught up; trying again")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(generation: &str, instance: &str, caught_up: Option<bool>) -> ReceiverIdentity {
        ReceiverIdentity { generation: generation.into(), instance: instance.into(), caught_up, concurrency: None }
    }

    #[test]
    fn a_receiver_not_caught_up_gets_one_resync_per_run_until_nothing_is_pending() {
        let mut c = CatchUp::default();
        assert_eq!(c.on(&id("gen_a", "run_1", Some(true)), false), Step::Nothing);
        assert_eq!(c.on(&id("gen_a", "run_2", Some(false)), false), Step::Resync { lost_state: false }, "a restart");
        assert_eq!(c.on(&id("gen_a", "run_2", Some(false)), true), Step::Nothing, "the resync is on its way");
        assert_eq!(c.on(&id("gen_a", "run_2", Some(false)), false), Step::Resync { lost_state: false }, "it was lost");
        assert_eq!(c.on(&id("gen_a", "run_2", Some(true)), false), Step::Nothing);
        assert_eq!(c.on(&id("gen_a", "run_3", Some(false)), true), Step::Resync { lost_state: false }, "a new run");
    }

    #[test]
    fn a_new_generation_is_a_lost_state() {
        let mut c = CatchUp::default();
        assert_eq!(c.on(&id("gen_a", "run_1", Some(false)), false), Step::Resync { lost_state: false });
        assert_eq!(c.on(&id("gen_b", "run_2", Some(false)), true), Step::Resync { lost_state: true });
        assert_eq!(c.on(&id("gen_b", "run_2", None), false), Step::Nothing, "no word on this cluster");
    }
}
