//! xDS discovery: workloads, services and policies from istiod (Istio's, or
//! istiod-lite) over Istio's delta ADS, as Istio's ztunnel gets them.
//!
//! One `DeltaAggregatedResources` stream carries both types, `istio.workload.Address`
//! and `istio.security.Authorization`, as wildcard subscriptions; or, with
//! `XDS_ON_DEMAND`, Addresses only as connections look them up ([`demand`]). Each response is
//! applied resource by resource: the valid ones go into the state, the invalid ones are
//! NACKed by name and leave the previous version in place. The held state is published
//! as the StateStore source "xds" after every response, and kept (and served) while
//! the stream is down; a reconnect names every held resource with its version
//! (`initial_resource_versions`) so istiod sends only what changed meanwhile.

mod demand;
pub mod metrics;
mod resources;
mod stream;

use std::sync::Arc;

use shared_types::istio::xds::{node_id, node_metadata, string_struct, Node};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub use metrics::XdsMetrics;
pub use resources::{ResourceError, Resources, TYPES, WAYPOINT_TYPES};

use crate::control_plane::{ControlPlane, ControlPlaneConfig, ControlPlaneError};
use crate::discovery::FirstSync;
use crate::state::demand::Demand;
use crate::state::StateStore;
use mesh_runtime::readiness::BlockReady;

/// Name of this source in the [`StateStore`].
pub const SOURCE: &str = "xds";

/// Who this ztunnel is to istiod: Istio's node id and metadata, from the downward API.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeIdentity {
    /// The id's first part: `ztunnel`, or `router` for a waypoint.
    pub node_type: &'static str,
    /// `POD_NAME`: the ztunnel pod.
    pub pod_name: String,
    /// `POD_NAMESPACE`: istiod checks the stream's token belongs to it.
    pub pod_namespace: String,
    /// `INSTANCE_IP`.
    pub instance_ip: String,
    /// `NODE_NAME`.
    pub node_name: String,
    /// `ISTIO_META_CLUSTER_ID` / `CLUSTER_ID`.
    pub cluster_id: String,
    /// Every `ISTIO_META_<X>=<v>` of the environment, sent as `<X>: <v>`.
    pub extra_metadata: Vec<(String, String)>,
}

impl NodeIdentity {
    /// `ISTIO_META_<X>` variables of this process's environment.
    pub fn istio_meta_from_env() -> Vec<(String, String)> {
        std::env::vars()
            .filter_map(|(k, v)| Some((k.strip_prefix("ISTIO_META_")?.to_owned(), v)))
            .collect()
    }

    pub fn to_node(&self) -> Node {
        let mut fields: Vec<(&str, &str)> = self
            .extra_metadata
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        // The fixed keys last, so an ISTIO_META_ variable cannot override them.
        fields.extend([
            (node_metadata::NAME, self.pod_name.as_str()),
            (node_metadata::NAMESPACE, self.pod_namespace.as_str()),
            (node_metadata::INSTANCE_IPS, self.instance_ip.as_str()),
            (node_metadata::NODE_NAME, self.node_name.as_str()),
            (node_metadata::CLUSTER_ID, self.cluster_id.as_str()),
        ]);
        Node {
            id: node_id(
                self.node_type,
                &self.instance_ip,
                &self.pod_name,
                &self.pod_namespace,
            ),
            metadata: Some(string_struct(fields)),
            ..Default::default()
        }
    }
}

/// Settings of the xDS client, with Istio's environment names.
#[derive(Clone, Debug)]
pub struct XdsConfig {
    /// `XDS_ADDRESS`, `XDS_ROOT_CA`, `ALT_XDS_HOSTNAME`, `XDS_HEADER_*`, `AUTH_TOKEN`.
    pub control_plane: ControlPlaneConfig,
    pub node: NodeIdentity,
    /// `XDS_ON_DEMAND`: Some(this ztunnel's `NETWORK`), the network of the keys.
    pub on_demand: Option<String>,
    /// The types to subscribe to: [`resources::TYPES`] for ztunnel,
    /// [`resources::WAYPOINT_TYPES`] for a waypoint.
    pub types: &'static [&'static str],
}

/// Starts the client; it runs, reconnecting, until `cancel` fires. `ready` is
/// released once a response of each type has been ACKed.
pub fn start(
    config: XdsConfig,
    state: StateStore,
    metrics: Arc<XdsMetrics>,
    ready: Option<BlockReady>,
    cancel: CancellationToken,
) -> Result<FirstSync, ControlPlaneError> {
    let control_plane = ControlPlane::new(&config.control_plane)?;
    let (synced_tx, synced) = watch::channel(false);
    let lookups = config.on_demand.map(|network| {
        let (demand, lookups) = Demand::new(network);
        state.enable_on_demand(demand);
        lookups
    });
    tokio::spawn(stream::run(
        stream::Client {
            control_plane,
            node: config.node.to_node(),
            state,
            metrics,
            lookups,
            types: config.types,
        },
        ready,
        synced_tx,
        cancel,
    ));
    Ok(FirstSync::new(synced))
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared_types::istio::xds::string_field;

    #[test]
    fn node_id_and_metadata_are_istios() {
        let node = NodeIdentity {
            node_type: "ztunnel",
            pod_name: "ztunnel-x1".into(),
            pod_namespace: "istio-system".into(),
            instance_ip: "10.0.0.7".into(),
            node_name: "node-1".into(),
            cluster_id: "Kubernetes".into(),
            extra_metadata: vec![
                ("NAMESPACE".into(), "spoofed".into()),
                ("FOO".into(), "bar".into()),
            ],
        }
        .to_node();
        assert_eq!(
            node.id,
            "ztunnel~10.0.0.7~ztunnel-x1.istio-system~istio-system.svc.cluster.local"
        );
        let md = node.metadata.unwrap();
        assert_eq!(string_field(&md, "NAMESPACE"), Some("istio-system"));
        assert_eq!(string_field(&md, "NAME"), Some("ztunnel-x1"));
        assert_eq!(string_field(&md, "INSTANCE_IPS"), Some("10.0.0.7"));
        assert_eq!(string_field(&md, "NODE_NAME"), Some("node-1"));
        assert_eq!(string_field(&md, "CLUSTER_ID"), Some("Kubernetes"));
        assert_eq!(string_field(&md, "FOO"), Some("bar"));
    }
}
