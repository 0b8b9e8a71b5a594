//! A pod's sockets: created inside its network namespace (entered on the calling
//! thread, see [`NetnsSwitch`]), then used from any thread; a socket stays in the
//! namespace it was created in. Done in place, as Istio's ztunnel does: a hand-off to
//! a dedicated thread cost two cross-thread wakeups on every inbound dial and queued a
//! burst of pod adds.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use mesh_runtime::netns::{NetnsHandle, NetnsSwitch};
use tokio::net::TcpListener;

use crate::socket::{self, ListenerFuture, SocketFactory, SocketFuture, UdpSocketFuture};

/// Creates sockets inside one pod's namespace.
pub struct PodSocketFactory {
    pub netns: Arc<NetnsHandle>,
    pub switch: NetnsSwitch,
    pub mark: u32,
}

impl SocketFactory for PodSocketFactory {
    fn tcp_socket(&self, family_of: SocketAddr) -> SocketFuture<'_> {
        let socket = self
            .switch
            .run(&self.netns, || socket::marked_socket(family_of, self.mark));
        Box::pin(std::future::ready(
            socket.and_then(socket::into_tokio_socket),
        ))
    }

    fn udp_socket(&self, addr: SocketAddr) -> UdpSocketFuture<'_> {
        let socket = self
            .switch
            .run(&self.netns, || socket::udp_socket(addr, self.mark));
        Box::pin(std::future::ready(socket.and_then(socket::into_tokio_udp)))
    }

    fn tcp_listener(&self, addr: SocketAddr, transparent: bool) -> ListenerFuture<'_> {
        Box::pin(std::future::ready(self.listen(addr, transparent)))
    }
}

impl PodSocketFactory {
    /// Binds a marked listener inside the pod's namespace.
    pub fn listen(&self, addr: SocketAddr, transparent: bool) -> io::Result<TcpListener> {
        let socket = self.switch.run(&self.netns, || {
            socket::listen_socket(addr, self.mark, transparent)
        })?;
        socket.set_nonblocking(true)?;
        TcpListener::from_std(socket.into())
    }
}
