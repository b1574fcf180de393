//! Bringing a receiver up to date by itself when it says it is not: a receiver that speaks the
//! identity contract ([`vipwatch_contract::receiver`], the HAProxy agent) answers every request with
//! the identity of its stored state (a generation) and of its run (an instance), and whether it holds
//! this cluster's whole state. One that restarted (and may have missed deliveries meanwhile) or lost
//! its state says it is not caught up, and keeps its host out of service (its `/healthz` is `503`, so
//! keepalived gives it no VIP) until a full resync of this cluster has gone live there.
//!
//! vipwatch probes each plain endpoint ([`PROBE_EVERY`], `GET` on its URL with the cluster's name in
//! [`CLUSTER_HEADER`]) and, when it is not caught up, enqueues that resync
//! ([`crate::route::resync`]) — once per run of the receiver, and again only once the resync it sent
//! is no longer pending there. A receiver whose first answer carries no identity is a plain webhook
//! receiver: it is not probed again. [`CatchUp`] decides; [`watch`] probes and acts.

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

/// Probes endpoint `name` at `url` with `client` every [`PROBE_EVERY`] until `cancel`, while `trust`
/// lasts, and enqueues a resync of it when [`CatchUp`] says so. Stops after the first answer without
/// an identity (a receiver that does not speak the contract). Failures to reach it are left to the
/// dispatcher's circuit breaker; a failed resync is logged and tried again at the next probe.
#[allow(clippy::too_many_arguments)]
pub(super) async fn watch(
    name: String,
    url: url::Url,
    client: reqwest::Client,
    config: Arc<Config>,
    store: Store,
    metrics: Arc<Metrics>,
    trust: crate::leader::Trust,
    cancel: CancellationToken,
) {
    let cluster = config.cluster.name.clone().unwrap_or_default();
    let mut state = CatchUp::default();
    loop {
        if trust.is_valid() {
            let answer = client.get(url.clone()).header(CLUSTER_HEADER, &cluster).send().await;
            if let Ok(answer) = answer {
                let headers = answer.headers();
                let id = ReceiverIdentity::from_headers(|n| headers.get(n).and_then(|v| v.to_str().ok()));
                let Some(id) = id else {
                    debug!(webhook = %name, "the endpoint does not report whether it is caught up; not probed again");
                    return;
                };
                let pending = match store.outbox_depth().await {
                    Ok(depth) => depth.iter().any(|(w, n, _)| *w == name && *n > 0),
                    Err(_) => true, // the database will say more at the next probe
                };
                if let Step::Resync { lost_state } = state.on(&id, pending) {
                    resync(&name, &id, lost_state, &config, &store, &metrics).await;
                }
            }
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(PROBE_EVERY) => {}
        }
    }
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
        ReceiverIdentity { generation: generation.into(), instance: instance.into(), caught_up }
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
