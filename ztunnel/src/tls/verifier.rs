//! Certificate verifiers that add SPIFFE checks on top of webpki chain validation.
//!
//! webpki's server verifier would check a DNS name or IP, which SPIFFE leaves do
//! not carry; HBONE instead pins identities. Both verifiers first validate the
//! chain (signatures, validity, EKU) and only then look at the SPIFFE id, and all
//! failures become `InvalidCertificate` errors with a message naming both sides.

use std::fmt;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::ParsedCertificate;
use rustls::{
    CertificateError, DigitallySignedStruct, DistinguishedName, Error, OtherError, RootCertStore,
    SignatureScheme,
};

use super::{identity_from_cert, TlsError};
use crate::identity::Identity;

/// The handshake signature checks, made the same way by both verifiers: rustls' own,
/// over the provider's algorithms (`self.algorithms`).
macro_rules! signature_checks {
    () => {
        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, Error> {
            rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, Error> {
            rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.algorithms.supported_schemes()
        }
    };
}

/// Turns our reason into a rustls certificate error (sent as a bad_certificate alert).
fn reject(reason: TlsError) -> Error {
    Error::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(Rejection(
        reason,
    )))))
}

/// rustls prints `CertificateError::Other` with `{:?}`; this makes that the message.
struct Rejection(TlsError);

impl fmt::Debug for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for Rejection {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

/// Client-side verifier: the server must chain to our roots and be one of `expected`.
#[derive(Debug)]
pub(super) struct ExpectedIdentityVerifier {
    roots: Arc<RootCertStore>,
    expected: Vec<Identity>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ExpectedIdentityVerifier {
    pub(super) fn new(
        roots: Arc<RootCertStore>,
        expected: Vec<Identity>,
        provider: &CryptoProvider,
    ) -> Self {
        ExpectedIdentityVerifier {
            roots,
            expected,
            algorithms: provider.signature_verification_algorithms,
        }
    }
}

impl ServerCertVerifier for ExpectedIdentityVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let leaf = ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &leaf,
            &self.roots,
            intermediates,
            now,
            self.algorithms.all,
        )?;
        let got = identity_from_cert(end_entity).map_err(reject)?;
        if !self.expected.contains(&got) {
            return Err(reject(TlsError::UnexpectedServer {
                got,
                expected: self.expected.clone(),
            }));
        }
        Ok(ServerCertVerified::assertion())
    }

    signature_checks!();
}

/// Server-side verifier: the client must chain to our roots (webpki, clientAuth EKU)
/// and carry an identity in our trust domain. A client certificate is mandatory.
#[derive(Debug)]
pub(super) struct TrustDomainVerifier {
    chain: Arc<dyn ClientCertVerifier>,
    trust_domain: String,
    algorithms: WebPkiSupportedAlgorithms,
}

impl TrustDomainVerifier {
    pub(super) fn new(
        chain: Arc<dyn ClientCertVerifier>,
        trust_domain: String,
        provider: Arc<CryptoProvider>,
    ) -> Self {
        TrustDomainVerifier {
            chain,
            trust_domain,
            algorithms: provider.signature_verification_algorithms,
        }
    }
}

impl ClientCertVerifier for TrustDomainVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.chain.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, Error> {
        self.chain
            .verify_client_cert(end_entity, intermediates, now)?;
        let got = identity_from_cert(end_entity).map_err(reject)?;
        if got.trust_domain != self.trust_domain {
            return Err(reject(TlsError::ForeignTrustDomain {
                got,
                trust_domain: self.trust_domain.clone(),
            }));
        }
        Ok(ClientCertVerified::assertion())
    }

    signature_checks!();
}
