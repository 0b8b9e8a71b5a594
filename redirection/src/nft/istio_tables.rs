//! Istio's nftables tables, as its native nftables mode writes them: the in-pod nat,
//! mangle and raw tables, and the host's probe SNAT table. The tests prove the text and
//! the netlink statements agree by applying each in its own netns and comparing what
//! the kernel reads back.

use super::expr::{Dir, Stmt, L4};
use super::ruleset::{base, regular, rule, Hook, Rule, Set, Table};
use crate::rules::{InpodRules, IpFamily};
use shared_types::constants::{CONNMARK, CONNMARK_MASK};
use std::net::IpAddr;

/// Istio's nat table: the in-pod capture redirects (on the host, the probe SNAT).
pub const TABLE_NAT: &str = "istio-ambient-nat";
/// Istio's in-pod mangle table: ztunnel's connection mark.
pub const TABLE_MANGLE: &str = "istio-ambient-mangle";
/// Istio's in-pod raw table: DNS conntrack zones, only with DNS capture.
pub const TABLE_RAW: &str = "istio-ambient-raw";
/// Every table the in-pod rules may own.
pub const INPOD_TABLES: [&str; 3] = [TABLE_NAT, TABLE_MANGLE, TABLE_RAW];
/// Our in-pod regular chain, jumped to from each table's `prerouting` base chain.
pub const CHAIN_PREROUTING: &str = "istio-prerouting";
/// Our in-pod regular chain, jumped to from each table's `output` base chain.
pub const CHAIN_OUTPUT: &str = "istio-output";
const DNS_PORT: u16 = 53;
/// `ct zone` of ztunnel's DNS proxy <-> upstream flows (istio/istio#33469).
const DNS_CT_ZONE: u16 = 1;
/// The bits of the connmark kept when ztunnel's mark is set on a connection.
const CONNMARK_KEEP: u32 = !CONNMARK_MASK;

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
