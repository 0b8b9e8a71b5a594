//! The outbound HBONE connection pool.
//!
//! Connections are keyed by (source identity, destination identity, destination
//! address, source IP), as in Istio, so a connection is only ever reused for the
//! same pair of identities. Each connection carries at most
//! [`POOL_MAX_STREAMS_PER_CONNECTION`] streams (or the peer's lower limit). Opening a
//! connection for a key holds that key's lock, so a burst to a new destination opens
//! exactly one connection and every other request of the burst waits and shares it.
//!
//! Each worker thread has its own connections (see `crate::workers`): a stream and the
//! HTTP/2 connection it travels on are driven by the same thread, so moving bytes
//! never needs a wakeup across threads. That costs at most one connection per key
//! and worker.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use rustls_pki_types::ServerName;
use tokio::io::AsyncRead;
use tokio::time::timeout;
use tracing::{debug, warn};

use super::early::EarlyData;
use super::stream::H2Stream;
use super::*;
use crate::identity::{Identity, SecretManager};
use crate::metrics::Metrics;
use crate::socket::SocketFactory;
use crate::tls;

/// Which pooled connection a stream may share.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct PoolKey {
    pub src_identity: Identity,
    pub dst_identity: Identity,
    /// The destination's HBONE address (`ip:15008`).
    pub dst: SocketAddr,
    pub src_ip: Option<IpAddr>,
}

/// One CONNECT to open through the pool.
#[derive(Clone, Debug)]
pub struct ConnectRequest {
    pub key: PoolKey,
    /// Identities the server may present: the workload's, plus a service's SANs.
    pub expected_identities: Vec<Identity>,
    /// The target `ip:port` behind the destination's ztunnel (`:authority`).
    pub authority: SocketAddr,
    /// The original client, sent as `forwarded: for=`.
    pub client: SocketAddr,
    pub baggage: String,
}

pub struct Pool {
    certs: SecretManager,
    sockets: Arc<dyn SocketFactory>,
    metrics: Arc<Metrics>,
    /// By key and the worker whose connections they are.
    slots: Mutex<HashMap<(PoolKey, usize), Arc<Slot>>>,
    idle_timeout: Duration,
    next_id: AtomicU64,
}

/// The connections of one key. The async mutex is what serialises opening.
#[derive(Default)]
struct Slot {
    connections: tokio::sync::Mutex<Vec<Arc<Connection>>>,
}

struct Connection {
    id: u64,
    sender: h2::client::SendRequest<Bytes>,
    active_streams: AtomicUsize,
    /// Set by the connection's driver task when the connection ends for any reason.
    closed: Arc<AtomicBool>,
    last_used: Mutex<Instant>,
}

impl Connection {
    fn stream_limit(&self) -> usize {
        POOL_MAX_STREAMS_PER_CONNECTION.min(self.sender.current_max_send_streams())
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    fn try_acquire(self: &Arc<Self>) -> Option<Lease> {
        if self.is_closed() {
            return None;
        }
        let limit = self.stream_limit();
        self.active_streams
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()
            .map(|_| Lease(self.clone()))
    }

    fn idle_since(&self) -> Option<Instant> {
        (self.active_streams.load(Ordering::Acquire) == 0).then(|| *lock(&self.last_used))
    }
}

/// A stream's claim on a connection; returned when the stream ends.
struct Lease(Arc<Connection>);

impl Drop for Lease {
    fn drop(&mut self) {
        *lock(&self.0.last_used) = Instant::now();
        self.0.active_streams.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What one attempt on one connection gave.
enum Attempt {
    Done(Result<H2Stream, HboneError>),
    /// The connection broke before the server answered: safe to retry elsewhere.
    ConnectionFailed(HboneError),
}

impl Pool {
    pub fn new(
        certs: SecretManager,
        sockets: Arc<dyn SocketFactory>,
        metrics: Arc<Metrics>,
        idle_timeout: Duration,
    ) -> Arc<Self> {
        let pool = Arc::new(Pool {
            certs,
            sockets,
            metrics,
            slots: Mutex::default(),
            idle_timeout,
            next_id: AtomicU64::new(1),
        });
        tokio::spawn(reap_idle(Arc::downgrade(&pool)));
        pool
    }

    /// Opens a CONNECT stream, sharing a pooled connection when one has room. If a
    /// pooled connection turns out to be dead, the request is retried once on a
    /// fresh connection.
    pub async fn connect(&self, req: &ConnectRequest) -> Result<H2Stream, HboneError> {
        let mut nothing = tokio::io::empty();
        self.connect_with_early_data(req, &mut EarlyData::new(&mut nothing))
            .await
    }

    /// [`Pool::connect`], forwarding what the client sends while the request is in
    /// flight (see [`EarlyData`]).
    pub async fn connect_with_early_data<R: AsyncRead + Unpin>(
        &self,
        req: &ConnectRequest,
        early: &mut EarlyData<'_, R>,
    ) -> Result<H2Stream, HboneError> {
        let slot = self.slot(&req.key);
        let (lease, fresh) = self.checkout(&slot, req).await?;
        match self.send(lease, req, early).await {
            Attempt::Done(result) => result,
            Attempt::ConnectionFailed(e) if !fresh => {
                debug!(dst = %req.key.dst, error = %e, "pooled HBONE connection failed; retrying on a new one");
                self.metrics.hbone_pool_retries.inc();
                let lease = self.open_into(&slot, req).await?;
                match self.send(lease, req, early).await {
                    Attempt::Done(result) => result,
                    Attempt::ConnectionFailed(e) => Err(e),
                }
            }
            Attempt::ConnectionFailed(e) => Err(e),
        }
    }

    /// Number of live connections, for tests and `/config_dump`.
    pub fn connection_count(&self) -> usize {
        let slots: Vec<Arc<Slot>> = lock(&self.slots).values().cloned().collect();
        slots
            .iter()
            .map(|s| {
                s.connections
                    .try_lock()
                    .map(|c| c.iter().filter(|c| !c.is_closed()).count())
                    .unwrap_or(0)
            })
            .sum()
    }

    fn slot(&self, key: &PoolKey) -> Arc<Slot> {
        lock(&self.slots)
            .entry((key.clone(), crate::workers::current()))
            .or_default()
            .clone()
    }

    /// A lease on a connection with room, opening one if none has room. The bool is
    /// true when the connection was opened for this request.
    async fn checkout(
        &self,
        slot: &Slot,
        req: &ConnectRequest,
    ) -> Result<(Lease, bool), HboneError> {
        let mut connections = slot.connections.lock().await;
        connections.retain(|c| !c.is_closed());
        if let Some(lease) = connections.iter().find_map(|c| c.try_acquire()) {
            return Ok((lease, false));
        }
        let connection = Box::pin(self.open(&req.key, &req.expected_identities)).await?;
        let lease = connection
            .try_acquire()
            .ok_or(HboneError::Timeout("waiting for a stream slot"))?;
        connections.push(connection);
        Ok((lease, true))
    }

    /// Opens a new connection for the key regardless of the others (after a failure).
    async fn open_into(&self, slot: &Slot, req: &ConnectRequest) -> Result<Lease, HboneError> {
        let mut connections = slot.connections.lock().await;
        connections.retain(|c| !c.is_closed());
        let connection = Box::pin(self.open(&req.key, &req.expected_identities)).await?;
        let lease = connection
            .try_acquire()
            .ok_or(HboneError::Timeout("waiting for a stream slot"))?;
        connections.push(connection);
        Ok(lease)
    }

    /// A new connection: TCP, TLS and HTTP/2 handshakes. Callers box it: its state is
    /// some 4 KiB, which every user connection's future would otherwise carry for its
    /// whole life though only the first to a destination ever runs it.
    async fn open(
        &self,
        key: &PoolKey,
        expected: &[Identity],
    ) -> Result<Arc<Connection>, HboneError> {
        let cert = self.certs.fetch(&key.src_identity).await?;
        let config = tls::client_config(&cert, expected.to_vec())?;
        let socket = self
            .sockets
            .tcp_socket(key.dst)
            .await
            .map_err(|e| HboneError::Connect(key.dst, e))?;
        let tcp = timeout(CONNECT_TIMEOUT, socket.connect(key.dst))
            .await
            .map_err(|_| HboneError::Timeout("connecting to the destination's HBONE port"))?
            .map_err(|e| HboneError::Connect(key.dst, e))?;
        let server_name = ServerName::IpAddress(key.dst.ip().into());
        let tls = timeout(HANDSHAKE_TIMEOUT, tls::connect(config, server_name, tcp))
            .await
            .map_err(|_| HboneError::Timeout("in the TLS handshake"))?
            .map_err(|e| HboneError::Tls(key.dst, e))?;
        let (sender, mut connection) = h2::client::Builder::new()
            .initial_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .max_frame_size(MAX_FRAME_SIZE)
            .max_send_buffer_size(MAX_SEND_BUFFER)
            .handshake::<_, Bytes>(tls)
            .await?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let closed = Arc::new(AtomicBool::new(false));
        let ping = connection.ping_pong();
        let gauge = self.metrics.hbone_pool_connections.clone();
        gauge.inc();
        let driver_closed = closed.clone();
        let dst = key.dst;
        tokio::spawn(async move {
            tokio::select! {
                result = &mut connection => {
                    if let Err(e) = result {
                        debug!(%dst, id, error = %e, "HBONE connection ended");
                    }
                }
                () = keepalive(ping) => warn!(%dst, id, "HBONE peer stopped answering PINGs; closing"),
            }
            driver_closed.store(true, Ordering::Release);
            gauge.dec();
        });
        debug!(%dst, id, src = %key.src_identity, "opened HBONE connection");
        Ok(Arc::new(Connection {
            id,
            sender,
            active_streams: AtomicUsize::new(0),
            closed,
            last_used: Mutex::new(Instant::now()),
        }))
    }

    async fn send<R: AsyncRead + Unpin>(
        &self,
        lease: Lease,
        req: &ConnectRequest,
        early: &mut EarlyData<'_, R>,
    ) -> Attempt {
        let connection = lease.0.clone();
        let broken = |e: h2::Error| {
            connection.closed.store(true, Ordering::Release);
            Attempt::ConnectionFailed(e.into())
        };
        let mut sender = match connection.sender.clone().ready().await {
            Ok(sender) => sender,
            Err(e) => return broken(e),
        };
        let request = match connect_request(req) {
            Ok(request) => request,
            Err(e) => return Attempt::Done(Err(e.into())),
        };
        let (response, mut send) = match sender.send_request(request, false) {
            Ok(pair) => pair,
            Err(e) => return broken(e),
        };
        if let Err(e) = early.replay(&mut send) {
            return broken(e);
        }
        let response = match early.forward_until(&mut send, response).await {
            Ok(response) => response,
            Err(e) => return Attempt::Done(Err(HboneError::Client(e))),
        };
        let response = match response {
            Ok(response) => response,
            // A refused or reset stream is the server's answer, not a dead connection.
            Err(e) if e.is_reset() && e.reason() != Some(h2::Reason::REFUSED_STREAM) => {
                return Attempt::Done(Err(e.into()))
            }
            Err(e) => return broken(e),
        };
        if response.status() != StatusCode::OK {
            return Attempt::Done(Err(HboneError::Status(response.status())));
        }
        debug!(connection = connection.id, authority = %req.authority, "HBONE stream established");
        let mut stream = H2Stream::new(send, response.into_body());
        stream._lease = Some(Box::new(lease));
        Attempt::Done(Ok(stream))
    }

    /// Drops connections idle for longer than the idle timeout.
    fn reap(&self) {
        let now = Instant::now();
        let slots: Vec<((PoolKey, usize), Arc<Slot>)> = lock(&self.slots)
            .iter()
            .map(|(k, s)| (k.clone(), s.clone()))
            .collect();
        for (key, slot) in slots {
            let Ok(mut connections) = slot.connections.try_lock() else {
                continue; // busy opening; look again next round
            };
            connections.retain(|c| {
                !c.is_closed()
                    && c.idle_since()
                        .is_none_or(|t| now.duration_since(t) < self.idle_timeout)
            });
            if connections.is_empty() {
                drop(connections);
                lock(&self.slots).remove(&key);
            }
        }
    }
}

fn connect_request(req: &ConnectRequest) -> Result<Request<()>, http::Error> {
    Request::builder()
        .method(Method::CONNECT)
        .uri(req.authority.to_string())
        .header("forwarded", format!("for=\"{}\"", req.client))
        .header("baggage", &req.baggage)
        .header("traceparent", traceparent())
        .body(())
}

/// A fresh W3C trace context: `00-<trace id>-<span id>-01`.
fn traceparent() -> String {
    let trace: u128 = rand::random();
    let span: u64 = rand::random();
    format!("00-{trace:032x}-{span:016x}-01")
}

/// Returns once the peer fails to answer a PING in time.
async fn keepalive(ping: Option<h2::PingPong>) {
    let Some(mut ping) = ping else {
        return std::future::pending().await;
    };
    loop {
        tokio::time::sleep(PING_INTERVAL).await;
        match timeout(PING_TIMEOUT, ping.ping(h2::Ping::opaque())).await {
            Ok(Ok(_)) => {}
            _ => return,
        }
    }
}

async fn reap_idle(pool: Weak<Pool>) {
    let interval = match pool.upgrade() {
        Some(p) => (p.idle_timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(30)),
        None => return,
    };
    loop {
        tokio::time::sleep(interval).await;
        match pool.upgrade() {
            Some(pool) => pool.reap(),
            None => return,
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic elsewhere must not take the data plane down with it.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
