//! `istio.workload` (Istio's `workload.proto`): the `Address` resources istiod sends
//! ztunnels over delta xDS, with Istio's field numbers. Fields we leave out
//! (`extensions`, `weighted_waypoints`, `visibility`) are skipped by the decoder, as
//! any unknown field is.

use prost::{Enumeration, Message};

/// `type.googleapis.com/istio.workload.Address`.
pub const ADDRESS_TYPE_URL: &str = "type.googleapis.com/istio.workload.Address";

/// A workload or a service; the resource name is the workload's uid or the service's
/// `namespace/hostname`.
#[derive(Clone, PartialEq, Message)]
pub struct Address {
    #[prost(oneof = "address::Type", tags = "1, 2")]
    pub r#type: Option<address::Type>,
}

pub mod address {
    use prost::Oneof;

    // Decoded once per resource and converted at once: boxing would buy nothing.
    #[allow(clippy::large_enum_variant)]
    #[derive(Clone, PartialEq, Oneof)]
    pub enum Type {
        #[prost(message, tag = "1")]
        Workload(super::Workload),
        #[prost(message, tag = "2")]
        Service(super::Service),
    }
}

#[derive(Clone, PartialEq, Message)]
pub struct Service {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub namespace: String,
    #[prost(string, tag = "3")]
    pub hostname: String,
    #[prost(message, repeated, tag = "4")]
    pub addresses: Vec<NetworkAddress>,
    #[prost(message, repeated, tag = "5")]
    pub ports: Vec<Port>,
    #[prost(string, repeated, tag = "6")]
    pub subject_alt_names: Vec<String>,
    #[prost(message, optional, tag = "7")]
    pub waypoint: Option<GatewayAddress>,
    #[prost(message, optional, tag = "8")]
    pub load_balancing: Option<LoadBalancing>,
    #[prost(enumeration = "IpFamilies", tag = "9")]
    pub ip_families: i32,
    #[prost(bool, tag = "11")]
    pub canonical: bool,
    #[prost(bool, tag = "12")]
    pub ingress_use_waypoint: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Enumeration)]
#[repr(i32)]
pub enum IpFamilies {
    Automatic = 0,
    Ipv4Only = 1,
    Ipv6Only = 2,
    Dual = 3,
}

#[derive(Clone, PartialEq, Message)]
pub struct LoadBalancing {
    #[prost(enumeration = "load_balancing::Scope", repeated, tag = "1")]
    pub routing_preference: Vec<i32>,
    #[prost(enumeration = "load_balancing::Mode", tag = "2")]
    pub mode: i32,
    #[prost(enumeration = "load_balancing::HealthPolicy", tag = "3")]
    pub health_policy: i32,
}

pub mod load_balancing {
    use prost::Enumeration;

    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Enumeration)]
    #[repr(i32)]
    pub enum Scope {
        UnspecifiedScope = 0,
        Region = 1,
        Zone = 2,
        Subzone = 3,
        Node = 4,
        Cluster = 5,
        Network = 6,
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Enumeration)]
    #[repr(i32)]
    pub enum Mode {
        UnspecifiedMode = 0,
        Strict = 1,
        Failover = 2,
        Passthrough = 3,
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Enumeration)]
    #[repr(i32)]
    pub enum HealthPolicy {
        OnlyHealthy = 0,
        AllowAll = 1,
    }
}

#[derive(Clone, PartialEq, Message)]
pub struct Workload {
    #[prost(string, tag = "20")]
    pub uid: String,
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub namespace: String,
    /// 4 or 16 bytes each.
    #[prost(bytes = "vec", repeated, tag = "3")]
    pub addresses: Vec<Vec<u8>>,
    #[prost(string, tag = "21")]
    pub hostname: String,
    #[prost(string, tag = "4")]
    pub network: String,
    #[prost(enumeration = "TunnelProtocol", tag = "5")]
    pub tunnel_protocol: i32,
    #[prost(string, tag = "6")]
    pub trust_domain: String,
    #[prost(string, tag = "7")]
    pub service_account: String,
    #[prost(message, optional, tag = "8")]
    pub waypoint: Option<GatewayAddress>,
    #[prost(message, optional, tag = "19")]
    pub network_gateway: Option<GatewayAddress>,
    #[prost(string, tag = "9")]
    pub node: String,
    #[prost(string, tag = "10")]
    pub canonical_name: String,
    #[prost(string, tag = "11")]
    pub canonical_revision: String,
    #[prost(enumeration = "WorkloadType", tag = "12")]
    pub workload_type: i32,
    #[prost(string, tag = "13")]
    pub workload_name: String,
    #[prost(bool, tag = "14")]
    pub native_tunnel: bool,
    #[prost(message, optional, tag = "23")]
    pub application_tunnel: Option<ApplicationTunnel>,
    /// `"namespace/hostname"` of each service the workload backs, with its ports.
    /// Ordered, so equal workloads encode to equal bytes (versions are digests).
    #[prost(btree_map = "string, message", tag = "22")]
    pub services: std::collections::BTreeMap<String, PortList>,
    /// Selector-based policies only (`namespace/name`); namespace and mesh-wide ones
    /// apply by their scope.
    #[prost(string, repeated, tag = "16")]
    pub authorization_policies: Vec<String>,
    #[prost(enumeration = "WorkloadStatus", tag = "17")]
    pub status: i32,
    #[prost(string, tag = "18")]
    pub cluster_id: String,
    #[prost(message, optional, tag = "24")]
    pub locality: Option<Locality>,
    #[prost(enumeration = "NetworkMode", tag = "25")]
    pub network_mode: i32,
    /// Unset means 1.
    #[prost(message, optional, tag = "27")]
    pub capacity: Option<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Enumeration)]
#[repr(i32)]
pub enum TunnelProtocol {
    None = 0,
    Hbone = 1,
    LegacyIstioMtls = 2,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Enumeration)]
#[repr(i32)]
pub enum WorkloadType {
    Deployment = 0,
    Cronjob = 1,
    Pod = 2,
    Job = 3,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Enumeration)]
#[repr(i32)]
pub enum WorkloadStatus {
    Healthy = 0,
    Unhealthy = 1,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Enumeration)]
#[repr(i32)]
pub enum NetworkMode {
    Standard = 0,
    HostNetwork = 1,
}

#[derive(Clone, PartialEq, Message)]
pub struct Locality {
    #[prost(string, tag = "1")]
    pub region: String,
    #[prost(string, tag = "2")]
    pub zone: String,
    #[prost(string, tag = "3")]
    pub subzone: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct ApplicationTunnel {
    #[prost(enumeration = "application_tunnel::Protocol", tag = "1")]
    pub protocol: i32,
    /// 0: the port the traffic was sent to.
    #[prost(uint32, tag = "2")]
    pub port: u32,
}

pub mod application_tunnel {
    use prost::Enumeration;

    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Enumeration)]
    #[repr(i32)]
    pub enum Protocol {
        None = 0,
        Proxy = 1,
    }
}

#[derive(Clone, PartialEq, Message)]
pub struct PortList {
    #[prost(message, repeated, tag = "1")]
    pub ports: Vec<Port>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Port {
    #[prost(uint32, tag = "1")]
    pub service_port: u32,
    /// 0: unset (the service's own target port applies).
    #[prost(uint32, tag = "2")]
    pub target_port: u32,
    #[prost(enumeration = "AppProtocol", tag = "3")]
    pub app_protocol: i32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Enumeration)]
#[repr(i32)]
pub enum AppProtocol {
    Unknown = 0,
    Http11 = 1,
    Http2 = 2,
    Grpc = 3,
}

#[derive(Clone, PartialEq, Message)]
pub struct NetworkAddress {
    #[prost(string, tag = "1")]
    pub network: String,
    /// 4 or 16 bytes.
    #[prost(bytes = "vec", tag = "2")]
    pub address: Vec<u8>,
    /// A prefix length, for CIDR-shaped entries.
    #[prost(uint32, optional, tag = "3")]
    pub length: Option<u32>,
}

#[derive(Clone, PartialEq, Message)]
pub struct NamespacedHostname {
    #[prost(string, tag = "1")]
    pub namespace: String,
    #[prost(string, tag = "2")]
    pub hostname: String,
}

/// A waypoint or network gateway: a service by hostname or an address.
#[derive(Clone, PartialEq, Message)]
pub struct GatewayAddress {
    #[prost(oneof = "gateway_address::Destination", tags = "1, 2")]
    pub destination: Option<gateway_address::Destination>,
    #[prost(uint32, tag = "3")]
    pub hbone_mtls_port: u32,
}

pub mod gateway_address {
    use prost::Oneof;

    #[derive(Clone, PartialEq, Oneof)]
    pub enum Destination {
        #[prost(message, tag = "1")]
        Hostname(super::NamespacedHostname),
        #[prost(message, tag = "2")]
        Address(super::NetworkAddress),
    }
}
