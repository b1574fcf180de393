//! Fault switches for the fake apiserver. Every method is thread-safe and takes effect while the server
//! runs; "open watches" means the watch streams open at the time of the call, of every resource, and
//! "requests" means requests to any path.

use std::sync::atomic::{AtomicBool, AtomicU16, AtomicUsize, Ordering};

use tokio::sync::watch;

use super::state::{SharedStore, WatchMsg};

/// The fault switches of one [`super::FakeApiServer`], reached through [`super::FakeApiServer::faults`].
pub struct Faults {
    store: SharedStore,
    /// Bumped to drop every open TCP connection at once.
    conn_epoch: watch::Sender<u64>,
    silent: watch::Sender<bool>,
    refuse: AtomicBool,
    expire_continue: AtomicBool,
    fail_next: AtomicUsize,
    /// Watch requests still to be answered `410 Gone` at connect (see [`Faults::gone_at_watch_start`]).
    gone_watches: AtomicUsize,
    /// HTTP status of the injected failures (500 unless set by [`Faults::fail_requests_with`]).
    fail_status: AtomicU16,
    /// Objects whose writes wait (see [`Faults::hold_writes_to`]).
    held: watch::Sender<std::collections::BTreeSet<String>>,
}

impl Faults {
    pub(crate) fn new(store: SharedStore) -> Faults {
        Faults {
            store,
            conn_epoch: watch::Sender::new(0),
            silent: watch::Sender::new(false),
            refuse: AtomicBool::new(false),
            expire_continue: AtomicBool::new(false),
            fail_next: AtomicUsize::new(0),
            gone_watches: AtomicUsize::new(0),
            fail_status: AtomicU16::new(500),
            held: watch::Sender::new(Default::default()),
        }
    }

    /// Every open watch gets an in-band ERROR line (`Status` with `code: 410`, `reason: "Expired"`, message
    /// `too old resource version: X (Y)` with X = the last resourceVersion that watch delivered and
    /// Y = the current one) and then ends; the history is compacted as by [`Faults::compact_history`], so
    /// a watch from any older resourceVersion also gets the in-band 410 (HTTP 200, ERROR line, end).
    pub fn force_gone(&self) {
        let mut store = self.store.lock().expect("store lock");
        store.compact();
        store.broadcast(|current| WatchMsg::Gone { current });
    }

    /// Drop the event history only: watches from a resourceVersion older than the current one get the
    /// in-band 410; open watches continue.
    pub fn compact_history(&self) {
        self.store.lock().expect("store lock").compact();
    }

    /// On each open watch, the next event line (ADDED/MODIFIED/DELETED that passes the watch's selectors)
    /// is written only partly (the first half of its bytes, no newline) and then the connection is cut
    /// (the chunked body is aborted). The change itself is stored and in the history, so a re-watch from
    /// the last good resourceVersion replays it.
    pub fn cut_next_event_mid_line(&self) {
        self.broadcast(|| WatchMsg::CutNext);
    }

    /// On each open watch, the next event line is replaced by the malformed line
    /// `{"type":"MODIFIED","object":{"kind":` + `\n`; the stream stays open. The change itself is in the
    /// store and the history; only this delivery is broken.
    pub fn corrupt_next_event(&self) {
        self.broadcast(|| WatchMsg::CorruptNext);
    }

    /// Write the line `this is not json\n` on every open watch now (after events already queued for it).
    pub fn send_garbage_line(&self) {
        self.broadcast(|| WatchMsg::Garbage);
    }

    /// While `true`, every new TCP connection is accepted and dropped at once (the client sees EOF before
    /// any response). Switching it on also drops every open connection, which ends all watch streams.
    pub fn refuse_connections(&self, on: bool) {
        self.refuse.store(on, Ordering::SeqCst);
        if on {
            self.conn_epoch.send_modify(|e| *e += 1);
        }
    }

    /// While `true`, list requests carrying a `continue` token answer HTTP 410 with a `Status` body
    /// (`reason: "Expired"`), out-of-band as real servers do for expired continue tokens.
    pub fn expire_continue_tokens(&self, on: bool) {
        self.expire_continue.store(on, Ordering::SeqCst);
    }

    /// While `true`, open and new watches write nothing at all (no events, no bookmarks, no fault lines,
    /// and `timeoutSeconds` does not end them): the stream hangs like a dead proxy. Events are queued,
    /// not lost; when switched off, each stream resumes where it stood.
    pub fn go_silent(&self, on: bool) {
        self.silent.send_replace(on);
    }

    /// Send a BOOKMARK (`{"kind":K,"apiVersion":V,"metadata":{"resourceVersion":"N"}}`, K/V = the watched
    /// resource's, e.g. `Node`/`v1` or `EndpointSlice`/`discovery.k8s.io/v1`; N = the last resourceVersion
    /// that watch has covered) on every open watch that asked `allowWatchBookmarks`.
    pub fn bookmark_now(&self) {
        self.broadcast(|| WatchMsg::Bookmark);
    }

    /// The next `n` watch requests (of any resource) answer HTTP 410 with a `Status` body (`reason:
    /// "Expired"`, message `too old resource version`) at connect, out-of-band, as an apiserver (or a
    /// proxy replaying a stale answer) does when the watch's resourceVersion is gone; lists are not
    /// affected. Replaces any remaining count.
    pub fn gone_at_watch_start(&self, n: usize) {
        self.gone_watches.store(n, Ordering::SeqCst);
    }

    /// Consume one injected watch-start 410; whether this watch request must get it.
    pub(crate) fn take_gone_watch(&self) -> bool {
        self.gone_watches.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok()
    }

    /// The next `n` requests (any path, any method) answer HTTP 500 with a `Status` body
    /// (`reason: "InternalError"`). Replaces any remaining count.
    pub fn fail_requests(&self, n: usize) {
        self.fail_requests_with(500, n);
    }

    /// The next `n` requests (any path, any method) answer HTTP `status` with a `Status` body whose
    /// `reason` is the Kubernetes one for it (`Unauthorized` for 401, `Forbidden` for 403, `NotFound`,
    /// `TooManyRequests`, `ServiceUnavailable`, else `InternalError`), as an apiserver denying a
    /// service account or shedding load answers. Replaces any remaining count and status.
    pub fn fail_requests_with(&self, status: u16, n: usize) {
        self.fail_status.store(status, Ordering::SeqCst);
        self.fail_next.store(n, Ordering::SeqCst);
    }

    /// While `on`, every write (POST, PUT, PATCH, DELETE) whose path names the object `name` (its
    /// last segment, or the one before `/status`) waits before it is applied, like a request stuck
    /// in a slow apiserver; switching it off lets the waiting writes through in order. Other
    /// requests are not affected.
    pub fn hold_writes_to(&self, name: &str, on: bool) {
        self.held.send_modify(|held| {
            if on {
                held.insert(name.to_owned());
            } else {
                held.remove(name);
            }
        });
    }

    /// Waits while writes to the object that `path` names are held ([`Faults::hold_writes_to`]).
    pub(crate) async fn write_allowed(&self, path: &str) {
        let mut segs = path.trim_end_matches('/').rsplit('/');
        let name = match segs.next() {
            Some("status") => segs.next(),
            last => last,
        };
        let Some(name) = name else { return };
        let mut held = self.held.subscribe();
        let _ = held.wait_for(|h| !h.contains(name)).await;
    }

    fn broadcast(&self, msg: impl Fn() -> WatchMsg) {
        self.store.lock().expect("store lock").broadcast(|_| msg());
    }

    /// Whether new connections are being refused.
    pub(crate) fn refusing(&self) -> bool {
        self.refuse.load(Ordering::SeqCst)
    }

    /// Whether continue tokens are expired.
    pub(crate) fn continue_expired(&self) -> bool {
        self.expire_continue.load(Ordering::SeqCst)
    }

    /// Consume one injected failure; the HTTP status to answer if this request must fail.
    pub(crate) fn take_failure(&self) -> Option<u16> {
        let failing = self.fail_next.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
        failing.then(|| self.fail_status.load(Ordering::SeqCst))
    }

    /// A receiver that changes whenever every open connection must be dropped.
    pub(crate) fn conn_epoch(&self) -> watch::Receiver<u64> {
        self.conn_epoch.subscribe()
    }

    /// A receiver of the go-silent switch.
    pub(crate) fn silent(&self) -> watch::Receiver<bool> {
        self.silent.subscribe()
    }
}

impl std::fmt::Debug for Faults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Faults")
            .field("refuse", &self.refusing())
            .field("expire_continue", &self.continue_expired())
            .field("silent", &*self.silent.borrow())
            .field("fail_next", &self.fail_next.load(Ordering::SeqCst))
            .field("held", &*self.held.borrow())
            .finish()
    }
}
