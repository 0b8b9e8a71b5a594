//! Kubernetes probes on port 8000 (Istio's node agent port): `/healthz` answers 200 while
//! the process serves at all, `/readyz` 200 only once nothing blocks [`Readiness`]
//! (503 with what it still waits for otherwise).

use http::{Method, StatusCode};
use mesh_runtime::http_server::{self, Limits, Request, Response, Server};
use mesh_runtime::readiness::Readiness;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub const LIVENESS_PATH: &str = "/healthz";
pub const READINESS_PATH: &str = "/readyz";

/// Binds all addresses: `[::]` (dual-stack) when the node has IPv6, else `0.0.0.0`, so
/// a node with IPv6 disabled still gets its probes answered.
pub async fn bind(port: u16) -> io::Result<TcpListener> {
    mesh_runtime::listen::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)))
}

fn route(request: &Request, readiness: &Readiness) -> Response {
    let path = request.path.as_str();
    if path != LIVENESS_PATH && path != READINESS_PATH {
        return http_server::not_found(path);
    }
    if request.method != Method::GET && request.method != Method::HEAD {
        return http_server::method_not_allowed("GET");
    }
    if path == LIVENESS_PATH {
        return http_server::text(StatusCode::OK, "ok\n");
    }
    readiness.response()
}

/// Serves probes until `cancel`.
pub async fn serve(listener: TcpListener, readiness: Readiness, cancel: CancellationToken) {
    let handler = move |request: Request| {
        let response = route(&request, &readiness);
        async move { response }
    };
    Server::new(handler, Limits::default(), cancel)
        .serve_tcp(listener)
        .await
}
