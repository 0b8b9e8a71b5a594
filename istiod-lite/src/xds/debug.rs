//! Debug streams, for callers from istiod's own namespace (Istio's rule for its debug
//! types), which are not proxies: `istio.io/debug/syncz` is answered with one envoy
//! `ClientConfig` per connected proxy and each type's sync state, as istiod answers
//! `istioctl proxy-status`; a request for Address or Authorization with every
//! resource of the type (the control plane's view, for `istioctl-lite ztunnel-config
//! --from-control-plane`). Each request gets one answer; nothing is pushed.

use prost::Message;
use shared_types::istio::xds::{
    resource, string_struct, Any, ClientConfig, ConfigStatus, DeltaDiscoveryRequest,
    DeltaDiscoveryResponse, GenericXdsConfig, Node, CLIENT_CONFIG_TYPE_URL, SYNCZ_TYPE_URL,
};
use tokio::sync::mpsc;
use tonic::{Status, Streaming};

use super::status::{Connections, ProxyStatus, SyncState};
use super::store::ResourceStore;
use super::TYPES;

/// Whether a debug stream may ask for `type_url`.
pub fn serves(type_url: &str) -> bool {
    type_url == SYNCZ_TYPE_URL || TYPES.contains(&type_url)
}

/// Answers every request of the stream once, with the current state.
pub async fn serve(
    connections: Connections,
    store: ResourceStore,
    first: DeltaDiscoveryRequest,
    mut requests: Streaming<DeltaDiscoveryRequest>,
    responses: mpsc::Sender<Result<DeltaDiscoveryResponse, Status>>,
) {
    let mut request = Some(first);
    let mut nonce = 0u64;
    while let Some(current) = request {
        if serves(&current.type_url) && current.response_nonce.is_empty() {
            nonce += 1;
            let answer = if current.type_url == SYNCZ_TYPE_URL {
                syncz(&connections, nonce)
            } else {
                snapshot(&store, &current.type_url, nonce)
            };
            if responses.send(Ok(answer)).await.is_err() {
                return;
            }
        }
        request = requests.message().await.ok().flatten();
    }
}

fn snapshot(store: &ResourceStore, type_url: &str, nonce: u64) -> DeltaDiscoveryResponse {
    DeltaDiscoveryResponse {
        type_url: type_url.into(),
        nonce: nonce.to_string(),
        resources: store
            .all(type_url)
            .into_iter()
            .map(|(name, entry)| resource(&*name, entry.version(), entry.body.clone()))
            .collect(),
        ..Default::default()
    }
}

fn syncz(connections: &Connections, nonce: u64) -> DeltaDiscoveryResponse {
    DeltaDiscoveryResponse {
        type_url: SYNCZ_TYPE_URL.into(),
        nonce: nonce.to_string(),
        resources: connections
            .snapshot()
            .iter()
            .map(|proxy| {
                let body = Any {
                    type_url: CLIENT_CONFIG_TYPE_URL.into(),
                    value: client_config(proxy).encode_to_vec(),
                };
                resource(&proxy.node_id, "", body)
            })
            .collect(),
        ..Default::default()
    }
}

fn client_config(proxy: &ProxyStatus) -> ClientConfig {
    let connected_at = proxy.connected_at.to_string();
    ClientConfig {
        node: Some(Node {
            id: proxy.node_id.clone(),
            metadata: Some(string_struct([
                ("identity", proxy.identity.as_str()),
                ("connected_at", connected_at.as_str()),
            ])),
            ..Default::default()
        }),
        generic_xds_configs: proxy
            .types
            .iter()
            .map(|(type_url, t)| {
                let status = match t.state() {
                    SyncState::Synced => ConfigStatus::Synced,
                    SyncState::NotSent => ConfigStatus::NotSent,
                    SyncState::Stale if t.nacked.is_some() => ConfigStatus::Error,
                    SyncState::Stale => ConfigStatus::Stale,
                };
                let nonces = string_struct([
                    ("nonce_sent", t.nonce_sent.as_str()),
                    ("nonce_acked", t.nonce_acked.as_str()),
                    ("nack", t.nacked.as_deref().unwrap_or_default()),
                ]);
                GenericXdsConfig {
                    type_url: type_url.clone(),
                    version_info: t.version.to_string(),
                    config_status: status as i32,
                    xds_config: Some(Any {
                        type_url: "type.googleapis.com/google.protobuf.Struct".into(),
                        value: nonces.encode_to_vec(),
                    }),
                    ..Default::default()
                }
            })
            .collect(),
        ..Default::default()
    }
}
