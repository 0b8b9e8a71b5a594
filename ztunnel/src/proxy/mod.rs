//! The three listeners a ztunnel runs for each workload it serves: outbound capture
//! (15001), inbound HBONE (15008) and inbound plaintext (15006).

pub mod connections;
#[cfg(test)]
pub(crate) mod fixtures;
pub mod inbound;
pub mod inbound_passthrough;
pub mod outbound;
pub mod result;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;

use shared_types::constants::{
    DNS_CAPTURE_PORT, HBONE_PORT, INBOUND_PLAINTEXT_PORT, OUTBOUND_CAPTURE_PORT,
    ZTUNNEL_ADMIN_PORT, ZTUNNEL_METRICS_PORT, ZTUNNEL_READINESS_PORT,
};

use futures::future::Either;
use tokio::net::TcpListener;
use tracing::{info, warn};

use crate::drain::Drain;
use crate::identity::{Identity, SecretManager};
use crate::metrics::Metrics;
use crate::socket::SocketFactory;
use crate::state::workload::Workload;
use crate::state::StateStore;
use connections::ConnectionManager;

/// The workload a proxy instance serves: the VM's in dedicated mode, one pod's in
/// shared (in-pod) mode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalWorkload {
    pub namespace: String,
    pub name: String,
    pub identity: Identity,
}

impl LocalWorkload {
    /// True when `w` is this workload (by namespace and name).
    pub fn is(&self, w: &Workload) -> bool {
        w.namespace == self.namespace && w.name == self.name
    }

    /// `(namespace, name)`, the key its connections are listed under.
    pub fn key(&self) -> (String, String) {
        (self.namespace.clone(), self.name.clone())
    }
}

/// Everything the listeners of one workload share.
#[derive(Clone)]
pub struct ProxyInputs {
    pub state: StateStore,
    pub certs: SecretManager,
    pub metrics: Arc<Metrics>,
    pub connections: Arc<ConnectionManager>,
    pub sockets: Arc<dyn SocketFactory>,
    pub local: LocalWorkload,
    pub drain: Drain,
    /// Deliver inbound traffic from the original client's IP (in-pod mode).
    pub transparent_inbound: bool,
    pub cluster_id: String,
    /// Ports no connection may be addressed to (loop protection).
    pub own_ports: OwnPorts,
}

impl ProxyInputs {
    /// The local workload as discovery knows it, if it does.
    pub fn local_workload(&self) -> Option<Arc<Workload>> {
        self.state
            .workload_by_name(&self.local.namespace, &self.local.name)
    }
}

/// Addresses the three listeners bind to.
#[derive(Clone, Copy, Debug)]
pub struct ListenAddrs {
    pub outbound: SocketAddr,
    pub inbound: SocketAddr,
    pub inbound_plaintext: SocketAddr,
    /// Whether the inbound ones accept for any address (`IP_TRANSPARENT`).
    pub transparent: bool,
    /// Also bind each IPv4 wildcard or loopback address's IPv6 twin
    /// ([`crate::socket::ipv6_twin`]), where the namespace has IPv6.
    pub ipv6: bool,
}

impl ListenAddrs {
    /// Istio's in-pod listeners: outbound on 127.0.0.1:15001, inbound on *:15008 and
    /// *:15006, transparent; each also on IPv6 (`[::1]`, `[::]`) when `ipv6`.
    pub fn inpod(ipv6: bool) -> Self {
        let any = |port| SocketAddr::from(([0, 0, 0, 0], port));
        ListenAddrs {
            outbound: SocketAddr::from(([127, 0, 0, 1], OUTBOUND_CAPTURE_PORT)),
            inbound: any(HBONE_PORT),
            inbound_plaintext: any(INBOUND_PLAINTEXT_PORT),
            transparent: true,
            ipv6,
        }
    }
}

/// The bound listeners of one workload: one socket per address family for each.
pub struct Listeners {
    pub outbound: Vec<TcpListener>,
    pub inbound: Vec<TcpListener>,
    pub inbound_plaintext: Vec<TcpListener>,
}

impl Listeners {
    /// Binds all three through `sockets` (ztunnel's own namespace in dedicated mode,
    /// the pod's in in-pod mode). A namespace without IPv6 gets its IPv4 listeners
    /// and no error: a pod with IPv6 disabled is served, and never unready, over IPv4.
    pub async fn bind(sockets: &dyn SocketFactory, addrs: ListenAddrs) -> std::io::Result<Self> {
        let bind = |addr, transparent: bool| {
            crate::socket::bind_with_ipv6_twin(addr, addrs.ipv6, move |a| {
                sockets.tcp_listener(a, transparent)
            })
        };
        Ok(Listeners {
            outbound: bind(addrs.outbound, false).await?,
            inbound: bind(addrs.inbound, addrs.transparent).await?,
            inbound_plaintext: bind(addrs.inbound_plaintext, addrs.transparent).await?,
        })
    }

    /// The local addresses bound, for logs and tests.
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        [&self.outbound, &self.inbound, &self.inbound_plaintext]
            .into_iter()
            .flatten()
            .filter_map(|l| l.local_addr().ok())
            .collect()
    }

    /// Runs the three proxies until `inputs.drain` stops them. The handles finish
    /// once the listeners are closed. Both families of a proxy share one instance
    /// (and so one HBONE pool).
    pub fn spawn(self, inputs: ProxyInputs) -> Vec<tokio::task::JoinHandle<()>> {
        if let Some(w) = inputs.local_workload() {
            if w.identity() != inputs.local.identity {
                warn!(expected = %inputs.local.identity, discovered = %w.identity(),
                    "local workload's identity differs from discovery; using the configured one");
            }
        }
        info!(workload = %format!("{}/{}", inputs.local.namespace, inputs.local.name),
            identity = %inputs.local.identity, "starting proxies");
        let outbound = outbound::Outbound::new(inputs.clone());
        let inbound = inbound::Inbound::new(inputs.clone());
        let passthrough = inbound_passthrough::InboundPassthrough::new(inputs);
        let mut handles = Vec::new();
        for l in self.outbound {
            handles.push(tokio::spawn(outbound.clone().run(l)));
        }
        for l in self.inbound {
            handles.push(tokio::spawn(inbound.clone().run(l)));
        }
        for l in self.inbound_plaintext {
            handles.push(tokio::spawn(passthrough.clone().run(l)));
        }
        handles
    }
}

/// Accepts connections until the drain stops the listener, running `handle` for
/// each under the drain (so shutdown can wait for it) in a span named `name`.
pub async fn accept_loop<H, F>(listener: TcpListener, drain: Drain, name: &'static str, handle: H)
where
    H: Fn(tokio::net::TcpStream, SocketAddr) -> F,
    F: std::future::Future<Output = ()> + Send + 'static,
{
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = drain.accepting_stopped() => break,
        };
        match accepted {
            Ok((stream, peer)) => {
                // The whole connection runs on one worker (see `crate::workers`).
                let worker = crate::workers::pick();
                let stream = match worker.adopt(stream) {
                    Ok(stream) => stream,
                    Err(e) => {
                        warn!(proxy = name, error = %e, "could not hand a connection to a worker");
                        continue;
                    }
                };
                let span = tracing::debug_span!("conn", proxy = name, src = %peer);
                // Boxed first: a connection's future is several KiB, and each wrapper
                // below (span, worker count, drain, task tracker, spawn) would move all
                // of it, some holding it twice (callgrind counted 300 KB copied per
                // connection, and each idle connection held 60 KiB).
                let connection = tracing::Instrument::instrument(
                    Box::pin(handle(stream, crate::socket::to_canonical(peer))),
                    span,
                );
                drain.spawn_on(worker.counted(connection), worker.runtime());
            }
            Err(e) => {
                // Out of fds or similar: back off instead of spinning.
                warn!(proxy = name, error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
    tracing::debug!(proxy = name, "listener stopped");
}

/// [`accept_loop`] for a listener behind an iptables REDIRECT (15001, 15006): each
/// connection's original destination is read (`SO_ORIGINAL_DST`) and handed to
/// `proxy`; a connection that was not redirected is counted and closed.
pub async fn accept_redirected<P, F>(
    listener: TcpListener,
    drain: Drain,
    metrics: Arc<Metrics>,
    name: &'static str,
    proxy: P,
) where
    P: Fn(tokio::net::TcpStream, SocketAddr, SocketAddr) -> F,
    F: std::future::Future<Output = ()> + Send + 'static,
{
    accept_loop(listener, drain, name, move |stream, peer| {
        // `Either`, not an async block holding the proxy's future: that would store it
        // twice (as the block's capture and as what it awaits).
        match crate::socket::original_dst(&stream) {
            Ok(target) => Either::Left(proxy(stream, peer, target)),
            Err(e) => {
                warn!(error = %e, "no original destination (connection was not redirected)");
                metrics.error("no_original_destination");
                Either::Right(std::future::ready(()))
            }
        }
    })
    .await
}

/// `NODE_NAME` says which workloads this ztunnel may serve: a workload that discovery
/// places on another node is refused (the node agent, or `PROXY_WORKLOAD_INFO`, named
/// the wrong one). A workload discovery does not know (yet), a workload without a
/// node, and a ztunnel without `NODE_NAME` pass.
pub fn check_local_node(
    state: &StateStore,
    namespace: &str,
    name: &str,
    node_name: &str,
) -> Result<(), String> {
    if node_name.is_empty() {
        return Ok(());
    }
    match state.workload_by_name(namespace, name) {
        Some(w) if !w.node.is_empty() && w.node != node_name => Err(format!(
            "workload {namespace}/{name} runs on node {}, not on this ztunnel's node {node_name} (NODE_NAME)",
            w.node
        )),
        _ => Ok(()),
    }
}

/// The ports ztunnel itself listens on, which are never a connection's destination.
///
/// Istio's ztunnel refuses its proxy ports (15001, 15006, 15008): a connection addressed
/// to one would loop into ztunnel, or nest HBONE in HBONE. We also refuse the admin
/// (15000), metrics (15020), readiness (15021) and DNS (15053) ports, plus whatever ports
/// the configuration moved these listeners to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnPorts(Arc<BTreeSet<u16>>);

impl OwnPorts {
    /// Istio's well-known ztunnel ports.
    pub const WELL_KNOWN: [u16; 7] = [
        ZTUNNEL_ADMIN_PORT,
        OUTBOUND_CAPTURE_PORT,
        INBOUND_PLAINTEXT_PORT,
        HBONE_PORT,
        ZTUNNEL_METRICS_PORT,
        ZTUNNEL_READINESS_PORT,
        DNS_CAPTURE_PORT,
    ];

    /// The well-known ports plus `configured` (the ports the listeners are bound to).
    pub fn new(configured: impl IntoIterator<Item = u16>) -> Self {
        let mut ports: BTreeSet<u16> = Self::WELL_KNOWN.into_iter().collect();
        ports.extend(configured.into_iter().filter(|p| *p != 0));
        OwnPorts(Arc::new(ports))
    }

    /// The well-known ports and every listener port of `config`.
    pub fn from_config(config: &crate::config::Config) -> Self {
        Self::new([
            config.admin_addr.port(),
            config.metrics_addr.port(),
            config.readiness_addr.port(),
            config.outbound_addr.port(),
            config.inbound_addr.port(),
            config.inbound_plaintext_addr.port(),
        ])
    }

    pub fn contains(&self, port: u16) -> bool {
        self.0.contains(&port)
    }

    /// The ports, ascending.
    pub fn iter(&self) -> impl Iterator<Item = u16> + '_ {
        self.0.iter().copied()
    }
}

impl Default for OwnPorts {
    fn default() -> Self {
        Self::new([])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workloads_of_other_nodes_are_not_served() {
        let state = StateStore::new();
        let mut snapshot = crate::state::ProxyState::new();
        for (name, node) in [("here", "n1"), ("there", "n2"), ("nowhere", "")] {
            snapshot.insert_workload(Workload {
                name: name.into(),
                namespace: "ns".into(),
                node: node.into(),
                ..Default::default()
            });
        }
        state.replace_source("local", snapshot);
        assert!(check_local_node(&state, "ns", "here", "n1").is_ok());
        let err = check_local_node(&state, "ns", "there", "n1").unwrap_err();
        assert!(err.contains("n2") && err.contains("NODE_NAME"), "{err}");
        assert!(check_local_node(&state, "ns", "nowhere", "n1").is_ok());
        assert!(check_local_node(&state, "ns", "unknown", "n1").is_ok());
        assert!(check_local_node(&state, "ns", "there", "").is_ok());
    }

    #[test]
    fn own_ports_are_istios_plus_ops_dns_and_configured_ones() {
        let ports = OwnPorts::default();
        for port in [15000, 15001, 15006, 15008, 15020, 15021, 15053] {
            assert!(ports.contains(port), "{port}");
        }
        assert!(!ports.contains(80) && !ports.contains(15009));
        let moved = OwnPorts::new([16020, 0]);
        assert!(moved.contains(16020) && moved.contains(15020) && !moved.contains(0));
    }
}
