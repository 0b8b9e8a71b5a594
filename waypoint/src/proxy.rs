//! The waypoint's data path: HBONE in on 15008, policy, HBONE (or TCP) out.
//!
//! Each CONNECT names the original destination: a Service VIP:port bound to this
//! waypoint, or the address of a workload bound to it. The waypoint picks a ready
//! endpoint (at random, as ztunnel), and tunnels to the endpoint's ztunnel with its
//! own identity (plain TCP for an endpoint outside the mesh). A port whose Service
//! declares HTTP/1.1 is served as HTTP: every request is authorized, forwarded and
//! counted on its own; anything else is authorized once and copied as TCP.
//!
//! Answers to a CONNECT: 200 connected; 400 an authority that is not an address or
//! not bound to this waypoint; 401 denied (TCP); 503 no endpoint, or upstream failed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::RecvStream;
use http::{Request, StatusCode};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, info};

use crate::config::{SharedConfig, WaypointConfig};
use crate::http::HttpProxy;
use crate::metrics::RequestMetrics;
use crate::policy::{Attributes, Decision};
use crate::routing::{pick_backend, RetryBudget};
use mesh_model::route::{Rule, ServiceRef};
use shared_types::constants::HBONE_PORT;
use ztunnel::hbone::io::H2Io;
use ztunnel::hbone::pool::{ConnectRequest, Pool, PoolKey};
use ztunnel::hbone::server::{accept_tls, connect_authority, respond_status, serve_counted};
use ztunnel::hbone::stream::H2Stream;
use ztunnel::identity::Identity;
use ztunnel::metrics::{Reporter, ResponseFlags, TrafficLabels};
use ztunnel::proxy::result::{ConnectionResult, Endpoints};
use ztunnel::proxy::ProxyInputs;
use ztunnel::socket;
use ztunnel::state::service::{AppProtocol, Service};
use ztunnel::state::workload::{GatewayAddress, Protocol, Workload};

/// A bidirectional byte stream to the next hop: an HBONE stream or a TCP socket.
pub trait Upstream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Upstream for T {}

#[derive(Clone)]
pub struct Waypoint {
    pub(crate) inputs: ProxyInputs,
    pool: Arc<Pool>,
    config: SharedConfig,
    pub(crate) requests: RequestMetrics,
    pub(crate) retry_budget: RetryBudget,
    pub(crate) header_read_timeout: Duration,
    /// Backend Services are named `<name>.<namespace>.svc.<domain>`.
    cluster_domain: String,
    server_config: Arc<ztunnel::tls::ServerConfigCache>,
}

/// The authenticated peer of one HBONE connection (a client's ztunnel).
#[derive(Clone, Debug)]
pub(crate) struct Peer {
    pub addr: SocketAddr,
    pub identity: Identity,
    /// `identity` as a SPIFFE URI, once per connection rather than per request.
    pub principal: String,
}

/// Where one CONNECT goes.
#[derive(Clone, Debug)]
pub(crate) struct Destination {
    /// The CONNECT's authority: the original destination.
    pub authority: SocketAddr,
    pub service: Option<Arc<Service>>,
    pub workload: Arc<Workload>,
    /// The endpoint's address and target port.
    pub target: SocketAddr,
    pub protocol: Option<AppProtocol>,
}

impl Waypoint {
    pub fn new(
        inputs: ProxyInputs,
        config: SharedConfig,
        requests: RequestMetrics,
        header_read_timeout: Duration,
        cluster_domain: String,
    ) -> Self {
        let pool = Pool::new(
            inputs.certs.clone(),
            inputs.sockets.clone(),
            inputs.metrics.clone(),
            ztunnel::proxy::outbound::POOL_IDLE_TIMEOUT,
        );
        Waypoint {
            inputs,
            pool,
            config,
            requests,
            retry_budget: RetryBudget::default(),
            header_read_timeout,
            cluster_domain,
            server_config: Arc::default(),
        }
    }

    pub async fn run(self, listener: TcpListener) {
        let drain = self.inputs.drain.clone();
        ztunnel::proxy::accept_loop(listener, drain, "waypoint", move |stream, peer| {
            let this = self.clone();
            async move { this.serve(stream, peer).await }
        })
        .await
    }

    async fn serve(&self, tcp: TcpStream, addr: SocketAddr) {
        let metrics = &self.inputs.metrics;
        let inputs = &self.inputs;
        let Some((tls, identity)) = accept_tls(
            tcp,
            &self.server_config,
            &inputs.certs,
            &inputs.local.identity,
            metrics,
        )
        .await
        else {
            return;
        };
        let peer = Peer {
            addr: socket::to_canonical(addr),
            principal: identity.to_uri(),
            identity,
        };
        let this = self.clone();
        serve_counted(
            tls,
            self.inputs.drain.accepting_token(),
            move |request, respond| {
                let this = this.clone();
                let peer = peer.clone();
                async move { this.handle(peer, request, respond).await }
            },
            metrics.clone(),
        )
        .await;
    }

    async fn handle(
        &self,
        peer: Peer,
        request: Request<RecvStream>,
        mut respond: SendResponse<Bytes>,
    ) {
        let metrics = &self.inputs.metrics;
        let mut refuse = |status: StatusCode, reason: &'static str| {
            metrics.error(reason);
            respond_status(&mut respond, status);
        };
        let authority = match connect_authority(&request) {
            Ok(authority) => authority,
            Err((status, reason)) => return refuse(status, reason),
        };
        let state = &self.inputs.state;
        tokio::join!(
            state.fetch_address(authority.ip()),
            state.fetch_address(peer.addr.ip())
        );
        let dst = match self.resolve(authority) {
            Ok(dst) => dst,
            Err((status, reason)) => return refuse(status, reason),
        };
        let response = match respond.send_response(http::Response::new(()), false) {
            Ok(send) => send,
            Err(e) => {
                debug!(error = %e, "client went away before the answer");
                return;
            }
        };
        let downstream = H2Io::new(H2Stream::new(response, request.into_body()));
        let http2 = match dst.protocol {
            Some(AppProtocol::Http11) => false,
            Some(AppProtocol::Http2 | AppProtocol::Grpc) => true,
            None => return self.tcp(peer, dst, downstream).await,
        };
        HttpProxy::new(self.clone(), peer, dst, http2)
            .serve(downstream)
            .await
    }

    /// The destination of a CONNECT for `authority`, or why it is refused.
    fn resolve(&self, authority: SocketAddr) -> Result<Destination, (StatusCode, &'static str)> {
        let state = self.inputs.state.snapshot();
        let not_served = || {
            info!(%authority, "refusing CONNECT for a destination not bound to this waypoint");
            (StatusCode::BAD_REQUEST, "authority_not_served")
        };
        if let Some(service) = state.service_by_vip(authority.ip()) {
            if !self.is_me(&state, service.waypoint.as_ref()) {
                return Err(not_served());
            }
            let Some((workload, port)) = state.pick_endpoint(&service, authority.port()) else {
                info!(%authority, service = %service.key(), "no healthy endpoint");
                return Err((StatusCode::SERVICE_UNAVAILABLE, "no_healthy_upstream"));
            };
            let ip = workload
                .address_of_family(authority.is_ipv4())
                .ok_or((StatusCode::SERVICE_UNAVAILABLE, "no_healthy_upstream"))?;
            return Ok(Destination {
                authority,
                protocol: service.app_protocols.get(&authority.port()).copied(),
                service: Some(service),
                workload,
                target: SocketAddr::new(ip, port),
            });
        }
        let Some(workload) = state.workload_by_ip(authority.ip()) else {
            return Err(not_served());
        };
        if !self.is_me(&state, workload.waypoint.as_ref()) {
            return Err(not_served());
        }
        // Addressed directly: the protocol of the Service port that targets this port.
        let protocol = workload.services.iter().find_map(|(key, ports)| {
            let service = state.service_by_key(key)?;
            ports
                .iter()
                .find(|(_, target)| **target == authority.port())
                .and_then(|(port, _)| service.app_protocols.get(port).copied())
        });
        Ok(Destination {
            authority,
            service: None,
            workload,
            target: authority,
            protocol,
        })
    }

    /// Whether `waypoint` names this waypoint (one of its instances is us).
    fn is_me(&self, state: &ztunnel::state::ProxyState, waypoint: Option<&GatewayAddress>) -> bool {
        waypoint.is_some_and(|w| {
            state
                .gateway_workloads(w)
                .iter()
                .any(|i| self.inputs.local.is(i))
        })
    }

    /// Opens the next hop: HBONE to the endpoint's ztunnel with the waypoint's own
    /// identity, or TCP to an endpoint outside the mesh.
    pub(crate) async fn connect(
        &self,
        peer: &Peer,
        dst: &Destination,
    ) -> Result<Box<dyn Upstream>, String> {
        if dst.workload.protocol != Protocol::Hbone {
            let tcp = socket::connect(self.inputs.sockets.as_ref(), dst.target, None)
                .await
                .map_err(|e| e.to_string())?;
            return Ok(Box::new(tcp));
        }
        let dst_identity = dst.workload.identity();
        let mut expected = vec![dst_identity.clone()];
        if let Some(svc) = &dst.service {
            expected.extend(
                svc.subject_alt_names
                    .iter()
                    .filter_map(|san| san.parse::<Identity>().ok()),
            );
        }
        let request = ConnectRequest {
            key: PoolKey {
                src_identity: self.inputs.local.identity.clone(),
                dst_identity,
                dst: SocketAddr::new(dst.target.ip(), HBONE_PORT),
                src_ip: None,
            },
            expected_identities: expected,
            authority: dst.target,
            client: peer.addr,
            baggage: String::new(),
        };
        let stream = self
            .pool
            .connect(&request)
            .await
            .map_err(|e| e.to_string())?;
        Ok(Box::new(H2Io::new(stream)))
    }

    /// The labels of traffic from `peer` to `dst`, as the waypoint reports it.
    pub(crate) fn labels(&self, peer: &Peer, dst: &Destination) -> TrafficLabels {
        let state = &self.inputs.state;
        let source = state.workload_by_ip(peer.addr.ip());
        TrafficLabels::new(Reporter::waypoint)
            .with_source(source.as_deref())
            .with_source_identity(Some(&peer.identity))
            .with_destination(Some(&dst.workload))
            .with_destination_identity(&dst.workload.identity())
            .with_service(dst.service.as_deref())
            .mutual_tls()
    }

    pub(crate) fn attributes<'a>(&self, peer: &'a Peer, dst: &'a Destination) -> Attributes<'a> {
        Attributes {
            source_principal: Some(&peer.principal),
            source_ip: peer.addr.ip(),
            destination_ip: dst.authority.ip(),
            destination_port: dst.authority.port(),
            service: dst
                .service
                .as_deref()
                .map(|s| (s.namespace.as_str(), s.name.as_str())),
            http: None,
        }
    }

    /// The policies and routes in force now.
    pub(crate) fn config(&self) -> Arc<WaypointConfig> {
        self.config
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Where a route's backend sends traffic that came for `dst`: `dst` itself when
    /// the backend is the Service addressed (its endpoint was chosen with the
    /// CONNECT), else a ready endpoint of the backend Service, on the backend's port
    /// (the port addressed when the backend names none).
    pub(crate) fn backend(
        &self,
        dst: &Destination,
        backend: &ServiceRef,
    ) -> Result<Destination, BackendError> {
        let port = backend.port.unwrap_or(dst.authority.port());
        if let Some(svc) = &dst.service {
            if svc.namespace == backend.namespace
                && svc.name == backend.name
                && port == dst.authority.port()
            {
                return Ok(dst.clone());
            }
        }
        let state = self.inputs.state.snapshot();
        let hostname = backend.hostname(&self.cluster_domain);
        let service = state
            .service_by_hostname(&hostname, &backend.namespace)
            .filter(|s| s.namespace == backend.namespace)
            .ok_or(BackendError::NotFound)?;
        let vip = service
            .vips
            .iter()
            .map(|v| v.address)
            .find(|ip| ip.is_ipv4() == dst.authority.is_ipv4())
            .or_else(|| service.vips.first().map(|v| v.address))
            .ok_or(BackendError::NotFound)?;
        let (workload, target_port) = state
            .pick_endpoint(&service, port)
            .ok_or(BackendError::NoEndpoint)?;
        let ip = workload
            .address_of_family(vip.is_ipv4())
            .ok_or(BackendError::NoEndpoint)?;
        Ok(Destination {
            authority: SocketAddr::new(vip, port),
            protocol: dst.protocol,
            service: Some(service),
            workload,
            target: SocketAddr::new(ip, target_port),
        })
    }

    /// The TCPRoute rule for a connection to `dst`, if one is bound to its Service.
    fn tcp_rule(config: &WaypointConfig, dst: &Destination) -> Option<Rule> {
        let svc = dst.service.as_ref()?;
        config
            .routes
            .tcp((&svc.namespace, &svc.name), dst.authority.port())
            .map(|s| s.rule.clone())
    }

    /// A TCP stream through the waypoint: authorized once, then copied.
    async fn tcp(&self, peer: Peer, dst: Destination, mut downstream: H2Io) {
        let metrics = &self.inputs.metrics;
        let labels = self.labels(&peer, &dst);
        let source = self.inputs.state.workload_by_ip(peer.addr.ip());
        let ends = Endpoints::new(
            peer.addr,
            dst.target,
            Some(dst.authority),
            source.as_deref(),
            Some(&dst.workload),
        );
        let config = self.config();
        let decision = config.policies.evaluate(&self.attributes(&peer, &dst));
        if let Decision::Deny { policy } = decision {
            info!(src = %peer.identity, dst = %dst.authority, ?policy, "connection denied by policy");
            metrics.error("policy_denied");
            let labels = labels.with_flags(ResponseFlags::Denied);
            ConnectionResult::failed(
                metrics,
                ends,
                labels,
                "connection closed due to policy rejection",
            );
            return;
        }
        // A TCPRoute bound to the Service sends the connection to one of its backends.
        let dst = match Self::tcp_rule(&config, &dst) {
            None => Ok(dst),
            Some(rule) => match pick_backend(&rule.backends) {
                Some(b) if b.unsupported.is_none() => self.backend(&dst, &b.service),
                _ => Err(BackendError::NotFound),
            },
        };
        drop(config);
        let dst = match dst {
            Ok(dst) => dst,
            Err(e) => {
                info!(src = %peer.identity, error = %e, "TCP route has no usable backend");
                metrics.error("no_route_backend");
                ConnectionResult::failed(metrics, ends, labels, e.to_string());
                return;
            }
        };
        let labels = self.labels(&peer, &dst);
        let mut upstream = match self.connect(&peer, &dst).await {
            Ok(upstream) => upstream,
            Err(e) => {
                info!(dst = %dst.target, error = %e, "upstream connect failed");
                metrics.error("upstream_connect");
                let labels = labels.with_flags(ResponseFlags::ConnectFailure);
                ConnectionResult::failed(metrics, ends, labels, e);
                return;
            }
        };
        let result = ConnectionResult::open(metrics, ends, labels);
        let copied = tokio::io::copy_bidirectional(&mut downstream, &mut upstream).await;
        if let Ok((up, down)) = copied {
            result.received.add(up);
            result.sent.add(down);
        }
        result.record(copied.map(drop));
    }
}

/// Why a route's backend cannot take a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum BackendError {
    #[error("the backend Service is not known")]
    NotFound,
    #[error("the backend Service has no ready endpoint")]
    NoEndpoint,
}
