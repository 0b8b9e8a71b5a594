//! Kubernetes probes on port 8000 (Istio's node agent port): `/healthz` answers 200 while
//! the process serves at all, `/readyz` 200 only once nothing blocks [`Readiness`]
//! (503 with what it still waits for otherwise).

use crate::http_server::{self, Handler, Response};
use crate::readiness::Readiness;
use http::{Method, Request, StatusCode};
use hyper::body::Incoming;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub const LIVENESS_PATH: &str = "/healthz";
pub const READINESS_PATH: &str = "/readyz";

/// Binds all addresses: `[::]` (dual-stack) when the node has IPv6, else `0.0.0.0`, so
/// a node with IPv6 disabled still gets its probes answered.
pub async fn bind(port: u16) -> io::Result<TcpListener> {
    match TcpListener::bind(SocketAddr::from((Ipv6Addr::UNSPECIFIED, port))).await {
        Ok(listener) => Ok(listener),
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => Err(e),
        Err(e) => {
            tracing::debug!("no IPv6 for the health server ({e}), using IPv4 only");
            TcpListener::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port))).await
        }
    }
}

pub fn router(readiness: Readiness) -> Handler {
    Arc::new(move |request| {
        let response = route(&request, &readiness);
        Box::pin(async move { response })
    })
}

fn route(request: &Request<Incoming>, readiness: &Readiness) -> Response {
    let path = request.uri().path();
    if path != LIVENESS_PATH && path != READINESS_PATH {
        return http_server::not_found(path);
    }
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return http_server::method_not_allowed("GET");
    }
    if path == LIVENESS_PATH {
        return http_server::text(StatusCode::OK, "ok\n");
    }
    let pending = readiness.pending();
    if pending.is_empty() {
        http_server::text(StatusCode::OK, "ready\n")
    } else {
        http_server::text(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready, waiting for: {}\n", pending.join(", ")),
        )
    }
}

/// Serves probes until `cancel`.
pub async fn serve(listener: TcpListener, readiness: Readiness, cancel: CancellationToken) {
    http_server::serve_tcp(listener, router(readiness), cancel, "health").await
}
