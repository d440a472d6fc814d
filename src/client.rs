//! The API client every part of the controller shares, with two guarantees kube's own client
//! does not give:
//!
//! - **every request has a deadline** (`--api-timeout-seconds`): a request that gets no complete
//!   answer in time fails, and the requeue, watch and audit backoffs retry it. Watches are the
//!   exception: they are meant to stay open, and kube-runtime's watcher ends one that stays
//!   silent past its server-side timeout.
//! - **with leader election on, every write passes the leader's [`Fence`]**: a write is sent
//!   only while the fence is open, and its deadline ends when the fence closes, which is the
//!   renew deadline after the start of the last successful Lease renewal — strictly before the
//!   Lease can expire and a standby take over. A hung write is abandoned, not left to land late.
//!   The Lease's own requests are exempt (the election bounds them itself).
//! - **it slows down when the API server says so** ([`Throttle`]): a 429 halves the number of
//!   requests (watches and the Lease aside) this process keeps in flight, and the limit does not
//!   grow again until the calm period after it (5 s, or the `Retry-After` if longer) has passed;
//!   then each answered request raises it by one over the limit (additive increase,
//!   multiplicative decrease), up to 32. Nothing is retried silently: the refused request fails,
//!   and its reconcile is requeued no sooner than a second later (the API server's
//!   `Retry-After`).

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use hyper::body::{Body, Frame};
use hyper::{Method, Request, Response, StatusCode};
use prometheus::{IntCounter, IntGauge, Registry};
use tokio::sync::Notify;
use tokio::time::{Instant, Sleep};
use tower::{BoxError, Layer, Service};

/// Until when a replica may write.
#[derive(Debug)]
pub struct Fence(Mutex<Gate>);

#[derive(Debug, Clone, Copy)]
enum Gate {
    /// No leader election: writes always pass.
    Open,
    /// Writes pass until this instant (none yet: closed).
    Until(Option<Instant>),
}

impl Fence {
    /// The fence of a controller without leader election.
    pub fn open() -> Arc<Fence> {
        Arc::new(Fence(Mutex::new(Gate::Open)))
    }

    /// The fence of a candidate: closed until its first renewal.
    pub fn closed() -> Arc<Fence> {
        Arc::new(Fence(Mutex::new(Gate::Until(None))))
    }

    /// Writes may pass until `until` (a renewal).
    pub fn open_until(&self, until: Instant) {
        *self.0.lock().expect("lock") = Gate::Until(Some(until));
    }

    /// Writes stop now (leadership given up).
    pub fn close(&self) {
        *self.0.lock().expect("lock") = Gate::Until(None);
    }

    /// How long writes may still take: `None` without a bound, zero when closed.
    pub fn remaining(&self) -> Option<Duration> {
        match *self.0.lock().expect("lock") {
            Gate::Open => None,
            Gate::Until(None) => Some(Duration::ZERO),
            Gate::Until(Some(t)) => Some(t.saturating_duration_since(Instant::now())),
        }
    }
}

/// What kind of request, for its deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// `watch=true`: no deadline.
    Watch,
    /// GET and the like: the API timeout.
    Read,
    /// POST, PUT, PATCH, DELETE: the API timeout, and the fence.
    Write,
    /// A request on a Lease (the election's own): the API timeout only.
    Lease,
}

/// The class of a request from its method and URI.
pub fn classify(method: &Method, path: &str, query: Option<&str>) -> Class {
    let watch = query.is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
    if watch {
        return Class::Watch;
    }
    if path.starts_with("/apis/coordination.k8s.io/") && path.contains("/leases") {
        return Class::Lease;
    }
    match *method {
        Method::GET | Method::HEAD | Method::OPTIONS => Class::Read,
        _ => Class::Write,
    }
}

/// The deadline of a request of `class` (`None`: none), or why it is not sent.
pub fn deadline(
    class: Class,
    timeout: Duration,
    fence: &Fence,
) -> Result<Option<Duration>, String> {
    match class {
        Class::Watch => Ok(None),
        Class::Read | Class::Lease => Ok(Some(timeout)),
        Class::Write => match fence.remaining() {
            None => Ok(Some(timeout)),
            Some(left) if left.is_zero() => Err(
                "not sent: this replica is not the leader (its Lease renewal is overdue)".into(),
            ),
            Some(left) => Ok(Some(left.min(timeout))),
        },
    }
}

/// The most requests in flight the throttle allows (it starts there).
pub const MAX_IN_FLIGHT: f64 = 32.0;
/// How long after a 429 the limit does not grow (longer if the `Retry-After` says so, up to
/// [`MAX_CALM`]).
const CALM: Duration = Duration::from_secs(5);
const MAX_CALM: Duration = Duration::from_secs(30);

/// The process's share of an API server that sheds load (see the module's description).
pub struct Throttle {
    state: Mutex<Share>,
    freed: Notify,
    /// `podgroup_sync_api_throttled_total`.
    throttled: IntCounter,
    /// `podgroup_sync_api_in_flight_limit`.
    limit: IntGauge,
}

#[derive(Debug)]
struct Share {
    limit: f64,
    in_flight: usize,
    /// No growth of the limit before this (set by a 429).
    calm_until: Option<Instant>,
}

impl Throttle {
    pub fn new(registry: Option<&Registry>) -> Arc<Throttle> {
        let throttled = IntCounter::new(
            "podgroup_sync_api_throttled_total",
            "Requests the API server answered 429 (Too Many Requests), watches and the Lease included; each other one holds new requests for its Retry-After and halves the requests this process keeps in flight",
        )
        .expect("metric");
        let limit = IntGauge::new(
            "podgroup_sync_api_in_flight_limit",
            "The requests to the API server (watches aside) this process keeps in flight at most now: lowered by 429s, raised again by answered requests",
        )
        .expect("metric");
        limit.set(MAX_IN_FLIGHT as i64);
        if let Some(r) = registry {
            r.register(Box::new(throttled.clone())).expect("register");
            r.register(Box::new(limit.clone())).expect("register");
        }
        Arc::new(Throttle {
            state: Mutex::new(Share {
                limit: MAX_IN_FLIGHT,
                in_flight: 0,
                calm_until: None,
            }),
            freed: Notify::new(),
            throttled,
            limit,
        })
    }

    /// A place among the requests in flight; `None` if none frees up before `until`.
    async fn enter(self: &Arc<Self>, until: Instant) -> Option<Place> {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            {
                let mut s = self.state.lock().expect("lock");
                if (s.in_flight as f64) < s.limit.floor() {
                    s.in_flight += 1;
                    return Some(Place(self.clone()));
                }
            }
            if Instant::now() >= until {
                return None;
            }
            tokio::select! {
                _ = &mut freed => {}
                _ = tokio::time::sleep_until(until) => {}
            }
        }
    }

    /// Counts a 429 on a request that does not take part in the share (a watch, the Lease):
    /// every 429 the API server sends this process is in `podgroup_sync_api_throttled_total`.
    fn counted(&self, status: StatusCode) {
        if status == StatusCode::TOO_MANY_REQUESTS {
            self.throttled.inc();
        }
    }

    /// Learns from an answer: a 429 halves the limit and calms it, any other answer raises it
    /// once the calm period is over.
    fn answered(&self, status: StatusCode, retry_after: Option<Duration>) {
        let mut s = self.state.lock().expect("lock");
        let now = Instant::now();
        if status == StatusCode::TOO_MANY_REQUESTS {
            self.throttled.inc();
            s.limit = (s.limit / 2.0).max(1.0);
            let calm = retry_after.unwrap_or_default().clamp(CALM, MAX_CALM);
            s.calm_until = Some(s.calm_until.map_or(now + calm, |c| c.max(now + calm)));
        } else if s.calm_until.is_none_or(|c| now >= c) {
            s.limit = (s.limit + 1.0 / s.limit).min(MAX_IN_FLIGHT);
        }
        self.limit.set(s.limit.floor() as i64);
    }
}

/// A request's place in flight; given back when dropped.
struct Place(Arc<Throttle>);

impl Drop for Place {
    fn drop(&mut self) {
        self.0.state.lock().expect("lock").in_flight -= 1;
        self.0.freed.notify_waiters();
    }
}

/// The seconds of a `Retry-After` header.
fn retry_after<B>(r: &Response<B>) -> Option<Duration> {
    let v = r.headers().get("retry-after")?.to_str().ok()?;
    v.trim().parse::<u64>().ok().map(Duration::from_secs)
}

/// The tower layer that gives requests their deadlines and their share.
#[derive(Clone)]
pub struct Deadlines {
    pub timeout: Duration,
    pub fence: Arc<Fence>,
    pub throttle: Arc<Throttle>,
}

impl<S> Layer<S> for Deadlines {
    type Service = DeadlineService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        DeadlineService {
            inner,
            deadlines: self.clone(),
        }
    }
}

#[derive(Clone)]
pub struct DeadlineService<S> {
    inner: S,
    deadlines: Deadlines,
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for DeadlineService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    ResBody: Body + Send + 'static,
{
    type Response = Response<TimedBody<ResBody>>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Self::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let class = classify(req.method(), req.uri().path(), req.uri().query());
        let limit = match deadline(class, self.deadlines.timeout, &self.deadlines.fence) {
            Ok(l) => l,
            Err(why) => return Box::pin(async move { Err(why.into()) }),
        };
        let Some(limit) = limit else {
            let response = self.inner.call(req);
            let throttle = self.deadlines.throttle.clone();
            return Box::pin(async move {
                let r = response.await.map_err(Into::into)?;
                throttle.counted(r.status());
                Ok(r.map(|b| TimedBody {
                    inner: b,
                    deadline: None,
                }))
            });
        };
        let until = Instant::now() + limit;
        // The Lease's requests never wait behind the others.
        let throttle = (class != Class::Lease).then(|| self.deadlines.throttle.clone());
        let self_throttle = self.deadlines.throttle.clone();
        // The inner service is ready now (poll_ready); the call is made once a place is free.
        let response = self.inner.call(req);
        Box::pin(async move {
            let place = match &throttle {
                Some(t) => match t.enter(until).await {
                    Some(p) => Some(p),
                    None => {
                        return Err(format!(
                            "not sent within {limit:?}: the API server is shedding load (429)"
                        )
                        .into());
                    }
                },
                None => None,
            };
            let r = match tokio::time::timeout_at(until, response).await {
                Ok(r) => r.map_err(Into::into)?,
                Err(_) => {
                    return Err(format!("no answer from the API server within {limit:?}").into());
                }
            };
            match &throttle {
                Some(t) => t.answered(r.status(), retry_after(&r)),
                None => self_throttle.counted(r.status()),
            }
            drop(place);
            let deadline = Some(Box::pin(tokio::time::sleep_until(until)));
            Ok(r.map(|b| TimedBody { inner: b, deadline }))
        })
    }
}

/// A response body that must be read whole before its request's deadline.
pub struct TimedBody<B> {
    inner: B,
    deadline: Option<Pin<Box<Sleep>>>,
}

impl<B> Body for TimedBody<B>
where
    B: Body + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        if let Some(d) = self.deadline.as_mut()
            && d.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(Some(Err(
                "the API server's answer did not arrive in time".into()
            )));
        }
        Pin::new(&mut self.inner).poll_frame(cx).map_err(Into::into)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_classed_by_method_path_and_watch() {
        let q = Some("labelSelector=a&watch=true&resourceVersion=5");
        assert_eq!(classify(&Method::GET, "/api/v1/pods", q), Class::Watch);
        assert_eq!(
            classify(&Method::GET, "/api/v1/pods", Some("limit=100")),
            Class::Read
        );
        assert_eq!(
            classify(&Method::GET, "/api/v1/pods", Some("watch=false")),
            Class::Read
        );
        let pg = "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/a/podgroups/j";
        for m in [Method::POST, Method::PUT, Method::PATCH, Method::DELETE] {
            assert_eq!(classify(&m, pg, None), Class::Write);
        }
        let lease = "/apis/coordination.k8s.io/v1/namespaces/a/leases/podgroup-sync";
        assert_eq!(classify(&Method::PUT, lease, None), Class::Lease);
    }

    #[tokio::test(start_paused = true)]
    async fn writes_pass_only_while_the_fence_is_open_and_end_when_it_closes() {
        let t = Duration::from_secs(30);
        let open = Fence::open();
        assert_eq!(deadline(Class::Write, t, &open), Ok(Some(t)));
        let fence = Fence::closed();
        assert!(
            deadline(Class::Write, t, &fence)
                .unwrap_err()
                .contains("not the leader")
        );
        assert_eq!(deadline(Class::Read, t, &fence), Ok(Some(t)));
        assert_eq!(deadline(Class::Lease, t, &fence), Ok(Some(t)));
        assert_eq!(deadline(Class::Watch, t, &fence), Ok(None));
        fence.open_until(Instant::now() + Duration::from_secs(10));
        assert_eq!(
            deadline(Class::Write, t, &fence),
            Ok(Some(Duration::from_secs(10)))
        );
        tokio::time::advance(Duration::from_secs(4)).await;
        assert_eq!(
            deadline(Class::Write, t, &fence),
            Ok(Some(Duration::from_secs(6)))
        );
        tokio::time::advance(Duration::from_secs(6)).await;
        assert!(
            deadline(Class::Write, t, &fence).is_err(),
            "closed at the renew deadline"
        );
        fence.open_until(Instant::now() + Duration::from_secs(100));
        assert_eq!(
            deadline(Class::Write, t, &fence),
            Ok(Some(t)),
            "never past the API timeout"
        );
        fence.close();
        assert!(deadline(Class::Write, t, &fence).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_429_halves_the_requests_in_flight_and_calms_their_growth() {
        let t = Throttle::new(None);
        let limit = || t.state.lock().unwrap().limit;
        let far = Instant::now() + Duration::from_secs(60);
        let places: Vec<Place> = futures::future::join_all((0..32).map(|_| t.enter(far)))
            .await
            .into_iter()
            .map(Option::unwrap)
            .collect();
        // The 33rd waits for a place, and gets one when a place is freed.
        let waiting = tokio::spawn({
            let t = t.clone();
            async move { t.enter(far).await.is_some() }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        t.answered(StatusCode::TOO_MANY_REQUESTS, Some(Duration::from_secs(1)));
        assert_eq!(limit(), 16.0);
        drop(places);
        assert!(waiting.await.unwrap());
        // Calm: answers do not raise the limit for 5 s.
        t.answered(StatusCode::OK, None);
        assert_eq!(limit(), 16.0);
        tokio::time::advance(Duration::from_secs(5)).await;
        t.answered(StatusCode::OK, None);
        assert!(limit() > 16.0 && limit() < 16.1);
        for _ in 0..5 {
            t.answered(StatusCode::TOO_MANY_REQUESTS, None);
        }
        assert_eq!(limit(), 1.0, "never below one");
        // With every place taken, a request that finds none before its deadline is not sent.
        let one = t.enter(far).await.unwrap();
        assert!(
            t.enter(Instant::now() + Duration::from_secs(1))
                .await
                .is_none()
        );
        drop(one);
        assert_eq!(t.state.lock().unwrap().in_flight, 0);
    }
}
