//! The pod-link admission webhook (SPEC §8): an HTTPS server on its own port, served by every
//! replica from the controller's caches. [`tls`] keeps the certificate, [`review`] speaks the
//! AdmissionReview format, [`admit`] answers one review, [`link`] is the decision (pure).

pub mod admit;
pub mod link;
pub mod review;
pub mod tls;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, info, warn};

pub use admit::Admission;

/// The path the MutatingWebhookConfiguration calls.
pub const PATH: &str = "/pod-link";
/// The largest AdmissionReview read: a pod is at most ~1.5 MiB in etcd, and a review carries
/// it once (twice for updates, which are not sent here).
pub const MAX_BODY: usize = 4 * 1024 * 1024;
/// A connection's TLS handshake and each request must complete within this; the API server's
/// own call timeout (the configuration's `timeoutSeconds`) is shorter still.
const IO_TIMEOUT: Duration = Duration::from_secs(10);

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
    info!(addr = ?listener.local_addr().ok(), path = PATH, "pod-link webhook listening");
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                warn!(error = %e, "webhook accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // A response written in two TLS records would otherwise wait for the peer's delayed ACK.
        let _ = stream.set_nodelay(true);
        let acceptor = acceptor.clone();
        let admission = admission.clone();
        tokio::spawn(async move {
            let connections = &admission.metrics.connections;
            let stream = match tokio::time::timeout(IO_TIMEOUT, acceptor.accept(stream)).await {
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
                async move { Ok::<_, Infallible>(handle(req, &admission).await) }
            });
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(IO_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            if let Err(e) = conn.await {
                debug!(%peer, error = %e, "webhook connection ended with an error");
            }
        });
    }
}

async fn handle(req: Request<Incoming>, admission: &Admission) -> Response<Full<Bytes>> {
    let start = Instant::now();
    match (req.method(), req.uri().path()) {
        (&Method::POST, PATH) => {}
        (&Method::GET, "/healthz") => return reply(StatusCode::OK, "ok\n"),
        _ => return reply(StatusCode::NOT_FOUND, "not found\n"),
    }
    let body = Limited::new(req.into_body(), MAX_BODY).collect();
    let body = match tokio::time::timeout(IO_TIMEOUT, body).await {
        Ok(Ok(b)) => b.to_bytes(),
        Ok(Err(e)) => {
            let too_large = e
                .downcast_ref::<http_body_util::LengthLimitError>()
                .is_some();
            let cause = if too_large {
                "request_too_large"
            } else {
                "malformed_review"
            };
            admission.refused(cause, start);
            warn!(error = %e, cause, "webhook request body refused");
            let status = if too_large {
                StatusCode::PAYLOAD_TOO_LARGE
            } else {
                StatusCode::BAD_REQUEST
            };
            return reply(status, format!("podgroup-sync: {e}\n"));
        }
        Err(_) => {
            admission.refused("malformed_review", start);
            warn!("webhook request body not received in time");
            return reply(
                StatusCode::REQUEST_TIMEOUT,
                "podgroup-sync: body timed out\n",
            );
        }
    };
    match admission.review(&body).await {
        Ok(json) => Response::builder()
            .status(StatusCode::OK)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(json)))
            .expect("response"),
        Err(e) => reply(StatusCode::BAD_REQUEST, format!("podgroup-sync: {e}\n")),
    }
}

fn reply(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", "text/plain; charset=utf-8")
        .body(Full::new(body.into()))
        .expect("response")
}
