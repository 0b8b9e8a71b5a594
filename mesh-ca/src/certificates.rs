//! The certificates the CA hands out: a workload's leaf with its key
//! ([`WorkloadCertificate`]), a leaf signed over someone else's key ([`IssuedChain`]),
//! a control-plane serving certificate ([`ServingCertificate`]), and the check peers
//! make of a chain ([`verify_chain`]).

use std::time::SystemTime;

use rcgen::KeyPair;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::RootCertStore;
use shared_types::identity::Identity;

use crate::pem::pem_encode;
use crate::validity::to_system_time;

/// A control-plane serving certificate with its key.
#[derive(Debug)]
pub struct ServingCertificate {
    /// Leaf first, then the CA's chain.
    pub chain: Vec<CertificateDer<'static>>,
    /// The leaf's private key (ECDSA P-256).
    pub key: PrivatePkcs8KeyDer<'static>,
    /// When the leaf expires.
    pub not_after: SystemTime,
}

/// A leaf signed over a requester's key: what a certificate service answers.
#[derive(Debug)]
pub struct IssuedChain {
    /// Leaf first, then the CA's cert-chain.pem entries.
    pub chain: Vec<CertificateDer<'static>>,
    /// The CA's trust roots.
    pub roots: Vec<CertificateDer<'static>>,
    /// Hex serial number of the leaf.
    pub serial: String,
    /// When the leaf expires.
    pub not_after: SystemTime,
}

impl IssuedChain {
    /// One PEM per certificate, leaf first and root last, each ending in a newline
    /// (Istio's `cert_chain`). A root already at the end of the chain is not repeated.
    pub fn to_pem_list(&self) -> Vec<String> {
        let mut certs: Vec<&CertificateDer<'_>> = self.chain.iter().collect();
        for root in &self.roots {
            if certs.last() != Some(&root) {
                certs.push(root);
            }
        }
        certs.iter().map(|c| pem_encode("CERTIFICATE", c)).collect()
    }
}

/// A leaf with its key, as handed to the TLS configs.
#[derive(Debug)]
pub struct WorkloadCertificate {
    /// The identity the leaf's URI SAN carries.
    pub identity: Identity,
    /// Leaf first, then the CA's cert-chain.pem entries (intermediates up to, not
    /// necessarily including, the root).
    pub chain: Vec<CertificateDer<'static>>,
    /// The trust roots peers' chains are verified against.
    pub roots: Vec<CertificateDer<'static>>,
    /// Start of the leaf's validity.
    pub not_before: SystemTime,
    /// End of the leaf's validity.
    pub not_after: SystemTime,
    /// Hex serial number.
    pub serial: String,
    pub(crate) key: PrivatePkcs8KeyDer<'static>,
}

impl WorkloadCertificate {
    /// A leaf someone else signed (a CA service's answer) with the key that was
    /// certified. Checks what peers would: the leaf parses, carries exactly `id`,
    /// certifies `key`, and chains to `roots`.
    pub fn from_issued(
        id: &Identity,
        chain: Vec<CertificateDer<'static>>,
        roots: Vec<CertificateDer<'static>>,
        key: PrivatePkcs8KeyDer<'static>,
    ) -> Result<Self, String> {
        let leaf = chain.first().ok_or("the certificate chain is empty")?;
        let (_, x509) = x509_parser::parse_x509_certificate(leaf)
            .map_err(|e| format!("the leaf is not X.509: {e}"))?;
        let uris: Vec<String> = match x509.subject_alternative_name() {
            Ok(Some(san)) => san
                .value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    x509_parser::extensions::GeneralName::URI(u) => Some(u.to_string()),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        };
        if uris != [id.to_uri()] {
            return Err(format!(
                "the leaf names {uris:?}, not the identity asked for ({id})"
            ));
        }
        let pair = KeyPair::try_from(&key).map_err(|e| format!("unusable private key: {e}"))?;
        if pair.public_key_raw() != x509.public_key().subject_public_key.data.as_ref() {
            return Err("the leaf does not certify the key that was sent".into());
        }
        verify_chain(&chain, &roots, UnixTime::now())
            .map_err(|e| format!("the chain does not verify against the roots: {e}"))?;
        let validity = x509.validity();
        Ok(WorkloadCertificate {
            identity: id.clone(),
            not_before: to_system_time(validity.not_before.timestamp()),
            not_after: to_system_time(validity.not_after.timestamp()),
            serial: x509.raw_serial_as_string().replace(':', ""),
            chain,
            roots,
            key,
        })
    }

    /// A copy of the leaf's private key, for a TLS config.
    pub fn private_key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(self.key.clone_key())
    }

    /// Half-life: late enough to keep churn low, early enough that a CA outage of
    /// half a lifetime does not break anything.
    pub fn refresh_at(&self) -> SystemTime {
        let total = self
            .not_after
            .duration_since(self.not_before)
            .unwrap_or_default();
        self.not_before + total / 2
    }

    /// The leaf alone as PEM; empty if the chain is empty.
    pub fn leaf_pem(&self) -> String {
        self.chain
            .first()
            .map(|c| pem_encode("CERTIFICATE", c))
            .unwrap_or_default()
    }

    /// The whole chain (leaf first) as PEM, for config dumps.
    pub fn chain_pem(&self) -> String {
        self.chain
            .iter()
            .map(|c| pem_encode("CERTIFICATE", c))
            .collect()
    }
}

/// Verifies `chain` (leaf first) against `roots` as a TLS peer would (EKU serverAuth).
pub fn verify_chain(
    chain: &[CertificateDer<'_>],
    roots: &[CertificateDer<'_>],
    now: UnixTime,
) -> Result<(), String> {
    let (leaf, intermediates) = chain.split_first().ok_or("empty chain")?;
    let mut store = RootCertStore::empty();
    for root in roots {
        store
            .add(root.clone().into_owned())
            .map_err(|e| format!("unusable root: {e}"))?;
    }
    let leaf = ParsedCertificate::try_from(leaf).map_err(|e| e.to_string())?;
    let provider = rustls::crypto::aws_lc_rs::default_provider();
    rustls::client::verify_server_cert_signed_by_trust_anchor(
        &leaf,
        &store,
        intermediates,
        now,
        provider.signature_verification_algorithms.all,
    )
    .map_err(|e| e.to_string())
}
