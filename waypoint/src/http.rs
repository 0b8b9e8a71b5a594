//! HTTP/1.1 through the waypoint: hyper serves the client's tunnel, each request is
//! authorized on its own (403 `RBAC: access denied` when denied, as Istio), then
//! forwarded over one upstream connection per client connection, opened with the
//! first allowed request. Every request is counted and logged.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body as _;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::Mutex;
use tracing::{debug, info};

use crate::metrics::RequestLabels;
use crate::policy::{Decision, HttpAttributes};
use crate::proxy::{Destination, Peer, Waypoint};
use ztunnel::hbone::io::H2Io;
use ztunnel::metrics::ResponseFlags;

/// Istio's body for a request its RBAC filter denied.
pub const DENIED_BODY: &str = "RBAC: access denied";
/// Largest request head accepted; a larger one gets 431.
const MAX_HEADER_BYTES: usize = 64 * 1024;

type Body = BoxBody<Bytes, hyper::Error>;

/// One client connection's HTTP proxy.
#[derive(Clone)]
pub struct HttpProxy {
    waypoint: Waypoint,
    peer: Peer,
    dst: Destination,
    upstream: Arc<Mutex<Option<SendRequest<Incoming>>>>,
}

impl HttpProxy {
    pub(crate) fn new(waypoint: Waypoint, peer: Peer, dst: Destination) -> Self {
        HttpProxy {
            waypoint,
            peer,
            dst,
            upstream: Arc::default(),
        }
    }

    pub(crate) async fn serve(self, downstream: H2Io) {
        let this = self.clone();
        let service = hyper::service::service_fn(move |request| {
            let this = this.clone();
            async move { Ok::<_, std::convert::Infallible>(this.request(request).await) }
        });
        let served = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(self.waypoint.header_read_timeout)
            .max_buf_size(MAX_HEADER_BYTES)
            .serve_connection(TokioIo::new(downstream), service)
            .await;
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
        let principal = self.peer.identity.to_uri();
        let host = request
            .headers()
            .get(http::header::HOST)
            .and_then(|h| h.to_str().ok())
            .or_else(|| request.uri().authority().map(|a| a.as_str()))
            .unwrap_or_default()
            .to_owned();
        let mut attrs = self.waypoint.attributes(&self.peer, &self.dst, &principal);
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
        let labels = RequestLabels {
            traffic: self
                .waypoint
                .labels(&self.peer, &self.dst)
                .with_flags(flags)
                .http(),
            response_code: status.as_u16(),
            grpc_response_status: "-".into(),
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

    /// Sends an allowed request upstream, opening the connection on first use.
    async fn forward(&self, request: Request<Incoming>) -> Result<Response<Incoming>, String> {
        let mut upstream = self.upstream.lock().await;
        if upstream.as_ref().is_none_or(|s| s.is_closed()) {
            let io = self.waypoint.connect(&self.peer, &self.dst).await?;
            let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
                .await
                .map_err(|e| e.to_string())?;
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    debug!(error = %e, "upstream HTTP connection ended");
                }
            });
            *upstream = Some(sender);
        }
        let sender = upstream.as_mut().expect("set above");
        sender.ready().await.map_err(|e| e.to_string())?;
        sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string())
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
