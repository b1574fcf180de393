//! The applier: one task that owns the desired state and HAProxy. Deliveries arriving within
//! `batch_window` share one render and one apply; each gets its answer only once the change is live
//! (the Runtime API commands answered without error, or the reload is confirmed and the new binds
//! accept connections). A batch HAProxy refuses is re-applied one delivery at a time, so only the
//! bad Service fails. Each delivery is first judged by who sent it ([`crate::clusters`]): a cluster
//! name another vipwatch holds is refused (409) before anything is applied. Watching HAProxy (and
//! starting it again) is [`crate::supervise`]'s, in a task of its own.
//!
//! It also knows whether the agent is caught up ([`crate::catchup`]). An agent that lost its state
//! while HAProxy kept serving (or found a `haproxy.cfg` it did not make) **holds** HAProxy: it folds
//! deliveries into its state but changes nothing in HAProxy, and answers them only once it is caught
//! up — when the full resync it waits for goes live in one reload, which replaces the configuration
//! it did not make — so the Services HAProxy serves are never taken away by an empty state.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::catchup::{CatchUp, Start, new_generation, new_instance};
use crate::clusters::{Change, Claim, Clusters, Liveness, Sender};
use crate::config::AgentConfig;
use crate::haproxy::{Haproxy, HaproxyError};
use crate::metrics::Metrics;
use crate::render::{Globals, Rendered, render, runtime_commands};
use crate::state::{Binds, Desired, write_atomically};
use crate::sync::Syncs;
use vipwatch_contract::WebhookPayload;

/// How a delivery ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Live (or nothing to change).
    Applied,
    /// Not applied, on purpose (stale; a duplicate).
    Ignored(String),
    /// HAProxy can never serve it as asked (422).
    Rejected(String),
    /// Another vipwatch holds the delivery's cluster name (409).
    Conflict(String),
    /// Transient trouble: HAProxy down, a reload failed or timed out (503).
    Unavailable(String),
    /// Folded into the state while the agent holds a HAProxy it did not configure (202): live with
    /// the full resync that makes it caught up (why it is not yet).
    Held(String),
}

/// One verified delivery waiting for its outcome.
pub struct Job {
    /// The body.
    pub payload: WebhookPayload,
    /// When it arrived (for `apply_seconds`).
    pub received: Instant,
    /// Where the outcome goes.
    pub reply: oneshot::Sender<Outcome>,
}

/// What the applier reports to `/healthz`, `/state` and the answers' headers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Status {
    /// Why the last apply failed, until one succeeds.
    pub last_error: Option<String>,
    /// `sha256:` of the applied `haproxy.cfg`.
    pub config_sha256: String,
    /// Services applied.
    pub services: usize,
    /// The applied desired state (while holding HAProxy: the state waiting to be applied).
    pub desired: Desired,
    /// Per cluster name: when its bound event log last delivered, and the refusals of its name.
    pub liveness: BTreeMap<String, Liveness>,
    /// Whether the agent is caught up, per cluster and as a whole.
    pub catch_up: CatchUp,
}

/// Why an activation failed.
enum Failure {
    Rejected(String),
    Transient(String),
}

/// The applier task. Build with [`Applier::start`], run with [`Applier::run`].
pub struct Applier {
    desired: Desired,
    applied: Rendered,
    haproxy: Arc<Haproxy>,
    globals: Globals,
    config: AgentConfig,
    state_path: PathBuf,
    syncs: Syncs,
    clusters: Clusters,
    metrics: Arc<Metrics>,
    status: watch::Sender<Status>,
    /// Sweeps of completed resyncs not yet live.
    sweeps: Vec<crate::state::Intent>,
    /// Whether the agent is caught up.
    catch_up: CatchUp,
    /// While holding HAProxy: the clusters whose resync is folded into the state, not yet live.
    staged: BTreeSet<String>,
    /// `agent.lock` in the directory, held exclusively: one agent per directory (and HAProxy).
    _lock: std::fs::File,
}

impl Applier {
    /// Loads `state.json`, renders it, and makes HAProxy run it: attaches to a running master (no
    /// reload when its file is already this render) or starts one. Without a `state.json` while HAProxy
    /// runs, or with a `haproxy.cfg` the state does not render, it holds HAProxy instead (module
    /// docs): attaches to it, or starts it from that file, and changes nothing. Returns the applier,
    /// its status and the HAProxy it drives (for [`crate::supervise`]). Errors: the state cannot be
    /// read, or HAProxy cannot be started or reloaded.
    pub async fn start(
        config: AgentConfig,
        metrics: Arc<Metrics>,
    ) -> Result<(Self, watch::Receiver<Status>, Arc<Haproxy>), String> {
        std::fs::create_dir_all(&config.dir).map_err(|e| format!("{}: {e}", config.dir.display()))?;
        let lock = lock_dir(&config.dir)?;
        let state_path = config.dir.join("state.json");
        let stored = Desired::load_existing(&state_path)?;
        let found = stored.is_some();
        let mut desired = stored.unwrap_or_default();
        let mut save = desired.generation.is_none();
        let generation = desired.generation.get_or_insert_with(new_generation).clone();
        desired.reslot(config.server_slots);
        let haproxy = Arc::new(Haproxy::new(&config.haproxy_bin, &config.dir));
        if let pids @ [_, ..] = haproxy.unreachable().as_slice() {
            return Err(crate::haproxy::unreachable_reason(pids, &haproxy.master));
        }
        let globals = Globals {
            admin_socket: haproxy.admin.display().to_string(),
            hard_stop_after: config.hard_stop_after,
            mworker_max_reloads: config.mworker_max_reloads,
        };
        let rendered = render(&desired, &globals);
        let on_disk = std::fs::read_to_string(&haproxy.config).ok();
        let running = haproxy.show_proc().await.is_ok();
        let foreign = match &on_disk {
            Some(text) => *text != rendered.text,
            None => running,
        };
        if !found && foreign {
            warn!(
                generation,
                running,
                "no state.json, but HAProxy runs or a haproxy.cfg is left: holding HAProxy as it is until a full resync went live"
            );
            desired.held = true;
            save = true;
        }
        let applied = if desired.held {
            match hold(&haproxy, &config, running, on_disk, &rendered).await? {
                Some(foreign) => foreign,
                None => {
                    desired.held = false;
                    rendered
                }
            }
        } else {
            run_render(&haproxy, &config, running, on_disk.as_deref(), &rendered, desired.services.len()).await?;
            rendered
        };
        if save {
            desired.save(&state_path).map_err(|e| format!("{}: {e}", state_path.display()))?;
        }
        let start = Start {
            generation,
            trusted: found && !desired.held,
            bound: desired.clusters.keys().cloned().collect(),
            expected: config.clusters.clone(),
        };
        let catch_up = CatchUp::new(start, new_instance(), desired.held);
        info!(generation = catch_up.generation(), waiting_for = ?catch_up.waiting_for(), "not caught up until a full resync went live");
        let (status, rx) = watch::channel(Status::default());
        let clusters = Clusters::new(config.cluster_takeover_after, Instant::now());
        let applier = Self {
            desired,
            applied,
            haproxy: haproxy.clone(),
            globals,
            config,
            state_path,
            syncs: Syncs::default(),
            clusters,
            metrics,
            status,
            sweeps: Vec::new(),
            catch_up,
            staged: BTreeSet::new(),
            _lock: lock,
        };
        applier.publish(None);
        Ok((applier, rx, haproxy))
    }

    /// Applies batches from `jobs` until `cancel`.
    pub async fn run(mut self, mut jobs: mpsc::Receiver<Job>, cancel: CancellationToken) {
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                job = jobs.recv() => match job {
                    Some(job) => {
                        let batch = self.collect(job, &mut jobs).await;
                        self.apply_batch(batch).await;
                    }
                    None => break,
                },
            }
        }
    }

    /// `first` and whatever else arrives within the batch window — or, when `first` changes members
    /// only (applied through the Runtime API, no reload to save), just what is already queued: a
    /// Pod leaving a rolling update is drained at once, not one window later.
    async fn collect(&self, first: Job, jobs: &mut mpsc::Receiver<Job>) -> Vec<Job> {
        let members_only = is_members_only(&first.payload);
        let mut batch = vec![first];
        if members_only {
            while let Ok(job) = jobs.try_recv() {
                batch.push(job);
            }
            return batch;
        }
        let deadline = Instant::now() + self.config.batch_window;
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => return batch,
                job = jobs.recv() => match job {
                    Some(job) => batch.push(job),
                    None => return batch,
                },
            }
        }
    }

    async fn apply_batch(&mut self, jobs: Vec<Job>) {
        let mut candidate = self.desired.clone();
        let mut pending = Vec::new();
        let mut changes = Vec::new();
        let mut binds = Binds::of(&candidate);
        for job in jobs {
            match self.take(&mut candidate, &mut binds, &job.payload, &mut changes) {
                Ok(()) => pending.push(job),
                Err(outcome) => self.answer(job, outcome),
            }
        }
        self.publish_liveness();
        // Completed resyncs sweep what they did not include; kept until a batch carrying them is live.
        self.sweeps.extend(self.syncs.take_sweeps());
        for sweep in &self.sweeps {
            let _ = candidate.apply(sweep.clone());
        }
        let resynced: BTreeSet<String> = self.sweeps.iter().filter_map(swept_cluster).map(str::to_owned).collect();
        if self.catch_up.held {
            return self.apply_held(candidate, pending, changes, resynced).await;
        }
        if pending.is_empty() && candidate == self.desired {
            self.sweeps.clear();
            self.live_resyncs(&resynced);
            self.publish(None);
            return;
        }
        candidate.reslot(self.config.server_slots);
        match self.activate(&candidate, true).await {
            Ok(()) => {
                if !self.sweeps.is_empty() {
                    let removed = self.desired.services.keys().filter(|k| !candidate.services.contains_key(*k)).count();
                    info!(
                        clusters = resynced.iter().cloned().collect::<Vec<_>>().join(","),
                        removed,
                        services = candidate.services.len(),
                        "resync complete: removed what it did not include"
                    );
                }
                self.sweeps.clear();
                self.commit(candidate, &changes);
                self.live_resyncs(&resynced);
                self.publish(None);
                for job in pending {
                    self.answer(job, Outcome::Applied);
                }
            }
            Err(Failure::Rejected(why)) if pending.len() > 1 => {
                warn!(deliveries = pending.len(), reason = %why, "a batch cannot be applied; applying its deliveries one at a time");
                for job in pending {
                    Box::pin(self.apply_batch(vec![job])).await;
                }
            }
            Err(Failure::Rejected(why)) => {
                self.publish(Some(why.clone()));
                for job in pending {
                    self.answer(job, Outcome::Rejected(why.clone()));
                }
            }
            Err(Failure::Transient(why)) => {
                self.publish(Some(why.clone()));
                for job in pending {
                    self.answer(job, Outcome::Unavailable(why.clone()));
                }
            }
        }
    }

    /// A batch while holding HAProxy: folded into the state and answered at once as held (202),
    /// unless the resyncs it completes make the agent caught up — then the whole state goes live in
    /// one reload that replaces the configuration HAProxy ran, and the batch is answered once it is.
    /// Held deliveries are not kept waiting: a resync has more Services than vipwatch has deliveries
    /// in flight to one endpoint, and answers that time out would count against the endpoint.
    async fn apply_held(
        &mut self,
        mut candidate: Desired,
        pending: Vec<Job>,
        changes: Vec<Change>,
        resynced: BTreeSet<String>,
    ) {
        self.sweeps.clear();
        self.staged.extend(resynced);
        candidate.reslot(self.config.server_slots);
        self.commit(candidate, &changes);
        if !self.catch_up.caught_up_with(&self.staged) {
            self.publish(None);
            let why = self.catch_up.reason().unwrap_or_default();
            for job in pending {
                self.answer(job, Outcome::Held(why.clone()));
            }
            return;
        }
        let desired = self.desired.clone();
        match self.activate(&desired, false).await {
            Ok(()) => {
                info!(
                    services = self.desired.services.len(),
                    clusters = self.staged.iter().cloned().collect::<Vec<_>>().join(","),
                    "caught up: the resynced state replaced the configuration HAProxy ran"
                );
                self.catch_up.held = false;
                self.desired.held = false;
                self.save();
                let staged = std::mem::take(&mut self.staged);
                self.live_resyncs(&staged);
                self.publish(None);
                for job in pending {
                    self.answer(job, Outcome::Applied);
                }
            }
            Err(Failure::Rejected(why) | Failure::Transient(why)) => {
                let why = format!("the resynced state cannot replace the configuration HAProxy runs: {why}");
                self.publish(Some(why.clone()));
                for job in pending {
                    self.answer(job, Outcome::Unavailable(why.clone()));
                }
            }
        }
    }

    /// Makes `candidate` the state, with the cluster `changes` that came with it, and saves it.
    fn commit(&mut self, candidate: Desired, changes: &[Change]) {
        self.desired = candidate;
        self.clusters.committed(changes, &self.desired, Instant::now());
        for change in changes {
            if let Change::Renamed { from, to, .. } = change {
                self.catch_up.renamed(from, to);
            }
        }
        self.log_changes(changes);
        self.save();
    }

    fn save(&self) {
        if let Err(e) = self.desired.save(&self.state_path) {
            warn!(error = %e, path = %self.state_path.display(), "cannot save the state; a restart would roll back to the previous one");
        }
    }

    /// Records that the resyncs of `clusters` are live; logs when that makes the agent caught up.
    fn live_resyncs(&mut self, clusters: &BTreeSet<String>) {
        let before = self.catch_up.caught_up();
        for c in clusters {
            self.catch_up.resynced(c);
        }
        if !before && self.catch_up.caught_up() {
            info!(generation = self.catch_up.generation(), "caught up: every cluster the agent waits for was resynced");
        }
    }

    /// Folds one delivery into `candidate` (whose bind index is `binds`), first judging who sent it
    /// (its cluster's binding may change: `changes`). Errors: its outcome when it changes nothing (a
    /// cluster name another vipwatch holds, stale, rejected).
    fn take(
        &mut self,
        candidate: &mut Desired,
        binds: &mut Binds,
        payload: &WebhookPayload,
        changes: &mut Vec<Change>,
    ) -> Result<(), Outcome> {
        let cluster = match self.clusters.claim(candidate, Sender::of(payload), Instant::now()) {
            Claim::Accepted { cluster, changes: made } => {
                if !made.is_empty() {
                    // A binding that changed may have moved Services between clusters.
                    *binds = Binds::of(candidate);
                }
                changes.extend(made);
                cluster
            }
            Claim::Invalid(why) => return Err(Outcome::Rejected(why)),
            Claim::Conflict(why) => return Err(Outcome::Conflict(why)),
        };
        let intents = self.syncs.intents(payload, &cluster);
        if intents.is_empty() {
            // `sync.completed`: applied with the batch (its sweep, if it completed the resync).
            return if payload.kind == vipwatch_contract::PayloadType::SyncCompleted {
                Ok(())
            } else {
                Err(Outcome::Ignored("nothing to apply".into()))
            };
        }
        for intent in intents {
            if let Some(why) = candidate.ignore(&intent) {
                return Err(Outcome::Ignored(why.into()));
            }
            candidate.apply_with(intent, binds).map_err(Outcome::Rejected)?;
        }
        Ok(())
    }

    fn answer(&self, job: Job, outcome: Outcome) {
        let d = &job.payload.data;
        let service = d.service.as_ref().map(|s| format!("{}/{}", s.namespace, s.name)).unwrap_or_default();
        let cluster = d.cluster.as_deref().unwrap_or(crate::state::DEFAULT_CLUSTER);
        match &outcome {
            Outcome::Applied if d.service.is_none() => {
                let sync = d.sync.as_ref().map(|s| s.id.as_str()).unwrap_or_default();
                info!(cluster, sync, kind = job.payload.kind.as_str(), "resync marker noted");
            }
            Outcome::Applied => {
                self.metrics.apply_seconds.observe(job.received.elapsed().as_secs_f64());
                info!(cluster, service, event = d.event.as_str(), kind = job.payload.kind.as_str(), "applied");
            }
            Outcome::Ignored(why) => info!(cluster, service, event = d.event.as_str(), reason = %why, "ignored"),
            Outcome::Rejected(why) => {
                self.metrics.rejected.inc();
                warn!(cluster, service, event = d.event.as_str(), reason = %why, "refused: HAProxy cannot serve it");
            }
            Outcome::Conflict(why) => {
                let labels = crate::metrics::ClusterLabels { cluster: cluster.to_owned() };
                self.metrics.cluster_conflicts.get_or_create(&labels).inc();
                let log_id = d.log_id.as_deref().unwrap_or_default();
                warn!(cluster, log_id, service, event = d.event.as_str(), reason = %why, "refused: another vipwatch holds this cluster name");
            }
            Outcome::Unavailable(why) => {
                warn!(cluster, service, event = d.event.as_str(), reason = %why, "not applied; vipwatch retries")
            }
            Outcome::Held(why) => {
                info!(cluster, service, event = d.event.as_str(), reason = %why, "recorded, not live until caught up")
            }
        }
        let _ = job.reply.send(outcome);
    }

    /// Makes HAProxy run `candidate`: Runtime API commands when only server slots differ, else a
    /// confirmed reload (checked with `haproxy -c` only when it fails); `preflight`: first check that the binds it adds are free (not when
    /// HAProxy runs a configuration the agent did not make: its binds are unknown, and HAProxy's own
    /// holds them).
    async fn activate(&mut self, candidate: &Desired, preflight: bool) -> Result<(), Failure> {
        let new = render(candidate, &self.globals);
        if new.text == self.applied.text {
            return Ok(());
        }
        if let Err(e) = self.haproxy.show_proc().await {
            return Err(Failure::Transient(format!(
                "{e}; the agent starts HAProxy again when it is gone, and `/healthz` says why while it does not answer"
            )));
        }
        if new.skeleton == self.applied.skeleton {
            let commands = runtime_commands(&self.applied, &new);
            match self.haproxy.runtime(&commands).await {
                Ok(()) => {
                    write_atomically(&self.haproxy.config, new.text.as_bytes())
                        .map_err(|e| Failure::Transient(e.to_string()))?;
                    self.metrics.runtime_updates.inc();
                    info!(commands = commands.len(), "members changed through the Runtime API (no reload)");
                    self.applied = new;
                    return Ok(());
                }
                Err(e) => warn!(error = %e, "runtime update failed; reloading instead"),
            }
        }
        self.reload(new, preflight).await
    }

    async fn reload(&mut self, new: Rendered, check_binds: bool) -> Result<(), Failure> {
        // As sets: with thousands of binds, `Vec::contains` per bind made this quadratic.
        let (old_binds, new_binds): (BTreeSet<&SocketAddr>, BTreeSet<&SocketAddr>) =
            (self.applied.binds.iter().collect(), new.binds.iter().collect());
        let added: Vec<SocketAddr> = new_binds.difference(&old_binds).map(|b| **b).collect();
        let removed: Vec<SocketAddr> = old_binds.difference(&new_binds).map(|b| **b).collect();
        if check_binds {
            preflight(&added)?;
        }
        // No `haproxy -c` first: the master parses the file as it reloads and keeps the old worker
        // serving when that fails, so a separate check only doubled the parse, the larger part of a
        // reload with thousands of frontends. The check runs after a failed reload, to tell a
        // configuration HAProxy refuses (the batch's Services, one at a time) from trouble that passes.
        write_atomically(&self.haproxy.config, new.text.as_bytes()).map_err(|e| Failure::Transient(e.to_string()))?;
        let reloaded = self.haproxy.reload(self.config.reload_timeout).await;
        let result = if reloaded.is_ok() { "ok" } else { "failed" };
        self.metrics.reloads.get_or_create(&crate::metrics::ResultLabels { result: result.into() }).inc();
        if let Err(e) = reloaded {
            let _ = write_atomically(&self.haproxy.config, self.applied.text.as_bytes());
            return Err(self.why_not_reloaded(&new, e, check_binds.then_some(&added[..])).await);
        }
        info!(binds = new.binds.len(), "HAProxy reloaded");
        self.applied = new;
        confirm_live(&added, &removed, self.config.reload_timeout).await;
        Ok(())
    }

    /// Why `new` did not go live in a reload that failed with `e`: refused (a configuration `haproxy
    /// -c` rejects; a bind in `added` that is taken, when binds are checked) or transient.
    async fn why_not_reloaded(&self, new: &Rendered, e: HaproxyError, added: Option<&[SocketAddr]>) -> Failure {
        let next = self.haproxy.config.with_extension("cfg.new");
        if let Err(e) = write_atomically(&next, new.text.as_bytes()) {
            return Failure::Transient(e.to_string());
        }
        let checked = self.haproxy.check(&next).await;
        let _ = std::fs::remove_file(&next);
        match checked {
            Err(HaproxyError::Invalid(why)) => {
                return Failure::Rejected(format!("HAProxy refused the configuration: {why}"));
            }
            Err(other) => return Failure::Transient(other.to_string()),
            Ok(()) => {}
        }
        // A bind that failed after the pre-flight passed (a program took the address meanwhile): the
        // same Service would fail again, so it is refused. HAProxy's own words are only there when
        // this agent started it (they go to the starting agent's stderr).
        if let Some(added) = added
            && let Err(refused) = preflight(added)
        {
            return refused;
        }
        let why = e.to_string();
        if why.contains("cannot bind") { Failure::Rejected(why) } else { Failure::Transient(why) }
    }

    fn publish(&self, error: Option<String>) {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(self.applied.text.as_bytes());
        let config_sha256 = format!("sha256:{}", digest.iter().map(|b| format!("{b:02x}")).collect::<String>());
        self.metrics.set_services(&self.desired.services_per_cluster());
        self.metrics.caught_up.set(i64::from(self.catch_up.caught_up()));
        self.status.send_replace(Status {
            last_error: error,
            config_sha256,
            services: self.desired.services.len(),
            desired: self.desired.clone(),
            liveness: self.liveness(),
            catch_up: self.catch_up.clone(),
        });
    }

    /// Every cluster's liveness, for `/state`.
    fn liveness(&self) -> BTreeMap<String, Liveness> {
        self.clusters.all().iter().map(|(c, l)| (c.clone(), l.clone())).collect()
    }

    /// Publishes the clusters' liveness alone (a delivery heard, a name refused).
    fn publish_liveness(&self) {
        let liveness = self.liveness();
        self.status.send_if_modified(|s| {
            let changed = s.liveness != liveness;
            s.liveness = liveness;
            changed
        });
    }

    /// Logs who speaks for which cluster now, once live.
    fn log_changes(&self, changes: &[Change]) {
        for change in changes {
            match change {
                Change::Bound { cluster, log_id } => {
                    let log_id = log_id.as_deref().unwrap_or_default();
                    info!(cluster, log_id, "a new cluster: its name is bound to the event log that delivered it");
                }
                Change::TakenOver { cluster, from, to, silent } => {
                    let labels = crate::metrics::ClusterLabels { cluster: cluster.clone() };
                    self.metrics.cluster_takeovers.get_or_create(&labels).inc();
                    warn!(
                        cluster,
                        from = from.as_deref().unwrap_or_default(),
                        to = to.as_deref().unwrap_or_default(),
                        silent = %humantime::format_duration(Duration::from_secs(silent.as_secs())),
                        "cluster name taken over by another vipwatch (event log) after the bound one fell silent: expected when that vipwatch's database was replaced; otherwise two clusters share a cluster.name"
                    );
                }
                Change::Renamed { from, to, services } => {
                    info!(
                        from,
                        to,
                        services,
                        "a vipwatch renamed its cluster (cluster.name changed): its Services moved under the new name"
                    )
                }
                Change::Adopted { cluster, services } => {
                    info!(
                        cluster,
                        services, "Services stored before clusters adopted by the cluster of their event log"
                    )
                }
            }
        }
    }
}

/// Makes HAProxy run `rendered` (what the state renders) at start: attaches to a running master
/// (reloading it when `on_disk` is another configuration) or starts one. `services` is for the log.
/// Errors: HAProxy cannot be reloaded or started.
async fn run_render(
    haproxy: &Haproxy,
    config: &AgentConfig,
    running: bool,
    on_disk: Option<&str>,
    rendered: &Rendered,
    services: usize,
) -> Result<(), String> {
    let current = on_disk == Some(rendered.text.as_str());
    if !current {
        write_atomically(&haproxy.config, rendered.text.as_bytes())
            .map_err(|e| format!("{}: {e}", haproxy.config.display()))?;
    }
    match (running, current) {
        (true, true) => info!(services, "attached to the running HAProxy; its configuration is current"),
        (true, false) => {
            haproxy.reload(config.reload_timeout).await.map_err(|e| e.to_string())?;
            info!(services, "attached to the running HAProxy and reloaded it");
        }
        (false, _) => {
            haproxy.start(config.reload_timeout, config.stop_haproxy_on_exit).await.map_err(|e| e.to_string())?;
            info!(services, pid = haproxy.pid(), "started HAProxy");
        }
    }
    Ok(())
}

/// Holds HAProxy at start: attaches to the running master as it is, or starts one from the
/// `haproxy.cfg` left in the directory (`on_disk`). With HAProxy running and no file, the file gets
/// `rendered` (what HAProxy would start from if it died: the agent knows nothing else), and HAProxy
/// is not reloaded. Returns what HAProxy runs as the applied render (its text that file, its slots
/// and binds unknown); `None` when there is nothing to hold — no HAProxy and no file, or a file that
/// does not start — and HAProxy runs `rendered` instead. Errors: HAProxy cannot be started at all.
async fn hold(
    haproxy: &Haproxy,
    config: &AgentConfig,
    running: bool,
    on_disk: Option<String>,
    rendered: &Rendered,
) -> Result<Option<Rendered>, String> {
    if !running && on_disk.is_none() {
        run_render(haproxy, config, false, None, rendered, 0).await?;
        return Ok(None);
    }
    let text = match on_disk {
        Some(text) => text,
        None => {
            write_atomically(&haproxy.config, rendered.text.as_bytes())
                .map_err(|e| format!("{}: {e}", haproxy.config.display()))?;
            String::new()
        }
    };
    let foreign = Rendered { text, skeleton: String::new(), slots: BTreeMap::new(), binds: Vec::new() };
    if running {
        info!("attached to the running HAProxy; holding it as it is");
        return Ok(Some(foreign));
    }
    match haproxy.start(config.reload_timeout, config.stop_haproxy_on_exit).await {
        Ok(()) => {
            info!(pid = haproxy.pid(), "started HAProxy from the haproxy.cfg left in the directory; holding it");
            Ok(Some(foreign))
        }
        Err(e) => {
            warn!(error = %e, "the haproxy.cfg left in the directory does not start; starting from the empty state");
            write_atomically(&haproxy.config, rendered.text.as_bytes())
                .map_err(|e| format!("{}: {e}", haproxy.config.display()))?;
            haproxy.start(config.reload_timeout, config.stop_haproxy_on_exit).await.map_err(|e| e.to_string())?;
            Ok(None)
        }
    }
}

/// The cluster a sweep is of.
fn swept_cluster(intent: &crate::state::Intent) -> Option<&str> {
    match intent {
        crate::state::Intent::Sweep { cluster, .. } => Some(cluster),
        _ => None,
    }
}

/// Binds that HAProxy is about to add must be free: one held by another program
/// (`EADDRINUSE`) or an address not on this host (`EADDRNOTAVAIL`: see `ip_nonlocal_bind`) can never
/// be served and would fail the whole reload.
fn preflight(added: &[SocketAddr]) -> Result<(), Failure> {
    for addr in added {
        if let Err(e) = std::net::TcpListener::bind(addr) {
            let why = match e.kind() {
                std::io::ErrorKind::AddrInUse => format!("{addr} is in use by another program"),
                std::io::ErrorKind::AddrNotAvailable => format!(
                    "{addr}: the address is not on this host (add it, or set net.ipv4.ip_nonlocal_bind=1 where keepalived or kube-vip moves it)"
                ),
                _ => format!("cannot bind {addr}: {e}"),
            };
            return Err(Failure::Rejected(why));
        }
    }
    Ok(())
}

/// Waits (at most `timeout`) until every added bind accepts connections and every removed one refuses
/// them, so the answer to the delivery means the next connection sees the change.
///
/// Only binds on an address this host holds now are checked: a VIP the other host of a pair holds
/// (bound here through `ip_nonlocal_bind`) would be reached over the network, or not at all while
/// nobody holds it, and says nothing about this HAProxy. A wildcard bind is checked on loopback.
async fn confirm_live(added: &[SocketAddr], removed: &[SocketAddr], timeout: Duration) {
    let deadline = Instant::now() + timeout;
    let local = local_addresses();
    let here = |a: &&SocketAddr| a.ip().is_unspecified() || local.contains(&a.ip()) || routed_here(a.ip());
    let pending: BTreeSet<SocketAddr> = added.iter().chain(removed).filter(here).copied().collect();
    for addr in pending {
        let want_open = added.contains(&addr);
        loop {
            let open = tokio::net::TcpStream::connect(addr).await.is_ok();
            if open == want_open {
                break;
            }
            if Instant::now() >= deadline {
                warn!(%addr, want_open, "the reload is confirmed but the bind did not follow in time");
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// Whether the kernel delivers `ip` to this host although no interface carries it (loopback's
/// `127.0.0.0/8`, a prefix routed `local` to `lo`): the source it picks to reach `ip` is then `ip`
/// itself or a loopback address. No packet is sent (a UDP `connect` only chooses the route).
fn routed_here(ip: std::net::IpAddr) -> bool {
    let any: SocketAddr =
        if ip.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { (std::net::Ipv6Addr::UNSPECIFIED, 0).into() };
    let source = std::net::UdpSocket::bind(any).and_then(|s| s.connect((ip, 9)).and_then(|()| s.local_addr()));
    source.is_ok_and(|s| s.ip() == ip || s.ip().is_loopback())
}

/// The addresses on this host's interfaces now (`getifaddrs(3)`); empty when it fails.
fn local_addresses() -> BTreeSet<std::net::IpAddr> {
    let mut out = BTreeSet::new();
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list` with a linked list that stays valid until freeifaddrs; each
    // `ifa_addr` is null or points to a sockaddr of the family it names.
    unsafe {
        if libc::getifaddrs(&mut list) != 0 {
            return out;
        }
        let mut cursor = list;
        while let Some(ifa) = cursor.as_ref() {
            if let Some(addr) = ifa.ifa_addr.as_ref() {
                match i32::from(addr.sa_family) {
                    libc::AF_INET => {
                        let v4 = &*ifa.ifa_addr.cast::<libc::sockaddr_in>();
                        out.insert(std::net::Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr)).into());
                    }
                    libc::AF_INET6 => {
                        let v6 = &*ifa.ifa_addr.cast::<libc::sockaddr_in6>();
                        out.insert(std::net::Ipv6Addr::from(v6.sin6_addr.s6_addr).into());
                    }
                    _ => {}
                }
            }
            cursor = ifa.ifa_next;
        }
        libc::freeifaddrs(list);
    }
    out
}

/// Whether `p` changes a Service's members and nothing else (`service.modified`, `changed:
/// ["backends"]`): within the server slots, a Runtime API update.
fn is_members_only(p: &WebhookPayload) -> bool {
    p.kind == vipwatch_contract::PayloadType::ServiceModified && p.data.changed == ["backends"]
}

/// Takes `<dir>/agent.lock` exclusively (released when the agent exits, even by SIGKILL). Errors:
/// another agent holds it, or the file cannot be opened.
fn lock_dir(dir: &std::path::Path) -> Result<std::fs::File, String> {
    let path = dir.join("agent.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(format!(
            "another vipwatch-haproxy already runs with dir {} (it holds {}); one agent per directory",
            dir.display(),
            path.display()
        )),
        Err(std::fs::TryLockError::Error(e)) => Err(format!("{}: {e}", path.display())),
    }
}
