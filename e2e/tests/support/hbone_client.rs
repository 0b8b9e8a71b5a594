//! A raw HBONE client for the bad-input tests: mutual TLS with a mesh certificate,
//! then HTTP/2 requests of the test's choosing.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use bytes::Bytes;
use http::{Method, Request, StatusCode};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use tokio::net::TcpStream;
use ztunnel::identity::{CertificateAuthority, Identity};

/// A client config with a certificate for `vms/client` from the CA in `ca_dir`,
/// accepting any server.
#[allow(dead_code)] // Not every test file uses every helper.
pub fn client_tls(ca_dir: &Path) -> Result<rustls::ClientConfig> {
    let ca = CertificateAuthority::load(ca_dir)?;
    let cert = ca.issue(
        &Identity::new("cluster.local", "vms", "client"),
        Duration::from_secs(3600),
    )?;
    Ok(
        rustls::ClientConfig::builder_with_provider(ztunnel::tls::crypto_provider())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAnyServer))
            .with_client_auth_cert(cert.chain.clone(), cert.private_key())?,
    )
}

/// An HTTP/2 session over TLS to `addr`, checked with one CONNECT to `probe` (with
/// TLS 1.3 a refused client certificate only shows on the first exchange).
pub async fn h2_session(
    config: rustls::ClientConfig,
    addr: &str,
    probe: &str,
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
    let mut ready = send.ready().await?;
    let probe = Request::builder()
        .method(Method::CONNECT)
        .uri(probe)
        .body(())?;
    let (response, _) = ready.send_request(probe, true)?;
    response.await?;
    Ok(ready)
}

/// The status a request without a body gets.
pub async fn status(
    h2: &mut h2::client::SendRequest<Bytes>,
    method: Method,
    uri: &str,
) -> StatusCode {
    let request = Request::builder().method(method).uri(uri).body(()).unwrap();
    let mut ready = h2.clone().ready().await.unwrap();
    let (response, _) = ready.send_request(request, true).unwrap();
    response.await.unwrap().status()
}

/// The tests inspect the server's answers; server authentication is not under test.
#[derive(Debug)]
pub struct AcceptAnyServer;

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
