//! Leading: one term's tasks (the watch, the relay, the write-back to Kubernetes, pruning), the
//! election loop that starts and stops them on PostgreSQL, and what every replica runs beside them
//! (the feedback route to the current term, the commit feed of followers).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch as signal};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{ASSIGNMENT_QUEUE, AppError, fatal_on_error};
use crate::config::{Config, DatabaseConfig};
use crate::leader::{Elector, LeaderDeadline, Role};
use crate::metrics::Metrics;
use crate::model::Feedback;
use crate::publish::{self, Publisher};
use crate::relay;
use crate::route::Router;
use crate::store::{Outbox, Store, now_ms};
use crate::watch;

/// What outlives a term: what the API reads and the next term starts from.
#[derive(Clone)]
pub(super) struct Shared {
    pub config: Config,
    /// The store, unfenced (each term fences its own clone).
    pub store: Store,
    pub metrics: Arc<Metrics>,
    pub client: kube::Client,
    /// `true` once the term's first full lists are stored.
    pub ready: signal::Sender<bool>,
    /// The highest committed event id.
    pub committed: signal::Sender<i64>,
    pub circuits: crate::store::Circuits,
    /// Where feedback for the current term's recorder goes; `None` between terms.
    pub route: signal::Sender<Option<mpsc::Sender<Feedback>>>,
    /// The watch's per-scope health (what `/readyz` checks).
    pub watch_health: watch::WatchHealth,
}

/// One term as leader: starts the relay, the write-back, the watch, pruning and the resync of
/// switched endpoints on `store` (fenced on PostgreSQL), acting while `leader_deadline` is ahead, and runs them
/// until `cancel`. A task that fails for good cancels `cancel`, which ends the term: on SQLite that
/// is the process's own token (it stops, as it always did), on PostgreSQL the term's ([`elect`]
/// then campaigns again). Returns the first error a task ended with.
pub(super) async fn lead(
    s: Shared,
    store: Store,
    leader_deadline: LeaderDeadline,
    cancel: CancellationToken,
) -> Result<(), AppError> {
    s.ready.send_replace(false);
    let (notices, events_task) =
        publish::start_events(s.client.clone(), s.metrics.clone(), leader_deadline.clone(), cancel.clone());
    let wiring = watch::WriterWiring {
        metrics: s.metrics.clone(),
        ready: s.ready.clone(),
        committed: s.committed.clone(),
        notices: notices.clone(),
        term: cancel.clone(),
        refused: Default::default(),
    };
    let outbox: Arc<dyn Outbox> = Arc::new(Router::new(&s.config, store.log_id())?);
    let (assign_tx, assign_rx) = mpsc::channel(ASSIGNMENT_QUEUE);
    s.route.send_replace(Some(assign_tx.clone()));
    // Pulsed by the relay when an endpoint acknowledged a delivery: the publisher's status write-back
    // and finalizer removal go at once instead of at the next poll.
    let (acked_tx, acked) = signal::channel(0u64);
    let committed = s.committed.subscribe();
    let mut relay_tasks = relay::start(
        &s.config,
        store.clone(),
        s.metrics.clone(),
        s.circuits.clone(),
        committed.clone(),
        acked_tx,
        assign_tx.clone(),
        leader_deadline.clone(),
        cancel.clone(),
    )
    .await?;
    let publisher = Publisher::new(s.client.clone(), &s.config, store.clone(), s.metrics.clone(), notices, assign_tx)
        .waking(s.committed.clone())
        .leading_until(leader_deadline);
    let publisher_task = tokio::spawn(publisher.run(committed.clone(), acked, cancel.clone()));
    let checkpoint_task = tokio::spawn(store.clone().checkpoint_loop(cancel.clone()));
    let relay_task = tokio::spawn(async move {
        while relay_tasks.join_next().await.is_some() {}
        let _ = publisher_task.await;
        let _ = events_task.await;
        let _ = checkpoint_task.await;
        Ok(())
    });
    let watch_task = {
        let (store, cancel, config, client) = (store.clone(), cancel.clone(), s.config.clone(), s.client.clone());
        fatal_on_error("watch", cancel.clone(), async move {
            Ok(watch::run(client, &config, store, outbox, wiring, assign_rx, cancel).await?)
        })
    };
    let prune_task = tokio::spawn(prune_loop(store.clone(), s.config.database.event_retention, cancel.clone()));
    let modes = resync_switched_modes(store, s.config.clone(), s.ready.subscribe(), cancel.clone());
    let modes_task = fatal_on_error("relay", cancel.clone(), modes);
    let mut result = Ok(());
    for task in [watch_task, relay_task, prune_task, modes_task] {
        match task.await {
            Ok(Err(e)) if result.is_ok() => result = Err(e),
            Err(e) => warn!(error = %e, "task panicked"),
            _ => {}
        }
    }
    s.route.send_replace(None);
    result
}

/// The election loop (PostgreSQL): campaigns for the lease, leads while the term lasts, and stands
/// down to follower when it is lost: the role says follower at once, the term's tasks stop (nothing
/// is sent or written to Kubernetes after its leader deadline passed, and its database writes were fenced
/// anyway), and it campaigns again. A term whose tasks fail (a database fault at its start, a write
/// the database refused) is given up and this replica waits `database.leader_ttl` before bidding
/// again, so another replica may take over; so is a term whose watch stays not ready for
/// `database.leader_step_down_after` ([`unready_for`]). On `cancel` (graceful stop) the term's tasks drain,
/// then the lease is given up at once so a follower takes over without waiting for it to expire.
/// Publishes this replica's role in `role`.
pub(super) async fn elect(
    s: Shared,
    elector: Elector,
    role: signal::Sender<Role>,
    cancel: CancellationToken,
) -> Result<(), AppError> {
    loop {
        role.send_replace(Role::Follower);
        let Some(term) = elector.campaign(&cancel).await else { return Ok(()) };
        let epoch = term.epoch;
        role.send_replace(Role::Leader { epoch });
        let term_cancel = cancel.child_token();
        let run = lead(s.clone(), term.fenced(&s.store), term.leader_deadline.clone(), term_cancel.clone());
        tokio::pin!(run);
        let unready =
            unready_for(s.config.database.leader_step_down_after, s.ready.subscribe(), s.watch_health.clone());
        // A term that ends while the lease is still ours (its watch failing too long, its tasks
        // failed, a graceful stop) gives the lease up; a lost one has nothing to give up.
        let result = tokio::select! {
            why = unready => {
                warn!(epoch, reason = %why, after = ?s.config.database.leader_step_down_after,
                    "watch not ready: giving the lease up so a replica that can reach Kubernetes leads");
                term_cancel.cancel();
                run.await
            }
            result = &mut run => {
                match &result {
                    _ if cancel.is_cancelled() => {}
                    // Deposed before the renewal noticed: the lease is someone else's already.
                    Err(e) if e.is_fenced() => {
                        info!(epoch, retry_in = ?s.config.database.leader_ttl, "leader term over: not the leader any more");
                    }
                    _ => {
                        let why = result.as_ref().err().map(|e| super::ErrorChain(e).to_string()).unwrap_or_default();
                        warn!(epoch, error = %why, retry_in = ?s.config.database.leader_ttl, "leader term failed; giving up the lease");
                    }
                }
                result
            }
            _ = term.lost() => {
                role.send_replace(Role::Follower);
                term_cancel.cancel();
                term.abandon();
                match run.await {
                    // Their writes refused by the fence: expected once the lease is lost.
                    Err(e) if e.is_fenced() => {}
                    Err(e) => warn!(epoch, error = %super::ErrorChain(&e), "the lost term's tasks ended with an error"),
                    Ok(()) => {}
                }
                // The loss itself was logged as a warning by the renewal that found it.
                info!(epoch, "stood down: following, and bidding for the lease again");
                continue;
            }
        };
        if let Err(e) = term.resign().await {
            warn!(error = %e, "cannot give up the leader lease; it expires by itself");
        }
        if cancel.is_cancelled() {
            return result;
        }
        role.send_replace(Role::Follower);
        tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            _ = tokio::time::sleep(s.config.database.leader_ttl) => {}
        }
    }
}

/// Resolves with the reason once the watch has been failing for `limit` without a break: before its
/// first lists are stored (`ready` false), a scope whose last request failed or stalled (a first list
/// that is still being read is progress, however long a large cluster takes); after, what `/readyz`
/// checks ([`watch::WatchHealth::not_ready`]). Checked every second.
async fn unready_for(limit: Duration, ready: signal::Receiver<bool>, health: watch::WatchHealth) -> String {
    let mut since = tokio::time::Instant::now();
    let mut ticks = tokio::time::interval(Duration::from_secs(1).min(limit));
    loop {
        ticks.tick().await;
        let ready = *ready.borrow();
        let why = match ready {
            false => first_list_failing(&health),
            true => health.not_ready(),
        };
        match why {
            None => since = tokio::time::Instant::now(),
            Some(why) if since.elapsed() >= limit => return why,
            Some(_) => {}
        }
    }
}

/// Why the first lists are not coming: the scopes whose last request failed or stalled, with their
/// last error; `None` while every scope lists or watches (or none has started yet).
fn first_list_failing(health: &watch::WatchHealth) -> Option<String> {
    let failing: Vec<String> = health
        .statuses()
        .into_iter()
        .filter(|s| matches!(s.state, watch::ScopeState::Failing | watch::ScopeState::Stalled))
        .map(|s| format!("{}: {}", s.resource, s.last_error.unwrap_or_default()))
        .collect();
    (!failing.is_empty()).then(|| format!("first full list failing ({})", failing.join("; ")))
}

/// Keeps `vipwatch_leader` at this replica's `role` (1 leading or single, 0 following) until the
/// role's sender is gone.
pub(super) async fn publish_role(mut role: signal::Receiver<Role>, metrics: Arc<Metrics>) -> Result<(), AppError> {
    loop {
        metrics.leader.set(i64::from(role.borrow_and_update().leads()));
        if role.changed().await.is_err() {
            return Ok(());
        }
    }
}

/// Passes feedback from the API (operator requests) to the current term's recorder; between terms
/// and on followers there is none, and the request is dropped with a warning (the API tells
/// followers' clients so itself).
pub(super) async fn forward_feedback(
    mut rx: mpsc::Receiver<Feedback>,
    route: signal::Receiver<Option<mpsc::Sender<Feedback>>>,
    cancel: CancellationToken,
) -> Result<(), AppError> {
    loop {
        let feedback = tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            f = rx.recv() => match f { Some(f) => f, None => return Ok(()) },
        };
        let target = route.borrow().clone();
        match target {
            Some(tx) => {
                let _ = tx.send(feedback).await;
            }
            None => warn!(?feedback, "not leading: request dropped"),
        }
    }
}

/// How often a follower reads the highest event id even without a notification (a backstop).
const COMMIT_POLL: Duration = Duration::from_secs(2);

/// Keeps `committed` at the highest event id in the database (PostgreSQL): woken by the leader's
/// `NOTIFY vipwatch_events` (sent in the transaction that wrote the events, so at its commit), with
/// a read after every reconnect and every [`COMMIT_POLL`] as a backstop. The SSE tail and the VIP
/// index of every replica wake on it; on the leader the watch moves it first.
pub(super) async fn follow_commits(
    store: Store,
    config: DatabaseConfig,
    committed: signal::Sender<i64>,
    cancel: CancellationToken,
) -> Result<(), AppError> {
    let url = config.url.as_ref().map(|u| u.expose().to_owned()).unwrap_or_default();
    let mut listener = None;
    loop {
        if listener.is_none() {
            listener = connect_listener(&url).await;
        }
        if let Ok(max) = store.max_event_id().await {
            raise(&committed, max);
        }
        let woke = async {
            match listener.as_mut() {
                Some(l) => l.try_recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            _ = tokio::time::sleep(COMMIT_POLL) => {}
            got = woke => match got {
                Ok(Some(n)) => {
                    if let Ok(id) = n.payload().parse() {
                        raise(&committed, id);
                    }
                }
                // The connection was lost (sqlx reconnects at the next call): read what was missed.
                Ok(None) => {}
                Err(_) => listener = None,
            },
        }
    }
}

async fn connect_listener(url: &str) -> Option<sqlx::postgres::PgListener> {
    let mut listener = sqlx::postgres::PgListener::connect(url).await.ok()?;
    listener.listen(crate::store::EVENTS_CHANNEL).await.ok()?;
    Some(listener)
}

fn raise(committed: &signal::Sender<i64>, id: i64) {
    committed.send_if_modified(|c| {
        let higher = id > *c;
        if higher {
            *c = id;
        }
        higher
    });
}

/// Once the first lists are stored, resyncs the endpoints whose backend mode changed since the last
/// start ([`crate::route::resync_switched_modes`]).
async fn resync_switched_modes(
    store: Store,
    config: Config,
    mut ready: signal::Receiver<bool>,
    cancel: CancellationToken,
) -> Result<(), AppError> {
    tokio::select! {
        _ = cancel.cancelled() => return Ok(()),
        r = ready.wait_for(|r| *r) => if r.is_err() { return Ok(()) },
    }
    crate::route::resync_switched_modes(&store, &config).await?;
    // Full-state template endpoints: a declaration now (converges after a restart), then periodically.
    relay::full_state::resend_loop(store, &config, cancel).await;
    Ok(())
}

/// Deletes events older than `retention`, at start and then hourly.
async fn prune_loop(store: Store, retention: Duration, cancel: CancellationToken) -> Result<(), AppError> {
    let mut tick = tokio::time::interval(Duration::from_secs(3600));
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            _ = tick.tick() => {}
        }
        let cutoff = now_ms().saturating_sub(i64::try_from(retention.as_millis()).unwrap_or(i64::MAX));
        match store.prune_events(cutoff).await {
            Ok(0) => {}
            Ok(n) => info!(deleted = n, "pruned events past database.event_retention"),
            Err(e) if e.is_fenced() => debug!(error = %e, "events not pruned: not the leader any more"),
            Err(e) => warn!(error = %e, "cannot prune events"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch::{ScopeSpec, Verb, WatchHealth};

    #[test]
    fn a_first_list_counts_as_failing_only_while_a_scope_fails_or_stalls() {
        let health = WatchHealth::new(Metrics::new(), Duration::from_secs(30));
        let services = ScopeSpec::services(None);
        assert_eq!(first_list_failing(&health), None, "nothing asked yet");
        health.opened(&services, Verb::List);
        assert_eq!(first_list_failing(&health), None, "a list being read is progress");
        health.failed(&services, Verb::List, "client error (Connect)");
        assert_eq!(
            first_list_failing(&health).as_deref(),
            Some("first full list failing (services: list services in all namespaces failed: client error (Connect))")
        );
        health.opened(&services, Verb::List);
        assert_eq!(first_list_failing(&health), None, "listing again");
        health.stalled(&services, Verb::List, Duration::from_secs(7));
        assert_eq!(
            first_list_failing(&health).as_deref(),
            Some("first full list failing (services: list stalled: nothing received for 7s)")
        );
    }
}
