//! Writing back to Kubernetes, gated on the appliance: adds vipwatch's finalizer before a Service's
//! first delivery goes out, publishes `status.loadBalancer.ingress` once every appliance (an endpoint,
//! or the hosts of a pair together) acknowledged the change carrying the address, and after an acknowledged DELETED clears that status
//! and removes the finalizer. Also publishes Kubernetes Events. Reads its work from the store (see
//! `migrations/0003_allocation.sql`), so nothing is lost across restarts.

pub mod events;
pub mod kube_ops;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::config::Config;
use crate::metrics::Metrics;
use crate::model::{Feedback, Gates, IngressView, Notice, Reason, ServiceKey};
use crate::store::{Acks, CleanupWork, StatusWork, Store, StoreError};
use kube_ops::Written;

pub use events::CONTROLLER;

/// Most finalizers added, and most statuses written, per pass.
const BATCH: i64 = 512;

/// Most Services whose status waits read per pass: a pass over all of them would, in the initial sync
/// of many Services, read them and their deliveries again at every pass, one after every commit and
/// every acknowledged delivery.
const STATUS_WINDOW: i64 = 2048;

/// Finalizer (and status) patches in flight at once.
const CONCURRENCY: usize = 32;

/// Least time from the end of one pass to the start of the next when woken by `committed` or `acked`. Every commit and
/// every acknowledged batch wakes the publisher: under a steady stream of changes, unspaced passes would follow
/// each other back to back (four queries each) and nearly all of them find nothing new. A single change still gets
/// its pass at once (see docs/explanation/design-decisions.md, "Publisher passes at least 25 ms apart").
const PASS_SPACING: Duration = Duration::from_millis(25);

/// Errors of one pass (logged; the pass is retried).
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The apiserver failed (not a 404/422, which settle the work).
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// This replica's leader term is over: it writes nothing to Kubernetes any more.
    #[error("not the leader any more")]
    NotLeader,
}

/// The write-back loop. Build with [`Publisher::new`], run with [`Publisher::run`].
pub struct Publisher {
    client: kube::Client,
    store: Store,
    metrics: Arc<Metrics>,
    notices: mpsc::Sender<Notice>,
    /// Where acknowledged releases go (the recorder frees the addresses).
    feedback: mpsc::Sender<Feedback>,
    /// The endpoints whose deliveries gate a write, by appliance ([`Config::gates`]; a full-state
    /// declaration carries the event id of the change that started it, but gates nothing).
    gates: Gates,
    write_status: bool,
    poll: Duration,
    /// Status last written per Service (until the watch shows it and the work row goes away).
    written: HashMap<ServiceKey, Vec<IngressView>>,
    /// Where the next pass's status window starts (after this Service; `None` = from the first).
    status_cursor: Option<ServiceKey>,
    /// The Services the windows of the current round showed waiting (to forget the rest of
    /// [`Self::written`] when the round ends).
    status_seen: HashSet<ServiceKey>,
    /// Delivery ids already reported in a `SyncLoadBalancerFailed` Event.
    reported: HashSet<i64>,
    /// Pulsed when deliveries awaiting the finalizer were let go (the relay's `committed` signal), so they are sent at
    /// once rather than at the relay's next poll.
    wake_relay: Option<watch::Sender<i64>>,
    /// Until when this replica leads: no Kubernetes write starts after it ([`Publisher::leading_until`]).
    leader_deadline: crate::leader::LeaderDeadline,
    /// The cluster's name, as the appliances know it (named in `EnsuredLoadBalancer`, so an
    /// operator looking at the Service knows which of an appliance's clusters holds it).
    cluster: Option<String>,
}

impl Publisher {
    /// A publisher for `config` (`kubernetes.write_status`, enabled endpoints, `relay.poll_interval`
    /// as the pass period). Events go to `notices`, acknowledged releases to `feedback`.
    pub fn new(
        client: kube::Client,
        config: &Config,
        store: Store,
        metrics: Arc<Metrics>,
        notices: mpsc::Sender<Notice>,
        feedback: mpsc::Sender<Feedback>,
    ) -> Self {
        Self {
            client,
            store,
            metrics,
            notices,
            feedback,
            gates: config.gates(),
            write_status: config.kubernetes.write_status,
            poll: config.relay.poll_interval,
            cluster: config.cluster.name.clone(),
            written: HashMap::new(),
            status_cursor: None,
            status_seen: HashSet::new(),
            reported: HashSet::new(),
            wake_relay: None,
            leader_deadline: crate::leader::LeaderDeadline::unbounded(),
        }
    }

    /// Writes to Kubernetes only while `leader_deadline` is ahead (a leader's term; see [`crate::leader`]).
    pub fn leading_until(mut self, leader_deadline: crate::leader::LeaderDeadline) -> Self {
        self.leader_deadline = leader_deadline;
        self
    }

    /// Pulses `relay` (the signal the dispatchers wake on) whenever deliveries awaiting the finalizer are let go.
    pub fn waking(mut self, relay: watch::Sender<i64>) -> Self {
        self.wake_relay = Some(relay);
        self
    }

    /// Runs passes until `cancel`: after every commit of the watch (`committed`), after every
    /// acknowledged delivery (`acked`, pulsed by the relay), and every `relay.poll_interval` (work
    /// another process enqueued). While the database cannot be written, passes are spaced by the
    /// store's backoff ([`Store::write_backoff`]) instead.
    pub async fn run(
        mut self,
        mut committed: watch::Receiver<i64>,
        mut acked: watch::Receiver<u64>,
        cancel: CancellationToken,
    ) {
        let mut acked_open = true;
        let mut backoff: Option<backon::ExponentialBackoff> = None;
        loop {
            match self.pass().await {
                // A full batch of finalizers: more Services wait, go on at once.
                Ok(true) => {
                    backoff = None;
                    continue;
                }
                Ok(false) => backoff = None,
                // The term is over (the store logged the refusal once): the term's tasks are being
                // stopped; nothing to retry or report.
                Err(PublishError::Store(e)) if e.is_fenced() => {
                    debug!(error = %e, "write-back stopped: not the leader any more")
                }
                Err(e @ PublishError::NotLeader) => debug!(error = %e, "write-back stopped"),
                Err(PublishError::Store(e)) if e.is_transient() => {
                    use backon::BackoffBuilder;
                    let delay = backoff.get_or_insert_with(|| self.store.write_backoff().build()).next();
                    let delay = delay.unwrap_or(self.poll);
                    warn!(error = %e, reason = %e.reason(), retry_in = ?delay, "database failing; write-back paused");
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep(delay) => continue,
                    }
                }
                Err(e) => warn!(error = %e, "writing back to Kubernetes failed; retrying"),
            }
            let passed = tokio::time::Instant::now();
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = committed.changed() => {}
                changed = acked.changed(), if acked_open => acked_open = changed.is_ok(),
                _ = tokio::time::sleep(self.poll) => {}
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep_until(passed + PASS_SPACING) => {}
            }
        }
    }

    /// One pass over the kinds of work that wait ([`Store::publish_work`]). Returns whether more
    /// finalizers wait than one pass takes ([`BATCH`]).
    pub async fn pass(&mut self) -> Result<bool, PublishError> {
        if !self.leader_deadline.is_ahead() {
            return Ok(false);
        }
        let work = self.store.publish_work().await?;
        let more = if work.finalizers { self.finalizers().await? } else { false };
        if self.write_status {
            if work.statuses {
                self.statuses().await?;
            } else {
                self.written.clear();
                self.status_seen.clear();
                self.status_cursor = None;
            }
        }
        if work.cleanups {
            self.cleanups().await?;
        }
        if work.releases {
            self.releases().await?;
        }
        Ok(more)
    }

    /// Frees the pool addresses withdrawn by changes (DELETED, or a MODIFIED that dropped addresses)
    /// that every appliance acknowledged ([`Gates`]).
    async fn releases(&mut self) -> Result<(), PublishError> {
        for r in self.store.releases().await? {
            // A withdrawing MODIFIED may be superseded: then the later delivery that replaced it counts.
            if !self.store.event_settled(&r.key, r.event_id, &self.gates).await? {
                continue;
            }
            if self.feedback.send(Feedback::Released { key: r.key, uid: r.uid, addresses: r.addresses }).await.is_err()
            {
                return Ok(()); // the recorder is gone: shutting down; the row stays for the next start
            }
            self.store.finish_release(r.event_id).await?;
        }
        Ok(())
    }

    /// Adds the finalizer to Services whose deliveries wait for it (up to [`CONCURRENCY`] at once),
    /// letting each Service's deliveries go as soon as its patch is done: a patch stuck in a slow
    /// apiserver holds back only its own Service's deliveries, not the rest of the pass (up to
    /// [`BATCH`]), and the relay starts on the first Services of a large first list while the later
    /// ones are patched. The patches and the writes that let deliveries go run side by side: each
    /// write takes every patch finished since the last one, and the next patches start while it
    /// waits for the write connection (were the write between them, every such wait would leave the
    /// patches idle). A Service that is gone or being deleted gets none (its DELETED follows), and its
    /// deliveries go too. A Service whose patch failed stays held for the next pass.
    async fn finalizers(&mut self) -> Result<bool, PublishError> {
        let held = self.store.services_awaiting_finalizer(BATCH).await?;
        let full = held.len() as i64 == BATCH;
        let (client, leader_deadline, metrics) = (&self.client, &self.leader_deadline, &self.metrics);
        let (finished_tx, mut finished_rx) = mpsc::unbounded_channel();
        let patching = async move {
            let mut patches = futures::stream::iter(held)
                .filter(|_| std::future::ready(leader_deadline.is_ahead()))
                .map(|key| async move {
                    let written = kube_ops::add_finalizer(client, &key).await;
                    (key, written)
                })
                .buffer_unordered(CONCURRENCY);
            // Counted and logged as each patch finishes, so none goes unrecorded when letting go
            // fails (that ends the pass, dropping the patches still running).
            let mut failed: Option<(ServiceKey, String, usize)> = None;
            while let Some((key, written)) = patches.next().await {
                if let Some(key) = settled(metrics, key, written, &mut failed) {
                    // Never fails: the receiver outlives this future.
                    let _ = finished_tx.send(key);
                }
            }
            Ok::<_, PublishError>(failed)
        };
        let releasing = async {
            let mut progress = false;
            let mut done = Vec::new();
            while finished_rx.recv_many(&mut done, BATCH as usize).await > 0 {
                self.store.release_awaiting_finalizer(&done).await?;
                if let Some(relay) = &self.wake_relay {
                    relay.send_modify(|_| {});
                }
                progress = true;
                done.clear();
            }
            Ok::<bool, PublishError>(progress)
        };
        let (failed, progress) = tokio::try_join!(patching, releasing)?;
        if let Some((key, error, services)) = failed {
            warn!(service = %key, %error, services, "cannot add the finalizer; their deliveries wait (retrying)");
        }
        // Go on at once only while making progress: a failing apiserver must not be hammered.
        Ok(full && progress)
    }

    /// Writes the statuses whose change every appliance acknowledged and that this replica has not
    /// written yet. Each pass reads the next [`STATUS_WINDOW`] waiting Services (after the last one
    /// the pass before read, from the first again after the end), their acknowledgements in one
    /// read, and patches up to [`BATCH`] of them, [`CONCURRENCY`] at once. One patch at a time, after
    /// two reads each, would hold the initial sync of many Services with a pool to the pace of one
    /// round trip per status, and the finalizers of the next Services would wait behind it.
    async fn statuses(&mut self) -> Result<(), PublishError> {
        let work = self.store.status_work(self.status_cursor.as_ref(), STATUS_WINDOW).await?;
        let wrapped = (work.len() as i64) < STATUS_WINDOW;
        self.status_cursor = if wrapped { None } else { work.last().map(|w| w.key.clone()) };
        self.status_seen.extend(work.iter().map(|w| w.key.clone()));
        if wrapped {
            // A whole round of windows is over: what it did not see, the watch has shown written.
            let seen = std::mem::take(&mut self.status_seen);
            self.written.retain(|k, _| seen.contains(k));
        }
        let todo: Vec<&StatusWork> = work.iter().filter(|w| self.written.get(&w.key) != Some(&w.ingress)).collect();
        let waiting: Vec<&ServiceKey> = todo.iter().map(|w| &w.key).collect();
        let acks = self.store.services_acks(&waiting, &self.gates).await?;
        let mut ready = Vec::new();
        for w in todo {
            let Some(acks) = acks.get(&w.key) else { continue };
            self.report_failures(&w.key, &w.uid, acks);
            if acks.done && ready.len() < BATCH as usize {
                ready.push(w.clone());
            }
        }
        // Owned work and a client per patch: a stream of borrowing futures inside the spawned pass
        // does not satisfy the compiler's higher-ranked lifetimes.
        let (client, leader_deadline) = (self.client.clone(), self.leader_deadline.clone());
        let patches = futures::stream::iter(ready)
            .filter(move |_| std::future::ready(leader_deadline.is_ahead()))
            .map(|w: StatusWork| {
                let client = client.clone();
                async move {
                    let result = kube_ops::patch_status(&client, &w.key, &w.ingress).await;
                    (w, result)
                }
            })
            .buffer_unordered(CONCURRENCY);
        let written: Vec<_> = patches.collect().await;
        for (w, result) in written {
            if let Err(e) = self.status_written(&w, result) {
                warn!(service = %w.key, error = %e, "cannot write status.loadBalancer; retrying");
            }
        }
        Ok(())
    }

    /// Records how the status patch of `w` went: logs, an Event, and [`Self::written`].
    fn status_written(&mut self, w: &StatusWork, result: Result<Written, kube::Error>) -> Result<(), PublishError> {
        self.metrics.kube_write("status", result.is_ok());
        match result? {
            Written::Ok => {
                let shown: Vec<&str> =
                    w.ingress.iter().filter_map(|i| i.ip.as_deref().or(i.hostname.as_deref())).collect();
                info!(service = %w.key, ingress = ?shown, "status.loadBalancer written");
                if !shown.is_empty() {
                    let on = self.cluster.as_deref().map(|c| format!(" (cluster {c})")).unwrap_or_default();
                    let note = format!("Ensured load balancer: {}{on}", shown.join(", "));
                    self.notify(&w.key, &w.uid, Reason::EnsuredLoadBalancer, note);
                }
            }
            Written::Gone => {}
            Written::Refused(why) => warn!(service = %w.key, reason = %why, "status not written"),
        }
        self.written.insert(w.key.clone(), w.ingress.clone());
        Ok(())
    }

    async fn cleanups(&mut self) -> Result<(), PublishError> {
        for c in self.store.cleanups().await? {
            let acks = self.store.event_acks(&c.key, c.event_id, &self.gates).await?;
            self.report_failures(&c.key, &c.uid, &acks);
            if !acks.done {
                continue;
            }
            match self.clean(&c).await {
                Ok(()) => self.store.finish_cleanup(c.event_id).await?,
                Err(e) => warn!(service = %c.key, error = %e, "cannot clean up after the DELETED; retrying"),
            }
        }
        Ok(())
    }

    /// Clears the status we published (if the object still shows it), then removes the finalizer
    /// (which lets a terminating object go). Only on the very object the DELETED was about.
    async fn clean(&mut self, c: &CleanupWork) -> Result<(), PublishError> {
        if !self.leader_deadline.is_ahead() {
            return Err(PublishError::NotLeader);
        }
        let Some(svc) = kube_ops::get(&self.client, &c.key).await? else { return Ok(()) };
        if svc.metadata.uid.as_deref() != Some(c.uid.as_str()) {
            return Ok(());
        }
        let shown = crate::model::ServiceView::from_service(&svc).ingress;
        if !c.clear_ingress.is_empty() && shown == c.clear_ingress {
            if !self.leader_deadline.is_ahead() {
                return Err(PublishError::NotLeader);
            }
            let written = kube_ops::patch_status(&self.client, &c.key, &[]).await;
            self.metrics.kube_write("status", written.is_ok());
            written?;
        }
        if c.remove_finalizer {
            if !self.leader_deadline.is_ahead() {
                return Err(PublishError::NotLeader);
            }
            let written = kube_ops::remove_finalizer(&self.client, &c.key).await;
            self.metrics.kube_write("finalizer_remove", written.is_ok());
            written?;
            info!(service = %c.key, "DELETED acknowledged by every appliance; finalizer removed");
        }
        self.notify(&c.key, &c.uid, Reason::DeletedLoadBalancer, "Deleted load balancer".into());
        Ok(())
    }

    /// One `SyncLoadBalancerFailed` Event per delivery that failed (for good, or its last attempt).
    fn report_failures(&mut self, key: &ServiceKey, uid: &str, acks: &Acks) {
        if self.reported.len() > 100_000 {
            self.reported.clear();
        }
        for (webhook, id, error) in &acks.failing {
            if self.reported.insert(*id) {
                let note = format!("Error syncing load balancer: webhook `{webhook}` delivery {id}: {error}");
                self.notify(key, uid, Reason::SyncLoadBalancerFailed, note);
            }
        }
    }

    fn notify(&self, key: &ServiceKey, uid: &str, reason: Reason, note: String) {
        let notice = Notice { key: key.clone(), uid: uid.to_owned(), reason, note };
        if self.notices.try_send(notice).is_err() {
            self.metrics.kube_events_dropped(1);
            warn!(service = %key, %reason, "Kubernetes Event queue full; Event dropped");
        }
    }
}

/// Starts the Event publisher task (publishing while `leader_deadline` is ahead); returns where to send notices.
pub fn start_events(
    client: kube::Client,
    metrics: Arc<Metrics>,
    leader_deadline: crate::leader::LeaderDeadline,
    cancel: CancellationToken,
) -> (mpsc::Sender<Notice>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel(crate::model::NOTICE_QUEUE);
    (tx, tokio::spawn(events::run(client, rx, metrics, leader_deadline, cancel)))
}

/// `vipwatch release-finalizers`: removes vipwatch's finalizer from every Service in the configured
/// namespaces (all when none), e.g. before uninstalling. Returns the Services released. Errors: the
/// apiserver failed (what was released so far stays released).
pub async fn release_finalizers(client: &kube::Client, config: &Config) -> Result<Vec<ServiceKey>, kube::Error> {
    let keys = kube_ops::with_finalizer(client, &config.kubernetes.namespaces).await?;
    for key in &keys {
        kube_ops::remove_finalizer(client, key).await?;
    }
    Ok(keys)
}

/// One finished finalizer patch of `key`, counted in `metrics`: the key when its deliveries may go
/// (patched, or refused for good: the Service is gone or being deleted, logged), `None` when the
/// patch failed (the Service stays held for the next pass; the first failure and how many there were
/// go to `failed`, logged once by the pass).
fn settled(
    metrics: &Metrics,
    key: ServiceKey,
    written: Result<Written, kube::Error>,
    failed: &mut Option<(ServiceKey, String, usize)>,
) -> Option<ServiceKey> {
    metrics.kube_write("finalizer_add", written.is_ok());
    match written {
        Ok(Written::Refused(why)) => info!(service = %key, reason = %why, "finalizer not added"),
        Ok(_) => {}
        Err(e) => {
            failed.get_or_insert_with(|| (key, e.to_string(), 0)).2 += 1;
            return None;
        }
    }
    Some(key)
}
