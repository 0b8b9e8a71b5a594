//! Istio's plug-in CA files (the `cacerts` Secret): read, checked and written, so a
//! mesh keeps its trust chain when it moves between Istio and us. Loading validates
//! everything up front (files, key match, and that an issued leaf verifies against the
//! roots) so a broken secret fails at start-up with the file named, not later as
//! handshake errors.

use std::fs;
use std::path::Path;

use rcgen::{Issuer, KeyPair, SignatureAlgorithm};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use x509_parser::certificate::X509Certificate;
use x509_parser::oid_registry::{
    OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY, OID_NIST_EC_P384, OID_PKCS1_RSAENCRYPTION,
};

use crate::error::invalid;
use crate::pem::pem_encode;
use crate::validity::to_system_time;
use crate::{CaError, CertificateAuthority};

/// The CA's signing certificate.
pub const CA_CERT_FILE: &str = "ca-cert.pem";
/// The CA's private key (written 0600).
pub const CA_KEY_FILE: &str = "ca-key.pem";
/// The trust roots peers verify against.
pub const ROOT_CERT_FILE: &str = "root-cert.pem";
/// The chain from the signing certificate up to (possibly including) the root.
pub const CERT_CHAIN_FILE: &str = "cert-chain.pem";

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
            let path = dir.join(name);
            // The key is never readable by others, not even for a moment.
            mesh_runtime::fs::write_atomic_with_mode(&path, contents.as_bytes(), mode)
                .map_err(|source| CaError::Write { path, source })?;
        }
        Ok(())
    }
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
