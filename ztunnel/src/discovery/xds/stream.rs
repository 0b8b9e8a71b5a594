//! The delta ADS stream: subscribe, apply each response, ACK or NACK it, and
//! reconnect with backoff when the stream ends.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use shared_types::istio::xds::{
    AggregatedDiscoveryServiceClient, DeltaDiscoveryRequest, DeltaDiscoveryResponse, Node, Status,
    ADDRESS_TYPE_URL,
};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::demand::Pending;
use super::metrics::{TerminationLabels, XdsMetrics};
use super::resources::Resources;
use super::SOURCE;
use crate::control_plane::ControlPlane;
use crate::state::demand::Lookups;
use crate::state::StateStore;
use mesh_runtime::readiness::BlockReady;

/// Istio's ztunnel: 10 ms, doubling up to 15 s.
const BACKOFF_MIN: Duration = Duration::from_millis(10);
const BACKOFF_MAX: Duration = Duration::from_secs(15);
/// A full push for a large cluster is bigger than gRPC's default 4 MiB.
const MAX_MESSAGE_BYTES: usize = 256 << 20;
/// Requests queued for the gRPC stream: the subscriptions, then ACKs and lookups.
const REQUEST_QUEUE: usize = 64;

pub struct Client {
    pub control_plane: ControlPlane,
    pub node: Node,
    pub state: StateStore,
    pub metrics: Arc<XdsMetrics>,
    /// On-demand Address lookups (`XDS_ON_DEMAND`); None: a wildcard subscription.
    pub lookups: Option<Lookups>,
    /// The types subscribed to, in order.
    pub types: &'static [&'static str],
}

/// What the session loop waits for.
enum Event {
    Response(Result<Option<DeltaDiscoveryResponse>, tonic::Status>),
    Lookup(String, oneshot::Sender<()>),
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
    mut client: Client,
    ready: Option<BlockReady>,
    synced: watch::Sender<bool>,
    cancel: CancellationToken,
) {
    let mut resources = Resources::new(client.types);
    let mut pending = Pending::default();
    let mut ready = ready;
    let mut backoff = BACKOFF_MIN;
    loop {
        let ended = tokio::select! {
            _ = cancel.cancelled() => break,
            ended = client.session(&mut resources, &mut pending, &mut ready, &synced) => ended,
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
        &mut self,
        resources: &mut Resources,
        pending: &mut Pending,
        ready: &mut Option<BlockReady>,
        synced: &watch::Sender<bool>,
    ) -> Ended {
        // The subscriptions are queued before the call, so they are the stream's first
        // messages; after them come ACKs and lookups, each sent as the loop gets to it.
        let (requests, rx) = mpsc::channel(REQUEST_QUEUE);
        for &type_url in resources.types() {
            let initial_resource_versions = resources.versions(type_url);
            let mut subscribe = DeltaDiscoveryRequest {
                node: Some(self.node.clone()),
                type_url: type_url.to_owned(),
                ..Default::default()
            };
            if self.lookups.is_some() && type_url == ADDRESS_TYPE_URL {
                // On demand: `*` in and out is "nothing yet"; after a reconnect, what
                // was followed and what is still being looked up.
                subscribe.resource_names_subscribe = std::iter::once("*".to_owned())
                    .chain(initial_resource_versions.keys().cloned())
                    .chain(pending.keys().cloned())
                    .collect();
                subscribe.resource_names_unsubscribe = vec!["*".to_owned()];
            }
            subscribe.initial_resource_versions = initial_resource_versions;
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
            let event = tokio::select! {
                response = responses.message() => Event::Response(response),
                Some((key, waiter)) = next_lookup(&mut self.lookups) => Event::Lookup(key, waiter),
            };
            let response = match event {
                Event::Lookup(key, waiter) => {
                    if pending.add(key.clone(), waiter) {
                        debug!(%key, "on-demand lookup");
                        let lookup = DeltaDiscoveryRequest {
                            type_url: ADDRESS_TYPE_URL.to_owned(),
                            resource_names_subscribe: vec![key],
                            ..Default::default()
                        };
                        if requests.send(lookup).await.is_err() {
                            return Ended::Broken {
                                responses: count,
                                error: "the request stream closed".into(),
                            };
                        }
                    }
                    continue;
                }
                Event::Response(response) => response,
            };
            let response = match response {
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
            self.metrics.total_size.inc_by(
                response
                    .resources
                    .iter()
                    .filter_map(|r| r.resource.as_ref())
                    .map(|any| any.value.len() as u64)
                    .sum(),
            );
            let (added, removed) = (response.resources.len(), response.removed_resources.len());

            let answered = if type_url == ADDRESS_TYPE_URL {
                Pending::answered_by(&response)
            } else {
                Vec::new()
            };
            let errors = resources.apply(response);
            self.state.replace_source(SOURCE, resources.state().clone());
            pending.answer(&answered);
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
            if !*synced.borrow() && resources.types().iter().all(|t| acked.contains(*t)) {
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

/// The next lookup to send; never, without on-demand (or once its senders are gone).
async fn next_lookup(lookups: &mut Option<Lookups>) -> Option<(String, oneshot::Sender<()>)> {
    match lookups {
        Some(l) => match l.next().await {
            Some(lookup) => Some(lookup),
            None => {
                *lookups = None;
                std::future::pending().await
            }
        },
        None => std::future::pending().await,
    }
}

fn status_text(status: &tonic::Status) -> String {
    format!("{:?}: {}", status.code(), status.message())
}
