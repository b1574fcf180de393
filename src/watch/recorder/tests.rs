//! The recorder fed synthetic streams, one step of its shell at a time, with the clock passed in:
//! no apiserver, no database, no channel. Each test asserts every change a step decides, in order.

use std::net::IpAddr;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;
use vipwatch_contract::BackendMode;

use super::super::stream::{Change, Observation, Resource, ScopeSpec, observe};
use super::{Batch, Loaded, Now, Recorder};
use crate::config::{Config, PoolConfig};
use crate::ipam::{Allocator, Pools};
use crate::model::backends::{ModeSetting, ObservedNode, ObservedSlice};
use crate::model::{Assignment, Feedback, Observed, ServiceKey};
use crate::store::{Cleanup, StateChange};
use crate::watch::Ownership;

/// The wall clock at the first step of every test (Unix ms).
const EPOCH_MS: i64 = 1_700_000_000_000;

/// A recorder and the clock its steps are read from.
struct Index {
    recorder: Recorder,
    t0: Instant,
}

impl Index {
    /// A recorder configured by `config` over `scopes`, starting from `loaded`.
    fn new(config: &Config, loaded: Loaded, scopes: &[ScopeSpec]) -> Self {
        let allocator = Allocator::new(Pools::new(&config.pools).expect("valid pools"));
        let ownership = Ownership { allocator, finalizer: config.kubernetes.finalizer };
        let t0 = Instant::now();
        let now = Now { instant: t0, unix_ms: EPOCH_MS };
        Self { recorder: Recorder::new(config, ownership, loaded, scopes, now), t0 }
    }

    /// `ms` milliseconds after the first step, on both clocks.
    fn at(&self, ms: u64) -> Now {
        let unix_ms = EPOCH_MS + i64::try_from(ms).expect("small");
        Now { instant: self.t0 + Duration::from_millis(ms), unix_ms }
    }

    /// One step of the shell at `ms` with the observations that arrived together (none: the timer
    /// of a member recomputation fired); `None` while the recorder buffers them.
    fn step(&mut self, ms: u64, observations: Vec<Observation>) -> Option<Batch> {
        let now = self.at(ms);
        let mut queued = observations;
        let mut batch = self.recorder.begin(&mut queued)?;
        for observation in queued {
            self.recorder.observe(&mut batch, observation, now);
        }
        self.recorder.finish(&mut batch, now);
        Some(batch)
    }

    /// [`Self::step`] once every first list is in.
    fn decide(&mut self, ms: u64, observations: Vec<Observation>) -> Batch {
        self.step(ms, observations).expect("every first list is in")
    }
}

/// Every change of `batch`, in order: `KIND namespace/name uid cause` for an event, `refresh
/// namespace/name resourceVersion`, `node name stored|gone`, `hold namespace/name cause` and `release
/// namespace/name` for the guard's rows.
fn changes(batch: &Batch) -> Vec<String> {
    let line = |c: &StateChange| match c {
        StateChange::Event { key, cause, event, .. } => {
            format!("{} {key} {} {}", event.kind.as_str(), event.uid, cause.as_str())
        }
        StateChange::Refresh { key, tracked } => format!("refresh {key} {}", tracked.resource_version),
        StateChange::Node { name, node } => format!("node {name} {}", if node.is_some() { "stored" } else { "gone" }),
        StateChange::Held { key, held: Some(h) } => format!("hold {key} {}", h.cause.as_str()),
        StateChange::Held { key, held: None } => format!("release {key}"),
    };
    batch.changes.iter().map(line).collect()
}

/// `namespace/name addresses` of every event of `batch`, in order: its VIPs joined by `,`, `-` for
/// none (an allocation pending, or none at all).
fn addresses(batch: &Batch) -> Vec<String> {
    let of = |c: &StateChange| match c {
        StateChange::Event { key, event, .. } => {
            let vips = event.view.allocation.as_ref().map(|a| a.addresses.join(",")).unwrap_or_default();
            Some(format!("{key} {}", if vips.is_empty() { "-" } else { &vips }))
        }
        _ => None,
    };
    batch.changes.iter().filter_map(of).collect()
}

/// `namespace/name members` of every event of `batch`, in order: its pod members' addresses joined
/// by `,`, `-` for none.
fn pod_members(batch: &Batch) -> Vec<String> {
    let of = |c: &StateChange| match c {
        StateChange::Event { key, event, .. } => {
            let pod = event.backends.get(&BackendMode::Pod)?;
            let members: Vec<String> = pod.members().map(|(_, m)| m.address.to_string()).collect();
            Some(format!("{key} {}", if members.is_empty() { "-".to_owned() } else { members.join(",") }))
        }
        _ => None,
    };
    batch.changes.iter().filter_map(of).collect()
}

/// The Kubernetes Events of `batch` as `(reason, namespace/name)`.
fn notices(batch: &Batch) -> Vec<(&'static str, String)> {
    batch.report.notices.kept.iter().map(|n| (n.reason.as_str(), n.key.to_string())).collect()
}

/// A config with members in `mode` and the pool `lab` of `addresses` (none: no pool), and a
/// `backends.window` of 250 ms (the times these tests assert are multiples of it).
fn config(mode: ModeSetting, addresses: &[&str]) -> Config {
    let mut config = Config::default();
    config.backends.mode = mode;
    config.backends.window = Duration::from_millis(250);
    if !addresses.is_empty() {
        config.pools = vec![PoolConfig {
            name: "lab".into(),
            addresses: addresses.iter().map(|a| (*a).to_owned()).collect(),
            auto_assign: true,
            namespaces: Vec::new(),
            service_selector: String::new(),
            avoid_buggy_ips: false,
        }];
    }
    config
}

/// The Service scope of every namespace.
pub(super) fn services() -> ScopeSpec {
    ScopeSpec::services(None)
}

/// A LoadBalancer Service `namespace/name` (uid `u-<name>`) at resourceVersion `rv`: one port `http`,
/// 80 to the Pods' 8080.
pub(super) fn svc(key: &str, rv: &str) -> Value {
    let (namespace, name) = key.split_once('/').expect("namespace/name");
    json!({
        "metadata": {"namespace": namespace, "name": name, "uid": format!("u-{name}"), "resourceVersion": rv},
        "spec": {"type": "LoadBalancer",
                 "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080, "nodePort": 30080}]}
    })
}

/// `svc` with `spec` fields replaced.
fn with_spec(mut service: Value, spec: Value) -> Value {
    for (k, v) in spec.as_object().expect("an object") {
        service["spec"][k] = v.clone();
    }
    service
}

/// The Service as the stream task reports it (judged by the default scope rule).
pub(super) fn observed(service: Value) -> Observed {
    let service = serde_json::from_value(service).expect("a Service");
    observe(service, &Config::default().kubernetes.scope())
}

fn apply(service: Value) -> Observation {
    Observation::Apply(services(), observed(service))
}

fn delete(service: Value) -> Observation {
    Observation::Delete(services(), observed(service))
}

fn list(scope: &ScopeSpec, first: bool, services: Vec<Value>) -> Observation {
    Observation::Listed { scope: scope.clone(), objects: services.into_iter().map(observed).collect(), first }
}

/// An EndpointSlice `name` of `shop/<service>` at `rv`, port `http` 8080, one ready endpoint per
/// address.
fn slice(name: &str, service: &str, rv: &str, addresses: &[&str]) -> ObservedSlice {
    let endpoints: Vec<Value> = addresses
        .iter()
        .map(|a| json!({"addresses": [a], "nodeName": "w1", "conditions": {"ready": true, "serving": true}}))
        .collect();
    let s = json!({
        "metadata": {"namespace": "shop", "name": name, "resourceVersion": rv,
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "protocol": "TCP", "port": 8080}],
        "endpoints": endpoints,
    });
    ObservedSlice::from_slice(&serde_json::from_value(s).expect("an EndpointSlice"))
}

fn slices() -> ScopeSpec {
    ScopeSpec { resource: Resource::EndpointSlices, namespace: None }
}

fn nodes() -> ScopeSpec {
    ScopeSpec { resource: Resource::Nodes, namespace: None }
}

fn node(name: &str, address: &str) -> ObservedNode {
    let n = json!({"metadata": {"name": name, "resourceVersion": "1"},
                   "status": {"addresses": [{"type": "InternalIP", "address": address}]}});
    ObservedNode::from_node(&serde_json::from_value(n).expect("a Node"))
}

/// `shop/svc-00` … `shop/svc-<n-1>` at resourceVersion 1.
fn shop(n: usize) -> Vec<Value> {
    (0..n).map(|i| svc(&format!("shop/svc-{i:02}"), "1")).collect()
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("an address")
}

/// A recorder over every namespace's Services, without members or pools, that took the first list
/// of `first` (its batch returned).
fn started(first: Vec<Value>) -> (Index, Batch) {
    let mut index = Index::new(&config(ModeSetting::None, &[]), Loaded::default(), &[services()]);
    let batch = index.decide(0, vec![list(&services(), true, first)]);
    (index, batch)
}

#[test]
fn a_first_list_then_watch_events() {
    let (mut index, batch) = started(vec![svc("shop/a", "10"), svc("shop/b", "11")]);
    assert_eq!(changes(&batch), ["ADDED shop/a u-a startup", "ADDED shop/b u-b startup"]);
    assert_eq!(batch.report.first_lists, ["*"]);
    let progress = &batch.progress["*"];
    assert_eq!((progress.resource_version.as_deref(), progress.listed), (None, Some(false)));

    let moved = with_spec(svc("shop/a", "12"), json!({"ports": [{"name": "http", "protocol": "TCP", "port": 81}]}));
    let status_only = {
        let mut b = svc("shop/b", "13");
        b["status"] = json!({"loadBalancer": {"ingress": [{"ip": "198.51.100.7"}]}});
        b
    };
    let batch = index
        .decide(10, vec![apply(moved), apply(status_only), delete(svc("shop/b", "14")), apply(svc("shop/c", "15"))]);
    assert_eq!(
        changes(&batch),
        ["MODIFIED shop/a u-a watch", "refresh shop/b 13", "DELETED shop/b u-b watch", "ADDED shop/c u-c watch"]
    );
    let StateChange::Event { event, .. } = &batch.changes[0] else { panic!("an event") };
    assert_eq!(event.changed, ["ports"]);
    assert!(batch.report.first_lists.is_empty());
    let progress = &batch.progress["*"];
    assert_eq!((progress.resource_version.as_deref(), progress.listed), (Some("15"), None));
    assert_eq!(index.recorder.gauges().services_in_scope, 2);
}

#[test]
fn a_relist_after_410_records_what_the_watch_missed_with_cause_relist() {
    let (mut index, _) = started(vec![svc("shop/a", "1"), svc("shop/b", "1"), svc("shop/c", "1")]);
    let a = with_spec(svc("shop/a", "7"), json!({"ports": [{"name": "http", "protocol": "TCP", "port": 81}]}));
    let relist = list(&services(), false, vec![a, svc("shop/b", "1"), svc("shop/d", "8")]);
    let batch = index.decide(10, vec![relist]);
    assert_eq!(changes(&batch), ["MODIFIED shop/a u-a relist", "ADDED shop/d u-d relist", "DELETED shop/c u-c relist"]);
    let progress = &batch.progress["*"];
    assert_eq!((progress.resource_version.as_deref(), progress.listed), (None, Some(true)));
    assert!(batch.report.first_lists.is_empty(), "a relist is not a first list");
    assert!(batch.report.guard_trips.is_empty());
}

#[test]
fn a_uid_flip_between_two_observations_is_a_deleted_then_an_added() {
    let (mut index, _) = started(vec![svc("shop/a", "1"), svc("shop/b", "1")]);
    let mut a = svc("shop/a", "5");
    a["metadata"]["uid"] = json!("u-a2");
    let batch = index.decide(10, vec![apply(a)]);
    assert_eq!(changes(&batch), ["DELETED shop/a u-a watch", "ADDED shop/a u-a2 watch"]);

    // The same, seen only by a relist (the DELETED and the ADDED fell into a 410).
    let mut b = svc("shop/b", "6");
    b["metadata"]["uid"] = json!("u-b2");
    let mut a = svc("shop/a", "5");
    a["metadata"]["uid"] = json!("u-a2");
    let batch = index.decide(20, vec![list(&services(), false, vec![a, b])]);
    assert_eq!(changes(&batch), ["DELETED shop/b u-b relist", "ADDED shop/b u-b2 relist"]);
}

/// Ten tracked; a relist shows two: eight vanished, more than `guard.min_deletions` (5) and more
/// than `guard.max_share` (half) of the ten.
fn tripped() -> Index {
    let (mut index, _) = started(shop(10));
    let batch = index.decide(1_000, vec![list(&services(), false, shop(2))]);
    let held: Vec<String> = (2..10).map(|i| format!("hold shop/svc-{i:02} relist")).collect();
    assert_eq!(changes(&batch), held);
    assert_eq!(batch.report.guard_trips, ["relist"]);
    let warned: Vec<(&str, String)> = (2..10).map(|i| ("DeletionHeld", format!("shop/svc-{i:02}"))).collect();
    assert_eq!(notices(&batch), warned);
    let gauges = index.recorder.gauges();
    assert_eq!((gauges.services_in_scope, gauges.deletions_held), (10, 8));
    index
}

#[test]
fn the_guard_holds_the_deletions_of_a_relist_that_misses_most_services() {
    let mut index = tripped();
    // Missed again before `guard.confirm_after`: still held, nothing recorded, no second trip.
    let batch = index.decide(2_000, vec![list(&services(), false, shop(2))]);
    assert_eq!(changes(&batch), Vec::<String>::new());
    assert!(batch.report.guard_trips.is_empty());
}

#[test]
fn a_held_service_that_reappears_or_is_deleted_on_the_watch_is_let_go() {
    let mut index = tripped();
    let batch = index.decide(2_000, vec![list(&services(), false, shop(3))]);
    assert_eq!(changes(&batch), ["release shop/svc-02"]);
    assert_eq!(batch.report.guard_releases, [("reappeared", 1)]);

    let batch = index.decide(3_000, vec![apply(svc("shop/svc-03", "2")), delete(svc("shop/svc-04", "3"))]);
    assert_eq!(
        changes(&batch),
        ["release shop/svc-03", "refresh shop/svc-03 2", "release shop/svc-04", "DELETED shop/svc-04 u-svc-04 watch"]
    );
    assert_eq!(batch.report.guard_releases, [("reappeared", 1), ("confirmed", 1)]);
    assert_eq!(index.recorder.gauges().deletions_held, 5);
}

#[test]
fn a_list_after_confirm_after_records_the_held_deletions() {
    let mut index = tripped();
    let confirm_after = 600_000;
    let batch = index.decide(1_000 + confirm_after - 1, vec![list(&services(), false, shop(2))]);
    assert_eq!(changes(&batch), Vec::<String>::new());

    let batch = index.decide(1_000 + confirm_after, vec![list(&services(), false, shop(2))]);
    let released = (2..10).map(|i| format!("release shop/svc-{i:02}"));
    let deleted = (2..10).map(|i| format!("DELETED shop/svc-{i:02} u-svc-{i:02} relist"));
    assert_eq!(changes(&batch), released.chain(deleted).collect::<Vec<_>>());
    assert_eq!(batch.report.guard_releases, [("confirmed", 8)]);
    assert_eq!(index.recorder.gauges().deletions_held, 0);
}

#[test]
fn a_release_through_the_api_records_every_held_deletion_with_its_cause() {
    let mut index = tripped();
    let batch = index.decide(2_000, vec![Observation::Feedback(Feedback::ReleaseHeld)]);
    let expected: Vec<String> = (2..10)
        .flat_map(|i| [format!("release shop/svc-{i:02}"), format!("DELETED shop/svc-{i:02} u-svc-{i:02} relist")])
        .collect();
    assert_eq!(changes(&batch), expected);
    assert_eq!(batch.report.guard_releases, [("api", 8)]);
    assert_eq!(index.recorder.gauges().services_in_scope, 2);
}

#[test]
fn deletions_seen_on_a_live_watch_are_never_held() {
    let (mut index, _) = started(shop(10));
    let deletes = (2..10).map(|i| delete(svc(&format!("shop/svc-{i:02}"), "2"))).collect();
    let batch = index.decide(10, deletes);
    let deleted: Vec<String> = (2..10).map(|i| format!("DELETED shop/svc-{i:02} u-svc-{i:02} watch")).collect();
    assert_eq!(changes(&batch), deleted);
    assert!(batch.report.guard_trips.is_empty());
    assert_eq!(index.recorder.gauges().deletions_held, 0);
}

/// A recorder in mode `pod` that took the first lists: `shop/web` with the endpoint 10.244.0.1.
fn pod_mode() -> Index {
    let scopes = [services(), slices()];
    let mut index = Index::new(&config(ModeSetting::Pod, &[]), Loaded::default(), &scopes);
    let first_slices = Change::Listed { items: vec![slice("web-a", "web", "1", &["10.244.0.1"])], first: true };
    let first = vec![list(&services(), true, vec![svc("shop/web", "1")]), Observation::Slice(slices(), first_slices)];
    let batch = index.decide(0, first);
    assert_eq!(changes(&batch), ["ADDED shop/web u-web startup"]);
    assert_eq!(pod_members(&batch), ["shop/web 10.244.0.1"]);
    assert_eq!(batch.report.first_lists, ["endpointslices/*", "*"], "the slices first");
    index
}

fn slice_changed(rv: &str, addresses: &[&str]) -> Observation {
    Observation::Slice(slices(), Change::Apply(slice("web-a", "web", rv, addresses)))
}

#[test]
fn endpoint_churn_within_a_window_is_one_modified() {
    let mut index = pod_mode();
    let batch = index.decide(1_000, vec![slice_changed("2", &["10.244.0.1", "10.244.0.2"])]);
    assert_eq!((changes(&batch), batch.report.members_coalesced), (vec![], 0));
    let batch = index.decide(1_100, vec![slice_changed("3", &["10.244.0.1", "10.244.0.2", "10.244.0.3"])]);
    assert_eq!((changes(&batch), batch.report.members_coalesced), (vec![], 1));
    let batch = index.decide(1_200, vec![slice_changed("4", &["10.244.0.5", "10.244.0.7"])]);
    assert_eq!((changes(&batch), batch.report.members_coalesced), (vec![], 1));
    assert_eq!(index.recorder.next_due(), Some(index.at(1_450).instant), "one window after the last change");

    assert_eq!(changes(&index.decide(1_449, vec![])), Vec::<String>::new());
    let batch = index.decide(1_450, vec![]);
    assert_eq!(changes(&batch), ["MODIFIED shop/web u-web backends"]);
    let StateChange::Event { event, .. } = &batch.changes[0] else { panic!("an event") };
    assert_eq!(event.changed, ["backends"]);
    assert_eq!(pod_members(&batch), ["shop/web 10.244.0.5,10.244.0.7"]);
    assert_eq!(index.recorder.next_due(), None);
}

#[test]
fn endpoint_churn_that_never_pauses_goes_out_after_max_wait() {
    let mut index = pod_mode();
    // A change every 200 ms, shorter than the window (250 ms): due `backends.max_wait` (2 s) after the first.
    for (i, ms) in (2_000..4_000).step_by(200).enumerate() {
        let address = format!("10.244.1.{i}");
        let batch = index.decide(ms, vec![slice_changed(&format!("{}", 10 + i), &[address.as_str()])]);
        assert_eq!(changes(&batch), Vec::<String>::new(), "at {ms} ms");
    }
    assert_eq!(index.recorder.next_due(), Some(index.at(4_000).instant));
    let batch = index.decide(4_000, vec![]);
    assert_eq!(changes(&batch), ["MODIFIED shop/web u-web backends"]);
    assert_eq!(pod_members(&batch), ["shop/web 10.244.1.9"]);

    // A second slice repeating the endpoint leaves the members as they are: nothing recorded, counted.
    let duplicate = Change::Apply(slice("web-b", "web", "30", &["10.244.1.9"]));
    index.decide(5_000, vec![Observation::Slice(slices(), duplicate)]);
    let batch = index.decide(5_250, vec![]);
    assert_eq!((changes(&batch), batch.report.members_unchanged), (vec![], 1));
}

#[test]
fn an_added_in_pod_mode_waits_up_to_a_window_for_its_endpoints() {
    let mut index = pod_mode();
    let batch = index.decide(1_000, vec![apply(svc("shop/api", "5")), apply(svc("shop/lonely", "6"))]);
    assert_eq!(changes(&batch), Vec::<String>::new(), "deferred for their endpoints");
    assert_eq!(index.recorder.next_due(), Some(index.at(1_250).instant));

    let api_slice = Change::Apply(slice("api-a", "api", "7", &["10.244.2.1"]));
    assert_eq!(changes(&index.decide(1_100, vec![Observation::Slice(slices(), api_slice)])), Vec::<String>::new());
    assert_eq!(changes(&index.decide(1_249, vec![])), Vec::<String>::new());

    let batch = index.decide(1_250, vec![]);
    assert_eq!(changes(&batch), ["ADDED shop/api u-api watch", "ADDED shop/lonely u-lonely watch"]);
    assert_eq!(pod_members(&batch), ["shop/api 10.244.2.1", "shop/lonely -"]);
    assert_eq!(notices(&batch), [("UnAvailableLoadBalancer", "shop/lonely".to_owned())]);
}

/// The pool `lab` of 192.0.2.10 and .11; `shop/a` asks for .10.
fn pool_of_two() -> (Index, Batch) {
    let mut index =
        Index::new(&config(ModeSetting::None, &["192.0.2.10-192.0.2.11"]), Loaded::default(), &[services()]);
    let a = with_spec(svc("shop/a", "1"), json!({"loadBalancerIP": "192.0.2.10"}));
    let first = vec![a, svc("shop/b", "1"), svc("shop/d", "1"), svc("shop/c", "1")];
    let batch = index.decide(0, vec![list(&services(), true, first)]);
    (index, batch)
}

#[test]
fn services_wait_for_an_address_and_take_freed_ones_in_namespace_and_name_order() {
    let (mut index, batch) = pool_of_two();
    let names = ["shop/a", "shop/b", "shop/d", "shop/c"];
    let added: Vec<String> = names.iter().map(|k| format!("ADDED {k} u-{} startup", &k[5..])).collect();
    assert_eq!(changes(&batch), added);
    assert_eq!(addresses(&batch), ["shop/a 192.0.2.10", "shop/b 192.0.2.11", "shop/d -", "shop/c -"]);
    let failed = notices(&batch).into_iter().filter(|(r, _)| *r == "AllocationFailed").collect::<Vec<_>>();
    assert_eq!(failed, [("AllocationFailed", "shop/d".to_owned()), ("AllocationFailed", "shop/c".to_owned())]);

    // A DELETED's address stays reserved until the appliance acknowledged it.
    let batch = index.decide(10, vec![delete(svc("shop/b", "2"))]);
    assert_eq!(changes(&batch), ["DELETED shop/b u-b watch"]);
    let usage = &index.recorder.gauges().pool_usage[0];
    assert_eq!((usage.in_use, usage.free, usage.reserved), (2, 0, 1));

    // Acknowledged: the first waiting Service by namespace and name takes it.
    let released =
        Feedback::Released { key: ServiceKey::new("shop", "b"), uid: "u-b".into(), addresses: vec![ip("192.0.2.11")] };
    let batch = index.decide(20, vec![Observation::Feedback(released)]);
    assert_eq!(changes(&batch), ["MODIFIED shop/c u-c allocation"]);
    assert_eq!(addresses(&batch), ["shop/c 192.0.2.11"]);
}

#[test]
fn a_modified_that_takes_an_address_away_keeps_it_reserved_until_acknowledged() {
    let (mut index, _) = pool_of_two();
    // `shop/a` now asks for .11, which `shop/b` holds: it gets none and gives .10 up.
    let a = with_spec(svc("shop/a", "2"), json!({"loadBalancerIP": "192.0.2.11"}));
    let batch = index.decide(10, vec![apply(a)]);
    assert_eq!(changes(&batch), ["MODIFIED shop/a u-a watch"]);
    assert_eq!(addresses(&batch), ["shop/a -"]);
    let usage = &index.recorder.gauges().pool_usage[0];
    assert_eq!((usage.in_use, usage.reserved), (2, 1), ".10 is reserved for the MODIFIED");

    let released =
        Feedback::Released { key: ServiceKey::new("shop", "a"), uid: "u-a".into(), addresses: vec![ip("192.0.2.10")] };
    let batch = index.decide(20, vec![Observation::Feedback(released)]);
    assert_eq!(changes(&batch), ["MODIFIED shop/c u-c allocation"]);
    assert_eq!(addresses(&batch), ["shop/c 192.0.2.10"]);
}

#[test]
fn an_address_the_appliance_assigns_is_a_modified_with_cause_appliance() {
    let (mut index, _) = started(vec![svc("shop/a", "1")]);
    let assigned = Assignment {
        key: ServiceKey::new("shop", "a"),
        uid: "u-a".into(),
        addresses: vec!["203.0.113.9".into()],
        hostname: None,
    };
    let batch = index.decide(10, vec![Observation::Feedback(Feedback::Assigned(assigned))]);
    assert_eq!(changes(&batch), ["MODIFIED shop/a u-a appliance"]);
    assert_eq!(addresses(&batch), ["shop/a 203.0.113.9"]);
}

#[test]
fn a_terminating_service_with_our_finalizer_unknown_to_the_database_gets_exactly_one_deleted() {
    let mut index = Index::new(&config(ModeSetting::None, &["192.0.2.10"]), Loaded::default(), &[services()]);
    let terminating = |rv: &str| {
        let mut s = svc("shop/gone", rv);
        s["metadata"]["deletionTimestamp"] = json!("2024-01-01T00:00:00Z");
        s["metadata"]["finalizers"] = json!(["vipwatch.io/cleanup"]);
        s["status"] = json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.10"}]}});
        s
    };
    let batch = index.decide(0, vec![list(&services(), true, vec![terminating("1"), svc("shop/new", "1")])]);
    assert_eq!(changes(&batch), ["DELETED shop/gone u-gone startup", "ADDED shop/new u-new startup"]);
    let StateChange::Event { cleanup, .. } = &batch.changes[0] else { panic!("an event") };
    assert_eq!(cleanup, &Some(Cleanup { remove_finalizer: true, clear_ingress: vec![] }));
    // The address it still shows is what its DELETED withdraws: nobody takes it before the ack.
    assert_eq!(addresses(&batch), ["shop/gone 192.0.2.10", "shop/new -"]);

    let again = vec![apply(terminating("2")), list(&services(), false, vec![terminating("3"), svc("shop/new", "1")])];
    assert_eq!(changes(&index.decide(10, again)), Vec::<String>::new(), "never a second DELETED");

    let released = Feedback::Released {
        key: ServiceKey::new("shop", "gone"),
        uid: "u-gone".into(),
        addresses: vec![ip("192.0.2.10")],
    };
    let batch = index.decide(20, vec![delete(terminating("4")), Observation::Feedback(released)]);
    assert_eq!(changes(&batch), ["MODIFIED shop/new u-new allocation"]);
    assert_eq!(addresses(&batch), ["shop/new 192.0.2.10"]);
}

#[test]
fn observations_before_every_first_list_are_buffered_and_released_in_order() {
    let scopes = [ScopeSpec::services(Some("a".into())), ScopeSpec::services(Some("b".into())), nodes()];
    // Tracked in a namespace no scope covers any more: its DELETED comes first.
    let old = observed(svc("c/old", "1"));
    let loaded = Loaded { tracked: [(old.key.clone(), old.tracked())].into(), ..Loaded::default() };
    let mut index = Index::new(&config(ModeSetting::None, &[]), loaded, &scopes);

    let first_a = list(&scopes[0], true, vec![svc("a/s1", "1")]);
    let x = Observation::Apply(scopes[0].clone(), observed(svc("a/x", "2")));
    assert!(index.step(0, vec![first_a, x]).is_none());
    let y = Observation::Apply(scopes[0].clone(), observed(svc("a/y", "3")));
    assert!(index.step(10, vec![y]).is_none());
    assert_eq!(index.recorder.next_due(), None);

    let first_b = list(&scopes[1], true, vec![svc("b/s2", "1")]);
    let first_nodes = Observation::Node(nodes(), Change::Listed { items: vec![node("n1", "10.0.0.1")], first: true });
    let batch = index.step(20, vec![first_b, first_nodes]).expect("the last first list");
    assert_eq!(
        changes(&batch),
        [
            "DELETED c/old u-old startup",
            "node n1 stored",
            "ADDED a/s1 u-s1 startup",
            "ADDED a/x u-x watch",
            "ADDED a/y u-y watch",
            "ADDED b/s2 u-s2 startup",
        ]
    );
    assert_eq!(batch.report.first_lists, ["nodes", "a", "b"]);
    assert_eq!(index.recorder.gauges().nodes, (1, 0));
}

/// The shell hands a long list to the writer in segments ([`Recorder::list_object`] one object at a
/// time, the changes taken out every few): the segments together are what the whole list decides,
/// and the list's progress and report stay for the last.
#[test]
fn a_list_in_segments_decides_what_the_whole_list_does() {
    let relisted = || {
        let mut services = shop(6);
        services[1] = svc("shop/svc-01", "2");
        services.pop();
        services.push(svc("shop/new", "3"));
        services
    };
    let (mut whole, _) = started(shop(6));
    let expected = whole.decide(10, vec![list(&services(), false, relisted())]);

    let (mut segmented, _) = started(shop(6));
    let Observation::Listed { scope, objects, first } = list(&services(), false, relisted()) else { unreachable!() };
    let mut batch = segmented.recorder.begin(&mut Vec::new()).expect("started");
    let listing = segmented.recorder.begin_list(scope, &objects, first);
    let mut segments: Vec<Vec<String>> = Vec::new();
    for obs in objects {
        segmented.recorder.list_object(&mut batch, &listing, obs);
        if !batch.changes.is_empty() {
            let segment = Batch { changes: std::mem::take(&mut batch.changes), ..Batch::default() };
            segments.push(changes(&segment));
        }
    }
    segmented.recorder.end_list(&mut batch, listing, segmented.at(10));
    segmented.recorder.finish(&mut batch, segmented.at(10));
    segments.push(changes(&batch));

    assert_eq!(
        segments,
        [
            vec!["refresh shop/svc-01 2"],
            vec!["ADDED shop/new u-new relist"],
            vec!["DELETED shop/svc-05 u-svc-05 relist"]
        ]
    );
    assert_eq!(segments.concat(), changes(&expected));
    assert_eq!(batch.progress, expected.progress);
    assert_eq!(whole.recorder.gauges(), segmented.recorder.gauges());
}
