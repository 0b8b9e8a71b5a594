//! Istio's nftables rule sets as values: tables, chains and rules, each rule carrying
//! both its `nft` text (Istio's spelling, for the golden transaction) and its
//! statements (what is sent over netlink). The tests prove the two agree by applying
//! each in its own netns and comparing what the kernel reads back.

use super::expr::{Dir, Stmt, L4};
use super::wire::{Attr, Msg, MsgType, NLM_F_ACK, NLM_F_APPEND, NLM_F_CREATE};
use crate::rules::{InpodRules, IpFamily};
use shared_types::constants::{CONNMARK, CONNMARK_MASK};
use std::fmt::Write as _;
use std::net::IpAddr;

pub const TABLE_NAT: &str = "istio-ambient-nat";
pub const TABLE_MANGLE: &str = "istio-ambient-mangle";
pub const TABLE_RAW: &str = "istio-ambient-raw";
/// Every table the in-pod rules may own.
pub const INPOD_TABLES: [&str; 3] = [TABLE_NAT, TABLE_MANGLE, TABLE_RAW];
pub const CHAIN_PREROUTING: &str = "istio-prerouting";
pub const CHAIN_OUTPUT: &str = "istio-output";
const DNS_PORT: u16 = 53;
/// `ct zone` of ztunnel's DNS proxy <-> upstream flows (istio/istio#33469).
const DNS_CT_ZONE: u16 = 1;
/// The bits of the connmark kept when ztunnel's mark is set on a connection.
const CONNMARK_KEEP: u32 = !CONNMARK_MASK;

/// Netfilter hooks (`enum nf_inet_hooks`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    Prerouting = 0,
    Output = 3,
    Postrouting = 4,
}

impl Hook {
    fn name(self) -> &'static str {
        match self {
            Hook::Prerouting => "prerouting",
            Hook::Output => "output",
            Hook::Postrouting => "postrouting",
        }
    }
}

/// A base chain's `type`, hook and priority.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BaseChain {
    pub kind: &'static str,
    pub hook: Hook,
    pub priority: i32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    pub name: &'static str,
    pub base: Option<BaseChain>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub chain: &'static str,
    /// The rule in `nft` syntax, spelled as Istio spells it.
    pub text: String,
    pub stmts: Vec<Stmt>,
}

/// A named set of addresses (the host's probe sets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Set {
    pub name: &'static str,
    pub family: IpFamily,
}

/// One `inet` table and everything in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    pub name: &'static str,
    pub sets: Vec<Set>,
    pub chains: Vec<Chain>,
    pub rules: Vec<Rule>,
}

impl Table {
    /// The table's part of an `nft -f` transaction: add, flush, chains, rules.
    pub fn render(&self, out: &mut String) {
        let t = self.name;
        let _ = writeln!(out, "add table inet {t}");
        let _ = writeln!(out, "flush table inet {t}");
        for set in &self.sets {
            let _ = writeln!(
                out,
                "add set inet {t} {} {{ type {} ; }}",
                set.name,
                set_key_type(set.family).0
            );
        }
        for c in &self.chains {
            match c.base {
                Some(b) => {
                    let _ = writeln!(
                        out,
                        "add chain inet {t} {} {{ type {} hook {} priority {} ; }}",
                        c.name,
                        b.kind,
                        b.hook.name(),
                        b.priority
                    );
                }
                None => {
                    let _ = writeln!(out, "add chain inet {t} {}", c.name);
                }
            }
        }
        for r in &self.rules {
            let _ = writeln!(out, "add rule inet {t} {} {}", r.chain, r.text);
        }
    }

    /// `NFT_MSG_NEWTABLE` for this table (also the "exists" half of a replace).
    pub fn new_msg(&self) -> Msg {
        table_msg(MsgType::NewTable, self.name)
    }

    /// The messages that create this table's sets, chains and rules, in order.
    pub fn content_msgs(&self) -> Vec<Msg> {
        let mut msgs: Vec<Msg> = (1..)
            .zip(&self.sets)
            .map(|(id, s)| set_msg(self.name, s, id))
            .collect();
        msgs.extend(self.chains.iter().map(|c| chain_msg(self.name, c)));
        msgs.extend(self.rules.iter().map(|r| rule_msg(self.name, r)));
        msgs
    }
}

/// `nft` type name and (`NFTA_SET_KEY_TYPE`, key length) of an address family's set.
pub fn set_key_type(family: IpFamily) -> (&'static str, u32, u32) {
    match family {
        IpFamily::V4 => ("ipv4_addr", 7, 4),
        IpFamily::V6 => ("ipv6_addr", 8, 16),
    }
}

pub fn table_msg(ty: MsgType, table: &str) -> Msg {
    let flags = match ty {
        MsgType::NewTable => NLM_F_CREATE | NLM_F_ACK,
        _ => NLM_F_ACK,
    };
    Msg::new(ty, flags, vec![Attr::string(1, table)]) // NFTA_TABLE_NAME
}

pub fn chain_attrs(table: &str, c: &Chain) -> Vec<Attr> {
    let mut attrs = vec![Attr::string(1, table), Attr::string(3, c.name)]; // TABLE, NAME
    if let Some(b) = c.base {
        attrs.push(Attr::nested(
            4, // NFTA_CHAIN_HOOK
            vec![
                Attr::be32(1, b.hook as u32),     // HOOKNUM
                Attr::be32(2, b.priority as u32), // PRIORITY
            ],
        ));
        attrs.push(Attr::string(7, b.kind)); // NFTA_CHAIN_TYPE
    }
    attrs
}

fn chain_msg(table: &str, c: &Chain) -> Msg {
    Msg::new(
        MsgType::NewChain,
        NLM_F_CREATE | NLM_F_ACK,
        chain_attrs(table, c),
    )
}

/// `NFTA_RULE_EXPRESSIONS` of a rule.
pub fn rule_exprs(r: &Rule) -> Attr {
    Attr::nested(4, super::expr::lower(&r.stmts))
}

fn rule_msg(table: &str, r: &Rule) -> Msg {
    Msg::new(
        MsgType::NewRule,
        NLM_F_CREATE | NLM_F_APPEND | NLM_F_ACK,
        vec![
            Attr::string(1, table),
            Attr::string(2, r.chain),
            rule_exprs(r),
        ],
    )
}

/// `id` names the set within one batch (the kernel requires one).
fn set_msg(table: &str, s: &Set, id: u32) -> Msg {
    let (_, key_type, key_len) = set_key_type(s.family);
    Msg::new(
        MsgType::NewSet,
        NLM_F_CREATE | NLM_F_ACK,
        vec![
            Attr::string(1, table),  // NFTA_SET_TABLE
            Attr::string(2, s.name), // NFTA_SET_NAME
            Attr::be32(4, key_type), // NFTA_SET_KEY_TYPE
            Attr::be32(5, key_len),  // NFTA_SET_KEY_LEN
            Attr::be32(10, id),      // NFTA_SET_ID
        ],
    )
}

/// Renders a whole transaction (`nft -f` input).
pub fn render(tables: &[Table]) -> String {
    let mut out = String::new();
    for t in tables {
        t.render(&mut out);
    }
    out
}

fn rule(chain: &'static str, text: String, stmts: Vec<Stmt>) -> Rule {
    Rule { chain, text, stmts }
}

fn base(name: &'static str, kind: &'static str, hook: Hook, priority: i32) -> Chain {
    Chain {
        name,
        base: Some(BaseChain {
            kind,
            hook,
            priority,
        }),
    }
}

fn regular(name: &'static str) -> Chain {
    Chain { name, base: None }
}

/// `ip`/`ip6`, the loopback host prefix and the probe SNAT address of a family.
struct Fam {
    kw: &'static str,
    lo: IpAddr,
    lo_cidr: &'static str,
    probe: IpAddr,
}

impl Fam {
    fn of(family: IpFamily) -> Fam {
        Fam {
            kw: match family {
                IpFamily::V4 => "ip",
                IpFamily::V6 => "ip6",
            },
            lo: match family {
                IpFamily::V4 => IpAddr::from([127, 0, 0, 1]),
                IpFamily::V6 => std::net::Ipv6Addr::LOCALHOST.into(),
            },
            lo_cidr: family.loopback_cidr(),
            probe: family
                .probe_snat()
                .parse()
                .expect("the probe SNAT addresses are constants"),
        }
    }

    fn not_lo(&self) -> Stmt {
        Stmt::Addr {
            dir: Dir::Dst,
            addr: self.lo,
            eq: false,
        }
    }
}

fn tcp_port(dir: Dir, port: u16, eq: bool) -> Stmt {
    Stmt::Port {
        l4: L4::Tcp,
        dir,
        port,
        eq,
    }
}

fn udp_port(dir: Dir, port: u16) -> Stmt {
    Stmt::Port {
        l4: L4::Udp,
        dir,
        port,
        eq: true,
    }
}

fn mark(mark: u32, eq: bool) -> Stmt {
    Stmt::Mark {
        mask: CONNMARK_MASK,
        value: mark,
        eq,
    }
}

/// Istio's in-pod tables for one pod: nat, mangle, and raw when DNS is captured. IPv6
/// adds an `ip6` twin after each address rule.
pub fn inpod_tables(rules: &InpodRules) -> Vec<Table> {
    let fams: Vec<Fam> = rules.families().into_iter().map(Fam::of).collect();
    let m = rules.packet_mark;
    let mask = CONNMARK_MASK;
    let p = rules.ports;
    let (prert, output) = (CHAIN_PREROUTING, CHAIN_OUTPUT);

    let mut nat = Vec::new();
    if rules.inbound_capture {
        for f in &fams {
            nat.push(rule(
                prert,
                format!("meta l4proto tcp {} saddr {} counter accept", f.kw, f.probe),
                vec![
                    Stmt::L4Proto(L4::Tcp),
                    Stmt::Addr {
                        dir: Dir::Src,
                        addr: f.probe,
                        eq: true,
                    },
                    Stmt::Counter,
                    Stmt::Accept,
                ],
            ));
        }
    }
    for f in &fams {
        nat.push(rule(
            output,
            format!("meta l4proto tcp {} daddr {} counter accept", f.kw, f.probe),
            vec![
                Stmt::L4Proto(L4::Tcp),
                Stmt::Addr {
                    dir: Dir::Dst,
                    addr: f.probe,
                    eq: true,
                },
                Stmt::Counter,
                Stmt::Accept,
            ],
        ));
    }
    if rules.inbound_capture {
        for f in &fams {
            nat.push(rule(
                prert,
                format!(
                    "{} daddr != {} tcp dport != {} mark and {mask:#x}  != {m:#x} counter redirect to :{}",
                    f.kw, f.lo_cidr, p.hbone, p.inbound_plaintext
                ),
                vec![
                    f.not_lo(),
                    tcp_port(Dir::Dst, p.hbone, false),
                    mark(m, false),
                    Stmt::Counter,
                    Stmt::Redirect(p.inbound_plaintext),
                ],
            ));
        }
    }
    if rules.dns_capture {
        nat.push(rule(
            output,
            format!(
                "oifname != lo mark and {mask:#x} != {m:#x} udp dport {DNS_PORT} counter redirect to :{}",
                p.dns
            ),
            vec![
                Stmt::OifName {
                    name: "lo".into(),
                    eq: false,
                },
                mark(m, false),
                udp_port(Dir::Dst, DNS_PORT),
                Stmt::Counter,
                Stmt::Redirect(p.dns),
            ],
        ));
        for f in &fams {
            nat.push(rule(
                output,
                format!(
                    "{} daddr != {} tcp dport {DNS_PORT} mark and {mask:#x} != {m:#x} counter redirect to :{}",
                    f.kw, f.lo_cidr, p.dns
                ),
                vec![
                    f.not_lo(),
                    tcp_port(Dir::Dst, DNS_PORT, true),
                    mark(m, false),
                    Stmt::Counter,
                    Stmt::Redirect(p.dns),
                ],
            ));
        }
    }
    nat.push(rule(
        output,
        format!("meta l4proto tcp mark and {mask:#x} == {CONNMARK:#x} counter accept"),
        vec![
            Stmt::L4Proto(L4::Tcp),
            mark(CONNMARK, true),
            Stmt::Counter,
            Stmt::Accept,
        ],
    ));
    for f in &fams {
        nat.push(rule(
            output,
            format!("oifname lo {} daddr != {} counter accept", f.kw, f.lo_cidr),
            vec![
                Stmt::OifName {
                    name: "lo".into(),
                    eq: true,
                },
                f.not_lo(),
                Stmt::Counter,
                Stmt::Accept,
            ],
        ));
    }
    for f in &fams {
        nat.push(rule(
            output,
            format!(
                "meta l4proto tcp {} daddr != {} mark and {mask:#x} != {m:#x} counter redirect to :{}",
                f.kw, f.lo_cidr, p.outbound
            ),
            vec![
                Stmt::L4Proto(L4::Tcp),
                f.not_lo(),
                mark(m, false),
                Stmt::Counter,
                Stmt::Redirect(p.outbound),
            ],
        ));
    }

    // Istio's nat table hooks output first; the others prerouting first.
    let mut tables = vec![
        inpod_table(TABLE_NAT, ("nat", "nat"), -100, [Hook::Output, Hook::Prerouting], nat),
        inpod_table(
            TABLE_MANGLE,
            ("filter", "route"),
            -150,
            [Hook::Prerouting, Hook::Output],
            vec![
                // ztunnel's own packets tag their connection...
                rule(
                    prert,
                    format!(
                        "meta mark & {mask:#x} == {m:#x} counter ct mark set ct mark & {CONNMARK_KEEP:#x} |  {CONNMARK:#x}"
                    ),
                    vec![
                        mark(m, true),
                        Stmt::Counter,
                        Stmt::CtMarkSetMasked {
                            keep: CONNMARK_KEEP,
                            or: CONNMARK,
                        },
                    ],
                ),
                // ...and replies on that connection carry the mark back out.
                rule(
                    output,
                    format!("ct mark and {mask:#x} == {CONNMARK:#x} counter meta mark set ct mark"),
                    vec![
                        Stmt::CtMark {
                            mask,
                            value: CONNMARK,
                            eq: true,
                        },
                        Stmt::Counter,
                        Stmt::MetaMarkSetCtMark,
                    ],
                ),
            ],
        ),
    ];
    if rules.dns_capture {
        tables.push(inpod_table(
            TABLE_RAW,
            ("filter", "filter"),
            -300,
            [Hook::Prerouting, Hook::Output],
            vec![
                rule(
                    output,
                    format!(
                        "udp dport {DNS_PORT} meta mark and {mask:#x} == {m:#x} counter ct zone set {DNS_CT_ZONE}"
                    ),
                    vec![
                        udp_port(Dir::Dst, DNS_PORT),
                        mark(m, true),
                        Stmt::Counter,
                        Stmt::CtZoneSet(DNS_CT_ZONE),
                    ],
                ),
                rule(
                    prert,
                    format!(
                        "udp sport {DNS_PORT} meta mark and {mask:#x} != {m:#x} counter ct zone set {DNS_CT_ZONE}"
                    ),
                    vec![
                        udp_port(Dir::Src, DNS_PORT),
                        mark(m, false),
                        Stmt::Counter,
                        Stmt::CtZoneSet(DNS_CT_ZONE),
                    ],
                ),
            ],
        ));
    }
    tables
}

/// One in-pod table: base chains `prerouting` and `output` of the given types at
/// `priority`, our two chains, each base chain's jump to ours in `jumps` order (as
/// Istio writes them), then `rules`.
fn inpod_table(
    name: &'static str,
    (prerouting_kind, output_kind): (&'static str, &'static str),
    priority: i32,
    jumps: [Hook; 2],
    rules: Vec<Rule>,
) -> Table {
    let jump = |hook: Hook| {
        let (from, to) = match hook {
            Hook::Output => ("output", CHAIN_OUTPUT),
            _ => ("prerouting", CHAIN_PREROUTING),
        };
        rule(from, format!("jump {to}"), vec![Stmt::Jump(to.into())])
    };
    Table {
        name,
        sets: Vec::new(),
        chains: vec![
            base("prerouting", prerouting_kind, Hook::Prerouting, priority),
            base("output", output_kind, Hook::Output, priority),
            regular(CHAIN_PREROUTING),
            regular(CHAIN_OUTPUT),
        ],
        rules: jumps.into_iter().map(jump).chain(rules).collect(),
    }
}

/// The host's probe SNAT table: the probe sets and, in `postrouting`, a rule per family
/// SNATing kubelet's (uid `kubelet_uid`) probes to the pods in the set.
pub fn host_table(families: &[IpFamily], kubelet_uid: u32) -> Table {
    let mut sets = Vec::new();
    let mut rules = Vec::new();
    for &family in families {
        let name = crate::ProbeSnat::set_name(family);
        let f = Fam::of(family);
        sets.push(Set { name, family });
        rules.push(rule(
            "postrouting",
            format!(
                "meta l4proto tcp skuid {kubelet_uid} {} daddr @{name} counter snat to {}",
                f.kw, f.probe
            ),
            vec![
                Stmt::L4Proto(L4::Tcp),
                Stmt::SkUid(kubelet_uid),
                Stmt::AddrInSet {
                    v6: family == IpFamily::V6,
                    set: name.to_owned(),
                },
                Stmt::Counter,
                Stmt::Snat(f.probe),
            ],
        ));
    }
    Table {
        name: TABLE_NAT,
        sets,
        chains: vec![base("postrouting", "nat", Hook::Postrouting, 100)],
        rules,
    }
}
