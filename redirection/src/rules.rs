//! Rule sets as values: which chains we own, which built-in chain jumps to each, and
//! the rules inside them. Nothing here touches the system; [`super::plan`] turns a
//! set plus the current `iptables-save` state into one `iptables-restore` input.
//!
//! Rules are written exactly as `iptables-save` prints them (`-m tcp` before
//! `--dport`, host masks `/32`, `--to-ports`), so a verified netns prints the same
//! text back and the golden files double as the expected `iptables-save` view.

use shared_types::constants::{
    CONNMARK, CONNMARK_MASK, DEFAULT_PACKET_MARK, DNS_CAPTURE_PORT, HBONE_PORT,
    INBOUND_PLAINTEXT_PORT, OUTBOUND_CAPTURE_PORT,
};
pub use shared_types::net::IpFamily;
use std::fmt::Write as _;

/// Our in-pod chain hooked from `PREROUTING` (same name in every table, like Istio).
pub const CHAIN_PREROUTING: &str = "ISTIO_PRERT";
/// Our in-pod chain hooked from `OUTPUT`.
pub const CHAIN_OUTPUT: &str = "ISTIO_OUTPUT";
/// Our host chain hooked from nat `POSTROUTING` (kubelet probe SNAT).
pub const CHAIN_HOST_POSTROUTING: &str = "ISTIO_POSTRT";
/// Mask `CONNMARK --restore-mark` uses for both sides, as Istio does.
const RESTORE_MASK: u32 = 0xffff_ffff;
/// The DNS port captured when DNS capture is on.
const DNS_PORT: u16 = 53;

/// The netfilter tables we put chains in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Table {
    /// `mangle`: ztunnel's connection mark.
    Mangle,
    /// `nat`: the capture redirects (on the host, the probe SNAT).
    Nat,
    /// `raw`: DNS conntrack zones, with DNS capture.
    Raw,
}

impl Table {
    /// Every table, in the order they are rendered and compared.
    pub const ALL: [Table; 3] = [Table::Mangle, Table::Nat, Table::Raw];

    /// The table's name, as iptables spells it.
    pub fn name(self) -> &'static str {
        match self {
            Table::Mangle => "mangle",
            Table::Nat => "nat",
            Table::Raw => "raw",
        }
    }
}

/// A chain we may own: where it lives and which built-in chain jumps to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ChainRef {
    /// The table it lives in.
    pub table: Table,
    /// The chain's name.
    pub name: &'static str,
    /// The built-in chain holding our single `-j <name>` jump.
    pub hook: &'static str,
}

/// A chain we want, with its rules (the text after `-A <chain> `), in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainRules {
    /// The chain.
    pub chain: ChainRef,
    /// Its rule specs, in order.
    pub rules: Vec<String>,
}

/// Everything one IP family should have, plus the wider scope of chains we own
/// (so leftovers, e.g. `raw` chains after DNS capture was turned off, are removed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleSet {
    /// The family (`iptables` or `ip6tables`).
    pub family: IpFamily,
    /// Every chain that is ours in this netns, wanted now or not.
    pub scope: Vec<ChainRef>,
    /// The chains wanted now, in the order they are rendered.
    pub wanted: Vec<ChainRules>,
}

impl RuleSet {
    /// The wanted chains of `table`.
    pub fn wanted_in(&self, table: Table) -> impl Iterator<Item = &ChainRules> {
        self.wanted.iter().filter(move |c| c.chain.table == table)
    }

    /// The owned chains of `table`.
    pub fn scope_in(&self, table: Table) -> impl Iterator<Item = &ChainRef> {
        self.scope.iter().filter(move |c| c.table == table)
    }

    /// Whether `name` is one of our chains in `table`.
    pub fn owns(&self, table: Table, name: &str) -> bool {
        self.scope_in(table).any(|c| c.name == name)
    }

    /// `iptables-restore` input for a netns that has none of our chains yet: the
    /// golden text, and what `iptables-save` prints back for our part.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for table in Table::ALL {
            let chains: Vec<&ChainRules> = self.wanted_in(table).collect();
            if chains.is_empty() {
                continue;
            }
            let _ = writeln!(out, "*{}", table.name());
            for c in &chains {
                let _ = writeln!(out, ":{} - [0:0]", c.chain.name);
            }
            for c in &chains {
                let _ = writeln!(out, "-A {} -j {}", c.chain.hook, c.chain.name);
            }
            for c in &chains {
                for rule in &c.rules {
                    let _ = writeln!(out, "-A {} {rule}", c.chain.name);
                }
            }
            out.push_str("COMMIT\n");
        }
        out
    }
}

/// Ports ztunnel listens on inside the pod netns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InpodPorts {
    /// Outbound capture port (`15001`).
    pub outbound: u16,
    /// Inbound plaintext capture port (`15006`).
    pub inbound_plaintext: u16,
    /// HBONE port (`15008`), never redirected inbound.
    pub hbone: u16,
    /// DNS proxy port (`15053`).
    pub dns: u16,
}

impl Default for InpodPorts {
    fn default() -> Self {
        InpodPorts {
            outbound: OUTBOUND_CAPTURE_PORT,
            inbound_plaintext: INBOUND_PLAINTEXT_PORT,
            hbone: HBONE_PORT,
            dns: DNS_CAPTURE_PORT,
        }
    }
}

/// Istio's in-pod redirection for one pod, from the agent config and pod annotations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InpodRules {
    /// Also program ip6tables (and the IPv6 local route).
    pub ipv6: bool,
    /// `ambient.istio.io/dns-capture`: redirect DNS to ztunnel's DNS proxy.
    pub dns_capture: bool,
    /// False when the pod has `ambient.istio.io/bypass-inbound-capture=true`.
    pub inbound_capture: bool,
    /// ztunnel's `SO_MARK` (`PACKET_MARK`).
    pub packet_mark: u32,
    /// The ports ztunnel listens on.
    pub ports: InpodPorts,
}

impl Default for InpodRules {
    fn default() -> Self {
        InpodRules {
            ipv6: false,
            dns_capture: false,
            inbound_capture: true,
            packet_mark: DEFAULT_PACKET_MARK,
            ports: InpodPorts::default(),
        }
    }
}

impl InpodRules {
    /// The families this pod is programmed for.
    pub fn families(&self) -> Vec<IpFamily> {
        if self.ipv6 {
            vec![IpFamily::V4, IpFamily::V6]
        } else {
            vec![IpFamily::V4]
        }
    }

    /// The chains every in-pod rule set may own (mangle, nat, raw).
    pub fn scope() -> Vec<ChainRef> {
        Table::ALL
            .iter()
            .flat_map(|&table| {
                [
                    ChainRef {
                        table,
                        name: CHAIN_PREROUTING,
                        hook: "PREROUTING",
                    },
                    ChainRef {
                        table,
                        name: CHAIN_OUTPUT,
                        hook: "OUTPUT",
                    },
                ]
            })
            .collect()
    }

    /// The rule set for one family: Istio's default in-pod rules (REDIRECT mode).
    pub fn rule_set(&self, family: IpFamily) -> RuleSet {
        let mark = format!("{:#x}/{CONNMARK_MASK:#x}", self.packet_mark);
        let connmark = format!("{CONNMARK:#x}/{CONNMARK_MASK:#x}");
        let lo = family.loopback_cidr();
        let snat = family.probe_snat_cidr();
        let p = self.ports;
        let chain = |table, name, hook| ChainRef { table, name, hook };
        let prert = |table| chain(table, CHAIN_PREROUTING, "PREROUTING");
        let output = |table| chain(table, CHAIN_OUTPUT, "OUTPUT");

        let mut mangle_prert = Vec::new();
        let mut nat_prert = Vec::new();
        if self.inbound_capture {
            // Packets from ztunnel's own sockets tag their connection.
            mangle_prert.push(format!(
                "-m mark --mark {mark} -j CONNMARK --set-xmark {connmark}"
            ));
            // Kubelet probes (SNATed on the node) skip capture.
            nat_prert.push(format!("-s {snat} -p tcp -m tcp -j ACCEPT"));
            // Everything else not for localhost or HBONE goes to the plaintext port.
            nat_prert.push(format!(
                "! -d {lo} -p tcp -m tcp ! --dport {} -m mark ! --mark {mark} -j REDIRECT --to-ports {}",
                p.hbone, p.inbound_plaintext
            ));
        }
        let mangle_output = vec![format!(
            "-m connmark --mark {connmark} -j CONNMARK --restore-mark --nfmask {RESTORE_MASK:#x} --ctmask {RESTORE_MASK:#x}"
        )];
        let mut nat_output = vec![format!("-d {snat} -p tcp -m tcp -j ACCEPT")];
        let mut raw = Vec::new();
        if self.dns_capture {
            nat_output.push(format!(
                "! -o lo -p udp -m mark ! --mark {mark} -m udp --dport {DNS_PORT} -j REDIRECT --to-ports {}",
                p.dns
            ));
            nat_output.push(format!(
                "! -d {lo} -p tcp -m tcp --dport {DNS_PORT} -m mark ! --mark {mark} -j REDIRECT --to-ports {}",
                p.dns
            ));
            // Proxy <-> upstream DNS in their own conntrack zone (istio/istio#33469).
            raw.push(ChainRules {
                chain: prert(Table::Raw),
                rules: vec![format!(
                    "-p udp -m mark ! --mark {mark} -m udp --sport {DNS_PORT} -j CT --zone 1"
                )],
            });
            raw.push(ChainRules {
                chain: output(Table::Raw),
                rules: vec![format!(
                    "-p udp -m mark --mark {mark} -m udp --dport {DNS_PORT} -j CT --zone 1"
                )],
            });
        }
        nat_output.push(format!("-p tcp -m mark --mark {connmark} -j ACCEPT"));
        nat_output.push(format!("! -d {lo} -o lo -j ACCEPT"));
        nat_output.push(format!(
            "! -d {lo} -p tcp -m mark ! --mark {mark} -j REDIRECT --to-ports {}",
            p.outbound
        ));

        let mut wanted = vec![
            ChainRules {
                chain: prert(Table::Mangle),
                rules: mangle_prert,
            },
            ChainRules {
                chain: output(Table::Mangle),
                rules: mangle_output,
            },
            ChainRules {
                chain: prert(Table::Nat),
                rules: nat_prert,
            },
            ChainRules {
                chain: output(Table::Nat),
                rules: nat_output,
            },
        ];
        wanted.extend(raw);
        RuleSet {
            family,
            scope: Self::scope(),
            wanted,
        }
    }

    /// One rule set per family this pod is programmed for.
    pub fn rule_sets(&self) -> Vec<RuleSet> {
        self.families()
            .into_iter()
            .map(|f| self.rule_set(f))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_v4_matches_istio_compat_rules() {
        let text = InpodRules::default().rule_set(IpFamily::V4).render();
        assert!(text.contains(
            "-A ISTIO_PRERT ! -d 127.0.0.1/32 -p tcp -m tcp ! --dport 15008 -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15006\n"
        ));
        assert!(text.contains("-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -o lo -j ACCEPT\n"));
        assert!(!text.contains("*raw"), "{text}");
        assert!(!text.contains("15053"));
    }

    #[test]
    fn bypass_inbound_keeps_jumps_but_no_inbound_rules() {
        let rules = InpodRules {
            inbound_capture: false,
            ..Default::default()
        };
        let set = rules.rule_set(IpFamily::V4);
        let prert: Vec<_> = set
            .wanted
            .iter()
            .filter(|c| c.chain.name == CHAIN_PREROUTING)
            .collect();
        assert_eq!(prert.len(), 2);
        assert!(prert.iter().all(|c| c.rules.is_empty()));
        assert!(set.render().contains("-A PREROUTING -j ISTIO_PRERT\n"));
    }

    #[test]
    fn v6_uses_v6_loopback_and_probe_address() {
        let text = InpodRules {
            ipv6: true,
            ..Default::default()
        }
        .rule_set(IpFamily::V6)
        .render();
        assert!(text.contains("! -d ::1/128"));
        assert!(text.contains("-s fd16:9254:7127:1337:ffff:ffff:ffff:ffff/128"));
        assert!(!text.contains("127.0.0.1"));
    }

    #[test]
    fn scope_covers_all_tables_even_without_dns() {
        let set = InpodRules::default().rule_set(IpFamily::V4);
        assert!(set.owns(Table::Raw, CHAIN_OUTPUT));
        assert_eq!(set.scope.len(), 6);
    }
}
