//! `IstioCertificateRequest`, the body of every `CreateCertificate` call to the CA
//! (protobuf via prost; `metadata` is a `google.protobuf.Struct`, nested as deep as a
//! caller likes). Any bytes decode or are refused, never a panic or a stack overflow; a
//! decoded request re-encodes to bytes that decode to the same request (compared by
//! their encoding: a NaN number in `metadata` is not equal to itself), with the same
//! impersonated identity.

#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use shared_types::istio::ca::{IstioCertificateRequest, IMPERSONATED_IDENTITY, MAX_REQUEST_BYTES};

fuzz_target!(|data: &[u8]| {
    // tonic refuses larger messages before decoding.
    if data.len() > MAX_REQUEST_BYTES {
        return;
    }
    let Ok(request) = IstioCertificateRequest::decode(data) else {
        return;
    };
    let identity = request.impersonated_identity();
    if let Some(id) = identity {
        let field = &request.metadata.as_ref().unwrap().fields[IMPERSONATED_IDENTITY];
        assert_eq!(
            field.kind,
            Some(prost_types::value::Kind::StringValue(id.to_owned()))
        );
    }

    let bytes = request.encode_to_vec();
    assert_eq!(bytes.len(), request.encoded_len());
    let again = IstioCertificateRequest::decode(bytes.as_slice()).expect("our encoding decodes");
    assert_eq!(again.encode_to_vec(), bytes, "encoding is not stable");
    assert_eq!(again.impersonated_identity(), identity);
    assert_eq!(
        (&again.csr, again.validity_duration),
        (&request.csr, request.validity_duration)
    );
});
