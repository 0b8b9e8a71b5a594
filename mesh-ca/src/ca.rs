//! The certificate authority that mints workload leaves (and control-plane serving
//! certificates), from Istio's plug-in CA files or a generated root.

use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PublicKeyData, SanType, SerialNumber,
};
use rustls::pki_types::{CertificateDer, PrivatePkcs8KeyDer, UnixTime};
use shared_types::identity::Identity;

use crate::certificates::{verify_chain, IssuedChain, ServingCertificate, WorkloadCertificate};
use crate::pem::pem_encode;
use crate::validity::{display_time, validity};
use crate::CaError;

const ROOT_LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// Leaves start a minute in the past so peers with slightly late clocks accept them.
const CLOCK_SKEW: Duration = Duration::from_secs(60);
/// Signs workload leaves with a CA key; the chain and roots ride along in every leaf.
#[derive(Debug)]
pub struct CertificateAuthority {
    pub(crate) issuer: Issuer<'static, KeyPair>,
    pub(crate) ca_cert: CertificateDer<'static>,
    /// cert-chain.pem: from the signing cert up to (possibly including) the root.
    pub(crate) chain: Vec<CertificateDer<'static>>,
    pub(crate) roots: Vec<CertificateDer<'static>>,
    pub(crate) not_after: SystemTime,
}

impl CertificateAuthority {
    /// A fresh self-signed ECDSA P-256 root, valid ten years, with O=<trust domain>.
    /// Quick to make: tests and throw-away meshes use it.
    pub fn generate_self_signed(trust_domain: &str) -> Result<Self, CaError> {
        Self::generate_root(trust_domain, RootKey::EcdsaP256)
    }

    /// A fresh self-signed root of the given key kind, valid ten years, O=<trust domain>.
    pub fn generate_root(trust_domain: &str, kind: RootKey) -> Result<Self, CaError> {
        let sign_err = |source| CaError::Sign {
            what: "the self-signed root".into(),
            source,
        };
        let key = match kind {
            RootKey::EcdsaP256 => {
                KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(sign_err)?
            }
            RootKey::Rsa2048 => rsa_2048_key().map_err(sign_err)?,
        };
        let now = SystemTime::now();
        let mut params = CertificateParams::default();
        let mut name = DistinguishedName::new();
        name.push(DnType::OrganizationName, trust_domain);
        params.distinguished_name = name;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let (not_before, not_after) = validity(now - CLOCK_SKEW, now + ROOT_LIFETIME)?;
        params.not_before = not_before.into();
        params.not_after = not_after.into();
        params.serial_number = Some(random_serial().0);
        let cert = params.self_signed(&key).map_err(sign_err)?;
        let ca_cert = cert.der().clone();
        Ok(CertificateAuthority {
            issuer: Issuer::new(params, key),
            chain: vec![ca_cert.clone()],
            roots: vec![ca_cert.clone()],
            ca_cert,
            not_after,
        })
    }

    /// The trust roots (root-cert.pem) as DER.
    pub fn roots(&self) -> Vec<CertificateDer<'static>> {
        self.roots.clone()
    }

    /// The roots as one PEM bundle (what `istio-ca-root-cert` publishes).
    pub fn roots_pem(&self) -> String {
        self.roots
            .iter()
            .map(|c| pem_encode("CERTIFICATE", c))
            .collect()
    }

    /// When the signing certificate expires; nothing is issued past it.
    pub fn not_after(&self) -> SystemTime {
        self.not_after
    }

    /// A leaf valid from a minute ago for `lifetime`, capped at the CA's own expiry.
    pub fn issue(&self, id: &Identity, lifetime: Duration) -> Result<WorkloadCertificate, CaError> {
        self.issue_at(id, lifetime, SystemTime::now())
    }

    /// [`issue`](Self::issue) as if the time were `now` (for callers with their own clock).
    pub fn issue_at(
        &self,
        id: &Identity,
        lifetime: Duration,
        now: SystemTime,
    ) -> Result<WorkloadCertificate, CaError> {
        let (not_before, not_after) = self.leaf_validity(now, lifetime)?;
        self.issue_with_validity(id, not_before, not_after)
    }

    /// Same with explicit validity (tests mint expired leaves with it). Times are
    /// truncated to whole seconds, as X.509 stores them.
    pub fn issue_with_validity(
        &self,
        id: &Identity,
        not_before: SystemTime,
        not_after: SystemTime,
    ) -> Result<WorkloadCertificate, CaError> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(|source| {
            CaError::Sign {
                what: format!("a key for {id}"),
                source,
            }
        })?;
        let (chain, serial, not_before, not_after) =
            self.sign_leaf(&key, workload_san(id)?, not_before, not_after)?;
        Ok(WorkloadCertificate {
            identity: id.clone(),
            chain,
            roots: self.roots.clone(),
            not_before,
            not_after,
            serial,
            key: PrivatePkcs8KeyDer::from(key.serialize_der()),
        })
    }

    /// Signs a leaf for `id` over a public key someone else holds (a verified CSR's).
    /// Returns the chain, leaf first, and the roots after it: Istio's answer to a
    /// certificate request.
    pub fn issue_for_key(
        &self,
        public_key: &impl PublicKeyData,
        id: &Identity,
        lifetime: Duration,
    ) -> Result<IssuedChain, CaError> {
        let (not_before, not_after) = self.leaf_validity(SystemTime::now(), lifetime)?;
        let (chain, serial, _, not_after) =
            self.sign_leaf(public_key, workload_san(id)?, not_before, not_after)?;
        Ok(IssuedChain {
            chain,
            roots: self.roots.clone(),
            serial,
            not_after,
        })
    }

    /// A serving certificate for a control-plane endpoint: DNS names (or IPs)
    /// only, signed by the mesh CA so clients that trust the mesh root trust it.
    pub fn issue_serving(
        &self,
        names: &[String],
        lifetime: Duration,
    ) -> Result<ServingCertificate, CaError> {
        let sans = names
            .iter()
            .map(|name| match name.parse::<std::net::IpAddr>() {
                Ok(ip) => Ok(SanType::IpAddress(ip)),
                Err(_) => name
                    .clone()
                    .try_into()
                    .map(SanType::DnsName)
                    .map_err(|source| CaError::Sign {
                        what: format!("a serving certificate for {name:?}"),
                        source,
                    }),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let sign_err = |source| CaError::Sign {
            what: "a serving key".into(),
            source,
        };
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(sign_err)?;
        let (not_before, not_after) = self.leaf_validity(SystemTime::now(), lifetime)?;
        let (chain, _, _, not_after) = self.sign_leaf(&key, sans, not_before, not_after)?;
        Ok(ServingCertificate {
            chain,
            key: PrivatePkcs8KeyDer::from(key.serialize_der()),
            not_after,
        })
    }

    /// A leaf's validity from `now`: a minute back for late clocks, `lifetime`
    /// ahead, never past the CA's own expiry.
    fn leaf_validity(
        &self,
        now: SystemTime,
        lifetime: Duration,
    ) -> Result<(SystemTime, SystemTime), CaError> {
        if now >= self.not_after {
            return Err(CaError::Expired {
                not_after: display_time(self.not_after),
            });
        }
        let not_after = now
            .checked_add(lifetime)
            .ok_or(CaError::Validity("lifetime too long"))?
            .min(self.not_after);
        Ok((now.checked_sub(CLOCK_SKEW).unwrap_or(now), not_after))
    }

    /// The one place leaves are signed: the given SANs, empty subject, server and
    /// client auth. Returns (chain leaf first, hex serial, validity).
    fn sign_leaf(
        &self,
        public_key: &impl PublicKeyData,
        sans: Vec<SanType>,
        not_before: SystemTime,
        not_after: SystemTime,
    ) -> Result<(Vec<CertificateDer<'static>>, String, SystemTime, SystemTime), CaError> {
        let (not_before, not_after) = validity(not_before, not_after)?;
        let sign_err = |source| CaError::Sign {
            what: format!("a leaf for {sans:?}"),
            source,
        };
        let mut params = CertificateParams::default();
        // Empty subject: the identity lives only in the SAN (marked critical by rcgen).
        params.distinguished_name = DistinguishedName::new();
        params.subject_alt_names = sans.clone();
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.not_before = not_before.into();
        params.not_after = not_after.into();
        let (serial_number, serial) = random_serial();
        params.serial_number = Some(serial_number);
        params.use_authority_key_identifier_extension = true;
        let leaf = params
            .signed_by(public_key, &self.issuer)
            .map_err(sign_err)?;

        let mut chain = Vec::with_capacity(1 + self.chain.len());
        chain.push(leaf.der().clone());
        chain.extend(self.chain.iter().cloned());
        Ok((chain, serial, not_before, not_after))
    }

    /// Issues a throw-away leaf and verifies it the way peers will.
    pub(crate) fn self_check(&self) -> Result<(), String> {
        let probe = Identity::new("ca-self-check.invalid", "default", "default");
        let leaf = self
            .issue(&probe, Duration::from_secs(3600))
            .map_err(|e| e.to_string())?;
        verify_chain(&leaf.chain, &self.roots, UnixTime::now())
    }
}

/// The URI SAN of a workload leaf; never mint what peers would refuse to parse.
/// (A field containing '/' changes the segment count, so parsing also catches it.)
fn workload_san(id: &Identity) -> Result<Vec<SanType>, CaError> {
    let uri = id.to_uri();
    if let Err(source) = uri.parse::<Identity>() {
        return Err(CaError::Identity { id: uri, source });
    }
    let san = uri.clone().try_into().map_err(|source| CaError::Sign {
        what: format!("a leaf for {uri}"),
        source,
    })?;
    Ok(vec![SanType::URI(san)])
}

/// The key of a generated root.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RootKey {
    /// What Istio's self-signed CA makes; `istioctl-lite ca init` does the same.
    Rsa2048,
    /// ECDSA on P-256: quick to generate, for tests and throw-away meshes.
    EcdsaP256,
}

/// ring verifies RSA but cannot generate it; the `rsa` crate makes the key.
fn rsa_2048_key() -> Result<KeyPair, rcgen::Error> {
    use rsa::pkcs8::EncodePrivateKey;
    let key = rsa::RsaPrivateKey::new(&mut rsa::rand_core::OsRng, 2048)
        .map_err(|_| rcgen::Error::KeyGenerationUnavailable)?;
    let der = key
        .to_pkcs8_der()
        .map_err(|_| rcgen::Error::KeyGenerationUnavailable)?;
    let der = PrivatePkcs8KeyDer::from(der.as_bytes().to_vec());
    KeyPair::from_pkcs8_der_and_sign_algo(&der, &rcgen::PKCS_RSA_SHA256)
}

/// 128 random bits, positive and without a leading zero byte so the hex form is
/// exactly what the certificate carries.
fn random_serial() -> (SerialNumber, String) {
    let mut bytes: [u8; 16] = rand::random();
    bytes[0] = (bytes[0] & 0x7f).max(1);
    let hex = bytes.iter().map(|b| format!("{b:02x}")).collect();
    (SerialNumber::from_slice(&bytes), hex)
}

#[cfg(test)]
#[path = "ca_tests.rs"]
mod tests;
