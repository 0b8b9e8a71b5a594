//! A small HTTP/1.1 server for ztunnel's operational endpoints (admin, metrics,
//! readiness). The data plane does not use it.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

/// Request bodies above this are refused: these endpoints take tiny inputs.
const MAX_BODY: usize = 64 * 1024;

/// A request as handlers see it: head plus the whole (bounded) body.
pub struct SimpleRequest {
    pub method: http::Method,
    pub path: String,
    pub query: Option<String>,
    pub body: Bytes,
}

pub type SimpleResponse = Response<Full<Bytes>>;

pub fn text(status: StatusCode, body: impl Into<String>) -> SimpleResponse {
    let mut response = Response::new(Full::new(Bytes::from(body.into())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

pub fn json(value: &serde_json::Value) -> SimpleResponse {
    let body = serde_json::to_vec_pretty(value).unwrap_or_default();
    let mut response = Response::new(Full::new(Bytes::from(body)));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

/// Limits of an operations listener. Metrics (15020) and readiness (15021) listen on
/// all addresses, so any pod can reach them: these keep a slow or hostile client (a
/// slow-loris) from holding ztunnel's file descriptors or starving other clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once. At the cap, a new connection evicts the oldest one
    /// that is waiting for a request (an idle or slow one); when every connection is
    /// in a request, the new one is closed.
    pub max_connections: usize,
    /// A request's head must be complete within this, counted from when the server
    /// starts waiting for it (so it also ends idle keep-alive connections).
    pub header_read_timeout: Duration,
    /// The body must arrive and the handler answer within this (else 408).
    pub request_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 64,
            header_read_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(10),
        }
    }
}

/// Backoff after a failed accept (e.g. out of file descriptors), doubling to the max.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(5);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// The largest request head buffered (hyper's minimum is 8 KiB).
const MAX_HEAD: usize = 64 * 1024;
/// How often "at the connection cap" may be logged.
const CAP_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// Serves `handler` on `listener` with the default [`Limits`] until `stop` fires.
pub async fn serve<H, F>(listener: TcpListener, stop: CancellationToken, handler: H)
where
    H: Fn(SimpleRequest) -> F + Send + Sync + 'static,
    F: Future<Output = SimpleResponse> + Send + 'static,
{
    serve_with(listener, Limits::default(), stop, handler).await
}

/// Serves `handler` on `listener` within `limits` until `stop` fires.
pub async fn serve_with<H, F>(
    listener: TcpListener,
    limits: Limits,
    stop: CancellationToken,
    handler: H,
) where
    H: Fn(SimpleRequest) -> F + Send + Sync + 'static,
    F: Future<Output = SimpleResponse> + Send + 'static,
{
    let handler = Arc::new(handler);
    let open = Arc::new(Mutex::new(OpenConnections::default()));
    let mut backoff = ACCEPT_BACKOFF_MIN;
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => {
                    backoff = ACCEPT_BACKOFF_MIN;
                    accepted
                }
                Err(e) => {
                    // Out of file descriptors or similar: back off instead of spinning.
                    warn!(error = %e, retry_in = ?backoff, "accept failed");
                    tokio::select! {
                        () = tokio::time::sleep(backoff) => {}
                        () = stop.cancelled() => return,
                    }
                    backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                    continue;
                }
            },
            () = stop.cancelled() => return,
        };
        let Some(admitted) = lock(&open).admit(limits.max_connections) else {
            debug!(%peer, "refusing connection: every connection is in a request");
            continue; // dropping the stream closes it
        };
        let handler = handler.clone();
        let open = open.clone();
        tokio::spawn(async move {
            let busy = admitted.busy.clone();
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let handler = handler.clone();
                let busy = Busy::enter(&busy);
                async move {
                    let _busy = busy;
                    let response = tokio::time::timeout(
                        limits.request_timeout,
                        dispatch(request, handler.as_ref()),
                    )
                    .await
                    .unwrap_or_else(|_| text(StatusCode::REQUEST_TIMEOUT, "request timed out\n"));
                    Ok::<_, Infallible>(response)
                }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout)
                .max_buf_size(MAX_HEAD)
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                result = connection => if let Err(e) = result {
                    debug!(%peer, error = %e, "connection ended");
                },
                () = admitted.evicted.cancelled() => {
                    debug!(%peer, "connection evicted to make room for a new one");
                }
            }
            lock(&open).remove(admitted.id);
        });
    }
}

/// The connections a listener serves, oldest first.
#[derive(Default)]
struct OpenConnections {
    next_id: u64,
    open: BTreeMap<u64, Admitted>,
    last_cap_log: Option<Instant>,
}

#[derive(Clone)]
struct Admitted {
    id: u64,
    /// Requests in progress on the connection.
    busy: Arc<AtomicUsize>,
    /// Fired to close the connection.
    evicted: CancellationToken,
}

impl OpenConnections {
    /// Registers a new connection, evicting the oldest idle one when at `max`; `None`
    /// when at `max` and no connection is idle.
    fn admit(&mut self, max: usize) -> Option<Admitted> {
        if self.open.len() >= max.max(1) {
            let now = Instant::now();
            if self
                .last_cap_log
                .is_none_or(|t| now.duration_since(t) >= CAP_LOG_INTERVAL)
            {
                warn!(max, "operations listener at its connection cap; evicting the oldest idle connections");
                self.last_cap_log = Some(now);
            }
            let idle = self
                .open
                .values()
                .find(|c| c.busy.load(Ordering::SeqCst) == 0)?
                .id;
            if let Some(evicted) = self.open.remove(&idle) {
                evicted.evicted.cancel();
            }
        }
        let admitted = Admitted {
            id: self.next_id,
            busy: Arc::default(),
            evicted: CancellationToken::new(),
        };
        self.next_id += 1;
        self.open.insert(admitted.id, admitted.clone());
        Some(admitted)
    }

    fn remove(&mut self, id: u64) {
        self.open.remove(&id);
    }
}

/// Marks a connection busy while a request is in progress.
struct Busy(Arc<AtomicUsize>);

impl Busy {
    fn enter(busy: &Arc<AtomicUsize>) -> Self {
        busy.fetch_add(1, Ordering::SeqCst);
        Busy(busy.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

async fn dispatch<H, F>(request: Request<Incoming>, handler: &H) -> SimpleResponse
where
    H: Fn(SimpleRequest) -> F,
    F: Future<Output = SimpleResponse>,
{
    let (parts, body) = request.into_parts();
    let body = match Limited::new(body, MAX_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return text(StatusCode::PAYLOAD_TOO_LARGE, "request body too large\n"),
    };
    handler(SimpleRequest {
        method: parts.method,
        path: parts.uri.path().to_owned(),
        query: parts.uri.query().map(str::to_owned),
        body,
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    async fn server(limits: Limits) -> (std::net::SocketAddr, CancellationToken) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        tokio::spawn(serve_with(listener, limits, stop.clone(), |_| async {
            text(StatusCode::OK, "ok\n")
        }));
        (addr, stop)
    }

    async fn get(addr: std::net::SocketAddr) -> std::io::Result<String> {
        let mut tcp = TcpStream::connect(addr).await?;
        tcp.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await?;
        let mut answer = String::new();
        tcp.read_to_string(&mut answer).await?;
        Ok(answer)
    }

    /// Waits for the server to close `tcp`; any bytes it sent first are ignored.
    async fn closed_within(tcp: &mut TcpStream, within: Duration) -> bool {
        let mut buf = [0u8; 256];
        tokio::time::timeout(within, async {
            loop {
                match tcp.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await
        .is_ok()
    }

    #[tokio::test]
    async fn slow_loris_does_not_stop_new_connections() {
        let limits = Limits {
            max_connections: 8,
            header_read_timeout: Duration::from_secs(30),
            request_timeout: Duration::from_secs(5),
        };
        let (addr, stop) = server(limits).await;
        // Far more half-sent heads than the cap, none ever finished.
        let mut loris = Vec::new();
        for _ in 0..40 {
            let mut tcp = TcpStream::connect(addr).await.unwrap();
            tcp.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                .await
                .unwrap();
            loris.push(tcp);
        }
        for _ in 0..3 {
            let answer = tokio::time::timeout(Duration::from_secs(2), get(addr))
                .await
                .expect("a new connection is served promptly")
                .unwrap();
            assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        }
        // The oldest slow connections were closed to make room.
        assert!(closed_within(&mut loris[0], Duration::from_secs(2)).await);
        stop.cancel();
    }

    #[tokio::test]
    async fn unfinished_heads_and_silent_connections_are_closed_after_the_timeout() {
        let limits = Limits {
            header_read_timeout: Duration::from_millis(300),
            ..Limits::default()
        };
        let (addr, stop) = server(limits).await;
        let mut partial = TcpStream::connect(addr).await.unwrap();
        partial.write_all(b"GET / HTTP/1.1\r\nHo").await.unwrap();
        let mut silent = TcpStream::connect(addr).await.unwrap();
        let started = Instant::now();
        assert!(closed_within(&mut partial, Duration::from_secs(3)).await);
        assert!(closed_within(&mut silent, Duration::from_secs(3)).await);
        assert!(started.elapsed() >= Duration::from_millis(250));
        // A keep-alive connection idle after its answer is closed the same way.
        let mut kept = TcpStream::connect(addr).await.unwrap();
        kept.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        assert!(closed_within(&mut kept, Duration::from_secs(3)).await);
        // And the server still answers.
        assert!(get(addr).await.unwrap().starts_with("HTTP/1.1 200"));
        stop.cancel();
    }

    #[tokio::test]
    async fn at_the_cap_with_every_connection_busy_new_ones_are_closed() {
        let mut open = OpenConnections::default();
        let a = open.admit(2).unwrap();
        let b = open.admit(2).unwrap();
        let _a_busy = Busy::enter(&a.busy);
        // b is idle: it is evicted for c.
        let c = open.admit(2).unwrap();
        assert!(b.evicted.is_cancelled() && !a.evicted.is_cancelled());
        let _c_busy = Busy::enter(&c.busy);
        assert!(open.admit(2).is_none());
        open.remove(a.id);
        assert!(open.admit(2).is_some());
    }
}
