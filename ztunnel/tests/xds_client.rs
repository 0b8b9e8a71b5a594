//! ztunnel's delta xDS client against a scripted istiod: real gRPC over TLS on
//! 127.0.0.1, the server side played by the test so every message on the wire is
//! checked (subscriptions, node identity, headers, ACKs, NACKs, reconnects).
//! No root needed.

use std::sync::Arc;
use std::time::Duration;
use test_support::poll::eventually;

use mesh_ca::CertificateAuthority;
use mesh_runtime::readiness::Readiness;
use prost::Message;
use rustls::pki_types::PrivateKeyDer;
use shared_types::istio::security as pb_sec;
use shared_types::istio::workload as pb;
use shared_types::istio::xds::{
    self as wire, string_field, AggregatedDiscoveryService, AggregatedDiscoveryServiceServer, Any,
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse, Resource,
    ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL,
};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status, Streaming};
use ztunnel::control_plane::{ControlPlaneConfig, TokenSource};
use ztunnel::discovery::xds::{self, NodeIdentity, XdsConfig, XdsMetrics};
use ztunnel::discovery::FirstSync;
use ztunnel::state::{Action, StateStore};

const WAIT: Duration = Duration::from_secs(10);
const SERVER_NAME: &str = "istiod.istio-system.svc";

/// One stream the client opened: its headers, what it sends, and a way to answer.
struct Opened {
    metadata: MetadataMap,
    requests: Streaming<DeltaDiscoveryRequest>,
    responses: mpsc::Sender<Result<DeltaDiscoveryResponse, Status>>,
}

impl Opened {
    async fn next(&mut self) -> DeltaDiscoveryRequest {
        tokio::time::timeout(WAIT, self.requests.message())
            .await
            .expect("a request in time")
            .expect("a readable stream")
            .expect("the stream is still open")
    }

    async fn send(&self, response: DeltaDiscoveryResponse) {
        self.responses
            .send(Ok(response))
            .await
            .expect("the client listens");
    }
}

/// The scripted istiod: hands each opened stream to the test, or refuses it.
struct FakeIstiod {
    opened: mpsc::UnboundedSender<Opened>,
    refuse: Option<Status>,
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for FakeIstiod {
    type StreamAggregatedResourcesStream = ReceiverStream<Result<DiscoveryResponse, Status>>;
    type DeltaAggregatedResourcesStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn stream_aggregated_resources(
        &self,
        _request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        Err(Status::unimplemented("delta only"))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        if let Some(status) = &self.refuse {
            return Err(status.clone());
        }
        let (tx, rx) = mpsc::channel(16);
        let (metadata, _, requests) = request.into_parts();
        let _ = self.opened.send(Opened {
            metadata,
            requests,
            responses: tx,
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// The fake istiod on 127.0.0.1 with a serving certificate for [`SERVER_NAME`] from a
/// fresh mesh root; returns its address, the root's PEM, and the opened streams.
async fn start_istiod(
    refuse: Option<Status>,
    cancel: &CancellationToken,
) -> (String, String, mpsc::UnboundedReceiver<Opened>) {
    let ca = CertificateAuthority::generate_self_signed("cluster.local").unwrap();
    let serving = ca
        .issue_serving(&[SERVER_NAME.to_owned()], Duration::from_secs(3600))
        .unwrap();
    let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(serving.chain, PrivateKeyDer::Pkcs8(serving.key))
    .unwrap();
    tls.alpn_protocols = vec![b"h2".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let incoming = async_stream_of(listener, acceptor);
    let (opened, rx) = mpsc::unbounded_channel();
    let server = tonic::transport::Server::builder()
        .add_service(AggregatedDiscoveryServiceServer::new(FakeIstiod {
            opened,
            refuse,
        }))
        .serve_with_incoming_shutdown(incoming, cancel.clone().cancelled_owned());
    tokio::spawn(server);
    (addr, ca.roots_pem(), rx)
}

/// TLS-accepted connections as tonic's incoming stream.
fn async_stream_of(
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
) -> ReceiverStream<std::io::Result<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>> {
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            if let Ok(tls) = acceptor.accept(tcp).await {
                if tx.send(Ok(tls)).await.is_err() {
                    return;
                }
            }
        }
    });
    ReceiverStream::new(rx)
}

struct Client {
    store: StateStore,
    synced: FirstSync,
    readiness: Readiness,
    metrics: Arc<XdsMetrics>,
}

fn start_client(addr: &str, root_pem: &str, cancel: &CancellationToken) -> Client {
    start_client_with(addr, root_pem, cancel, None)
}

/// `on_demand`: Some(network) for `XDS_ON_DEMAND`.
fn start_client_with(
    addr: &str,
    root_pem: &str,
    cancel: &CancellationToken,
    on_demand: Option<String>,
) -> Client {
    let store = StateStore::new();
    let readiness = Readiness::new();
    let metrics = Arc::new(XdsMetrics::default());
    let config = XdsConfig {
        control_plane: ControlPlaneConfig {
            address: addr.to_owned(),
            root_ca: root_pem.parse().unwrap(),
            token: TokenSource::Literal("token-abc".into()),
            cluster_id: "Kubernetes".into(),
            alt_hostname: Some(SERVER_NAME.into()),
            extra_headers: vec![("X-Trace".into(), "t1".into())],
            packet_mark: 0,
        },
        node: NodeIdentity {
            node_type: "ztunnel",
            pod_name: "ztunnel-a1".into(),
            pod_namespace: "istio-system".into(),
            instance_ip: "10.0.0.7".into(),
            node_name: "node-1".into(),
            cluster_id: "Kubernetes".into(),
            extra_metadata: vec![],
        },
        on_demand,
        types: &xds::TYPES,
    };
    let synced = xds::start(
        config,
        store.clone(),
        metrics.clone(),
        Some(readiness.register("xds")),
        cancel.clone(),
    )
    .unwrap();
    Client {
        store,
        synced,
        readiness,
        metrics,
    }
}

/// istiod goes away mid-stream; the client's next stream.
async fn istiod_restarts(stream: Opened, opened: &mut mpsc::UnboundedReceiver<Opened>) -> Opened {
    stream
        .responses
        .send(Err(Status::unavailable("istiod restarting")))
        .await
        .unwrap();
    drop(stream);
    accept(opened).await
}

async fn accept(opened: &mut mpsc::UnboundedReceiver<Opened>) -> Opened {
    tokio::time::timeout(WAIT, opened.recv())
        .await
        .expect("the client opens a stream in time")
        .expect("the server runs")
}

fn workload(name: &str, ip: [u8; 4], version: &str) -> Resource {
    let uid = format!("Kubernetes//Pod/shop/{name}");
    let body = pb::Address {
        r#type: Some(pb::address::Type::Workload(pb::Workload {
            uid: uid.clone(),
            name: name.into(),
            namespace: "shop".into(),
            addresses: vec![ip.to_vec()],
            tunnel_protocol: pb::TunnelProtocol::Hbone as i32,
            ..Default::default()
        })),
    };
    resource(&uid, version, ADDRESS_TYPE_URL, body.encode_to_vec())
}

fn deny_policy(name: &str, version: &str) -> Resource {
    let body = pb_sec::Authorization {
        name: name.into(),
        namespace: "shop".into(),
        scope: pb_sec::Scope::Namespace as i32,
        action: pb_sec::Action::Deny as i32,
        ..Default::default()
    };
    resource(
        &format!("shop/{name}"),
        version,
        AUTHORIZATION_TYPE_URL,
        body.encode_to_vec(),
    )
}

fn resource(name: &str, version: &str, type_url: &str, value: Vec<u8>) -> Resource {
    let body = Any {
        type_url: type_url.into(),
        value,
    };
    wire::resource(name, version, body)
}

fn response(
    type_url: &str,
    nonce: &str,
    resources: Vec<Resource>,
    removed: &[&str],
) -> DeltaDiscoveryResponse {
    DeltaDiscoveryResponse {
        type_url: type_url.into(),
        nonce: nonce.into(),
        resources,
        removed_resources: removed.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn header<'m>(md: &'m MetadataMap, key: &str) -> Option<&'m str> {
    md.get(key).and_then(|v| v.to_str().ok())
}

#[tokio::test]
async fn subscribes_as_istios_ztunnel_then_acks_nacks_and_follows_removals() {
    let cancel = CancellationToken::new();
    let (addr, root, mut opened) = start_istiod(None, &cancel).await;
    let client = start_client(&addr, &root, &cancel);
    let mut stream = accept(&mut opened).await;

    assert_eq!(
        header(&stream.metadata, "authorization"),
        Some("Bearer token-abc")
    );
    assert_eq!(header(&stream.metadata, "clusterid"), Some("Kubernetes"));
    assert_eq!(header(&stream.metadata, "x-trace"), Some("t1"));
    for type_url in [ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL] {
        let subscribe = stream.next().await;
        assert_eq!(subscribe.type_url, type_url);
        assert!(subscribe.resource_names_subscribe.is_empty(), "wildcard");
        assert!(subscribe.initial_resource_versions.is_empty());
        assert!(subscribe.response_nonce.is_empty());
        let node = subscribe
            .node
            .expect("the first request of each type names the node");
        assert_eq!(
            node.id,
            "ztunnel~10.0.0.7~ztunnel-a1.istio-system~istio-system.svc.cluster.local"
        );
        let md = node.metadata.unwrap();
        assert_eq!(string_field(&md, "NAMESPACE"), Some("istio-system"));
        assert_eq!(string_field(&md, "NODE_NAME"), Some("node-1"));
    }
    assert!(!client.synced.is_synced());
    assert_eq!(client.readiness.pending(), vec!["xds"]);

    // One bad resource among good ones: the good ones apply, the NACK names the bad one.
    let mut bad = workload("bad", [10, 0, 0, 9], "1");
    bad.resource.as_mut().unwrap().value = vec![0xff; 3];
    stream
        .send(response(
            ADDRESS_TYPE_URL,
            "n1",
            vec![
                workload("a", [10, 0, 0, 1], "1"),
                bad,
                workload("b", [10, 0, 0, 2], "1"),
            ],
            &[],
        ))
        .await;
    let nack = stream.next().await;
    assert_eq!(
        (nack.type_url.as_str(), nack.response_nonce.as_str()),
        (ADDRESS_TYPE_URL, "n1")
    );
    let detail = nack.error_detail.expect("a NACK");
    assert!(
        detail.message.contains("Kubernetes//Pod/shop/bad"),
        "{}",
        detail.message
    );
    assert!(nack.node.is_none());
    assert_eq!(client.store.snapshot().counts().0, 2);
    assert!(!client.synced.is_synced(), "no Authorization response yet");

    stream
        .send(response(
            AUTHORIZATION_TYPE_URL,
            "n2",
            vec![deny_policy("deny-all", "1")],
            &[],
        ))
        .await;
    let ack = stream.next().await;
    assert_eq!(
        (ack.type_url.as_str(), ack.response_nonce.as_str()),
        (AUTHORIZATION_TYPE_URL, "n2")
    );
    assert!(ack.error_detail.is_none());
    assert!(tokio::time::timeout(WAIT, client.synced.wait_synced())
        .await
        .unwrap());
    assert!(client.readiness.is_ready());
    let policy = client.store.snapshot().policy("shop/deny-all").unwrap();
    assert_eq!(policy.action, Action::Deny);

    stream
        .send(response(
            ADDRESS_TYPE_URL,
            "n3",
            vec![],
            &["Kubernetes//Pod/shop/b"],
        ))
        .await;
    assert!(stream.next().await.error_detail.is_none());
    let state = client.store.snapshot();
    assert!(state.workload_by_ip("10.0.0.2".parse().unwrap()).is_none());
    assert!(state
        .workload_by_ip("10.0.0.1".parse().unwrap())
        .unwrap()
        .is_hbone());
    let nacks = client
        .metrics
        .nacks
        .get_or_create(&XdsMetrics::url(ADDRESS_TYPE_URL))
        .get();
    assert_eq!(nacks, 1);
    cancel.cancel();
}

#[tokio::test]
async fn a_reconnect_names_what_it_holds_and_the_state_is_served_meanwhile() {
    let cancel = CancellationToken::new();
    let (addr, root, mut opened) = start_istiod(None, &cancel).await;
    let client = start_client(&addr, &root, &cancel);
    let mut stream = accept(&mut opened).await;
    stream.next().await;
    stream.next().await;
    stream
        .send(response(
            ADDRESS_TYPE_URL,
            "n1",
            vec![
                workload("a", [10, 0, 0, 1], "v1"),
                workload("b", [10, 0, 0, 2], "v1"),
            ],
            &[],
        ))
        .await;
    stream.next().await;
    stream
        .send(response(
            AUTHORIZATION_TYPE_URL,
            "n2",
            vec![deny_policy("p", "v7")],
            &[],
        ))
        .await;
    stream.next().await;
    assert!(tokio::time::timeout(WAIT, client.synced.wait_synced())
        .await
        .unwrap());

    // istiod goes away mid-stream.
    let mut stream = istiod_restarts(stream, &mut opened).await;
    assert_eq!(
        client.store.snapshot().counts(),
        (2, 0, 1),
        "served while reconnecting"
    );

    let subscribe = stream.next().await;
    assert_eq!(subscribe.type_url, ADDRESS_TYPE_URL);
    let mut held: Vec<(String, String)> = subscribe.initial_resource_versions.into_iter().collect();
    held.sort();
    assert_eq!(
        held,
        vec![
            ("Kubernetes//Pod/shop/a".to_owned(), "v1".to_owned()),
            ("Kubernetes//Pod/shop/b".to_owned(), "v1".to_owned())
        ]
    );
    let subscribe = stream.next().await;
    assert_eq!(subscribe.type_url, AUTHORIZATION_TYPE_URL);
    assert_eq!(
        subscribe
            .initial_resource_versions
            .get("shop/p")
            .map(String::as_str),
        Some("v7")
    );

    // Only what changed meanwhile comes back: b moved, a is gone.
    stream
        .send(response(
            ADDRESS_TYPE_URL,
            "n3",
            vec![workload("b", [10, 0, 0, 3], "v2")],
            &["Kubernetes//Pod/shop/a"],
        ))
        .await;
    assert!(stream.next().await.error_detail.is_none());
    let state = client.store.snapshot();
    assert_eq!(state.counts(), (1, 0, 1));
    assert!(state.workload_by_ip("10.0.0.3".parse().unwrap()).is_some());
    let broken = client
        .metrics
        .terminations
        .get_or_create(&xds::metrics::TerminationLabels { reason: "Error" })
        .get();
    assert_eq!(broken, 1);
    cancel.cancel();
}

#[tokio::test]
async fn a_refused_stream_is_retried_with_backoff_and_never_ready() {
    let cancel = CancellationToken::new();
    let (addr, root, _opened) =
        start_istiod(Some(Status::unauthenticated("bad token")), &cancel).await;
    let client = start_client(&addr, &root, &cancel);
    let refused = || {
        client
            .metrics
            .terminations
            .get_or_create(&xds::metrics::TerminationLabels {
                reason: "ConnectionError",
            })
            .get()
    };
    eventually("three refused attempts", WAIT, || refused() >= 3).await;
    assert!(!client.synced.is_synced());
    assert_eq!(client.readiness.pending(), vec!["xds"]);
    cancel.cancel();
}

/// `XDS_ON_DEMAND`: the Address subscription starts as `*` in and out (nothing), a
/// lookup that misses subscribes `network/IP` and waits for the answer, and a
/// reconnect subscribes again to what was fetched.
#[tokio::test]
async fn on_demand_subscribes_nothing_then_each_lookup_and_again_after_a_reconnect() {
    let cancel = CancellationToken::new();
    let (addr, root, mut opened) = start_istiod(None, &cancel).await;
    let client = start_client_with(&addr, &root, &cancel, Some("net1".into()));
    let mut stream = accept(&mut opened).await;
    let addresses = stream.next().await;
    assert_eq!(addresses.type_url, ADDRESS_TYPE_URL);
    assert_eq!(addresses.resource_names_subscribe, vec!["*"]);
    assert_eq!(addresses.resource_names_unsubscribe, vec!["*"]);
    let policies = stream.next().await;
    assert!(
        policies.resource_names_subscribe.is_empty(),
        "policies stay wildcard"
    );
    stream
        .send(response(ADDRESS_TYPE_URL, "n1", vec![], &[]))
        .await;
    stream.next().await;
    stream
        .send(response(AUTHORIZATION_TYPE_URL, "n2", vec![], &[]))
        .await;
    stream.next().await;
    assert!(tokio::time::timeout(WAIT, client.synced.wait_synced())
        .await
        .unwrap());

    let ip: std::net::IpAddr = "10.0.0.5".parse().unwrap();
    let store = client.store.clone();
    let lookup = tokio::spawn(async move { store.fetch_address(ip).await });
    let asked = stream.next().await;
    assert_eq!(asked.type_url, ADDRESS_TYPE_URL);
    assert_eq!(asked.resource_names_subscribe, vec!["net1/10.0.0.5"]);
    assert!(!lookup.is_finished(), "the lookup waits for the answer");
    let mut found = workload("p", [10, 0, 0, 5], "v1");
    found.aliases = vec!["net1/10.0.0.5".into()];
    stream
        .send(response(ADDRESS_TYPE_URL, "n3", vec![found], &[]))
        .await;
    tokio::time::timeout(WAIT, lookup).await.unwrap().unwrap();
    assert_eq!(
        client.store.workload_by_ip(ip).unwrap().uid,
        "Kubernetes//Pod/shop/p",
        "the answer is in the state when the lookup returns"
    );
    assert_eq!(stream.next().await.response_nonce, "n3");

    // A known address is not asked for again.
    client.store.fetch_address(ip).await;

    let mut stream = istiod_restarts(stream, &mut opened).await;
    let again = stream.next().await;
    assert_eq!(again.type_url, ADDRESS_TYPE_URL);
    assert_eq!(
        again.resource_names_subscribe,
        vec!["*", "Kubernetes//Pod/shop/p"]
    );
    assert_eq!(again.resource_names_unsubscribe, vec!["*"]);
    assert_eq!(
        again
            .initial_resource_versions
            .get("Kubernetes//Pod/shop/p")
            .map(String::as_str),
        Some("v1")
    );
    cancel.cancel();
}
