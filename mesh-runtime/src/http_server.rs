//! The one small HTTP/1.1 server every operational endpoint of the mesh runs on:
//! admin, metrics and readiness ports, and the node agent's plugin sockets. The data
//! plane never uses it.
//!
//! Hardened for listeners any pod can reach (metrics, readiness): a connection cap
//! where a new connection evicts the oldest idle one (a slow-loris cannot hold the
//! process's descriptors or starve other clients), a deadline for the request head
//! (which also ends idle keep-alive connections), one for the body and the handler,
//! bounded heads and bodies (refused on `Content-Length` alone when announced), and a
//! graceful stop: in-flight requests finish, then connections close.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

/// A request as handlers see it: the head plus the whole (bounded) body.
#[derive(Debug)]
pub struct Request {
    /// The request method.
    pub method: Method,
    /// The path, without the query.
    pub path: String,
    /// The raw query string, if any.
    pub query: Option<String>,
    /// The request headers.
    pub headers: HeaderMap,
    /// The whole body (at most [`Limits::max_body`] bytes).
    pub body: Bytes,
}

/// A whole response.
pub type Response = http::Response<Full<Bytes>>;

/// A `text/plain` answer.
pub fn text(status: StatusCode, body: impl Into<String>) -> Response {
    with_type(status, body.into(), "text/plain; charset=utf-8")
}

/// A pretty-printed JSON answer.
pub fn json(value: &serde_json::Value) -> Response {
    let body = serde_json::to_vec_pretty(value).unwrap_or_default();
    with_type(StatusCode::OK, body, "application/json")
}

/// Prometheus' text exposition format (version 0.0.4), which every scraper reads.
pub fn prometheus(exposition: String) -> Response {
    with_type(
        StatusCode::OK,
        exposition,
        "text/plain; version=0.0.4; charset=utf-8",
    )
}

/// 404 naming the path.
pub fn not_found(path: &str) -> Response {
    text(StatusCode::NOT_FOUND, format!("no handler for {path}\n"))
}

/// 405 with the `Allow` header naming the one method a path takes.
pub fn method_not_allowed(allow: &'static str) -> Response {
    let mut response = text(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("method not allowed: use {allow}\n"),
    );
    response
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(allow));
    response
}

fn with_type(status: StatusCode, body: impl Into<Bytes>, content_type: &'static str) -> Response {
    let mut response = http::Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// Limits of one server.
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
    /// Larger bodies are refused with 413.
    pub max_body: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 64,
            header_read_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(10),
            max_body: 64 * 1024,
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

/// Answers one request.
pub trait Handler: Send + Sync + 'static {
    /// The answer to `request`.
    fn handle(&self, request: Request) -> impl Future<Output = Response> + Send;
}

impl<F, Fut> Handler for F
where
    F: Fn(Request) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response> + Send,
{
    fn handle(&self, request: Request) -> impl Future<Output = Response> + Send {
        self(request)
    }
}

/// One server: a handler, its limits and the connections it serves. Cheap to clone.
pub struct Server<H> {
    handler: Arc<H>,
    limits: Limits,
    open: Arc<Mutex<OpenConnections>>,
    stop: CancellationToken,
}

impl<H> Clone for Server<H> {
    fn clone(&self) -> Self {
        Server {
            handler: self.handler.clone(),
            limits: self.limits,
            open: self.open.clone(),
            stop: self.stop.clone(),
        }
    }
}

impl<H: Handler> Server<H> {
    /// A server that stops (gracefully) when `stop` fires.
    pub fn new(handler: H, limits: Limits, stop: CancellationToken) -> Self {
        Server {
            handler: Arc::new(handler),
            limits,
            open: Arc::default(),
            stop,
        }
    }

    /// Accepts on `listener` until the stop token fires, serving each connection.
    pub async fn serve_tcp(self, listener: TcpListener) {
        let mut backoff = ACCEPT_BACKOFF_MIN;
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                () = self.stop.cancelled() => return,
            };
            match accepted {
                Ok((stream, peer)) => {
                    backoff = ACCEPT_BACKOFF_MIN;
                    // Small answers, often on keep-alive connections: no Nagle delay.
                    let _ = stream.set_nodelay(true);
                    self.serve_connection(stream, peer);
                }
                Err(e) => {
                    // Out of file descriptors or similar: back off instead of spinning.
                    warn!(error = %e, retry_in = ?backoff, "accept failed");
                    tokio::select! {
                        () = tokio::time::sleep(backoff) => {}
                        () = self.stop.cancelled() => return,
                    }
                    backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                }
            }
        }
    }

    /// Serves one accepted connection in its own task, within the connection cap.
    /// `peer` names it in logs.
    pub fn serve_connection<S>(&self, stream: S, peer: impl std::fmt::Display + Send + 'static)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let Some(admitted) = lock(&self.open).admit(self.limits.max_connections) else {
            debug!(%peer, "refusing a connection: every connection is in a request");
            return; // dropping the stream closes it
        };
        let (handler, limits, open, stop) = (
            self.handler.clone(),
            self.limits,
            self.open.clone(),
            self.stop.clone(),
        );
        tokio::spawn(async move {
            let busy = admitted.busy.clone();
            let service = hyper::service::service_fn(move |request| {
                let handler = handler.clone();
                let busy = Busy::enter(&busy);
                async move {
                    let _busy = busy;
                    let response = tokio::time::timeout(
                        limits.request_timeout,
                        dispatch(request, &*handler, limits),
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
            tokio::pin!(connection);
            let result = tokio::select! {
                result = connection.as_mut() => result,
                () = admitted.evicted.cancelled() => {
                    debug!(%peer, "connection evicted to make room for a new one");
                    Ok(())
                }
                () = stop.cancelled() => {
                    // In-flight requests finish; then the connection closes.
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(e) = result {
                debug!(%peer, error = %e, "connection ended");
            }
            lock(&open).remove(admitted.id);
        });
    }
}

/// Serves `handler` on `listener` with the default [`Limits`] until `stop` fires.
pub async fn serve<H: Handler>(listener: TcpListener, stop: CancellationToken, handler: H) {
    Server::new(handler, Limits::default(), stop)
        .serve_tcp(listener)
        .await
}

/// The connections a server serves, oldest first.
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
                warn!(
                    max,
                    "server at its connection cap; evicting the oldest idle connections"
                );
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

/// Reads the body within the limit (413 when larger, refused on the announced
/// `Content-Length` alone; 400 when it breaks off), then asks the handler.
async fn dispatch<H: Handler>(
    request: http::Request<Incoming>,
    handler: &H,
    limits: Limits,
) -> Response {
    let too_large = || {
        text(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body larger than {} bytes\n", limits.max_body),
        )
    };
    let (parts, body) = request.into_parts();
    let announced = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if announced.is_some_and(|n| n > limits.max_body as u64) {
        return too_large();
    }
    let body = match Limited::new(body, limits.max_body).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => return too_large(),
        Err(e) => {
            return text(
                StatusCode::BAD_REQUEST,
                format!("reading the request body: {e}\n"),
            )
        }
    };
    handler
        .handle(Request {
            method: parts.method,
            path: parts.uri.path().to_owned(),
            query: parts.uri.query().map(str::to_owned),
            headers: parts.headers,
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
        let server = Server::new(
            |request: Request| async move {
                text(StatusCode::OK, format!("ok {}\n", request.body.len()))
            },
            limits,
            stop.clone(),
        );
        tokio::spawn(server.serve_tcp(listener));
        (addr, stop)
    }

    async fn exchange(addr: std::net::SocketAddr, request: &[u8]) -> std::io::Result<String> {
        let mut tcp = TcpStream::connect(addr).await?;
        tcp.write_all(request).await?;
        let mut answer = String::new();
        tcp.read_to_string(&mut answer).await?;
        Ok(answer)
    }

    async fn get(addr: std::net::SocketAddr) -> std::io::Result<String> {
        exchange(
            addr,
            b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await
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
            ..Limits::default()
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
    async fn bodies_over_the_limit_are_refused_announced_or_not() {
        let limits = Limits {
            max_body: 16,
            ..Limits::default()
        };
        let (addr, stop) = server(limits).await;
        let fits = exchange(
            addr,
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nConnection: close\r\n\r\nabcd",
        )
        .await
        .unwrap();
        assert!(
            fits.starts_with("HTTP/1.1 200") && fits.ends_with("ok 4\n"),
            "{fits}"
        );
        // Announced: refused before a byte of the body is read.
        let announced = exchange(
            addr,
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\nConnection: close\r\n\r\n",
        )
        .await
        .unwrap();
        assert!(announced.starts_with("HTTP/1.1 413"), "{announced}");
        // Chunked: refused once the limit is passed.
        let chunked = exchange(
            addr,
            b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n\
              20\r\n0123456789abcdef0123456789abcdef\r\n0\r\n\r\n",
        )
        .await
        .unwrap();
        assert!(chunked.starts_with("HTTP/1.1 413"), "{chunked}");
        stop.cancel();
    }

    #[tokio::test]
    async fn a_stop_lets_the_request_in_flight_finish() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let slow = |_: Request| async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            text(StatusCode::OK, "late\n")
        };
        let server = Server::new(slow, Limits::default(), stop.clone());
        tokio::spawn(server.serve_tcp(listener));
        let answer = tokio::spawn(get(addr));
        tokio::time::sleep(Duration::from_millis(100)).await;
        stop.cancel();
        let answer = answer.await.unwrap().unwrap();
        assert!(answer.ends_with("late\n"), "{answer}");
        // And nothing is accepted afterwards.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            get(addr).await.is_err(),
            "the listener is closed after a stop"
        );
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
