//! TLS 1.3's record protection (RFC 8446 section 5), sans I/O: sealing plaintext into
//! records appended to a buffer, and opening one record in place.
//!
//! rustls negotiates the connection and hands over its traffic secrets; this is the
//! part of the record layer rustls would otherwise run, so a record is opened where
//! it was read and sealed where it is written, with no copy in between (rustls'
//! buffered connection copies each byte two or three times on its way through).

use aws_lc_rs::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use rustls::ConnectionTrafficSecrets;

/// A record's header: type, legacy version, length.
pub const HEADER_LEN: usize = 5;
/// Every TLS 1.3 suite's AEAD tag.
pub const TAG_LEN: usize = 16;
/// Largest plaintext in one record (2^14).
pub const MAX_PLAINTEXT: usize = 16 * 1024;
/// Largest ciphertext a peer may send in one record (2^14 + 256).
pub const MAX_CIPHERTEXT: usize = MAX_PLAINTEXT + 256;
/// Largest record on the wire.
pub const MAX_RECORD: usize = HEADER_LEN + MAX_CIPHERTEXT;
/// Records sent under one key before we change it: AES-GCM's limit is 2^24.5
/// records per key (RFC 8446 section 5.5); well before it.
pub const KEY_UPDATE_AFTER: u64 = 1 << 23;

/// The content types a TLS 1.3 peer sends once the handshake is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentType {
    Alert,
    Handshake,
    ApplicationData,
}

impl ContentType {
    fn code(self) -> u8 {
        match self {
            ContentType::Alert => 21,
            ContentType::Handshake => 22,
            ContentType::ApplicationData => 23,
        }
    }
}

/// Why a peer's record, or what it carries, is refused; each ends the connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("TLS record of type {0} where only application_data (23) is allowed")]
    OuterType(u8),
    #[error("TLS record of {0} bytes (allowed: 17 to 16640)")]
    Length(usize),
    #[error("TLS record's inner plaintext of {0} bytes is over 2^14 + 1 (record_overflow)")]
    Overflow(usize),
    #[error("TLS record failed to decrypt (bad_record_mac)")]
    BadMac,
    #[error("TLS record with no content type")]
    NoContentType,
    #[error("TLS record of inner content type {0}")]
    InnerType(u8),
    #[error("TLS traffic secrets of a suite HBONE does not use")]
    UnsupportedSuite,
    #[error("peer sent TLS alert {0}")]
    Alert(u8),
    #[error("malformed TLS {0}")]
    Malformed(&'static str),
    #[error("TLS handshake message of type {0} after the handshake")]
    HandshakeType(u8),
    #[error("TLS key update: {0}")]
    KeyUpdate(String),
}

/// One direction's traffic key and its record sequence number.
pub struct RecordKey {
    key: LessSafeKey,
    iv: [u8; aead::NONCE_LEN],
    seq: u64,
}

impl RecordKey {
    /// The key of `secrets`, its next record numbered `seq`.
    pub fn new(secrets: &ConnectionTrafficSecrets, seq: u64) -> Result<Self, RecordError> {
        let (algorithm, key, iv) = match secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (&aead::AES_128_GCM, key, iv),
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (&aead::AES_256_GCM, key, iv),
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => {
                (&aead::CHACHA20_POLY1305, key, iv)
            }
            _ => return Err(RecordError::UnsupportedSuite),
        };
        let key =
            UnboundKey::new(algorithm, key.as_ref()).map_err(|_| RecordError::UnsupportedSuite)?;
        let iv = iv
            .as_ref()
            .try_into()
            .map_err(|_| RecordError::UnsupportedSuite)?;
        Ok(RecordKey {
            key: LessSafeKey::new(key),
            iv,
            seq,
        })
    }

    /// Records protected under this key so far.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The per-record nonce: the IV xor the sequence number (RFC 8446 section 5.3).
    fn next_nonce(&mut self) -> Nonce {
        let mut nonce = self.iv;
        let (_, tail) = nonce.split_at_mut(4);
        let tail: &mut [u8; 8] = tail.try_into().expect("a 12-byte nonce");
        *tail = (u64::from_be_bytes(*tail) ^ self.seq).to_be_bytes();
        self.seq += 1;
        Nonce::assume_unique_for_key(nonce)
    }

    /// Appends one record to `out` holding `pieces` (at most [`MAX_PLAINTEXT`] bytes
    /// in all) as `content`: the plaintext is copied once, into `out`, and encrypted
    /// there.
    pub fn seal(&mut self, content: ContentType, pieces: &[&[u8]], out: &mut Vec<u8>) {
        let len: usize = pieces.iter().map(|p| p.len()).sum();
        debug_assert!(len <= MAX_PLAINTEXT);
        let ciphertext_len = len + 1 + TAG_LEN;
        let start = out.len();
        out.reserve(HEADER_LEN + ciphertext_len);
        out.extend_from_slice(&[23, 3, 3]);
        out.extend_from_slice(&(ciphertext_len as u16).to_be_bytes());
        for piece in pieces {
            out.extend_from_slice(piece);
        }
        out.push(content.code());
        let (header, body) = out[start..].split_at_mut(HEADER_LEN);
        let nonce = self.next_nonce();
        let tag = self
            .key
            .seal_in_place_separate_tag(nonce, Aad::from(&*header), body)
            .expect("AES-GCM and ChaCha20 seal any record up to 2^14 bytes");
        out.extend_from_slice(tag.as_ref());
    }

    /// Opens the record `record` (its header and ciphertext, exactly) in place: its
    /// content type and the length of its plaintext, which starts at
    /// `record[HEADER_LEN]`.
    pub fn open(&mut self, record: &mut [u8]) -> Result<(ContentType, usize), RecordError> {
        let (header, body) = record.split_at_mut(HEADER_LEN);
        let nonce = self.next_nonce();
        let plaintext = self
            .key
            .open_in_place(nonce, Aad::from(&*header), body)
            .map_err(|_| RecordError::BadMac)?;
        if plaintext.len() > MAX_PLAINTEXT + 1 {
            return Err(RecordError::Overflow(plaintext.len()));
        }
        // The inner plaintext is the content, its type, then zero padding.
        let end = plaintext
            .iter()
            .rposition(|&b| b != 0)
            .ok_or(RecordError::NoContentType)?;
        let content = match plaintext[end] {
            21 => ContentType::Alert,
            22 => ContentType::Handshake,
            23 => ContentType::ApplicationData,
            other => return Err(RecordError::InnerType(other)),
        };
        Ok((content, end))
    }
}

/// Largest handshake message taken after the handshake (tickets and key updates are
/// small); a larger one is refused rather than buffered.
pub const MAX_HANDSHAKE_MESSAGE: usize = 64 * 1024;
const NEW_SESSION_TICKET: u8 = 4;
const KEY_UPDATE: u8 = 24;
const CLOSE_NOTIFY: u8 = 0;
const USER_CANCELED: u8 = 90;
/// A KeyUpdate message: update_not_requested.
pub const KEY_UPDATE_MESSAGE: [u8; 5] = [KEY_UPDATE, 0, 0, 1, 0];
/// A KeyUpdate message: update_requested.
pub const KEY_UPDATE_REQUEST: [u8; 5] = [KEY_UPDATE, 0, 0, 1, 1];
/// A warning-level close_notify alert.
pub const CLOSE_NOTIFY_ALERT: [u8; 2] = [1, CLOSE_NOTIFY];

/// The handshake messages a TLS 1.3 peer may send once the handshake is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostHandshake {
    NewSessionTicket,
    /// The peer changed its key; `requested`: it asks us to change ours.
    KeyUpdate {
        requested: bool,
    },
}

/// The first handshake message in `buf` and its length, `None` until it is whole
/// (a message may span records).
pub fn post_handshake_message(buf: &[u8]) -> Result<Option<(PostHandshake, usize)>, RecordError> {
    let [kind, a, b, c, ref body @ ..] = *buf else {
        return Ok(None);
    };
    let len = u32::from_be_bytes([0, a, b, c]) as usize;
    if len > MAX_HANDSHAKE_MESSAGE {
        return Err(RecordError::Malformed("handshake message over 64 KiB"));
    }
    let Some(body) = body.get(..len) else {
        return Ok(None);
    };
    let message = match (kind, body) {
        (NEW_SESSION_TICKET, _) => PostHandshake::NewSessionTicket,
        (KEY_UPDATE, &[request @ (0 | 1)]) => PostHandshake::KeyUpdate {
            requested: request == 1,
        },
        (KEY_UPDATE, _) => return Err(RecordError::Malformed("key update")),
        (kind, _) => return Err(RecordError::HandshakeType(kind)),
    };
    Ok(Some((message, 4 + len)))
}

/// An alert's body: `true` for close_notify (the end of the peer's data), `false`
/// for one that is ignored (user_canceled, which precedes a close_notify); any
/// other is the error it reports.
pub fn alert(body: &[u8]) -> Result<bool, RecordError> {
    match *body {
        [_, CLOSE_NOTIFY] => Ok(true),
        [_, USER_CANCELED] => Ok(false),
        [_, description] => Err(RecordError::Alert(description)),
        _ => Err(RecordError::Malformed("alert")),
    }
}

/// The length of the record at the start of `buf` if its header is there (its
/// header and ciphertext), checked against what a TLS 1.3 peer may send.
pub fn record_len(buf: &[u8]) -> Result<Option<usize>, RecordError> {
    let Some(header) = buf.get(..HEADER_LEN) else {
        return Ok(None);
    };
    // The legacy version is ignored (RFC 8446 section 5.1).
    if header[0] != 23 {
        return Err(RecordError::OuterType(header[0]));
    }
    let len = u16::from_be_bytes([header[3], header[4]]) as usize;
    if !(TAG_LEN + 1..=MAX_CIPHERTEXT).contains(&len) {
        return Err(RecordError::Length(len));
    }
    Ok(Some(HEADER_LEN + len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::crypto::cipher::{AeadKey, Iv};

    fn key(seq: u64) -> RecordKey {
        let secrets = ConnectionTrafficSecrets::Aes256Gcm {
            key: AeadKey::from([7u8; 32]),
            iv: Iv::new([9u8; 12]),
        };
        RecordKey::new(&secrets, seq).unwrap()
    }

    #[test]
    fn sealed_records_open_in_order_and_not_out_of_it() {
        let (mut tx, mut rx) = (key(5), key(5));
        let mut wire = Vec::new();
        tx.seal(
            ContentType::ApplicationData,
            &[b"hello ", b"world"],
            &mut wire,
        );
        tx.seal(ContentType::Handshake, &[&[24, 0, 0, 1, 0]], &mut wire);
        assert_eq!(tx.seq(), 7);

        let first = record_len(&wire).unwrap().unwrap();
        assert_eq!(first, HEADER_LEN + 11 + 1 + TAG_LEN);
        let (a, b) = wire.split_at_mut(first);
        assert_eq!(rx.open(a), Ok((ContentType::ApplicationData, 11)));
        assert_eq!(&a[HEADER_LEN..HEADER_LEN + 11], b"hello world");
        // Opened with the wrong sequence number: refused.
        let mut replay = b.to_vec();
        assert_eq!(key(0).open(&mut replay), Err(RecordError::BadMac));
        assert_eq!(rx.open(b), Ok((ContentType::Handshake, 5)));

        // A flipped bit anywhere, header included, fails the tag.
        let mut wire = Vec::new();
        key(0).seal(ContentType::ApplicationData, &[b"x"], &mut wire);
        for i in 0..wire.len() {
            let mut bad = wire.clone();
            bad[i] ^= 1;
            assert_eq!(key(0).open(&mut bad), Err(RecordError::BadMac), "byte {i}");
        }
    }

    #[test]
    fn post_handshake_messages_and_alerts() {
        use PostHandshake::*;
        assert_eq!(post_handshake_message(&[24, 0, 0]), Ok(None));
        assert_eq!(post_handshake_message(&[24, 0, 0, 1]), Ok(None));
        assert_eq!(
            post_handshake_message(&KEY_UPDATE_REQUEST),
            Ok(Some((KeyUpdate { requested: true }, 5)))
        );
        assert_eq!(
            post_handshake_message(&[24, 0, 0, 1, 0, 4]),
            Ok(Some((KeyUpdate { requested: false }, 5)))
        );
        assert_eq!(
            post_handshake_message(&[4, 0, 0, 2, 9, 9, 24]),
            Ok(Some((NewSessionTicket, 6)))
        );
        assert!(post_handshake_message(&[24, 0, 0, 1, 2]).is_err());
        assert!(post_handshake_message(&[24, 0, 0, 2, 0, 0]).is_err());
        assert_eq!(
            post_handshake_message(&[20, 0, 0, 0]),
            Err(RecordError::HandshakeType(20))
        );
        assert!(
            post_handshake_message(&[4, 1, 0, 1]).is_err(),
            "over 64 KiB"
        );

        assert_eq!(alert(&CLOSE_NOTIFY_ALERT), Ok(true));
        assert_eq!(alert(&[1, 90]), Ok(false));
        assert_eq!(alert(&[2, 40]), Err(RecordError::Alert(40)));
        assert!(alert(&[2]).is_err() && alert(&[2, 40, 0]).is_err());
    }

    #[test]
    fn headers_outside_tls13_are_refused() {
        assert_eq!(record_len(&[23, 3, 3, 0]), Ok(None));
        assert_eq!(
            record_len(&[22, 3, 3, 0, 40]),
            Err(RecordError::OuterType(22))
        );
        assert_eq!(record_len(&[23, 3, 3, 0, 16]), Err(RecordError::Length(16)));
        assert_eq!(
            record_len(&[23, 3, 3, 0x41, 1]),
            Err(RecordError::Length(16641))
        );
        assert_eq!(
            record_len(&[23, 3, 3, 0x41, 0]),
            Ok(Some(HEADER_LEN + 16640))
        );
    }
}
