//! HBONE: user TCP connections carried as HTTP/2 CONNECT streams over mutual TLS.
//!
//! `pool` holds the client connections (one per key, many streams each), `early`
//! forwards a client's first bytes while its CONNECT is in flight, `server` accepts
//! the streams, and `stream` copies bytes between a TCP socket and a stream.

pub mod early;
#[cfg(test)]
mod fixtures;
pub mod io;
pub mod pool;
pub mod server;
pub mod stream;

use std::net::SocketAddr;
use std::time::Duration;

use crate::identity::source::CertError;
use crate::tls::TlsError;

/// Istio's HTTP/2 settings for HBONE: large windows so one stream can fill a fast
/// link, large frames so a stream costs few frame headers.
pub const STREAM_WINDOW: u32 = 4 * 1024 * 1024;
pub const CONNECTION_WINDOW: u32 = 16 * 1024 * 1024;
pub const MAX_FRAME_SIZE: u32 = 1024 * 1024;
/// Data h2 may queue per stream before the writer waits for the socket.
pub const MAX_SEND_BUFFER: usize = 1024 * 1024;
pub const SERVER_MAX_CONCURRENT_STREAMS: u32 = 200;
pub const POOL_MAX_STREAMS_PER_CONNECTION: usize = 100;
pub const PING_INTERVAL: Duration = Duration::from_secs(10);
pub const PING_TIMEOUT: Duration = Duration::from_secs(20);
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// An inbound stream that moves no byte either way for this long is closed: Envoy's
/// TCP proxy default (Istio sidecars apply it to every TCP connection).
pub const STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(3600);

#[derive(Debug, thiserror::Error)]
pub enum HboneError {
    #[error("connecting to {0}: {1}")]
    Connect(SocketAddr, std::io::Error),
    #[error("TLS handshake with {0}: {1}")]
    Tls(SocketAddr, std::io::Error),
    #[error("timed out {0}")]
    Timeout(&'static str),
    #[error("HTTP/2: {0}")]
    H2(#[from] h2::Error),
    #[error("workload certificate: {0}")]
    Certificate(#[from] CertError),
    #[error("TLS configuration: {0}")]
    TlsConfig(#[from] TlsError),
    #[error("building the CONNECT request: {0}")]
    Request(#[from] http::Error),
    #[error("peer answered {0}")]
    Status(http::StatusCode),
    #[error("reading from the client: {0}")]
    Client(std::io::Error),
}
