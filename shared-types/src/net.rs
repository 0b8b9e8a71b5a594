//! IP families, as every part of the mesh names them: Kubernetes (`IPv4`/`IPv6` in a
//! Service's `ipFamilies`), the iptables tools (`iptables`/`ip6tables`) and logs.

use std::fmt;
use std::net::IpAddr;

use crate::constants::{PROBE_SNAT_IPV4, PROBE_SNAT_IPV6};

/// IPv4 or IPv6.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IpFamily {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

impl IpFamily {
    /// Both families, IPv4 first.
    pub const BOTH: [IpFamily; 2] = [IpFamily::V4, IpFamily::V6];

    /// The family of `addr`.
    pub fn of(addr: &IpAddr) -> Self {
        if addr.is_ipv4() {
            IpFamily::V4
        } else {
            IpFamily::V6
        }
    }

    /// The name Kubernetes uses (`spec.ipFamilies`): `IPv4` or `IPv6`.
    pub fn kube_name(self) -> &'static str {
        match self {
            IpFamily::V4 => "IPv4",
            IpFamily::V6 => "IPv6",
        }
    }

    /// The family a Kubernetes name (`IPv4`, `IPv6`) stands for.
    pub fn from_kube_name(name: &str) -> Option<Self> {
        match name {
            "IPv4" => Some(IpFamily::V4),
            "IPv6" => Some(IpFamily::V6),
            _ => None,
        }
    }

    /// Loopback as a host prefix, the way `iptables-save` prints it.
    pub fn loopback_cidr(self) -> &'static str {
        match self {
            IpFamily::V4 => "127.0.0.1/32",
            IpFamily::V6 => "::1/128",
        }
    }

    /// The source address kubelet probes are SNATed to on the node.
    pub fn probe_snat(self) -> &'static str {
        match self {
            IpFamily::V4 => PROBE_SNAT_IPV4,
            IpFamily::V6 => PROBE_SNAT_IPV6,
        }
    }

    /// [`IpFamily::probe_snat`] as a host prefix.
    pub fn probe_snat_cidr(self) -> String {
        match self {
            IpFamily::V4 => format!("{PROBE_SNAT_IPV4}/32"),
            IpFamily::V6 => format!("{PROBE_SNAT_IPV6}/128"),
        }
    }
}

impl fmt::Display for IpFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IpFamily::V4 => "ipv4",
            IpFamily::V6 => "ipv6",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_addresses_tell_their_family() {
        for family in IpFamily::BOTH {
            assert_eq!(IpFamily::from_kube_name(family.kube_name()), Some(family));
        }
        assert_eq!(IpFamily::from_kube_name("ipv4"), None);
        assert_eq!(IpFamily::of(&"10.0.0.1".parse().unwrap()), IpFamily::V4);
        assert_eq!(IpFamily::of(&"fd00::1".parse().unwrap()), IpFamily::V6);
        assert_eq!(IpFamily::V4.probe_snat_cidr(), "169.254.7.127/32");
    }
}
