//! PEM text (RFC 7468), as every consumer of the mesh's certificates reads it.

/// One PEM block with `label` (e.g. `CERTIFICATE`), LF line endings, 64 columns.
pub fn pem_encode(label: &str, der: &[u8]) -> String {
    let config = pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF);
    pem::encode_config(&pem::Pem::new(label, der.to_vec()), config)
}
