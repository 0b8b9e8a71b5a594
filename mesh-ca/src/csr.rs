//! Certificate signing requests: built by ztunnel's CA client, checked by the CA.
//!
//! The CA only takes the public key from a CSR. The identity a leaf carries is
//! the one the caller authenticated as (or was allowed to impersonate), never the
//! SAN the CSR asks for, so nothing else in the request needs to be trusted.

use rcgen::{CertificateParams, DistinguishedName, KeyPair, SanType, SubjectPublicKeyInfo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateSigningRequestDer, PrivatePkcs8KeyDer};
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::oid_registry::{OID_EC_P256, OID_NIST_EC_P384};
use x509_parser::prelude::FromDer;
use x509_parser::public_key::PublicKey;

use shared_types::identity::Identity;

/// A PEM CSR for one SPIFFE id is well under 1 KiB; 16 KiB leaves room for RSA-4096
/// and refuses anything meant to make the CA burn memory or time.
pub const MAX_CSR_PEM_BYTES: usize = 16 * 1024;
/// Istio's minimum for workload keys.
const MIN_RSA_BITS: usize = 2048;
const MAX_RSA_BITS: usize = 8192;

/// Why a CSR was refused. Each variant is a client error: the caller sent it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CsrError {
    /// The PEM or DER is longer than [`MAX_CSR_PEM_BYTES`].
    #[error("the CSR is {len} bytes; at most {MAX_CSR_PEM_BYTES} are accepted")]
    TooLarge {
        /// The size received, in bytes.
        len: usize,
    },
    /// The text holds no PEM `CERTIFICATE REQUEST` block.
    #[error("the CSR is not a PEM CERTIFICATE REQUEST: {0}")]
    Pem(String),
    /// The DER does not parse as PKCS#10, or has trailing bytes.
    #[error("the CSR is not valid PKCS#10: {0}")]
    Malformed(String),
    /// The request's self-signature does not verify.
    #[error("the CSR's signature does not verify with its own public key")]
    BadSignature,
    /// The public key is unreadable or not ECDSA P-256/P-384 or RSA of 2048 to 8192 bits.
    #[error("the CSR's key is not accepted: {0}")]
    Key(String),
    /// [`new_csr`] could not generate the key or build the request.
    #[error("cannot build a CSR: {0}")]
    Build(String),
}

/// A CSR whose signature has been verified, reduced to what the CA uses.
#[derive(Debug)]
pub struct CertificateRequest {
    public_key: SubjectPublicKeyInfo,
    /// URI SANs the requester asked for; logged when they differ from what is issued.
    requested_uris: Vec<String>,
}

impl CertificateRequest {
    /// Parses and verifies a PEM CSR: size, PKCS#10 structure, self-signature, and a
    /// key the mesh accepts (ECDSA P-256/P-384, or RSA of 2048 to 8192 bits).
    pub fn parse_pem(pem: &str) -> Result<Self, CsrError> {
        if pem.len() > MAX_CSR_PEM_BYTES {
            return Err(CsrError::TooLarge { len: pem.len() });
        }
        let der = CertificateSigningRequestDer::from_pem_slice(pem.as_bytes())
            .map_err(|e| CsrError::Pem(e.to_string()))?;
        Self::parse_der(der.as_ref())
    }

    /// [`parse_pem`](Self::parse_pem) for a DER-encoded CSR, with the same checks.
    pub fn parse_der(der: &[u8]) -> Result<Self, CsrError> {
        if der.len() > MAX_CSR_PEM_BYTES {
            return Err(CsrError::TooLarge { len: der.len() });
        }
        let (rest, csr) = X509CertificationRequest::from_der(der)
            .map_err(|e| CsrError::Malformed(e.to_string()))?;
        if !rest.is_empty() {
            return Err(CsrError::Malformed(format!(
                "{} trailing bytes after the request",
                rest.len()
            )));
        }
        let spki = &csr.certification_request_info.subject_pki;
        // Checked before the signature so a weak key gets its own clear answer.
        check_key(spki)?;
        csr.verify_signature().map_err(|_| CsrError::BadSignature)?;
        let public_key = SubjectPublicKeyInfo::from_der(spki.raw)
            .map_err(|e| CsrError::Key(format!("unsupported public key: {e}")))?;
        Ok(CertificateRequest {
            public_key,
            requested_uris: requested_uris(&csr),
        })
    }

    /// The requester's public key, which the issued leaf certifies.
    pub fn public_key(&self) -> &SubjectPublicKeyInfo {
        &self.public_key
    }

    /// The URI SANs the requester asked for (not what is issued).
    pub fn requested_uris(&self) -> &[String] {
        &self.requested_uris
    }
}

/// A fresh ECDSA P-256 key and a CSR for `id` as Istio's ztunnel writes it: SHA-256
/// signature, one URI SAN with the SPIFFE id, no common name.
pub fn new_csr(id: &Identity) -> Result<(PrivatePkcs8KeyDer<'static>, String), CsrError> {
    let build = |e: rcgen::Error| CsrError::Build(e.to_string());
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(build)?;
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.subject_alt_names = vec![SanType::URI(id.to_uri().try_into().map_err(build)?)];
    let csr = params.serialize_request(&key).map_err(build)?;
    let pem = csr.pem().map_err(build)?;
    Ok((PrivatePkcs8KeyDer::from(key.serialize_der()), pem))
}

fn check_key(spki: &x509_parser::x509::SubjectPublicKeyInfo<'_>) -> Result<(), CsrError> {
    let key = spki
        .parsed()
        .map_err(|e| CsrError::Key(format!("unreadable public key: {e}")))?;
    match key {
        PublicKey::EC(_) => {
            let curve = spki
                .algorithm
                .parameters
                .as_ref()
                .and_then(|p| p.as_oid().ok());
            match curve {
                Some(c) if c == OID_EC_P256 || c == OID_NIST_EC_P384 => Ok(()),
                _ => Err(CsrError::Key("ECDSA keys must be on P-256 or P-384".into())),
            }
        }
        PublicKey::RSA(rsa) => {
            let bits = rsa.key_size();
            if (MIN_RSA_BITS..=MAX_RSA_BITS).contains(&bits) {
                Ok(())
            } else {
                Err(CsrError::Key(format!(
                    "RSA-{bits}: RSA keys must have {MIN_RSA_BITS} to {MAX_RSA_BITS} bits"
                )))
            }
        }
        _ => Err(CsrError::Key(
            "only ECDSA (P-256, P-384) and RSA keys are accepted".into(),
        )),
    }
}

fn requested_uris(csr: &X509CertificationRequest<'_>) -> Vec<String> {
    let Some(extensions) = csr.requested_extensions() else {
        return Vec::new();
    };
    extensions
        .filter_map(|ext| match ext {
            ParsedExtension::SubjectAlternativeName(san) => Some(san),
            _ => None,
        })
        .flat_map(|san| san.general_names.iter())
        .filter_map(|name| match name {
            GeneralName::URI(uri) => Some(uri.to_string()),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
#[path = "csr_tests.rs"]
mod tests;
