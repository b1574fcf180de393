//! The applier: one task that owns the desired state and HAProxy. Deliveries arriving within
//! `batch_window` share one render and one apply; each gets its answer only once the change is live
//! (the Runtime API commands answered without error, or the reload is confirmed and the new binds
//! accept connections). A batch HAProxy refuses is re-applied one delivery at a time, so only the
//! bad Service fails. Each delivery is first judged by who sent it ([`crate::clusters`]): a cluster
//! name another vipwatch holds is refused (409) before anything is applied. Between batches it
//! checks HAProxy every second and restarts it from the last applied configuration when it is gone.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::clusters::{Change, Claim, Clusters, Liveness, Sender};
use crate::config::AgentConfig;
use crate::haproxy::{Haproxy, HaproxyError};
use crate::metrics::Metrics;
use crate::render::{Globals, Rendered, render, runtime_commands};
use crate::state::{Desired, write_atomically};
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

/// What `/healthz` and `/state` report.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Status {
    /// The HAProxy master answers.
    pub haproxy_up: bool,
    /// Why the last apply failed, until one succeeds.
    pub last_error: Option<String>,
    /// `sha256:` of the applied `haproxy.cfg`.
    pub config_sha256: String,
    /// Services applied.
    pub services: usize,
    /// The applied desired state.
    #[serde(skip)]
    pub desired: Desired,
    /// Per cluster name: when its bound event log last delivered, and the refusals of its name.
    #[serde(skip)]
    pub liveness: BTreeMap<String, Liveness>,
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
    haproxy: Haproxy,
    globals: Globals,
    config: AgentConfig,
    state_path: PathBuf,
    syncs: Syncs,
    clusters: Clusters,
    metrics: Arc<Metrics>,
    status: watch::Sender<Status>,
    /// Sweeps of completed resyncs not yet live.
    sweeps: Vec<crate::state::Intent>,
    /// `agent.lock` in the directory, held exclusively: one agent per directory (and HAProxy).
    _lock: std::fs::File,
}

impl Applier {
    /// Loads `state.json`, renders it, and makes HAProxy run it: attaches to a running master (no
    /// reload when its file is already this render) or starts one. Errors: the state cannot be read, or
    /// HAProxy cannot be started or reloaded.
    pub async fn start(config: AgentConfig, metrics: Arc<Metrics>) -> Result<(Self, watch::Receiver<Status>), String> {
        std::fs::create_dir_all(&config.dir).map_err(|e| format!("{}: {e}", config.dir.display()))?;
        let lock = lock_dir(&config.dir)?;
        let state_path = config.dir.join("state.json");
        let mut desired = Desired::load(&state_path)?;
        desired.reslot(config.server_slots);
        let haproxy = Haproxy::new(&config.haproxy_bin, &config.dir);
        let globals = Globals {
            admin_socket: haproxy.admin.display().to_string(),
            hard_stop_after: config.hard_stop_after,
            mworker_max_reloads: config.mworker_max_reloads,
        };
        let applied = render(&desired, &globals);
        let on_disk = std::fs::read_to_string(&haproxy.config).ok();
        if on_disk.as_deref() != Some(applied.text.as_str()) {
            write_atomically(&haproxy.config, applied.text.as_bytes())
                .map_err(|e| format!("{}: {e}", haproxy.config.display()))?;
        }
        match haproxy.show_proc().await {
            Ok(_) if on_disk.as_deref() == Some(applied.text.as_str()) => {
                info!(
                    services = desired.services.len(),
                    "attached to the running HAProxy; its configuration is current"
                )
            }
            Ok(_) => {
                haproxy.reload(config.reload_timeout).await.map_err(|e| e.to_string())?;
                info!(services = desired.services.len(), "attached to the running HAProxy and reloaded it");
            }
            Err(_) => {
                haproxy.start(config.reload_timeout, config.stop_haproxy_on_exit).await.map_err(|e| e.to_string())?;
                info!(services = desired.services.len(), pid = haproxy.pid(), "started HAProxy");
            }
        }
        let (status, rx) = watch::channel(Status::default());
        let clusters = Clusters::new(config.cluster_takeover_after, Instant::now());
        let applier = Self {
            desired,
            applied,
            haproxy,
            globals,
            config,
            state_path,
            syncs: Syncs::default(),
            clusters,
            metrics,
            status,
            sweeps: Vec::new(),
            _lock: lock,
        };
        applier.publish(true, None);
        Ok((applier, rx))
    }

    /// Applies batches from `jobs` and watches HAProxy until `cancel`.
    pub async fn run(mut self, mut jobs: mpsc::Receiver<Job>, cancel: CancellationToken) {
        let mut health = tokio::time::interval(Duration::from_secs(1));
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
                _ = health.tick() => self.supervise().await,
            }
        }
        if self.config.stop_haproxy_on_exit {
            self.haproxy.stop().await;
            info!("stopped HAProxy");
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
        for job in jobs {
            match self.take(&mut candidate, &job.payload, &mut changes) {
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
        if pending.is_empty() && candidate == self.desired {
            self.sweeps.clear();
            return;
        }
        candidate.reslot(self.config.server_slots);
        match self.activate(&candidate).await {
            Ok(()) => {
                if !self.sweeps.is_empty() {
                    let removed = self.desired.services.keys().filter(|k| !candidate.services.contains_key(*k)).count();
                    let clusters: Vec<&str> = self
                        .sweeps
                        .iter()
                        .filter_map(|s| match s {
                            crate::state::Intent::Sweep { cluster, .. } => Some(cluster.as_str()),
                            _ => None,
                        })
                        .collect();
                    info!(
                        clusters = clusters.join(","),
                        removed,
                        services = candidate.services.len(),
                        "resync complete: removed what it did not include"
                    );
                }
                self.sweeps.clear();
                self.desired = candidate;
                self.clusters.committed(&changes, &self.desired, Instant::now());
                self.log_changes(&changes);
                if let Err(e) = self.desired.save(&self.state_path) {
                    warn!(error = %e, path = %self.state_path.display(), "cannot save the state; a restart would roll back to the previous one");
                }
                self.publish(true, None);
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
                self.publish(true, Some(why.clone()));
                for job in pending {
                    self.answer(job, Outcome::Rejected(why.clone()));
                }
            }
            Err(Failure::Transient(why)) => {
                self.publish(false, Some(why.clone()));
                for job in pending {
                    self.answer(job, Outcome::Unavailable(why.clone()));
                }
            }
        }
    }

    /// Folds one delivery into `candidate`, first judging who sent it (its cluster's binding may
    /// change: `changes`). Errors: its outcome when it changes nothing (a cluster name another
    /// vipwatch holds, stale, rejected).
    fn take(
        &mut self,
        candidate: &mut Desired,
        payload: &WebhookPayload,
        changes: &mut Vec<Change>,
    ) -> Result<(), Outcome> {
        let cluster = match self.clusters.claim(candidate, Sender::of(payload), Instant::now()) {
            Claim::Accepted { cluster, changes: made } => {
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
            candidate.apply(intent).map_err(Outcome::Rejected)?;
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
        }
        let _ = job.reply.send(outcome);
    }

    /// Makes HAProxy run `candidate`: Runtime API commands when only server slots differ, else a
    /// checked, confirmed reload.
    async fn activate(&mut self, candidate: &Desired) -> Result<(), Failure> {
        let new = render(candidate, &self.globals);
        if new.text == self.applied.text {
            return Ok(());
        }
        if let Err(e) = self.haproxy.show_proc().await {
            return Err(Failure::Transient(format!("{e}; the agent restarts it")));
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
        self.reload(new).await
    }

    async fn reload(&mut self, new: Rendered) -> Result<(), Failure> {
        let added: Vec<SocketAddr> = new.binds.iter().filter(|b| !self.applied.binds.contains(b)).copied().collect();
        let removed: Vec<SocketAddr> = self.applied.binds.iter().filter(|b| !new.binds.contains(b)).copied().collect();
        preflight(&added)?;
        let next = self.haproxy.config.with_extension("cfg.new");
        write_atomically(&next, new.text.as_bytes()).map_err(|e| Failure::Transient(e.to_string()))?;
        if let Err(e) = self.haproxy.check(&next).await {
            return Err(match e {
                HaproxyError::Invalid(why) => Failure::Rejected(format!("HAProxy refused the configuration: {why}")),
                other => Failure::Transient(other.to_string()),
            });
        }
        std::fs::rename(&next, &self.haproxy.config).map_err(|e| Failure::Transient(e.to_string()))?;
        let reloaded = self.haproxy.reload(self.config.reload_timeout).await;
        let result = if reloaded.is_ok() { "ok" } else { "failed" };
        self.metrics.reloads.get_or_create(&crate::metrics::ResultLabels { result: result.into() }).inc();
        if let Err(e) = reloaded {
            let _ = write_atomically(&self.haproxy.config, self.applied.text.as_bytes());
            // A bind that failed after the pre-flight passed (a program took the address meanwhile):
            // the same Service would fail again, so it is refused. HAProxy's own words are only there
            // when this agent started it (they go to the starting agent's stderr).
            preflight(&added)?;
            let why = e.to_string();
            return Err(if why.contains("cannot bind") { Failure::Rejected(why) } else { Failure::Transient(why) });
        }
        info!(binds = new.binds.len(), "HAProxy reloaded");
        self.applied = new;
        confirm_live(&added, &removed, self.config.reload_timeout).await;
        Ok(())
    }

    /// Checks HAProxy; restarts it from the applied configuration when the master is gone.
    async fn supervise(&mut self) {
        match self.haproxy.show_proc().await {
            Ok(p) => {
                self.metrics.up.set(1);
                self.metrics.workers.set(i64::try_from(p.workers).unwrap_or(i64::MAX));
                if !self.status.borrow().haproxy_up {
                    self.publish(true, None);
                }
            }
            Err(e) => {
                self.metrics.up.set(0);
                warn!(error = %e, "HAProxy is not answering; starting it from the last applied configuration");
                self.publish(false, Some(e.to_string()));
                match self.haproxy.start(self.config.reload_timeout, self.config.stop_haproxy_on_exit).await {
                    Ok(()) => {
                        info!(
                            pid = self.haproxy.pid(),
                            services = self.desired.services.len(),
                            "HAProxy started again"
                        );
                        self.publish(true, None);
                    }
                    Err(e) => warn!(error = %e, "cannot start HAProxy; retrying"),
                }
            }
        }
    }

    fn publish(&self, up: bool, error: Option<String>) {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(self.applied.text.as_bytes());
        let config_sha256 = format!("sha256:{}", digest.iter().map(|b| format!("{b:02x}")).collect::<String>());
        self.metrics.set_services(&self.desired.services_per_cluster());
        self.status.send_replace(Status {
            haproxy_up: up,
            last_error: error,
            config_sha256,
            services: self.desired.services.len(),
            desired: self.desired.clone(),
            liveness: self.liveness(),
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
async fn confirm_live(added: &[SocketAddr], removed: &[SocketAddr], timeout: Duration) {
    let deadline = Instant::now() + timeout;
    let pending: BTreeSet<SocketAddr> = added.iter().chain(removed).copied().collect();
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
