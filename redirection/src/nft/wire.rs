//! nf_tables over netlink, by hand: netlink attributes as trees, and the messages of
//! one batch (`linux/netfilter/nf_tables.h`, `linux/netfilter/nfnetlink.h`). The
//! attributes and [`encode_message`] serve the ipset subsystem too.
//!
//! Messages are built as [`Attr`] trees and encoded at the end, so the same tree that
//! was sent can be compared with what the kernel dumps back ([`Attr::is_within`]).
//! None of the crates we evaluated (rustables, nlink, nftnl) encodes `ct mark set`,
//! `ct zone set` or `meta mark set`, which Istio's rules need.

/// `NETLINK_NETFILTER` subsystem of nf_tables.
pub const NFNL_SUBSYS_NFTABLES: u16 = 10;
/// `NFNL_MSG_BATCH_BEGIN`: opens an atomic batch.
pub const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
/// `NFNL_MSG_BATCH_END`: commits the batch.
pub const NFNL_MSG_BATCH_END: u16 = 0x11;
/// `NFPROTO_INET`: the family of every table we own.
pub const NFPROTO_INET: u8 = 1;
/// `NFPROTO_IPV4`.
pub const NFPROTO_IPV4: u8 = 2;
/// `NFPROTO_IPV6`.
pub const NFPROTO_IPV6: u8 = 10;

/// `enum nf_tables_msg_types`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum MsgType {
    /// `NFT_MSG_NEWTABLE`: creates a table.
    NewTable = 0,
    /// `NFT_MSG_GETTABLE`: gets or dumps tables.
    GetTable = 1,
    /// `NFT_MSG_DELTABLE`: deletes a table and everything in it.
    DelTable = 2,
    /// `NFT_MSG_NEWCHAIN`: creates a chain.
    NewChain = 3,
    /// `NFT_MSG_GETCHAIN`: gets or dumps chains.
    GetChain = 4,
    /// `NFT_MSG_NEWRULE`: adds a rule.
    NewRule = 6,
    /// `NFT_MSG_GETRULE`: gets or dumps rules.
    GetRule = 7,
    /// `NFT_MSG_DELRULE`: deletes a rule, or all of a chain's rules.
    DelRule = 8,
    /// `NFT_MSG_NEWSET`: creates a set.
    NewSet = 9,
    /// `NFT_MSG_NEWSETELEM`: adds set elements.
    NewSetElem = 12,
    /// `NFT_MSG_GETSETELEM`: gets or dumps set elements.
    GetSetElem = 13,
    /// `NFT_MSG_DELSETELEM`: deletes set elements.
    DelSetElem = 14,
    /// `NFT_MSG_DESTROYTABLE`: deletes a table; an absent one is not an error.
    DestroyTable = 26,
}

/// `NLM_F_REQUEST`: the message is a request.
pub const NLM_F_REQUEST: u16 = 0x1;
/// `NLM_F_ACK`: asks for an acknowledgement.
pub const NLM_F_ACK: u16 = 0x4;
/// `NLM_F_DUMP`: asks for every matching object.
pub const NLM_F_DUMP: u16 = 0x300;
/// `NLM_F_CREATE`: creates the object if it does not exist.
pub const NLM_F_CREATE: u16 = 0x400;
/// `NLM_F_APPEND`: adds the rule at the end of its chain.
pub const NLM_F_APPEND: u16 = 0x800;
const NLA_F_NESTED: u16 = 0x8000;
const NLA_TYPE_MASK: u16 = 0x3fff;
const NLMSG_HDRLEN: usize = 16;
const NFGENMSG_LEN: usize = 4;

/// A netlink attribute: bytes, or attributes nested inside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attr {
    /// The attribute type (`nla_type`, without `NLA_F_NESTED`).
    pub ty: u16,
    /// Its payload.
    pub value: Value,
}

/// An attribute's payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// Raw bytes, sent as they are.
    Bytes(Vec<u8>),
    /// Nested attributes (encoded with `NLA_F_NESTED`).
    Nested(Vec<Attr>),
}

impl Attr {
    /// An attribute holding `bytes` as they are.
    pub fn bytes(ty: u16, bytes: impl Into<Vec<u8>>) -> Attr {
        Attr {
            ty,
            value: Value::Bytes(bytes.into()),
        }
    }

    /// A NUL-terminated string, as the kernel's `NLA_STRING`/`NLA_NUL_STRING` take it.
    pub fn string(ty: u16, s: &str) -> Attr {
        let mut bytes = s.as_bytes().to_vec();
        bytes.push(0);
        Attr::bytes(ty, bytes)
    }

    /// A big-endian u32 (nf_tables' `NLA_BE32`/`NLA_U32` attributes are all network order).
    pub fn be32(ty: u16, v: u32) -> Attr {
        Attr::bytes(ty, v.to_be_bytes())
    }

    /// An attribute nesting `attrs`.
    pub fn nested(ty: u16, attrs: Vec<Attr>) -> Attr {
        Attr {
            ty,
            value: Value::Nested(attrs),
        }
    }

    fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&[0; 4]);
        let ty = match &self.value {
            Value::Bytes(b) => {
                out.extend_from_slice(b);
                self.ty
            }
            Value::Nested(attrs) => {
                for a in attrs {
                    a.encode(out);
                }
                self.ty | NLA_F_NESTED
            }
        };
        let len = (out.len() - start) as u16;
        out[start..start + 2].copy_from_slice(&len.to_ne_bytes());
        out[start + 2..start + 4].copy_from_slice(&ty.to_ne_bytes());
        pad(out);
    }

    /// Whether everything in `self` is in `dumped` (the kernel's dump of the same
    /// object): each of our attributes, in order, matches a later attribute of the same
    /// type there; bytes must be equal, nested ones are compared the same way. The
    /// kernel adds attributes of its own (handles, counters' values, defaults), which
    /// are ignored; a changed or missing value is not.
    pub fn is_within(&self, dumped: &[u8]) -> bool {
        match &self.value {
            Value::Bytes(b) => b.as_slice() == dumped,
            Value::Nested(ours) => match parse_attrs(dumped) {
                Some(theirs) => attrs_within(ours, &theirs),
                None => false,
            },
        }
    }
}

/// Subset match of `ours` in `theirs` (see [`Attr::is_within`]). Attributes of one type
/// keep their order (a rule's expressions are a list of `NFTA_LIST_ELEM`); attributes
/// of different types may come in any order, as each expression dumps its own way.
pub fn attrs_within(ours: &[Attr], theirs: &[(u16, &[u8])]) -> bool {
    let mut next_of_type: std::collections::HashMap<u16, usize> = Default::default();
    ours.iter().all(|a| {
        let from = next_of_type.get(&a.ty).copied().unwrap_or(0);
        let found = theirs
            .iter()
            .enumerate()
            .skip(from)
            .find(|(_, (ty, bytes))| *ty == a.ty && a.is_within(bytes));
        match found {
            Some((i, _)) => {
                next_of_type.insert(a.ty, i + 1);
                true
            }
            None => false,
        }
    })
}

fn pad(out: &mut Vec<u8>) {
    while !out.len().is_multiple_of(4) {
        out.push(0);
    }
}

/// Splits attribute bytes into (type, payload) pairs; `None` if they are malformed.
pub fn parse_attrs(mut bytes: &[u8]) -> Option<Vec<(u16, &[u8])>> {
    let mut attrs = Vec::new();
    while bytes.len() >= 4 {
        let len = u16::from_ne_bytes([bytes[0], bytes[1]]) as usize;
        let ty = u16::from_ne_bytes([bytes[2], bytes[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > bytes.len() {
            return None;
        }
        attrs.push((ty, &bytes[4..len]));
        let advance = (len + 3) & !3;
        bytes = bytes.get(advance..).unwrap_or(&[]);
    }
    Some(attrs)
}

/// One nf_tables request: the message type, its flags and its attributes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Msg {
    /// The nf_tables message type.
    pub ty: MsgType,
    /// `NLM_F_*` flags (`NLM_F_REQUEST` is always added).
    pub flags: u16,
    /// The `nfgenmsg` family (`NFPROTO_*`).
    pub family: u8,
    /// Its attributes.
    pub attrs: Vec<Attr>,
}

impl Msg {
    /// A message of the `inet` family.
    pub fn new(ty: MsgType, flags: u16, attrs: Vec<Attr>) -> Msg {
        Msg {
            ty,
            flags,
            family: NFPROTO_INET,
            attrs,
        }
    }

    fn encode(&self, seq: u32, out: &mut Vec<u8>) {
        let ty = (NFNL_SUBSYS_NFTABLES << 8) | self.ty as u16;
        out.extend(encode_message(
            ty,
            self.flags,
            seq,
            self.family,
            &self.attrs,
        ));
    }
}

/// One nfnetlink request of any subsystem: `ty` is `subsystem << 8 | command`.
pub fn encode_message(ty: u16, flags: u16, seq: u32, family: u8, attrs: &[Attr]) -> Vec<u8> {
    let mut body = Vec::new();
    for a in attrs {
        a.encode(&mut body);
    }
    let mut out = Vec::new();
    header(&mut out, ty, flags | NLM_F_REQUEST, seq, family, 0, &body);
    out
}

/// Appends `nlmsghdr` + `nfgenmsg` + `body`.
fn header(out: &mut Vec<u8>, ty: u16, flags: u16, seq: u32, family: u8, res_id: u16, body: &[u8]) {
    let len = (NLMSG_HDRLEN + NFGENMSG_LEN + body.len()) as u32;
    out.extend_from_slice(&len.to_ne_bytes());
    out.extend_from_slice(&ty.to_ne_bytes());
    out.extend_from_slice(&flags.to_ne_bytes());
    out.extend_from_slice(&seq.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes());
    out.push(family);
    out.push(0); // NFNETLINK_V0
    out.extend_from_slice(&res_id.to_be_bytes());
    out.extend_from_slice(body);
}

/// Encodes `msgs` as one atomic batch. Sequence numbers start at `first_seq`, one per
/// message including the batch markers; returns the bytes and the sequence numbers of
/// the messages that asked for an acknowledgement.
pub fn encode_batch(msgs: &[Msg], first_seq: u32) -> (Vec<u8>, Vec<u32>) {
    let mut out = Vec::new();
    let mut acked = Vec::new();
    let mut seq = first_seq;
    header(
        &mut out,
        NFNL_MSG_BATCH_BEGIN,
        NLM_F_REQUEST,
        seq,
        0,
        NFNL_SUBSYS_NFTABLES,
        &[],
    );
    for m in msgs {
        seq += 1;
        m.encode(seq, &mut out);
        if m.flags & NLM_F_ACK != 0 {
            acked.push(seq);
        }
    }
    seq += 1;
    header(
        &mut out,
        NFNL_MSG_BATCH_END,
        NLM_F_REQUEST,
        seq,
        0,
        NFNL_SUBSYS_NFTABLES,
        &[],
    );
    (out, acked)
}

/// Encodes one request outside a batch (dumps).
pub fn encode_request(msg: &Msg, seq: u32) -> Vec<u8> {
    let mut out = Vec::new();
    msg.encode(seq, &mut out);
    out
}

/// A netlink message from the kernel: its type, sequence number and payload after the
/// `nlmsghdr`.
#[derive(Debug)]
pub struct Reply<'a> {
    /// `nlmsg_type`.
    pub ty: u16,
    /// `nlmsg_seq`: the request it answers.
    pub seq: u32,
    /// What follows the header.
    pub payload: &'a [u8],
}

/// `NLMSG_ERROR`: an error, or an acknowledgement (errno 0).
pub const NLMSG_ERROR: u16 = 2;
/// `NLMSG_DONE`: the end of a dump.
pub const NLMSG_DONE: u16 = 3;

/// Splits a datagram into netlink messages; `None` if it is malformed.
pub fn parse_replies(mut bytes: &[u8]) -> Option<Vec<Reply<'_>>> {
    let mut replies = Vec::new();
    while bytes.len() >= NLMSG_HDRLEN {
        let len = u32::from_ne_bytes(bytes[0..4].try_into().ok()?) as usize;
        if len < NLMSG_HDRLEN || len > bytes.len() {
            return None;
        }
        replies.push(Reply {
            ty: u16::from_ne_bytes([bytes[4], bytes[5]]),
            seq: u32::from_ne_bytes(bytes[8..12].try_into().ok()?),
            payload: &bytes[NLMSG_HDRLEN..len],
        });
        let advance = (len + 3) & !3;
        bytes = bytes.get(advance..).unwrap_or(&[]);
    }
    Some(replies)
}

impl Reply<'_> {
    /// For `NLMSG_ERROR`: the (negative) errno, 0 for an acknowledgement.
    pub fn errno(&self) -> Option<i32> {
        (self.ty == NLMSG_ERROR)
            .then(|| {
                self.payload
                    .get(0..4)?
                    .try_into()
                    .ok()
                    .map(i32::from_ne_bytes)
            })
            .flatten()
    }

    /// For an nf_tables object: its attributes (after `nfgenmsg`).
    pub fn attrs(&self) -> Option<Vec<(u16, &[u8])>> {
        parse_attrs(self.payload.get(NFGENMSG_LEN..)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_attributes_encode_with_lengths_padding_and_the_nested_flag() {
        let mut out = Vec::new();
        Attr::nested(1, vec![Attr::string(2, "lo"), Attr::be32(3, 7)]).encode(&mut out);
        assert_eq!(out.len(), 4 + 8 + 8);
        assert_eq!(u16::from_ne_bytes([out[0], out[1]]), 20);
        assert_eq!(u16::from_ne_bytes([out[2], out[3]]), 1 | NLA_F_NESTED);
        let inner = parse_attrs(&out[4..]).unwrap();
        assert_eq!(inner, vec![(2, &b"lo\0"[..]), (3, &[0, 0, 0, 7][..])]);
    }

    #[test]
    fn subset_match_ignores_kernel_additions_but_not_changes() {
        let ours = Attr::nested(
            1,
            vec![Attr::be32(2, 5), Attr::nested(3, vec![Attr::be32(4, 1)])],
        );
        let mut dumped = Vec::new();
        for a in [
            Attr::be32(9, 42),
            Attr::be32(2, 5),
            Attr::nested(3, vec![Attr::be32(4, 1), Attr::be32(5, 0)]),
        ] {
            a.encode(&mut dumped);
        }
        assert!(ours.is_within(&dumped));
        let mut changed = Vec::new();
        for a in [Attr::be32(2, 6), Attr::nested(3, vec![Attr::be32(4, 1)])] {
            a.encode(&mut changed);
        }
        assert!(!ours.is_within(&changed));
        assert!(!ours.is_within(&[1, 2, 3]), "garbage never matches");
    }

    #[test]
    fn malformed_replies_are_rejected_not_read_past() {
        assert!(parse_replies(&[0xff; 20]).is_none());
        assert!(parse_attrs(&[200, 0, 1, 0, 1]).is_none());
        let mut out = Vec::new();
        header(&mut out, NLMSG_ERROR, 0, 9, 0, 0, &[]);
        let replies = parse_replies(&out).unwrap();
        assert_eq!((replies[0].ty, replies[0].seq), (NLMSG_ERROR, 9));
    }
}
