//! Garbage at a dedicated ztunnel's HBONE port, from a namespace with no ztunnel:
//! every bad request gets Istio's error answer and a counter, never a crash, and
//! the ztunnel keeps serving good requests afterwards.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use bytes::Bytes;
use e2e::mesh::{self, metric_sum, ztunnel_metrics};
use e2e::netns::{link, Netns};
use e2e::process::ChildGuard;
use http::{Method, Request, StatusCode};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
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

#[test]
fn bad_hbone_input_is_refused_and_counted() -> Result<()> {
    if !e2e::can_run_root_tests() {
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
    let ztunnel = mesh::start_dedicated_ztunnel(&server, "vms/server-vm/server", &ca_dir, &config)?;
    let mut echo_cmd = server.command(mesh::binary("e2e-app")?.to_str().unwrap());
    echo_cmd.args(["echo", "--listen", "0.0.0.0:9000"]);
    let _echo = ChildGuard::spawn("bad-echo", echo_cmd)?;

    let ca = CertificateAuthority::load(&ca_dir)?;
    let cert = ca.issue(
        &Identity::new("cluster.local", "vms", "client"),
        Duration::from_secs(3600),
    )?;
    let chain = cert.chain.clone();
    let key = cert.private_key();

    client.run_inside(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            // Plain TCP: no TLS at all.
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

            // TLS without a client certificate: the server refuses the handshake.
            let no_cert =
                rustls::ClientConfig::builder_with_provider(ztunnel::tls::crypto_provider())
                    .with_protocol_versions(&[&rustls::version::TLS13])
                    .unwrap()
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(AcceptAnyServer))
                    .with_no_client_auth();
            assert!(
                h2_session(no_cert, HBONE).await.is_err(),
                "TLS without client cert must fail"
            );

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
            let mut h2 = h2_session(with_cert(), HBONE).await.expect("mTLS session");
            assert_eq!(
                status(&mut h2, Method::GET, "http://10.10.0.2:9000/").await,
                StatusCode::METHOD_NOT_ALLOWED
            );
            assert_eq!(
                status(&mut h2, Method::CONNECT, "not-an-ip:9000").await,
                StatusCode::BAD_REQUEST
            );
            assert_eq!(
                status(&mut h2, Method::CONNECT, "10.99.0.1:9000").await,
                StatusCode::BAD_REQUEST
            );
            let mut other = h2_session(with_cert(), OTHER_HBONE)
                .await
                .expect("mTLS session");
            assert_eq!(
                status(&mut other, Method::CONNECT, "10.10.0.3:9000").await,
                StatusCode::SERVICE_UNAVAILABLE
            );
            assert_eq!(
                status(&mut h2, Method::CONNECT, "10.10.0.2:1").await,
                StatusCode::SERVICE_UNAVAILABLE
            );

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
        });
    })?;

    let metrics = ztunnel_metrics(&server)?;
    for reason in [
        "tls_handshake",
        "not_connect",
        "bad_authority",
        "authority_mismatch",
        "unknown_workload",
        "upstream_connect",
    ] {
        assert!(
            metric_sum(&metrics, "ztunnel_errors_total", &[("reason", reason)]) >= 1.0,
            "{reason}: {metrics}"
        );
    }
    assert!(
        metric_sum(
            &metrics,
            "ztunnel_errors_total",
            &[("reason", "tls_handshake")]
        ) >= 2.0,
        "plain TCP and the missing client cert are both counted: {metrics}"
    );
    drop(ztunnel);
    Ok(())
}

async fn h2_session(
    config: rustls::ClientConfig,
    addr: &str,
) -> Result<h2::client::SendRequest<Bytes>> {
    let mut config = config;
    config.alpn_protocols = vec![b"h2".to_vec()];
    let addr: SocketAddr = addr.parse()?;
    let tcp = TcpStream::connect(addr).await?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::IpAddress(addr.ip().into()), tcp)
        .await?;
    let (send, connection) = h2::client::handshake(tls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    // With TLS 1.3 a refused client certificate shows up on the first exchange.
    let mut ready = send.ready().await?;
    let probe = Request::builder()
        .method(Method::CONNECT)
        .uri("10.10.0.2:9")
        .body(())?;
    let (response, _) = ready.send_request(probe, true)?;
    response.await?;
    Ok(ready)
}

async fn status(h2: &mut h2::client::SendRequest<Bytes>, method: Method, uri: &str) -> StatusCode {
    let request = Request::builder().method(method).uri(uri).body(()).unwrap();
    let mut ready = h2.clone().ready().await.unwrap();
    let (response, _) = ready.send_request(request, true).unwrap();
    response.await.unwrap().status()
}

/// The test inspects the server's answers; server authentication is not under test.
#[derive(Debug)]
struct AcceptAnyServer;

impl ServerCertVerifier for AcceptAnyServer {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }
    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        ztunnel::tls::crypto_provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}
