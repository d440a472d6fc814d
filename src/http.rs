//! `/metrics`, `/healthz` and `/readyz` over hyper.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tracing::{debug, info};

use crate::listen::{Bounds, Listener};

use crate::liveness::Readiness;
use crate::metrics::Metrics;

/// What the endpoints report on.
#[derive(Clone)]
pub struct Health {
    pub metrics: Arc<Metrics>,
    pub readiness: Readiness,
    /// Unix time of the controller loop's last turn (it turns every discovery interval).
    pub heartbeat: Arc<std::sync::atomic::AtomicI64>,
    /// Liveness fails when the controller loop has not turned for this long: the runtime is wedged.
    pub wedged_after: Duration,
    /// Liveness fails when one reconcile has been running this long: the reconcile loop is wedged.
    pub reconcile_stuck_after: Duration,
    /// Liveness fails when a cache has not refreshed for this long.
    pub cache_stall_after: Duration,
    pub in_flight: Arc<crate::liveness::InFlight>,
}

impl Health {
    /// Why the process is not live (a restart may help); empty when it is.
    fn not_live(&self) -> Vec<String> {
        let mut why = Vec::new();
        let beat = self.heartbeat.load(std::sync::atomic::Ordering::Relaxed);
        let since = k8s_openapi::jiff::Timestamp::now().as_second() - beat;
        if beat != 0 && since >= self.wedged_after.as_secs() as i64 {
            why.push(format!("the controller loop has not turned for {since}s"));
        }
        if let Some(d) = self
            .in_flight
            .oldest()
            .filter(|d| *d >= self.reconcile_stuck_after)
        {
            why.push(format!("a reconcile has been running for {}s", d.as_secs()));
        }
        why.extend(self.readiness.liveness().problems(self.cache_stall_after));
        why
    }
}

/// 200 "ok", or 503 with one reason a line.
fn verdict(problems: Vec<String>) -> Response<Full<Bytes>> {
    if problems.is_empty() {
        respond(StatusCode::OK, "text/plain", "ok".into())
    } else {
        respond(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            problems.join("\n") + "\n",
        )
    }
}

fn respond(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Full::new(Bytes::from(body)))
        .expect("valid response")
}

async fn handle(
    req: Request<Incoming>,
    health: Health,
) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(match req.uri().path() {
        "/metrics" => respond(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            health.metrics.encode(),
        ),
        "/healthz" | "/livez" => verdict(health.not_live()),
        "/readyz" => verdict(health.readiness.not_ready()),
        _ => respond(StatusCode::NOT_FOUND, "text/plain", "not found".into()),
    })
}

/// The metrics and health port's bounds: Prometheus and the kubelet's probes keep a handful of
/// connections; a flood of idle ones is closed within seconds and never starves them.
pub const BOUNDS: Bounds = Bounds {
    max_connections: 256,
    idle_timeout: Duration::from_secs(15),
    overflow_timeout: Duration::from_secs(2),
};

/// Serves the endpoints on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, health: Health) {
    let mut listener = Listener::new(listener, BOUNDS);
    if let Some(addr) = listener.local_addr() {
        info!(%addr, "serving /metrics, /healthz, /readyz");
    }
    loop {
        let conn = listener.accept().await;
        let health = health.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| handle(req, health.clone()));
            let served = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(conn.idle_timeout)
                .keep_alive(!conn.overflow)
                .serve_connection(TokioIo::new(conn.stream), svc)
                .await;
            if let Err(e) = served {
                debug!(peer = %conn.peer, error = %e, "http connection ended with an error");
            }
        });
    }
}
