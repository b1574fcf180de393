//! Kubernetes Events about Services (events.k8s.io/v1), a repeat folded into the earlier Event's
//! series as client-go's event recorder does: only when it is the same Event — same Service, type,
//! reason, action *and note*. kube-runtime's `Recorder` leaves the note out of that comparison, so a
//! Service that got new addresses showed one `IPAllocated` Event with a count of 2 and the first
//! addresses and pool in its note; with the note compared, each new note is an Event of its own.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, Patch, PatchParams, PostParams};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::model::bounded::{bound, one_line};
use crate::model::{Notice, ServiceKey};

/// The longest Event note the apiserver accepts (`events.k8s.io/v1` validation: 1 KiB).
const NOTE: usize = 1024;

/// Reporting controller name on every Event.
pub const CONTROLLER: &str = "vipwatch.io/controller";

/// Events remembered at most to fold repeats into a series; the memory is cleared when it is full.
/// During a first sync of many Services the memory would grow with their number; client-go bounds its
/// event correlator the same way (an LRU). A repeat of an Event published before the clearing becomes
/// a new Event instead of a series entry. At 1,024 the memory was still a visible part of the heap's
/// peak in a burst; 256 keeps the repeats that matter (one Service's flapping reason) for a quarter
/// of that (see docs/explanation/design-decisions.md).
const RECORDER_EVENTS: usize = 256;

/// How long after its last occurrence an Event still takes repeats into its series: client-go's and
/// kube-runtime's 6 minutes.
const SERIES_WINDOW: SignedDuration = SignedDuration::from_mins(6);

/// What makes two notices the same Event (client-go's `eventKey`: regarding object, type, reason,
/// action, note; the reporting controller is always vipwatch).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct EventKey {
    key: ServiceKey,
    uid: String,
    reason: &'static str,
    note: String,
}

/// Publishes Events as vipwatch (`reportingInstance`: `$HOSTNAME`, the pod's name), folding repeats into
/// series.
struct Recorder {
    client: kube::Client,
    instance: String,
    recent: HashMap<EventKey, K8sEvent>,
}

impl Recorder {
    fn new(client: kube::Client) -> Self {
        let instance = std::env::var("HOSTNAME").unwrap_or_else(|_| CONTROLLER.to_owned());
        Self { client, instance, recent: HashMap::new() }
    }

    /// Creates the Event of `n`, or, for a repeat within [`SERIES_WINDOW`] of the same Event, counts it
    /// in that Event's series (a merge patch). Errors: the apiserver's; after a failed patch (the Event
    /// was deleted meanwhile, say) the next repeat creates a new Event.
    async fn publish(&mut self, n: &Notice) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        self.recent.retain(|_, e| last_seen(e).is_some_and(|t| t + SERIES_WINDOW > now));
        if self.recent.len() >= RECORDER_EVENTS {
            self.recent.clear();
        }
        let key = EventKey { key: n.key.clone(), uid: n.uid.clone(), reason: n.reason.as_str(), note: n.note.clone() };
        let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), &n.key.namespace);
        let event = match self.recent.get(&key) {
            Some(earlier) => {
                let mut event = earlier.clone();
                let count = earlier.series.as_ref().map_or(2, |s| s.count + 1);
                event.series = Some(EventSeries { count, last_observed_time: MicroTime(now) });
                let name = event.metadata.name.clone().unwrap_or_default();
                if let Err(e) = api.patch(&name, &PatchParams::default(), &Patch::Merge(&event)).await {
                    self.recent.remove(&key);
                    return Err(e);
                }
                event
            }
            None => {
                let event = self.event(n, now);
                api.create(&PostParams::default(), &event).await?;
                event
            }
        };
        self.recent.insert(key, event);
        Ok(())
    }

    /// A new Event for `n` at `now`.
    fn event(&self, n: &Notice, now: Timestamp) -> K8sEvent {
        let regarding = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Service".into()),
            namespace: Some(n.key.namespace.to_string()),
            name: Some(n.key.name.to_string()),
            uid: Some(n.uid.clone()),
            ..ObjectReference::default()
        };
        K8sEvent {
            metadata: ObjectMeta {
                namespace: Some(n.key.namespace.to_string()),
                name: Some(format!("{}.{:x}", n.key.name, now.as_nanosecond())),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(now)),
            type_: Some(if n.reason.warning() { "Warning" } else { "Normal" }.into()),
            reason: Some(n.reason.as_str().into()),
            action: Some(n.reason.action().into()),
            // The apiserver refuses a note over 1 KiB; a reason quoting an annotation could be longer.
            note: Some(bound(one_line(&n.note).into_owned(), NOTE)),
            regarding: Some(regarding),
            reporting_controller: Some(CONTROLLER.into()),
            reporting_instance: Some(self.instance.clone()),
            ..K8sEvent::default()
        }
    }
}

/// When `e` last occurred: its series' last time, else its own.
fn last_seen(e: &K8sEvent) -> Option<Timestamp> {
    e.series.as_ref().map(|s| s.last_observed_time.0).or_else(|| e.event_time.as_ref().map(|t| t.0))
}

/// Publishes every notice received until `cancel` or the channel closes. Failures are logged and
/// counted, never retried: an Event is informational.
pub async fn run(
    client: kube::Client,
    mut rx: mpsc::Receiver<Notice>,
    metrics: std::sync::Arc<crate::metrics::Metrics>,
    leader_deadline: crate::leader::LeaderDeadline,
    cancel: CancellationToken,
) {
    let mut recorder = Recorder::new(client);
    loop {
        let notice = tokio::select! {
            _ = cancel.cancelled() => return,
            n = rx.recv() => match n { Some(n) => n, None => return },
        };
        if !leader_deadline.is_ahead() {
            return; // this replica's term is over: it writes nothing to Kubernetes any more
        }
        let ok = publish(&mut recorder, &notice).await;
        metrics.kube_write("event", ok);
    }
}

async fn publish(recorder: &mut Recorder, n: &Notice) -> bool {
    match recorder.publish(n).await {
        Ok(()) => {
            debug!(service = %n.key, reason = %n.reason, "published Event");
            true
        }
        Err(e) => {
            warn!(service = %n.key, reason = %n.reason, error = %e, "cannot publish Kubernetes Event");
            false
        }
    }
}
