//! Full-state template endpoints: the declaration of every in-scope Service, rendered at
//! send time from the state table; the removal guard; the periodic re-send. Deliveries wait on the
//! endpoint's own queue (empty namespace and name), coalesced and debounced by the store.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Map;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::RelayError;
use super::sender::failure;
use super::templated::{Log, TemplateSender, template_failure};
use crate::config::{Config, TemplateMode, WebhookConfig};
use crate::metrics::Metrics;
use crate::model::backends::ModePlan;
use crate::route::{Route, declaration};
use crate::store::{Claimed, Store};
use crate::template::{TemplateError, full_state_context, service_value};

/// What a full-state endpoint reads at send time.
pub struct FullState {
    /// Endpoint name.
    name: String,
    store: Store,
    route: Route,
    modes: ModePlan,
    /// The cluster the declaration covers (`cluster` in its context).
    cluster: Option<String>,
    max_removal: f64,
    metrics: Arc<Metrics>,
}

impl FullState {
    /// For endpoint `w` of `config`. Errors: [`RelayError::Endpoint`] for a label selector that does
    /// not parse (already refused by config validation).
    pub fn new(config: &Config, w: &WebhookConfig, store: Store, metrics: Arc<Metrics>) -> Result<Self, RelayError> {
        let max_removal = w.template.as_ref().map_or(1.0, |t| t.max_removal);
        let route = Route::new(w).map_err(|e| RelayError::Endpoint { name: w.name.clone(), reason: e.to_string() })?;
        let cluster = config.cluster.name.clone();
        Ok(Self { name: w.name.clone(), route, modes: config.mode_plan(), cluster, store, max_removal, metrics })
    }

    /// One attempt: reads the Services, applies the removal guard, renders and sends the declaration,
    /// and records what the appliance accepted.
    pub(super) async fn send(
        &self,
        t: &TemplateSender,
        c: &Claimed,
        log: &mut Log,
    ) -> Result<(), Box<super::sender::AttemptResult>> {
        let store_failure =
            |e: crate::store::StoreError| Box::new(failure("template", format!("cannot read the state: {e}")));
        let rows = self.store.services().await.map_err(store_failure)?;
        let mut rows: Vec<_> = rows.into_iter().filter(|s| self.route.accepts_service(s)).collect();
        rows.sort_by(|a, b| a.key.cmp(&b.key));
        let mut keys: Vec<String> = rows.iter().map(|r| r.key.to_string()).collect();
        keys.sort();
        let digest = digest(&keys);
        let told = self.store.full_state(&self.name).await.map_err(store_failure)?;
        let removed = told.told.iter().filter(|k| keys.binary_search(k).is_err()).count();
        let share = if told.told.is_empty() { 0.0 } else { removed as f64 / told.told.len() as f64 };
        if share > self.max_removal && told.confirmed.as_deref() != Some(digest.as_str()) {
            return Err(self.hold(&digest, removed, told.told.len()).await);
        }
        let Some(req) = t.compiled.full_state() else {
            return Err(template_failure(TemplateError::Setup("no full_state request".into())));
        };
        let ctx = self.context(rows, t.compiled.secrets_value()).await.map_err(template_failure)?;
        let ctx = |captured: &Map<String, serde_json::Value>| {
            if captured.is_empty() { ctx.clone() } else { with_captured(&ctx, captured) }
        };
        t.run(&c.msg_id, std::slice::from_ref(req), ctx, log).await?;
        match self.store.full_state_told(&self.name, &keys).await {
            Err(e) if e.is_fenced() => {
                debug!(webhook = %self.name, error = %e, "declaration accepted, not recorded: not the leader any more");
            }
            Err(e) => {
                warn!(webhook = %self.name, error = %e, "declaration accepted, but cannot record it as the removal guard's reference")
            }
            Ok(()) => {}
        }
        self.metrics.template_held(&self.name, false);
        Ok(())
    }

    /// The template context of a declaration of `rows`: each Service's value in this endpoint's
    /// backend mode, built on tokio's blocking pool (like the render, [`TemplateSender`]): for many
    /// Services both are long CPU work that would hold a runtime worker (docs/benchmarks.md).
    async fn context(
        &self,
        rows: Vec<crate::store::ServiceRow>,
        secrets: serde_json::Value,
    ) -> Result<minijinja::Value, TemplateError> {
        let (name, modes, cluster) = (self.name.clone(), self.modes.clone(), self.cluster.clone());
        let build = move || {
            let services = rows
                .iter()
                .map(|r| service_value(r, crate::model::backends::in_mode(&r.backends, modes.mode_for(&r.view, &name))))
                .collect();
            let now = crate::model::rfc3339(crate::store::now_ms());
            full_state_context(services, cluster.as_deref(), &now, &name, &secrets, &Map::new())
        };
        tokio::task::spawn_blocking(build).await.map_err(|e| super::templated::not_finished(&e))
    }

    async fn hold(&self, digest: &str, removed: usize, total: usize) -> Box<super::sender::AttemptResult> {
        let (removed, total) = (removed as i64, total as i64);
        let why = format!(
            "removal guard: the declaration removes {removed} of the {total} Services the appliance was last told \
             (more than max_removal {}); confirm with POST /api/v1/webhooks/{}/confirm-removal",
            self.max_removal, self.name
        );
        match self.store.full_state(&self.name).await {
            Ok(row) if row.held.as_ref().is_some_and(|h| h.0 == digest) => {}
            _ => {
                warn!(webhook = %self.name, removed, total, "full-state declaration held by the removal guard; confirm it through the API if intended")
            }
        }
        match self.store.full_state_hold(&self.name, digest, removed, total).await {
            Err(e) if e.is_fenced() => {
                debug!(webhook = %self.name, error = %e, "held declaration not recorded: not the leader any more");
            }
            Err(e) => warn!(webhook = %self.name, error = %e, "cannot record the held declaration"),
            Ok(()) => {}
        }
        self.metrics.template_held(&self.name, true);
        Box::new(failure("held", why))
    }
}

/// `ctx` with `captured` replaced.
fn with_captured(ctx: &minijinja::Value, captured: &Map<String, serde_json::Value>) -> minijinja::Value {
    minijinja::context! { captured => minijinja::Value::from(minijinja::value::Serde(captured)), ..ctx.clone() }
}

/// sha256 (hex) of a sorted Service set.
fn digest(keys: &[String]) -> String {
    format!("{:x}", Sha256::digest(keys.join("\n").as_bytes()))
}

/// Enqueues a declaration of every enabled full-state endpoint now, then every `resend_interval`
/// (repairs drift on the appliance), until `cancel`. Call it once the first lists are stored. A
/// database that refuses the write is logged and tried again at the next tick (storage faults are not
/// fatal).
pub async fn resend_loop(store: Store, config: &Config, cancel: CancellationToken) {
    let endpoints: Vec<(String, Duration)> = config
        .webhooks
        .iter()
        .filter(|w| w.enabled)
        .filter_map(|w| {
            let t = w.template.as_ref().filter(|t| t.mode == TemplateMode::FullState)?;
            Some((w.name.clone(), t.resend_interval))
        })
        .collect();
    let loops = endpoints.into_iter().map(|(name, every)| {
        let (store, cancel) = (store.clone(), cancel.clone());
        async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut why = "start";
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tick.tick() => {}
                }
                match store.enqueue_full_state(declaration(&name, "SYNCED", Duration::ZERO, why, None)).await {
                    Ok(()) if why == "start" => {
                        info!(webhook = %name, "full-state declaration enqueued (then every resend_interval)")
                    }
                    Ok(()) => {}
                    Err(e) if e.is_fenced() => {
                        debug!(webhook = %name, error = %e, "full-state declaration not enqueued: not the leader any more");
                    }
                    Err(e) => warn!(webhook = %name, error = %e, "cannot enqueue the full-state declaration; trying at the next resend"),
                }
                why = "resend";
            }
        }
    });
    futures::future::join_all(loops).await;
}
