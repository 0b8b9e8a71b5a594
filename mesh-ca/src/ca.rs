//! The certificate authority that mints workload leaves.
//!
//! It reads Istio's plug-in CA layout (the `cacerts` secret), so a mesh keeps its
//! trust chain when it moves between Istio and us, or generates a self-signed root
//! for development and tests. Loading validates everything up front (files, key
//! match, and that an issued leaf verifies against the roots) so a broken secret
//! fails at start-up with the file named, not later as handshake errors.

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PublicKeyData, SanType, SerialNumber, SignatureAlgorithm,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::RootCertStore;
use x509_parser::certificate::X509Certificate;
use x509_parser::oid_registry::{
    OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY, OID_NIST_EC_P384, OID_PKCS1_RSAENCRYPTION,
};

use crate::identity::{Identity, IdentityError};

pub const CA_CERT_FILE: &str = "ca-cert.pem";
pub const CA_KEY_FILE: &str = "ca-key.pem";
pub const ROOT_CERT_FILE: &str = "root-cert.pem";
pub const CERT_CHAIN_FILE: &str = "cert-chain.pem";

const ROOT_LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// Leaves start a minute in the past so peers with slightly late clocks accept them.
const CLOCK_SKEW: Duration = Duration::from_secs(60);
/// 9999-12-31T23:59:59Z, the last instant an X.509 time can express.
const MAX_CERT_SECS: u64 = 253_402_300_799;

/// Why the CA could not be loaded, written or used.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error("the private key in {key} does not belong to the certificate in {cert}")]
    KeyMismatch { key: PathBuf, cert: PathBuf },
    #[error("{dir}: leaves issued by this CA do not verify against {ROOT_CERT_FILE}: {reason}")]
    Chain { dir: PathBuf, reason: String },
    #[error("the CA certificate expired at {not_after}")]
    Expired { not_after: String },
    #[error("invalid validity for a certificate: {0}")]
    Validity(&'static str),
    #[error("cannot issue a certificate for {id:?}: {source}")]
    Identity {
        id: String,
        #[source]
        source: IdentityError,
    },
    #[error("cannot sign {what}: {source}")]
    Sign {
        what: String,
        #[source]
        source: rcgen::Error,
    },
}

/// Signs workload leaves with a CA key; the chain and roots ride along in every leaf.
#[derive(Debug)]
pub struct CertificateAuthority {
    issuer: Issuer<'static, KeyPair>,
    ca_cert: CertificateDer<'static>,
    /// cert-chain.pem: from the signing cert up to (possibly including) the root.
    chain: Vec<CertificateDer<'static>>,
    roots: Vec<CertificateDer<'static>>,
    not_after: SystemTime,
}

impl CertificateAuthority {
    /// Loads Istio's plug-in CA layout: ca-cert.pem, ca-key.pem, root-cert.pem, cert-chain.pem.
    pub fn load(dir: &Path) -> Result<Self, CaError> {
        let cert_path = dir.join(CA_CERT_FILE);
        let key_path = dir.join(CA_KEY_FILE);
        let ca_cert = read_certs(&cert_path)?.swap_remove(0);
        let roots = read_certs(&dir.join(ROOT_CERT_FILE))?;
        let mut chain = read_certs(&dir.join(CERT_CHAIN_FILE))?;
        let key_pem = fs::read(&key_path).map_err(|source| CaError::Read {
            path: key_path.clone(),
            source,
        })?;
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
            invalid(
                &key_path,
                format!("no usable private key (unencrypted PKCS#1, SEC1 or PKCS#8 PEM): {e}"),
            )
        })?;

        let (_, x509) = x509_parser::parse_x509_certificate(&ca_cert)
            .map_err(|e| invalid(&cert_path, format!("not an X.509 certificate: {e}")))?;
        let is_ca = matches!(x509.basic_constraints(), Ok(Some(bc)) if bc.value.ca);
        if !is_ca {
            return Err(invalid(&cert_path, "not a CA certificate (needs CA:TRUE)"));
        }
        // rcgen panics on an empty RDN set; refuse such a subject before handing it over.
        if x509.subject().iter().any(|rdn| rdn.iter().next().is_none()) {
            return Err(invalid(&cert_path, "subject has an empty name component"));
        }
        let key = signing_key(key, &x509, &key_path, &cert_path)?;
        let not_after = to_system_time(x509.validity().not_after.timestamp());
        let issuer = Issuer::from_ca_cert_der(&ca_cert, key).map_err(|e| {
            invalid(
                &cert_path,
                format!("cannot issue with this certificate: {e}"),
            )
        })?;

        // Leaves must carry their issuer even if cert-chain.pem starts higher up.
        if chain.first() != Some(&ca_cert) {
            chain.insert(0, ca_cert.clone());
        }
        let ca = CertificateAuthority {
            issuer,
            ca_cert,
            chain,
            roots,
            not_after,
        };
        ca.self_check().map_err(|reason| CaError::Chain {
            dir: dir.to_path_buf(),
            reason,
        })?;
        Ok(ca)
    }

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

    /// Writes the plug-in layout; the key is 0600. Each file is replaced atomically.
    pub fn write(&self, dir: &Path) -> Result<(), CaError> {
        fs::create_dir_all(dir).map_err(|source| CaError::Write {
            path: dir.to_path_buf(),
            source,
        })?;
        let certs = |certs: &[CertificateDer<'_>]| -> String {
            certs.iter().map(|c| pem_encode("CERTIFICATE", c)).collect()
        };
        let files = [
            (
                CA_CERT_FILE,
                certs(std::slice::from_ref(&self.ca_cert)),
                0o644,
            ),
            (CA_KEY_FILE, self.issuer.key().serialize_pem(), 0o600),
            (ROOT_CERT_FILE, certs(&self.roots), 0o644),
            (CERT_CHAIN_FILE, certs(&self.chain), 0o644),
        ];
        for (name, contents, mode) in files {
            write_atomically(&dir.join(name), contents.as_bytes(), mode)?;
        }
        Ok(())
    }

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
    fn self_check(&self) -> Result<(), String> {
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

/// A control-plane serving certificate with its key.
#[derive(Debug)]
pub struct ServingCertificate {
    /// Leaf first, then the CA's chain.
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivatePkcs8KeyDer<'static>,
    pub not_after: SystemTime,
}

/// The key of a generated root.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RootKey {
    /// What Istio's self-signed CA makes; `istioctl-lite ca init` does the same.
    Rsa2048,
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

/// A leaf signed over a requester's key: what a certificate service answers.
#[derive(Debug)]
pub struct IssuedChain {
    /// Leaf first, then the CA's cert-chain.pem entries.
    pub chain: Vec<CertificateDer<'static>>,
    pub roots: Vec<CertificateDer<'static>>,
    pub serial: String,
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
    pub identity: Identity,
    /// Leaf first, then the CA's cert-chain.pem entries (intermediates up to, not
    /// necessarily including, the root).
    pub chain: Vec<CertificateDer<'static>>,
    pub roots: Vec<CertificateDer<'static>>,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
    /// Hex serial number.
    pub serial: String,
    key: PrivatePkcs8KeyDer<'static>,
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

/// All certificates of a PEM file; at least one, each parseable as X.509.
fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, CaError> {
    let pem = fs::read(path).map_err(|source| CaError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(path, format!("malformed PEM: {e}")))?;
    if certs.is_empty() {
        return Err(invalid(path, "no PEM CERTIFICATE block found"));
    }
    for (i, cert) in certs.iter().enumerate() {
        if let Err(e) = x509_parser::parse_x509_certificate(cert) {
            return Err(invalid(path, format!("certificate #{}: {e}", i + 1)));
        }
    }
    Ok(certs)
}

/// Turns the CA key into an rcgen signer for the algorithm of the CA certificate.
/// ring only reads PKCS#8, so PKCS#1 (RSA) and SEC1 (EC) keys are rewrapped first.
fn signing_key(
    key: PrivateKeyDer<'_>,
    cert: &X509Certificate<'_>,
    key_path: &Path,
    cert_path: &Path,
) -> Result<KeyPair, CaError> {
    use rsa::pkcs1::DecodeRsaPrivateKey;
    use rsa::pkcs8::der::asn1::ObjectIdentifier;
    use rsa::pkcs8::der::Encode;
    use rsa::pkcs8::EncodePrivateKey;
    const EC_PUBLIC_KEY: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.2.1");
    const P256: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.3.1.7");
    const P384: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.132.0.34");

    let spki = cert.public_key();
    let algorithm = &spki.algorithm.algorithm;
    let (alg, curve): (&'static SignatureAlgorithm, _) = if *algorithm == OID_PKCS1_RSAENCRYPTION {
        (&rcgen::PKCS_RSA_SHA256, None)
    } else if *algorithm == OID_KEY_TYPE_EC_PUBLIC_KEY {
        let params = spki.algorithm.parameters.as_ref();
        match params.and_then(|p| p.as_oid().ok()) {
            Some(c) if c == OID_EC_P256 => (&rcgen::PKCS_ECDSA_P256_SHA256, Some(P256)),
            Some(c) if c == OID_NIST_EC_P384 => (&rcgen::PKCS_ECDSA_P384_SHA384, Some(P384)),
            _ => return Err(invalid(cert_path, "unsupported curve (use P-256 or P-384)")),
        }
    } else {
        let reason = format!("unsupported key algorithm {algorithm} (use RSA or ECDSA)");
        return Err(invalid(cert_path, reason));
    };
    let mismatch = || CaError::KeyMismatch {
        key: key_path.to_path_buf(),
        cert: cert_path.to_path_buf(),
    };
    let pkcs8: Vec<u8> = match &key {
        PrivateKeyDer::Pkcs8(k) => k.secret_pkcs8_der().to_vec(),
        PrivateKeyDer::Pkcs1(k) => rsa::RsaPrivateKey::from_pkcs1_der(k.secret_pkcs1_der())
            .and_then(|k| k.to_pkcs8_der().map_err(Into::into))
            .map_err(|e| invalid(key_path, format!("invalid RSA private key: {e}")))?
            .as_bytes()
            .to_vec(),
        PrivateKeyDer::Sec1(k) => {
            let curve = curve.ok_or_else(mismatch)?;
            let algorithm = rsa::pkcs8::AlgorithmIdentifierRef {
                oid: EC_PUBLIC_KEY,
                parameters: Some((&curve).into()),
            };
            rsa::pkcs8::PrivateKeyInfo::new(algorithm, k.secret_sec1_der())
                .to_der()
                .map_err(|e| invalid(key_path, format!("invalid EC private key: {e}")))?
        }
        _ => return Err(invalid(key_path, "unsupported private key format")),
    };
    let pkcs8 = PrivatePkcs8KeyDer::from(pkcs8);
    let pair = match KeyPair::from_pkcs8_der_and_sign_algo(&pkcs8, alg) {
        Ok(pair) => pair,
        // A key ring can read under another algorithm is simply the wrong key.
        Err(_) if KeyPair::try_from(&pkcs8).is_ok() => return Err(mismatch()),
        Err(e) => return Err(invalid(key_path, format!("invalid private key: {e}"))),
    };
    if pair.public_key_raw() != spki.subject_public_key.data.as_ref() {
        return Err(mismatch());
    }
    Ok(pair)
}

fn invalid(path: &Path, reason: impl Into<String>) -> CaError {
    CaError::Invalid {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// Truncates to whole seconds (what X.509 keeps) and checks the range is sane.
fn validity(
    not_before: SystemTime,
    not_after: SystemTime,
) -> Result<(SystemTime, SystemTime), CaError> {
    let secs = |t: SystemTime| t.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).ok();
    let (Some(from), Some(to)) = (secs(not_before), secs(not_after)) else {
        return Err(CaError::Validity("times before 1970 are not supported"));
    };
    if to > MAX_CERT_SECS {
        return Err(CaError::Validity("not_after is beyond the year 9999"));
    }
    if to <= from {
        return Err(CaError::Validity("not_after must be after not_before"));
    }
    let at = |s| UNIX_EPOCH + Duration::from_secs(s);
    Ok((at(from), at(to)))
}

fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Human-readable time for error messages (the format openssl prints).
fn display_time(t: SystemTime) -> String {
    let secs = i64::try_from(unix_secs(t)).unwrap_or(i64::MAX);
    match x509_parser::time::ASN1Time::from_timestamp(secs) {
        Ok(time) => time.to_string(),
        Err(_) => format!("{secs} s after the Unix epoch"),
    }
}

fn to_system_time(secs: i64) -> SystemTime {
    match u64::try_from(secs) {
        Ok(s) => UNIX_EPOCH + Duration::from_secs(s),
        Err(_) => UNIX_EPOCH,
    }
}

/// 128 random bits, positive and without a leading zero byte so the hex form is
/// exactly what the certificate carries.
fn random_serial() -> (SerialNumber, String) {
    let mut bytes: [u8; 16] = rand::random();
    bytes[0] = (bytes[0] & 0x7f).max(1);
    let hex = bytes.iter().map(|b| format!("{b:02x}")).collect();
    (SerialNumber::from_slice(&bytes), hex)
}

/// Writes via a temporary file and rename, so readers never see half a key.
fn write_atomically(path: &Path, contents: &[u8], mode: u32) -> Result<(), CaError> {
    let err = |source| CaError::Write {
        path: path.to_path_buf(),
        source,
    };
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)
        .map_err(err)?;
    // Set before writing: the key must never be readable by others, even briefly.
    file.set_permissions(fs::Permissions::from_mode(mode))
        .map_err(err)?;
    file.write_all(contents).map_err(err)?;
    file.sync_all().map_err(err)?;
    fs::rename(&tmp, path).map_err(err)
}

/// RFC 7468 PEM with 64-column base64.
pub fn pem_encode(label: &str, der: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut b64 = Vec::with_capacity(der.len().div_ceil(3) * 4);
    for chunk in der.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            b64.push(if i <= chunk.len() {
                ALPHABET[(n >> (18 - 6 * i) & 0x3f) as usize]
            } else {
                b'='
            });
        }
    }
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in b64.chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

#[cfg(test)]
#[path = "ca_tests.rs"]
mod tests;
