//! Prometheus metrics (`vipwatch_` prefix), registered once and shared by every layer. Rendered in the
//! Prometheus text format by [`Metrics::render`].

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Labels of `vipwatch_events_total`.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventLabels {
    /// `ADDED`, `MODIFIED`, `DELETED`.
    pub r#type: String,
    /// `watch`, `relist`, `startup`.
    pub cause: String,
}

/// Labels carrying one watch scope: the resource and `*` or a namespace.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ScopeLabels {
    /// `services`, `nodes` or `endpointslices`.
    pub resource: String,
    /// `*` for the cluster-wide watch, else the namespace.
    pub scope: String,
}

/// Labels of `vipwatch_watch_errors_total`.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WatchErrorLabels {
    /// `services`, `nodes` or `endpointslices`.
    pub resource: String,
    /// `*` or the namespace.
    pub scope: String,
    /// `list`, `watch_start`, `gone` (410), `status`, `stream`, `decode`, `no_resource_version`,
    /// `stalled` (a list or watch got no byte within its deadline and was dropped).
    pub kind: String,
}

/// Labels of `vipwatch_store_write_errors_total`.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StoreErrorLabels {
    /// `full`, `io`, `busy`, `locked`, `readonly`, `timeout` or `other` (see `store::FaultKind`).
    pub kind: String,
}

/// Labels of `vipwatch_deliveries_total`.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeliveryLabels {
    /// Endpoint name.
    pub webhook: String,
    /// `succeeded`, `retrying` (attempt failed, will retry) or `failed` (gave up).
    pub outcome: String,
}

/// Labels of `vipwatch_relay_round_seconds`.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RoundLabels {
    /// Endpoint name.
    pub webhook: String,
    /// `waiting` (the round's first attempt finished → the round went to the store) or `store` (the
    /// round went to the store → its outcomes were recorded and the next heads claimed).
    pub stage: String,
}

/// Labels carrying one endpoint.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WebhookLabels {
    /// Endpoint name.
    pub webhook: String,
}

/// Labels of `vipwatch_webhook_receiver_resyncs_total`.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResyncLabels {
    /// Endpoint name.
    pub webhook: String,
    /// `lost_state` or `not_caught_up`.
    pub reason: String,
}

/// Labels of `vipwatch_webhook_circuit_transitions_total`.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CircuitLabels {
    /// Endpoint name.
    pub webhook: String,
    /// The state entered: `open`, `half_open` (a probe went out) or `closed`.
    pub to: String,
}

/// Labels of `vipwatch_http_requests_total`.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    /// The matched route template (e.g. `/api/v1/events/{id}`), or `unmatched`.
    pub route: String,
    /// HTTP method.
    pub method: String,
    /// Response status code.
    pub status: u16,
}

/// Labels of `vipwatch_http_request_duration_seconds`.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    /// The matched route template, or `unmatched`.
    pub route: String,
    /// HTTP method.
    pub method: String,
}

/// Labels of the per-pool gauges.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    /// `[[pools]]` name.
    pub pool: String,
}

/// Labels of `vipwatch_kubernetes_writes_total`.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    /// `status`, `finalizer_add`, `finalizer_remove`, `event`.
    pub kind: String,
    /// `ok` or `error`.
    pub outcome: String,
}

/// Labels of `vipwatch_backend_members`.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MemberLabels {
    /// `nodePort` or `pod`.
    pub mode: String,
    /// `active` or `draining`.
    pub state: String,
}

/// Labels of `vipwatch_nodes`.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabels {
    /// `true` when the Node may carry load-balancer traffic.
    pub eligible: String,
}

/// Labels of `vipwatch_deletion_guard_trips_total`.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GuardTripLabels {
    /// `startup` (the first list, or namespaces no longer watched) or `relist`.
    pub cause: String,
}

/// Labels of `vipwatch_held_deletions_released_total`.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HeldReleaseLabels {
    /// `api` (released by request: DELETED recorded), `confirmed` (a later list confirmed them:
    /// DELETED recorded) or `reappeared` (listed again: no DELETED).
    pub how: String,
}

/// Every metric vipwatch exports. Clone the `Arc` to share.
pub struct Metrics {
    registry: Registry,
    /// `vipwatch_events_total{type,cause}`: events recorded in the event log.
    pub events: Family<EventLabels, Counter>,
    /// `vipwatch_watch_errors_total{scope,kind}`: errors from the watch (never fatal).
    pub watch_errors: Family<WatchErrorLabels, Counter>,
    /// `vipwatch_watch_relists_total{scope}`: full lists after the first one.
    pub relists: Family<ScopeLabels, Counter>,
    /// `vipwatch_watch_restarts_total{scope}`: watcher restarts forced by vipwatch (malformed line,
    /// periodic relist).
    pub watch_restarts: Family<ScopeLabels, Counter>,
    /// `vipwatch_watch_gone_total{scope}`: `410 Gone` answers (expired resourceVersion).
    pub watch_gone: Family<ScopeLabels, Counter>,
    /// `vipwatch_watch_backoffs_total{resource,scope}`: waits before a relist after a list that gave
    /// no working watch.
    pub watch_backoffs: Family<ScopeLabels, Counter>,
    /// `vipwatch_backend_members{mode,state}`: pool members over every in-scope Service.
    pub backend_members: Family<MemberLabels, Gauge>,
    /// `vipwatch_backend_changes_coalesced_total`: EndpointSlice and Node changes folded into a member
    /// update that was already pending for a Service (one MODIFIED instead of several).
    pub backend_coalesced: Counter,
    /// `vipwatch_backend_noop_total`: member recomputations after an input changed that changed nothing
    /// (a slice write that moved, relabelled or duplicated endpoints; a Node update that leaves its
    /// addresses and eligibility as they were).
    pub backend_noop: Counter,
    /// `vipwatch_nodes{eligible}`: Nodes known, by eligibility for load-balancer traffic.
    pub nodes: Family<NodeLabels, Gauge>,
    /// `vipwatch_services_in_scope`: rows in the current-state table.
    pub services_in_scope: Gauge,
    /// `vipwatch_vips_in_use`: distinct VIP addresses over in-scope Services.
    pub vips_in_use: Gauge,
    /// `vipwatch_pool_addresses_in_use{pool}`: distinct addresses of the pool Services use or have
    /// reserved.
    pub pool_in_use: Family<PoolLabels, Gauge>,
    /// `vipwatch_pool_addresses_free{pool}`: usable addresses nobody uses or has reserved (saturates at
    /// 2^63-1).
    pub pool_free: Family<PoolLabels, Gauge>,
    /// `vipwatch_pool_addresses_reserved{pool}`: addresses of the pool only reserved, for a DELETED or an
    /// address-withdrawing MODIFIED the appliance has not acknowledged yet (no other Service may take
    /// them meanwhile; part of `in_use`).
    pub pool_reserved: Family<PoolLabels, Gauge>,
    /// `vipwatch_kubernetes_writes_total{kind,outcome}`: writes back to Kubernetes (status patches,
    /// finalizer changes, Events) by `outcome`: `ok`, `error`, or (Events only) `dropped`, never
    /// attempted because the Event queue ([`crate::model::NOTICE_QUEUE`]) was full.
    pub kube_writes: Family<WriteLabels, Counter>,
    /// `vipwatch_deliveries_total{webhook,outcome}`: delivery attempts by result.
    pub deliveries: Family<DeliveryLabels, Counter>,
    /// `vipwatch_delivery_latency_seconds{webhook}`: event observed → 2xx from the endpoint.
    pub delivery_latency: Family<WebhookLabels, Histogram>,
    /// `vipwatch_outbox_depth{webhook}`: pending deliveries, refreshed on every scrape.
    pub outbox_depth: Family<WebhookLabels, Gauge>,
    /// `vipwatch_outbox_oldest_pending_age_seconds{webhook}`: age of the oldest pending delivery (0 when
    /// none), refreshed on every scrape.
    pub outbox_oldest_age: Family<WebhookLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// `vipwatch_deletions_held`: Service deletions the mass-deletion guard holds now.
    pub deletions_held: Gauge,
    /// `vipwatch_deletion_guard_trips_total{cause}`: lists whose deletions the guard held.
    pub guard_trips: Family<GuardTripLabels, Counter>,
    /// `vipwatch_held_deletions_released_total{how}`: held deletions no longer held, by how.
    pub held_released: Family<HeldReleaseLabels, Counter>,
    /// `vipwatch_http_requests_total{route,method,status}`: API requests answered.
    pub http_requests: Family<HttpLabels, Counter>,
    /// `vipwatch_http_request_duration_seconds{route,method}`: time to the response head.
    pub http_latency: Family<RouteLabels, Histogram>,
    /// `vipwatch_webhook_circuit_open{webhook}`: 1 while the endpoint's circuit is open or half-open
    /// (one probe at a time), 0 while closed.
    pub circuit_open: Family<WebhookLabels, Gauge>,
    /// `vipwatch_webhook_circuit_transitions_total{webhook,to}`: circuit state changes by the state
    /// entered: `open` (the first opening and each failed probe), `half_open` (a probe went out),
    /// `closed`.
    pub circuit_transitions: Family<CircuitLabels, Counter>,
    /// `vipwatch_store_write_errors_total{kind}`: database writes (and `/readyz` write probes) that
    /// failed with a storage fault; every retry counts again.
    pub store_write_errors: Family<StoreErrorLabels, Counter>,
    /// `vipwatch_store_writable`: 1 while the last write (or probe) succeeded, 0 while writes fail.
    pub store_writable: Gauge,
    /// `vipwatch_leader`: 1 while this replica leads (always on SQLite, the only instance), 0 while
    /// it follows (PostgreSQL). Summed over every replica's own scrape: 0 means nobody leads
    /// (`VipwatchNoLeader`).
    pub leader: Gauge,
    /// `vipwatch_watch_synced_timestamp_seconds{resource,scope}`: up to when the scope's data is known
    /// current (Unix seconds; now while its watch is healthy), refreshed on every scrape. What the
    /// `VipwatchNotSynced` alert watches.
    pub watch_synced: Family<ScopeLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// `vipwatch_webhook_throttled_until_seconds{webhook}`: until when the endpoint asked not to be
    /// sent anything (Unix seconds; 0 when it never asked).
    pub throttled_until: Family<WebhookLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// `vipwatch_webhook_throttles_total{webhook}`: answers that asked the endpoint be slowed down.
    pub throttles: Family<WebhookLabels, Counter>,
    /// `vipwatch_webhook_receiver_resyncs_total{webhook, reason}`: full resyncs enqueued because the
    /// endpoint said it is not caught up; `reason` `lost_state` (a new generation of its state) or
    /// `not_caught_up` (a restart, or a resync that did not arrive).
    pub receiver_resyncs: Family<ResyncLabels, Counter>,
    /// `vipwatch_template_removal_held{webhook}`: 1 while a full-state endpoint's removal guard holds
    /// a declaration (confirm it with `POST /api/v1/webhooks/{name}/confirm-removal`), else 0.
    pub template_held: Family<WebhookLabels, Gauge>,
    /// `vipwatch_relay_round_seconds{webhook, stage}`: a slot's turnaround between two deliveries,
    /// by stage (see [`RoundLabels`]); their sum is how long a slot that finished an attempt waits
    /// for its next head.
    pub relay_round: Family<RoundLabels, Histogram>,
}

/// Every `(kind, outcome)` of `vipwatch_kubernetes_writes_total`, shown at 0 from the start: an
/// alert on `increase()` or `rate()` sees the first error or dropped Event only if the series existed
/// before it (Prometheus has no earlier sample to compare a new series with).
pub const KUBE_WRITE_SERIES: &[(&str, &str)] = &[
    ("status", "ok"),
    ("status", "error"),
    ("finalizer_add", "ok"),
    ("finalizer_add", "error"),
    ("finalizer_remove", "ok"),
    ("finalizer_remove", "error"),
    ("event", "ok"),
    ("event", "error"),
    ("event", "dropped"),
];

fn http_histogram() -> Histogram {
    Histogram::new([0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 30.0])
}

fn latency_histogram() -> Histogram {
    Histogram::new([0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0])
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Arc<Self> {
        let mut m = Self {
            registry: Registry::with_prefix("vipwatch"),
            events: Family::default(),
            watch_errors: Family::default(),
            relists: Family::default(),
            watch_restarts: Family::default(),
            watch_gone: Family::default(),
            watch_backoffs: Family::default(),
            backend_members: Family::default(),
            backend_coalesced: Counter::default(),
            backend_noop: Counter::default(),
            nodes: Family::default(),
            services_in_scope: Gauge::default(),
            vips_in_use: Gauge::default(),
            pool_in_use: Family::default(),
            pool_free: Family::default(),
            pool_reserved: Family::default(),
            kube_writes: Family::default(),
            deliveries: Family::default(),
            delivery_latency: Family::new_with_constructor(latency_histogram),
            outbox_depth: Family::default(),
            outbox_oldest_age: Family::default(),
            deletions_held: Gauge::default(),
            guard_trips: Family::default(),
            held_released: Family::default(),
            http_requests: Family::default(),
            http_latency: Family::new_with_constructor(http_histogram),
            circuit_open: Family::default(),
            circuit_transitions: Family::default(),
            store_write_errors: Family::default(),
            store_writable: Gauge::default(),
            leader: Gauge::default(),
            watch_synced: Family::default(),
            template_held: Family::default(),
            relay_round: Family::new_with_constructor(http_histogram),
            throttled_until: Family::default(),
            throttles: Family::default(),
            receiver_resyncs: Family::default(),
        };
        let registry = &mut m.registry;
        registry.register("events", "Events recorded in the event log, by `type` (`ADDED`, `MODIFIED`, `DELETED`) and `cause` (`watch`, `relist`, `startup`, `allocation`, `appliance`, `backends`)", m.events.clone());
        registry.register("watch_errors", "Errors of the Kubernetes watch (never fatal), by `resource` (`services`, `nodes`, `endpointslices`), `scope` (`*` or a namespace) and `kind`: `list`, `watch_start`, `gone` (410), `status`, `stream`, `decode`, `no_resource_version`, `stalled` (a list or watch got no byte within its deadline and was dropped)", m.watch_errors.clone());
        registry.register(
            "watch_relists",
            "Full lists after the first one, by `resource` and `scope`",
            m.relists.clone(),
        );
        registry.register(
            "watch_restarts",
            "Watch restarts forced by vipwatch (a malformed line, the periodic relist), by `resource` and `scope`",
            m.watch_restarts.clone(),
        );
        registry.register(
            "watch_gone",
            "`410 Gone` answers (an expired resourceVersion), by `resource` and `scope`",
            m.watch_gone.clone(),
        );
        registry.register("watch_backoffs", "Waits before a relist, by `resource` and `scope`, after a list that gave no working watch (a `410 Gone` at watch start, a malformed line): 0.8 s doubling to 30 s with jitter, reset after 2 minutes without one", m.watch_backoffs.clone());
        registry.register("backend_members", "Pool members over every in-scope Service, by `mode` (`nodePort`, `pod`) and `state` (`active`, `draining`)", m.backend_members.clone());
        registry.register("backend_changes_coalesced", "EndpointSlice and Node changes folded into a member update already pending for a Service (one MODIFIED instead of several)", m.backend_coalesced.clone());
        registry.register("backend_noop", "Member recomputations after an input changed that changed nothing (a slice write that moved, relabelled or duplicated endpoints; a Node update that leaves its addresses and eligibility as they were)", m.backend_noop.clone());
        registry.register(
            "nodes",
            "Nodes known, by `eligible` (`true` when the Node may carry load-balancer traffic)",
            m.nodes.clone(),
        );
        registry.register("services_in_scope", "Services in the current-state table", m.services_in_scope.clone());
        registry.register("vips_in_use", "Distinct VIP addresses of in-scope Services", m.vips_in_use.clone());
        registry.register(
            "pool_addresses_in_use",
            "Distinct addresses of the `pool` used by Services (reserved ones included)",
            m.pool_in_use.clone(),
        );
        registry.register(
            "pool_addresses_free",
            "Usable addresses of the `pool` that nobody uses or has reserved (saturates at 2^63-1)",
            m.pool_free.clone(),
        );
        registry.register("pool_addresses_reserved", "Addresses of the `pool` only reserved, for a DELETED or an address-withdrawing MODIFIED that the appliance has not acknowledged yet: no other Service may take them meanwhile (part of in use)", m.pool_reserved.clone());
        registry.register("kubernetes_writes", "Writes back to Kubernetes by `kind` (`status`, `finalizer_add`, `finalizer_remove`, `event`) and `outcome`: `ok`, `error`, or (Events only) `dropped`, never attempted because the Event queue was full. Every series exists at 0 from the start", m.kube_writes.clone());
        registry.register("deliveries", "Delivery attempts by `webhook` and `outcome`: `succeeded`, `retrying` (the attempt failed and will be retried), `failed` (given up)", m.deliveries.clone());
        registry.register(
            "delivery_latency_seconds",
            "Time from a change observed to the endpoint's 2xx, by `webhook`",
            m.delivery_latency.clone(),
        );
        registry.register(
            "outbox_depth",
            "Pending deliveries per `webhook`, refreshed on every scrape",
            m.outbox_depth.clone(),
        );
        registry.register(
            "outbox_oldest_pending_age_seconds",
            "Age of the oldest pending delivery per `webhook` (0 when none), refreshed on every scrape",
            m.outbox_oldest_age.clone(),
        );
        registry.register(
            "deletions_held",
            "Service deletions the mass-deletion guard holds now",
            m.deletions_held.clone(),
        );
        registry.register("deletion_guard_trips", "Lists whose deletions the mass-deletion guard held, by `cause`: `startup` (the first list, or namespaces no longer watched) or `relist`", m.guard_trips.clone());
        registry.register("held_deletions_released", "Held deletions no longer held, by `how`: `api` (released by request: DELETED recorded), `confirmed` (a later list confirmed them: DELETED recorded) or `reappeared` (listed again: no DELETED)", m.held_released.clone());
        registry.register("http_requests", "API requests answered, by `route` (the matched route template, e.g. `/api/v1/events/{id}`, or `unmatched`), `method` and `status`", m.http_requests.clone());
        registry.register(
            "http_request_duration_seconds",
            "API request latency to the response head, by `route` and `method`",
            m.http_latency.clone(),
        );
        registry.register(
            "webhook_circuit_open",
            "1 while the `webhook`'s circuit breaker is open or half-open (one probe at a time), 0 while closed",
            m.circuit_open.clone(),
        );
        registry.register("webhook_throttled_until_seconds", "Until when the `webhook` asked not to be sent anything, with a 429 or 503 and `Retry-After` (Unix seconds; 0 when it never asked): no delivery to it starts before then. Throttled while above `time()`", m.throttled_until.clone());
        registry.register(
            "webhook_throttles",
            "Answers (429 or 503 with `Retry-After`) that started or extended a throttle of the `webhook`",
            m.throttles.clone(),
        );
        registry.register("webhook_receiver_resyncs", "Full resyncs of the `webhook` enqueued because it said it is not caught up with this cluster (it answers the identity of its state with each request), by `reason`: `lost_state` (its state has a new generation: a wiped disk, a rebuilt host) or `not_caught_up` (it restarted, or an earlier resync did not arrive)", m.receiver_resyncs.clone());
        registry.register("webhook_circuit_transitions", "Circuit breaker state changes by `webhook` and the state entered, `to`: `open` (the first opening and each failed probe), `half_open` (a probe went out), `closed`", m.circuit_transitions.clone());
        registry.register("store_write_errors", "Database writes (and `/readyz` write probes) that failed with a storage fault, by `kind`: `full`, `io`, `busy`, `locked`, `readonly`, `timeout`, `fenced` (a deposed leader's write) or `other`; every retry counts again", m.store_write_errors.clone());
        registry.register(
            "store_writable",
            "1 while the last database write (or probe) succeeded, 0 while writes fail",
            m.store_writable.clone(),
        );
        registry.register("leader", "1 while this replica leads (always on SQLite, the only instance), 0 while it follows (PostgreSQL). Summed over every replica: 0 means nobody leads", m.leader.clone());
        registry.register("watch_synced_timestamp_seconds", "Up to when each watch scope's data is known current (Unix seconds; now while its watch is healthy), by `resource` and `scope`, refreshed on every scrape", m.watch_synced.clone());
        registry.register(
            "relay_round_seconds",
            "A relay slot's turnaround between two deliveries to a `webhook`, by `stage`: `waiting` (its attempt finished → the round that records it went to the store: the spacing between rounds), `store` (the round went to the store → its outcomes recorded and the next heads claimed: the wait for the write connection and the transaction)",
            m.relay_round.clone(),
        );
        registry.register("template_removal_held", "1 while a full-state `webhook`'s removal guard holds a declaration (confirm it with `POST /api/v1/webhooks/{name}/confirm-removal`), else 0", m.template_held.clone());
        for (kind, outcome) in KUBE_WRITE_SERIES {
            m.kube_writes_of(kind, outcome);
        }
        Arc::new(m)
    }

    /// Counts a throttle of `webhook` and sets its end, `until` (Unix ms).
    pub fn webhook_throttled(&self, webhook: &str, until: i64) {
        let labels = WebhookLabels { webhook: webhook.to_owned() };
        self.throttles.get_or_create(&labels).inc();
        self.throttled_until.get_or_create(&labels).set(until as f64 / 1000.0);
    }

    /// Counts a resync of `webhook` enqueued because it is not caught up (`lost_state`: with a new
    /// generation of its state).
    pub fn receiver_resync(&self, webhook: &str, lost_state: bool) {
        let reason = if lost_state { "lost_state" } else { "not_caught_up" };
        self.receiver_resyncs.get_or_create(&ResyncLabels { webhook: webhook.to_owned(), reason: reason.into() }).inc();
    }

    /// Sets `webhook`'s removal-guard gauge: 1 while a declaration is held.
    pub fn template_held(&self, webhook: &str, held: bool) {
        self.template_held.get_or_create(&WebhookLabels { webhook: webhook.to_owned() }).set(i64::from(held));
    }

    /// Sets `webhook`'s circuit gauge for `state` (`closed`, `open`, `half_open`) and, when
    /// `transition`, counts the change into `state`.
    pub fn circuit(&self, webhook: &str, state: &str, transition: bool) {
        let open = i64::from(state != "closed");
        self.circuit_open.get_or_create(&WebhookLabels { webhook: webhook.to_owned() }).set(open);
        if transition {
            let labels = CircuitLabels { webhook: webhook.to_owned(), to: state.to_owned() };
            self.circuit_transitions.get_or_create(&labels).inc();
        }
    }

    /// Counts one failed database write of `kind` (a `store::FaultKind` label).
    pub fn store_write_error(&self, kind: &str) {
        self.store_write_errors.get_or_create(&StoreErrorLabels { kind: kind.to_owned() }).inc();
    }

    /// Counts one recorded event.
    pub fn event(&self, event_type: &str, cause: &str) {
        let labels = EventLabels { r#type: event_type.to_owned(), cause: cause.to_owned() };
        self.events.get_or_create(&labels).inc();
    }

    /// Sets the usage gauges of `pool`.
    pub fn pool_usage(&self, pool: &str, in_use: u64, free: u128) {
        let labels = PoolLabels { pool: pool.to_owned() };
        self.pool_in_use.get_or_create(&labels).set(i64::try_from(in_use).unwrap_or(i64::MAX));
        self.pool_free.get_or_create(&labels).set(i64::try_from(free).unwrap_or(i64::MAX));
    }

    /// Sets `vipwatch_pool_addresses_reserved{pool}`.
    pub fn pool_reserved(&self, pool: &str, reserved: u64) {
        let labels = PoolLabels { pool: pool.to_owned() };
        self.pool_reserved.get_or_create(&labels).set(i64::try_from(reserved).unwrap_or(i64::MAX));
    }

    /// Counts one write back to Kubernetes.
    pub fn kube_write(&self, kind: &str, ok: bool) {
        self.kube_writes_of(kind, if ok { "ok" } else { "error" }).inc();
    }

    /// Counts `n` Kubernetes Events dropped because the Event queue was full
    /// (`vipwatch_kubernetes_writes_total{kind="event",outcome="dropped"}`).
    pub fn kube_events_dropped(&self, n: usize) {
        self.kube_writes_of("event", "dropped").inc_by(n as u64);
    }

    /// The `vipwatch_kubernetes_writes_total{kind,outcome}` counter (created at 0 if new).
    fn kube_writes_of(&self, kind: &str, outcome: &str) -> Counter {
        self.kube_writes.get_or_create(&WriteLabels { kind: kind.to_owned(), outcome: outcome.to_owned() }).clone()
    }

    /// Counts one delivery attempt of `webhook` with `outcome`.
    pub fn delivery(&self, webhook: &str, outcome: &str) {
        let labels = DeliveryLabels { webhook: webhook.to_owned(), outcome: outcome.to_owned() };
        self.deliveries.get_or_create(&labels).inc();
    }

    /// Records one stage of a relay round (`waiting` or `store`), in seconds.
    pub fn relay_round(&self, webhook: &str, stage: &str, seconds: f64) {
        let labels = RoundLabels { webhook: webhook.to_owned(), stage: stage.to_owned() };
        self.relay_round.get_or_create(&labels).observe(seconds);
    }

    /// Records one event → 2xx latency, in seconds.
    pub fn delivery_latency(&self, webhook: &str, seconds: f64) {
        self.delivery_latency.get_or_create(&WebhookLabels { webhook: webhook.to_owned() }).observe(seconds);
    }

    /// Counts one API request and records its latency (seconds).
    pub fn http_request(&self, route: &str, method: &str, status: u16, seconds: f64) {
        let labels = HttpLabels { route: route.to_owned(), method: method.to_owned(), status };
        self.http_requests.get_or_create(&labels).inc();
        let labels = RouteLabels { route: route.to_owned(), method: method.to_owned() };
        self.http_latency.get_or_create(&labels).observe(seconds);
    }

    /// Sets the outbox gauges of `webhook`: `pending` deliveries, the oldest `oldest_age_seconds` old.
    pub fn outbox(&self, webhook: &str, pending: i64, oldest_age_seconds: f64) {
        let labels = WebhookLabels { webhook: webhook.to_owned() };
        self.outbox_depth.get_or_create(&labels).set(pending);
        self.outbox_oldest_age.get_or_create(&labels).set(oldest_age_seconds);
    }

    /// A scope-labelled counter of the Service watch of `scope` (0 when never incremented); for tests.
    pub fn scope_count(family: &Family<ScopeLabels, Counter>, scope: &str) -> u64 {
        let labels = ScopeLabels { resource: "services".to_owned(), scope: scope.to_owned() };
        family.get(&labels).map(|c| c.get()).unwrap_or(0)
    }

    /// `vipwatch_watch_errors_total` of the Service watch of `scope` and `kind`; for tests and logs.
    pub fn watch_error_count(&self, scope: &str, kind: &str) -> u64 {
        let labels =
            WatchErrorLabels { resource: "services".to_owned(), scope: scope.to_owned(), kind: kind.to_owned() };
        self.watch_errors.get(&labels).map(|c| c.get()).unwrap_or(0)
    }

    /// Every metric as a scrape shows it once each family has a series (its labels empty): `# HELP`
    /// and `# TYPE` lines and at least one sample per metric, which names its labels. The metrics
    /// reference (docs/reference/metrics.md) is generated from it.
    pub fn reference_exposition() -> String {
        let m = Self::new();
        let _ = m.events.get_or_create(&Default::default());
        let _ = m.watch_errors.get_or_create(&Default::default());
        let _ = m.relists.get_or_create(&Default::default());
        let _ = m.watch_restarts.get_or_create(&Default::default());
        let _ = m.watch_gone.get_or_create(&Default::default());
        let _ = m.watch_backoffs.get_or_create(&Default::default());
        let _ = m.backend_members.get_or_create(&Default::default());
        let _ = m.nodes.get_or_create(&Default::default());
        let _ = m.pool_in_use.get_or_create(&Default::default());
        let _ = m.pool_free.get_or_create(&Default::default());
        let _ = m.pool_reserved.get_or_create(&Default::default());
        let _ = m.kube_writes.get_or_create(&Default::default());
        let _ = m.deliveries.get_or_create(&Default::default());
        let _ = m.delivery_latency.get_or_create(&Default::default());
        let _ = m.outbox_depth.get_or_create(&Default::default());
        let _ = m.outbox_oldest_age.get_or_create(&Default::default());
        let _ = m.guard_trips.get_or_create(&Default::default());
        let _ = m.held_released.get_or_create(&Default::default());
        let _ = m.http_requests.get_or_create(&Default::default());
        let _ = m.http_latency.get_or_create(&Default::default());
        let _ = m.circuit_open.get_or_create(&Default::default());
        let _ = m.circuit_transitions.get_or_create(&Default::default());
        let _ = m.store_write_errors.get_or_create(&Default::default());
        let _ = m.watch_synced.get_or_create(&Default::default());
        let _ = m.template_held.get_or_create(&Default::default());
        let _ = m.throttled_until.get_or_create(&Default::default());
        let _ = m.throttles.get_or_create(&Default::default());
        let _ = m.receiver_resyncs.get_or_create(&Default::default());
        let _ = m.relay_round.get_or_create(&Default::default());
        m.render()
    }

    /// The OpenMetrics text exposition (`application/openmetrics-text; version=1.0.0`), which
    /// Prometheus scrapes natively.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
