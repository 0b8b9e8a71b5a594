//! Outbound (15001): connections the capture rules redirected from the local
//! workload. Mesh destinations get an HBONE tunnel, services are resolved to an
//! endpoint, everything else passes through as plain TCP. A destination bound to a
//! waypoint is tunnelled to the waypoint instead, as Istio's ztunnel does: a Service
//! by its own waypoint (the CONNECT names the VIP), a workload addressed directly by
//! the workload's (the CONNECT names the workload's address). The waypoint picks the
//! endpoint and enforces its L7 policy; a waypoint with no ready instance refuses the
//! connection rather than let it around.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use rand::seq::IndexedRandom;
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, info, warn};

use super::connections::{ConnectionDump, Direction, Shown};
use super::result::{ConnectionResult, Endpoints};
use super::ProxyInputs;
use crate::hbone::early::EarlyData;
use crate::hbone::pool::{ConnectRequest, Pool, PoolKey};
use crate::hbone::stream::{copy_bidirectional, copy_tcp};
use crate::identity::Identity;
use crate::metrics::{Reporter, ResponseFlags, TrafficLabels};
use crate::socket;
use crate::state::service::{IpFamilies, Service};
use crate::state::workload::{GatewayAddress, Protocol, Workload};
use crate::state::ProxyState;
use shared_types::constants::HBONE_PORT;

/// How long pooled HBONE connections may sit idle (Istio: 5 minutes).
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Clone)]
pub struct Outbound {
    inputs: ProxyInputs,
    pool: Arc<Pool>,
}

/// Where an outbound connection goes.
#[derive(Debug)]
enum Route {
    /// Through the destination's ztunnel.
    Hbone {
        workload: Arc<Workload>,
        service: Option<Arc<Service>>,
        target: SocketAddr,
    },
    /// Straight to the destination (non-mesh, or a mesh workload without HBONE).
    Passthrough {
        workload: Option<Arc<Workload>>,
        service: Option<Arc<Service>>,
        target: SocketAddr,
    },
    /// Through the destination's waypoint: HBONE to one of its instances, the
    /// CONNECT naming the original destination.
    Waypoint {
        waypoint: Arc<Workload>,
        /// The instance's HBONE address.
        hbone: SocketAddr,
        /// The Service addressed, if it was one.
        service: Option<Arc<Service>>,
    },
    /// The destination names a waypoint that has no ready instance: refused, as going
    /// around it would skip its policy. (which resource, the waypoint it names)
    WaypointUnavailable { bound: String, waypoint: String },
}

/// The address of `workload` a connection to `service`'s VIP `vip` goes to: of the
/// Service's own family when it has only one (`ip_families`), else of the VIP's;
/// any address of the workload when it has none of that family.
fn endpoint_ip(service: &Service, workload: &Workload, vip: IpAddr) -> Option<IpAddr> {
    let v4 = match service.ip_families {
        Some(IpFamilies::IPv4) => true,
        Some(IpFamilies::IPv6) => false,
        Some(IpFamilies::Dual) | None => vip.is_ipv4(),
    };
    workload.address_of_family(v4)
}

/// The next hop of an HBONE tunnel.
struct Hop {
    /// The workload whose ztunnel (or waypoint) terminates the tunnel.
    next: Arc<Workload>,
    /// Identities it may present.
    expected: Vec<Identity>,
    /// The Service addressed, for the metrics.
    service: Option<Arc<Service>>,
    /// Where the tunnel's TLS goes (`ip:15008`).
    hbone: SocketAddr,
    /// The CONNECT's target.
    authority: SocketAddr,
}

impl Hop {
    /// Straight to the endpoint's ztunnel, which may present the endpoint's identity
    /// or one of the Service's SANs.
    fn direct(workload: Arc<Workload>, service: Option<Arc<Service>>, target: SocketAddr) -> Self {
        let mut expected = vec![workload.identity()];
        if let Some(svc) = &service {
            expected.extend(
                svc.subject_alt_names
                    .iter()
                    .filter_map(|san| san.parse::<Identity>().ok()),
            );
        }
        Hop {
            next: workload,
            expected,
            service,
            hbone: SocketAddr::new(target.ip(), HBONE_PORT),
            authority: target,
        }
    }
}

/// The route through `waypoint` for a connection to `dst` (bound as `bound()` says):
/// a random instance with an address of `dst`'s family (else any), or
/// [`Route::WaypointUnavailable`] when it has none. `None` when the source is an
/// instance of that waypoint: its own traffic goes on to the destination, never back
/// through itself.
fn via_waypoint(
    state: &ProxyState,
    waypoint: &GatewayAddress,
    dst: SocketAddr,
    source: Option<&Workload>,
    bound: impl FnOnce() -> String,
    service: Option<Arc<Service>>,
) -> Option<Route> {
    let instances = state.gateway_workloads(waypoint);
    if source.is_some_and(|s| instances.iter().any(|i| i.uid == s.uid)) {
        return None;
    }
    let reachable: Vec<(Arc<Workload>, IpAddr)> = instances
        .into_iter()
        .filter_map(|w| Some((w.clone(), w.address_of_family(dst.is_ipv4())?)))
        .collect();
    let Some((instance, ip)) = reachable.choose(&mut rand::rng()).cloned() else {
        return Some(Route::WaypointUnavailable {
            bound: bound(),
            waypoint: waypoint.destination.to_string(),
        });
    };
    let port = match waypoint.hbone_mtls_port {
        0 => HBONE_PORT,
        port => port,
    };
    Some(Route::Waypoint {
        waypoint: instance,
        hbone: SocketAddr::new(ip, port),
        service,
    })
}

impl Outbound {
    pub fn new(inputs: ProxyInputs) -> Self {
        let pool = Pool::new(
            inputs.certs.clone(),
            inputs.sockets.clone(),
            inputs.metrics.clone(),
            POOL_IDLE_TIMEOUT,
        );
        Outbound { inputs, pool }
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    pub async fn run(self, listener: TcpListener) {
        let (drain, metrics) = (self.inputs.drain.clone(), self.inputs.metrics.clone());
        super::accept_redirected(
            listener,
            drain,
            metrics,
            "outbound",
            move |stream, peer, target| {
                let this = self.clone();
                async move { this.proxy(stream, peer, target).await }
            },
        )
        .await
    }

    /// Proxies a redirected connection whose original destination was `orig_dst`.
    /// (Tests call it with a destination of their choosing: a real one takes an
    /// iptables REDIRECT, i.e. root.)
    async fn proxy(&self, client: TcpStream, peer: SocketAddr, orig_dst: SocketAddr) {
        let metrics = &self.inputs.metrics;
        let listener = client.local_addr().ok().map(socket::to_canonical);
        // On demand, what the state misses of either end is asked for first.
        let state = &self.inputs.state;
        tokio::join!(
            state.fetch_address(orig_dst.ip()),
            state.fetch_address(peer.ip())
        );
        if self.is_self_call(orig_dst, listener) {
            warn!(dst = %orig_dst, "refusing connection to a ztunnel port (loop)");
            metrics.error("self_call_outbound");
            return;
        }
        let source = self.inputs.local_workload();
        let route = match self.route(orig_dst, source.as_deref()) {
            Some(route) => route,
            None => {
                warn!(dst = %orig_dst, "service has no healthy endpoint");
                metrics.error("no_healthy_upstream");
                return;
            }
        };
        let src_identity = &self.inputs.local.identity;
        match route {
            Route::Hbone {
                workload,
                service,
                target,
            } => {
                let hop = Hop::direct(workload, service, target);
                self.tunnel(client, peer, orig_dst, src_identity, source.as_deref(), hop)
                    .await
            }
            Route::Waypoint {
                waypoint,
                hbone,
                service,
            } => {
                let hop = Hop {
                    expected: vec![waypoint.identity()],
                    next: waypoint,
                    service,
                    hbone,
                    authority: orig_dst,
                };
                self.tunnel(client, peer, orig_dst, src_identity, source.as_deref(), hop)
                    .await
            }
            Route::WaypointUnavailable { bound, waypoint } => {
                // Fail closed, as Istio does for a waypoint it cannot resolve: going
                // around the waypoint would skip the L7 policy it enforces.
                info!(dst = %orig_dst, %bound, %waypoint,
                    "refusing connection: the destination's waypoint has no ready instance");
                metrics.error("waypoint_unavailable");
            }
            Route::Passthrough {
                workload,
                service,
                target,
            } => {
                let labels = TrafficLabels::new(Reporter::source)
                    .with_source(source.as_deref())
                    .with_source_identity(Some(src_identity))
                    .with_destination(workload.as_deref())
                    .with_service(service.as_deref());
                let ends =
                    Endpoints::new(peer, target, None, source.as_deref(), workload.as_deref());
                self.passthrough(client, orig_dst, ends, labels).await
            }
        }
    }

    /// A connection to ztunnel itself: its own listener, or one of its ports on a local
    /// address (loopback, or the local workload's own IP). As Istio, a port of ours on
    /// another host is not refused here: a mesh destination's ztunnel refuses it, and
    /// anything else is not ours.
    fn is_self_call(&self, dst: SocketAddr, listener: Option<SocketAddr>) -> bool {
        if Some(dst) == listener {
            return true;
        }
        if !self.inputs.own_ports.contains(dst.port()) {
            return false;
        }
        let ip = dst.ip();
        ip.is_loopback()
            || ip.is_unspecified()
            || self
                .inputs
                .local_workload()
                .is_some_and(|w| w.workload_ips.contains(&ip))
    }

    /// Where a connection from `source` to `dst` goes; `None` for a Service with no
    /// ready endpoint.
    fn route(&self, dst: SocketAddr, source: Option<&Workload>) -> Option<Route> {
        let state = &self.inputs.state.snapshot();
        if let Some(service) = state.service_by_vip(dst.ip()) {
            if let Some(waypoint) = &service.waypoint {
                let bound = || format!("service {}", service.key());
                if let Some(route) =
                    via_waypoint(state, waypoint, dst, source, bound, Some(service.clone()))
                {
                    return Some(route);
                }
            }
            let (workload, target_port) = state.pick_endpoint(&service, dst.port())?;
            let ip = endpoint_ip(&service, &workload, dst.ip())?;
            let target = SocketAddr::new(ip, target_port);
            return Some(match workload.protocol {
                Protocol::Hbone => Route::Hbone {
                    workload,
                    service: Some(service),
                    target,
                },
                _ => Route::Passthrough {
                    workload: Some(workload),
                    service: Some(service),
                    target,
                },
            });
        }
        let workload = state.workload_by_ip(dst.ip());
        if let Some(waypoint) = workload.as_ref().and_then(|w| w.waypoint.as_ref()) {
            let bound = || format!("workload {}", workload.as_ref().expect("bound"));
            if let Some(route) = via_waypoint(state, waypoint, dst, source, bound, None) {
                return Some(route);
            }
        }
        Some(match workload {
            Some(workload) if workload.protocol == Protocol::Hbone => Route::Hbone {
                workload,
                service: None,
                target: dst,
            },
            workload => Route::Passthrough {
                workload,
                service: None,
                target: dst,
            },
        })
    }

    async fn tunnel(
        &self,
        mut client: TcpStream,
        peer: SocketAddr,
        orig_dst: SocketAddr,
        src_identity: &Identity,
        source: Option<&Workload>,
        hop: Hop,
    ) {
        let dst_identity = hop.next.identity();
        let target = hop.authority;
        let request = ConnectRequest {
            key: PoolKey {
                src_identity: src_identity.clone(),
                dst_identity: dst_identity.clone(),
                dst: hop.hbone,
                src_ip: Some(peer.ip()),
            },
            expected_identities: hop.expected,
            authority: target,
            client: peer,
            baggage: self.baggage(source),
        };
        let labels = TrafficLabels::new(Reporter::source)
            .with_source(source)
            .with_source_identity(Some(src_identity))
            .with_destination(Some(&hop.next))
            .with_service(hop.service.as_deref())
            .mutual_tls();
        let ends = Endpoints::new(peer, hop.hbone, Some(target), source, Some(&hop.next));
        let mut early = EarlyData::new(&mut client);
        let connected = self
            .pool
            .connect_with_early_data(&request, &mut early)
            .await;
        let early_bytes = early.len() as u64;
        drop(early); // its copies of the early bytes: not for the connection's lifetime
        let stream = match connected {
            Ok(stream) => stream,
            Err(e) => {
                warn!(dst = %target, identity = %dst_identity, error = %e, "HBONE connect failed");
                let labels = labels.with_flags(ResponseFlags::ConnectFailure);
                ConnectionResult::failed(&self.inputs.metrics, ends, labels, &e);
                self.inputs.metrics.error("hbone_connect_failed");
                return;
            }
        };
        let _shown = self.show(peer, orig_dst, target, "HBONE");
        let result = ConnectionResult::open(&self.inputs.metrics, ends, labels);
        result.received.add(early_bytes);
        let copied =
            copy_bidirectional(&mut client, stream, &result.received, &result.sent, None).await;
        if let Err(e) = &copied {
            debug!(dst = %target, error = %e, "connection ended with an error");
        }
        result.record(copied.map(drop));
    }

    /// Lists the connection under the local workload in `/config_dump` while the
    /// registration lives.
    fn show(
        &self,
        peer: SocketAddr,
        orig_dst: SocketAddr,
        target: SocketAddr,
        protocol: &'static str,
    ) -> super::connections::Registration {
        self.inputs.connections.track(
            None,
            Some(Shown {
                workload: self.inputs.local.key(),
                direction: Direction::Outbound,
                dump: ConnectionDump {
                    src: peer.to_string(),
                    original_dst: Some(orig_dst.to_string()),
                    actual_dst: target.to_string(),
                    protocol,
                },
            }),
        )
    }

    async fn passthrough(
        &self,
        mut client: TcpStream,
        orig_dst: SocketAddr,
        ends: Endpoints,
        labels: TrafficLabels,
    ) {
        let target = ends.dst;
        let mut upstream = match socket::connect(self.inputs.sockets.as_ref(), target, None).await {
            Ok(upstream) => upstream,
            Err(e) => {
                debug!(dst = %target, error = %e, "passthrough connect failed");
                let labels = labels.with_flags(ResponseFlags::ConnectFailure);
                ConnectionResult::failed(&self.inputs.metrics, ends, labels, &e);
                return;
            }
        };
        let _shown = self.show(ends.src, orig_dst, target, "TCP");
        let result = ConnectionResult::open(&self.inputs.metrics, ends, labels);
        let copied = copy_tcp(&mut client, &mut upstream, &result.received, &result.sent).await;
        if let Err(e) = &copied {
            debug!(dst = %target, error = %e, "passthrough ended with an error");
        }
        result.record(copied.map(drop));
    }

    /// W3C baggage describing the source, as Istio's ztunnel sends it.
    fn baggage(&self, source: Option<&Workload>) -> String {
        let local = &self.inputs.local;
        let name = source.map(|w| w.name.as_str()).unwrap_or(&local.name);
        format!(
            "k8s.cluster.name={},k8s.namespace.name={},k8s.pod.name={name},service.name={name},service.version=latest",
            self.inputs.cluster_id, local.namespace
        )
    }
}

#[cfg(test)]
#[path = "outbound_tests.rs"]
mod tests;
