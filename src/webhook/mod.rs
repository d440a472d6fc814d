//! The pod-link admission webhook (SPEC §8): an HTTPS server on its own port, served by every
//! replica from the controller's caches. [`tls`] keeps the certificate, [`review`] speaks the
//! AdmissionReview format, [`admit`] answers one review, [`link`] is the decision (pure).

pub mod admit;
pub mod certs;
pub mod link;
pub mod managed;
pub mod memo;
pub mod placement;
pub mod review;
pub mod tls;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONNECTION, CONTENT_LENGTH, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;
use tracing::{debug, info, warn};

pub use admit::Admission;

use crate::listen::{Bounds, Listener};

/// The path the MutatingWebhookConfiguration calls.
pub const PATH: &str = "/pod-link";
/// The largest AdmissionReview read. etcd stores no object over 1.5 MiB (its default
/// `--max-request-bytes`), and a pod create's review carries the pod once, as JSON: a pod that
/// can exist makes a review well under 3 MiB. A larger body is no pod the cluster will keep, or
/// not from the API server: refused with 413 before it is read (the API server then admits the
/// pod unchanged, per `failurePolicy: Ignore`, and storage refuses it).
pub const MAX_BODY: usize = 3 * 1024 * 1024;
/// A connection's TLS handshake and each request must complete within this; the API server's
/// own call timeout (the configuration's `timeoutSeconds`) is shorter still.
const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// The webhook port's bounds: the API server keeps a pool of connections to a webhook, reused
/// while busy; more than this are served once and closed.
const BOUNDS: Bounds = Bounds {
    max_connections: 512,
    idle_timeout: Duration::from_secs(60),
    overflow_timeout: Duration::from_secs(2),
};

/// Reviews read and answered at once, by the size their `Content-Length` announces: every real
/// pod is small (a few KiB; 64 KiB is a pod with very large annotations), and a flood of large
/// bodies must not take the places of small ones. Memory in flight stays under
/// `SMALL_SLOTS × SMALL_BODY + LARGE_SLOTS × MAX_BODY` (24 MiB), twice that while parsed.
const SMALL_BODY: usize = 64 * 1024;
const SMALL_SLOTS: usize = 64;
const LARGE_SLOTS: usize = 6;
/// A review that finds no free place is answered from its first bytes (its uid), without the
/// link: the pod is created unlinked and reported (`PodsNotLinked`), never held or refused.
const UID_PREFIX: usize = 16 * 1024;

/// The places for reviews in flight.
struct Slots {
    small: Arc<Semaphore>,
    large: Arc<Semaphore>,
}

impl Slots {
    fn new() -> Self {
        Slots {
            small: Arc::new(Semaphore::new(SMALL_SLOTS)),
            large: Arc::new(Semaphore::new(LARGE_SLOTS)),
        }
    }

    /// A place for a body of `length` bytes (unknown: a large one), if one is free.
    fn take(&self, length: Option<usize>) -> Option<OwnedSemaphorePermit> {
        let class = match length {
            Some(n) if n <= SMALL_BODY => &self.small,
            _ => &self.large,
        };
        class.clone().try_acquire_owned().ok()
    }
}

/// Serves the webhook on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, tls: Arc<tls::Reloading>, admission: Arc<Admission>) {
    let config = match tls.server_config() {
        Ok(c) => Arc::new(c),
        Err(e) => {
            warn!(error = %e, "webhook TLS configuration failed; the webhook does not serve");
            return;
        }
    };
    let acceptor = TlsAcceptor::from(config);
    let mut listener = Listener::new(listener, BOUNDS);
    let slots = Arc::new(Slots::new());
    info!(addr = ?listener.local_addr(), path = PATH, "pod-link webhook listening");
    loop {
        let conn = listener.accept().await;
        // A response written in two TLS records would otherwise wait for the peer's delayed ACK.
        let _ = conn.stream.set_nodelay(true);
        let acceptor = acceptor.clone();
        let admission = admission.clone();
        let slots = slots.clone();
        tokio::spawn(async move {
            let connections = &admission.metrics.connections;
            if conn.overflow {
                connections.with_label_values(&["overflow"]).inc();
            }
            let handshake = IO_TIMEOUT.min(conn.idle_timeout);
            let (peer, idle_timeout, overflow) = (conn.peer, conn.idle_timeout, conn.overflow);
            let stream = match tokio::time::timeout(handshake, acceptor.accept(conn.stream)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    connections.with_label_values(&["handshake_failed"]).inc();
                    debug!(%peer, error = %e, "webhook TLS handshake failed");
                    return;
                }
                Err(_) => {
                    connections.with_label_values(&["handshake_failed"]).inc();
                    debug!(%peer, "webhook TLS handshake timed out");
                    return;
                }
            };
            connections.with_label_values(&["accepted"]).inc();
            let service = service_fn(move |req| {
                let admission = admission.clone();
                let slots = slots.clone();
                async move {
                    let mut response = handle(req, &admission, &slots).await;
                    // Stopping: the connection closes after this answer, which the caller
                    // knows (it never reuses it), instead of at the process's exit, which can
                    // meet a request already on its way.
                    if admission.draining.load(Ordering::Relaxed) {
                        response
                            .headers_mut()
                            .insert(CONNECTION, HeaderValue::from_static("close"));
                    }
                    Ok::<_, Infallible>(response)
                }
            });
            let served = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(idle_timeout)
                .keep_alive(!overflow)
                .serve_connection(TokioIo::new(stream), service)
                .await;
            if let Err(e) = served {
                debug!(%peer, error = %e, "webhook connection ended with an error");
            }
        });
    }
}

async fn handle(
    req: Request<Incoming>,
    admission: &Admission,
    slots: &Slots,
) -> Response<Full<Bytes>> {
    let start = Instant::now();
    match (req.method(), req.uri().path()) {
        (&Method::POST, PATH) => {}
        (&Method::GET, "/healthz") => return reply(StatusCode::OK, "ok\n"),
        _ => return reply(StatusCode::NOT_FOUND, "not found\n"),
    }
    let length = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if length.is_some_and(|n| n > MAX_BODY) {
        admission.refused("request_too_large", start);
        return reply(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("podgroup-sync: the body is over {MAX_BODY} bytes\n"),
        );
    }
    let Some(_slot) = slots.take(length) else {
        return overloaded(req.into_body(), admission, start).await;
    };
    let body = match read_body(req.into_body(), MAX_BODY).await {
        Ok(b) => b,
        Err(refusal) => return refusal.answer(admission, start),
    };
    match admission.review(&body).await {
        Ok(json) => json_reply(json),
        Err(e) => reply(StatusCode::BAD_REQUEST, format!("podgroup-sync: {e}\n")),
    }
}

/// Answers a review that found no free place: allowed, unchanged, from the uid in its first
/// bytes (the rest is never read); 503 when the uid is not there (the API server then admits
/// the pod unchanged all the same). Counted as `error/overloaded`.
async fn overloaded(
    body: Incoming,
    admission: &Admission,
    start: Instant,
) -> Response<Full<Bytes>> {
    admission.refused("overloaded", start);
    let prefix = read_prefix(body, UID_PREFIX).await;
    match review::uid_from_prefix(&prefix) {
        Some(uid) => {
            warn!(
                uid,
                "webhook at its bound of reviews in flight: pod admitted without a link"
            );
            json_reply(review::response(
                uid,
                None,
                &[
                    "podgroup-sync: webhook overloaded; the pod is not linked to its PodGroup"
                        .into(),
                ],
            ))
        }
        None => reply(
            StatusCode::SERVICE_UNAVAILABLE,
            "podgroup-sync: webhook overloaded\n",
        ),
    }
}

/// Why a body was not read.
enum Refusal {
    TooLarge(String),
    Malformed(String),
    TimedOut,
}

impl Refusal {
    fn answer(self, admission: &Admission, start: Instant) -> Response<Full<Bytes>> {
        let (cause, status, text) = match self {
            Refusal::TooLarge(e) => ("request_too_large", StatusCode::PAYLOAD_TOO_LARGE, e),
            Refusal::Malformed(e) => ("malformed_review", StatusCode::BAD_REQUEST, e),
            Refusal::TimedOut => (
                "malformed_review",
                StatusCode::REQUEST_TIMEOUT,
                "body timed out".to_string(),
            ),
        };
        admission.refused(cause, start);
        warn!(error = %text, cause, "webhook request body refused");
        reply(status, format!("podgroup-sync: {text}\n"))
    }
}

/// The whole body, at most `limit` bytes, within [`IO_TIMEOUT`].
async fn read_body(body: Incoming, limit: usize) -> Result<Bytes, Refusal> {
    match tokio::time::timeout(IO_TIMEOUT, Limited::new(body, limit).collect()).await {
        Ok(Ok(b)) => Ok(b.to_bytes()),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => {
            Err(Refusal::TooLarge(e.to_string()))
        }
        Ok(Err(e)) => Err(Refusal::Malformed(e.to_string())),
        Err(_) => Err(Refusal::TimedOut),
    }
}

/// The first `limit` bytes of a body (fewer if it ends, fails or stalls first).
async fn read_prefix(mut body: Incoming, limit: usize) -> Vec<u8> {
    let mut prefix = Vec::new();
    let deadline = tokio::time::Instant::now() + IO_TIMEOUT;
    while prefix.len() < limit {
        let Ok(Some(Ok(frame))) = tokio::time::timeout_at(deadline, body.frame()).await else {
            break;
        };
        if let Ok(data) = frame.into_data() {
            let take = data.len().min(limit - prefix.len());
            prefix.extend_from_slice(&data[..take]);
        }
    }
    prefix
}

fn json_reply(json: Vec<u8>) -> Response<Full<Bytes>> {
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(json)))
        .expect("response")
}

fn reply(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", "text/plain; charset=utf-8")
        .body(Full::new(body.into()))
        .expect("response")
}
