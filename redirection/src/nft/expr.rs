//! The statements Istio's nftables rules use, and their nf_tables expressions.
//!
//! Lowering adds the dependencies `nft` itself inserts in an `inet` table: an `ip`/`ip6`
//! address match is preceded by `meta nfproto`, a port match by `meta l4proto` unless the
//! rule already proved them. So a rule sent here reads back from the kernel exactly
//! as the same rule written in `nft` syntax (the tests compare both).

use super::wire::{Attr, NFPROTO_IPV4, NFPROTO_IPV6};
use std::net::IpAddr;

const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;

const NFT_REG_VERDICT: u32 = 0;
const NFT_REG_1: u32 = 1;

const NF_ACCEPT: u32 = 1;
const NFT_JUMP: u32 = -3i32 as u32;

const META_KEY_MARK: u32 = 3;
const META_KEY_OIFNAME: u32 = 7;
const META_KEY_SKUID: u32 = 10;
const META_KEY_NFPROTO: u32 = 15;
const META_KEY_L4PROTO: u32 = 16;
const CT_KEY_MARK: u32 = 3;
const CT_KEY_ZONE: u32 = 17;
const PAYLOAD_NETWORK: u32 = 1;
const PAYLOAD_TRANSPORT: u32 = 2;
const CMP_EQ: u32 = 0;
const CMP_NEQ: u32 = 1;
const NFT_NAT_SNAT: u32 = 0;
/// `IFNAMSIZ`: interface names are compared as 16 zero-padded bytes.
const IFNAMSIZ: usize = 16;

/// `meta l4proto` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L4 {
    /// `IPPROTO_TCP`.
    Tcp = 6,
    /// `IPPROTO_UDP`.
    Udp = 17,
}

/// Which end of a packet a match reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// The source: `saddr`, `sport`.
    Src,
    /// The destination: `daddr`, `dport`.
    Dst,
}

/// One statement of a rule, in `nft` terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stmt {
    /// `meta l4proto tcp`
    L4Proto(L4),
    /// `ip saddr 1.2.3.4`, `ip6 daddr != ::1/128` (host addresses only).
    Addr {
        /// Source or destination address.
        dir: Dir,
        /// The host address; its family picks `ip` or `ip6`.
        addr: IpAddr,
        /// `==` when true, `!=` when false.
        eq: bool,
    },
    /// `ip daddr @set`
    AddrInSet {
        /// `ip6 daddr` rather than `ip daddr`.
        v6: bool,
        /// The set's name.
        set: String,
    },
    /// `tcp dport != 15008`, `udp sport 53`
    Port {
        /// `tcp` or `udp`.
        l4: L4,
        /// `sport` or `dport`.
        dir: Dir,
        /// The port.
        port: u16,
        /// `==` when true, `!=` when false.
        eq: bool,
    },
    /// `mark and 0xfff != 0x539`
    Mark {
        /// Mask applied to the packet mark.
        mask: u32,
        /// Value the masked mark is compared with.
        value: u32,
        /// `==` when true, `!=` when false.
        eq: bool,
    },
    /// `ct mark and 0xfff == 0x111`
    CtMark {
        /// Mask applied to the conntrack mark.
        mask: u32,
        /// Value the masked mark is compared with.
        value: u32,
        /// `==` when true, `!=` when false.
        eq: bool,
    },
    /// `oifname != lo`
    OifName {
        /// The interface name (compared zero-padded to `IFNAMSIZ`).
        name: String,
        /// `==` when true, `!=` when false.
        eq: bool,
    },
    /// `meta skuid 0`
    SkUid(u32),
    /// `counter`
    Counter,
    /// `accept`
    Accept,
    /// `jump chain`
    Jump(String),
    /// `redirect to :port`
    Redirect(u16),
    /// `snat to addr` (the family from the address)
    Snat(IpAddr),
    /// `ct mark set ct mark & keep | or`
    CtMarkSetMasked {
        /// Bits of the current conntrack mark kept.
        keep: u32,
        /// Bits then set.
        or: u32,
    },
    /// `meta mark set ct mark`
    MetaMarkSetCtMark,
    /// `ct zone set n`
    CtZoneSet(u16),
}

/// What earlier statements of a rule have proven, so dependencies are added once.
#[derive(Default)]
struct Proven {
    nfproto: Option<u8>,
    l4: Option<L4>,
}

/// A rule's `NFTA_RULE_EXPRESSIONS` list.
pub fn lower(stmts: &[Stmt]) -> Vec<Attr> {
    let mut proven = Proven::default();
    let mut out = Vec::new();
    for stmt in stmts {
        lower_one(stmt, &mut proven, &mut out);
    }
    out
}

fn lower_one(stmt: &Stmt, proven: &mut Proven, out: &mut Vec<Attr>) {
    match stmt {
        Stmt::L4Proto(l4) => {
            out.push(meta_load(META_KEY_L4PROTO));
            out.push(cmp(true, vec![*l4 as u8]));
            proven.l4 = Some(*l4);
        }
        Stmt::Addr { dir, addr, eq } => {
            need_nfproto(addr.is_ipv6(), proven, out);
            out.push(addr_load(addr.is_ipv6(), *dir));
            out.push(cmp(*eq, ip_bytes(addr)));
        }
        Stmt::AddrInSet { v6, set } => {
            need_nfproto(*v6, proven, out);
            out.push(addr_load(*v6, Dir::Dst));
            out.push(expr(
                "lookup",
                vec![
                    Attr::string(1, set),     // NFTA_LOOKUP_SET
                    Attr::be32(2, NFT_REG_1), // NFTA_LOOKUP_SREG
                ],
            ));
        }
        Stmt::Port { l4, dir, port, eq } => {
            if proven.l4 != Some(*l4) {
                out.push(meta_load(META_KEY_L4PROTO));
                out.push(cmp(true, vec![*l4 as u8]));
                proven.l4 = Some(*l4);
            }
            let offset = match dir {
                Dir::Src => 0,
                Dir::Dst => 2,
            };
            out.push(payload(PAYLOAD_TRANSPORT, offset, 2));
            out.push(cmp(*eq, port.to_be_bytes().to_vec()));
        }
        Stmt::Mark { mask, value, eq } => {
            out.push(meta_load(META_KEY_MARK));
            out.push(bitwise(*mask, 0));
            out.push(cmp(*eq, value.to_ne_bytes().to_vec()));
        }
        Stmt::CtMark { mask, value, eq } => {
            out.push(ct_load(CT_KEY_MARK));
            out.push(bitwise(*mask, 0));
            out.push(cmp(*eq, value.to_ne_bytes().to_vec()));
        }
        Stmt::OifName { name, eq } => {
            let mut bytes = name.as_bytes().to_vec();
            bytes.resize(IFNAMSIZ, 0);
            out.push(meta_load(META_KEY_OIFNAME));
            out.push(cmp(*eq, bytes));
        }
        Stmt::SkUid(uid) => {
            out.push(meta_load(META_KEY_SKUID));
            out.push(cmp(true, uid.to_ne_bytes().to_vec()));
        }
        Stmt::Counter => out.push(Attr::nested(
            NFTA_LIST_ELEM,
            vec![Attr::string(NFTA_EXPR_NAME, "counter")],
        )),
        Stmt::Accept => out.push(verdict(NF_ACCEPT, None)),
        Stmt::Jump(chain) => out.push(verdict(NFT_JUMP, Some(chain))),
        Stmt::Redirect(port) => {
            out.push(immediate(port.to_be_bytes().to_vec()));
            out.push(expr("redir", vec![Attr::be32(1, NFT_REG_1)])); // NFTA_REDIR_REG_PROTO_MIN
        }
        Stmt::Snat(addr) => {
            let family = if addr.is_ipv6() {
                NFPROTO_IPV6
            } else {
                NFPROTO_IPV4
            };
            out.push(immediate(ip_bytes(addr)));
            out.push(expr(
                "nat",
                vec![
                    Attr::be32(1, NFT_NAT_SNAT),  // NFTA_NAT_TYPE
                    Attr::be32(2, family as u32), // NFTA_NAT_FAMILY
                    Attr::be32(3, NFT_REG_1),     // NFTA_NAT_REG_ADDR_MIN
                ],
            ));
        }
        Stmt::CtMarkSetMasked { keep, or } => {
            // `(x & keep) | or` is `(x & (keep & !or)) ^ or` in nf_tables' terms.
            out.push(ct_load(CT_KEY_MARK));
            out.push(bitwise(keep & !or, *or));
            out.push(ct_set(CT_KEY_MARK));
        }
        Stmt::MetaMarkSetCtMark => {
            out.push(ct_load(CT_KEY_MARK));
            out.push(expr(
                "meta",
                vec![Attr::be32(2, META_KEY_MARK), Attr::be32(3, NFT_REG_1)], // KEY, SREG
            ));
        }
        Stmt::CtZoneSet(zone) => {
            out.push(immediate(zone.to_ne_bytes().to_vec()));
            out.push(ct_set(CT_KEY_ZONE));
        }
    }
}

fn need_nfproto(v6: bool, proven: &mut Proven, out: &mut Vec<Attr>) {
    let nfproto = if v6 { NFPROTO_IPV6 } else { NFPROTO_IPV4 };
    if proven.nfproto != Some(nfproto) {
        out.push(meta_load(META_KEY_NFPROTO));
        out.push(cmp(true, vec![nfproto]));
        proven.nfproto = Some(nfproto);
    }
}

fn ip_bytes(addr: &IpAddr) -> Vec<u8> {
    match addr {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// Loads `ip saddr|daddr` (`ip6` for v6) into register 1.
fn addr_load(v6: bool, dir: Dir) -> Attr {
    let (offset, len) = match (v6, dir) {
        (false, Dir::Src) => (12, 4),
        (false, Dir::Dst) => (16, 4),
        (true, Dir::Src) => (8, 16),
        (true, Dir::Dst) => (24, 16),
    };
    payload(PAYLOAD_NETWORK, offset, len)
}

fn expr(name: &str, data: Vec<Attr>) -> Attr {
    Attr::nested(
        NFTA_LIST_ELEM,
        vec![
            Attr::string(NFTA_EXPR_NAME, name),
            Attr::nested(NFTA_EXPR_DATA, data),
        ],
    )
}

fn meta_load(key: u32) -> Attr {
    expr("meta", vec![Attr::be32(2, key), Attr::be32(1, NFT_REG_1)]) // KEY, DREG
}

fn ct_load(key: u32) -> Attr {
    expr("ct", vec![Attr::be32(1, NFT_REG_1), Attr::be32(2, key)]) // DREG, KEY
}

fn ct_set(key: u32) -> Attr {
    expr("ct", vec![Attr::be32(2, key), Attr::be32(4, NFT_REG_1)]) // KEY, SREG
}

fn payload(base: u32, offset: u32, len: u32) -> Attr {
    expr(
        "payload",
        vec![
            Attr::be32(1, NFT_REG_1), // DREG
            Attr::be32(2, base),
            Attr::be32(3, offset),
            Attr::be32(4, len),
        ],
    )
}

fn data_value(ty: u16, bytes: Vec<u8>) -> Attr {
    Attr::nested(ty, vec![Attr::bytes(NFTA_DATA_VALUE, bytes)])
}

fn cmp(eq: bool, bytes: Vec<u8>) -> Attr {
    expr(
        "cmp",
        vec![
            Attr::be32(1, NFT_REG_1), // SREG
            Attr::be32(2, if eq { CMP_EQ } else { CMP_NEQ }),
            data_value(3, bytes),
        ],
    )
}

/// `reg1 = (reg1 & mask) ^ xor` over 4 bytes (marks are host-order u32s).
fn bitwise(mask: u32, xor: u32) -> Attr {
    expr(
        "bitwise",
        vec![
            Attr::be32(1, NFT_REG_1), // SREG
            Attr::be32(2, NFT_REG_1), // DREG
            Attr::be32(3, 4),         // LEN
            data_value(4, mask.to_ne_bytes().to_vec()),
            data_value(5, xor.to_ne_bytes().to_vec()),
        ],
    )
}

fn immediate(bytes: Vec<u8>) -> Attr {
    expr(
        "immediate",
        vec![Attr::be32(1, NFT_REG_1), data_value(2, bytes)],
    )
}

fn verdict(code: u32, chain: Option<&str>) -> Attr {
    let mut v = vec![Attr::be32(NFTA_VERDICT_CODE, code)];
    if let Some(chain) = chain {
        v.push(Attr::string(NFTA_VERDICT_CHAIN, chain));
    }
    expr(
        "immediate",
        vec![
            Attr::be32(1, NFT_REG_VERDICT),
            Attr::nested(2, vec![Attr::nested(NFTA_DATA_VERDICT, v)]),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(attrs: &[Attr]) -> Vec<String> {
        attrs
            .iter()
            .map(|a| match &a.value {
                super::super::wire::Value::Nested(inner) => match &inner[0].value {
                    super::super::wire::Value::Bytes(b) => {
                        String::from_utf8_lossy(&b[..b.len() - 1]).into_owned()
                    }
                    _ => unreachable!(),
                },
                _ => unreachable!(),
            })
            .collect()
    }

    #[test]
    fn dependencies_are_added_once_as_nft_adds_them() {
        let stmts = [
            Stmt::Addr {
                dir: Dir::Dst,
                addr: "127.0.0.1".parse().unwrap(),
                eq: false,
            },
            Stmt::Port {
                l4: L4::Tcp,
                dir: Dir::Dst,
                port: 15008,
                eq: false,
            },
            Stmt::Addr {
                dir: Dir::Src,
                addr: "10.0.0.1".parse().unwrap(),
                eq: true,
            },
            Stmt::Counter,
            Stmt::Redirect(15006),
        ];
        assert_eq!(
            names(&lower(&stmts)),
            [
                "meta",
                "cmp",
                "payload",
                "cmp", // nfproto ipv4, ip daddr
                "meta",
                "cmp",
                "payload",
                "cmp", // l4proto tcp, tcp dport
                "payload",
                "cmp", // ip saddr: ipv4 already proven
                "counter",
                "immediate",
                "redir",
            ]
        );
    }
}
