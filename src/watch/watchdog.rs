//! The watchdog: a tower layer on the Kubernetes client that reports every list and watch request of
//! the watch scopes to [`WatchHealth`], and bounds in time what kube-runtime and kube-client leave
//! unbounded.
//!
//! Who keeps a watch scope alive, concern by concern (docs/explanation/recording.md, "Watch health",
//! has the same table for operators):
//!
//! | concern | handled by | why there |
//! |---|---|---|
//! | a watch stream with no event for `watch_timeout + 5 s`: dropped, re-watched from the last resourceVersion | kube-runtime (`watcher`'s idle timeout, from `watcher::Config::timeout`) | the watcher owns the stream and its resourceVersion |
//! | resuming after a cut stream, re-listing after `410 Gone` | kube-runtime (`watcher`) | its state machine |
//! | BOOKMARKs, 500-object list pages, quorum reads | kube-runtime (`watcher::Config` defaults) | the defaults client-go uses |
//! | backoff between failed requests and between relists that gave no working watch | kube-runtime (`default_backoff`, `DefaultBackoff`; [`super::stream`]) | client-go's reflector schedule |
//! | retry of 429/503/504, auth, base URL, TLS | kube-client (its layers, `Config::default_retry`) | configured from the kubeconfig |
//! | connect timeout, TCP keepalive | vipwatch's connector ([`super::client`]) | kube-client's default connector takes a connect timeout but not keepalive |
//! | the response head of a watch within `watch_timeout + 5 s` | this layer | the watcher's idle timeout starts once the head is in; kube-client's `read_timeout` would also cut quiet healthy watches |
//! | a whole list response (head and body) within `list_timeout` | this layer | neither bounds a list: a proxy that stops forwarding mid-list would hold the scope forever |
//! | what each scope did last, stalls counted (`/readyz`, `GET /api/v1/status`, metrics) | this layer | only the HTTP layer sees every request, byte and drop; the watcher resumes silently |
//! | a safety-net relist every `relist_interval`, a relist after a malformed line | the scope task ([`super::stream`]) | kube-runtime relists only on `410 Gone` |
//!
//! A request that misses one of this layer's deadlines fails with [`Stalled`] (the connection is
//! dropped), which the watcher treats like any other error: it retries after its backoff. A watch
//! body the watcher drops after waiting `watch_timeout + 5 s` for an event is reported as stalled
//! here ([`Guarded`]'s drop); the watcher resumes it itself. Other requests (the publisher's writes,
//! single-object reads) pass through untouched.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};
use tower::{BoxError, Layer, Service};

use super::health::{Verb, WatchHealth};
use super::stream::{Resource, ScopeSpec};

/// What kube-runtime's watcher adds to the server-side watch timeout (`watcher::Config::timeout`)
/// before it drops a stream that sent no event: its private `WATCH_IDLE_TIMEOUT_MARGIN`. The same
/// bound applies here to a watch's response head, and a stall is reported with it.
pub const WATCH_SLACK: Duration = Duration::from_secs(5);

/// A list or watch got nothing within its deadline.
#[derive(Debug, thiserror::Error)]
#[error("{} stalled: nothing received from the apiserver for {}", verb.as_str(), humantime::format_duration(*silent))]
pub struct Stalled {
    /// Which request.
    pub verb: Verb,
    /// How long it was silent.
    pub silent: Duration,
}

/// Whether `err` or anything it wraps (through `source()` and `io::Error` payloads) is a [`Stalled`].
pub fn is_stall(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(err);
    while let Some(e) = next {
        if e.is::<Stalled>() {
            return true;
        }
        if let Some(inner) = e.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref())
            && is_stall(inner)
        {
            return true;
        }
        next = e.source();
    }
    false
}

/// The layer: deadlines from `[kubernetes]`, reports to `health`.
#[derive(Clone)]
pub struct Watchdog {
    health: WatchHealth,
    watch_idle: Duration,
    list_timeout: Duration,
}

impl Watchdog {
    /// A watch's head must come within `watch_timeout` + [`WATCH_SLACK`] (the watcher's idle bound
    /// for its events); a list's head and body within `list_timeout`.
    pub fn new(health: WatchHealth, watch_timeout: Duration, list_timeout: Duration) -> Self {
        Self { health, watch_idle: watch_timeout + WATCH_SLACK, list_timeout }
    }
}

impl<S> Layer<S> for Watchdog {
    type Service = WatchdogService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        WatchdogService { inner, dog: self.clone() }
    }
}

/// The service [`Watchdog`] wraps around the client.
#[derive(Clone)]
pub struct WatchdogService<S> {
    inner: S,
    dog: Watchdog,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, ReqB, B> Service<Request<ReqB>> for WatchdogService<S>
where
    S: Service<Request<ReqB>, Response = Response<B>>,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<Guarded<B>>;
    type Error = BoxError;
    type Future = BoxFuture<Result<Self::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        let target = target(request.method(), request.uri());
        let future = self.inner.call(request);
        let dog = self.dog.clone();
        Box::pin(async move {
            let Some((spec, verb)) = target else {
                return Ok(future.await.map_err(Into::into)?.map(Guarded::plain));
            };
            let bound = if verb == Verb::Watch { dog.watch_idle } else { dog.list_timeout };
            let deadline = Instant::now() + bound;
            let response = match tokio::time::timeout_at(deadline, future).await {
                Err(_) => {
                    dog.health.stalled(&spec, verb, bound);
                    return Err(Stalled { verb, silent: bound }.into());
                }
                Ok(Err(e)) => {
                    let e: BoxError = e.into();
                    dog.health.failed(&spec, verb, &e.to_string());
                    return Err(e);
                }
                Ok(Ok(response)) => response,
            };
            if response.status().is_success() {
                dog.health.opened(&spec, verb);
            } else {
                dog.health.refused(&spec, verb, response.status().as_u16());
            }
            let list_deadline = (verb == Verb::List).then(|| Box::pin(tokio::time::sleep_until(deadline)));
            let watched = Watched { spec, verb, health: dog.health, bound, list_deadline, waiting_since: None };
            Ok(response.map(|body| Guarded { inner: body, watch: Some(watched), dead: false }))
        })
    }
}

/// Which watch scope and verb a request serves: a `GET` of `/api/v1/[namespaces/NS/]services`,
/// `/api/v1/nodes` or `/apis/discovery.k8s.io/v1/[namespaces/NS/]endpointslices`, a watch when the
/// query has `watch=true` (or `watch=1`). `None` for anything else.
pub fn target(method: &Method, uri: &http::Uri) -> Option<(ScopeSpec, Verb)> {
    if method != Method::GET {
        return None;
    }
    let path = uri.path();
    let (core, rest) = match path.strip_prefix("/api/v1/") {
        Some(rest) => (true, rest),
        None => (false, path.strip_prefix("/apis/discovery.k8s.io/v1/")?),
    };
    let segments: Vec<&str> = rest.split('/').collect();
    let (namespace, collection) = match segments.as_slice() {
        [collection] => (None, *collection),
        ["namespaces", ns, collection] if !ns.is_empty() => (Some((*ns).to_owned()), *collection),
        _ => return None,
    };
    let resource = match (core, collection) {
        (true, "services") => Resource::Services,
        (true, "nodes") if namespace.is_none() => Resource::Nodes,
        (false, "endpointslices") => Resource::EndpointSlices,
        _ => return None,
    };
    let watch = uri.query().is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
    Some((ScopeSpec { resource, namespace }, if watch { Verb::Watch } else { Verb::List }))
}

/// A response body; for a watch scope's list or watch it reports to [`WatchHealth`], and a list's
/// body ends with [`Stalled`] at the list's deadline.
pub struct Guarded<B> {
    inner: B,
    /// Set while a list or watch body is open (not yet ended, failed or stalled).
    watch: Option<Watched>,
    /// Set after a list stalled: the body reports its end without reading further.
    dead: bool,
}

struct Watched {
    spec: ScopeSpec,
    verb: Verb,
    health: WatchHealth,
    /// The request's bound: `watch_timeout + 5 s` for a watch, `list_timeout` for a list.
    bound: Duration,
    /// A list's deadline: `list_timeout` after its request.
    list_deadline: Option<Pin<Box<Sleep>>>,
    /// Since when the reader has been waiting for the next watch event: set by the first poll that
    /// found nothing after a frame holding a line end, the end of an event. A frame with part of
    /// an event only does not reset it: the watcher's idle timeout counts from the last whole event.
    waiting_since: Option<Instant>,
}

impl<B> Guarded<B> {
    fn plain(inner: B) -> Self {
        Self { inner, watch: None, dead: false }
    }
}

impl<B> Body for Guarded<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if this.dead {
            return Poll::Ready(None);
        }
        let Some(w) = this.watch.as_mut() else {
            return Pin::new(&mut this.inner).poll_frame(cx).map_err(Into::into);
        };
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                w.health.received(&w.spec);
                if frame.data_ref().is_some_and(|data| data.contains(&b'\n')) {
                    w.waiting_since = None;
                }
                return Poll::Ready(Some(Ok(frame)));
            }
            Poll::Ready(Some(Err(e))) => {
                let e: BoxError = e.into();
                w.health.failed(&w.spec, w.verb, &e.to_string());
                this.watch = None;
                return Poll::Ready(Some(Err(e)));
            }
            Poll::Ready(None) => {
                w.health.finished(&w.spec, w.verb);
                this.watch = None;
                return Poll::Ready(None);
            }
            Poll::Pending => {}
        }
        w.waiting_since.get_or_insert_with(Instant::now);
        if !w.list_deadline.as_mut().is_some_and(|d| d.as_mut().poll(cx).is_ready()) {
            return Poll::Pending;
        }
        let (verb, silent) = (w.verb, w.bound);
        w.health.stalled(&w.spec, verb, silent);
        // From now on the body is over: the reader sees this error, then the end, and drops the
        // connection with it.
        this.watch = None;
        this.dead = true;
        Poll::Ready(Some(Err(Stalled { verb, silent }.into())))
    }

    fn is_end_stream(&self) -> bool {
        self.dead || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B> Drop for Guarded<B> {
    /// A watch body dropped before its end: by the watcher after its idle timeout (a stall), or by
    /// the scope's task restarting the watcher (a relist, a shutdown). Told apart by how long the
    /// reader had been waiting for an event: past `watch_timeout` plus half the slack the server
    /// should have ended a healthy stream, so it was silent; the other drops come while events flow
    /// or within the server's timeout.
    fn drop(&mut self) {
        let Some(w) = self.watch.take().filter(|w| w.verb == Verb::Watch) else { return };
        let waited = w.waiting_since.map(|since| since.elapsed());
        if waited.is_some_and(|waited| waited + WATCH_SLACK / 2 >= w.bound) {
            w.health.stalled(&w.spec, Verb::Watch, w.bound);
        } else {
            w.health.left(&w.spec);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use http_body_util::{BodyExt, StreamBody};
    use tokio::sync::mpsc;
    use tokio_stream::wrappers::ReceiverStream;
    use tower::ServiceExt;

    use super::*;
    use std::sync::Arc;

    use crate::metrics::Metrics;
    use crate::watch::health::ScopeState;

    type TestBody = StreamBody<ReceiverStream<Result<Frame<Bytes>, Infallible>>>;
    type Feed = mpsc::Sender<Result<Frame<Bytes>, Infallible>>;
    type Dog = tower::util::BoxCloneService<Request<()>, Response<Guarded<TestBody>>, BoxError>;

    const WATCH: &str = "/api/v1/services?watch=true&timeoutSeconds=2";
    const LIST: &str = "/api/v1/services?limit=500";

    /// `watch_timeout` 2 s (so 7 s for a watch) and `list_timeout` 3 s.
    fn watchdog<S>(health: &WatchHealth, apiserver: S) -> Dog
    where
        S: Service<Request<()>, Response = Response<TestBody>, Error = Infallible> + Clone + Send + 'static,
        S::Future: Send + 'static,
    {
        let dog = Watchdog::new(health.clone(), Duration::from_secs(2), Duration::from_secs(3));
        tower::util::BoxCloneService::new(dog.layer(apiserver))
    }

    /// The watchdog over an apiserver that answers every request at once, with a body fed through
    /// the sender the returned receiver gets for it.
    fn answering(health: &WatchHealth) -> (Dog, mpsc::UnboundedReceiver<Feed>) {
        let (bodies, feeds) = mpsc::unbounded_channel();
        let apiserver = tower::service_fn(move |_: Request<()>| {
            let (tx, rx) = mpsc::channel(16);
            bodies.send(tx).unwrap();
            std::future::ready(Ok(Response::new(StreamBody::new(ReceiverStream::new(rx)))))
        });
        (watchdog(health, apiserver), feeds)
    }

    fn health() -> (WatchHealth, Arc<Metrics>) {
        let metrics = Metrics::new();
        (WatchHealth::new(metrics.clone(), Duration::from_secs(30)), metrics)
    }

    fn get(uri: &str) -> Request<()> {
        Request::get(uri).body(()).unwrap()
    }

    fn data(text: &str) -> Result<Frame<Bytes>, Infallible> {
        Ok(Frame::data(Bytes::from(text.to_owned())))
    }

    fn of(method: Method, uri: &str) -> Option<(ScopeSpec, Verb)> {
        target(&method, &uri.parse().unwrap())
    }

    /// Waits `secs` for the next frame of `body`, which must not come.
    async fn wait(body: &mut Guarded<TestBody>, secs: u64) {
        assert!(tokio::time::timeout(Duration::from_secs(secs), body.frame()).await.is_err(), "nothing came");
    }

    fn state(health: &WatchHealth) -> (ScopeState, Option<String>) {
        let status = &health.statuses()[0];
        (status.state, status.last_error.clone())
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_whose_head_does_not_come_within_watch_timeout_plus_5_s_fails_as_stalled() {
        let (h, metrics) = health();
        let never =
            tower::service_fn(|_: Request<()>| std::future::pending::<Result<Response<TestBody>, Infallible>>());
        let started = Instant::now();
        let err = watchdog(&h, never).oneshot(get(WATCH)).await.err().expect("no head");
        assert_eq!(started.elapsed(), Duration::from_secs(7));
        assert_eq!(err.to_string(), "watch stalled: nothing received from the apiserver for 7s");
        assert!(is_stall(err.as_ref()));
        assert_eq!(metrics.watch_error_count("*", "stalled"), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_list_body_ends_with_a_stall_list_timeout_after_the_request() {
        let (h, _) = health();
        let (dog, mut feeds) = answering(&h);
        let started = Instant::now();
        let mut body = dog.oneshot(get(LIST)).await.unwrap().into_body();
        let feed = feeds.recv().await.unwrap();
        tokio::time::advance(Duration::from_secs(1)).await;
        feed.send(data("{\"items\":[")).await.unwrap();
        assert!(body.frame().await.unwrap().unwrap().is_data());
        let err = body.frame().await.unwrap().unwrap_err();
        assert_eq!(started.elapsed(), Duration::from_secs(3), "3 s from the request, not from the last chunk");
        assert!(is_stall(err.as_ref()));
        assert!(body.frame().await.is_none(), "over after the stall");
        assert_eq!(state(&h), (ScopeState::Stalled, Some("list stalled: nothing received for 3s".into())));
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_body_dropped_after_waiting_out_the_idle_bound_is_a_stall_and_one_dropped_sooner_is_not() {
        let (h, metrics) = health();
        let (dog, mut feeds) = answering(&h);

        // The watcher reads an event, then waits 7 s for the next one and drops the stream.
        let mut body = dog.clone().oneshot(get(WATCH)).await.unwrap().into_body();
        let feed = feeds.recv().await.unwrap();
        feed.send(data("{\"type\":\"ADDED\"}\n")).await.unwrap();
        body.frame().await.unwrap().unwrap();
        assert_eq!(state(&h), (ScopeState::Watching, None));
        wait(&mut body, 7).await;
        drop(body);
        assert_eq!(state(&h), (ScopeState::Stalled, Some("watch stalled: nothing received for 7s".into())));
        assert_eq!(metrics.watch_error_count("*", "stalled"), 1);

        // Part of an event 3 s into the wait, then nothing: dropped 4 s after that part, 7 s after the
        // watcher began to wait for the event. A stall too.
        let mut body = dog.clone().oneshot(get(WATCH)).await.unwrap().into_body();
        let feed = feeds.recv().await.unwrap();
        wait(&mut body, 3).await;
        feed.send(data("{\"type\":")).await.unwrap();
        body.frame().await.unwrap().unwrap();
        wait(&mut body, 4).await;
        drop(body);
        assert_eq!(metrics.watch_error_count("*", "stalled"), 2);

        // Dropped 4 s into a wait (the scope's task restarting the watcher): not a stall.
        let mut body = dog.oneshot(get(WATCH)).await.unwrap().into_body();
        let _feed = feeds.recv().await.unwrap();
        assert_eq!(state(&h).0, ScopeState::Watching);
        wait(&mut body, 4).await;
        drop(body);
        assert_eq!(metrics.watch_error_count("*", "stalled"), 2);
        assert_eq!(state(&h).0, ScopeState::Watching, "until the next request says otherwise");
    }

    #[test]
    fn list_and_watch_requests_of_the_watched_collections_are_recognised() {
        let services = |ns: Option<&str>| ScopeSpec { resource: Resource::Services, namespace: ns.map(Into::into) };
        assert_eq!(of(Method::GET, "/api/v1/services?limit=500"), Some((services(None), Verb::List)));
        assert_eq!(
            of(Method::GET, "/api/v1/namespaces/shop/services?watch=true&resourceVersion=7&allowWatchBookmarks=true"),
            Some((services(Some("shop")), Verb::Watch))
        );
        assert_eq!(
            of(Method::GET, "/api/v1/nodes?watch=1"),
            Some((ScopeSpec { resource: Resource::Nodes, namespace: None }, Verb::Watch))
        );
        assert_eq!(
            of(Method::GET, "/apis/discovery.k8s.io/v1/namespaces/shop/endpointslices"),
            Some((ScopeSpec { resource: Resource::EndpointSlices, namespace: Some("shop".into()) }, Verb::List))
        );
    }

    #[test]
    fn writes_and_single_objects_pass_through() {
        assert_eq!(of(Method::PATCH, "/api/v1/namespaces/shop/services/a/status"), None);
        assert_eq!(of(Method::GET, "/api/v1/namespaces/shop/services/a"), None);
        assert_eq!(of(Method::GET, "/api/v1/namespaces/shop/events"), None);
        assert_eq!(of(Method::POST, "/api/v1/namespaces/shop/events"), None);
        assert_eq!(of(Method::GET, "/api/v1/namespaces/shop/nodes"), None);
    }

    #[test]
    fn a_stall_is_found_through_io_and_kube_error_wrappers() {
        let stall = || Stalled { verb: Verb::Watch, silent: Duration::from_secs(7) };
        let read = kube::Error::ReadEvents(std::io::Error::other(BoxError::from(stall())));
        assert!(is_stall(&read));
        assert!(is_stall(&kube::Error::Service(stall().into())));
        assert!(!is_stall(&kube::Error::ReadEvents(std::io::Error::other("reset"))));
    }
}
