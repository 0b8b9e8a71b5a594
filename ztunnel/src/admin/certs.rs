//! `certificates`: each identity's leaf as Istio dumps it: `state`, and every
//! certificate of the chain and roots as `{pem, serialNumber, validFrom,
//! expirationTime}` (the PEM text base64-encoded, the serial in decimal).

use base64::Engine as _;
use serde_json::{json, Value};
use time::format_description::well_known::Rfc3339;

use crate::identity::manager::CertState;
use crate::identity::Identity;

/// The `certificates` section of `states` ([`crate::identity::SecretManager::states`]),
/// sorted by identity.
pub fn certificates(mut states: Vec<(Identity, CertState)>) -> Value {
    states.sort_by_key(|(id, _)| id.to_uri());
    states
        .into_iter()
        .map(|(id, state)| {
            let (state, chain, roots) = match state {
                CertState::Available(cert) => (
                    "Available".to_owned(),
                    cert.chain.iter().map(|d| cert_json(d)).collect(),
                    cert.roots.iter().map(|d| cert_json(d)).collect(),
                ),
                CertState::Initializing => ("Initializing".to_owned(), vec![], vec![]),
                CertState::Unavailable(e) => (format!("Unavailable: {e}"), vec![], vec![]),
            };
            json!({
                "identity": id.to_uri(),
                "state": state,
                "certChain": chain,
                "rootCerts": roots,
            })
        })
        .collect()
}

/// One certificate; fields that cannot be read from it are left empty.
pub fn cert_json(der: &[u8]) -> Value {
    let pem = mesh_ca::pem_encode("CERTIFICATE", der);
    let (serial, from, to) = match x509_parser::parse_x509_certificate(der) {
        Ok((_, x509)) => {
            let time = |t: x509_parser::time::ASN1Time| {
                t.to_datetime().format(&Rfc3339).unwrap_or_default()
            };
            (
                x509.tbs_certificate.serial.to_str_radix(10),
                time(x509.validity().not_before),
                time(x509.validity().not_after),
            )
        }
        Err(_) => Default::default(),
    };
    json!({
        "pem": base64::engine::general_purpose::STANDARD.encode(pem),
        "serialNumber": serial,
        "validFrom": from,
        "expirationTime": to,
    })
}
