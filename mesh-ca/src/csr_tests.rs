//! CSR building, checking and signing, including what a hostile requester sends.

use std::time::Duration;

use rsa::pkcs8::EncodePublicKey;
use x509_parser::extensions::GeneralName;

use super::*;
use crate::CertificateAuthority;

fn id(sa: &str) -> Identity {
    Identity::new("cluster.local", "default", sa)
}

fn uri_sans(der: &[u8]) -> Vec<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).unwrap();
    let san = cert.subject_alternative_name().unwrap().unwrap();
    san.value
        .general_names
        .iter()
        .filter_map(|n| match n {
            GeneralName::URI(u) => Some(u.to_string()),
            _ => None,
        })
        .collect()
}

/// A minimal DER TLV; enough to hand-build requests rcgen refuses to make.
fn tlv(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    match body.len() {
        n if n < 0x80 => out.push(n as u8),
        n if n < 0x100 => out.extend([0x81, n as u8]),
        n => out.extend([0x82, (n >> 8) as u8, n as u8]),
    }
    out.extend_from_slice(body);
    out
}

/// A PKCS#10 request around `spki` with a made-up ECDSA signature.
fn csr_with_spki(spki: &[u8]) -> Vec<u8> {
    let info = tlv(
        0x30,
        &[&[0x02, 0x01, 0x00][..], &[0x30, 0x00], spki, &[0xa0, 0x00]].concat(),
    );
    let ecdsa_sha256 = [
        0x30, 0x0a, 0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02,
    ];
    let signature = [0x03, 0x02, 0x00, 0x00];
    tlv(0x30, &[&info[..], &ecdsa_sha256, &signature].concat())
}

#[test]
fn built_csr_parses_with_its_spiffe_san() {
    let (_key, pem) = new_csr(&id("client")).unwrap();
    assert!(pem.starts_with("-----BEGIN CERTIFICATE REQUEST-----"));
    let csr = CertificateRequest::parse_pem(&pem).unwrap();
    assert_eq!(
        csr.requested_uris(),
        ["spiffe://cluster.local/ns/default/sa/client"]
    );
}

#[test]
fn the_leaf_carries_the_identity_given_not_the_one_asked_for() {
    let ca = CertificateAuthority::generate_self_signed("cluster.local").unwrap();
    let (_key, pem) = new_csr(&id("admin")).unwrap();
    let csr = CertificateRequest::parse_pem(&pem).unwrap();
    let issued = ca
        .issue_for_key(csr.public_key(), &id("client"), Duration::from_secs(3600))
        .unwrap();
    assert_eq!(
        uri_sans(&issued.chain[0]),
        ["spiffe://cluster.local/ns/default/sa/client"]
    );
    crate::verify_chain(
        &issued.chain,
        &issued.roots,
        rustls::pki_types::UnixTime::now(),
    )
    .unwrap();
    // Leaf first, root last, each a PEM ending in a newline; the root is not doubled.
    let pems = issued.to_pem_list();
    assert_eq!(pems.len(), 2);
    assert!(pems
        .iter()
        .all(|p| p.ends_with("-----END CERTIFICATE-----\n")));
}

#[test]
fn leaf_key_in_the_csr_is_the_one_certified() {
    let ca = CertificateAuthority::generate_self_signed("cluster.local").unwrap();
    let (key, pem) = new_csr(&id("a")).unwrap();
    let csr = CertificateRequest::parse_pem(&pem).unwrap();
    let issued = ca
        .issue_for_key(csr.public_key(), &id("a"), Duration::from_secs(60))
        .unwrap();
    let pair = KeyPair::try_from(&key).unwrap();
    let (_, cert) = x509_parser::parse_x509_certificate(&issued.chain[0]).unwrap();
    assert_eq!(
        cert.public_key().subject_public_key.data.as_ref(),
        pair.public_key_raw()
    );
}

#[test]
fn refuses_garbage_oversize_and_tampering() {
    let err = |pem: &str| CertificateRequest::parse_pem(pem).unwrap_err();
    assert!(matches!(err("hello"), CsrError::Pem(_)));
    assert!(matches!(
        err(&"A".repeat(MAX_CSR_PEM_BYTES + 1)),
        CsrError::TooLarge { .. }
    ));
    let garbage = "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n";
    assert!(matches!(err(garbage), CsrError::Malformed(_)));

    // Flip a byte of the SAN: the signature no longer matches.
    let (_key, pem) = new_csr(&id("client")).unwrap();
    let mut der = CertificateSigningRequestDer::from_pem_slice(pem.as_bytes())
        .unwrap()
        .as_ref()
        .to_vec();
    let at = der
        .windows(6)
        .position(|w| w == b"client")
        .expect("the SAN is in the request");
    der[at] = b'C';
    assert_eq!(
        CertificateRequest::parse_der(&der).unwrap_err(),
        CsrError::BadSignature
    );
}

#[test]
fn refuses_weak_and_odd_keys_with_a_clear_reason() {
    let rsa512 = rsa::RsaPrivateKey::new(&mut rsa::rand_core::OsRng, 512).unwrap();
    let spki = rsa512.to_public_key().to_public_key_der().unwrap();
    let err = CertificateRequest::parse_der(&csr_with_spki(spki.as_bytes())).unwrap_err();
    assert!(err.to_string().contains("RSA-512"), "{err}");

    // Ed25519 is a fine key, but not one the mesh issues for.
    let ed = KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    let pem = params.serialize_request(&ed).unwrap().pem().unwrap();
    let err = CertificateRequest::parse_pem(&pem).unwrap_err();
    assert!(matches!(err, CsrError::Key(_)), "{err}");
}

/// Property: whatever a requester sends, parsing answers (Ok or Err) and never panics.
#[test]
fn mutated_requests_never_panic() {
    use rand::Rng;
    let (_key, pem) = new_csr(&id("client")).unwrap();
    let der = CertificateSigningRequestDer::from_pem_slice(pem.as_bytes())
        .unwrap()
        .as_ref()
        .to_vec();
    let mut rng = rand::rng();
    let mut accepted = 0;
    for _ in 0..3000 {
        let mut bytes = der.clone();
        for _ in 0..rng.random_range(1..4) {
            let i = rng.random_range(0..bytes.len());
            match rng.random_range(0..3) {
                0 => bytes[i] = rng.random(),
                1 => bytes.truncate(i),
                _ => bytes.insert(i, rng.random()),
            }
            if bytes.is_empty() {
                break;
            }
        }
        if CertificateRequest::parse_der(&bytes).is_ok() {
            accepted += 1;
        }
    }
    // A mutation that survives must still carry a valid signature: almost none do.
    assert!(accepted < 30, "{accepted} mutated requests were accepted");
}

/// What a CA client checks before it uses an answer.
#[test]
fn an_answer_is_used_only_for_the_identity_and_key_asked_for() {
    let ca = CertificateAuthority::generate_self_signed("cluster.local").unwrap();
    let (key, pem) = new_csr(&id("client")).unwrap();
    let csr = CertificateRequest::parse_pem(&pem).unwrap();
    let ttl = Duration::from_secs(600);

    let right = ca
        .issue_for_key(csr.public_key(), &id("client"), ttl)
        .unwrap();
    let cert = crate::WorkloadCertificate::from_issued(
        &id("client"),
        right.chain.clone(),
        right.roots.clone(),
        key.clone_key(),
    )
    .unwrap();
    assert_eq!(cert.serial, right.serial);

    // Another identity than the one asked for.
    let wrong_id = ca
        .issue_for_key(csr.public_key(), &id("admin"), ttl)
        .unwrap();
    let err = crate::WorkloadCertificate::from_issued(
        &id("client"),
        wrong_id.chain,
        wrong_id.roots,
        key.clone_key(),
    )
    .unwrap_err();
    assert!(err.contains("not the identity asked for"), "{err}");

    // Another key than the one sent.
    let (_other_key, other_pem) = new_csr(&id("client")).unwrap();
    let other = CertificateRequest::parse_pem(&other_pem).unwrap();
    let wrong_key = ca
        .issue_for_key(other.public_key(), &id("client"), ttl)
        .unwrap();
    let err = crate::WorkloadCertificate::from_issued(
        &id("client"),
        wrong_key.chain,
        wrong_key.roots,
        key.clone_key(),
    )
    .unwrap_err();
    assert!(err.contains("does not certify"), "{err}");

    // A chain that does not reach the root it came with.
    let stranger = CertificateAuthority::generate_self_signed("cluster.local").unwrap();
    let err =
        crate::WorkloadCertificate::from_issued(&id("client"), right.chain, stranger.roots(), key)
            .unwrap_err();
    assert!(err.contains("does not verify"), "{err}");
}
