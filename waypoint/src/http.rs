//! HTTP through the waypoint: hyper serves the client's tunnel in the port's protocol
//! (HTTP/1.1, or HTTP/2 for `http2`, `h2c` and gRPC ports), each request is authorized
//! on its own (403 `RBAC: access denied` when denied, as Istio), then forwarded over
//! one upstream connection per client connection in the same protocol, opened with
//! the first allowed request (HTTP/2 requests share it, multiplexed). Every request is
//! counted and logged.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body as _;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::sync::Mutex;
use tracing::{debug, info};

use crate::metrics::RequestLabels;
use crate::policy::{Decision, HttpAttributes};
use crate::proxy::{Destination, Peer, Waypoint};
use ztunnel::hbone::io::H2Io;
use ztunnel::metrics::ResponseFlags;
use ztunnel::state::service::AppProtocol;

/// Istio's body for a request its RBAC filter denied.
pub const DENIED_BODY: &str = "RBAC: access denied";
/// Largest request head accepted; a larger one gets 431 (HTTP/1.1) or a reset
/// (HTTP/2).
const MAX_HEADER_BYTES: usize = 64 * 1024;

/// The upstream connection's sender, in the protocol of the port.
enum Upstream {
    Http1(http1::SendRequest<Incoming>),
    Http2(http2::SendRequest<Incoming>),
}

impl Upstream {
    fn is_closed(&self) -> bool {
        match self {
            Upstream::Http1(s) => s.is_closed(),
            Upstream::Http2(s) => s.is_closed(),
        }
    }
}

type Body = BoxBody<Bytes, hyper::Error>;

/// One client connection's HTTP proxy.
#[derive(Clone)]
pub struct HttpProxy {
    waypoint: Waypoint,
    peer: Peer,
    dst: Destination,
    http2: bool,
    upstream: Arc<Mutex<Option<Upstream>>>,
}

impl HttpProxy {
    /// For a client connection speaking HTTP/2 (`http2`) or HTTP/1.1.
    pub(crate) fn new(waypoint: Waypoint, peer: Peer, dst: Destination, http2: bool) -> Self {
        HttpProxy {
            waypoint,
            peer,
            dst,
            http2,
            upstream: Arc::default(),
        }
    }

    pub(crate) async fn serve(self, downstream: H2Io) {
        let this = self.clone();
        let service = hyper::service::service_fn(move |request| {
            let this = this.clone();
            async move { Ok::<_, std::convert::Infallible>(this.request(request).await) }
        });
        let io = TokioIo::new(downstream);
        let served = if self.http2 {
            hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .max_header_list_size(MAX_HEADER_BYTES as u32)
                .serve_connection(io, service)
                .await
        } else {
            hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(self.waypoint.header_read_timeout)
                .max_buf_size(MAX_HEADER_BYTES)
                .serve_connection(io, service)
                .await
        };
        if let Err(e) = served {
            // Malformed requests, oversized heads and slow clients end here; hyper
            // has already answered what could be answered (400, 431, 408).
            info!(src = %self.peer.identity, dst = %self.dst.authority, error = %e, "HTTP connection ended with an error");
            self.waypoint.inputs.metrics.error("http_protocol");
        }
    }

    async fn request(&self, request: Request<Incoming>) -> Response<Body> {
        let started = Instant::now();
        let method = request.method().clone();
        let path = request.uri().path().to_owned();
        let request_bytes = head_size(&request) + request.body().size_hint().lower();
        let host = request
            .headers()
            .get(http::header::HOST)
            .and_then(|h| h.to_str().ok())
            .or_else(|| request.uri().authority().map(|a| a.as_str()))
            .unwrap_or_default()
            .to_owned();
        let mut attrs = self.waypoint.attributes(&self.peer, &self.dst);
        attrs.http = Some(HttpAttributes {
            method: method.as_str(),
            path: &path,
            host: &host,
            headers: request.headers(),
        });
        let decision = self.waypoint.policies().evaluate(&attrs);
        let (response, flags) = match decision {
            Decision::Deny { policy } => {
                info!(src = %self.peer.identity, dst = %self.dst.authority, %method, %path, ?policy, "request denied by policy");
                (
                    text(StatusCode::FORBIDDEN, DENIED_BODY),
                    ResponseFlags::Denied,
                )
            }
            Decision::Allow => match self.forward(request).await {
                Ok(response) => (response.map(|b| b.boxed()), ResponseFlags::None),
                Err(e) => {
                    info!(dst = %self.dst.target, error = %e, "upstream request failed");
                    (
                        text(StatusCode::SERVICE_UNAVAILABLE, "upstream connect error"),
                        ResponseFlags::ConnectFailure,
                    )
                }
            },
        };
        let took = started.elapsed();
        let status = response.status();
        let response_bytes = head_size(&response) + response.body().size_hint().lower();
        // gRPC's status: a trailers-only answer (errors) carries it in its headers;
        // one in the trailers is not read here.
        let grpc_response_status = response
            .headers()
            .get("grpc-status")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_owned();
        let labels = RequestLabels {
            traffic: self
                .waypoint
                .labels(&self.peer, &self.dst)
                .with_flags(flags)
                .with_request_protocol(self.request_protocol()),
            response_code: status.as_u16(),
            grpc_response_status,
        };
        self.waypoint
            .requests
            .record(&labels, took, request_bytes, response_bytes);
        info!(
            src.addr = %self.peer.addr,
            src.identity = %self.peer.identity,
            dst.addr = %self.dst.target,
            dst.hbone_addr = %self.dst.authority,
            dst.service = self.dst.service.as_ref().map(|s| s.hostname.as_str()).unwrap_or("unknown"),
            dst.workload = %self.dst.workload.name,
            %method,
            %path,
            status = status.as_u16(),
            duration = format!("{}ms", took.as_millis()),
            "request complete"
        );
        response
    }

    /// Istio's `request_protocol` for this port.
    fn request_protocol(&self) -> &'static str {
        match self.dst.protocol {
            Some(AppProtocol::Grpc) => "grpc",
            _ => "http",
        }
    }

    /// Sends an allowed request upstream, opening the connection on first use.
    async fn forward(&self, request: Request<Incoming>) -> Result<Response<Incoming>, String> {
        let mut upstream = self.upstream.lock().await;
        if upstream.as_ref().is_none_or(Upstream::is_closed) {
            *upstream = Some(self.open().await?);
        }
        match upstream.as_mut().expect("set above") {
            Upstream::Http1(sender) => {
                // One request at a time, as the client's own connection sends them.
                sender.ready().await.map_err(|e| e.to_string())?;
                sender
                    .send_request(request)
                    .await
                    .map_err(|e| e.to_string())
            }
            Upstream::Http2(sender) => {
                // Multiplexed: the lock is not held while the request is in flight.
                let mut sender = sender.clone();
                drop(upstream);
                sender.ready().await.map_err(|e| e.to_string())?;
                sender
                    .send_request(request)
                    .await
                    .map_err(|e| e.to_string())
            }
        }
    }

    /// The upstream connection: HBONE (or TCP) to the endpoint, then the HTTP
    /// handshake in the port's protocol.
    async fn open(&self) -> Result<Upstream, String> {
        let io = TokioIo::new(self.waypoint.connect(&self.peer, &self.dst).await?);
        let ended = |e: hyper::Error| debug!(error = %e, "upstream HTTP connection ended");
        if self.http2 {
            let (sender, connection) = http2::handshake(TokioExecutor::new(), io)
                .await
                .map_err(|e| e.to_string())?;
            tokio::spawn(async move { connection.await.map_err(ended) });
            Ok(Upstream::Http2(sender))
        } else {
            let (sender, connection) = http1::handshake(io).await.map_err(|e| e.to_string())?;
            tokio::spawn(async move { connection.await.map_err(ended) });
            Ok(Upstream::Http1(sender))
        }
    }
}

fn text(status: StatusCode, body: &'static str) -> Response<Body> {
    let mut response = Response::new(
        Full::new(Bytes::from_static(body.as_bytes()))
            .map_err(|never| match never {})
            .boxed(),
    );
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain"),
    );
    response
}

/// Approximate size of a message's head (Istio counts headers in its byte metrics).
fn head_size<T>(message: &T) -> u64
where
    T: HasHeaders,
{
    message
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().len() + v.len() + 4) as u64)
        .sum()
}

trait HasHeaders {
    fn headers(&self) -> &http::HeaderMap;
}

impl<B> HasHeaders for Request<B> {
    fn headers(&self) -> &http::HeaderMap {
        Request::headers(self)
    }
}

impl<B> HasHeaders for Response<B> {
    fn headers(&self) -> &http::HeaderMap {
        Response::headers(self)
    }
}
