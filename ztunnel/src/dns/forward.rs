//! Queries the mesh does not answer go to the node's resolvers, from sockets in the
//! client pod's network namespace that carry ztunnel's mark (so the pod's own DNS
//! capture lets them through).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing::warn;

use super::Protocol;
use crate::socket::{self, SocketFactory};

/// How long one upstream may take before the next is tried (glibc's default).
pub const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest DNS message (a TCP length prefix is 16 bits).
const MAX_MESSAGE: usize = u16::MAX as usize;

#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error("no upstream resolver is configured")]
    NoUpstream,
    #[error("upstream {0} did not answer within {UPSTREAM_TIMEOUT:?}")]
    Timeout(SocketAddr),
    #[error("upstream {0}: {1}")]
    Io(SocketAddr, std::io::Error),
}

/// The upstream resolvers: the `nameserver` lines of ztunnel's own resolv.conf, as
/// Istio's ztunnel reads them.
pub fn upstreams_from_resolv_conf(path: &Path) -> Vec<SocketAddr> {
    let text = match std::fs::read(path) {
        Ok(text) => text,
        Err(e) => {
            warn!(path = %path.display(), error = %e, "cannot read the upstream resolvers; the DNS proxy answers mesh names only");
            return Vec::new();
        }
    };
    match resolv_conf::Config::parse(&text) {
        Ok(conf) => conf
            .nameservers
            .into_iter()
            .map(|ns| SocketAddr::new(IpAddr::from(ns), 53))
            .collect(),
        Err(e) => {
            warn!(path = %path.display(), error = %e, "cannot parse the upstream resolvers; the DNS proxy answers mesh names only");
            Vec::new()
        }
    }
}

/// Sends queries upstream, in resolv.conf's order, the next on a timeout or error.
#[derive(Clone)]
pub struct Forwarder {
    pub upstreams: Arc<[SocketAddr]>,
    pub sockets: Arc<dyn SocketFactory>,
}

impl Forwarder {
    /// The upstream's answer to `query` (raw bytes, as the client sent it), with the
    /// client's id. Over UDP a truncated answer is passed on as is: the client
    /// retries over TCP, and so do we then.
    pub async fn forward(&self, query: &[u8], protocol: Protocol) -> Result<Vec<u8>, ForwardError> {
        let mut last = ForwardError::NoUpstream;
        for &upstream in self.upstreams.iter() {
            let exchange = async {
                match protocol {
                    Protocol::Udp => self.udp(upstream, query).await,
                    Protocol::Tcp => self.tcp(upstream, query).await,
                }
            };
            match tokio::time::timeout(UPSTREAM_TIMEOUT, exchange).await {
                Ok(Ok(answer)) => return Ok(answer),
                Ok(Err(e)) => last = ForwardError::Io(upstream, e),
                Err(_) => last = ForwardError::Timeout(upstream),
            }
        }
        Err(last)
    }

    async fn udp(&self, upstream: SocketAddr, query: &[u8]) -> std::io::Result<Vec<u8>> {
        let socket = self.sockets.udp_socket(unspecified(upstream)).await?;
        socket.connect(upstream).await?;
        let (sent, id) = with_fresh_id(query);
        socket.send(&sent).await?;
        let mut buf = vec![0u8; MAX_MESSAGE];
        loop {
            let n = socket.recv(&mut buf).await?;
            // A connected socket only hears the upstream; the fresh id and the
            // response bit reject stale or spoofed datagrams.
            if let Some(answer) = answer_to(&buf[..n], id, query) {
                return Ok(answer);
            }
        }
    }

    async fn tcp(&self, upstream: SocketAddr, query: &[u8]) -> std::io::Result<Vec<u8>> {
        let mut stream = socket::connect(self.sockets.as_ref(), upstream, None).await?;
        let (sent, id) = with_fresh_id(query);
        write_framed(&mut stream, &sent).await?;
        let answer = read_framed(&mut stream)
            .await?
            .ok_or_else(|| std::io::Error::other("closed before answering"))?;
        answer_to(&answer, id, query)
            .ok_or_else(|| std::io::Error::other("answered with another id or no response"))
    }
}

/// A copy of `query` under a random id, so answers to earlier queries are not taken
/// for this one.
fn with_fresh_id(query: &[u8]) -> (Vec<u8>, u16) {
    let id: u16 = rand::random();
    let mut sent = query.to_vec();
    sent[..2].copy_from_slice(&id.to_be_bytes());
    (sent, id)
}

/// `answer` with the client's id back in place, if it is a response with id `id`.
fn answer_to(answer: &[u8], id: u16, query: &[u8]) -> Option<Vec<u8>> {
    let is_response = answer.len() >= 12 && answer[2] & 0x80 != 0;
    if !is_response || answer[..2] != id.to_be_bytes() {
        return None;
    }
    let mut answer = answer.to_vec();
    answer[..2].copy_from_slice(&query[..2]);
    Some(answer)
}

fn unspecified(of: SocketAddr) -> SocketAddr {
    let ip = match of {
        SocketAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        SocketAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    };
    SocketAddr::new(ip, 0)
}

/// One DNS message over TCP: a 16-bit length, then the message. `None` on a clean
/// end of stream before the length.
pub async fn read_framed<S: AsyncReadExt + Unpin>(
    stream: &mut S,
) -> std::io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 2];
    match stream.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let mut message = vec![0u8; u16::from_be_bytes(len) as usize];
    stream.read_exact(&mut message).await?;
    Ok(Some(message))
}

pub async fn write_framed<S: AsyncWriteExt + Unpin>(
    stream: &mut S,
    message: &[u8],
) -> std::io::Result<()> {
    let len = u16::try_from(message.len())
        .map_err(|_| std::io::Error::other("a DNS message over 65535 bytes"))?;
    let mut framed = Vec::with_capacity(message.len() + 2);
    framed.extend_from_slice(&len.to_be_bytes());
    framed.extend_from_slice(message);
    stream.write_all(&framed).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_matched_by_fresh_id_and_get_the_clients_back() {
        let query = [0xab, 0xcd, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        let (sent, id) = with_fresh_id(&query);
        assert_eq!(sent[..2], id.to_be_bytes());
        assert_eq!(sent[2..], query[2..]);

        let mut answer = sent.clone();
        answer[2] |= 0x80;
        assert_eq!(answer_to(&answer, id, &query).unwrap()[..2], [0xab, 0xcd]);
        // Not a response, another id, too short: not ours.
        assert!(answer_to(&sent, id, &query).is_none());
        assert!(answer_to(&answer, id.wrapping_add(1), &query).is_none());
        assert!(answer_to(&answer[..11], id, &query).is_none());
    }

    #[test]
    fn resolv_conf_nameservers_become_upstreams() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("resolv.conf");
        std::fs::write(
            &path,
            "search demo.svc.cluster.local svc.cluster.local\nnameserver 10.96.0.10\nnameserver fd00::a\noptions ndots:5\n",
        )
        .unwrap();
        assert_eq!(
            upstreams_from_resolv_conf(&path),
            vec![
                "10.96.0.10:53".parse::<SocketAddr>().unwrap(),
                "[fd00::a]:53".parse().unwrap()
            ]
        );
        assert!(upstreams_from_resolv_conf(&dir.path().join("missing")).is_empty());
    }
}
