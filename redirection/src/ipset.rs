//! The iptables mode's probe ipsets over netlink (`NFNL_SUBSYS_IPSET`): a pod's entry
//! is added and deleted without spawning `ipset` on its start-up path. Creating,
//! listing and destroying the sets (once per agent start, or per unenrollment) still
//! go through the `ipset` CLI, which prints what the tests and operators read.

use super::nft::session::{NftError, Session};
use super::nft::wire::{Attr, NFPROTO_IPV4, NFPROTO_IPV6};
use std::net::IpAddr;

const NFNL_SUBSYS_IPSET: u16 = 6;
const IPSET_CMD_ADD: u16 = 9;
const IPSET_CMD_DEL: u16 = 10;
/// The protocol version we speak (`IPSET_PROTOCOL`; kernels accept 6 and up).
const IPSET_PROTOCOL: u8 = 7;
const IPSET_ATTR_PROTOCOL: u16 = 1;
const IPSET_ATTR_SETNAME: u16 = 2;
const IPSET_ATTR_DATA: u16 = 7;
const IPSET_ATTR_IP: u16 = 1;
const IPSET_ATTR_COMMENT: u16 = 26;
const IPSET_ATTR_IPADDR_IPV4: u16 = 1;
const IPSET_ATTR_IPADDR_IPV6: u16 = 2;
/// Addresses are sent in network order and must say so.
const NLA_F_NET_BYTEORDER: u16 = 0x4000;

/// Adds `ip` to `set` commented with `comment`; an existing entry is kept and its
/// comment replaced (the CLI's `-exist`: no `NLM_F_EXCL`).
pub fn add(set: &str, ip: IpAddr, comment: &str) -> Result<(), NftError> {
    request(IPSET_CMD_ADD, set, ip, Some(comment), "ipset add")
}

/// Deletes `ip` from `set`; an absent entry is fine (`-exist`).
pub fn del(set: &str, ip: IpAddr) -> Result<(), NftError> {
    request(IPSET_CMD_DEL, set, ip, None, "ipset del")
}

fn request(
    cmd: u16,
    set: &str,
    ip: IpAddr,
    comment: Option<&str>,
    what: &str,
) -> Result<(), NftError> {
    let (family, addr) = match ip {
        IpAddr::V4(a) => (
            NFPROTO_IPV4,
            Attr::bytes(IPSET_ATTR_IPADDR_IPV4 | NLA_F_NET_BYTEORDER, a.octets()),
        ),
        IpAddr::V6(a) => (
            NFPROTO_IPV6,
            Attr::bytes(IPSET_ATTR_IPADDR_IPV6 | NLA_F_NET_BYTEORDER, a.octets()),
        ),
    };
    let mut data = vec![Attr::nested(IPSET_ATTR_IP, vec![addr])];
    if let Some(comment) = comment {
        data.push(Attr::string(IPSET_ATTR_COMMENT, comment));
    }
    let attrs = [
        Attr::bytes(IPSET_ATTR_PROTOCOL, [IPSET_PROTOCOL]),
        Attr::string(IPSET_ATTR_SETNAME, set),
        Attr::nested(IPSET_ATTR_DATA, data),
    ];
    Session::open()?.request((NFNL_SUBSYS_IPSET << 8) | cmd, family, &attrs, what)
}
