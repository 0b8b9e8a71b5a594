//! Nodes and pods as network namespaces: each node has a pod bridge, each pod a
//! veth on it, and nodes are joined by routed links. Nothing touches the root
//! namespace. (Redirection inside a pod is the mesh's own business: the tests program
//! it with the `inpod-redirect` crate.)

use anyhow::Result;

use crate::netns::{add_addr, Netns};

/// A node namespace with pod bridge `br0` on `10.244.<index>.1/24` (and
/// `fd00:10:244:<index>::1/64` when dual-stack).
pub struct Node {
    /// The node's number: the `<index>` of its pod CIDR.
    pub index: u8,
    /// The node's network namespace.
    pub ns: Netns,
    /// Whether its pods get an IPv6 address beside the IPv4 one.
    pub dual_stack: bool,
    next_pod: std::sync::atomic::AtomicU8,
}

/// A pod namespace with its addresses on its node's bridge.
pub struct Pod {
    /// The pod's name.
    pub name: String,
    /// The primary address: IPv4, or IPv6 for an IPv6-only pod.
    pub ip: String,
    /// The second address of a dual-stack pod (IPv6).
    pub ip6: Option<String>,
    /// The pod's network namespace.
    pub ns: Netns,
}

/// Which families a pod has addresses of.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Families {
    V4,
    /// IPv4 only, with IPv6 disabled in the namespace.
    V4NoIpv6,
    Dual,
    V6,
}

/// A dual-stack node's IPv6 pod prefix (without the length).
fn pod_prefix6(node: u8) -> String {
    format!("fd00:10:244:{node}::")
}

impl Node {
    /// An IPv4-only node namespace with its pod bridge up and forwarding on.
    pub fn new(tag: &str, index: u8) -> Result<Self> {
        Self::create(tag, index, false)
    }

    /// A node whose pods have an IPv6 address beside the IPv4 one.
    pub fn dual_stack(tag: &str, index: u8) -> Result<Self> {
        Self::create(tag, index, true)
    }

    fn create(tag: &str, index: u8, dual_stack: bool) -> Result<Self> {
        let ns = Netns::new(&format!("{tag}n{index}"))?;
        ns.exec(&["ip", "link", "add", "br0", "type", "bridge"])?;
        add_addr(&ns, &format!("10.244.{index}.1/24"), "br0")?;
        if dual_stack {
            add_addr(&ns, &format!("{}1/64", pod_prefix6(index)), "br0")?;
            ns.exec(&["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"])?;
        }
        ns.exec(&["ip", "link", "set", "br0", "up"])?;
        ns.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"])?;
        Ok(Node {
            index,
            ns,
            dual_stack,
            next_pod: std::sync::atomic::AtomicU8::new(10),
        })
    }

    /// Creates a pod namespace attached to this node's bridge (dual-stack on a
    /// dual-stack node).
    pub fn add_pod(&self, tag: &str, name: &str) -> Result<Pod> {
        let families = if self.dual_stack {
            Families::Dual
        } else {
            Families::V4
        };
        self.create_pod(tag, name, families)
    }

    /// A pod whose namespace has IPv6 disabled (`disable_ipv6` on every interface,
    /// so not even `::1` on `lo`), as some clusters run them.
    pub fn add_pod_without_ipv6(&self, tag: &str, name: &str) -> Result<Pod> {
        self.create_pod(tag, name, Families::V4NoIpv6)
    }

    /// A pod with an IPv6 address only (a dual-stack node's).
    pub fn add_pod_ipv6_only(&self, tag: &str, name: &str) -> Result<Pod> {
        anyhow::ensure!(self.dual_stack, "an IPv6-only pod needs a dual-stack node");
        self.create_pod(tag, name, Families::V6)
    }

    fn create_pod(&self, tag: &str, name: &str, families: Families) -> Result<Pod> {
        let n = self
            .next_pod
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let ns = Netns::new(&format!("{tag}{name}"))?;
        if families == Families::V4NoIpv6 {
            for conf in ["all", "default", "lo"] {
                ns.exec(&[
                    "sysctl",
                    "-qw",
                    &format!("net.ipv6.conf.{conf}.disable_ipv6=1"),
                ])?;
            }
        }
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
        let v4 = families != Families::V6;
        let v6 = matches!(families, Families::Dual | Families::V6);
        let ip4 = format!("10.244.{}.{n}", self.index);
        let ip6 = format!("{}{n:x}", pod_prefix6(self.index));
        if v4 {
            add_addr(&ns, &format!("{ip4}/24"), "eth0")?;
        }
        if v6 {
            add_addr(&ns, &format!("{ip6}/64"), "eth0")?;
        }
        ns.exec(&["ip", "link", "set", "eth0", "up"])?;
        if v4 {
            let gateway = format!("10.244.{}.1", self.index);
            ns.exec(&["ip", "route", "add", "default", "via", &gateway])?;
        }
        if v6 {
            let gateway = format!("{}1", pod_prefix6(self.index));
            ns.exec(&["ip", "-6", "route", "add", "default", "via", &gateway])?;
        }
        let (ip, ip6) = match families {
            Families::V6 => (ip6, None),
            Families::Dual => (ip4, Some(ip6)),
            Families::V4 | Families::V4NoIpv6 => (ip4, None),
        };
        Ok(Pod {
            name: name.to_owned(),
            ip,
            ip6,
            ns,
        })
    }
}

/// Joins two nodes with a routed link so their pod CIDRs reach each other (both
/// families when both nodes are dual-stack).
pub fn connect_nodes(a: &Node, b: &Node) -> Result<()> {
    let (a_ip, b_ip) = (format!("10.0.{}.1", b.index), format!("10.0.{}.2", b.index));
    let (a_ip6, b_ip6) = (
        format!("fd00:0:{}::1", b.index),
        format!("fd00:0:{}::2", b.index),
    );
    let (mut a_addrs, mut b_addrs) = (vec![format!("{a_ip}/30")], vec![format!("{b_ip}/30")]);
    let dual_stack = a.dual_stack && b.dual_stack;
    if dual_stack {
        a_addrs.push(format!("{a_ip6}/64"));
        b_addrs.push(format!("{b_ip6}/64"));
    }
    fn strs(v: &[String]) -> Vec<&str> {
        v.iter().map(String::as_str).collect()
    }
    crate::netns::link_addrs(&a.ns, &strs(&a_addrs), &b.ns, &strs(&b_addrs))?;
    if dual_stack {
        for (from, to, via) in [(a, b, &b_ip6), (b, a, &a_ip6)] {
            let dst = format!("{}/64", pod_prefix6(to.index));
            from.ns
                .exec(&["ip", "-6", "route", "add", &dst, "via", via])?;
        }
    }
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
