//! The watchdog: a tower layer on the Kubernetes client that bounds every list and watch request of
//! the watch scopes in time and reports what it sees to [`WatchHealth`].
//!
//! - watch (`GET <collection>?watch=true`): the response head and then each byte of the body must
//!   come within `watch_timeout + 5 s` (the bound docs/explanation/recording.md promises under
//!   "Watch health"; the server ends the stream after `watch_timeout` and sends BOOKMARKs, which
//!   vipwatch asks for, so a healthy stream is never that quiet);
//! - list (`GET <collection>`): the head, each chunk and the whole body within `kubernetes.list_timeout`.
//!
//! On expiry the request fails with [`Stalled`] (the connection is dropped), which kube-runtime's
//! watcher treats like any stream error: it resumes from the last resourceVersion, re-listing on 410.
//! Other requests (the publisher's writes, single-object reads) pass through untouched.

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

/// Slack the client adds to the server-side watch timeout before a silent stream counts as dead.
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
    /// Watch streams get `watch_timeout + 5 s` of silence at most; lists `list_timeout`.
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
            let deadline = if verb == Verb::Watch { dog.watch_idle } else { dog.list_timeout };
            let response = match tokio::time::timeout(deadline, future).await {
                Err(_) => {
                    dog.health.stalled(&spec, verb, deadline);
                    return Err(Stalled { verb, silent: deadline }.into());
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
            let total = (verb == Verb::List).then(|| Box::pin(tokio::time::sleep(dog.list_timeout)));
            Ok(response.map(|body| Guarded {
                inner: body,
                watch: Some(Watched { spec, verb, health: dog.health, idle: deadline, quiet: None, total }),
                dead: false,
            }))
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

/// A response body, with deadlines when it belongs to a watch scope's list or watch.
pub struct Guarded<B> {
    inner: B,
    watch: Option<Watched>,
    /// Set after a stall: the body reports its end without reading further.
    dead: bool,
}

struct Watched {
    spec: ScopeSpec,
    verb: Verb,
    health: WatchHealth,
    /// Longest silence between two chunks.
    idle: Duration,
    /// Fires `idle` after the last chunk (armed on the first poll).
    quiet: Option<Pin<Box<Sleep>>>,
    /// Fires when a list body took `list_timeout` in all.
    total: Option<Pin<Box<Sleep>>>,
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
                w.quiet = None;
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
        let idle = w.idle;
        let quiet = w.quiet.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(Instant::now() + idle)));
        let silent = if quiet.as_mut().poll(cx).is_ready() {
            idle
        } else if let Some(total) = w.total.as_mut()
            && total.as_mut().poll(cx).is_ready()
        {
            w.idle
        } else {
            return Poll::Pending;
        };
        w.health.stalled(&w.spec, w.verb, silent);
        let verb = w.verb;
        // From now on the body is over: the watcher sees this error, then the end of the stream, and
        // drops the connection with it.
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

#[cfg(test)]
mod tests {
    use super::*;

    fn of(method: Method, uri: &str) -> Option<(ScopeSpec, Verb)> {
        target(&method, &uri.parse().unwrap())
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
