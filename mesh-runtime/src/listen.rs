//! Listening on all addresses of both families with one socket, as Go servers do on
//! `:port`.

use std::io;
use std::net::{Ipv6Addr, SocketAddr};

use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::TcpListener;

/// Binds `addr`. The IPv4 wildcard (every default) becomes one dual-stack `[::]`
/// socket, as Go's istiod listens on `:port`: in an IPv6 or dual-stack cluster the
/// Service and the kubelet's probes may reach the pod over IPv6. A namespace without
/// IPv6 gets `0.0.0.0`; a port in use is an error either way.
pub fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    if addr.ip().is_unspecified() && addr.is_ipv4() {
        let any = SocketAddr::from((Ipv6Addr::UNSPECIFIED, addr.port()));
        match bind_socket(any, false) {
            Ok(listener) => return Ok(listener),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => return Err(e),
            Err(e) => tracing::debug!(error = %e, "no IPv6 here: listening on IPv4 only"),
        }
    }
    bind_socket(addr, true)
}

fn bind_socket(addr: SocketAddr, only_v6: bool) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    if addr.is_ipv6() {
        socket.set_only_v6(only_v6)?;
    }
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    socket.set_nonblocking(true)?;
    TcpListener::from_std(socket.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_wildcard_takes_both_families_and_a_given_address_only_its_own() {
        let listener = bind("0.0.0.0:0".parse().unwrap()).unwrap();
        let port = listener.local_addr().unwrap().port();
        for ip in ["127.0.0.1", "::1"] {
            let addr = SocketAddr::new(ip.parse().unwrap(), port);
            let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
            let (_, peer) = listener.accept().await.unwrap();
            assert_eq!(peer.ip().to_canonical(), addr.ip(), "{ip}");
        }
        let v4 = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let port = v4.local_addr().unwrap().port();
        assert!(tokio::net::TcpStream::connect(("::1", port)).await.is_err());
    }
}
