//! The 15012 listener: TLS with a serving certificate from the mesh CA, renewed
//! at half-life without a restart, carrying istiod's gRPC services.
//!
//! Clients authenticate with tokens in the request, as Istio's do, so no client
//! certificate is asked for. ALPN is h2 only (gRPC).

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use mesh_ca::CertificateAuthority;
use rustls::crypto::aws_lc_rs;
use rustls::pki_types::PrivateKeyDer;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::TcpListener;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const RETRY: Duration = Duration::from_secs(5);

/// The current serving certificate; swapped in place on renewal.
#[derive(Debug)]
pub struct ServingCert {
    current: RwLock<Arc<CertifiedKey>>,
}

impl ServingCert {
    fn issue(
        ca: &CertificateAuthority,
        names: &[String],
        lifetime: Duration,
    ) -> anyhow::Result<(Arc<CertifiedKey>, SystemTime)> {
        let cert = ca.issue_serving(names, lifetime)?;
        let key = PrivateKeyDer::Pkcs8(cert.key);
        let signer = aws_lc_rs::sign::any_supported_type(&key)?;
        Ok((
            Arc::new(CertifiedKey::new(cert.chain, signer)),
            cert.not_after,
        ))
    }

    /// Issues the first certificate and keeps renewing it at half-life until `shutdown`.
    pub fn start(
        ca: Arc<CertificateAuthority>,
        names: Vec<String>,
        lifetime: Duration,
        shutdown: CancellationToken,
    ) -> anyhow::Result<Arc<Self>> {
        let (first, mut not_after) = Self::issue(&ca, &names, lifetime)?;
        let serving = Arc::new(ServingCert {
            current: RwLock::new(first),
        });
        tracing::info!(?names, "serving certificate issued");
        let this = serving.clone();
        tokio::spawn(async move {
            loop {
                let left = not_after
                    .duration_since(SystemTime::now())
                    .unwrap_or_default();
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(left / 2) => {}
                }
                match Self::issue(&ca, &names, lifetime) {
                    Ok((cert, expiry)) => {
                        *this.current.write().unwrap_or_else(|p| p.into_inner()) = cert;
                        not_after = expiry;
                        tracing::info!("serving certificate renewed");
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "cannot renew the serving certificate; retrying");
                        tokio::time::sleep(RETRY).await;
                    }
                }
            }
        });
        Ok(serving)
    }
}

impl ResolvesServerCert for ServingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        )
    }
}

pub fn tls_acceptor(serving: Arc<ServingCert>) -> anyhow::Result<TlsAcceptor> {
    let mut config =
        rustls::ServerConfig::builder_with_provider(Arc::new(aws_lc_rs::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_cert_resolver(serving);
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Accepts TCP, completes TLS off the accept loop (a slow client holds up no one),
/// and yields finished streams for tonic.
pub fn incoming(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    shutdown: CancellationToken,
) -> tokio_stream::wrappers::ReceiverStream<std::io::Result<TlsStream<tokio::net::TcpStream>>> {
    let (tx, rx) = tokio::sync::mpsc::channel(128);
    tokio::spawn(async move {
        loop {
            let (tcp, peer): (_, SocketAddr) = tokio::select! {
                () = shutdown.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of fds and the like: back off instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let _ = tcp.set_nodelay(true);
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => {
                        let _ = tx.send(Ok(tls)).await;
                    }
                    Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                    Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn current(serving: &ServingCert) -> Arc<CertifiedKey> {
        serving.current.read().unwrap().clone()
    }

    #[tokio::test]
    async fn the_serving_certificate_is_renewed_before_it_expires() {
        let ca = Arc::new(CertificateAuthority::generate_self_signed("cluster.local").unwrap());
        let shutdown = CancellationToken::new();
        let names = vec!["istiod.istio-system.svc".to_owned(), "10.1.0.1".to_owned()];
        // CAs backdate not_before; a 2 s lifetime is renewed after ~1 s.
        let serving =
            ServingCert::start(ca, names, Duration::from_secs(2), shutdown.clone()).unwrap();
        let first = current(&serving);
        let (_, x509) = x509_parser::parse_x509_certificate(&first.cert[0]).unwrap();
        let san = x509.subject_alternative_name().unwrap().unwrap();
        assert_eq!(san.value.general_names.len(), 2, "a DNS name and an IP");
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let second = current(&serving);
        assert_ne!(first.cert[0], second.cert[0], "renewed at half-life");
        shutdown.cancel();
    }
}
