//! The agent's Prometheus metrics (`vipwatch_haproxy_` prefix), rendered by `GET /metrics`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Labels of `vipwatch_haproxy_reloads_total`.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `ok` or `failed`.
    pub result: String,
}

/// Labels of `vipwatch_haproxy_deliveries_total`.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AnswerLabels {
    /// The HTTP status answered: `200`, `401`, `422`, `503`, ...
    pub status: String,
}

/// Labels of the per-cluster metrics.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClusterLabels {
    /// The cluster (`data.cluster`; `default` for a vipwatch that sends none; empty for Services
    /// stored before clusters and not yet claimed by one).
    pub cluster: String,
}

/// Every metric of the agent.
pub struct Metrics {
    registry: Registry,
    /// `vipwatch_haproxy_reloads_total{result}`: reloads, confirmed (`ok`) or not.
    pub reloads: Family<ResultLabels, Counter>,
    /// `vipwatch_haproxy_runtime_updates_total`: member changes applied through the Runtime API, without
    /// a reload.
    pub runtime_updates: Counter,
    /// `vipwatch_haproxy_apply_seconds`: delivery received → change live.
    pub apply_seconds: Histogram,
    /// `vipwatch_haproxy_rejected_services_total`: deliveries refused for good (422).
    pub rejected: Counter,
    /// `vipwatch_haproxy_deliveries_total{status}`: deliveries by the status answered.
    pub deliveries: Family<AnswerLabels, Counter>,
    /// `vipwatch_haproxy_services{cluster}`: Services in the applied configuration, per cluster.
    pub services: Family<ClusterLabels, Gauge>,
    /// `vipwatch_haproxy_cluster_conflicts_total{cluster}`: deliveries refused (409) because another
    /// vipwatch (another event log) holds the cluster name.
    pub cluster_conflicts: Family<ClusterLabels, Counter>,
    /// `vipwatch_haproxy_cluster_takeovers_total{cluster}`: a new event log took a cluster name over
    /// after the bound one fell silent.
    pub cluster_takeovers: Family<ClusterLabels, Counter>,
    /// `vipwatch_haproxy_workers`: HAProxy workers (old ones still draining included).
    pub workers: Gauge,
    /// `vipwatch_haproxy_up`: 1 while the HAProxy master answers.
    pub up: Gauge,
    /// `vipwatch_haproxy_restarts_total`: HAProxy started again by the agent after it died.
    pub restarts: Counter,
    /// `vipwatch_haproxy_caught_up`: 1 once the agent is caught up (`/healthz`), else 0.
    pub caught_up: Gauge,
    /// The clusters `services` has a series for.
    known_clusters: std::sync::Mutex<std::collections::HashSet<ClusterLabels>>,
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Self {
        let mut m = Self {
            registry: Registry::with_prefix("vipwatch_haproxy"),
            reloads: Family::default(),
            runtime_updates: Counter::default(),
            apply_seconds: Histogram::new([0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]),
            rejected: Counter::default(),
            deliveries: Family::default(),
            services: Family::default(),
            cluster_conflicts: Family::default(),
            cluster_takeovers: Family::default(),
            workers: Gauge::default(),
            up: Gauge::default(),
            restarts: Counter::default(),
            caught_up: Gauge::default(),
            known_clusters: Default::default(),
        };
        let r = &mut m.registry;
        r.register(
            "reloads",
            "HAProxy reloads by `result`: `ok` (confirmed by `show proc`) or `failed`",
            m.reloads.clone(),
        );
        r.register(
            "runtime_updates",
            "Member changes applied through the Runtime API, without a reload",
            m.runtime_updates.clone(),
        );
        r.register(
            "apply_seconds",
            "Time from a delivery received to its change live in HAProxy",
            m.apply_seconds.clone(),
        );
        r.register(
            "rejected_services",
            "Deliveries refused for good (422): a Service HAProxy can never serve",
            m.rejected.clone(),
        );
        r.register(
            "deliveries",
            "Deliveries by the HTTP `status` answered (`200`, `401`, `422`, `503`, ...)",
            m.deliveries.clone(),
        );
        r.register(
            "services",
            "Services in the applied configuration, per `cluster` (every cluster the agent knows, 0 when it has none)",
            m.services.clone(),
        );
        r.register(
            "cluster_conflicts",
            "Deliveries refused (409) because another vipwatch (another event log) holds the `cluster` name",
            m.cluster_conflicts.clone(),
        );
        r.register(
            "cluster_takeovers",
            "Takeovers of a `cluster` name by a new event log after the bound one fell silent (a vipwatch whose \
             database was replaced, or a second vipwatch claiming a quiet cluster's name)",
            m.cluster_takeovers.clone(),
        );
        r.register("workers", "HAProxy workers, old ones still draining included", m.workers.clone());
        r.register("up", "1 while the HAProxy master answers its CLI and runs a worker, else 0", m.up.clone());
        r.register(
            "restarts",
            "HAProxy started again by the agent after its master exited (killed, crashed, or its worker died)",
            m.restarts.clone(),
        );
        r.register(
            "caught_up",
            "1 once a full resync of every cluster the agent waits for went live since it started, else 0 \
             (`/healthz` answers 503 meanwhile)",
            m.caught_up.clone(),
        );
        m
    }

    /// Every metric as a scrape shows it once each family has a series (its labels empty): the
    /// metrics reference (docs/reference/metrics.md) is generated from it.
    pub fn reference_exposition() -> String {
        let m = Self::new();
        let _ = m.reloads.get_or_create(&Default::default());
        let _ = m.deliveries.get_or_create(&Default::default());
        let _ = m.services.get_or_create(&Default::default());
        let _ = m.cluster_conflicts.get_or_create(&Default::default());
        let _ = m.cluster_takeovers.get_or_create(&Default::default());
        m.render()
    }

    /// The OpenMetrics text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

impl Metrics {
    /// Sets `vipwatch_haproxy_services{cluster}` to `counts` (by cluster; `None`: unclaimed), and
    /// removes the series of clusters no longer there.
    pub fn set_services(&self, counts: &std::collections::BTreeMap<Option<String>, usize>) {
        let label = |c: &Option<String>| ClusterLabels { cluster: c.clone().unwrap_or_default() };
        let wanted: std::collections::HashSet<ClusterLabels> = counts.keys().map(label).collect();
        let mut stale = self.known_clusters.lock().unwrap_or_else(|p| p.into_inner());
        for gone in stale.difference(&wanted) {
            self.services.remove(gone);
        }
        for (c, n) in counts {
            self.services.get_or_create(&label(c)).set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
        *stale = wanted;
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
