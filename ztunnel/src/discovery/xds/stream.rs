//! The delta ADS stream: subscribe, apply each response, ACK or NACK it, and
//! reconnect with backoff when the stream ends.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use shared_types::istio::xds::{
    AggregatedDiscoveryServiceClient, DeltaDiscoveryRequest, Node, Status,
};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::metrics::{TerminationLabels, XdsMetrics};
use super::resources::{Resources, TYPES};
use super::SOURCE;
use crate::control_plane::ControlPlane;
use crate::discovery::waypoints::{self, WaypointWarnings};
use crate::readiness::BlockReady;
use crate::state::StateStore;

/// Istio's ztunnel: 10 ms, doubling up to 15 s.
const BACKOFF_MIN: Duration = Duration::from_millis(10);
const BACKOFF_MAX: Duration = Duration::from_secs(15);
/// A full push for a large cluster is bigger than gRPC's default 4 MiB.
const MAX_MESSAGE_BYTES: usize = 256 << 20;

pub struct Client {
    pub control_plane: ControlPlane,
    pub node: Node,
    pub state: StateStore,
    pub metrics: Arc<XdsMetrics>,
}

/// How one stream ended.
enum Ended {
    /// No stream was opened (connect, TLS or authentication failed).
    NotOpened(String),
    /// The stream broke, after `responses` responses.
    Broken { responses: u64, error: String },
    /// istiod closed the stream cleanly.
    Closed { responses: u64 },
}

pub async fn run(
    client: Client,
    ready: Option<BlockReady>,
    synced: watch::Sender<bool>,
    cancel: CancellationToken,
) {
    let mut resources = Resources::default();
    let mut waypoints = WaypointWarnings::default();
    let mut ready = ready;
    let mut backoff = BACKOFF_MIN;
    loop {
        let ended = tokio::select! {
            _ = cancel.cancelled() => break,
            ended = client.session(&mut resources, &mut waypoints, &mut ready, &synced) => ended,
        };
        let (reason, got_responses) = match &ended {
            Ended::NotOpened(error) => {
                warn!(?backoff, "cannot open the xDS stream: {error}");
                ("ConnectionError", false)
            }
            Ended::Broken { responses, error } => {
                warn!(?backoff, "the xDS stream broke: {error}");
                ("Error", *responses > 0)
            }
            Ended::Closed { responses } => {
                info!(?backoff, "istiod closed the xDS stream");
                ("Complete", *responses > 0)
            }
        };
        client
            .metrics
            .terminations
            .get_or_create(&TerminationLabels { reason })
            .inc();
        if got_responses {
            backoff = BACKOFF_MIN;
        }
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
    debug!("xDS client stopped");
}

impl Client {
    async fn session(
        &self,
        resources: &mut Resources,
        waypoints: &mut WaypointWarnings,
        ready: &mut Option<BlockReady>,
        synced: &watch::Sender<bool>,
    ) -> Ended {
        // Both subscriptions are queued before the call, so they are the stream's first
        // messages; the channel never holds more than them plus one ACK.
        let (requests, rx) = mpsc::channel(TYPES.len() + 1);
        for type_url in TYPES {
            let subscribe = DeltaDiscoveryRequest {
                node: Some(self.node.clone()),
                type_url: type_url.to_owned(),
                initial_resource_versions: resources.versions(type_url),
                ..Default::default()
            };
            // Cannot fail: the channel has room and its receiver is held above.
            let _ = requests.try_send(subscribe);
        }
        let request = match self.control_plane.request(ReceiverStream::new(rx)) {
            Ok(request) => request,
            Err(e) => return Ended::NotOpened(e.to_string()),
        };
        let mut ads = AggregatedDiscoveryServiceClient::new(self.control_plane.channel())
            .max_decoding_message_size(MAX_MESSAGE_BYTES);
        let mut responses = match ads.delta_aggregated_resources(request).await {
            Ok(response) => response.into_inner(),
            Err(status) => return Ended::NotOpened(status_text(&status)),
        };
        info!("xDS stream open");

        let mut acked: HashSet<String> = HashSet::new();
        let mut count = 0;
        loop {
            let response = match responses.message().await {
                Ok(Some(response)) => response,
                Ok(None) => return Ended::Closed { responses: count },
                Err(status) => {
                    return Ended::Broken {
                        responses: count,
                        error: status_text(&status),
                    }
                }
            };
            count += 1;
            let type_url = response.type_url.clone();
            let nonce = response.nonce.clone();
            let labels = XdsMetrics::url(&type_url);
            self.metrics.messages.get_or_create(&labels).inc();
            let bytes: usize = response
                .resources
                .iter()
                .filter_map(|r| r.resource.as_ref())
                .map(|any| any.encoded_len())
                .sum();
            self.metrics
                .message_bytes
                .get_or_create(&labels)
                .inc_by(bytes as u64);
            let (added, removed) = (response.resources.len(), response.removed_resources.len());

            let errors = resources.apply(response);
            self.state.replace_source(SOURCE, resources.state().clone());
            waypoints.report(SOURCE, waypoints::bound_in(resources.state()));
            let error_detail = (!errors.is_empty()).then(|| {
                let message = errors
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ");
                warn!(%type_url, %nonce, rejected = errors.len(), "NACK: {message}");
                self.metrics.nacks.get_or_create(&labels).inc();
                Status {
                    code: tonic::Code::InvalidArgument as i32,
                    message,
                    details: Vec::new(),
                }
            });
            debug!(%type_url, %nonce, added, removed, nack = error_detail.is_some(), "xDS response applied");
            let ack = DeltaDiscoveryRequest {
                type_url: type_url.clone(),
                response_nonce: nonce,
                error_detail,
                ..Default::default()
            };
            if requests.send(ack).await.is_err() {
                return Ended::Broken {
                    responses: count,
                    error: "the request stream closed".into(),
                };
            }
            acked.insert(type_url);
            if !*synced.borrow() && TYPES.iter().all(|t| acked.contains(*t)) {
                let (workloads, services, policies) = resources.state().counts();
                info!(
                    workloads,
                    services, policies, "xDS synced: a response of each type applied"
                );
                *ready = None;
                synced.send_replace(true);
            }
        }
    }
}

fn status_text(status: &tonic::Status) -> String {
    format!("{:?}: {}", status.code(), status.message())
}
