//! Delta ADS as istiod serves ztunnels: Envoy's discovery messages (from
//! `envoy-types`) and the node identity Istio's ztunnel sends with them.

pub use envoy_types::pb::envoy::config::core::v3::Node;
pub use envoy_types::pb::envoy::service::discovery::v3::{
    aggregated_discovery_service_client::AggregatedDiscoveryServiceClient,
    aggregated_discovery_service_server::{
        AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
    },
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse, Resource,
};
pub use envoy_types::pb::envoy::service::status::v3::{
    client_config::GenericXdsConfig, ClientConfig, ConfigStatus,
};
pub use envoy_types::pb::google::protobuf::{value::Kind, Any, Struct, Value};
pub use envoy_types::pb::google::rpc::Status;

pub use super::security::AUTHORIZATION_TYPE_URL;
pub use super::workload::ADDRESS_TYPE_URL;

/// Istio's debug type: one `ClientConfig` per connected proxy, with each type's sync
/// state (what `istioctl proxy-status` shows).
pub const SYNCZ_TYPE_URL: &str = "istio.io/debug/syncz";
/// Type URL of Envoy's `ClientConfig`, the resources of a [`SYNCZ_TYPE_URL`] response.
pub const CLIENT_CONFIG_TYPE_URL: &str = "type.googleapis.com/envoy.service.status.v3.ClientConfig";

/// The node metadata keys istiod reads from a ztunnel (besides every
/// `ISTIO_META_<X>` variable, sent as `<X>`).
pub mod node_metadata {
    /// The ztunnel pod's name.
    pub const NAME: &str = "NAME";
    /// The ztunnel pod's namespace; istiod checks the stream's token against it.
    pub const NAMESPACE: &str = "NAMESPACE";
    /// The ztunnel pod's IPs, comma-separated.
    pub const INSTANCE_IPS: &str = "INSTANCE_IPS";
    /// The node (Kubernetes node name) the ztunnel runs on.
    pub const NODE_NAME: &str = "NODE_NAME";
    /// The cluster the ztunnel belongs to.
    pub const CLUSTER_ID: &str = "CLUSTER_ID";
}

/// Istio's xDS node id for a ztunnel: `ztunnel~IP~POD.NS~NS.svc.cluster.local`.
pub fn ztunnel_node_id(instance_ip: &str, pod: &str, namespace: &str) -> String {
    node_id(ZTUNNEL_NODE, instance_ip, pod, namespace)
}

/// The node type in a ztunnel's id.
pub const ZTUNNEL_NODE: &str = "ztunnel";
/// The node type in a gateway's or waypoint's id (Istio's `router`).
pub const ROUTER_NODE: &str = "router";

/// Istio's xDS node id: `TYPE~IP~POD.NS~NS.svc.cluster.local` (istiod wants four `~`
/// parts and reads the proxy type from the first).
pub fn node_id(node_type: &str, instance_ip: &str, pod: &str, namespace: &str) -> String {
    format!("{node_type}~{instance_ip}~{pod}.{namespace}~{namespace}.svc.cluster.local")
}

/// A `Struct` of string values, as Istio's proxies send node metadata.
pub fn string_struct<'a>(fields: impl IntoIterator<Item = (&'a str, &'a str)>) -> Struct {
    Struct {
        fields: fields
            .into_iter()
            .map(|(k, v)| {
                let value = Value {
                    kind: Some(Kind::StringValue(v.to_owned())),
                };
                (k.to_owned(), value)
            })
            .collect(),
    }
}

/// The string value of `key` in node metadata, if it is a string.
pub fn string_field<'a>(metadata: &'a Struct, key: &str) -> Option<&'a str> {
    match metadata.fields.get(key)?.kind.as_ref()? {
        Kind::StringValue(s) => Some(s),
        _ => None,
    }
}

/// A named, versioned resource of a delta response.
pub fn resource(name: impl Into<String>, version: impl Into<String>, body: Any) -> Resource {
    Resource {
        name: name.into(),
        version: version.into(),
        resource: Some(body),
        ..Default::default()
    }
}
