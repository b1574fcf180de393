//! Kubernetes Events about Services (events.k8s.io/v1, through kube-runtime's event recorder, which
//! also folds repeats into a series).

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::model::Notice;
use crate::model::bounded::bound;

/// The longest Event note the apiserver accepts (`events.k8s.io/v1` validation: 1 KiB).
const NOTE: usize = 1024;

/// Reporting controller name on every Event.
pub const CONTROLLER: &str = "vipwatch.io/controller";

/// Events published through one [`Recorder`] before a fresh one replaces it. The recorder keeps every
/// Event it published for 6 minutes (in a hash map) to fold repeats into a series, so during a first
/// sync of many Services that cache grows with their number. Starting over bounds it, as client-go
/// bounds its event correlator (an LRU); a repeat of an Event published before the restart becomes a
/// new Event instead of a series entry. At 1,024 the cache was still a visible part of the heap's
/// peak in a burst; 256 keeps the repeats that matter (one Service's flapping reason) for a quarter
/// of that (see docs/explanation/design-decisions.md).
const RECORDER_EVENTS: usize = 256;

/// Publishes every notice received until `cancel` or the channel closes. Failures are logged and
/// counted, never retried: an Event is informational.
pub async fn run(
    client: kube::Client,
    mut rx: mpsc::Receiver<Notice>,
    metrics: std::sync::Arc<crate::metrics::Metrics>,
    trust: crate::leader::Trust,
    cancel: CancellationToken,
) {
    let instance = std::env::var("HOSTNAME").ok();
    let reporter = Reporter { controller: CONTROLLER.into(), instance };
    let mut recorder = Recorder::new(client.clone(), reporter.clone());
    let mut published = 0;
    loop {
        let notice = tokio::select! {
            _ = cancel.cancelled() => return,
            n = rx.recv() => match n { Some(n) => n, None => return },
        };
        if !trust.is_valid() {
            return; // this replica's term is over: it writes nothing to Kubernetes any more
        }
        if published == RECORDER_EVENTS {
            recorder = Recorder::new(client.clone(), reporter.clone());
            published = 0;
        }
        published += 1;
        let ok = publish(&recorder, &notice).await;
        metrics.kube_write("event", ok);
    }
}

async fn publish(recorder: &Recorder, n: &Notice) -> bool {
    let event = Event {
        type_: if n.reason.warning() { EventType::Warning } else { EventType::Normal },
        reason: n.reason.as_str().into(),
        // The apiserver refuses a note over 1 KiB; a reason quoting an annotation could be longer.
        note: Some(bound(n.note.clone(), NOTE)),
        action: n.reason.action().into(),
        secondary: None,
    };
    let reference = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Service".into()),
        namespace: Some(n.key.namespace.to_string()),
        name: Some(n.key.name.to_string()),
        uid: Some(n.uid.clone()),
        ..ObjectReference::default()
    };
    match recorder.publish(&event, &reference).await {
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
