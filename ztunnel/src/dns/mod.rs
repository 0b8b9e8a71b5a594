//! ztunnel's DNS proxy, as Istio's: the node agent's DNS capture sends a pod's queries
//! to 15053 inside the pod, where ztunnel answers A and AAAA for the mesh's service
//! hostnames from its own state and forwards everything else to the node's resolvers.
//!
//! hickory-proto parses and writes the messages; the sockets are ztunnel's own (created
//! in the pod's namespace, marked), so the serving loops are here rather than in
//! hickory-server.

pub mod forward;
pub mod local;
pub mod metrics;
pub mod names;
mod server;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use hickory_proto::op::{Edns, Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::Record;

pub use forward::Forwarder;
pub use local::LocalZone;
pub use metrics::DnsMetrics;
pub use server::DnsServer;

use self::local::LocalAnswer;
use self::metrics::DnsLabels;
use crate::config::Config;
use crate::drain::Drain;
use crate::proxy::LocalWorkload;
use crate::socket::SocketFactory;
use crate::state::StateStore;

/// Where ztunnel, as Istio's, finds the resolvers it forwards to.
pub const RESOLV_CONF: &str = "/etc/resolv.conf";

/// What every workload's DNS proxy shares.
#[derive(Clone)]
pub struct DnsProxy {
    pub addr: SocketAddr,
    pub zone: Arc<LocalZone>,
    pub upstreams: Arc<[SocketAddr]>,
    pub metrics: Arc<DnsMetrics>,
    pub state: StateStore,
}

impl DnsProxy {
    /// The proxy `config` asks for, or `None` when ISTIO_META_DNS_CAPTURE turns it off.
    pub fn from_config(
        config: &Config,
        state: &StateStore,
        metrics: &Arc<DnsMetrics>,
    ) -> Option<Self> {
        if !config.dns_capture {
            return None;
        }
        let upstreams = forward::upstreams_from_resolv_conf(Path::new(RESOLV_CONF));
        tracing::info!(addr = %config.dns_proxy_addr, ?upstreams, "DNS proxy on");
        Some(DnsProxy {
            addr: config.dns_proxy_addr,
            zone: Arc::new(LocalZone {
                cluster_domain: config.cluster_domain.clone(),
                ipv6_enabled: config.ipv6_enabled,
            }),
            upstreams: upstreams.into(),
            metrics: metrics.clone(),
            state: state.clone(),
        })
    }

    /// Binds `client`'s DNS server with `sockets` (in its namespace) and serves it
    /// until `drain` stops accepting.
    pub async fn start(
        &self,
        sockets: Arc<dyn SocketFactory>,
        client: LocalWorkload,
        drain: Drain,
    ) -> std::io::Result<Vec<tokio::task::JoinHandle<()>>> {
        let server = DnsServer::bind(sockets.as_ref(), self.addr).await?;
        let handler = DnsHandler {
            state: self.state.clone(),
            zone: self.zone.clone(),
            metrics: self.metrics.clone(),
            forwarder: Forwarder {
                upstreams: self.upstreams.clone(),
                sockets,
            },
            client,
        };
        Ok(server.spawn(Arc::new(handler), drain))
    }
}

/// The transport a query came over; names the `request_protocol` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Udp,
    Tcp,
}

impl Protocol {
    fn label(self) -> &'static str {
        match self {
            Protocol::Udp => "udp",
            Protocol::Tcp => "tcp",
        }
    }
}

/// The largest UDP answer when the client does not say (RFC 1035).
const CLASSIC_UDP_SIZE: usize = 512;

/// What to do with one message a client sent.
pub enum Step {
    /// Send this answer.
    Reply(Vec<u8>),
    /// Not a mesh name: forward the query.
    Forward(Box<Upstream>),
    /// Not a DNS query at all (or a response): say nothing.
    Ignore,
}

/// A query on its way upstream, with what its answer will be counted under.
pub struct Upstream {
    query: Vec<u8>,
    request: Message,
    labels: DnsLabels,
}

/// Answers the queries of one client workload (a pod, or the VM in dedicated mode).
pub struct DnsHandler {
    pub state: StateStore,
    pub zone: Arc<LocalZone>,
    pub metrics: Arc<DnsMetrics>,
    pub forwarder: Forwarder,
    pub client: LocalWorkload,
}

impl DnsHandler {
    /// Decides on `bytes` at once: a local answer, a query to forward, or nothing.
    pub fn step(&self, bytes: &[u8], protocol: Protocol) -> Step {
        let request = match Message::from_vec(bytes) {
            Ok(request) => request,
            Err(_) => return formerr(bytes),
        };
        if request.message_type() != MessageType::Query {
            return Step::Ignore; // never answer an answer (no reflection loops)
        }
        let labels = self.labels(&request, protocol);
        self.metrics.requests.get_or_create(&labels).inc();
        if request.op_code() != OpCode::Query {
            return Step::Reply(encode(
                &error(&request, ResponseCode::NotImp),
                protocol,
                &request,
            ));
        }
        let [query] = request.queries() else {
            return Step::Reply(encode(
                &error(&request, ResponseCode::FormErr),
                protocol,
                &request,
            ));
        };
        let state = self.state.snapshot();
        match self.zone.answer(
            &state,
            query.name(),
            query.query_type(),
            &self.client.namespace,
        ) {
            LocalAnswer::Records(records) => Step::Reply(encode(
                &authoritative(&request, records),
                protocol,
                &request,
            )),
            LocalAnswer::Unknown => Step::Forward(Box::new(Upstream {
                query: bytes.to_vec(),
                request,
                labels,
            })),
        }
    }

    /// The upstream's answer to a forwarded query; SERVFAIL when none answered. On
    /// demand, a Kubernetes Service name the state misses is first asked of istiod.
    pub async fn forward(&self, upstream: Box<Upstream>, protocol: Protocol) -> Vec<u8> {
        if let Some(answer) = self.answer_on_demand(&upstream.request, protocol).await {
            return answer;
        }
        self.metrics
            .upstream_requests
            .get_or_create(&upstream.labels)
            .inc();
        let started = Instant::now();
        let result = self.forwarder.forward(&upstream.query, protocol).await;
        self.metrics
            .upstream_duration
            .get_or_create(&upstream.labels)
            .observe(started.elapsed().as_secs_f64());
        match result {
            Ok(answer) => answer,
            Err(e) => {
                tracing::debug!(error = %e, "DNS upstream failed");
                self.metrics
                    .upstream_failures
                    .get_or_create(&upstream.labels)
                    .inc();
                let failure = error(&upstream.request, ResponseCode::ServFail);
                encode(&failure, protocol, &upstream.request)
            }
        }
    }

    /// Fetches the Services the query may name (`<svc>.<ns>.svc.<domain>` forms of
    /// its candidates) and answers locally if one of them exists.
    async fn answer_on_demand(&self, request: &Message, protocol: Protocol) -> Option<Vec<u8>> {
        if !self.state.is_on_demand() {
            return None;
        }
        let query = request.queries().first()?;
        let namespace = &self.client.namespace;
        let services = self.zone.service_hostnames(query.name(), namespace);
        futures::future::join_all(
            services
                .iter()
                .map(|(ns, hostname)| self.state.fetch_service(ns, hostname)),
        )
        .await;
        let state = self.state.snapshot();
        match self
            .zone
            .answer(&state, query.name(), query.query_type(), namespace)
        {
            LocalAnswer::Records(records) => {
                Some(encode(&authoritative(request, records), protocol, request))
            }
            LocalAnswer::Unknown => None,
        }
    }

    fn labels(&self, request: &Message, protocol: Protocol) -> DnsLabels {
        let workload = self
            .state
            .workload_by_name(&self.client.namespace, &self.client.name);
        let known = |s: Option<&String>| match s {
            Some(s) if !s.is_empty() => s.clone(),
            _ => "unknown".to_owned(),
        };
        DnsLabels {
            request_query_type: request
                .queries()
                .first()
                .map(|q| q.query_type().to_string())
                .unwrap_or_else(|| "unknown".into()),
            request_protocol: protocol.label(),
            source_canonical_service: known(workload.as_ref().map(|w| &w.canonical_name)),
            source_canonical_revision: known(workload.as_ref().map(|w| &w.canonical_revision)),
        }
    }
}

/// A response to `request` with its id, opcode, question and RD flag.
fn response_to(request: &Message, code: ResponseCode) -> Message {
    let mut response = Message::new();
    response
        .set_id(request.id())
        .set_message_type(MessageType::Response)
        .set_op_code(request.op_code())
        .set_recursion_desired(request.recursion_desired())
        .set_recursion_available(true)
        .set_response_code(code)
        .add_queries(request.queries().iter().cloned());
    if let Some(edns) = request.extensions() {
        let mut ours = Edns::new();
        ours.set_max_payload(edns.max_payload().max(CLASSIC_UDP_SIZE as u16));
        response.set_edns(ours);
    }
    response
}

fn authoritative(request: &Message, records: Vec<Record>) -> Message {
    let mut response = response_to(request, ResponseCode::NoError);
    response.set_authoritative(true).add_answers(records);
    response
}

fn error(request: &Message, code: ResponseCode) -> Message {
    response_to(request, code)
}

/// FORMERR for a message that does not parse but has a query's header; nothing for
/// anything shorter or for a response.
fn formerr(bytes: &[u8]) -> Step {
    if bytes.len() < 12 || bytes[2] & 0x80 != 0 {
        return Step::Ignore;
    }
    let mut response = Message::new();
    response
        .set_id(u16::from_be_bytes([bytes[0], bytes[1]]))
        .set_message_type(MessageType::Response)
        .set_op_code(OpCode::from_u8((bytes[2] >> 3) & 0x0f))
        .set_response_code(ResponseCode::FormErr);
    match response.to_vec() {
        Ok(bytes) => Step::Reply(bytes),
        Err(_) => Step::Ignore,
    }
}

/// Wire bytes of `response`; over UDP, larger than the client takes, only the header
/// and question with TC set, so the client asks again over TCP.
fn encode(response: &Message, protocol: Protocol, request: &Message) -> Vec<u8> {
    let limit = match protocol {
        Protocol::Tcp => usize::from(u16::MAX),
        Protocol::Udp => request
            .extensions()
            .as_ref()
            .map_or(CLASSIC_UDP_SIZE, |e| usize::from(e.max_payload()))
            .max(CLASSIC_UDP_SIZE),
    };
    match response.to_vec() {
        Ok(bytes) if bytes.len() <= limit => bytes,
        _ => {
            let mut truncated = response_to(request, response.response_code());
            truncated
                .set_authoritative(response.authoritative())
                .set_truncated(true);
            truncated.to_vec().unwrap_or_default()
        }
    }
}

#[cfg(test)]
mod tests;
