//! Services: a hostname and VIPs in front of a set of workloads.
//!
//! Mirrors Istio's local-config `services` entries. Endpoints come mostly from the
//! workloads' own `services` maps; a service may also list `endpoints` by workload uid
//! (Istio accepts that too), and both are merged when resolving.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::serde_util::{is_default, null_as_default, port_map};
use super::workload::{GatewayAddress, HealthStatus};

/// Why an address or hostname string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressParseError {
    /// Not `<network>/<ip>` or a bare IP; holds the rejected text.
    #[error("invalid network address {0:?} (expected \"<network>/<ip>\", e.g. \"/10.96.0.10\")")]
    NetworkAddress(String),
    /// Not `<namespace>/<hostname>` with both parts non-empty; holds the rejected text.
    #[error("invalid namespaced hostname {0:?} (expected \"<namespace>/<hostname>\")")]
    NamespacedHostname(String),
}

/// An IP on a network: `"network/ip"`; the default network is empty (`"/10.96.0.10"`).
/// A bare IP is accepted as the default network.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NetworkAddress {
    /// Network name; empty for the default network.
    pub network: String,
    /// The IP on that network.
    pub address: IpAddr,
}

impl FromStr for NetworkAddress {
    type Err = AddressParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || AddressParseError::NetworkAddress(s.to_string());
        let (network, ip) = s.split_once('/').unwrap_or(("", s));
        let address = ip.trim().parse::<IpAddr>().map_err(|_| err())?;
        Ok(NetworkAddress {
            network: network.to_string(),
            address,
        })
    }
}

impl fmt::Display for NetworkAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.address)
    }
}

impl Serialize for NetworkAddress {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for NetworkAddress {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// `namespace/hostname`: how workloads name the services they back.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NamespacedHostname {
    /// Namespace the hostname belongs to.
    pub namespace: String,
    /// Service hostname, e.g. `svc.ns.svc.cluster.local`.
    pub hostname: String,
}

impl FromStr for NamespacedHostname {
    type Err = AddressParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once('/') {
            Some((ns, host)) if !ns.is_empty() && !host.is_empty() => Ok(NamespacedHostname {
                namespace: ns.to_string(),
                hostname: host.to_string(),
            }),
            _ => Err(AddressParseError::NamespacedHostname(s.to_string())),
        }
    }
}

impl fmt::Display for NamespacedHostname {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.hostname)
    }
}

/// Istio's load-balancing knobs; only `healthPolicy` changes our endpoint choice today.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LoadBalancerMode {
    /// No locality constraint (xDS sends it as unspecified).
    Standard,
    /// Only endpoints that match the client on every routing preference.
    Strict,
    /// Prefer endpoints matching more routing preferences, falling back to the rest.
    Failover,
    /// Pick no endpoint: forward to the original destination address.
    Passthrough,
}

/// Whether unhealthy endpoints of a service may receive traffic (`healthPolicy`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LoadBalancerHealthPolicy {
    /// Only healthy endpoints (the default).
    #[default]
    OnlyHealthy,
    /// Unhealthy endpoints too.
    AllowAll,
}

/// A topology level a routing preference compares between client and endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LoadBalancerScope {
    /// Same region.
    Region,
    /// Same zone.
    Zone,
    /// Same subzone.
    Subzone,
    /// Same node.
    Node,
    /// Same cluster.
    Cluster,
    /// Same network.
    Network,
}

/// A service's `loadBalancer` settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancer {
    /// Topology levels an endpoint should share with the client, checked in order.
    #[serde(default, deserialize_with = "null_as_default")]
    pub routing_preferences: Vec<LoadBalancerScope>,
    /// How `routing_preferences` are applied; `None` means Istio's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<LoadBalancerMode>,
    /// Whether unhealthy endpoints get traffic; only healthy ones by default.
    #[serde(default)]
    pub health_policy: LoadBalancerHealthPolicy,
}

/// The IP families a service has (Kubernetes `ipFamilies`, Istio's `IPFamilies`);
/// decides which address of a dual-stack endpoint is dialled. (One family is
/// `shared_types::net::IpFamily`.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum IpFamilies {
    /// IPv4 and IPv6: use the family of the VIP that was dialled.
    Dual,
    /// IPv4 only.
    IPv4,
    /// IPv6 only.
    IPv6,
}

/// An endpoint listed on the service itself (Istio's `endpoints` map, keyed by uid).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    /// Uid of the workload behind this endpoint.
    pub workload_uid: String,
    /// Service port -> target port for this endpoint; wins over the workload's and the
    /// service's own mappings.
    #[serde(default, with = "port_map")]
    pub port: HashMap<u16, u16>,
    /// The endpoint's health; an unhealthy one gets no traffic unless the health policy is `AllowAll`.
    #[serde(default)]
    pub status: HealthStatus,
}

/// A service: a hostname and VIPs fronting the workloads that back it (an entry of
/// the local config's `services`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Service {
    /// Service name.
    #[serde(default)]
    pub name: String,
    /// Service namespace.
    #[serde(default)]
    pub namespace: String,
    /// Fully qualified hostname, e.g. `svc.ns.svc.cluster.local`.
    #[serde(default)]
    pub hostname: String,
    /// Virtual IPs, written `network/ip` (`/10.96.0.10` on the default network).
    #[serde(default, deserialize_with = "null_as_default")]
    pub vips: Vec<NetworkAddress>,
    /// Service port -> default target port (a workload's own mapping wins).
    #[serde(default, with = "port_map")]
    pub ports: HashMap<u16, u16>,
    /// Identities the client accepts for this service's endpoints (besides each
    /// endpoint's own identity).
    #[serde(default, deserialize_with = "null_as_default")]
    pub subject_alt_names: Vec<String>,

    /// Endpoints listed on the service itself, keyed by workload uid; merged with the
    /// workloads whose `services` map names this service.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "HashMap::is_empty"
    )]
    pub endpoints: HashMap<String, Endpoint>,
    /// Waypoint for traffic addressed to this service (its VIPs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waypoint: Option<GatewayAddress>,
    /// Load-balancing settings; only `healthPolicy` is acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_balancer: Option<LoadBalancer>,
    /// IP families of the service; `None` uses the family of the VIP dialled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_families: Option<IpFamilies>,
    /// Whether this is the authoritative entry for its hostname when several services
    /// (e.g. a Service and a ServiceEntry) share it.
    #[serde(default, skip_serializing_if = "is_default")]
    pub canonical: bool,
    /// Service port -> its application protocol, where declared (`appProtocol` or a
    /// port name prefix): how a waypoint reads the traffic. Istio sends it in the
    /// xDS `Port`; its local-config format has no such field (an extension here).
    #[serde(default, skip_serializing_if = "HashMap::is_empty")]
    pub app_protocols: HashMap<u16, AppProtocol>,
}

/// A port's application protocol, as Istio's workload API names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AppProtocol {
    /// HTTP/1.1.
    #[serde(rename = "HTTP11")]
    Http11,
    /// HTTP/2 (with or without TLS underneath the mesh's).
    #[serde(rename = "HTTP2")]
    Http2,
    /// gRPC: HTTP/2.
    #[serde(rename = "GRPC")]
    Grpc,
}

impl Service {
    /// `namespace/hostname`, the key workloads use in their `services` map.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.hostname)
    }

    /// Whether endpoints in `status` may receive traffic (Istio's `healthPolicy`).
    pub fn accepts_endpoint(&self, status: HealthStatus) -> bool {
        status == HealthStatus::Healthy
            || self
                .load_balancer
                .as_ref()
                .is_some_and(|lb| lb.health_policy == LoadBalancerHealthPolicy::AllowAll)
    }

    /// Target port for `port` when the endpoint does not declare its own: the service's
    /// mapping (zero means unset), else the port itself.
    pub fn default_target_port(&self, port: u16) -> u16 {
        self.ports
            .get(&port)
            .copied()
            .filter(|p| *p != 0)
            .unwrap_or(port)
    }
}

impl fmt::Display for Service {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn network_address_parses_default_and_named_networks() {
        let a: NetworkAddress = "/10.96.0.10".parse().unwrap();
        assert_eq!(a.network, "");
        assert_eq!(a.address, "10.96.0.10".parse::<IpAddr>().unwrap());
        assert_eq!(a.to_string(), "/10.96.0.10");

        let b: NetworkAddress = "net1/10.0.0.1".parse().unwrap();
        assert_eq!(b.network, "net1");
        assert_eq!(b.to_string(), "net1/10.0.0.1");

        let v6: NetworkAddress = "/fd00::10".parse().unwrap();
        assert!(v6.address.is_ipv6());

        let bare: NetworkAddress = "10.1.2.3".parse().unwrap();
        assert_eq!(bare.network, "");

        assert!("net1/not-an-ip".parse::<NetworkAddress>().is_err());
        assert!("10.0.0.0/8".parse::<NetworkAddress>().is_err());
        assert!("".parse::<NetworkAddress>().is_err());
    }

    #[test]
    fn network_address_serde_round_trip() {
        let v: Vec<NetworkAddress> =
            serde_yaml::from_str("- /10.96.0.10\n- net1/10.0.0.1\n").unwrap();
        assert_eq!(
            serde_json::to_string(&v).unwrap(),
            r#"["/10.96.0.10","net1/10.0.0.1"]"#
        );
        let err = serde_yaml::from_str::<Vec<NetworkAddress>>("- bogus/1.2\n").unwrap_err();
        assert!(err.to_string().contains("bogus/1.2"), "{err}");
    }

    #[test]
    fn namespaced_hostname_requires_both_parts() {
        let h: NamespacedHostname = "ns/svc.ns.svc.cluster.local".parse().unwrap();
        assert_eq!(h.namespace, "ns");
        assert_eq!(h.hostname, "svc.ns.svc.cluster.local");
        assert!("no-slash".parse::<NamespacedHostname>().is_err());
        assert!("/host".parse::<NamespacedHostname>().is_err());
    }

    #[test]
    fn service_parses_istio_fields() {
        let s: Service = serde_yaml::from_str(
            "name: svc\nnamespace: ns\nhostname: svc.ns.svc.cluster.local\n\
             vips: [/10.96.0.10]\nports: {80: 8080}\nsubjectAltNames: [spiffe://td/ns/ns/sa/x]\n\
             loadBalancer: {routingPreferences: [Network, Node], mode: Failover, healthPolicy: AllowAll}\n\
             ipFamilies: IPv4\ncanonical: true\n",
        )
        .unwrap();
        assert_eq!(s.key(), "ns/svc.ns.svc.cluster.local");
        assert_eq!(s.default_target_port(80), 8080);
        assert_eq!(s.default_target_port(443), 443);
        assert!(s.accepts_endpoint(HealthStatus::Unhealthy));
        assert_eq!(s.ip_families, Some(IpFamilies::IPv4));
    }
}
