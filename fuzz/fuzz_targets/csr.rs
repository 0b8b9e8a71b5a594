//! The CSR of a `CreateCertificate` call (PEM in the request's `csr` field), as the CA
//! reads it: accepted only as one well-formed PKCS#10 request with an accepted key and a
//! signature that verifies with it; the PEM and DER readers agree; and the leaf the CA
//! signs for an accepted request certifies exactly the requester's key.

#![no_main]

use std::sync::OnceLock;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use mesh_ca::csr::MAX_CSR_PEM_BYTES;
use mesh_ca::{pem_encode, CertificateAuthority, CertificateRequest};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateSigningRequestDer;
use shared_types::identity::Identity;
use x509_parser::certificate::X509Certificate;
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::prelude::FromDer;

fn ca() -> &'static CertificateAuthority {
    static CA: OnceLock<CertificateAuthority> = OnceLock::new();
    CA.get_or_init(|| CertificateAuthority::generate_self_signed("cluster.local").unwrap())
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle)
}

/// Checks an accepted request against the DER it came from, and has the CA sign it.
fn accepted(der: &[u8], request: &CertificateRequest) {
    assert!(der.len() <= MAX_CSR_PEM_BYTES);
    let (rest, csr) = X509CertificationRequest::from_der(der).expect("accepted DER parses");
    assert!(rest.is_empty());
    csr.verify_signature()
        .expect("an accepted signature verifies");
    for uri in request.requested_uris() {
        assert!(
            contains(der, uri.as_bytes()),
            "{uri:?} is not in the request"
        );
    }
    let spki = &csr.certification_request_info.subject_pki;

    let id = Identity::new("cluster.local", "fuzz", "requester");
    let issued = ca()
        .issue_for_key(request.public_key(), &id, Duration::from_secs(3600))
        .expect("an accepted key can be certified");
    let (_, leaf) = X509Certificate::from_der(issued.chain[0].as_ref()).expect("the leaf parses");
    let key = &leaf.tbs_certificate.subject_pki;
    assert_eq!(key.algorithm.algorithm, spki.algorithm.algorithm);
    assert_eq!(
        key.subject_public_key.data, spki.subject_public_key.data,
        "another key"
    );
}

fuzz_target!(|data: &[u8]| {
    // `csr` is a protobuf string: valid UTF-8 when it reaches the parser.
    if let Ok(pem) = std::str::from_utf8(data) {
        if let Ok(request) = CertificateRequest::parse_pem(pem) {
            // The DER as the CA's PEM reader finds it.
            let der = CertificateSigningRequestDer::from_pem_slice(pem.as_bytes())
                .expect("an accepted PEM has a CERTIFICATE REQUEST block");
            let der = der.as_ref();
            let again = CertificateRequest::parse_der(der).expect("the PEM's DER is accepted");
            assert_eq!(again.requested_uris(), request.requested_uris());
            accepted(der, &request);
        }
    }
    if let Ok(request) = CertificateRequest::parse_der(data) {
        accepted(data, &request);
        let pem = pem_encode("CERTIFICATE REQUEST", data);
        if pem.len() <= MAX_CSR_PEM_BYTES {
            let again = CertificateRequest::parse_pem(&pem).expect("its PEM is accepted");
            assert_eq!(again.requested_uris(), request.requested_uris());
        }
    }
});
