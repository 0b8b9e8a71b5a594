//! Nodes and pods as network namespaces: each node has a pod bridge, each pod a
//! veth on it, and nodes are joined by routed links. Nothing touches the root
//! namespace.

use anyhow::Result;
use cni_agent::redirect::rules::{InpodRules, IpFamily};

use crate::netns::Netns;

/// A node namespace with pod bridge `br0` on `10.244.<index>.1/24`.
pub struct Node {
    pub index: u8,
    pub ns: Netns,
    next_pod: std::sync::atomic::AtomicU8,
}

/// A pod namespace with one address on its node's bridge.
pub struct Pod {
    pub name: String,
    pub ip: String,
    pub ns: Netns,
}

impl Node {
    pub fn new(tag: &str, index: u8) -> Result<Self> {
        let ns = Netns::new(&format!("{tag}n{index}"))?;
        ns.exec(&["ip", "link", "add", "br0", "type", "bridge"])?;
        ns.exec(&[
            "ip",
            "addr",
            "add",
            &format!("10.244.{index}.1/24"),
            "dev",
            "br0",
        ])?;
        ns.exec(&["ip", "link", "set", "br0", "up"])?;
        ns.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"])?;
        Ok(Node {
            index,
            ns,
            next_pod: std::sync::atomic::AtomicU8::new(10),
        })
    }

    /// Creates a pod namespace attached to this node's bridge.
    pub fn add_pod(&self, tag: &str, name: &str) -> Result<Pod> {
        let n = self
            .next_pod
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let ip = format!("10.244.{}.{n}", self.index);
        let ns = Netns::new(&format!("{tag}{name}"))?;
        let host_if = format!("vp{n}");
        self.ns.exec(&[
            "ip",
            "link",
            "add",
            &host_if,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            ns.name(),
        ])?;
        self.ns
            .exec(&["ip", "link", "set", &host_if, "master", "br0", "up"])?;
        ns.exec(&["ip", "addr", "add", &format!("{ip}/24"), "dev", "eth0"])?;
        ns.exec(&["ip", "link", "set", "eth0", "up"])?;
        ns.exec(&[
            "ip",
            "route",
            "add",
            "default",
            "via",
            &format!("10.244.{}.1", self.index),
        ])?;
        Ok(Pod {
            name: name.to_owned(),
            ip,
            ns,
        })
    }
}

/// Joins two nodes with a routed link so their pod CIDRs reach each other.
pub fn connect_nodes(a: &Node, b: &Node) -> Result<()> {
    let (a_ip, b_ip) = (format!("10.0.{}.1", b.index), format!("10.0.{}.2", b.index));
    crate::netns::link(&a.ns, &format!("{a_ip}/30"), &b.ns, &format!("{b_ip}/30"))?;
    a.ns.exec(&[
        "ip",
        "route",
        "add",
        &format!("10.244.{}.0/24", b.index),
        "via",
        &b_ip,
    ])?;
    b.ns.exec(&[
        "ip",
        "route",
        "add",
        &format!("10.244.{}.0/24", a.index),
        "via",
        &a_ip,
    ])?;
    Ok(())
}

/// Istio's default in-pod rule set (istio-compat.md), loaded in one
/// `iptables-restore --noflush` transaction, plus the policy route for ztunnel's
/// transparent sockets. The node agent programs exactly this.
pub const ISTIO_INPOD_RULES: &str = "\
*mangle
-N ISTIO_PRERT
-N ISTIO_OUTPUT
-A PREROUTING -j ISTIO_PRERT
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_PRERT -m mark --mark 0x539/0xfff -j CONNMARK --set-xmark 0x111/0xfff
-A ISTIO_OUTPUT -m connmark --mark 0x111/0xfff -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff
COMMIT
*nat
-N ISTIO_PRERT
-N ISTIO_OUTPUT
-A PREROUTING -j ISTIO_PRERT
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_PRERT -s 169.254.7.127 -p tcp -m tcp -j ACCEPT
-A ISTIO_OUTPUT -d 169.254.7.127 -p tcp -m tcp -j ACCEPT
-A ISTIO_PRERT ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15006
-A ISTIO_OUTPUT -p tcp -m mark --mark 0x111/0xfff -j ACCEPT
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -o lo -j ACCEPT
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -p tcp -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15001
COMMIT
";

impl Pod {
    /// Programs Istio's in-pod redirection, as the node agent would.
    pub fn capture(&self) -> Result<()> {
        self.restore("iptables-restore", ISTIO_INPOD_RULES)?;
        self.policy_route(IpFamily::V4)
    }

    /// Programs the rules the node agent itself renders for `rules` (e.g. with DNS
    /// capture), one `iptables-restore` transaction per family as the agent applies
    /// them to a fresh pod, plus the policy route for ztunnel's transparent sockets.
    pub fn capture_with(&self, rules: &InpodRules) -> Result<()> {
        for set in rules.rule_sets() {
            let program = match set.family {
                IpFamily::V4 => "iptables-restore",
                IpFamily::V6 => "ip6tables-restore",
            };
            self.restore(program, &set.render())?;
            self.policy_route(set.family)?;
        }
        Ok(())
    }

    /// Loads `text` with `program --noflush` inside the pod.
    fn restore(&self, program: &str, text: &str) -> Result<()> {
        let mut child = self
            .ns
            .command(program)
            .arg("--noflush")
            .stdin(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        use std::io::Write;
        child
            .stdin
            .take()
            .ok_or_else(|| anyhow::anyhow!("no stdin"))?
            .write_all(text.as_bytes())?;
        let out = child.wait_with_output()?;
        if !out.status.success() {
            anyhow::bail!(
                "{program} failed in {}: {}\ninput:\n{text}",
                self.ns.name(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }

    /// Istio's policy route: connmarked packets are delivered locally (table 100).
    fn policy_route(&self, family: IpFamily) -> Result<()> {
        let (flag, any) = match family {
            IpFamily::V4 => ("-4", "0.0.0.0/0"),
            IpFamily::V6 => ("-6", "::/0"),
        };
        self.ns.exec(&[
            "ip",
            flag,
            "rule",
            "add",
            "fwmark",
            "0x111/0xfff",
            "pref",
            "32764",
            "lookup",
            "100",
        ])?;
        self.ns.exec(&[
            "ip", flag, "route", "add", "local", any, "dev", "lo", "table", "100",
        ])?;
        Ok(())
    }
}
