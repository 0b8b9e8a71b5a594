//! HTTP through the waypoint: hyper serves the client's tunnel in the port's protocol
//! (HTTP/1.1, or HTTP/2 for `http2`, `h2c` and gRPC ports). Each request is
//! authorized on its own (403 `RBAC: access denied` when denied, as Istio), routed by
//! the HTTPRoute or GRPCRoute bound to its Service (matches, filters, a weighted
//! backend, timeouts, retries; without one, to the Service addressed), and sent over
//! one upstream connection per backend per client connection, in the same protocol
//! (HTTP/2 requests multiplexed on it). Every request is counted and logged.

use std::collections::HashMap;
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
use mesh_model::route::{Filter, HeaderModifier, RequestView, Rule, ServiceRef, Timeouts};
use tokio::sync::Mutex;
use tracing::{debug, info};

use crate::config::WaypointConfig;
use crate::metrics::RequestLabels;
use crate::policy::{Decision, HttpAttributes};
use crate::proxy::{BackendError, Destination, Peer, Waypoint};
use crate::routing::{self, BudgetGuard, RetryPolicy};
use ztunnel::hbone::io::H2Io;
use ztunnel::metrics::ResponseFlags;
use ztunnel::state::service::AppProtocol;

/// Istio's body for a request its RBAC filter denied.
pub const DENIED_BODY: &str = "RBAC: access denied";
/// Largest request head accepted; a larger one gets 431 (HTTP/1.1) or a reset
/// (HTTP/2).
const MAX_HEADER_BYTES: usize = 64 * 1024;
/// Largest request body held for a retry or a mirror; a larger (or unsized) one is
/// streamed, and neither retried nor mirrored (Envoy's buffer limit plays this part).
const MAX_REPLAY_BYTES: u64 = 64 * 1024;
/// The route name in the request metrics when no route applies.
const NO_ROUTE: &str = "default";

/// An upstream connection's sender, in the protocol of the port.
enum Upstream {
    Http1(http1::SendRequest<Body>),
    Http2(http2::SendRequest<Body>),
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

/// A request body: held whole (it can be sent again), or streamed once.
enum RequestBody {
    Held(Bytes),
    Streamed(Option<Incoming>),
}

impl RequestBody {
    async fn read(body: Incoming) -> Result<Self, hyper::Error> {
        let fits = body
            .size_hint()
            .upper()
            .is_some_and(|n| n <= MAX_REPLAY_BYTES);
        if fits {
            Ok(RequestBody::Held(body.collect().await?.to_bytes()))
        } else {
            Ok(RequestBody::Streamed(Some(body)))
        }
    }

    /// The body for the next try; `None` once a streamed body has been sent.
    fn next(&mut self) -> Option<Body> {
        match self {
            RequestBody::Held(bytes) => Some(full(bytes.clone())),
            RequestBody::Streamed(body) => body.take().map(|b| b.boxed()),
        }
    }

    fn replayable(&self) -> bool {
        matches!(self, RequestBody::Held(_))
    }
}

/// Why a try failed without a response.
#[derive(Debug)]
enum TryError {
    Connect(String),
    /// The connection was reset, or closed, before the response's head.
    Reset(String),
    PerTryTimeout,
}

impl TryError {
    fn reason(&self) -> &'static str {
        match self {
            TryError::Connect(_) => "connect-failure",
            TryError::Reset(_) => "reset",
            TryError::PerTryTimeout => "per-try-timeout",
        }
    }
}

impl std::fmt::Display for TryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TryError::Connect(e) => write!(f, "connect failed: {e}"),
            TryError::Reset(e) => write!(f, "reset before the response: {e}"),
            TryError::PerTryTimeout => f.write_str("per-try timeout"),
        }
    }
}

/// What became of one request.
struct Outcome {
    response: Response<Body>,
    flags: ResponseFlags,
    /// Where it was sent (for the labels and the log); the Service addressed when it
    /// was not sent.
    backend: Option<Destination>,
    /// `namespace.name.rule` of the route rule it took, or [`NO_ROUTE`].
    route: String,
}

/// One client connection's HTTP proxy.
#[derive(Clone)]
pub struct HttpProxy {
    waypoint: Waypoint,
    peer: Peer,
    dst: Destination,
    http2: bool,
    /// By backend: its Service's key and port (the Service addressed included).
    upstreams: Arc<Mutex<HashMap<(String, u16), Upstream>>>,
}

impl HttpProxy {
    /// For a client connection speaking HTTP/2 (`http2`) or HTTP/1.1.
    pub(crate) fn new(waypoint: Waypoint, peer: Peer, dst: Destination, http2: bool) -> Self {
        HttpProxy {
            waypoint,
            peer,
            dst,
            http2,
            upstreams: Arc::default(),
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
        let request_bytes = head_size(request.headers()) + request.body().size_hint().lower();
        let host = request
            .headers()
            .get(http::header::HOST)
            .and_then(|h| h.to_str().ok())
            .or_else(|| request.uri().authority().map(|a| a.as_str()))
            .unwrap_or_default()
            .to_owned();
        let config = self.waypoint.config();
        let mut attrs = self.waypoint.attributes(&self.peer, &self.dst);
        attrs.http = Some(HttpAttributes {
            method: method.as_str(),
            path: &path,
            host: &host,
            headers: request.headers(),
        });
        let decision = config.policies.evaluate(&attrs);
        let outcome = match decision {
            Decision::Deny { policy } => {
                info!(src = %self.peer.identity, dst = %self.dst.authority, %method, %path, ?policy, "request denied by policy");
                Outcome {
                    response: text(StatusCode::FORBIDDEN, DENIED_BODY),
                    flags: ResponseFlags::Denied,
                    backend: None,
                    route: NO_ROUTE.into(),
                }
            }
            Decision::Allow => self.route(&config, request).await,
        };
        drop(config);
        let Outcome {
            response,
            flags,
            backend,
            route,
        } = outcome;
        let took = started.elapsed();
        let status = response.status();
        let response_bytes = head_size(response.headers()) + response.body().size_hint().lower();
        // gRPC's status: a trailers-only answer (errors) carries it in its headers;
        // one in the trailers is not read here.
        let grpc_response_status = response
            .headers()
            .get("grpc-status")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_owned();
        let dst = backend.as_ref().unwrap_or(&self.dst);
        let labels = RequestLabels {
            traffic: self
                .waypoint
                .labels(&self.peer, dst)
                .with_flags(flags)
                .with_request_protocol(self.request_protocol()),
            response_code: status.as_u16(),
            grpc_response_status,
            route_name: route.clone(),
        };
        self.waypoint
            .requests
            .record(&labels, took, request_bytes, response_bytes);
        info!(
            src.addr = %self.peer.addr,
            src.identity = %self.peer.identity,
            dst.addr = %dst.target,
            dst.hbone_addr = %self.dst.authority,
            dst.service = dst.service.as_ref().map(|s| s.hostname.as_str()).unwrap_or("unknown"),
            dst.workload = %dst.workload.name,
            route,
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

    /// Routes an allowed request: the rule it takes, its filters, its backend, then
    /// the request sent with the rule's timeouts and retries.
    async fn route(&self, config: &WaypointConfig, request: Request<Incoming>) -> Outcome {
        let (mut parts, body) = request.into_parts();
        let service = self
            .dst
            .service
            .as_ref()
            .map(|s| (s.namespace.as_str(), s.name.as_str()));
        let port = self.dst.authority.port();
        let view = RequestView {
            method: parts.method.as_str(),
            path: parts.uri.path(),
            query: parts.uri.query(),
            headers: &parts.headers,
        };
        let selected = service.and_then(|svc| config.routes.http(svc, port, &view));
        let Some(selected) = selected else {
            if service.is_some_and(|svc| config.routes.has_http(svc, port)) {
                // Routes are bound here, and none matches: 404, as the spec requires.
                return self.refused(StatusCode::NOT_FOUND, ResponseFlags::NoRoute, NO_ROUTE);
            }
            return self
                .send(
                    None,
                    NO_ROUTE,
                    parts,
                    body,
                    Timeouts::default(),
                    RetryPolicy::of(None),
                    Vec::new(),
                )
                .await;
        };
        let rule = selected.rule;
        let route = format!(
            "{}.{}.{}",
            selected.route.namespace, selected.route.name, rule.name
        );
        if let Some(reason) = &rule.unsupported {
            info!(
                route,
                reason, "request refused: its route rule cannot be applied"
            );
            return self.refused(
                StatusCode::INTERNAL_SERVER_ERROR,
                ResponseFlags::NoRoute,
                &route,
            );
        }
        let mut response_headers = Vec::new();
        let mut mirrors = Vec::new();
        for filter in &rule.filters {
            match filter {
                Filter::RequestHeaders(m) => routing::modify_headers(m, &mut parts.headers),
                Filter::ResponseHeaders(m) => response_headers.push(m.clone()),
                Filter::Rewrite(r) => routing::rewrite(r, &mut parts, selected.matched),
                Filter::Mirror(m) if routing::sampled(m.fraction) => {
                    mirrors.push(m.backend.clone())
                }
                Filter::Mirror(_) => {}
                Filter::Redirect(r) => {
                    let location = routing::redirect_location(
                        r,
                        &parts.uri,
                        &parts.headers,
                        selected.matched,
                        port,
                    );
                    let mut response = text(
                        StatusCode::from_u16(r.status).unwrap_or(StatusCode::MOVED_PERMANENTLY),
                        "",
                    );
                    if let Ok(value) = http::HeaderValue::from_str(&location) {
                        response.headers_mut().insert(http::header::LOCATION, value);
                    }
                    for m in &response_headers {
                        routing::modify_headers(m, response.headers_mut());
                    }
                    return Outcome {
                        response,
                        flags: ResponseFlags::None,
                        backend: None,
                        route,
                    };
                }
            }
        }
        let backend = match self.rule_backend(rule, &mut parts, &mut response_headers) {
            Ok(backend) => backend,
            Err(e) => {
                info!(route, error = %e, "request refused: no usable backend");
                let status = match e {
                    BackendError::NoEndpoint => StatusCode::SERVICE_UNAVAILABLE,
                    BackendError::NotFound => StatusCode::INTERNAL_SERVER_ERROR,
                };
                return self.refused(status, ResponseFlags::NoRoute, &route);
            }
        };
        let mut outcome = self
            .send(
                backend,
                &route,
                parts,
                body,
                rule.timeouts,
                RetryPolicy::of(rule.retry.as_ref()),
                mirrors,
            )
            .await;
        for m in &response_headers {
            routing::modify_headers(m, outcome.response.headers_mut());
        }
        outcome
    }

    /// The rule's backend, by weight, with its own filters applied; `None` for the
    /// Service addressed (a rule without backends: the parent Service, as a mesh
    /// route's default).
    fn rule_backend(
        &self,
        rule: &Rule,
        parts: &mut http::request::Parts,
        response_headers: &mut Vec<HeaderModifier>,
    ) -> Result<Option<Destination>, BackendError> {
        if rule.backends.is_empty() {
            return Ok(None);
        }
        let backend = routing::pick_backend(&rule.backends).ok_or(BackendError::NotFound)?;
        if backend.unsupported.is_some() {
            return Err(BackendError::NotFound);
        }
        for filter in &backend.filters {
            match filter {
                Filter::RequestHeaders(m) => routing::modify_headers(m, &mut parts.headers),
                Filter::ResponseHeaders(m) => response_headers.push(m.clone()),
                // Compiled out for backends (redirect), or applied by the rule.
                _ => {}
            }
        }
        self.waypoint.backend(&self.dst, &backend.service).map(Some)
    }

    fn refused(&self, status: StatusCode, flags: ResponseFlags, route: &str) -> Outcome {
        let body = match status {
            StatusCode::NOT_FOUND => "route not found",
            StatusCode::SERVICE_UNAVAILABLE => "no healthy upstream",
            _ => "route backend not usable",
        };
        Outcome {
            response: text(status, body),
            flags,
            backend: None,
            route: route.to_owned(),
        }
    }

    /// Sends the request to `backend` (`None`: the Service addressed), trying again as
    /// `retry` says, all within the rule's request timeout.
    #[allow(clippy::too_many_arguments)]
    async fn send(
        &self,
        backend: Option<Destination>,
        route: &str,
        parts: http::request::Parts,
        body: Incoming,
        timeouts: Timeouts,
        retry: RetryPolicy,
        mirrors: Vec<ServiceRef>,
    ) -> Outcome {
        let dst = backend.unwrap_or_else(|| self.dst.clone());
        let route = route.to_owned();
        let tries = self.tries(&dst, parts, body, timeouts.backend_request, retry, mirrors);
        let result = match timeouts.request.filter(|t| !t.is_zero()) {
            Some(limit) => tokio::time::timeout(limit, tries).await.ok(),
            None => Some(tries.await),
        };
        let (response, flags) = match result {
            None => {
                info!(dst = %dst.target, route, "upstream request timeout");
                (
                    text(StatusCode::GATEWAY_TIMEOUT, "upstream request timeout"),
                    ResponseFlags::UpstreamTimeout,
                )
            }
            Some(Ok(response)) => (response.map(|b| b.boxed()), ResponseFlags::None),
            Some(Err(TryError::PerTryTimeout)) => (
                text(StatusCode::GATEWAY_TIMEOUT, "upstream request timeout"),
                ResponseFlags::UpstreamTimeout,
            ),
            Some(Err(e)) => {
                info!(dst = %dst.target, route, error = %e, "upstream request failed");
                (
                    text(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "upstream connect error or disconnect/reset before headers",
                    ),
                    ResponseFlags::ConnectFailure,
                )
            }
        };
        Outcome {
            response,
            flags,
            backend: Some(dst),
            route,
        }
    }

    /// The tries of one request: the first, and the retries `retry` and the budget
    /// allow (only a held body can be sent again).
    async fn tries(
        &self,
        dst: &Destination,
        parts: http::request::Parts,
        body: Incoming,
        per_try: Option<std::time::Duration>,
        retry: RetryPolicy,
        mirrors: Vec<ServiceRef>,
    ) -> Result<Response<Incoming>, TryError> {
        let mut body = RequestBody::read(body)
            .await
            .map_err(|e| TryError::Reset(format!("reading the request body: {e}")))?;
        if let RequestBody::Held(bytes) = &body {
            for mirror in mirrors {
                self.mirror(mirror, &parts, bytes.clone());
            }
        }
        let backend_key = dst
            .service
            .as_ref()
            .map_or_else(|| dst.target.to_string(), |s| s.key());
        let mut budget: BudgetGuard = self.waypoint.retry_budget.request(&backend_key);
        let mut tried = 0;
        loop {
            let Some(next_body) = body.next() else {
                return Err(TryError::Reset("the request body was already sent".into()));
            };
            let request = Request::from_parts(parts.clone(), next_body);
            let sent = self.send_once(dst, request);
            let result = match per_try.filter(|t| !t.is_zero()) {
                Some(limit) => tokio::time::timeout(limit, sent)
                    .await
                    .unwrap_or(Err(TryError::PerTryTimeout)),
                None => sent.await,
            };
            let reason = match &result {
                Ok(response) if retry.codes.contains(&response.status().as_u16()) => {
                    "retriable-status-code"
                }
                Ok(_) => return result,
                Err(e) => e.reason(),
            };
            if tried >= retry.attempts || !body.replayable() {
                return result;
            }
            if !budget.retry() {
                self.waypoint
                    .requests
                    .retry_budget_exhausted
                    .get_or_create(&backend_key.clone().into())
                    .inc();
                return result;
            }
            tried += 1;
            debug!(dst = %dst.target, reason, tried, "retrying");
            self.waypoint.requests.retried(&backend_key, reason);
            tokio::time::sleep(retry.wait(tried)).await;
        }
    }

    /// Sends one try over the backend's connection, opening it on first use (and
    /// again after it closed).
    async fn send_once(
        &self,
        dst: &Destination,
        request: Request<Body>,
    ) -> Result<Response<Incoming>, TryError> {
        let key = (
            dst.service.as_ref().map(|s| s.key()).unwrap_or_default(),
            dst.authority.port(),
        );
        let mut upstreams = self.upstreams.lock().await;
        if upstreams.get(&key).is_none_or(Upstream::is_closed) {
            let opened = self.open(dst).await.map_err(TryError::Connect)?;
            upstreams.insert(key.clone(), opened);
        }
        let result = match upstreams.get_mut(&key).expect("inserted above") {
            Upstream::Http1(sender) => {
                // One request at a time, as the client's own connection sends them.
                match sender.ready().await {
                    Ok(()) => sender.send_request(request).await,
                    Err(e) => Err(e),
                }
            }
            Upstream::Http2(sender) => {
                // Multiplexed: the lock is not held while the request is in flight.
                let mut sender = sender.clone();
                drop(upstreams);
                match sender.ready().await {
                    Ok(()) => sender.send_request(request).await,
                    Err(e) => Err(e),
                }
            }
        };
        result.map_err(|e| TryError::Reset(e.to_string()))
    }

    /// An upstream connection to `dst`: HBONE (or TCP) to the endpoint, then the HTTP
    /// handshake in the port's protocol.
    async fn open(&self, dst: &Destination) -> Result<Upstream, String> {
        let io = TokioIo::new(self.waypoint.connect(&self.peer, dst).await?);
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

    /// Sends a copy of the request to `mirror` and forgets it: its answer is dropped,
    /// and the original's never waits for it. The copy's host gets `-shadow`, as
    /// Envoy marks mirrored requests.
    fn mirror(&self, mirror: ServiceRef, parts: &http::request::Parts, body: Bytes) {
        let dst = match self.waypoint.backend(&self.dst, &mirror) {
            Ok(dst) => dst,
            Err(e) => {
                debug!(%mirror, error = %e, "request not mirrored");
                return;
            }
        };
        let mut parts = parts.clone();
        if let Some(host) = parts
            .headers
            .get(http::header::HOST)
            .and_then(|h| h.to_str().ok())
        {
            let shadow = match host.rsplit_once(':') {
                Some((h, p)) => format!("{h}-shadow:{p}"),
                None => format!("{host}-shadow"),
            };
            if let Ok(value) = http::HeaderValue::from_str(&shadow) {
                parts.headers.insert(http::header::HOST, value);
            }
        }
        // Its own connection: a slow mirror must not hold the backend's.
        let this = HttpProxy {
            upstreams: Arc::default(),
            ..self.clone()
        };
        tokio::spawn(async move {
            let request = Request::from_parts(parts, full(body));
            match this.send_once(&dst, request).await {
                Ok(response) => {
                    // Read to the end, so the connection closes cleanly.
                    let _ = response.into_body().collect().await;
                }
                Err(e) => debug!(%mirror, error = %e, "mirrored request failed"),
            }
        });
    }
}

fn full(bytes: Bytes) -> Body {
    Full::new(bytes).map_err(|never| match never {}).boxed()
}

fn text(status: StatusCode, body: &'static str) -> Response<Body> {
    let mut response = Response::new(full(Bytes::from_static(body.as_bytes())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain"),
    );
    response
}

/// Approximate size of a message's head (Istio counts headers in its byte metrics).
fn head_size(headers: &http::HeaderMap) -> u64 {
    headers
        .iter()
        .map(|(k, v)| (k.as_str().len() + v.len() + 4) as u64)
        .sum()
}
