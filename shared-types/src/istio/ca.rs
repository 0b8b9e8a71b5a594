//! `istio.v1.auth.IstioCertificateService`'s messages: what ztunnels send the mesh CA
//! for a leaf, and its answer. The service itself is [`super::ca_service`].

use prost::Message;

/// Fully qualified gRPC name of Istio's certificate service.
pub const SERVICE: &str = "istio.v1.auth.IstioCertificateService";
/// gRPC method path of `CreateCertificate`.
pub const CREATE_CERTIFICATE: &str = "/istio.v1.auth.IstioCertificateService/CreateCertificate";
/// The `metadata` field a node proxy sets to ask for one of its pods' identities.
pub const IMPERSONATED_IDENTITY: &str = "ImpersonatedIdentity";
/// A CSR plus metadata is a few KiB; more is refused before it is decoded.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;

/// A request for a signed workload certificate: a CSR for the caller's identity, or for
/// the one it impersonates.
#[derive(Clone, PartialEq, Message)]
pub struct IstioCertificateRequest {
    /// PEM-encoded PKCS#10 request.
    #[prost(string, tag = "1")]
    pub csr: String,
    /// Requested lifetime in seconds; ≤ 0 means the CA's default.
    #[prost(int64, tag = "3")]
    pub validity_duration: i64,
    /// Extra request data as a protobuf `Struct`; node proxies set
    /// [`IMPERSONATED_IDENTITY`] in it.
    #[prost(message, optional, tag = "4")]
    pub metadata: Option<prost_types::Struct>,
}

/// The CA's answer to an [`IstioCertificateRequest`]: the signed chain.
#[derive(Clone, PartialEq, Message)]
pub struct IstioCertificateResponse {
    /// Leaf first, root last; one PEM certificate per element.
    #[prost(string, repeated, tag = "1")]
    pub cert_chain: Vec<String>,
}

impl IstioCertificateRequest {
    /// The identity a node proxy asks to impersonate, if it set one.
    pub fn impersonated_identity(&self) -> Option<&str> {
        let value = self.metadata.as_ref()?.fields.get(IMPERSONATED_IDENTITY)?;
        match value.kind.as_ref()? {
            prost_types::value::Kind::StringValue(s) => Some(s),
            _ => None,
        }
    }

    /// Sets `metadata.fields["ImpersonatedIdentity"]`.
    pub fn with_impersonated_identity(mut self, identity: &str) -> Self {
        let value = prost_types::Value {
            kind: Some(prost_types::value::Kind::StringValue(identity.to_owned())),
        };
        self.metadata
            .get_or_insert_with(Default::default)
            .fields
            .insert(IMPERSONATED_IDENTITY.to_owned(), value);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Field numbers are Istio's: csr = 1, validity_duration = 3, metadata = 4.
    #[test]
    fn wire_bytes_use_istio_field_numbers() {
        let req = IstioCertificateRequest {
            csr: "x".into(),
            validity_duration: 60,
            metadata: None,
        }
        .with_impersonated_identity("spiffe://td/ns/a/sa/b");
        let bytes = req.encode_to_vec();
        assert_eq!(&bytes[..3], &[0x0a, 0x01, b'x']);
        assert_eq!(&bytes[3..5], &[0x18, 60]);
        assert_eq!(bytes[5], 0x22);
        let back = IstioCertificateRequest::decode(bytes.as_slice()).unwrap();
        assert_eq!(back.impersonated_identity(), Some("spiffe://td/ns/a/sa/b"));

        let resp = IstioCertificateResponse {
            cert_chain: vec!["a".into(), "b".into()],
        };
        assert_eq!(resp.encode_to_vec(), [0x0a, 1, b'a', 0x0a, 1, b'b']);
    }

    #[test]
    fn impersonation_must_be_a_string() {
        let mut req = IstioCertificateRequest::default().with_impersonated_identity("x");
        let fields = &mut req.metadata.as_mut().unwrap().fields;
        fields.get_mut(IMPERSONATED_IDENTITY).unwrap().kind =
            Some(prost_types::value::Kind::NumberValue(1.0));
        assert_eq!(req.impersonated_identity(), None);
        assert_eq!(
            IstioCertificateRequest::default().impersonated_identity(),
            None
        );
    }

    /// Property: any bytes decode to a request or an error, never a panic, and a
    /// request that decodes re-encodes to something that decodes the same.
    #[test]
    fn arbitrary_bytes_never_panic() {
        let seed = IstioCertificateRequest {
            csr: "-----BEGIN CERTIFICATE REQUEST-----".into(),
            validity_duration: 86400,
            metadata: None,
        }
        .with_impersonated_identity("spiffe://cluster.local/ns/a/sa/b")
        .encode_to_vec();
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..20_000 {
            let mut bytes = seed.clone();
            for _ in 0..(next() % 4 + 1) {
                let at = (next() as usize) % bytes.len().max(1);
                match next() % 3 {
                    0 if !bytes.is_empty() => bytes[at] = next() as u8,
                    1 => bytes.truncate(at),
                    _ => bytes.insert(at.min(bytes.len()), next() as u8),
                }
            }
            if let Ok(req) = IstioCertificateRequest::decode(bytes.as_slice()) {
                let _ = req.impersonated_identity();
                let again = IstioCertificateRequest::decode(req.encode_to_vec().as_slice());
                assert_eq!(again.as_ref(), Ok(&req));
            }
        }
    }
}
