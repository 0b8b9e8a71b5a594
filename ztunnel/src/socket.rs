//! Sockets the proxy owns: every one carries `SO_MARK = PACKET_MARK` so the capture
//! rules skip it, and the [`SocketFactory`] decides which network namespace it lives in.

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsFd;
use std::pin::Pin;
use std::sync::Arc;

use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::{TcpListener, TcpSocket, TcpStream, UdpSocket};

pub type SocketFuture<'a> = Pin<Box<dyn Future<Output = io::Result<TcpSocket>> + Send + 'a>>;
pub type UdpSocketFuture<'a> = Pin<Box<dyn Future<Output = io::Result<UdpSocket>> + Send + 'a>>;
pub type ListenerFuture<'a> = Pin<Box<dyn Future<Output = io::Result<TcpListener>> + Send + 'a>>;

/// Creates the proxy's sockets. Dedicated mode creates them in the proxy's own
/// namespace; in-pod mode creates them inside a pod's namespace, on a thread that
/// has entered it (hence the future).
pub trait SocketFactory: Send + Sync + 'static {
    /// An unconnected TCP socket for `family_of`'s address family, marked.
    fn tcp_socket(&self, family_of: SocketAddr) -> SocketFuture<'_>;
    /// A marked UDP socket bound to `addr` (port 0: an ephemeral port).
    fn udp_socket(&self, addr: SocketAddr) -> UdpSocketFuture<'_>;
    /// A marked TCP listener on `addr`; `transparent` lets it accept connections to
    /// any address (`IP_TRANSPARENT`).
    fn tcp_listener(&self, addr: SocketAddr, transparent: bool) -> ListenerFuture<'_>;
}

/// Sockets in the calling process's own network namespace.
#[derive(Debug, Clone)]
pub struct LocalSocketFactory {
    pub mark: u32,
}

impl SocketFactory for LocalSocketFactory {
    fn tcp_socket(&self, family_of: SocketAddr) -> SocketFuture<'_> {
        Box::pin(std::future::ready(
            marked_socket(family_of, self.mark).and_then(into_tokio_socket),
        ))
    }

    fn udp_socket(&self, addr: SocketAddr) -> UdpSocketFuture<'_> {
        Box::pin(std::future::ready(
            udp_socket(addr, self.mark).and_then(into_tokio_udp),
        ))
    }

    fn tcp_listener(&self, addr: SocketAddr, transparent: bool) -> ListenerFuture<'_> {
        Box::pin(std::future::ready(self.listener(addr, transparent)))
    }
}

impl LocalSocketFactory {
    /// A marked listener; `transparent` lets it accept connections to any address.
    pub fn listener(&self, addr: SocketAddr, transparent: bool) -> io::Result<TcpListener> {
        let socket = listen_socket(addr, self.mark, transparent)?;
        socket.set_nonblocking(true)?;
        TcpListener::from_std(socket.into())
    }
}

/// A marked, non-blocking TCP socket with `TCP_NODELAY`: the proxy forwards what it
/// reads at once, so Nagle would only add latency. Non-blocking from `socket(2)` on
/// (`SOCK_NONBLOCK`): two `fcntl` calls fewer on every upstream connection.
pub fn marked_socket(family_of: SocketAddr, mark: u32) -> io::Result<Socket> {
    let socket = Socket::new(
        Domain::for_address(family_of),
        Type::STREAM.nonblocking(),
        Some(Protocol::TCP),
    )?;
    set_mark(&socket, mark)?;
    socket.set_tcp_nodelay(true)?;
    Ok(socket)
}

/// `SO_MARK`. Mark 0 is a new socket's mark already, but setting it still needs
/// CAP_NET_ADMIN, so 0 means "no mark" (production uses 1337; tests run without root).
fn set_mark(socket: &Socket, mark: u32) -> io::Result<()> {
    if mark == 0 {
        return Ok(());
    }
    socket.set_mark(mark)
}

/// Hands a socket from [`marked_socket`] (already non-blocking) to tokio.
pub fn into_tokio_socket(socket: Socket) -> io::Result<TcpSocket> {
    Ok(TcpSocket::from_std_stream(socket.into()))
}

/// A bound, marked UDP socket (not yet registered with tokio). A fixed port is shared
/// with `SO_REUSEPORT`, as TCP listeners are, for a rolling update's two ztunnels.
pub fn udp_socket(addr: SocketAddr, mark: u32) -> io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    set_mark(&socket, mark)?;
    if addr.port() != 0 {
        socket.set_reuse_address(true)?;
        socket.set_reuse_port(true)?;
    }
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.bind(&addr.into())?;
    Ok(socket)
}

/// Hands a (blocking) socket2 UDP socket to tokio.
pub fn into_tokio_udp(socket: Socket) -> io::Result<UdpSocket> {
    socket.set_nonblocking(true)?;
    UdpSocket::from_std(socket.into())
}

/// A bound, listening, marked socket (not yet registered with tokio).
pub fn listen_socket(addr: SocketAddr, mark: u32, transparent: bool) -> io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    set_mark(&socket, mark)?;
    socket.set_reuse_address(true)?;
    // Several ztunnels (a rolling update) may hold the same pod's ports at once.
    socket.set_reuse_port(true)?;
    socket.set_tcp_nodelay(true)?;
    if transparent {
        set_transparent(&socket, addr)?;
    }
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    Ok(socket)
}

/// The IPv6 address a listener on `addr` also binds, as a socket of its own:
/// `0.0.0.0` → `[::]`, `127.0.0.1` → `[::1]`; other addresses have none.
///
/// One socket per family rather than one dual-stack `[::]` socket: each family keeps
/// its own `SO_ORIGINAL_DST`/`IP6T_SO_ORIGINAL_DST` and `IP_TRANSPARENT`/
/// `IPV6_TRANSPARENT`, peers are never `::ffff:`-mapped, and a namespace without IPv6
/// loses only the IPv6 socket (see [`is_no_ipv6`]).
pub fn ipv6_twin(addr: SocketAddr) -> Option<SocketAddr> {
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => Some(SocketAddr::from((
            std::net::Ipv6Addr::UNSPECIFIED,
            addr.port(),
        ))),
        IpAddr::V4(ip) if ip.is_loopback() => Some(SocketAddr::from((
            std::net::Ipv6Addr::LOCALHOST,
            addr.port(),
        ))),
        _ => None,
    }
}

/// Binds `addr` with `bind`, then its IPv6 twin ([`ipv6_twin`]) when `ipv6`; the twin
/// is skipped, not an error, where the namespace has no IPv6. Errors name the address.
pub async fn bind_with_ipv6_twin<F, Fut>(
    addr: SocketAddr,
    ipv6: bool,
    bind: F,
) -> io::Result<Vec<TcpListener>>
where
    F: Fn(SocketAddr) -> Fut,
    Fut: Future<Output = io::Result<TcpListener>>,
{
    let named = |addr: SocketAddr| {
        move |e: io::Error| io::Error::new(e.kind(), format!("binding {addr}: {e}"))
    };
    let mut bound = vec![bind(addr).await.map_err(named(addr))?];
    if let Some(v6) = ipv6_twin(addr).filter(|_| ipv6) {
        match bind(v6).await {
            Ok(listener) => bound.push(listener),
            Err(e) if is_no_ipv6(&e) => {
                tracing::debug!(addr = %v6, error = %e, "no IPv6 in this namespace: IPv4 only");
            }
            Err(e) => return Err(named(v6)(e)),
        }
    }
    Ok(bound)
}

/// A listener for ztunnel's own servers (admin, metrics, readiness): no mark, no port
/// sharing; an IPv6 address takes IPv6 only, so it can sit beside its IPv4 twin.
pub fn server_listener(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    socket.set_nonblocking(true)?;
    TcpListener::from_std(socket.into())
}

/// Whether a bind failed because the namespace has no IPv6 (disabled by sysctl, so no
/// `::1` on `lo`, or no IPv6 in the kernel), not because of a real conflict.
pub fn is_no_ipv6(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EADDRNOTAVAIL | libc::EAFNOSUPPORT | libc::EPROTONOSUPPORT)
    )
}

/// `IP_TRANSPARENT`: accept for, or bind to, addresses that are not local.
pub fn set_transparent(socket: &Socket, addr: SocketAddr) -> io::Result<()> {
    match addr {
        SocketAddr::V4(_) => socket.set_ip_transparent_v4(true),
        SocketAddr::V6(_) => socket.set_ip_transparent_v6(true),
    }
}

/// Connects `socket` to `dst`, first binding it to `source` with `IP_TRANSPARENT`
/// when given, so the peer sees the original client's address.
pub async fn connect(
    factory: &dyn SocketFactory,
    dst: SocketAddr,
    source: Option<IpAddr>,
) -> io::Result<TcpStream> {
    let socket = factory.tcp_socket(dst).await?;
    if let Some(ip) = source {
        let borrowed = socket2::SockRef::from(&socket);
        set_transparent(&borrowed, dst)?;
        socket.bind(SocketAddr::new(ip, 0))?;
    }
    socket.connect(dst).await
}

/// The destination a connection had before iptables REDIRECT rewrote it.
pub fn original_dst(stream: &TcpStream) -> io::Result<SocketAddr> {
    use nix::sys::socket::{getsockopt, sockopt};
    let fd = stream.as_fd();
    let local = stream.local_addr()?;
    let addr = if local.is_ipv4() {
        let raw = getsockopt(&fd, sockopt::OriginalDst).map_err(io::Error::from)?;
        SocketAddr::from((
            std::net::Ipv4Addr::from(u32::from_be(raw.sin_addr.s_addr)),
            u16::from_be(raw.sin_port),
        ))
    } else {
        let raw = getsockopt(&fd, sockopt::Ip6tOriginalDst).map_err(io::Error::from)?;
        SocketAddr::from((
            std::net::Ipv6Addr::from(raw.sin6_addr.s6_addr),
            u16::from_be(raw.sin6_port),
        ))
    };
    Ok(to_canonical(addr))
}

/// Maps `::ffff:a.b.c.d` to `a.b.c.d`, so lookups by IP see one form.
pub fn to_canonical(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}

/// The default factory, shared by proxies that live in ztunnel's own namespace.
pub fn local(mark: u32) -> Arc<dyn SocketFactory> {
    Arc::new(LocalSocketFactory { mark })
}
