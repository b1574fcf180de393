//! Watch streams: one spawned task per watch turns the store's ordered [`WatchMsg`] channel into compact
//! JSON lines (`{"type":"ADDED","object":{…}}\n`), one body frame each, which hyper writes and flushes as
//! chunks as soon as they are produced.
//!
//! A watch is of one [`Resource`]: the store's channel and history carry every resource's changes, and the
//! task passes on only its own (while its resourceVersion, which bookmarks carry, advances past all of
//! them, as the global counter allows). Fault instructions reach every watch, whatever its resource.
//!
//! The task ends the stream cleanly on `timeoutSeconds`, after an in-band 410, or on server shutdown; it
//! aborts the body (connection cut) for [`super::Faults::cut_next_event_mid_line`]. While the server is
//! silent ([`super::Faults::go_silent`]) it writes nothing and does not time out.

use std::collections::VecDeque;
use std::io;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_stream::wrappers::ReceiverStream;

use super::Shared;
use super::resource::Resource;
use super::selector::Matcher;
use super::state::{EventType, HistEntry, StartFrom, TooOld, WatchMsg};

/// Frames of one watch body; an `Err` aborts the response (the client sees the connection cut).
type Frame = Result<Bytes, io::Error>;

/// What a watch request asked for.
#[derive(Debug, Clone)]
pub(crate) struct WatchSpec {
    /// The watched collection.
    pub resource: Resource,
    pub matcher: Matcher,
    pub from: StartFrom,
    /// `timeoutSeconds`: end the stream cleanly after this long.
    pub timeout: Option<Duration>,
    /// `allowWatchBookmarks=true`.
    pub bookmarks: bool,
    /// `sendInitialEvents=true` (with bookmarks): a BOOKMARK annotated `k8s.io/initial-events-end`
    /// follows the synthetic ADDED events.
    pub initial_events_end: bool,
}

/// Subscribe under the store lock and answer with the streaming response (HTTP 200, chunked JSON lines),
/// or with HTTP 200 + one in-band ERROR 410 line when the requested resourceVersion is too old.
pub(crate) fn start(shared: &Arc<Shared>, spec: WatchSpec) -> Response {
    let sub = shared.store.lock().expect("store lock").subscribe(spec.resource, spec.from);
    let sub = match sub {
        Ok(sub) => sub,
        Err(TooOld { requested, oldest }) => {
            let line = gone_line(requested, oldest);
            return ([(header::CONTENT_TYPE, "application/json")], line).into_response();
        }
    };
    let (tx, rx) = mpsc::channel::<Frame>(64);
    let task = WatchTask {
        shared: shared.clone(),
        id: sub.id,
        resource: spec.resource,
        matcher: spec.matcher,
        initial: sub.initial,
        last_rv: sub.rv,
        msgs: sub.rx,
        out: tx,
        bookmarks: spec.bookmarks,
        end_bookmark_pending: spec.initial_events_end && spec.bookmarks,
        cut_next: false,
        corrupt_next: false,
    };
    tokio::spawn(task.run(spec.timeout));
    let mut resp = Body::from_stream(ReceiverStream::new(rx)).into_response();
    *resp.status_mut() = StatusCode::OK;
    resp.headers_mut().insert(header::CONTENT_TYPE, "application/json".parse().expect("static"));
    resp
}

/// The in-band ERROR line for an expired resourceVersion: `too old resource version: X (Y)`.
pub(crate) fn gone_line(requested: u64, current: u64) -> String {
    let status = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("too old resource version: {requested} ({current})"),
        "reason": "Expired", "code": 410,
    });
    event_line("ERROR", &status)
}

/// `{"type":"<ty>","object":<compact object>}\n` with `type` first, as real servers write it.
fn event_line(ty: &str, object: &Value) -> String {
    format!("{{\"type\":\"{ty}\",\"object\":{object}}}\n")
}

struct WatchTask {
    shared: Arc<Shared>,
    id: u64,
    resource: Resource,
    matcher: Matcher,
    initial: VecDeque<Arc<HistEntry>>,
    /// Highest resourceVersion this watch has covered (delivered or filtered out): bookmarks carry it.
    last_rv: u64,
    msgs: mpsc::UnboundedReceiver<WatchMsg>,
    out: mpsc::Sender<Frame>,
    bookmarks: bool,
    end_bookmark_pending: bool,
    cut_next: bool,
    corrupt_next: bool,
}

impl Drop for WatchTask {
    fn drop(&mut self) {
        if let Ok(mut store) = self.shared.store.lock() {
            store.unsubscribe(self.id);
        }
    }
}

impl WatchTask {
    async fn run(mut self, timeout: Option<Duration>) {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut silent = self.shared.faults.silent();
        let mut shutdown = self.shared.shutdown.clone();
        let every = self.shared.options.bookmark_interval.max(Duration::from_millis(10));
        let mut tick = tokio::time::interval_at(Instant::now() + every, every);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            if *shutdown.borrow_and_update() {
                return;
            }
            if *silent.borrow_and_update() {
                tokio::select! {
                    r = silent.changed() => if r.is_err() { return },
                    r = shutdown.changed() => if r.is_err() { return },
                    _ = self.out.closed() => return,
                }
                continue;
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return;
            }
            if let Some(entry) = self.initial.pop_front() {
                if self.send_event(&entry).await.is_break() {
                    return;
                }
                continue;
            }
            if self.end_bookmark_pending {
                self.end_bookmark_pending = false;
                if self.send_bookmark(true).await.is_break() {
                    return;
                }
                continue;
            }
            let expire = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            let flow = tokio::select! {
                biased;
                r = shutdown.changed() => if r.is_err() { ControlFlow::Break(()) } else { ControlFlow::Continue(()) },
                r = silent.changed() => if r.is_err() { ControlFlow::Break(()) } else { ControlFlow::Continue(()) },
                _ = self.out.closed() => ControlFlow::Break(()),
                _ = expire => ControlFlow::Break(()),
                msg = self.msgs.recv() => match msg {
                    Some(msg) => self.handle(msg).await,
                    None => ControlFlow::Break(()),
                },
                _ = tick.tick(), if self.bookmarks => self.send_bookmark(false).await,
            };
            if flow.is_break() {
                return;
            }
        }
    }

    async fn handle(&mut self, msg: WatchMsg) -> ControlFlow<()> {
        match msg {
            WatchMsg::Event(entry) => self.send_event(&entry).await,
            WatchMsg::Gone { current } => {
                let line = gone_line(self.last_rv, current);
                let _ = self.send(line.into()).await;
                ControlFlow::Break(())
            }
            WatchMsg::CutNext => {
                self.cut_next = true;
                ControlFlow::Continue(())
            }
            WatchMsg::CorruptNext => {
                self.corrupt_next = true;
                ControlFlow::Continue(())
            }
            WatchMsg::Garbage => self.send(Bytes::from_static(b"this is not json\n")).await,
            WatchMsg::Bookmark if self.bookmarks => self.send_bookmark(false).await,
            WatchMsg::Bookmark => ControlFlow::Continue(()),
        }
    }

    async fn send(&self, bytes: Bytes) -> ControlFlow<()> {
        match self.out.send(Ok(bytes)).await {
            Ok(()) => ControlFlow::Continue(()),
            Err(_) => ControlFlow::Break(()),
        }
    }

    async fn send_bookmark(&mut self, initial_end: bool) -> ControlFlow<()> {
        let mut metadata = json!({ "resourceVersion": self.last_rv.to_string() });
        if initial_end {
            metadata["annotations"] = json!({ "k8s.io/initial-events-end": "true" });
        }
        let object =
            json!({ "kind": self.resource.kind(), "apiVersion": self.resource.api_version(), "metadata": metadata });
        self.send(event_line("BOOKMARK", &object).into()).await
    }

    /// Filter one change through the watch's resource and matcher the way the watch cache does, then
    /// write it, applying a pending cut or corruption.
    async fn send_event(&mut self, entry: &HistEntry) -> ControlFlow<()> {
        self.last_rv = self.last_rv.max(entry.rv);
        if entry.resource != self.resource {
            return ControlFlow::Continue(());
        }
        let now = self.matcher.matches(&entry.object);
        let line = match entry.kind {
            EventType::Added | EventType::Deleted if now => event_line(entry.kind.as_str(), &entry.object),
            EventType::Modified => {
                let before = entry.prev.as_ref().is_some_and(|p| self.matcher.matches(p));
                match (before, now) {
                    (true, true) => event_line("MODIFIED", &entry.object),
                    (false, true) => event_line("ADDED", &entry.object),
                    (true, false) => {
                        // Stopped matching: DELETED with the previous state at the new resourceVersion.
                        let mut old = entry.prev.as_deref().cloned().unwrap_or(Value::Null);
                        old["metadata"]["resourceVersion"] = Value::String(entry.rv.to_string());
                        event_line("DELETED", &old)
                    }
                    (false, false) => return ControlFlow::Continue(()),
                }
            }
            _ => return ControlFlow::Continue(()),
        };
        crate::spend(self.shared.options.cpu_per_request / 5);
        if std::mem::take(&mut self.cut_next) {
            return self.cut(line.into_bytes()).await;
        }
        if std::mem::take(&mut self.corrupt_next) {
            return self.send(Bytes::from_static(b"{\"type\":\"MODIFIED\",\"object\":{\"kind\":\n")).await;
        }
        self.send(line.into()).await
    }

    /// Write the first half of `line`, let hyper flush it, then abort the body.
    async fn cut(&self, mut line: Vec<u8>) -> ControlFlow<()> {
        line.truncate((line.len() / 2).max(1));
        if self.send(line.into()).await.is_break() {
            return ControlFlow::Break(());
        }
        // Wait until hyper has taken every frame off the channel, then give it a moment to flush the socket
        // before the abort (an error frame makes hyper drop the connection without flushing).
        let drained = Instant::now() + Duration::from_secs(2);
        while self.out.capacity() < self.out.max_capacity() && Instant::now() < drained {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let _ = self.out.send(Err(io::Error::other("fault injected: watch cut mid-line"))).await;
        ControlFlow::Break(())
    }
}
