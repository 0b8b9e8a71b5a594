//! TLS on the server's one port, beside plain HTTP: a connection that opens with a TLS
//! handshake record is served over TLS, with a self-signed certificate made at start;
//! every other connection is plain HTTP as before. Why: client-go (so kubectl) sends
//! bearer tokens only over TLS (kubernetes/kubectl#744), so `kubectl --token ... auth
//! whoami` needs `https://` (with `--insecure-skip-tls-verify`); the other clients keep
//! using `http://`.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpStream;
use tokio_rustls::rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_rustls::rustls::{self, ServerConfig};
use tokio_rustls::TlsAcceptor;

/// First byte of a TLS record carrying a handshake message (the ClientHello); no HTTP
/// request starts with it.
const HANDSHAKE_RECORD: u8 = 0x16;

/// An acceptor with a fresh self-signed certificate for `addr`'s IP, localhost and the
/// in-cluster names of the API server, and that certificate in PEM (what in-cluster
/// clients trust: their `ca.crt`).
pub fn acceptor(addr: SocketAddr) -> Result<(TlsAcceptor, String), String> {
    let key =
        rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(|e| e.to_string())?;
    let mut params = rcgen::CertificateParams::new(vec![
        "localhost".to_string(),
        "kubernetes".to_string(),
        "kubernetes.default".to_string(),
        "kubernetes.default.svc".to_string(),
        "kubernetes.default.svc.cluster.local".to_string(),
    ])
    .map_err(|e| e.to_string())?;
    params
        .subject_alt_names
        .push(rcgen::SanType::IpAddress(addr.ip()));
    let cert = params.self_signed(&key).map_err(|e| e.to_string())?;
    let pem = cert.pem();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], key)
        .map_err(|e| e.to_string())?;
    // The server speaks HTTP/1.1 only; Go clients offer h2 first.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok((TlsAcceptor::from(Arc::new(config)), pem))
}

/// True when the client's first byte opens a TLS handshake (waits for that byte).
pub async fn starts_with_handshake(stream: &TcpStream) -> bool {
    let mut first = [0u8; 1];
    matches!(stream.peek(&mut first).await, Ok(1)) && first[0] == HANDSHAKE_RECORD
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn makes_a_certificate() {
        assert!(acceptor("127.0.0.1:6443".parse().unwrap()).is_ok());
    }
}
