//! Traffic capture for dedicated mode (a VM or bare host): the iptables rules that
//! send the host's outbound TCP to ztunnel, so existing applications need no change.
//!
//! The rule set is a value rendered to `iptables-restore` input and applied in one
//! transaction; removal deletes exactly what apply added.

use std::fmt::Write as _;
use std::io::Write as _;
use std::process::{Command, Stdio};

use ipnet::IpNet;
use shared_types::constants::{INBOUND_PLAINTEXT_PORT, OUTBOUND_CAPTURE_PORT};

/// Chain names follow Istio's.
pub const OUTPUT_CHAIN: &str = "ISTIO_OUTPUT";
pub const PREROUTING_CHAIN: &str = "ISTIO_PRERT";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    fn restore(self) -> &'static str {
        match self {
            Family::V4 => "iptables-restore",
            Family::V6 => "ip6tables-restore",
        }
    }
    fn iptables(self) -> &'static str {
        match self {
            Family::V4 => "iptables",
            Family::V6 => "ip6tables",
        }
    }
    fn loopback(self) -> &'static str {
        match self {
            Family::V4 => "127.0.0.0/8",
            Family::V6 => "::1/128",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("running {0}: {1}")]
    Spawn(&'static str, std::io::Error),
    #[error("{0} failed: {1}")]
    Failed(&'static str, String),
}

/// The host capture rule set of a dedicated ztunnel.
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

impl HostCapture {
    /// `iptables-restore --noflush` input. Declaring the chains flushes them, so a
    /// re-apply replaces the rules; `with_jumps` adds the jumps from the built-in
    /// chains (left out when they already exist, so they are never doubled).
    pub fn render(&self, family: Family, with_jumps: bool) -> String {
        let mut out = String::from("*nat\n");
        let _ = writeln!(out, ":{OUTPUT_CHAIN} - [0:0]");
        let _ = writeln!(out, ":{PREROUTING_CHAIN} - [0:0]");
        if with_jumps {
            let _ = writeln!(out, "-A OUTPUT -p tcp -j {OUTPUT_CHAIN}");
            let _ = writeln!(out, "-A PREROUTING -p tcp -j {PREROUTING_CHAIN}");
        }
        let mark = format!("{:#x}/{:#x}", self.mark, 0xfff);
        let _ = writeln!(out, "-A {OUTPUT_CHAIN} -m mark --mark {mark} -j RETURN");
        let _ = writeln!(out, "-A {OUTPUT_CHAIN} -d {} -j RETURN", family.loopback());
        let _ = writeln!(out, "-A {OUTPUT_CHAIN} -o lo -j RETURN");
        for cidr in self
            .exclude_cidrs
            .iter()
            .filter(|c| matches_family(c, family))
        {
            let _ = writeln!(out, "-A {OUTPUT_CHAIN} -d {cidr} -j RETURN");
        }
        for port in &self.exclude_ports {
            let _ = writeln!(
                out,
                "-A {OUTPUT_CHAIN} -p tcp -m tcp --dport {port} -j RETURN"
            );
        }
        let _ = writeln!(
            out,
            "-A {OUTPUT_CHAIN} -p tcp -j REDIRECT --to-ports {OUTBOUND_CAPTURE_PORT}"
        );
        for port in &self.inbound_ports {
            let _ = writeln!(
                out,
                "-A {PREROUTING_CHAIN} -p tcp -m tcp --dport {port} -m mark ! --mark {mark} -j REDIRECT --to-ports {INBOUND_PLAINTEXT_PORT}"
            );
        }
        out.push_str("COMMIT\n");
        out
    }

    /// Installs (or replaces) the rules in one transaction.
    pub fn apply(&self, family: Family) -> Result<(), CaptureError> {
        let jumps_present = jump_exists(family, "OUTPUT", OUTPUT_CHAIN)?;
        restore(family, &self.render(family, !jumps_present))
    }

    /// Removes the jumps and our chains; leaves every other rule untouched.
    pub fn remove(family: Family) -> Result<(), CaptureError> {
        let mut input = String::from("*nat\n");
        if jump_exists(family, "OUTPUT", OUTPUT_CHAIN)? {
            let _ = writeln!(input, "-D OUTPUT -p tcp -j {OUTPUT_CHAIN}");
        }
        if jump_exists(family, "PREROUTING", PREROUTING_CHAIN)? {
            let _ = writeln!(input, "-D PREROUTING -p tcp -j {PREROUTING_CHAIN}");
        }
        for chain in [OUTPUT_CHAIN, PREROUTING_CHAIN] {
            if chain_exists(family, chain)? {
                let _ = writeln!(input, "-F {chain}\n-X {chain}");
            }
        }
        input.push_str("COMMIT\n");
        restore(family, &input)
    }
}

fn matches_family(cidr: &IpNet, family: Family) -> bool {
    matches!(
        (cidr, family),
        (IpNet::V4(_), Family::V4) | (IpNet::V6(_), Family::V6)
    )
}

fn restore(family: Family, input: &str) -> Result<(), CaptureError> {
    let tool = family.restore();
    let mut child = Command::new(tool)
        .arg("--noflush")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| CaptureError::Spawn(tool, e))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(input.as_bytes())
            .map_err(|e| CaptureError::Spawn(tool, e))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| CaptureError::Spawn(tool, e))?;
    if !out.status.success() {
        return Err(CaptureError::Failed(
            tool,
            String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        ));
    }
    Ok(())
}

fn jump_exists(family: Family, from: &str, chain: &str) -> Result<bool, CaptureError> {
    let tool = family.iptables();
    let status = Command::new(tool)
        .args(["-w", "-t", "nat", "-C", from, "-p", "tcp", "-j", chain])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| CaptureError::Spawn(tool, e))?;
    Ok(status.success())
}

fn chain_exists(family: Family, chain: &str) -> Result<bool, CaptureError> {
    let tool = family.iptables();
    let status = Command::new(tool)
        .args(["-w", "-t", "nat", "-n", "-L", chain])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| CaptureError::Spawn(tool, e))?;
    Ok(status.success())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_golden_rule_set() {
        let capture = HostCapture {
            mark: 0x539,
            exclude_cidrs: vec![
                "169.254.169.254/32".parse().unwrap(),
                "fd00::/8".parse().unwrap(),
            ],
            exclude_ports: vec![22],
            inbound_ports: vec![8080],
        };
        let golden = include_str!("../testdata/capture-v4.golden");
        assert_eq!(capture.render(Family::V4, true), golden);
        let v6 = capture.render(Family::V6, false);
        assert!(v6.contains("-d ::1/128 -j RETURN"));
        assert!(v6.contains("-d fd00::/8 -j RETURN"));
        assert!(!v6.contains("169.254"));
        assert!(!v6.contains("-A OUTPUT"));
    }
}
