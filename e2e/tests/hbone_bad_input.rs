//! Garbage at a dedicated ztunnel's HBONE port, from a namespace with no ztunnel:
//! every bad request gets Istio's error answer and a counter, never a crash, and
//! the ztunnel keeps serving good requests afterwards.

#[path = "support/hbone_client.rs"]
mod hbone_client;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use bytes::Bytes;
use http::{Method, Request, StatusCode};
use local_cluster::mesh::{self, ztunnel_metrics};

use test_support::netns::{link, Netns};
use test_support::process::ChildGuard;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use hbone_client::{h2_session, status, AcceptAnyServer};
use ztunnel::identity::{CertificateAuthority, Identity};

const CONFIG: &str = r#"workloads:
- uid: Kubernetes//v1/VM/vms/server-vm
  name: server-vm
  namespace: vms
  serviceAccount: server
  workloadIps: ["10.10.0.2"]
  protocol: HBONE
"#;
const HBONE: &str = "10.10.0.2:15008";
/// An address of B that belongs to no workload.
const OTHER_HBONE: &str = "10.10.0.3:15008";
/// A CONNECT each new session starts with, to see a refused client certificate.
const PROBE: &str = "10.10.0.2:9";

#[test]
fn bad_hbone_input_is_refused_and_counted() -> Result<()> {
    if !test_support::can_run_root_tests() {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let ca_dir = dir.path().join("ca");
    mesh::ca_init(&ca_dir)?;
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, CONFIG)?;
    let client = Netns::new("bad-c")?;
    let server = Netns::new("bad-s")?;
    link(&client, "10.10.0.1/24", &server, "10.10.0.2/24")?;
    let dev = server.stdout(&[
        "sh",
        "-c",
        "ip -o link show type veth | cut -d: -f2 | cut -d@ -f1",
    ])?;
    server.exec(&["ip", "addr", "add", "10.10.0.3/24", "dev", dev.trim()])?;
    // Inbound capture as the in-pod rules do it: TCP to B goes to 15006, here only
    // for port 15006 itself (so ztunnel sees an original destination that is its own).
    server.exec(&[
        "iptables",
        "-t",
        "nat",
        "-A",
        "PREROUTING",
        "-p",
        "tcp",
        "--dport",
        "15006",
        "-j",
        "REDIRECT",
        "--to-ports",
        "15006",
    ])?;
    let ztunnel = mesh::start_dedicated_ztunnel(&server, "vms/server-vm/server", &ca_dir, &config)?;
    let mut echo_cmd = server.command(test_support::built_binary("e2e-app")?.to_str().unwrap());
    echo_cmd.args(["echo", "--listen", "0.0.0.0:9000"]);
    let _echo = ChildGuard::spawn("bad-echo", echo_cmd)?;

    let ca = CertificateAuthority::load(&ca_dir)?;
    let cert = ca.issue(
        &Identity::new("cluster.local", "vms", "client"),
        Duration::from_secs(3600),
    )?;
    let chain = cert.chain.clone();
    let key = cert.private_key();

    let server_ns = &server;
    client.run_inside(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            // Plain TCP: no TLS at all.
            refused_once(server_ns, "tls_handshake", async {
                let mut tcp = TcpStream::connect(HBONE).await.unwrap();
                tcp.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                    .await
                    .unwrap();
                let mut buf = [0u8; 64];
                let n = tcp.read(&mut buf).await.unwrap_or(0);
                assert!(
                    n == 0 || !buf[..n].starts_with(b"HTTP"),
                    "plain TCP got an HTTP answer"
                );
            })
            .await;

            // TLS without a client certificate: the server refuses the handshake.
            refused_once(server_ns, "tls_handshake", async {
                let no_cert =
                    rustls::ClientConfig::builder_with_provider(ztunnel::tls::crypto_provider())
                        .with_protocol_versions(&[&rustls::version::TLS13])
                        .unwrap()
                        .dangerous()
                        .with_custom_certificate_verifier(Arc::new(AcceptAnyServer))
                        .with_no_client_auth();
                assert!(
                    h2_session(no_cert, HBONE, PROBE).await.is_err(),
                    "TLS without client cert must fail"
                );
            })
            .await;

            let with_cert = || {
                let mut config =
                    rustls::ClientConfig::builder_with_provider(ztunnel::tls::crypto_provider())
                        .with_protocol_versions(&[&rustls::version::TLS13])
                        .unwrap()
                        .dangerous()
                        .with_custom_certificate_verifier(Arc::new(AcceptAnyServer))
                        .with_client_auth_cert(chain.clone(), key.clone_key())
                        .unwrap();
                config.alpn_protocols = vec![b"h2".to_vec()];
                config
            };
            let mut h2 = h2_session(with_cert(), HBONE, PROBE)
                .await
                .expect("mTLS session");
            let mut other = h2_session(with_cert(), OTHER_HBONE, PROBE)
                .await
                .expect("mTLS session");
            // Each refusal moves its own counter, by one. `other` reached B's second
            // address, which belongs to no workload.
            let cases = [
                (
                    false,
                    Method::GET,
                    "http://10.10.0.2:9000/",
                    StatusCode::METHOD_NOT_ALLOWED,
                    "not_connect",
                ),
                (
                    false,
                    Method::CONNECT,
                    "not-an-ip:9000",
                    StatusCode::BAD_REQUEST,
                    "bad_authority",
                ),
                // An address other than the one the connection reached.
                (
                    false,
                    Method::CONNECT,
                    "10.99.0.1:9000",
                    StatusCode::BAD_REQUEST,
                    "authority_mismatch",
                ),
                (
                    true,
                    Method::CONNECT,
                    "10.10.0.3:9000",
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unknown_workload",
                ),
                (
                    false,
                    Method::CONNECT,
                    "10.10.0.2:1",
                    StatusCode::SERVICE_UNAVAILABLE,
                    "upstream_connect",
                ),
            ];
            for (on_other, method, uri, want, reason) in cases {
                let session = if on_other { &mut other } else { &mut h2 };
                refused_once(server_ns, reason, async {
                    assert_eq!(status(session, method, uri).await, want, "{uri}");
                })
                .await;
            }
            // ztunnel's own ports: 503, as Istio. 15008 would otherwise loop into
            // ztunnel's own HBONE listener (it listens on all addresses here).
            for port in [15008, 15006, 15020, 15021] {
                refused_once(server_ns, "self_call_hbone", async {
                    assert_eq!(
                        status(&mut h2, Method::CONNECT, &format!("10.10.0.2:{port}")).await,
                        StatusCode::SERVICE_UNAVAILABLE,
                        "CONNECT to ztunnel's port {port}"
                    );
                })
                .await;
            }

            // After all that, a good request still works end to end.
            let request = Request::builder()
                .method(Method::CONNECT)
                .uri("10.10.0.2:9000")
                .body(())
                .unwrap();
            let (response, mut send) = h2.send_request(request, false).unwrap();
            let response = response.await.unwrap();
            assert_eq!(response.status(), StatusCode::OK);
            send.send_data(Bytes::from_static(b"still alive"), false)
                .unwrap();
            let mut body = response.into_body();
            let echoed = body.data().await.unwrap().unwrap();
            assert_eq!(&echoed[..], b"still alive");

            // Plaintext straight at the inbound plaintext port: its original
            // destination is ztunnel's own port, so it is refused, not looped.
            refused_once(server_ns, "self_call_inbound_plaintext", async {
                let mut plain = TcpStream::connect("10.10.0.2:15006").await.unwrap();
                let _ = plain.write_all(b"hello").await;
                let mut buf = [0u8; 16];
                let n = tokio::time::timeout(Duration::from_secs(5), plain.read(&mut buf))
                    .await
                    .expect("the plaintext connection is closed")
                    .unwrap_or(0);
                assert_eq!(n, 0, "nothing answers on a loop");
            })
            .await;
        });
    })?;

    drop(ztunnel);
    Ok(())
}

/// Many connections to the metrics port (it listens on all addresses) that never
/// finish their request head: new scrapes are still served, the oldest slow ones are
/// closed to make room, and any unfinished head is closed after the header timeout.
#[test]
fn slow_loris_on_the_metrics_port_does_not_stop_new_connections() -> Result<()> {
    if !test_support::can_run_root_tests() {
        return Ok(());
    }
    let pair = Pair::new("lor", CONFIG)?;
    pair.client.run_inside(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            const METRICS: &str = "10.10.0.2:15020";
            let mut slow = Vec::new();
            for _ in 0..200 {
                let mut tcp = TcpStream::connect(METRICS).await.unwrap();
                tcp.write_all(b"GET /metrics HTTP/1.1\r\nHost: ztunnel\r\nX-Slow: ")
                    .await
                    .unwrap();
                slow.push(tcp);
            }
            let mut scrape = tokio::time::timeout(Duration::from_secs(3), async {
                let mut tcp = TcpStream::connect(METRICS).await?;
                tcp.write_all(
                    b"GET /metrics HTTP/1.1\r\nHost: ztunnel\r\nConnection: close\r\n\r\n",
                )
                .await?;
                let mut answer = String::new();
                tcp.read_to_string(&mut answer).await?;
                std::io::Result::Ok(answer)
            })
            .await
            .expect("a scrape is answered during the slow-loris")
            .unwrap();
            assert!(scrape.starts_with("HTTP/1.1 200"), "{scrape}");
            assert!(scrape.contains("istio_build"));
            scrape.clear();
            assert!(
                closed_within(&mut slow[0], Duration::from_secs(3)).await,
                "the oldest slow connection was closed to make room"
            );
            // A head never finished is closed after the header timeout (10 s).
            let mut last = TcpStream::connect(METRICS).await.unwrap();
            last.write_all(b"GET /metrics HTTP/1.1\r\nHo")
                .await
                .unwrap();
            let started = std::time::Instant::now();
            assert!(
                closed_within(&mut last, Duration::from_secs(20)).await,
                "an unfinished head is closed"
            );
            assert!(
                started.elapsed() >= Duration::from_secs(5),
                "{:?}",
                started.elapsed()
            );
        });
    })?;
    // Still serving, and still ready.
    ztunnel_metrics(&pair.server)?;
    mesh::http_get(&pair.server, "http://127.0.0.1:15021/healthz/ready")?;
    Ok(())
}

/// B (10.10.0.2) runs a dedicated ztunnel for `server-vm` with an echo app on 9000;
/// A (10.10.0.1) has no ztunnel and talks to B's ports directly.
struct Pair {
    _echo: ChildGuard,
    _ztunnel: ChildGuard,
    client: Netns,
    server: Netns,
    _dir: tempfile::TempDir,
}

impl Pair {
    fn new(tag: &str, config: &str) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let ca_dir = dir.path().join("ca");
        mesh::ca_init(&ca_dir)?;
        let config_path = dir.path().join("config.yaml");
        std::fs::write(&config_path, config)?;
        let client = Netns::new(&format!("{tag}-c"))?;
        let server = Netns::new(&format!("{tag}-s"))?;
        link(&client, "10.10.0.1/24", &server, "10.10.0.2/24")?;
        let ztunnel =
            mesh::start_dedicated_ztunnel(&server, "vms/server-vm/server", &ca_dir, &config_path)?;
        let mut echo_cmd = server.command(test_support::built_binary("e2e-app")?.to_str().unwrap());
        echo_cmd.args(["echo", "--listen", "0.0.0.0:9000"]);
        let echo = ChildGuard::spawn(&format!("{tag}-echo"), echo_cmd)?;
        Ok(Pair {
            _echo: echo,
            _ztunnel: ztunnel,
            client,
            server,
            _dir: dir,
        })
    }
}

/// ztunnel's refusals so far, by reason (`ztunnel_errors_total`).
fn refusals(ns: &Netns) -> BTreeMap<String, f64> {
    let metrics = ztunnel_metrics(ns).expect("ztunnel's metrics");
    metrics
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("ztunnel_errors_total{reason=\"")?;
            let (reason, value) = rest.split_once("\"} ")?;
            Some((reason.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// Runs `case` and checks that it moved the counter of `reason` by exactly one and
/// no other counter (a refusal is counted as it is answered, a failed handshake may
/// be counted just after the client gives up, hence the short wait).
async fn refused_once(ns: &Netns, reason: &str, case: impl std::future::Future<Output = ()>) {
    let before = refusals(ns);
    case.await;
    let mut expected = before.clone();
    *expected.entry(reason.to_owned()).or_default() += 1.0;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let mut after = refusals(ns);
    while after == before && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        after = refusals(ns);
    }
    assert_eq!(after, expected, "{reason}: counters before {before:?}");
}

/// Waits for the server to close `tcp` (any bytes it sends first are ignored).
async fn closed_within(tcp: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 1024];
    tokio::time::timeout(within, async {
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}
