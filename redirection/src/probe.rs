//! The kubelet probe path on the NODE (run in the host netns): kubelet's probes to an
//! enrolled pod are SNATed to `169.254.7.127` (IPv6 `fd16:9254:7127:1337:ffff:ffff:ffff:ffff`)
//! so the in-pod rules can let them through uncaptured, while forwarded traffic
//! (kube-proxy, no local socket) keeps its source and is captured.
//!
//! As Istio does: an ipset `istio-inpod-probes-v4` (`-v6`) of enrolled pod IPs, each
//! entry commented with the pod UID, and in nat `POSTROUTING` a jump to our chain
//! `ISTIO_POSTRT` holding
//! `-p tcp -m owner --socket-exists -m set --match-set istio-inpod-probes-v4 dst -j SNAT --to-source 169.254.7.127`.
//! Sets are created, listed and destroyed with the `ipset` CLI (Debian package
//! `ipset`), members added and deleted over netlink ([`super::ipset`]); rules go
//! through the same one-transaction path as the in-pod rules.
//!
//! In nftables mode the same lives in the host's `inet istio-ambient-nat` table
//! ([`super::nft::HostProbe`]): nftables sets, and a rule matching kubelet's uid.

use super::iptables::{self, IptablesError};
use super::nft::{HostProbe, NftError};
use super::plan::CheckResult;
use super::rules::{ChainRef, ChainRules, IpFamily, RuleSet, Table, CHAIN_HOST_POSTROUTING};
use super::Mode;
use std::net::IpAddr;
use std::process::Command;

/// The IPv4 probe set's name (an ipset, or an nftables set in nftables mode).
pub const PROBE_IPSET_V4: &str = "istio-inpod-probes-v4";
/// The IPv6 probe set's name (an ipset, or an nftables set in nftables mode).
pub const PROBE_IPSET_V6: &str = "istio-inpod-probes-v6";
/// Longest comment the kernel stores on a set entry.
const MAX_COMMENT: usize = 255;

/// Why the probe SNAT could not be read or changed.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The `ipset` CLI could not be run.
    #[error("running ipset {args}: {source}")]
    Spawn {
        /// Its arguments.
        args: String,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// The `ipset` CLI exited unsuccessfully.
    #[error("ipset {args} failed: {stderr}")]
    Ipset {
        /// Its arguments.
        args: String,
        /// Its standard error, trimmed.
        stderr: String,
    },
    /// Converging, checking or removing the host rules with iptables failed.
    #[error(transparent)]
    Iptables(#[from] IptablesError),
    /// A netlink request (nf_tables, or an ipset member's add or delete) failed, or the
    /// nftables host table did not converge.
    #[error(transparent)]
    Nftables(#[from] NftError),
    /// A pod UID is empty, longer than 255 bytes, or has characters other than ASCII
    /// letters, digits, `-`, `_` and `.`.
    #[error("pod UID {0:?} is not a valid set comment")]
    InvalidUid(String),
}

/// One member of a probe set: a pod IP and the UID it was added for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeEntry {
    /// The pod IP.
    pub ip: IpAddr,
    /// The pod UID from the entry's comment, if any.
    pub uid: Option<String>,
}

/// Where the host's probe SNAT lives in the node's mode.
enum HostRules {
    Iptables(super::Backend),
    Nftables(HostProbe),
}

/// The node's probe SNAT: the sets and the SNAT rules of each family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeSnat {
    /// The node's mode: ipset and iptables, or nftables.
    pub mode: Mode,
    /// Also program the IPv6 set and rule.
    pub ipv6: bool,
    /// Kubelet's uid, which the nftables rule matches (iptables matches any local socket).
    pub kubelet_uid: u32,
}

impl ProbeSnat {
    /// Kubelet's uid defaults to root's, as kubelet runs nearly everywhere.
    pub fn new(mode: Mode, ipv6: bool) -> Self {
        ProbeSnat {
            mode,
            ipv6,
            kubelet_uid: 0,
        }
    }

    fn host_rules(&self) -> HostRules {
        match self.mode {
            Mode::Iptables(backend) => HostRules::Iptables(backend),
            Mode::Nftables { .. } => HostRules::Nftables(HostProbe {
                ipv6: self.ipv6,
                kubelet_uid: self.kubelet_uid,
            }),
        }
    }

    /// The probe set's name for `family`.
    pub fn set_name(family: IpFamily) -> &'static str {
        match family {
            IpFamily::V4 => PROBE_IPSET_V4,
            IpFamily::V6 => PROBE_IPSET_V6,
        }
    }

    /// The families programmed: IPv4, plus IPv6 when `ipv6`.
    pub fn families(&self) -> Vec<IpFamily> {
        if self.ipv6 {
            vec![IpFamily::V4, IpFamily::V6]
        } else {
            vec![IpFamily::V4]
        }
    }

    /// The host rule set of one family (as `iptables-save` prints it).
    pub fn rule_set(family: IpFamily) -> RuleSet {
        let chain = ChainRef {
            table: Table::Nat,
            name: CHAIN_HOST_POSTROUTING,
            hook: "POSTROUTING",
        };
        let rule = format!(
            "-p tcp -m owner --socket-exists -m set --match-set {} dst -j SNAT --to-source {}",
            Self::set_name(family),
            family.probe_snat()
        );
        RuleSet {
            family,
            scope: vec![chain],
            wanted: vec![ChainRules {
                chain,
                rules: vec![rule],
            }],
        }
    }

    /// Creates the sets (kept with their members if present), then converges the
    /// rules in one restore per family (one batch in nftables mode). Idempotent.
    pub fn install(&self) -> Result<(), ProbeError> {
        let backend = match self.host_rules() {
            HostRules::Iptables(backend) => backend,
            HostRules::Nftables(nft) => return Ok(nft.install()?),
        };
        // A node moved back from nftables mode: its host table goes once ours is in.
        let leftover = HostProbe {
            ipv6: true,
            kubelet_uid: self.kubelet_uid,
        };
        for family in self.families() {
            let inet = match family {
                IpFamily::V4 => "inet",
                IpFamily::V6 => "inet6",
            };
            ipset(&[
                "create",
                Self::set_name(family),
                "hash:ip",
                "family",
                inet,
                "comment",
                "-exist",
            ])?;
            iptables::apply(backend, &Self::rule_set(family))?;
        }
        if let Err(e) = leftover.uninstall() {
            // A kernel without nf_tables has no nftables-mode table to take down.
            tracing::debug!(error = %e, "no nftables host table removed");
        }
        Ok(())
    }

    /// Compares the host rules with the wanted ones (sets are not inspected).
    pub fn check(&self) -> Result<CheckResult, ProbeError> {
        let backend = match self.host_rules() {
            HostRules::Iptables(backend) => backend,
            HostRules::Nftables(nft) => return Ok(nft.check()?),
        };
        let mut results = Vec::new();
        for family in self.families() {
            results.push(iptables::check(backend, &Self::rule_set(family))?);
        }
        Ok(CheckResult::combine(results))
    }

    /// Adds (or re-labels) a pod IP. An IPv6 address while IPv6 is off is skipped;
    /// returns whether the IP was added.
    pub fn add_pod(&self, ip: IpAddr, uid: &str) -> Result<bool, ProbeError> {
        let family = IpFamily::of(&ip);
        if family == IpFamily::V6 && !self.ipv6 {
            return Ok(false);
        }
        if uid.is_empty()
            || uid.len() > MAX_COMMENT
            || !uid
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return Err(ProbeError::InvalidUid(uid.to_owned()));
        }
        if let HostRules::Nftables(nft) = self.host_rules() {
            nft.add(ip, uid)?;
            return Ok(true);
        }
        super::ipset::add(Self::set_name(family), ip, uid)?;
        Ok(true)
    }

    /// Removes a pod IP; an absent IP (or set) is fine.
    pub fn remove_pod(&self, ip: IpAddr) -> Result<(), ProbeError> {
        if let HostRules::Nftables(nft) = self.host_rules() {
            return Ok(nft.remove(ip)?);
        }
        match super::ipset::del(Self::set_name(IpFamily::of(&ip)), ip) {
            Err(NftError::Rejected { source, .. })
                if source.raw_os_error() == Some(libc::ENOENT) =>
            {
                Ok(()) // no such set
            }
            other => Ok(other?),
        }
    }

    /// Removes every IP added for pod `uid` (when its IPs are no longer known).
    pub fn remove_pod_uid(&self, uid: &str) -> Result<Vec<IpAddr>, ProbeError> {
        let mut removed = Vec::new();
        for family in self.families() {
            for entry in self.members(family)? {
                if entry.uid.as_deref() == Some(uid) {
                    self.remove_pod(entry.ip)?;
                    removed.push(entry.ip);
                }
            }
        }
        Ok(removed)
    }

    /// The members of one family's set (empty if the set does not exist).
    pub fn members(&self, family: IpFamily) -> Result<Vec<ProbeEntry>, ProbeError> {
        if let HostRules::Nftables(nft) = self.host_rules() {
            return Ok(nft.members(family)?);
        }
        if !self.set_exists(family)? {
            return Ok(Vec::new());
        }
        let text = ipset(&["list", Self::set_name(family), "-output", "save"])?;
        Ok(parse_members(&text))
    }

    /// Removes the rules and chain of every family (v4 and v6, whatever `ipv6` says),
    /// then destroys the sets.
    pub fn uninstall(&self) -> Result<(), ProbeError> {
        let backend = match self.host_rules() {
            HostRules::Iptables(backend) => backend,
            HostRules::Nftables(nft) => return Ok(nft.uninstall()?),
        };
        for family in [IpFamily::V4, IpFamily::V6] {
            iptables::remove(backend, &Self::rule_set(family))?;
        }
        for family in [IpFamily::V4, IpFamily::V6] {
            if self.set_exists(family)? {
                ipset(&["destroy", Self::set_name(family)])?;
            }
        }
        Ok(())
    }

    /// Whether the host has either iptables-mode probe ipset.
    pub fn ipsets_exist() -> Result<bool, ProbeError> {
        let names = ipset(&["list", "-name"])?;
        Ok(names
            .lines()
            .any(|n| [PROBE_IPSET_V4, PROBE_IPSET_V6].contains(&n.trim())))
    }

    fn set_exists(&self, family: IpFamily) -> Result<bool, ProbeError> {
        let names = ipset(&["list", "-name"])?;
        Ok(names.lines().any(|n| n.trim() == Self::set_name(family)))
    }
}

/// Parses `ipset list <set> -output save`: `add <set> <ip> [comment "<uid>"]` lines.
fn parse_members(text: &str) -> Vec<ProbeEntry> {
    text.lines()
        .filter_map(|line| {
            let mut tokens = line.split_whitespace();
            if tokens.next() != Some("add") {
                return None;
            }
            let _set = tokens.next()?;
            let ip: IpAddr = tokens.next()?.parse().ok()?;
            let mut uid = None;
            while let Some(t) = tokens.next() {
                if t == "comment" {
                    uid = tokens.next().map(|c| c.trim_matches('"').to_owned());
                }
            }
            Some(ProbeEntry { ip, uid })
        })
        .collect()
}

/// Runs the `ipset` CLI in the current thread's netns, returning stdout.
fn ipset(args: &[&str]) -> Result<String, ProbeError> {
    let joined = args.join(" ");
    let out = Command::new("ipset")
        .args(args)
        .output()
        .map_err(|source| ProbeError::Spawn {
            args: joined.clone(),
            source,
        })?;
    if !out.status.success() {
        return Err(ProbeError::Ipset {
            args: joined,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_rule_is_istios_probe_snat() {
        let text = ProbeSnat::rule_set(IpFamily::V4).render();
        assert_eq!(
            text,
            "*nat\n:ISTIO_POSTRT - [0:0]\n-A POSTROUTING -j ISTIO_POSTRT\n\
             -A ISTIO_POSTRT -p tcp -m owner --socket-exists -m set --match-set istio-inpod-probes-v4 dst -j SNAT --to-source 169.254.7.127\nCOMMIT\n"
        );
        assert!(ProbeSnat::rule_set(IpFamily::V6)
            .render()
            .contains("istio-inpod-probes-v6 dst -j SNAT --to-source fd16:9254:7127:1337:ffff:ffff:ffff:ffff\n"));
    }

    #[test]
    fn parses_set_members() {
        let text = "create istio-inpod-probes-v4 hash:ip family inet hashsize 1024 maxelem 65536 comment\n\
                    add istio-inpod-probes-v4 10.244.1.10 comment \"uid-1\"\n\
                    add istio-inpod-probes-v4 10.244.1.11\n\
                    add istio-inpod-probes-v4 not-an-ip\n";
        assert_eq!(
            parse_members(text),
            [
                ProbeEntry {
                    ip: "10.244.1.10".parse().unwrap(),
                    uid: Some("uid-1".into())
                },
                ProbeEntry {
                    ip: "10.244.1.11".parse().unwrap(),
                    uid: None
                },
            ]
        );
    }

    #[test]
    fn rejects_uids_that_are_not_plain_names() {
        let probe = ProbeSnat::new(Mode::Iptables(super::super::Backend::Nft), false);
        let err = probe
            .add_pod("10.0.0.1".parse().unwrap(), "a\" b")
            .unwrap_err();
        assert!(matches!(err, ProbeError::InvalidUid(_)));
        // IPv6 is off: skipped before any command runs.
        assert!(!probe.add_pod("fd00::1".parse().unwrap(), "uid").unwrap());
    }
}
