//! Inbound HBONE (15008): terminates mutual TLS, checks each CONNECT (method,
//! authority, local workload, policy), dials the target and copies.
//!
//! Answers follow Istio: 200 connected; 400 malformed authority or an authority that
//! is not the address the connection reached; 401 denied by policy; 405 not CONNECT;
//! 503 unknown workload, a target port of ztunnel's own, or upstream failure.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::RecvStream;
use http::{Request, StatusCode};
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, info};

use super::connections::{ConnectionDump, Direction, Shown};
use super::result::{ConnectionResult, Endpoints};
use super::{OwnPorts, ProxyInputs};
use crate::hbone::server::{accept_tls, connect_authority, respond_status, serve_counted};
use crate::hbone::stream::{copy_bidirectional, reset_on_close, H2Stream};
use crate::hbone::STREAM_IDLE_TIMEOUT;
use crate::identity::Identity;
use crate::metrics::{Reporter, ResponseFlags, TrafficLabels};
use crate::socket;
use crate::state::policy::ConnectionAttrs;
use crate::tls;

/// The target of a CONNECT, from the request head alone, or the status and metric reason
/// it is refused with: the method must be CONNECT, the authority an `ip:port` on the
/// address the connection reached (`local`), the port none of ztunnel's own.
/// A function of its own for the fuzz target (fuzz/fuzz_targets/hbone_connect.rs).
pub fn connect_target<B>(
    request: &Request<B>,
    local: SocketAddr,
    own_ports: &OwnPorts,
) -> Result<SocketAddr, (StatusCode, &'static str)> {
    let target = connect_authority(request)?;
    if target.ip() != local.ip() {
        info!(%target, reached = %local, "refusing CONNECT for an address the connection did not reach");
        return Err((StatusCode::BAD_REQUEST, "authority_mismatch"));
    }
    if own_ports.contains(target.port()) {
        // As Istio (its SelfCall error): 503. Dialing it would loop into ztunnel.
        info!(%target, "refusing CONNECT to a ztunnel port");
        return Err((StatusCode::SERVICE_UNAVAILABLE, "self_call_hbone"));
    }
    Ok(target)
}

#[derive(Clone)]
pub struct Inbound {
    inputs: ProxyInputs,
    server_config: Arc<tls::ServerConfigCache>,
}

/// The authenticated peer of one HBONE connection.
#[derive(Clone, Debug)]
struct Peer {
    addr: SocketAddr,
    /// The local address the connection reached.
    local: SocketAddr,
    identity: Identity,
}

impl Inbound {
    pub fn new(inputs: ProxyInputs) -> Self {
        Inbound {
            inputs,
            server_config: Arc::default(),
        }
    }

    pub async fn run(self, listener: TcpListener) {
        let drain = self.inputs.drain.clone();
        super::accept_loop(listener, drain, "inbound", move |stream, peer| {
            let this = self.clone();
            async move { this.serve(stream, peer).await }
        })
        .await
    }

    async fn serve(&self, tcp: TcpStream, peer_addr: SocketAddr) {
        let metrics = &self.inputs.metrics;
        let local = match tcp.local_addr() {
            Ok(local) => socket::to_canonical(local),
            Err(_) => return,
        };
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
            addr: peer_addr,
            local,
            identity,
        };
        let this = self.clone();
        let drain = self.inputs.drain.accepting_token();
        serve_counted(
            tls,
            drain,
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
        let refuse =
            |respond: &mut SendResponse<Bytes>, status: StatusCode, reason: &'static str| {
                metrics.error(reason);
                respond_status(respond, status);
            };
        let target = match connect_target(&request, peer.local, &self.inputs.own_ports) {
            Ok(target) => target,
            Err((status, reason)) => return refuse(&mut respond, status, reason),
        };
        let state = &self.inputs.state;
        // On demand, what the state misses of either end is asked for first.
        tokio::join!(
            state.fetch_address(target.ip()),
            state.fetch_address(peer.addr.ip())
        );
        let Some(dst) = state
            .workload_by_ip(target.ip())
            .filter(|w| self.inputs.local.is(w))
        else {
            info!(%target, "refusing CONNECT for a workload that is not local");
            return refuse(
                &mut respond,
                StatusCode::SERVICE_UNAVAILABLE,
                "unknown_workload",
            );
        };
        // A waypoint-bound workload is not refused here, as in Istio: a waypoint's
        // CONNECT arrives with the waypoint's identity, traffic that rightly skips it
        // (to a Service not bound to it, with `istio.io/waypoint-for: workload`) with
        // the client's, and L4 policy decides between them.
        let source = state.workload_by_ip(peer.addr.ip());
        let labels = TrafficLabels::new(Reporter::destination)
            .with_source(source.as_deref())
            .with_source_identity(Some(&peer.identity))
            .with_destination(Some(&dst))
            .with_destination_identity(&self.inputs.local.identity)
            .mutual_tls();
        let ends = Endpoints::new(
            peer.addr,
            peer.local,
            Some(target),
            source.as_deref(),
            Some(&dst),
        );
        let attrs = ConnectionAttrs {
            src_identity: Some(peer.identity.clone()),
            src_ip: peer.addr.ip(),
            dst: target,
        };
        if let Err(denied) = state.authorize(&attrs, &dst) {
            info!(src = %peer.identity, %target, reason = %denied, "connection denied by policy");
            let labels = labels.with_flags(ResponseFlags::Denied);
            ConnectionResult::failed(metrics, ends, labels, policy_rejection(&denied));
            return refuse(&mut respond, StatusCode::UNAUTHORIZED, "policy_denied");
        }
        // In-pod, the app sees the client pod's own address: the HBONE connection was
        // opened from inside that pod's namespace. The `forwarded` header is not
        // trusted for this, so a peer cannot make us spoof an arbitrary address.
        let source_ip = self.inputs.transparent_inbound.then_some(peer.addr.ip());
        let mut upstream =
            match socket::connect(self.inputs.sockets.as_ref(), target, source_ip).await {
                Ok(upstream) => upstream,
                Err(e) => {
                    info!(%target, error = %e, "upstream connect failed");
                    let labels = labels.with_flags(ResponseFlags::ConnectFailure);
                    ConnectionResult::failed(metrics, ends, labels, &e);
                    return refuse(
                        &mut respond,
                        StatusCode::SERVICE_UNAVAILABLE,
                        "upstream_connect",
                    );
                }
            };
        let response = http::Response::new(());
        let send = match respond.send_response(response, false) {
            Ok(send) => send,
            Err(e) => {
                debug!(error = %e, "client went away before the answer");
                return;
            }
        };
        let registration = self.inputs.connections.track(
            Some(attrs),
            Some(Shown {
                workload: self.inputs.local.key(),
                direction: Direction::Inbound,
                dump: ConnectionDump {
                    src: peer.addr.to_string(),
                    original_dst: None,
                    actual_dst: target.to_string(),
                    protocol: "HBONE",
                },
            }),
        );
        let result = ConnectionResult::open(&self.inputs.metrics, ends, labels);
        let stream = H2Stream::new(send, request.into_body());
        let outcome = tokio::select! {
            copied = copy_bidirectional(&mut upstream, stream, &result.sent, &result.received, Some(STREAM_IDLE_TIMEOUT)) => match copied {
                Ok(_) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                    info!(%target, src = %peer.identity, error = %e, "connection closed: idle");
                    metrics.error("hbone_stream_idle");
                    Err(e.to_string())
                }
                Err(e) => Err(e.to_string()),
            },
            () = registration.revoked.cancelled() => {
                info!(%target, src = %peer.identity, "connection closed: no longer allowed by policy");
                Err("connection closed due to policy change".to_owned())
            }
        };
        // A copy that failed has reset its sockets itself; a revoked one is aborted too.
        if outcome.is_err() && registration.revoked.is_cancelled() {
            reset_on_close(&upstream);
        }
        result.record(outcome);
    }
}

/// The access log's error for a denied connection, in Istio's words.
pub(super) fn policy_rejection(denied: &crate::state::Denied) -> String {
    format!("connection closed due to policy rejection: {denied}")
}

#[cfg(test)]
#[path = "inbound_tests.rs"]
mod tests;
