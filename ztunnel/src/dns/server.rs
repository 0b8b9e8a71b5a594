//! The DNS proxy's listeners: UDP and TCP on one address (and on `[::1]` beside
//! `127.0.0.1` when the namespace has it), served until the workload's drain stops them.

use std::net::{Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use super::forward::{read_framed, write_framed};
use super::{DnsHandler, Protocol, Step};
use crate::drain::Drain;
use crate::socket::SocketFactory;

/// Queries of one workload waiting on upstreams at once; beyond, UDP queries are
/// dropped (the client retries) rather than pile up sockets.
const MAX_FORWARDS_IN_FLIGHT: usize = 256;
/// A TCP client that sends nothing for this long is closed.
const TCP_IDLE: Duration = Duration::from_secs(10);
/// The largest datagram read; a larger one is cut and fails to parse.
const MAX_DATAGRAM: usize = 4096;

/// Bound sockets of one workload's DNS proxy.
pub struct DnsServer {
    udp: Vec<UdpSocket>,
    tcp: Vec<TcpListener>,
}

impl DnsServer {
    /// Binds UDP and TCP on `addr`; for `127.0.0.1`, also on `[::1]` when that exists
    /// in the namespace (a namespace without IPv6 simply has none).
    pub async fn bind(sockets: &dyn SocketFactory, addr: SocketAddr) -> std::io::Result<Self> {
        let mut server = DnsServer {
            udp: vec![sockets.udp_socket(addr).await?],
            tcp: vec![sockets.tcp_listener(addr, false).await?],
        };
        if addr.ip().is_loopback() && addr.is_ipv4() {
            let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, addr.port()));
            match (
                sockets.udp_socket(v6).await,
                sockets.tcp_listener(v6, false).await,
            ) {
                (Ok(udp), Ok(tcp)) => {
                    server.udp.push(udp);
                    server.tcp.push(tcp);
                }
                (Err(e), _) | (_, Err(e)) => debug!(error = %e, "no DNS proxy on [::1]"),
            }
        }
        Ok(server)
    }

    /// Serves until `drain` stops accepting; the handles finish once every socket is
    /// closed.
    pub fn spawn(self, handler: Arc<DnsHandler>, drain: Drain) -> Vec<JoinHandle<()>> {
        let forwards = Arc::new(Semaphore::new(MAX_FORWARDS_IN_FLIGHT));
        let mut handles = Vec::new();
        for socket in self.udp {
            handles.push(tokio::spawn(serve_udp(
                Arc::new(socket),
                handler.clone(),
                forwards.clone(),
                drain.clone(),
            )));
        }
        for listener in self.tcp {
            let handler = handler.clone();
            handles.push(tokio::spawn(crate::proxy::accept_loop(
                listener,
                drain.clone(),
                "dns",
                move |stream, _| serve_tcp(stream, handler.clone()),
            )));
        }
        handles
    }
}

async fn serve_udp(
    socket: Arc<UdpSocket>,
    handler: Arc<DnsHandler>,
    forwards: Arc<Semaphore>,
    drain: Drain,
) {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        let (n, client) = tokio::select! {
            received = socket.recv_from(&mut buf) => match received {
                Ok(received) => received,
                Err(e) => {
                    // ICMP errors from earlier sends surface here; keep serving.
                    debug!(error = %e, "DNS receive failed");
                    continue;
                }
            },
            () = drain.accepting_stopped() => break,
        };
        match handler.step(&buf[..n], Protocol::Udp) {
            Step::Reply(answer) => send(&socket, &answer, client).await,
            Step::Forward(upstream) => {
                let Ok(permit) = forwards.clone().try_acquire_owned() else {
                    warn!("too many DNS queries waiting on upstreams; dropping one");
                    continue;
                };
                let (socket, handler) = (socket.clone(), handler.clone());
                let stopped = drain.accepting_token();
                tokio::spawn(async move {
                    let _permit = permit;
                    // The workload left: its socket goes now, not after the upstream.
                    tokio::select! {
                        answer = handler.forward(upstream, Protocol::Udp) => {
                            send(&socket, &answer, client).await;
                        }
                        () = stopped.cancelled() => {}
                    }
                });
            }
            Step::Ignore => {}
        }
    }
    debug!("DNS UDP listener stopped");
}

async fn send(socket: &UdpSocket, answer: &[u8], client: SocketAddr) {
    if let Err(e) = socket.send_to(answer, client).await {
        debug!(%client, error = %e, "sending a DNS answer failed");
    }
}

/// One TCP client: queries in sequence until it closes or idles.
async fn serve_tcp(mut stream: TcpStream, handler: Arc<DnsHandler>) {
    loop {
        let query = match tokio::time::timeout(TCP_IDLE, read_framed(&mut stream)).await {
            Ok(Ok(Some(query))) => query,
            Ok(Ok(None)) | Err(_) => return,
            Ok(Err(e)) => {
                debug!(error = %e, "DNS over TCP: reading failed");
                return;
            }
        };
        let answer = match handler.step(&query, Protocol::Tcp) {
            Step::Reply(answer) => answer,
            Step::Forward(upstream) => handler.forward(upstream, Protocol::Tcp).await,
            Step::Ignore => return,
        };
        if let Err(e) = write_framed(&mut stream, &answer).await {
            debug!(error = %e, "DNS over TCP: writing failed");
            return;
        }
    }
}
