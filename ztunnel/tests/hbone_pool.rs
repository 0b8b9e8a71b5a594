//! HBONE client pool against a real inbound proxy on loopback: real TLS, real
//! HTTP/2, real sockets. No root needed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use ztunnel::discovery::local::parse_local_config;
use ztunnel::drain::Drain;
use ztunnel::hbone::pool::{ConnectRequest, Pool, PoolKey};
use ztunnel::hbone::stream::H2Stream;
use ztunnel::identity::{CertificateAuthority, Identity, SecretManager};
use ztunnel::metrics::Metrics;
use ztunnel::proxy::connections::ConnectionManager;
use ztunnel::proxy::inbound::Inbound;
use ztunnel::proxy::{LocalWorkload, ProxyInputs};
use ztunnel::socket;
use ztunnel::state::StateStore;

const CONFIG: &str = r#"
workloads:
- uid: test//server
  name: server
  namespace: test
  serviceAccount: server
  workloadIps: ["127.0.0.1"]
  protocol: HBONE
"#;

struct Server {
    hbone: SocketAddr,
    echo: SocketAddr,
    drain: Drain,
}

fn client_identity() -> Identity {
    Identity::new("cluster.local", "test", "client")
}

fn server_identity() -> Identity {
    Identity::new("cluster.local", "test", "server")
}

async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while let Ok(n) = stream.read(&mut buf).await {
                    if n == 0 || stream.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}

async fn start_server(certs: &SecretManager, bind: SocketAddr, echo: SocketAddr) -> Server {
    let state = StateStore::new();
    state.replace_source("local", parse_local_config(CONFIG).unwrap());
    let drain = Drain::new();
    let listener = socket::LocalSocketFactory { mark: 0 }
        .listener(bind, false)
        .unwrap();
    let sockets = socket::local(0);
    let hbone = listener.local_addr().unwrap();
    let inputs = ProxyInputs {
        state,
        certs: certs.clone(),
        metrics: Arc::new(Metrics::new()),
        connections: ConnectionManager::new(),
        sockets,
        local: LocalWorkload {
            namespace: "test".into(),
            name: "server".into(),
            identity: server_identity(),
        },
        drain: drain.clone(),
        transparent_inbound: false,
        cluster_id: "test".into(),
        own_ports: Default::default(),
    };
    tokio::spawn(Inbound::new(inputs).run(listener));
    Server { hbone, echo, drain }
}

fn request(server: &Server) -> ConnectRequest {
    ConnectRequest {
        key: PoolKey {
            src_identity: client_identity(),
            dst_identity: server_identity(),
            dst: server.hbone,
            src_ip: None,
        },
        expected_identities: vec![server_identity()],
        authority: server.echo,
        client: "127.0.0.1:40000".parse().unwrap(),
        baggage: String::new(),
    }
}

async fn round_trip(stream: &mut H2Stream, message: &'static [u8]) {
    stream
        .send
        .send_data(Bytes::from_static(message), false)
        .unwrap();
    let mut got = Vec::new();
    while got.len() < message.len() {
        let chunk = stream.recv.data().await.expect("echo answered").unwrap();
        stream
            .recv
            .flow_control()
            .release_capacity(chunk.len())
            .unwrap();
        got.extend_from_slice(&chunk);
    }
    assert_eq!(got, message);
}

fn mesh() -> (SecretManager, Arc<Metrics>) {
    let ca = CertificateAuthority::generate_self_signed("cluster.local").unwrap();
    (
        SecretManager::from_ca(ca, Duration::from_secs(3600)),
        Arc::new(Metrics::new()),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_streams_share_ceil_n_over_100_connections() {
    let (certs, metrics) = mesh();
    let server = start_server(&certs, "127.0.0.1:0".parse().unwrap(), echo_server().await).await;
    let pool = Pool::new(
        certs.clone(),
        socket::local(0),
        metrics.clone(),
        Duration::from_secs(300),
    );
    let req = request(&server);

    // A burst to a new key opens exactly one connection.
    let burst = futures::future::join_all((0..50).map(|_| pool.connect(&req))).await;
    let mut streams: Vec<H2Stream> = burst.into_iter().map(|s| s.expect("stream")).collect();
    assert_eq!(pool.connection_count(), 1);

    // 250 concurrent user connections need ceil(250/100) = 3.
    let more = futures::future::join_all((0..200).map(|_| pool.connect(&req))).await;
    streams.extend(more.into_iter().map(|s| s.expect("stream")));
    for stream in streams.iter_mut() {
        round_trip(stream, b"ping").await;
    }
    assert_eq!(pool.connection_count(), 3);
    assert!(
        metrics
            .encode()
            .contains("ztunnel_hbone_pool_connections 3"),
        "{}",
        metrics.encode()
    );

    // Streams that ended free their slots: new ones reuse the same connections.
    drop(streams);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut stream = pool.connect(&req).await.unwrap();
    round_trip(&mut stream, b"again").await;
    assert_eq!(pool.connection_count(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_released() {
    let (certs, metrics) = mesh();
    let server = start_server(&certs, "127.0.0.1:0".parse().unwrap(), echo_server().await).await;
    let pool = Pool::new(
        certs.clone(),
        socket::local(0),
        metrics,
        Duration::from_millis(200),
    );
    let mut stream = pool.connect(&request(&server)).await.unwrap();
    round_trip(&mut stream, b"hello").await;
    drop(stream);
    assert_eq!(pool.connection_count(), 1);
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(pool.connection_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_connection_is_never_handed_out_again() {
    let (certs, metrics) = mesh();
    let echo = echo_server().await;
    let first = start_server(&certs, "127.0.0.1:0".parse().unwrap(), echo).await;
    let pool = Pool::new(
        certs.clone(),
        socket::local(0),
        metrics.clone(),
        Duration::from_secs(300),
    );
    let mut stream = pool.connect(&request(&first)).await.unwrap();
    round_trip(&mut stream, b"one").await;
    drop(stream);

    // The server goes away (its connections are cut) and comes back on the same port.
    first.drain.drain(Duration::ZERO).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while pool.connection_count() != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the pool never noticed its connection died"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let second = start_server(&certs, first.hbone, echo).await;

    let mut stream = pool.connect(&request(&second)).await.unwrap();
    round_trip(&mut stream, b"two").await;
    assert_eq!(pool.connection_count(), 1);
    // A fresh connection from the start: the dead one was not handed out and then
    // silently retried.
    assert_eq!(metrics.hbone_pool_retries.get(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_server_identity_fails_the_connect() {
    let (certs, metrics) = mesh();
    let server = start_server(&certs, "127.0.0.1:0".parse().unwrap(), echo_server().await).await;
    let pool = Pool::new(
        certs.clone(),
        socket::local(0),
        metrics,
        Duration::from_secs(300),
    );
    let mut req = request(&server);
    req.key.dst_identity = Identity::new("cluster.local", "test", "someone-else");
    req.expected_identities = vec![req.key.dst_identity.clone()];
    let err = pool.connect(&req).await.err().expect("handshake must fail");
    assert!(err.to_string().contains("TLS"), "{err}");
    assert_eq!(pool.connection_count(), 0);
}

/// With ztunnel's worker threads, each worker shares only its own connections: a
/// stream is never driven by another thread's HTTP/2 connection.
#[test]
fn each_worker_pools_its_own_connections() {
    ztunnel::workers::run(2, async {
        let (certs, metrics) = mesh();
        let server =
            start_server(&certs, "127.0.0.1:0".parse().unwrap(), echo_server().await).await;
        let pool = Pool::new(
            certs.clone(),
            socket::local(0),
            metrics,
            Duration::from_secs(300),
        );
        let req = request(&server);

        let open_here = |pool: Arc<Pool>, req: ConnectRequest| async move {
            let mut stream = pool.connect(&req).await.unwrap();
            round_trip(&mut stream, b"ping").await;
            (ztunnel::workers::current(), stream)
        };
        let (worker, _first) = open_here(pool.clone(), req.clone()).await;
        assert_eq!(worker, 0);
        let (_, _second) = open_here(pool.clone(), req.clone()).await;
        assert_eq!(
            pool.connection_count(),
            1,
            "the same worker reuses its connection"
        );

        // Worker 1, found by making the others look busy.
        let mut busy = Vec::new();
        let other = loop {
            let worker = ztunnel::workers::pick();
            let index = worker
                .runtime()
                .spawn(async { ztunnel::workers::current() });
            if index.await.unwrap() == 1 {
                break worker;
            }
            busy.push(worker.counted(std::future::pending::<()>()));
        };
        let on_other =
            |pool: Arc<Pool>, req: ConnectRequest| other.runtime().spawn(open_here(pool, req));
        let (worker, _third) = on_other(pool.clone(), req.clone()).await.unwrap();
        assert_eq!(worker, 1);
        assert_eq!(pool.connection_count(), 2, "worker 1 opened its own");
        let (_, _fourth) = on_other(pool.clone(), req.clone()).await.unwrap();
        assert_eq!(pool.connection_count(), 2, "and reuses it");
    })
    .unwrap();
}
