//! Accepting connections on a port anyone in the cluster may reach (the metrics and health
//! port, the webhook), within bounds: at most `max_connections` are served with the normal
//! idle timeout; connections past that are still served (a scrape or a probe must get through
//! a flood of idle connections) but closed after a short idle time and never kept alive; a
//! failing `accept` (out of file descriptors) pauses instead of spinning, and is logged at most
//! once a minute.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::warn;

/// The limits of one listening port.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Connections served with `idle_timeout` and keep-alive.
    pub max_connections: usize,
    /// How long a connection may take to send a request's headers (or sit idle between
    /// requests) before it is closed.
    pub idle_timeout: Duration,
    /// The same for connections past `max_connections`.
    pub overflow_timeout: Duration,
}

/// The pause after a failed `accept`.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// At most one log line per this for failing accepts.
const ACCEPT_LOG_EVERY: Duration = Duration::from_secs(60);

/// One accepted connection and how to serve it. Holding it holds its place in the bound.
pub struct Accepted {
    pub stream: TcpStream,
    pub peer: SocketAddr,
    /// The header-read (and idle) timeout for this connection.
    pub idle_timeout: Duration,
    /// Past the bound: served once, not kept alive.
    pub overflow: bool,
    _place: Option<OwnedSemaphorePermit>,
}

/// A listener that hands out connections within [`Bounds`].
pub struct Listener {
    inner: TcpListener,
    places: Arc<Semaphore>,
    bounds: Bounds,
    failed_accepts: u64,
    last_log: Option<Instant>,
}

impl Listener {
    pub fn new(inner: TcpListener, bounds: Bounds) -> Self {
        Listener {
            inner,
            places: Arc::new(Semaphore::new(bounds.max_connections)),
            bounds,
            failed_accepts: 0,
            last_log: None,
        }
    }

    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.inner.local_addr().ok()
    }

    /// The next connection; waits out accept failures.
    pub async fn accept(&mut self) -> Accepted {
        loop {
            match self.inner.accept().await {
                Ok((stream, peer)) => {
                    let place = self.places.clone().try_acquire_owned().ok();
                    let overflow = place.is_none();
                    return Accepted {
                        stream,
                        peer,
                        idle_timeout: if overflow {
                            self.bounds.overflow_timeout
                        } else {
                            self.bounds.idle_timeout
                        },
                        overflow,
                        _place: place,
                    };
                }
                Err(e) => {
                    self.failed_accepts += 1;
                    if self
                        .last_log
                        .is_none_or(|t| t.elapsed() >= ACCEPT_LOG_EVERY)
                    {
                        warn!(addr = ?self.local_addr(), error = %e, failed = self.failed_accepts,
                            "accept failed; pausing before the next");
                        self.last_log = Some(Instant::now());
                    }
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            }
        }
    }

    /// Connections being served within the bound right now.
    pub fn open(&self) -> usize {
        self.bounds.max_connections - self.places.available_permits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn connections_past_the_bound_get_the_short_timeout_and_places_come_back() {
        let inner = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = inner.local_addr().unwrap();
        let bounds = Bounds {
            max_connections: 2,
            idle_timeout: Duration::from_secs(10),
            overflow_timeout: Duration::from_secs(1),
        };
        let mut l = Listener::new(inner, bounds);
        let mut clients = Vec::new();
        for _ in 0..3 {
            clients.push(TcpStream::connect(addr).await.unwrap());
        }
        let a = l.accept().await;
        let b = l.accept().await;
        let c = l.accept().await;
        assert!(!a.overflow && !b.overflow && c.overflow);
        assert_eq!(c.idle_timeout, Duration::from_secs(1));
        assert_eq!(l.open(), 2);
        drop(a);
        assert_eq!(l.open(), 1);
        clients.push(TcpStream::connect(addr).await.unwrap());
        let d = l.accept().await;
        assert!(!d.overflow);
        assert_eq!(d.idle_timeout, Duration::from_secs(10));
    }
}
