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
    /// Which resource this is: a workload or a service.
    #[prost(oneof = "address::Type", tags = "1, 2")]
    pub r#type: Option<address::Type>,
}

/// Types nested in [`Address`].
pub mod address {
    use prost::Oneof;

    // Decoded once per resource and converted at once: boxing would buy nothing.
    /// The resource an [`Address`](super::Address) carries.
    #[allow(clippy::large_enum_variant)]
    #[derive(Clone, PartialEq, Oneof)]
    pub enum Type {
        /// A single workload, such as a pod or a VM.
        #[prost(message, tag = "1")]
        Workload(super::Workload),
        /// A service: a group of workloads reached together.
        #[prost(message, tag = "2")]
        Service(super::Service),
    }
}

/// An Istio service: a group of workloads that can be reached together. Its resource
/// name is `namespace/hostname`.
#[derive(Clone, PartialEq, Message)]
pub struct Service {
    /// Service name (for Kubernetes, the Service's name).
    #[prost(string, tag = "1")]
    pub name: String,
    /// Namespace of the service.
    #[prost(string, tag = "2")]
    pub namespace: String,
    /// Fully qualified hostname, e.g. `<name>.<namespace>.svc.cluster.local`.
    #[prost(string, tag = "3")]
    pub hostname: String,
    /// Addresses (VIPs) the service is reachable at, one or more per network; empty for a
    /// headless service.
    #[prost(message, repeated, tag = "4")]
    pub addresses: Vec<NetworkAddress>,
    /// The service's ports; a workload may override the target port.
    #[prost(message, repeated, tag = "5")]
    pub ports: Vec<Port>,
    /// SANs to verify on TLS connections instead of each workload's own identity; usually
    /// empty.
    #[prost(string, repeated, tag = "6")]
    pub subject_alt_names: Vec<String>,
    /// The service's waypoint; when set, traffic to the service must go through it.
    #[prost(message, optional, tag = "7")]
    pub waypoint: Option<GatewayAddress>,
    /// How endpoints are picked when connecting to them directly (with a waypoint, the
    /// waypoint's own policy applies).
    #[prost(message, optional, tag = "8")]
    pub load_balancing: Option<LoadBalancing>,
    /// IP families the service supports ([`IpFamilies`]).
    #[prost(enumeration = "IpFamilies", tag = "9")]
    pub ip_families: i32,
    /// Whether this service wins hostname lookups when the client's own namespace has no
    /// service of that name.
    #[prost(bool, tag = "11")]
    pub canonical: bool,
    /// Whether ingress gateways should send this service's traffic through its waypoint
    /// (Istio's `istio.io/ingress-use-waypoint` label).
    #[prost(bool, tag = "12")]
    pub ingress_use_waypoint: bool,
}

/// IP families a service supports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Enumeration)]
#[repr(i32)]
pub enum IpFamilies {
    /// Inferred from the service's addresses.
    Automatic = 0,
    /// IPv4 only.
    Ipv4Only = 1,
    /// IPv6 only.
    Ipv6Only = 2,
    /// Both IPv4 and IPv6 (dual stack).
    Dual = 3,
}

/// A service's endpoint-selection policy: locality preferences and health filtering.
#[derive(Clone, PartialEq, Message)]
pub struct LoadBalancing {
    /// Scopes ([`load_balancing::Scope`]) to keep traffic within, in order of priority;
    /// `mode` says how they are applied.
    #[prost(enumeration = "load_balancing::Scope", repeated, tag = "1")]
    pub routing_preference: Vec<i32>,
    /// How `routing_preference` is applied ([`load_balancing::Mode`]).
    #[prost(enumeration = "load_balancing::Mode", tag = "2")]
    pub mode: i32,
    /// Which endpoints may be picked, by health ([`load_balancing::HealthPolicy`]).
    #[prost(enumeration = "load_balancing::HealthPolicy", tag = "3")]
    pub health_policy: i32,
}

/// Enums nested in [`LoadBalancing`].
pub mod load_balancing {
    use prost::Enumeration;

    /// A locality scope to keep traffic within.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Enumeration)]
    #[repr(i32)]
    pub enum Scope {
        /// Unset.
        UnspecifiedScope = 0,
        /// Prefer endpoints in the same region.
        Region = 1,
        /// Prefer endpoints in the same zone.
        Zone = 2,
        /// Prefer endpoints in the same subzone.
        Subzone = 3,
        /// Prefer endpoints on the same node.
        Node = 4,
        /// Prefer endpoints in the same cluster.
        Cluster = 5,
        /// Prefer endpoints on the same network.
        Network = 6,
    }

    /// How routing preferences are applied.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Enumeration)]
    #[repr(i32)]
    pub enum Mode {
        /// Unset.
        UnspecifiedMode = 0,
        /// Only endpoints matching every preference; traffic fails if there are none.
        Strict = 1,
        /// Prefer endpoints matching every preference, then fall back to those matching fewer
        /// (dropping the last preference first), and finally to any endpoint.
        Failover = 2,
        /// No endpoint selection: traffic goes to the original destination address.
        Passthrough = 3,
    }

    /// Which endpoints may be picked, by health.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Enumeration)]
    #[repr(i32)]
    pub enum HealthPolicy {
        /// Healthy endpoints only.
        OnlyHealthy = 0,
        /// All endpoints, even unhealthy ones.
        AllowAll = 1,
    }
}

/// An Istio workload: one endpoint, such as a pod or a VM, or endpoints behind a
/// hostname. Its resource name is `uid`.
#[derive(Clone, PartialEq, Message)]
pub struct Workload {
    /// Mesh-wide unique opaque id, also the resource name (for a pod, e.g.
    /// `<cluster>//Pod/<namespace>/<name>`).
    #[prost(string, tag = "20")]
    pub uid: String,
    /// Workload name (for Kubernetes, the pod name); informational.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Namespace of the workload; also the namespace of its SPIFFE identity.
    #[prost(string, tag = "2")]
    pub namespace: String,
    /// 4 or 16 bytes each.
    #[prost(bytes = "vec", repeated, tag = "3")]
    pub addresses: Vec<Vec<u8>>,
    /// DNS name ztunnel resolves to reach the workload, for workloads known by hostname
    /// rather than (or besides) by address.
    #[prost(string, tag = "21")]
    pub hostname: String,
    /// Network the workload is on; empty for the default network. Network and address
    /// together identify a workload.
    #[prost(string, tag = "4")]
    pub network: String,
    /// How traffic is tunneled to the workload ([`TunnelProtocol`]).
    #[prost(enumeration = "TunnelProtocol", tag = "5")]
    pub tunnel_protocol: i32,
    /// Trust domain of the workload's SPIFFE identity; empty means the mesh default
    /// (`cluster.local`).
    #[prost(string, tag = "6")]
    pub trust_domain: String,
    /// Service account of the workload's SPIFFE identity; empty means `default`.
    #[prost(string, tag = "7")]
    pub service_account: String,
    /// The workload's waypoint; when set, all traffic to the workload must go through it.
    #[prost(message, optional, tag = "8")]
    pub waypoint: Option<GatewayAddress>,
    /// East-west gateway through which clients on other networks reach the workload.
    #[prost(message, optional, tag = "19")]
    pub network_gateway: Option<GatewayAddress>,
    /// Name of the node the workload runs on.
    #[prost(string, tag = "9")]
    pub node: String,
    /// Canonical service name (`service.istio.io/canonical-name`), for telemetry.
    #[prost(string, tag = "10")]
    pub canonical_name: String,
    /// Canonical revision (`service.istio.io/canonical-revision`), for telemetry.
    #[prost(string, tag = "11")]
    pub canonical_revision: String,
    /// Kind of controller that owns the workload ([`WorkloadType`]), for telemetry.
    #[prost(enumeration = "WorkloadType", tag = "12")]
    pub workload_type: i32,
    /// Name of that controller (e.g. the Deployment's name), for telemetry.
    #[prost(string, tag = "13")]
    pub workload_name: String,
    /// The workload handles tunnel traffic itself: traffic to it is not de-tunneled, and
    /// its own already-tunneled traffic is not tunneled again.
    #[prost(bool, tag = "14")]
    pub native_tunnel: bool,
    /// Set when the workload (e.g. a sandwiched waypoint) wants ztunnel to hand it
    /// tunnel metadata with the traffic ([`ApplicationTunnel`]).
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
    /// Whether the workload is ready to serve traffic ([`WorkloadStatus`]).
    #[prost(enumeration = "WorkloadStatus", tag = "17")]
    pub status: i32,
    /// Cluster the workload belongs to.
    #[prost(string, tag = "18")]
    pub cluster_id: String,
    /// Where the workload runs, for locality-aware load balancing.
    #[prost(message, optional, tag = "24")]
    pub locality: Option<Locality>,
    /// Whether the workload's address is its own or shared ([`NetworkMode`]).
    #[prost(enumeration = "NetworkMode", tag = "25")]
    pub network_mode: i32,
    /// Unset means 1.
    #[prost(message, optional, tag = "27")]
    pub capacity: Option<u32>,
}

/// How traffic is tunneled to a workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Enumeration)]
#[repr(i32)]
pub enum TunnelProtocol {
    /// No tunnel: traffic is forwarded as-is.
    None = 0,
    /// HBONE: HTTP CONNECT over mutual TLS, to the workload's port 15008.
    Hbone = 1,
    /// Istio's sidecar-style mutual TLS, for workloads that run a sidecar.
    LegacyIstioMtls = 2,
}

/// Kind of controller that owns a workload, for telemetry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Enumeration)]
#[repr(i32)]
pub enum WorkloadType {
    /// A Deployment.
    Deployment = 0,
    /// A CronJob.
    Cronjob = 1,
    /// A bare pod, with no controller.
    Pod = 2,
    /// A Job.
    Job = 3,
}

/// Whether a workload can take traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Enumeration)]
#[repr(i32)]
pub enum WorkloadStatus {
    /// Ready to serve traffic.
    Healthy = 0,
    /// Not ready to serve traffic.
    Unhealthy = 1,
}

/// How a workload's addresses are treated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Enumeration)]
#[repr(i32)]
pub enum NetworkMode {
    /// The address identifies the workload within its network.
    Standard = 0,
    /// The address is shared by many workloads (host network), so the workload must not
    /// be looked up by IP.
    HostNetwork = 1,
}

/// Where a workload runs.
#[derive(Clone, PartialEq, Message)]
pub struct Locality {
    /// Region (`topology.kubernetes.io/region`).
    #[prost(string, tag = "1")]
    pub region: String,
    /// Zone (`topology.kubernetes.io/zone`).
    #[prost(string, tag = "2")]
    pub zone: String,
    /// Subzone (`topology.istio.io/subzone`).
    #[prost(string, tag = "3")]
    pub subzone: String,
}

/// How a workload that consumes tunnel metadata wants its traffic delivered.
#[derive(Clone, PartialEq, Message)]
pub struct ApplicationTunnel {
    /// What the inner stream is wrapped in ([`application_tunnel::Protocol`]).
    #[prost(enumeration = "application_tunnel::Protocol", tag = "1")]
    pub protocol: i32,
    /// 0: the port the traffic was sent to.
    #[prost(uint32, tag = "2")]
    pub port: u32,
}

/// Enums nested in [`ApplicationTunnel`].
pub mod application_tunnel {
    use prost::Enumeration;

    /// How the inner stream is handed to the application.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Enumeration)]
    #[repr(i32)]
    pub enum Protocol {
        /// Bytes are copied unchanged.
        None = 0,
        /// A PROXY protocol header comes first, with the source and destination addresses
        /// and, as TLVs, the source's SPIFFE identity (0xD0) and the target service's hostname
        /// (0xD1).
        Proxy = 1,
    }
}

/// The ports a workload serves for one service.
#[derive(Clone, PartialEq, Message)]
pub struct PortList {
    /// Port mappings, one per service port.
    #[prost(message, repeated, tag = "1")]
    pub ports: Vec<Port>,
}

/// A service port and the port its traffic is forwarded to.
#[derive(Clone, PartialEq, Message)]
pub struct Port {
    /// Port clients address the service on.
    #[prost(uint32, tag = "1")]
    pub service_port: u32,
    /// 0: unset (the service's own target port applies).
    #[prost(uint32, tag = "2")]
    pub target_port: u32,
    /// Application protocol of the port, declared or inferred ([`AppProtocol`]).
    #[prost(enumeration = "AppProtocol", tag = "3")]
    pub app_protocol: i32,
}

/// A port's application protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Enumeration)]
#[repr(i32)]
pub enum AppProtocol {
    /// Not declared or not known.
    Unknown = 0,
    /// HTTP/1.1.
    Http11 = 1,
    /// HTTP/2.
    Http2 = 2,
    /// gRPC.
    Grpc = 3,
}

/// An IP address on a specific network.
#[derive(Clone, PartialEq, Message)]
pub struct NetworkAddress {
    /// Network the address is on; empty for the default network.
    #[prost(string, tag = "1")]
    pub network: String,
    /// 4 or 16 bytes.
    #[prost(bytes = "vec", tag = "2")]
    pub address: Vec<u8>,
    /// A prefix length, for CIDR-shaped entries.
    #[prost(uint32, optional, tag = "3")]
    pub length: Option<u32>,
}

/// A service named by namespace and hostname.
#[derive(Clone, PartialEq, Message)]
pub struct NamespacedHostname {
    /// Namespace of the service.
    #[prost(string, tag = "1")]
    pub namespace: String,
    /// Hostname of the service, e.g. `waypoint.<namespace>.svc.cluster.local`.
    #[prost(string, tag = "2")]
    pub hostname: String,
}

/// A waypoint or network gateway: a service by hostname or an address.
#[derive(Clone, PartialEq, Message)]
pub struct GatewayAddress {
    /// Where the gateway is: a service hostname or an IP address.
    #[prost(oneof = "gateway_address::Destination", tags = "1, 2")]
    pub destination: Option<gateway_address::Destination>,
    /// Port for HBONE (mutual TLS) connections to the gateway, usually 15008.
    #[prost(uint32, tag = "3")]
    pub hbone_mtls_port: u32,
}

/// Types nested in [`GatewayAddress`].
pub mod gateway_address {
    use prost::Oneof;

    /// How a gateway is located.
    #[derive(Clone, PartialEq, Oneof)]
    pub enum Destination {
        /// A service, by namespace and hostname.
        #[prost(message, tag = "1")]
        Hostname(super::NamespacedHostname),
        /// An IP address on a network.
        #[prost(message, tag = "2")]
        Address(super::NetworkAddress),
    }
}
