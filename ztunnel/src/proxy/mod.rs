//! The three listeners a ztunnel runs for each workload it serves: outbound capture
//! (15001), inbound HBONE (15008) and inbound plaintext (15006).

pub mod connections;
pub mod inbound;
pub mod inbound_passthrough;
pub mod outbound;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tracing::{info, warn};

use crate::drain::Drain;
use crate::identity::{Identity, SecretManager};
use crate::metrics::Metrics;
use crate::socket::{LocalSocketFactory, SocketFactory};
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
}

/// The bound listeners of one workload.
pub struct Listeners {
    pub outbound: TcpListener,
    pub inbound: TcpListener,
    pub inbound_plaintext: TcpListener,
}

impl Listeners {
    /// Binds all three in ztunnel's own namespace (dedicated mode).
    pub fn bind(sockets: &LocalSocketFactory, addrs: ListenAddrs) -> std::io::Result<Self> {
        Ok(Listeners {
            outbound: sockets.listener(addrs.outbound, false)?,
            inbound: sockets.listener(addrs.inbound, false)?,
            inbound_plaintext: sockets.listener(addrs.inbound_plaintext, false)?,
        })
    }

    /// Runs the three proxies until `inputs.drain` stops them. The handles finish
    /// once the listeners are closed.
    pub fn spawn(self, inputs: ProxyInputs) -> Vec<tokio::task::JoinHandle<()>> {
        if let Some(w) = inputs.local_workload() {
            if w.identity() != inputs.local.identity {
                warn!(expected = %inputs.local.identity, discovered = %w.identity(),
                    "local workload's identity differs from discovery; using the configured one");
            }
        }
        info!(workload = %format!("{}/{}", inputs.local.namespace, inputs.local.name),
            identity = %inputs.local.identity, "starting proxies");
        vec![
            tokio::spawn(outbound::Outbound::new(inputs.clone()).run(self.outbound)),
            tokio::spawn(inbound::Inbound::new(inputs.clone()).run(self.inbound)),
            tokio::spawn(
                inbound_passthrough::InboundPassthrough::new(inputs).run(self.inbound_plaintext),
            ),
        ]
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
                let span = tracing::debug_span!("conn", proxy = name, src = %peer);
                drain.spawn(tracing::Instrument::instrument(
                    handle(stream, crate::socket::to_canonical(peer)),
                    span,
                ));
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

/// True for the proxy's own ports, which must never be a destination (loops).
pub fn is_proxy_port(port: u16) -> bool {
    shared_types::constants::PROXY_PORTS.contains(&port)
}
