//! Delta ADS (`DeltaAggregatedResources` on 15012): Istio's workload discovery for
//! ztunnels, as istiod serves it.
//!
//! Each stream is authenticated with the caller's token (as the CA is); its first
//! request must name a node whose metadata `NAMESPACE` is the token's namespace. A
//! trusted node account (ztunnel's) gets the resources, which describe every workload
//! of the mesh: its stream runs on its own task ([`connection`]) against the shared
//! [`ResourceStore`], so a slow or stuck client holds up nobody but itself. A caller
//! from istiod's own namespace asking for `istio.io/debug/syncz` gets the proxies'
//! sync status ([`debug`]) and nothing else.

pub mod connection;
pub mod debug;
pub mod grpc;
pub mod metrics;
pub mod status;
pub mod store;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use shared_types::istio::xds::{
    string_field, AggregatedDiscoveryService, DeltaDiscoveryRequest, DeltaDiscoveryResponse,
    DiscoveryRequest, DiscoveryResponse, ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL,
};
use shared_types::waypoint::{WAYPOINT_POLICY_TYPE_URL, WAYPOINT_ROUTE_TYPE_URL};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::ca::authn::{AuthnError, Caller, TokenAuthenticator};
use crate::kube::pods::PodIndex;
pub use metrics::XdsMetrics;
pub use status::{Connections, ProxyStatus, SyncState};
pub use store::ResourceStore;

/// The types served: Istio's for ztunnels, and the waypoints' policies and routes.
pub const TYPES: [&str; 4] = [
    ADDRESS_TYPE_URL,
    AUTHORIZATION_TYPE_URL,
    WAYPOINT_POLICY_TYPE_URL,
    WAYPOINT_ROUTE_TYPE_URL,
];
/// How long a stream may take to send its first request.
const FIRST_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Responses queued per stream before its task waits: a stuck client costs one
/// response of memory, and what changes meanwhile is coalesced into the next one.
const QUEUE: usize = 1;

pub struct AdsService {
    pub store: ResourceStore,
    pub authn: Arc<TokenAuthenticator>,
    /// (namespace, service account) allowed to stream: the node proxies.
    pub trusted: HashSet<(String, String)>,
    /// Pods by name: a waypoint's pod-bound token may stream too.
    pub pods: PodIndex,
    /// istiod's namespace: its accounts may read the debug types.
    pub system_namespace: String,
    /// A burst of changes within this window is one push per stream.
    pub debounce: Duration,
    pub connections: Connections,
    pub metrics: Arc<XdsMetrics>,
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for AdsService {
    type StreamAggregatedResourcesStream = ReceiverStream<Result<DiscoveryResponse, Status>>;
    type DeltaAggregatedResourcesStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn stream_aggregated_resources(
        &self,
        _request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        Err(Status::unimplemented(
            "only delta xDS (DeltaAggregatedResources) is served, as istiod serves ztunnels",
        ))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let caller = self
            .authn
            .authenticate(request.metadata())
            .await
            .map_err(|e| self.refuse(e.reason(), authn_status(e)))?;
        let mut requests = request.into_inner();
        let first = match tokio::time::timeout(FIRST_REQUEST_TIMEOUT, requests.message()).await {
            Ok(Ok(Some(first))) => first,
            Ok(Ok(None)) => return Err(Status::cancelled("the stream ended before a request")),
            Ok(Err(status)) => return Err(status),
            Err(_) => {
                return Err(self.refuse(
                    "no_request",
                    Status::deadline_exceeded("no request in time"),
                ))
            }
        };
        let node = first.node.clone().ok_or_else(|| {
            self.refuse(
                "no_node",
                Status::invalid_argument("the first request names no node"),
            )
        })?;
        let id = &caller.identity;
        let namespace = node
            .metadata
            .as_ref()
            .and_then(|md| string_field(md, shared_types::istio::xds::node_metadata::NAMESPACE))
            .unwrap_or_default();
        if namespace != id.namespace {
            return Err(self.refuse(
                "namespace_mismatch",
                Status::permission_denied(format!(
                    "the node's NAMESPACE {namespace:?} is not the token's namespace {:?}",
                    id.namespace
                )),
            ));
        }
        let (responses, rx) = mpsc::channel(QUEUE);
        let proxy = self
            .trusted
            .contains(&(id.namespace.clone(), id.service_account.clone()))
            || self.is_waypoint(&caller);
        if !proxy {
            if debug::serves(&first.type_url) && id.namespace == self.system_namespace {
                tracing::debug!(caller = %id, "xDS debug stream open");
                tokio::spawn(debug::serve(
                    self.connections.clone(),
                    self.store.clone(),
                    first,
                    requests,
                    responses,
                ));
                return Ok(Response::new(ReceiverStream::new(rx)));
            }
            return Err(self.refuse(
                "untrusted_caller",
                Status::permission_denied(format!(
                    "{id} is not a node proxy account (CA_TRUSTED_NODE_ACCOUNTS), nor a waypoint's pod, nor a debug caller from istiod's namespace"
                )),
            ));
        }
        let registration = self.connections.register(&node.id, id.to_uri());
        tracing::info!(node = %node.id, caller = %id, "xDS stream open");
        tokio::spawn(
            connection::Connection::new(
                self.store.clone(),
                self.debounce,
                registration,
                self.metrics.clone(),
            )
            .serve(first, requests, responses),
        );
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

impl AdsService {
    /// Whether the caller's token is bound to a waypoint's pod (the one with that UID).
    fn is_waypoint(&self, caller: &Caller) -> bool {
        let Some(bound) = &caller.pod else {
            return false;
        };
        self.pods
            .get(&caller.identity.namespace, &bound.name)
            .is_some_and(|pod| pod.uid == bound.uid && pod.waypoint)
    }

    fn refuse(&self, reason: &'static str, status: Status) -> Status {
        tracing::info!(reason, error = %status.message(), "xDS stream refused");
        self.metrics.refused(reason);
        status
    }
}

fn authn_status(e: AuthnError) -> Status {
    match e {
        AuthnError::Review(_) => Status::unavailable(e.to_string()),
        _ => Status::unauthenticated(e.to_string()),
    }
}
