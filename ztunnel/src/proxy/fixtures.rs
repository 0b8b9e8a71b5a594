//! What the proxy unit tests share: a mesh on loopback with a local CA, echo servers,
//! and connected socket pairs. Nothing here needs root: sockets carry no mark (mark 0)
//! and nothing is transparent.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::connections::ConnectionManager;
use super::{LocalWorkload, OwnPorts, ProxyInputs};
use crate::discovery::local::parse_local_config;
use crate::drain::Drain;
use crate::hbone::stream::H2Stream;
use crate::identity::{CertificateAuthority, Identity, SecretManager};
use crate::metrics::{ErrorLabels, Metrics};
use crate::socket;
use crate::state::StateStore;

/// Long enough for anything on loopback; only a broken proxy waits this long.
pub const WAIT: Duration = Duration::from_secs(5);

pub fn identity(namespace: &str, service_account: &str) -> Identity {
    Identity::new("cluster.local", namespace, service_account)
}

/// Leaves from a CA of our own.
pub fn certs() -> SecretManager {
    let ca = CertificateAuthority::generate_self_signed("cluster.local").unwrap();
    SecretManager::from_ca(ca, Duration::from_secs(3600))
}

/// A state holding the local config `yaml`.
pub fn state(yaml: &str) -> StateStore {
    let state = StateStore::new();
    state.replace_source("local", parse_local_config(yaml).unwrap());
    state
}

/// The inputs of workload `namespace/name` (service account = name), with unmarked
/// sockets in our own namespace and fresh metrics.
pub fn inputs(
    state: &StateStore,
    certs: &SecretManager,
    namespace: &str,
    name: &str,
) -> ProxyInputs {
    ProxyInputs {
        state: state.clone(),
        certs: certs.clone(),
        metrics: Arc::new(Metrics::new()),
        connections: ConnectionManager::new(),
        sockets: socket::local(0),
        local: LocalWorkload {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity(namespace, name),
        },
        drain: Drain::new(),
        transparent_inbound: false,
        cluster_id: "Kubernetes".into(),
        own_ports: OwnPorts::default(),
    }
}

/// `ztunnel_errors_total{reason}`.
pub fn errors(metrics: &Metrics, reason: &'static str) -> u64 {
    metrics.errors.get_or_create(&ErrorLabels { reason }).get()
}

/// Sum of a connection counter over all label sets whose exposition contains every
/// one of `labels` (e.g. `reporter="source"`).
pub fn connections(metrics: &Metrics, counter: &str, labels: &[&str]) -> u64 {
    metrics
        .encode()
        .lines()
        .filter(|l| l.starts_with(&format!("{counter}{{")))
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum()
}

/// An echo server on `ip`, port chosen by the kernel.
pub async fn echo_server(ip: &str) -> SocketAddr {
    let listener = TcpListener::bind((ip, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut read, mut write) = stream.split();
                let _ = tokio::io::copy(&mut read, &mut write).await;
            });
        }
    });
    addr
}

/// A connected loopback pair, as a proxy sees one it accepted: (the application's end,
/// the proxy's end, the application's address).
pub async fn accepted_pair() -> (TcpStream, TcpStream, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let app = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (proxied, peer) = listener.accept().await.unwrap();
    (app, proxied, peer)
}

/// Writes `message` and reads it back (through an echo server).
pub async fn round_trip(stream: &mut TcpStream, message: &[u8]) {
    stream.write_all(message).await.unwrap();
    let mut got = vec![0; message.len()];
    tokio::time::timeout(WAIT, stream.read_exact(&mut got))
        .await
        .expect("echo answered in time")
        .expect("echo answered");
    assert_eq!(got, message);
}

/// The same over an HBONE stream.
pub async fn h2_round_trip(stream: &mut H2Stream, message: &'static [u8]) {
    stream
        .send
        .send_data(Bytes::from_static(message), false)
        .unwrap();
    let mut got = Vec::new();
    while got.len() < message.len() {
        let chunk = tokio::time::timeout(WAIT, stream.recv.data())
            .await
            .expect("echo answered in time")
            .expect("echo answered")
            .unwrap();
        stream
            .recv
            .flow_control()
            .release_capacity(chunk.len())
            .unwrap();
        got.extend_from_slice(&chunk);
    }
    assert_eq!(got, message);
}

/// Asserts the peer closed `stream` without sending anything (EOF or reset).
pub async fn assert_closed(stream: &mut TcpStream) {
    let mut buf = [0u8; 64];
    match tokio::time::timeout(WAIT, stream.read(&mut buf)).await {
        Ok(Ok(0)) | Ok(Err(_)) => {}
        Ok(Ok(n)) => panic!("expected the proxy to close, got {n} bytes"),
        Err(_) => panic!("the proxy kept the connection open"),
    }
}

/// How the kernel answers `SO_ORIGINAL_DST` for a connection no iptables rule
/// redirected: `None` (no conntrack entry, the usual case in a namespace without NAT
/// rules) or the address the connection reached (conntrack tracks it, e.g. a host
/// with NAT rules of its own).
pub async fn original_dst_without_redirect() -> Option<SocketAddr> {
    let (_app, accepted, _) = accepted_pair().await;
    socket::original_dst(&accepted).ok()
}
