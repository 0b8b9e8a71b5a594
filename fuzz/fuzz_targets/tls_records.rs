//! HBONE's TLS 1.3 record layer (`ztunnel::tls::record`), on what a peer sends once
//! the handshake is over: record headers, records that do not decrypt, and, sealed
//! under the right key so that they decrypt, any inner content (its type byte and
//! padding included), handshake messages and alerts. Each is refused with an error or
//! taken; none panics, and sealed bytes open to the same bytes.
//!
//! Input: byte 0 picks the inner content type the rest is sealed as; the rest is
//! also tried as a raw record and as a post-handshake message and an alert body.

#![no_main]

use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use libfuzzer_sys::fuzz_target;
use rustls::crypto::cipher::{AeadKey, Iv};
use rustls::ConnectionTrafficSecrets;
use ztunnel::tls::record::{self, ContentType, RecordKey, MAX_PLAINTEXT};

/// `inner` sealed as the first record under [`key`], by aws-lc-rs directly: a peer
/// that picks its own content type byte and padding.
fn seal_raw(inner: &[u8]) -> Vec<u8> {
    let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &[7; 32]).expect("a key"));
    let len = (inner.len() + 16) as u16;
    let header = [23, 3, 3, (len >> 8) as u8, len as u8];
    let mut body = inner.to_vec();
    let tag = key
        .seal_in_place_separate_tag(
            Nonce::assume_unique_for_key([9; 12]),
            Aad::from(header),
            &mut body,
        )
        .expect("sealed");
    [&header[..], &body, tag.as_ref()].concat()
}

fn key() -> RecordKey {
    let secrets = ConnectionTrafficSecrets::Aes256Gcm {
        key: AeadKey::from([7; 32]),
        iv: Iv::new([9; 12]),
    };
    RecordKey::new(&secrets, 0).expect("an AES-256-GCM key")
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let _ = record::post_handshake_message(rest);
    let _ = record::alert(rest);

    // As a raw record: a header refused, or a tag that does not verify.
    if let Ok(Some(len)) = record::record_len(rest) {
        if len <= rest.len() {
            let mut raw = rest[..len].to_vec();
            let _ = key().open(&mut raw);
        }
    }

    // Sealed as the selector says, then opened: the same content and type back.
    let content = match selector % 3 {
        0 => ContentType::ApplicationData,
        1 => ContentType::Handshake,
        _ => ContentType::Alert,
    };
    let plain = &rest[..rest.len().min(MAX_PLAINTEXT)];
    let mut wire = Vec::new();
    key().seal(content, &[plain], &mut wire);
    assert_eq!(record::record_len(&wire), Ok(Some(wire.len())));
    let (opened, len) = key().open(&mut wire).expect("a sealed record opens");
    assert_eq!((opened, &wire[5..5 + len]), (content, plain));

    // The inner plaintext as the peer chose it (content, type byte, padding), sealed
    // as a record of its own: opened to a type and a length, or refused.
    if selector >= 128 && rest.len() <= MAX_PLAINTEXT + 256 - 16 {
        let _ = key().open(&mut seal_raw(rest));
    }
});
