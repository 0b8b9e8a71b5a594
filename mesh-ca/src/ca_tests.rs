//! Tests of the mesh CA: loading each key kind, minting, and the error messages.

use super::*;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::plugin_files::{CA_CERT_FILE, CA_KEY_FILE, CERT_CHAIN_FILE, ROOT_CERT_FILE};
use crate::validity::unix_secs;
use crate::CaError;
use rsa::pkcs1::EncodeRsaPrivateKey;
use rsa::pkcs8::{EncodePrivateKey, LineEnding};
use rustls::pki_types::pem::PemObject;
use x509_parser::extensions::GeneralName;
use x509_parser::oid_registry::{OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY};

const DAY: Duration = Duration::from_secs(24 * 3600);

fn id() -> Identity {
    Identity::new("cluster.local", "default", "client")
}

fn ca_params(org: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::OrganizationName, org);
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params
}

fn write_dir(dir: &Path, cert: &str, key: &str, root: &str, chain: &str) {
    let files = [
        (CA_CERT_FILE, cert),
        (CA_KEY_FILE, key),
        (ROOT_CERT_FILE, root),
        (CERT_CHAIN_FILE, chain),
    ];
    for (name, contents) in files {
        fs::write(dir.join(name), contents).unwrap();
    }
}

fn issue_and_verify(ca: &CertificateAuthority) -> WorkloadCertificate {
    let leaf = ca.issue(&id(), DAY).unwrap();
    verify_chain(&leaf.chain, &ca.roots(), UnixTime::now()).unwrap();
    leaf
}

fn load_err(dir: &Path) -> String {
    CertificateAuthority::load(dir).unwrap_err().to_string()
}

#[test]
fn self_signed_write_load_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let ca = CertificateAuthority::generate_self_signed("cluster.local").unwrap();
    ca.write(dir.path()).unwrap();
    let key_meta = fs::metadata(dir.path().join(CA_KEY_FILE)).unwrap();
    assert_eq!(key_meta.permissions().mode() & 0o777, 0o600);
    let chain = fs::read_to_string(dir.path().join(CERT_CHAIN_FILE)).unwrap();
    assert_eq!(chain, pem_encode("CERTIFICATE", &ca.roots()[0]));

    let loaded = CertificateAuthority::load(dir.path()).unwrap();
    assert_eq!(loaded.roots(), ca.roots());
    let leaf = issue_and_verify(&loaded);
    verify_chain(&leaf.chain, &ca.roots(), UnixTime::now()).unwrap();

    let roots = ca.roots();
    let (_, root) = x509_parser::parse_x509_certificate(&roots[0]).unwrap();
    assert!(root.basic_constraints().unwrap().unwrap().value.ca);
    assert!(root.key_usage().unwrap().unwrap().value.key_cert_sign());
    assert_eq!(root.subject().to_string(), "O=cluster.local");
    let years = root.validity().time_to_expiration().unwrap().whole_days() / 365;
    assert_eq!(years, 9, "about ten years");
}

#[test]
fn loads_rsa_pkcs1_ca() {
    let dir = tempfile::tempdir().unwrap();
    let rsa_key = rsa::RsaPrivateKey::new(&mut rsa::rand_core::OsRng, 2048).unwrap();
    let pkcs8 = rsa_key.to_pkcs8_der().unwrap().as_bytes().to_vec();
    let key =
        KeyPair::from_pkcs8_der_and_sign_algo(&pkcs8.into(), &rcgen::PKCS_RSA_SHA256).unwrap();
    let cert = ca_params("cluster.local").self_signed(&key).unwrap().pem();
    let key_pem = rsa_key.to_pkcs1_pem(LineEnding::LF).unwrap();
    assert!(key_pem.starts_with("-----BEGIN RSA PRIVATE KEY-----"));
    write_dir(dir.path(), &cert, &key_pem, &cert, &cert);

    let ca = CertificateAuthority::load(dir.path()).unwrap();
    let leaf = issue_and_verify(&ca);
    assert_eq!(leaf.chain.len(), 2);
}

#[test]
fn loads_ecdsa_p256_sec1_ca() {
    let dir = tempfile::tempdir().unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = ca_params("cluster.local").self_signed(&key).unwrap().pem();
    let info = rsa::pkcs8::PrivateKeyInfo::try_from(key.serialized_der()).unwrap();
    let sec1 = pem_encode("EC PRIVATE KEY", info.private_key);
    write_dir(dir.path(), &cert, &sec1, &cert, &cert);
    issue_and_verify(&CertificateAuthority::load(dir.path()).unwrap());
}

#[test]
fn loads_p384_intermediate_under_a_root() {
    let dir = tempfile::tempdir().unwrap();
    let root_params = ca_params("root");
    let root_key = KeyPair::generate().unwrap();
    let root = root_params.self_signed(&root_key).unwrap();
    let root_issuer = Issuer::new(root_params, root_key);
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap();
    let int = ca_params("intermediate")
        .signed_by(&key, &root_issuer)
        .unwrap();
    let chain = format!("{}{}", int.pem(), root.pem());
    write_dir(
        dir.path(),
        &int.pem(),
        &key.serialize_pem(),
        &root.pem(),
        &chain,
    );
    let leaf = issue_and_verify(&CertificateAuthority::load(dir.path()).unwrap());
    assert_eq!(leaf.chain.len(), 3);
    assert_eq!(&leaf.chain[1], int.der());

    // A chain file that starts above the signing cert still ships the issuer.
    write_dir(
        dir.path(),
        &int.pem(),
        &key.serialize_pem(),
        &root.pem(),
        &root.pem(),
    );
    let leaf = issue_and_verify(&CertificateAuthority::load(dir.path()).unwrap());
    assert_eq!(&leaf.chain[1], int.der());
}

#[test]
fn load_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = |name| dir.path().join(name);
    let ca = CertificateAuthority::generate_self_signed("cluster.local").unwrap();
    let other = CertificateAuthority::generate_self_signed("cluster.local").unwrap();

    ca.write(dir.path()).unwrap();
    fs::remove_file(path(ROOT_CERT_FILE)).unwrap();
    let err = load_err(dir.path());
    assert!(
        err.contains("cannot read") && err.contains(ROOT_CERT_FILE),
        "{err}"
    );

    ca.write(dir.path()).unwrap();
    fs::write(path(CA_CERT_FILE), "garbage").unwrap();
    let err = load_err(dir.path());
    assert!(
        err.contains(CA_CERT_FILE) && err.contains("no PEM"),
        "{err}"
    );

    let bad_block = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
    fs::write(path(CERT_CHAIN_FILE), bad_block).unwrap();
    let err = load_err(dir.path());
    assert!(err.contains(CA_CERT_FILE), "{err}");

    ca.write(dir.path()).unwrap();
    fs::write(path(CA_KEY_FILE), "-----BEGIN PRIVATE KEY-----\n!!\n").unwrap();
    let err = load_err(dir.path());
    assert!(
        err.contains(CA_KEY_FILE) && err.contains("private key"),
        "{err}"
    );

    ca.write(dir.path()).unwrap();
    fs::write(path(CA_KEY_FILE), other.issuer.key().serialize_pem()).unwrap();
    let err = CertificateAuthority::load(dir.path()).unwrap_err();
    assert!(matches!(err, CaError::KeyMismatch { .. }), "{err}");
    let err = err.to_string();
    assert!(
        err.contains(CA_KEY_FILE) && err.contains(CA_CERT_FILE),
        "{err}"
    );

    ca.write(dir.path()).unwrap();
    let leaf = ca.issue(&id(), DAY).unwrap();
    fs::write(path(CA_CERT_FILE), leaf.leaf_pem()).unwrap();
    let err = load_err(dir.path());
    assert!(
        err.contains(CA_CERT_FILE) && err.contains("not a CA"),
        "{err}"
    );

    ca.write(dir.path()).unwrap();
    let foreign_root = pem_encode("CERTIFICATE", &other.roots()[0]);
    fs::write(path(ROOT_CERT_FILE), foreign_root).unwrap();
    let err = CertificateAuthority::load(dir.path()).unwrap_err();
    assert!(matches!(err, CaError::Chain { .. }), "{err}");
}

#[test]
fn leaf_has_the_istio_shape() {
    let ca = CertificateAuthority::generate_self_signed("cluster.local").unwrap();
    let leaf = ca.issue(&id(), DAY).unwrap();
    let (_, x509) = x509_parser::parse_x509_certificate(&leaf.chain[0]).unwrap();

    assert_eq!(x509.subject().iter().count(), 0, "empty subject");
    let san = x509.subject_alternative_name().unwrap().unwrap();
    assert!(san.critical, "SAN must be critical with an empty subject");
    let uri = GeneralName::URI("spiffe://cluster.local/ns/default/sa/client");
    assert_eq!(san.value.general_names, vec![uri]);
    let eku = x509.extended_key_usage().unwrap().unwrap().value;
    assert!(eku.server_auth && eku.client_auth);
    let ku = x509.key_usage().unwrap().unwrap().value;
    assert!(ku.digital_signature() && ku.key_encipherment() && !ku.key_cert_sign());
    assert!(!x509.basic_constraints().unwrap().unwrap().value.ca);
    let spki = &x509.public_key().algorithm;
    assert_eq!(spki.algorithm, OID_KEY_TYPE_EC_PUBLIC_KEY);
    let curve = spki.parameters.as_ref().unwrap().as_oid().unwrap();
    assert_eq!(curve, OID_EC_P256);

    let lifetime = leaf.not_after.duration_since(leaf.not_before).unwrap();
    assert_eq!(lifetime, DAY + CLOCK_SKEW);
    assert_eq!(
        x509.validity().not_after.timestamp() as u64,
        unix_secs(leaf.not_after)
    );
    assert_eq!(leaf.refresh_at(), leaf.not_before + (DAY + CLOCK_SKEW) / 2);
    assert_eq!(leaf.serial, x509.raw_serial_as_string().replace(':', ""));
    assert_eq!(leaf.serial.len(), 32);
    assert_eq!(leaf.chain.len(), 2);
    let pem = CertificateDer::from_pem_slice(leaf.leaf_pem().as_bytes()).unwrap();
    assert_eq!(pem, leaf.chain[0]);
    assert!(!format!("{leaf:?}").contains(&format!("{:?}", leaf.key.secret_pkcs8_der())));
}

#[test]
fn issue_rejects_bad_input() {
    let ca = CertificateAuthority::generate_self_signed("cluster.local").unwrap();
    let bad = Identity::new("cluster.local", "a/b", "c");
    assert!(matches!(ca.issue(&bad, DAY), Err(CaError::Identity { .. })));
    let now = SystemTime::now();
    let inverted = ca.issue_with_validity(&id(), now, now - CLOCK_SKEW);
    assert!(matches!(inverted, Err(CaError::Validity(_))));
    assert!(matches!(
        ca.issue(&id(), Duration::MAX),
        Err(CaError::Validity(_))
    ));
}

#[test]
fn pem_encoding_round_trips_every_padding() {
    for len in 1..200usize {
        let data: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
        let pem = pem_encode("CERTIFICATE", &data);
        assert!(pem.lines().all(|l| l.len() <= 64 || l.starts_with("-----")));
        let back = CertificateDer::from_pem_slice(pem.as_bytes()).unwrap();
        assert_eq!(back.as_ref(), &data[..]);
    }
}
