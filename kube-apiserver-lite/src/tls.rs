//! TLS on the server's one port, beside plain HTTP: a connection that opens with a TLS
//! handshake record is served over TLS, with a self-signed certificate; every other
//! connection is plain HTTP as before. Why: client-go (so kubectl) sends
//! bearer tokens only over TLS (kubernetes/kubectl#744), so `kubectl --token ... auth
//! whoami` needs `https://` (with `--insecure-skip-tls-verify`); the other clients keep
//! using `http://`.
//!
//! With a state file the key and certificate are kept beside it and reused, as a real
//! API server's serving certificate outlives its restarts: in-cluster clients trust
//! the `ca.crt` they were given, and a new certificate would lock them all out.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::TcpStream;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_rustls::rustls::{self, ServerConfig};
use tokio_rustls::TlsAcceptor;

/// First byte of a TLS record carrying a handshake message (the ClientHello); no HTTP
/// request starts with it.
const HANDSHAKE_RECORD: u8 = 0x16;

/// Where the serving key and certificate of a server at `addr` with `state_file` are
/// kept (by address: a server moved to another address needs a certificate naming it).
pub fn files_beside(state_file: &Path, addr: SocketAddr) -> (PathBuf, PathBuf) {
    let ip = addr.ip().to_string().replace(':', "_");
    (
        state_file.with_extension(format!("tls-{ip}.key")),
        state_file.with_extension(format!("tls-{ip}.crt")),
    )
}

/// An acceptor with the self-signed certificate for `addr`'s IP, localhost and the
/// in-cluster names of the API server, and that certificate in PEM (what in-cluster
/// clients trust: their `ca.crt`). The key and certificate come from `kept` (key, cert)
/// when both are there and parse; otherwise they are made and written there.
pub fn acceptor(
    addr: SocketAddr,
    kept: Option<(PathBuf, PathBuf)>,
) -> Result<(TlsAcceptor, String), String> {
    let (key, der, pem) = match kept.as_ref().and_then(|(k, c)| load(k, c)) {
        Some(loaded) => loaded,
        None => {
            let made = make(addr)?;
            if let Some((key_file, cert_file)) = &kept {
                let key_pem = made.0.serialize_pem();
                mesh_runtime::fs::write_atomic_with_mode(key_file, key_pem.as_bytes(), 0o600)
                    .and_then(|()| {
                        mesh_runtime::fs::write_atomic(cert_file, made.2.as_bytes(), 0o644)
                    })
                    .map_err(|e| format!("keeping the serving certificate: {e}"))?;
            }
            made
        }
    };
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(vec![der], key)
        .map_err(|e| e.to_string())?;
    // The server speaks HTTP/1.1 only; Go clients offer h2 first.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok((TlsAcceptor::from(Arc::new(config)), pem))
}

type Certified = (rcgen::KeyPair, CertificateDer<'static>, String);

/// The kept key and certificate, if both read and parse.
fn load(key_file: &Path, cert_file: &Path) -> Option<Certified> {
    let key = rcgen::KeyPair::from_pem(&std::fs::read_to_string(key_file).ok()?).ok()?;
    let pem = std::fs::read_to_string(cert_file).ok()?;
    let der = CertificateDer::from_pem_slice(pem.as_bytes()).ok()?;
    Some((key, der, pem))
}

fn make(addr: SocketAddr) -> Result<Certified, String> {
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
    Ok((key, cert.der().clone(), pem))
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
        assert!(acceptor("127.0.0.1:6443".parse().unwrap(), None).is_ok());
    }

    #[test]
    fn keeps_its_certificate_across_restarts_for_the_same_address() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state.json");
        let addr: SocketAddr = "10.1.0.1:6443".parse().unwrap();
        let kept = files_beside(&state, addr);
        let (_, first) = acceptor(addr, Some(kept.clone())).unwrap();
        let (_, again) = acceptor(addr, Some(kept.clone())).unwrap();
        assert_eq!(
            first, again,
            "a restart serves the certificate clients trust"
        );
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&kept.0).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600, "the key is the server's alone");
        // Another address: a certificate that names it.
        let other: SocketAddr = "10.1.0.2:6443".parse().unwrap();
        let (_, moved) = acceptor(other, Some(files_beside(&state, other))).unwrap();
        assert_ne!(first, moved);
        // Garbage in the files: a new certificate, not a failure.
        std::fs::write(&kept.1, "not a certificate").unwrap();
        assert!(acceptor(addr, Some(kept)).is_ok());
    }
}
