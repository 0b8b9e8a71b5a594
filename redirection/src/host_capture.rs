//! A dedicated (VM) ztunnel's capture of its own host's traffic: outbound TCP to
//! ztunnel's 15001 so existing applications need no change, and optionally inbound
//! plaintext to chosen ports through 15006. Chain names follow Istio's; the rule set
//! is applied, checked and removed like any other ([`crate::iptables`]).

use ipnet::IpNet;
use shared_types::constants::{CONNMARK_MASK, INBOUND_PLAINTEXT_PORT, OUTBOUND_CAPTURE_PORT};

use crate::rules::{
    ChainRef, ChainRules, IpFamily, RuleSet, Table, CHAIN_OUTPUT, CHAIN_PREROUTING,
};

/// What a dedicated ztunnel captures on its host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostCapture {
    /// ztunnel's socket mark; marked traffic is never captured (no loops).
    pub mark: u32,
    /// Destinations left alone (e.g. the management network, the metadata server).
    pub exclude_cidrs: Vec<IpNet>,
    /// Destination ports left alone (e.g. 22).
    pub exclude_ports: Vec<u16>,
    /// Local ports whose inbound plaintext traffic goes through ztunnel's 15006
    /// (empty: inbound is not captured; mesh peers reach 15008 directly).
    pub inbound_ports: Vec<u16>,
}

const OUTPUT: ChainRef = ChainRef {
    table: Table::Nat,
    name: CHAIN_OUTPUT,
    hook: "OUTPUT",
};
const PREROUTING: ChainRef = ChainRef {
    table: Table::Nat,
    name: CHAIN_PREROUTING,
    hook: "PREROUTING",
};

impl HostCapture {
    /// The rule set of one family, rules written as `iptables-save` prints them.
    pub fn rule_set(&self, family: IpFamily) -> RuleSet {
        let mark = format!("{:#x}/{CONNMARK_MASK:#x}", self.mark);
        // All of loopback: a host's services listen anywhere in 127/8.
        let loopback = match family {
            IpFamily::V4 => "127.0.0.0/8",
            IpFamily::V6 => "::1/128",
        };
        let mut output = vec![
            format!("-m mark --mark {mark} -j RETURN"),
            format!("-d {loopback} -j RETURN"),
            "-o lo -j RETURN".to_owned(),
        ];
        output.extend(
            self.exclude_cidrs
                .iter()
                .filter(|cidr| family_of(cidr) == family)
                .map(|cidr| format!("-d {} -j RETURN", cidr.trunc())),
        );
        output.extend(
            self.exclude_ports
                .iter()
                .map(|port| format!("-p tcp -m tcp --dport {port} -j RETURN")),
        );
        output.push(format!(
            "-p tcp -j REDIRECT --to-ports {OUTBOUND_CAPTURE_PORT}"
        ));
        let mut wanted = vec![ChainRules {
            chain: OUTPUT,
            rules: output,
        }];
        if !self.inbound_ports.is_empty() {
            wanted.push(ChainRules {
                chain: PREROUTING,
                rules: self
                    .inbound_ports
                    .iter()
                    .map(|port| {
                        format!(
                            "-p tcp -m tcp --dport {port} -m mark ! --mark {mark} \
                             -j REDIRECT --to-ports {INBOUND_PLAINTEXT_PORT}"
                        )
                    })
                    .collect(),
            });
        }
        RuleSet {
            family,
            scope: Self::scope(),
            wanted,
        }
    }

    /// Every chain a host capture may own, so removal (or an inbound capture turned
    /// off) takes exactly these.
    pub fn scope() -> Vec<ChainRef> {
        vec![OUTPUT, PREROUTING]
    }

    /// What to remove: nothing wanted, every chain of [`HostCapture::scope`].
    pub fn removal(family: IpFamily) -> RuleSet {
        RuleSet {
            family,
            scope: Self::scope(),
            wanted: Vec::new(),
        }
    }
}

fn family_of(cidr: &IpNet) -> IpFamily {
    match cidr {
        IpNet::V4(_) => IpFamily::V4,
        IpNet::V6(_) => IpFamily::V6,
    }
}
