//! The client of istiod's certificate service (`CA_ADDRESS`).
//!
//! For each identity: a fresh P-256 key and CSR, `CreateCertificate` with the
//! node's service-account token (re-read for every call, since kubelet rotates
//! it), and in shared mode `ImpersonatedIdentity` naming the pod's identity. The
//! answer is only accepted if its leaf carries exactly that identity, certifies
//! the key we sent, and chains to the root it came with.

use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use shared_types::istio::ca::IstioCertificateRequest;
use shared_types::istio::ca_service::IstioCertificateServiceClient;
use tonic::Code;

use super::{Identity, WorkloadCertificate};
use crate::control_plane::{ControlPlane, ControlPlaneConfig, ControlPlaneError};

const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a certificate request failed.
#[derive(Debug, thiserror::Error)]
pub enum CaClientError {
    #[error(transparent)]
    Setup(#[from] ControlPlaneError),
    #[error("cannot build the CSR: {0}")]
    Csr(#[from] mesh_ca::CsrError),
    #[error("the CA is unreachable: {0}")]
    Unavailable(String),
    #[error("the CA refused the request ({code:?}): {message}")]
    Refused { code: Code, message: String },
    #[error("the CA's answer is not usable: {0}")]
    BadResponse(String),
}

impl CaClientError {
    pub fn reason(&self) -> &'static str {
        match self {
            CaClientError::Setup(ControlPlaneError::Config(_)) => "config",
            CaClientError::Setup(ControlPlaneError::Token(_)) => "token",
            CaClientError::Csr(_) => "csr",
            CaClientError::Unavailable(_) => "unavailable",
            CaClientError::Refused { code, .. } if *code == Code::Unauthenticated => {
                "unauthenticated"
            }
            CaClientError::Refused { .. } => "refused",
            CaClientError::BadResponse(_) => "bad_response",
        }
    }
}

/// The CA's connection to istiod, shared by all fetches.
pub struct CaClient {
    control_plane: ControlPlane,
    /// Shared mode asks for its pods' identities, not its own.
    impersonate: bool,
}

impl CaClient {
    pub fn new(config: &ControlPlaneConfig, impersonate: bool) -> Result<Self, CaClientError> {
        Ok(CaClient {
            control_plane: ControlPlane::new(config)?,
            impersonate,
        })
    }

    /// A leaf for `id`, valid for `lifetime` unless the CA shortens it.
    pub async fn fetch(
        &self,
        id: &Identity,
        lifetime: Duration,
    ) -> Result<WorkloadCertificate, CaClientError> {
        let (key, csr) = mesh_ca::csr::new_csr(id)?;
        let mut body = IstioCertificateRequest {
            csr,
            validity_duration: i64::try_from(lifetime.as_secs()).unwrap_or(i64::MAX),
            metadata: None,
        };
        if self.impersonate {
            body = body.with_impersonated_identity(&id.to_uri());
        }
        // The deadline goes to istiod (`grpc-timeout`) and is enforced here too: a
        // peer that never answers must not hang the fetch.
        let mut request = self.control_plane.request(body)?;
        request.set_timeout(REQUEST_TIMEOUT);
        let mut client = IstioCertificateServiceClient::new(self.control_plane.channel());
        let response = tokio::time::timeout(REQUEST_TIMEOUT, client.create_certificate(request))
            .await
            .map_err(|_| CaClientError::Unavailable(format!("no answer in {REQUEST_TIMEOUT:?}")))?
            .map_err(|status| match status.code() {
                Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown => {
                    CaClientError::Unavailable(status.message().to_owned())
                }
                code => CaClientError::Refused {
                    code,
                    message: status.message().to_owned(),
                },
            })?;
        into_certificate(id, response.into_inner().cert_chain, key)
    }
}

/// Leaf first, then its chain, then the roots. Every element is read whole: Istio's
/// istiod sends its root bundle as one last element, istiod-lite one certificate per
/// element. The trailing self-signed certificates are the roots (at least the last
/// one), so every root of a bundle is trusted, as during a root rotation.
fn into_certificate(
    id: &Identity,
    pems: Vec<String>,
    key: rustls::pki_types::PrivatePkcs8KeyDer<'static>,
) -> Result<WorkloadCertificate, CaClientError> {
    let mut certs = Vec::with_capacity(pems.len());
    for pem in &pems {
        let before = certs.len();
        for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            certs.push(cert.map_err(|e| {
                CaClientError::BadResponse(format!("a chain element is not PEM: {e}"))
            })?);
        }
        if certs.len() == before {
            return Err(CaClientError::BadResponse(
                "a chain element holds no certificate".into(),
            ));
        }
    }
    if certs.len() < 2 {
        return Err(CaClientError::BadResponse(format!(
            "expected the leaf and the root, got {} certificates",
            certs.len()
        )));
    }
    let more_roots = certs[1..certs.len() - 1]
        .iter()
        .rev()
        .take_while(|c| self_signed(c))
        .count();
    let roots = certs.split_off(certs.len() - 1 - more_roots);
    WorkloadCertificate::from_issued(id, certs, roots, key).map_err(CaClientError::BadResponse)
}

fn self_signed(cert: &CertificateDer<'_>) -> bool {
    x509_parser::parse_x509_certificate(cert)
        .is_ok_and(|(_, x509)| x509.subject().as_raw() == x509.issuer().as_raw())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A root bundle of two (a rotation): the leaf verifies whichever root issued it,
    /// and both roots are trusted, in istiod-lite's shape and in Istio's.
    #[test]
    fn every_root_of_a_bundle_is_trusted() {
        let td = "cluster.local";
        let dir = tempfile::tempdir().unwrap();
        let issuing = mesh_ca::CertificateAuthority::generate_self_signed(td).unwrap();
        let other = mesh_ca::CertificateAuthority::generate_self_signed(td).unwrap();
        issuing.write(dir.path()).unwrap();
        let bundle = issuing.roots_pem() + &other.roots_pem();
        std::fs::write(dir.path().join("root-cert.pem"), &bundle).unwrap();
        let ca = mesh_ca::CertificateAuthority::load(dir.path()).unwrap();

        let id = Identity::new(td, "a", "b");
        let (key, csr) = mesh_ca::csr::new_csr(&id).unwrap();
        let csr = mesh_ca::csr::CertificateRequest::parse_pem(&csr).unwrap();
        let issued = ca
            .issue_for_key(csr.public_key(), &id, std::time::Duration::from_secs(600))
            .unwrap();
        let leaf_pem = issued.to_pem_list().remove(0);
        for (shape, pems) in [
            ("one per element", issued.to_pem_list()),
            ("bundle last", vec![leaf_pem.clone(), bundle.clone()]),
        ] {
            let cert = into_certificate(&id, pems, key.clone_key())
                .unwrap_or_else(|e| panic!("{shape}: {e}"));
            assert_eq!(cert.chain.len(), 1, "{shape}");
            let roots: std::collections::BTreeSet<&[u8]> =
                cert.roots.iter().map(|r| r.as_ref()).collect();
            assert_eq!(roots.len(), 2, "{shape}");
        }
    }

    #[test]
    fn answers_without_leaf_and_root_are_refused() {
        let id = Identity::new("cluster.local", "a", "b");
        let (key, _) = mesh_ca::csr::new_csr(&id).unwrap();
        let err = into_certificate(&id, vec![], key.clone_key()).unwrap_err();
        assert_eq!(err.reason(), "bad_response");
        let err = into_certificate(&id, vec!["junk".into(), "junk".into()], key).unwrap_err();
        assert_eq!(err.reason(), "bad_response");
    }
}
