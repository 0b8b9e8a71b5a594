//! Operations endpoints, as istiod's: Prometheus metrics on 15014 (`/metrics`) and
//! readiness on 8080 (`/ready`). Both listen on all addresses (Prometheus and the
//! kubelet reach the pod's IP) on the shared hardened server.

use std::net::SocketAddr;
use std::sync::Arc;

use mesh_runtime::http_server::{self, Handler, Request};
use mesh_runtime::readiness::Readiness;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// Serves `/metrics` (and Envoy's `/stats/prometheus`) on `addr` until `shutdown`.
pub fn serve_metrics(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    serve(addr, shutdown, move |request: Request| {
        let response = match request.path.as_str() {
            "/metrics" | "/stats/prometheus" => http_server::prometheus(metrics.encode()),
            path => http_server::not_found(path),
        };
        async move { response }
    })
}

/// Serves `/ready` on `addr` until `shutdown`.
pub fn serve_readiness(
    addr: SocketAddr,
    readiness: Readiness,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    serve(addr, shutdown, move |request: Request| {
        let response = match request.path.as_str() {
            "/ready" => readiness.response(),
            path => http_server::not_found(path),
        };
        async move { response }
    })
}

fn serve<H: Handler>(
    addr: SocketAddr,
    shutdown: CancellationToken,
    handler: H,
) -> std::io::Result<()> {
    let listener = mesh_runtime::listen::bind(addr)?;
    tokio::spawn(http_server::serve(listener, shutdown, handler));
    Ok(())
}
