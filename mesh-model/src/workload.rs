//! Workloads: the pods (or VMs) the mesh knows, in Istio's local-config shape.
//!
//! Field names, enum spellings and defaults follow Istio's ztunnel so a `LOCAL_XDS_PATH`
//! file written for it loads unchanged. Fields we do not act on yet (network gateways,
//! locality, ...) are still parsed so they round-trip into `/config_dump`.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use super::serde_util::{is_default, null_as_default, service_port_maps};
use super::service::{NamespacedHostname, NetworkAddress};
use shared_types::constants::{DEFAULT_SERVICE_ACCOUNT, DEFAULT_TRUST_DOMAIN};
use shared_types::identity::Identity;

/// How a workload accepts inbound traffic: HBONE (it is in the mesh) or plain TCP.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Protocol {
    /// Not captured by a ztunnel: send plaintext. Istio's default.
    #[default]
    #[serde(rename = "TCP", alias = "tcp", alias = "NONE")]
    Tcp,
    /// Captured by a ztunnel on its node: tunnel over HBONE to port 15008.
    #[serde(rename = "HBONE", alias = "hbone")]
    Hbone,
}

impl Protocol {
    /// Istio's spelling: `TCP` or `HBONE`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Hbone => "HBONE",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Readiness as reported by the control plane; unhealthy workloads get no service traffic.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum HealthStatus {
    /// Ready: may receive service traffic (the default).
    #[default]
    Healthy,
    /// Not ready: gets no service traffic unless the service's health policy is `AllowAll`.
    Unhealthy,
}

/// Host-network workloads share the node's IPs, so they are never indexed by address.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum NetworkMode {
    /// The workload has its own IPs (the default).
    #[default]
    Standard,
    /// The workload uses its node's network and IPs.
    HostNetwork,
}

/// Topology of a workload, used by Istio for locality-aware load balancing.
#[derive(Debug, Default, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default)]
pub struct Locality {
    /// Region, e.g. from `topology.kubernetes.io/region`.
    pub region: String,
    /// Zone within the region.
    pub zone: String,
    /// Subzone within the zone (Istio's `topology.istio.io/subzone`).
    pub subzone: String,
}

/// Where a waypoint or network gateway is reached: `network/ip` or `namespace/hostname`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum GatewayDestination {
    /// An IP on a network (`network/ip`).
    Address(NetworkAddress),
    /// A service (`namespace/hostname`).
    Hostname(NamespacedHostname),
}

impl fmt::Display for GatewayDestination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GatewayDestination::Address(a) => a.fmt(f),
            GatewayDestination::Hostname(h) => h.fmt(f),
        }
    }
}

impl Serialize for GatewayDestination {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for GatewayDestination {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Same precedence as Istio's untagged enum: an address first, then a hostname.
        let text = String::deserialize(d)?;
        if let Ok(addr) = text.parse::<NetworkAddress>() {
            return Ok(GatewayDestination::Address(addr));
        }
        text.parse::<NamespacedHostname>()
            .map(GatewayDestination::Hostname)
            .map_err(serde::de::Error::custom)
    }
}

/// A waypoint or east-west gateway in front of a workload or service.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayAddress {
    /// Where the gateway is reached.
    pub destination: GatewayDestination,
    /// Port the gateway accepts HBONE on (usually 15008).
    #[serde(default)]
    pub hbone_mtls_port: u16,
}

/// Protocol a workload's own tunnel (e.g. a waypoint) expects inside HBONE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ApplicationTunnelProtocol {
    /// Plain bytes, no extra framing.
    #[serde(rename = "NONE")]
    None,
    /// A PROXY protocol header ahead of the stream, carrying the original addresses.
    #[serde(rename = "PROXY")]
    Proxy,
}

/// `applicationTunnel`: how traffic is handed to a workload (e.g. a waypoint) once
/// HBONE is terminated.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationTunnel {
    /// Framing the workload expects.
    pub protocol: ApplicationTunnelProtocol,
    /// Port to deliver to; `None` keeps the connection's destination port.
    #[serde(default)]
    pub port: Option<u16>,
}

fn default_capacity() -> u32 {
    1
}

/// One workload. Source-neutral: the local file and (later) Kubernetes both produce it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Workload {
    /// Unique key. Istio uses `cluster//Kind/namespace/name`; when the local file leaves
    /// it empty, [`Workload::effective_uid`] derives one of that shape.
    #[serde(default)]
    pub uid: String,
    /// Workload name (for a pod, the pod's name).
    #[serde(default)]
    pub name: String,
    /// Kubernetes namespace.
    #[serde(default)]
    pub namespace: String,
    /// Service account of its identity; empty means `default`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub service_account: String,
    /// Trust domain of its identity; empty means `cluster.local`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub trust_domain: String,
    /// IPs the workload is reached at (its pod IPs).
    #[serde(default, deserialize_with = "null_as_default")]
    pub workload_ips: Vec<IpAddr>,
    /// How it accepts inbound traffic: `HBONE` or `TCP` (the default).
    #[serde(default)]
    pub protocol: Protocol,
    /// Node the workload runs on.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node: String,
    /// Network its IPs belong to; empty for the default network.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub network: String,
    /// Readiness; unhealthy workloads get no service traffic.
    #[serde(default)]
    pub status: HealthStatus,
    /// Keys (`namespace/name`) of WorkloadSelector-scoped policies that select this workload.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub authorization_policies: Vec<String>,
    /// Services this workload backs: `"namespace/hostname" -> {service port: target port}`.
    #[serde(
        default,
        with = "service_port_maps",
        skip_serializing_if = "HashMap::is_empty"
    )]
    pub services: HashMap<String, HashMap<u16, u16>>,

    /// Waypoint for traffic addressed to this workload directly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waypoint: Option<GatewayAddress>,
    /// East-west gateway that reaches the workload from another network (parsed, not used).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_gateway: Option<GatewayAddress>,
    /// Whether it has its own IPs or shares its node's (`HostNetwork`).
    #[serde(default, skip_serializing_if = "is_default")]
    pub network_mode: NetworkMode,
    /// Name of the owning workload, e.g. the Deployment (for telemetry).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub workload_name: String,
    /// Kind of the owner, lowercase: `deployment`, `cronjob`, `pod` or `job`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub workload_type: String,
    /// Istio canonical service name (`service.istio.io/canonical-name`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub canonical_name: String,
    /// Istio canonical revision (`service.istio.io/canonical-revision`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub canonical_revision: String,
    /// DNS name of a workload reached by name rather than by IP.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub hostname: String,
    /// The workload handles HBONE itself, so no ztunnel wraps or unwraps its traffic
    /// (parsed, not used).
    #[serde(default, skip_serializing_if = "is_default")]
    pub native_tunnel: bool,
    /// How traffic is handed to the workload after HBONE, if it needs framing (parsed, not used).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub application_tunnel: Option<ApplicationTunnel>,
    /// Cluster the workload runs in; used in the derived uid (`Kubernetes` if empty).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cluster_id: String,
    /// Region, zone and subzone, for locality-aware load balancing.
    #[serde(default, skip_serializing_if = "is_default")]
    pub locality: Locality,
    /// Relative load-balancing weight; 1 when unset.
    #[serde(default = "default_capacity")]
    pub capacity: u32,
}

impl Default for Workload {
    fn default() -> Self {
        Workload {
            uid: String::new(),
            name: String::new(),
            namespace: String::new(),
            service_account: String::new(),
            trust_domain: String::new(),
            workload_ips: Vec::new(),
            protocol: Protocol::default(),
            node: String::new(),
            network: String::new(),
            status: HealthStatus::default(),
            authorization_policies: Vec::new(),
            services: HashMap::new(),
            waypoint: None,
            network_gateway: None,
            network_mode: NetworkMode::default(),
            workload_name: String::new(),
            workload_type: String::new(),
            canonical_name: String::new(),
            canonical_revision: String::new(),
            hostname: String::new(),
            native_tunnel: false,
            application_tunnel: None,
            cluster_id: String::new(),
            locality: Locality::default(),
            capacity: default_capacity(),
        }
    }
}

impl Workload {
    /// Its address of one family (IPv4 when `ipv4`), else its first, if it has any:
    /// where a connection of that family to it goes.
    pub fn address_of_family(&self, ipv4: bool) -> Option<IpAddr> {
        let ips = &self.workload_ips;
        ips.iter()
            .find(|ip| ip.is_ipv4() == ipv4)
            .or(ips.first())
            .copied()
    }

    /// The SPIFFE identity the workload's certificate carries. Empty trust domain and
    /// service account mean Istio's defaults, as they do for xDS-delivered workloads.
    pub fn identity(&self) -> Identity {
        Identity {
            trust_domain: non_empty_or(&self.trust_domain, DEFAULT_TRUST_DOMAIN),
            namespace: self.namespace.clone(),
            service_account: non_empty_or(&self.service_account, DEFAULT_SERVICE_ACCOUNT),
        }
    }

    /// `uid`, or Istio's `cluster//Pod/namespace/name` shape when the config omitted it,
    /// so hand-written files with several uid-less workloads do not collide.
    pub fn effective_uid(&self) -> String {
        if !self.uid.is_empty() {
            return self.uid.clone();
        }
        pod_uid(
            &non_empty_or(&self.cluster_id, "Kubernetes"),
            &self.namespace,
            &self.name,
        )
    }

    /// Whether the workload is ready to receive service traffic.
    pub fn is_healthy(&self) -> bool {
        self.status == HealthStatus::Healthy
    }

    /// Whether the workload answers HBONE (is behind a ztunnel).
    pub fn is_hbone(&self) -> bool {
        self.protocol == Protocol::Hbone
    }

    /// The workload's own target port for `port` of service `svc_key` (`ns/hostname`), if
    /// it declares one. A zero target means "unset", as in Istio's xDS.
    pub fn service_target_port(&self, svc_key: &str, port: u16) -> Option<u16> {
        self.services
            .get(svc_key)
            .and_then(|ports| ports.get(&port))
            .copied()
            .filter(|p| *p != 0)
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

fn non_empty_or(value: &str, default: &str) -> String {
    if value.is_empty() {
        default.to_string()
    } else {
        value.to_string()
    }
}

/// Istio's uid of a pod's workload: `<cluster>//Pod/<namespace>/<name>`.
pub fn pod_uid(cluster_id: &str, namespace: &str, name: &str) -> String {
    format!("{cluster_id}//Pod/{namespace}/{name}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_defaults_trust_domain_and_service_account() {
        let w = Workload {
            namespace: "ns".into(),
            ..Default::default()
        };
        let id = w.identity();
        assert_eq!(id.trust_domain, "cluster.local");
        assert_eq!(id.namespace, "ns");
        assert_eq!(id.service_account, "default");

        let w = Workload {
            namespace: "ns".into(),
            trust_domain: "td".into(),
            service_account: "sa".into(),
            ..Default::default()
        };
        assert_eq!(w.identity().principal(), "td/ns/ns/sa/sa");
    }

    #[test]
    fn minimal_workload_uses_istio_defaults() {
        let w: Workload = serde_yaml::from_str("namespace: default\nname: a\n").unwrap();
        assert_eq!(w.protocol, Protocol::Tcp);
        assert_eq!(w.status, HealthStatus::Healthy);
        assert_eq!(w.capacity, 1);
        assert_eq!(w.effective_uid(), "Kubernetes//Pod/default/a");
    }

    #[test]
    fn enum_spellings_match_istio() {
        let w: Workload = serde_yaml::from_str(
            "namespace: n\nprotocol: HBONE\nstatus: Unhealthy\nnetworkMode: HostNetwork\n",
        )
        .unwrap();
        assert_eq!(w.protocol, Protocol::Hbone);
        assert_eq!(w.status, HealthStatus::Unhealthy);
        assert_eq!(w.network_mode, NetworkMode::HostNetwork);
        assert!(serde_yaml::from_str::<Workload>("protocol: QUIC\n").is_err());
    }

    #[test]
    fn service_ports_accept_quoted_keys_and_zero_means_unset() {
        let w: Workload = serde_yaml::from_str(
            "namespace: n\nservices:\n  n/svc.n.svc.cluster.local:\n    \"80\": 8080\n    81: 0\n",
        )
        .unwrap();
        assert_eq!(
            w.service_target_port("n/svc.n.svc.cluster.local", 80),
            Some(8080)
        );
        assert_eq!(w.service_target_port("n/svc.n.svc.cluster.local", 81), None);
        assert_eq!(w.service_target_port("n/other", 80), None);
    }

    #[test]
    fn waypoint_destination_address_or_hostname() {
        let w: Workload = serde_yaml::from_str(
            "namespace: n\nwaypoint:\n  destination: /10.0.0.9\n  hboneMtlsPort: 15008\n\
             networkGateway:\n  destination: ns/gw.ns.svc.cluster.local\n  hboneMtlsPort: 15008\n",
        )
        .unwrap();
        assert!(matches!(
            w.waypoint.unwrap().destination,
            GatewayDestination::Address(_)
        ));
        assert!(matches!(
            w.network_gateway.unwrap().destination,
            GatewayDestination::Hostname(_)
        ));
    }
}
