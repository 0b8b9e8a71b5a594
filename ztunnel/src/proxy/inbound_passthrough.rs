//! Inbound plaintext (15006): traffic from sources without a mesh identity, which
//! the capture rules redirected. Policy is checked with no peer identity, then the
//! bytes pass through to the application.

use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, info};

use super::connections::{ConnectionDump, Direction, Shown};
use super::result::{ConnectionResult, Endpoints};
use super::ProxyInputs;
use crate::hbone::stream::{copy_tcp, reset_on_close};
use crate::metrics::{Reporter, ResponseFlags, TrafficLabels};
use crate::socket;
use crate::state::policy::ConnectionAttrs;

#[derive(Clone)]
pub struct InboundPassthrough {
    inputs: ProxyInputs,
}

impl InboundPassthrough {
    pub fn new(inputs: ProxyInputs) -> Self {
        InboundPassthrough { inputs }
    }

    pub async fn run(self, listener: TcpListener) {
        let (drain, metrics) = (self.inputs.drain.clone(), self.inputs.metrics.clone());
        super::accept_redirected(
            listener,
            drain,
            metrics,
            "inbound_plaintext",
            move |stream, peer, target| {
                let this = self.clone();
                async move { this.proxy(stream, peer, target).await }
            },
        )
        .await
    }

    /// Proxies a redirected connection whose original destination was `target`.
    /// (Tests call it with a destination of their choosing: a real one takes an
    /// iptables REDIRECT, i.e. root.)
    async fn proxy(&self, mut client: TcpStream, peer: SocketAddr, target: SocketAddr) {
        let metrics = &self.inputs.metrics;
        if self.inputs.own_ports.contains(target.port()) {
            info!(%target, src = %peer, "refusing plaintext connection to a ztunnel port");
            metrics.error("self_call_inbound_plaintext");
            return;
        }
        let state = &self.inputs.state;
        // On demand, what the state misses of either end is asked for first.
        tokio::join!(
            state.fetch_address(target.ip()),
            state.fetch_address(peer.ip())
        );
        let Some(dst) = state
            .workload_by_ip(target.ip())
            .filter(|w| self.inputs.local.is(w))
        else {
            info!(%target, "plaintext connection for a workload that is not local");
            metrics.error("unknown_workload");
            return;
        };
        if let Some(waypoint) = &dst.waypoint {
            info!(%target, src = %peer, waypoint = %waypoint.destination,
                "refusing plaintext connection: the workload names a waypoint, and plaintext cannot have come through it");
            metrics.error("plaintext_waypoint_required");
            return;
        }
        let source = state.workload_by_ip(peer.ip());
        let labels = TrafficLabels::new(Reporter::destination)
            .with_source(source.as_deref())
            .with_destination(Some(&dst))
            .with_destination_identity(&self.inputs.local.identity);
        let ends = Endpoints::new(peer, target, None, source.as_deref(), Some(&dst));
        let attrs = ConnectionAttrs {
            src_identity: None,
            src_ip: peer.ip(),
            dst: target,
        };
        if let Err(denied) = state.authorize(&attrs, &dst) {
            info!(src = %peer, %target, reason = %denied, "plaintext connection denied by policy");
            let labels = labels.with_flags(ResponseFlags::Denied);
            ConnectionResult::failed(
                metrics,
                ends,
                labels,
                super::inbound::policy_rejection(&denied),
            );
            // `strict_mtls` when a STRICT PeerAuthentication refused plaintext.
            metrics.error(denied.reason());
            return;
        }
        let source_ip = self.inputs.transparent_inbound.then_some(peer.ip());
        let mut upstream =
            match socket::connect(self.inputs.sockets.as_ref(), target, source_ip).await {
                Ok(upstream) => upstream,
                Err(e) => {
                    debug!(%target, error = %e, "upstream connect failed");
                    let labels = labels.with_flags(ResponseFlags::ConnectFailure);
                    ConnectionResult::failed(metrics, ends, labels, &e);
                    return;
                }
            };
        let registration = self.inputs.connections.track(
            Some(attrs),
            Some(Shown {
                workload: self.inputs.local.key(),
                direction: Direction::Inbound,
                dump: ConnectionDump {
                    src: peer.to_string(),
                    original_dst: None,
                    actual_dst: target.to_string(),
                    protocol: "TCP",
                },
            }),
        );
        let result = ConnectionResult::open(&self.inputs.metrics, ends, labels);
        let outcome = tokio::select! {
            copied = copy_tcp(&mut client, &mut upstream, &result.received, &result.sent) => {
                copied.map(drop).map_err(|e| e.to_string())
            }
            () = registration.revoked.cancelled() => {
                info!(%target, src = %peer, "connection closed: no longer allowed by policy");
                Err("connection closed due to policy change".to_owned())
            }
        };
        // A copy that failed has reset its sockets itself; a revoked one is aborted too.
        if outcome.is_err() && registration.revoked.is_cancelled() {
            reset_on_close(&client);
            reset_on_close(&upstream);
        }
        result.record(outcome);
    }
}

#[cfg(test)]
#[path = "inbound_passthrough_tests.rs"]
mod tests;
