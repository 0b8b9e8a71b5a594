//! nftables rule sets as values: tables, chains, sets and rules, each rule carrying
//! both its `nft` text (for the golden transaction) and its statements (what is sent
//! over netlink), and the netlink messages that create them. Istio's concrete tables
//! are in [`super::istio_tables`].

use super::expr::Stmt;
use super::wire::{Attr, Msg, MsgType, NLM_F_ACK, NLM_F_APPEND, NLM_F_CREATE};
use crate::rules::IpFamily;
use std::fmt::Write as _;

/// Netfilter hooks (`enum nf_inet_hooks`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    /// `NF_INET_PRE_ROUTING`.
    Prerouting = 0,
    /// `NF_INET_LOCAL_OUT`.
    Output = 3,
    /// `NF_INET_POST_ROUTING`.
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
    /// The chain type (`NFTA_CHAIN_TYPE`): `nat`, `filter` or `route`.
    pub kind: &'static str,
    /// The hook it is attached to (`NFTA_HOOK_HOOKNUM`).
    pub hook: Hook,
    /// Its priority at that hook (`NFTA_HOOK_PRIORITY`).
    pub priority: i32,
}

/// A chain of a table: a base chain on a hook, or a regular one reached by jumps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    /// The chain's name.
    pub name: &'static str,
    /// Type, hook and priority of a base chain; `None` for a regular chain.
    pub base: Option<BaseChain>,
}

/// One rule, appended to its chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// The chain it is appended to.
    pub chain: &'static str,
    /// The rule in `nft` syntax, spelled as Istio spells it.
    pub text: String,
    /// The same rule as statements, lowered to what is sent over netlink.
    pub stmts: Vec<Stmt>,
}

/// A named set of addresses (the host's probe sets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Set {
    /// The set's name.
    pub name: &'static str,
    /// The family of its addresses (its key type).
    pub family: IpFamily,
}

/// One `inet` table and everything in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    /// The table's name (family `inet`).
    pub name: &'static str,
    /// Its sets.
    pub sets: Vec<Set>,
    /// Its chains.
    pub chains: Vec<Chain>,
    /// Its rules, in order within each chain.
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

/// A table message (`NFTA_TABLE_NAME` only), acknowledged; `NFT_MSG_NEWTABLE` also
/// gets `NLM_F_CREATE`.
pub fn table_msg(ty: MsgType, table: &str) -> Msg {
    let flags = match ty {
        MsgType::NewTable => NLM_F_CREATE | NLM_F_ACK,
        _ => NLM_F_ACK,
    };
    Msg::new(ty, flags, vec![Attr::string(1, table)]) // NFTA_TABLE_NAME
}

/// A chain's attributes, as created and as compared with the dump: `NFTA_CHAIN_TABLE`
/// and `NFTA_CHAIN_NAME`, plus `NFTA_CHAIN_HOOK` and `NFTA_CHAIN_TYPE` for a base chain.
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

pub(super) fn rule(chain: &'static str, text: String, stmts: Vec<Stmt>) -> Rule {
    Rule { chain, text, stmts }
}

pub(super) fn base(name: &'static str, kind: &'static str, hook: Hook, priority: i32) -> Chain {
    Chain {
        name,
        base: Some(BaseChain {
            kind,
            hook,
            priority,
        }),
    }
}

pub(super) fn regular(name: &'static str) -> Chain {
    Chain { name, base: None }
}
