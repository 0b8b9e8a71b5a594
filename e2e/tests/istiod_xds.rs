//! The delta ADS server against real clients over gRPC and TLS on loopback: ztunnel's
//! own xDS client, and a raw ADS client for checking every message. Tokens come from
//! the local API server (TokenRequest) and are reviewed by it, as in a cluster. The
//! resources are published straight into the store here; what the model publishes
//! from Kubernetes is tested with the real binary.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use test_support::poll::eventually;

use istiod_lite::ca::authn::TokenAuthenticator;
use istiod_lite::kube::pods::PodIndex;
use istiod_lite::model;
use istiod_lite::server::{self, ServingCert};
use istiod_lite::xds::grpc::AdsServer;
use istiod_lite::xds::store::{Published, ResourceStore};
use istiod_lite::xds::{AdsService, Connections, SyncState, XdsMetrics};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::api::{Api, PostParams};
use kube::Client;
use kube_apiserver_lite::{ApiServer, Control, Options};
use mesh_ca::CertificateAuthority;
use prost::Message;
use serde_json::json;
use shared_types::istio::security as pb_sec;
use shared_types::istio::workload as pb;
use shared_types::istio::xds::{
    string_struct, ztunnel_node_id, AggregatedDiscoveryServiceClient, Any, DeltaDiscoveryRequest,
    DeltaDiscoveryResponse, Node, Status as RpcStatus, ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Certificate, Channel, ClientTlsConfig};
use tonic::{Code, Streaming};
use ztunnel::control_plane::{ControlPlaneConfig, RootCa, TokenSource};
use ztunnel::discovery::xds::{self as client, NodeIdentity, XdsConfig};
use ztunnel::state::demand::LOOKUP_TIMEOUT;
use ztunnel::state::StateStore;

const TD: &str = "cluster.local";
const WAIT: Duration = Duration::from_secs(10);
const DEBOUNCE: Duration = Duration::from_millis(100);
const SERVER_NAME: &str = "istiod.istio-system.svc";

struct Fixture {
    _apiserver: Control,
    client: Client,
    store: ResourceStore,
    connections: Connections,
    metrics: Arc<XdsMetrics>,
    addr: String,
    root_pem: String,
    cancel: CancellationToken,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

fn object<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
    serde_json::from_value(value).unwrap()
}

async fn start() -> Fixture {
    let server = ApiServer::bind_with("127.0.0.1:0", Options::default())
        .await
        .unwrap();
    let client = Client::try_from(kube::Config::new(server.url().parse().unwrap())).unwrap();
    let apiserver = server.spawn();
    for ns in ["istio-system", "app"] {
        Api::<Namespace>::all(client.clone())
            .create(
                &PostParams::default(),
                &object(json!({"metadata": {"name": ns}})),
            )
            .await
            .unwrap();
    }
    for (ns, name, sa) in [
        ("istio-system", "ztunnel-1", "ztunnel"),
        ("app", "client", "client"),
    ] {
        Api::<ServiceAccount>::namespaced(client.clone(), ns)
            .create(
                &PostParams::default(),
                &object(json!({"metadata": {"name": sa, "namespace": ns}})),
            )
            .await
            .ok();
        let pod: Pod = object(json!({
            "metadata": {"namespace": ns, "name": name},
            "spec": {"serviceAccountName": sa, "nodeName": "n1", "containers": [{"name": "c", "image": "x"}]},
            "status": {"phase": "Running"},
        }));
        Api::<Pod>::namespaced(client.clone(), ns)
            .create(&PostParams::default(), &pod)
            .await
            .unwrap();
    }

    let cancel = CancellationToken::new();
    let pods = PodIndex::default();
    // The model's pod watch keeps the CA's pod index (its resources are not served here).
    model::start(
        client.clone(),
        model::Options::default(),
        ResourceStore::default(),
        pods.clone(),
        cancel.clone(),
    );
    tokio::time::timeout(WAIT, pods.wait_synced())
        .await
        .unwrap();
    let ca = Arc::new(CertificateAuthority::generate_self_signed(TD).unwrap());
    let serving = ServingCert::start(
        ca.clone(),
        vec![SERVER_NAME.into()],
        Duration::from_secs(3600),
        cancel.clone(),
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let incoming = server::incoming(
        listener,
        server::tls_acceptor(serving).unwrap(),
        cancel.clone(),
    );
    let store = ResourceStore::default();
    let connections = Connections::default();
    let metrics = Arc::new(XdsMetrics::default());
    let ads = AdsService {
        store: store.clone(),
        authn: Arc::new(TokenAuthenticator::new(
            client.clone(),
            vec!["istio-ca".into()],
            "Kubernetes".into(),
            TD.into(),
            pods.clone(),
        )),
        trusted: HashSet::from([("istio-system".into(), "ztunnel".into())]),
        pods,
        system_namespace: "istio-system".into(),
        debounce: DEBOUNCE,
        connections: connections.clone(),
        metrics: metrics.clone(),
    };
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(AdsServer::new(ads))
            .serve_with_incoming_shutdown(incoming, cancel.clone().cancelled_owned()),
    );
    Fixture {
        _apiserver: apiserver,
        client,
        store,
        connections,
        metrics,
        addr,
        root_pem: ca.roots_pem(),
        cancel,
    }
}

impl Fixture {
    async fn token(&self, ns: &str, sa: &str, pod: &str) -> String {
        let p: Pod = Api::namespaced(self.client.clone(), ns)
            .get(pod)
            .await
            .unwrap();
        let request: TokenRequest = object(json!({"spec": {
            "audiences": ["istio-ca"], "expirationSeconds": 3600,
            "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": pod, "uid": p.metadata.uid},
        }}));
        let answer: TokenRequest = Api::<ServiceAccount>::namespaced(self.client.clone(), ns)
            .create_subresource("token", sa, &PostParams::default(), &request)
            .await
            .unwrap();
        answer.status.unwrap().token
    }

    async fn ztunnel_token(&self) -> String {
        self.token("istio-system", "ztunnel", "ztunnel-1").await
    }

    /// Publishes `pods` workloads (`app/<name>` with version `v` baked into a field).
    fn publish_workloads(&self, pods: &[(&str, u8)]) {
        let resources: Vec<Published> = pods
            .iter()
            .map(|(name, v)| Published {
                name: uid(name),
                body: workload_body(name, *v),
                aliases: vec![format!("/10.0.{v}.{}", name.len())],
                related: Vec::new(),
            })
            .collect();
        self.store.replace_all(ADDRESS_TYPE_URL, resources);
    }

    fn publish_policies(&self, names: &[&str]) {
        let resources: Vec<(String, Any)> = names
            .iter()
            .map(|name| {
                let body = pb_sec::Authorization {
                    name: (*name).into(),
                    namespace: "app".into(),
                    scope: pb_sec::Scope::Namespace as i32,
                    action: pb_sec::Action::Deny as i32,
                    ..Default::default()
                };
                (
                    format!("app/{name}"),
                    any(AUTHORIZATION_TYPE_URL, body.encode_to_vec()),
                )
            })
            .collect();
        self.store.replace_all(AUTHORIZATION_TYPE_URL, resources);
    }

    async fn raw(&self, token: Option<&str>) -> Raw {
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.root_pem))
            .domain_name(SERVER_NAME);
        let channel = Channel::from_shared(format!("https://{}", self.addr))
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .connect()
            .await
            .unwrap();
        Raw {
            channel,
            token: token.map(str::to_owned),
        }
    }

    fn ztunnel(&self, token: String) -> StateStore {
        self.ztunnel_with(token, None)
    }

    /// A ztunnel xDS client; `on_demand`: Some(network) for `XDS_ON_DEMAND`.
    fn ztunnel_with(&self, token: String, on_demand: Option<String>) -> StateStore {
        self.client(token, on_demand, "ztunnel", &client::TYPES)
    }

    /// An xDS client subscribing to what a waypoint does (its policies and routes too).
    fn waypoint(&self, token: String) -> StateStore {
        self.client(token, None, "router", &client::WAYPOINT_TYPES)
    }

    fn client(
        &self,
        token: String,
        on_demand: Option<String>,
        node_type: &'static str,
        types: &'static [&'static str],
    ) -> StateStore {
        let store = StateStore::new();
        let config = XdsConfig {
            control_plane: ControlPlaneConfig {
                address: self.addr.clone(),
                root_ca: RootCa::Pem(self.root_pem.clone()),
                token: TokenSource::Literal(token),
                cluster_id: "Kubernetes".into(),
                alt_hostname: Some(SERVER_NAME.into()),
                extra_headers: vec![],
                packet_mark: 0,
            },
            node: NodeIdentity {
                node_type,
                pod_name: "ztunnel-1".into(),
                pod_namespace: "istio-system".into(),
                instance_ip: "10.0.0.7".into(),
                node_name: "n1".into(),
                cluster_id: "Kubernetes".into(),
                extra_metadata: vec![],
            },
            on_demand,
            types,
        };
        client::start(
            config,
            store.clone(),
            Arc::new(client::XdsMetrics::default()),
            None,
            self.cancel.clone(),
        )
        .unwrap();
        store
    }
}

fn uid(name: &str) -> String {
    format!("Kubernetes//Pod/app/{name}")
}

fn workload_body(name: &str, v: u8) -> Any {
    let body = pb::Address {
        r#type: Some(pb::address::Type::Workload(pb::Workload {
            uid: uid(name),
            name: name.into(),
            namespace: "app".into(),
            addresses: vec![vec![10, 0, v, name.len() as u8]],
            tunnel_protocol: pb::TunnelProtocol::Hbone as i32,
            ..Default::default()
        })),
    };
    any(ADDRESS_TYPE_URL, body.encode_to_vec())
}

fn any(type_url: &str, value: Vec<u8>) -> Any {
    Any {
        type_url: type_url.into(),
        value,
    }
}

/// A raw ADS client: every message in and out is the test's.
struct Raw {
    channel: Channel,
    token: Option<String>,
}

struct RawStream {
    requests: mpsc::Sender<DeltaDiscoveryRequest>,
    responses: Streaming<DeltaDiscoveryResponse>,
}

fn node(namespace: &str) -> Node {
    Node {
        id: ztunnel_node_id("10.0.0.7", "ztunnel-1", namespace),
        metadata: Some(string_struct([
            ("NAMESPACE", namespace),
            ("NODE_NAME", "n1"),
        ])),
        ..Default::default()
    }
}

fn subscribe(type_url: &str, namespace: &str, held: &[(&str, &str)]) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        node: Some(node(namespace)),
        type_url: type_url.into(),
        initial_resource_versions: held
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    }
}

fn ack(response: &DeltaDiscoveryResponse, nack: Option<&str>) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: response.type_url.clone(),
        response_nonce: response.nonce.clone(),
        error_detail: nack.map(|m| RpcStatus {
            code: Code::InvalidArgument as i32,
            message: m.into(),
            details: vec![],
        }),
        ..Default::default()
    }
}

impl Raw {
    async fn open(&self, first: Vec<DeltaDiscoveryRequest>) -> Result<RawStream, tonic::Status> {
        let (requests, rx) = mpsc::channel(16);
        for r in first {
            requests.try_send(r).unwrap();
        }
        let mut request = tonic::Request::new(ReceiverStream::new(rx));
        if let Some(token) = &self.token {
            request
                .metadata_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
        }
        let responses = AggregatedDiscoveryServiceClient::new(self.channel.clone())
            .delta_aggregated_resources(request)
            .await?
            .into_inner();
        Ok(RawStream {
            requests,
            responses,
        })
    }
}

impl RawStream {
    async fn next(&mut self) -> DeltaDiscoveryResponse {
        tokio::time::timeout(WAIT, self.responses.message())
            .await
            .expect("a response in time")
            .expect("an open stream")
            .expect("a response")
    }

    /// Nothing arrives for `wait`.
    async fn quiet(&mut self, wait: Duration) {
        if let Ok(message) = tokio::time::timeout(wait, self.responses.message()).await {
            panic!("expected no response, got {message:?}");
        }
    }

    async fn send(&self, request: DeltaDiscoveryRequest) {
        self.requests.send(request).await.unwrap();
    }
}

fn names(response: &DeltaDiscoveryResponse) -> Vec<String> {
    let mut names: Vec<String> = response.resources.iter().map(|r| r.name.clone()).collect();
    names.sort();
    names
}

#[tokio::test]
async fn ztunnel_syncs_and_follows_changes_with_only_the_changed_resource_sent() {
    let f = start().await;
    f.publish_workloads(&[("a", 1), ("b", 1), ("c", 1)]);
    f.publish_policies(&["deny"]);
    let ztunnel = f.ztunnel(f.ztunnel_token().await);
    eventually("ztunnel has everything", WAIT, || {
        ztunnel.snapshot().counts() == (3, 0, 1)
    })
    .await;

    let raw = f.raw(Some(&f.ztunnel_token().await)).await;
    let mut s = raw
        .open(vec![
            subscribe(ADDRESS_TYPE_URL, "istio-system", &[]),
            subscribe(AUTHORIZATION_TYPE_URL, "istio-system", &[]),
        ])
        .await
        .unwrap();
    let first = s.next().await;
    assert_eq!(first.type_url, ADDRESS_TYPE_URL);
    assert_eq!(names(&first), vec![uid("a"), uid("b"), uid("c")]);
    s.send(ack(&first, None)).await;
    let policies = s.next().await;
    assert_eq!(names(&policies), vec!["app/deny"]);
    s.send(ack(&policies, None)).await;

    // One pod changes: that resource alone goes out, to every stream.
    f.publish_workloads(&[("a", 1), ("b", 2), ("c", 1)]);
    let push = s.next().await;
    assert_eq!(names(&push), vec![uid("b")]);
    assert!(push.removed_resources.is_empty());
    s.send(ack(&push, None)).await;
    eventually("ztunnel sees b move", WAIT, || {
        ztunnel
            .snapshot()
            .workload_by_uid(&uid("b"))
            .is_some_and(|w| w.workload_ips[0].to_string() == "10.0.2.1")
    })
    .await;

    // A removal is a removal, nothing else.
    f.publish_workloads(&[("a", 1), ("b", 2)]);
    let push = s.next().await;
    assert!(push.resources.is_empty());
    assert_eq!(push.removed_resources, vec![uid("c")]);
    s.send(ack(&push, None)).await;
    eventually("ztunnel drops c", WAIT, || {
        ztunnel.snapshot().counts() == (2, 0, 1)
    })
    .await;

    eventually("both streams synced", WAIT, || {
        let all = f.connections.snapshot();
        all.len() == 2
            && all.iter().all(|p| {
                p.types.len() == 2 && p.types.values().all(|t| t.state() == SyncState::Synced)
            })
    })
    .await;
    assert_eq!(f.metrics.connected.get(), 2);
}

#[tokio::test]
async fn a_reconnect_gets_only_what_changed_meanwhile() {
    let f = start().await;
    f.publish_workloads(&[("a", 1), ("b", 1), ("c", 1)]);
    let version = |name: &str| f.store.get(ADDRESS_TYPE_URL, &uid(name)).unwrap().version();
    let (a, b) = (version("a"), version("b"));
    let raw = f.raw(Some(&f.ztunnel_token().await)).await;
    let held = [
        (uid("a").as_str().to_owned(), a),
        (uid("b"), "stale".to_owned()),
        (uid("gone"), "v9".to_owned()),
    ];
    let held: Vec<(&str, &str)> = held.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
    let mut s = raw
        .open(vec![subscribe(ADDRESS_TYPE_URL, "istio-system", &held)])
        .await
        .unwrap();
    let response = s.next().await;
    // a is current: not sent. b is stale and c new: sent. gone: removed.
    assert_eq!(names(&response), vec![uid("b"), uid("c")]);
    assert_eq!(response.resources[0].version, b);
    assert_eq!(response.removed_resources, vec![uid("gone")]);
}

#[tokio::test]
async fn a_nack_is_counted_not_resent_and_shows_stale() {
    let f = start().await;
    f.publish_workloads(&[("a", 1)]);
    let raw = f.raw(Some(&f.ztunnel_token().await)).await;
    let mut s = raw
        .open(vec![subscribe(ADDRESS_TYPE_URL, "istio-system", &[])])
        .await
        .unwrap();
    let response = s.next().await;
    s.send(ack(
        &response,
        Some("Kubernetes//Pod/app/a: addresses: bad"),
    ))
    .await;
    s.quiet(DEBOUNCE * 5).await;
    let rejects = || {
        f.metrics
            .rejects
            .get_or_create(&XdsMetrics::type_label(ADDRESS_TYPE_URL))
            .get()
    };
    eventually("the NACK is counted", WAIT, || rejects() == 1).await;
    let status = &f.connections.snapshot()[0];
    let address = &status.types[ADDRESS_TYPE_URL];
    assert_eq!(address.state(), SyncState::Stale);
    assert!(address
        .nacked
        .as_deref()
        .unwrap()
        .contains("addresses: bad"));

    // A new version is sent, and its ACK makes the stream SYNCED again.
    f.publish_workloads(&[("a", 2)]);
    let push = s.next().await;
    assert_eq!(names(&push), vec![uid("a")]);
    s.send(ack(&push, None)).await;
    eventually("SYNCED", WAIT, || {
        f.connections.snapshot()[0].types[ADDRESS_TYPE_URL].state() == SyncState::Synced
    })
    .await;
}

#[tokio::test]
async fn streams_are_refused_without_a_token_or_from_the_wrong_account_or_namespace() {
    let f = start().await;
    let first = || vec![subscribe(ADDRESS_TYPE_URL, "istio-system", &[])];
    let refused = |reason: &'static str| {
        f.metrics
            .refused
            .get_or_create(&istiod_lite::xds::metrics::ReasonLabels { reason })
            .get()
    };

    let err = f.raw(None).await.open(first()).await.err().unwrap();
    assert_eq!(err.code(), Code::Unauthenticated, "{err}");
    assert_eq!(refused("no_token"), 1);

    let app = f.token("app", "client", "client").await;
    let err = f
        .raw(Some(&app))
        .await
        .open(vec![subscribe(ADDRESS_TYPE_URL, "app", &[])])
        .await
        .err()
        .unwrap();
    assert_eq!(err.code(), Code::PermissionDenied, "{err}");
    assert_eq!(refused("untrusted_caller"), 1);

    // ztunnel's token, but a node claiming another namespace.
    let err = f
        .raw(Some(&f.ztunnel_token().await))
        .await
        .open(vec![subscribe(ADDRESS_TYPE_URL, "app", &[])])
        .await
        .err()
        .unwrap();
    assert_eq!(err.code(), Code::PermissionDenied, "{err}");
    assert!(err.message().contains("NAMESPACE"), "{err}");
    assert_eq!(refused("namespace_mismatch"), 1);
    assert!(f.connections.is_empty());
}

#[tokio::test]
async fn a_stuck_client_delays_no_one_and_a_burst_is_one_push() {
    let f = start().await;
    // Big resources, so the stuck stream's HTTP/2 window fills up.
    let big = |v: u8| -> Vec<(String, Any)> {
        (0..200)
            .map(|i| {
                let body = workload_body(&format!("p{i}"), v).value;
                (
                    uid(&format!("p{i}")),
                    any(ADDRESS_TYPE_URL, pad(body, 2_000)),
                )
            })
            .collect()
    };
    f.store.replace_all(ADDRESS_TYPE_URL, big(0));
    let token = f.ztunnel_token().await;
    // Never reads, never ACKs.
    let stuck = f
        .raw(Some(&token))
        .await
        .open(vec![subscribe(ADDRESS_TYPE_URL, "istio-system", &[])])
        .await
        .unwrap();
    let mut live = f
        .raw(Some(&token))
        .await
        .open(vec![subscribe(ADDRESS_TYPE_URL, "istio-system", &[])])
        .await
        .unwrap();
    let first = live.next().await;
    assert_eq!(first.resources.len(), 200);
    live.send(ack(&first, None)).await;

    // A burst of changes inside one debounce window, many times over.
    let mut pushes = 0;
    for round in 1..=20u8 {
        for step in 0..5u8 {
            f.store.replace_all(ADDRESS_TYPE_URL, big(round * 5 + step));
        }
        let push = live.next().await;
        pushes += 1;
        assert_eq!(push.resources.len(), 200, "round {round}");
        live.send(ack(&push, None)).await;
        let expected = f.store.get(ADDRESS_TYPE_URL, &uid("p0")).unwrap().version();
        let got: HashMap<&str, &str> = push
            .resources
            .iter()
            .map(|r| (r.name.as_str(), r.version.as_str()))
            .collect();
        assert_eq!(
            got[uid("p0").as_str()],
            expected,
            "the burst's last version"
        );
    }
    assert_eq!(
        pushes, 20,
        "five changes inside a debounce window are one push"
    );
    live.quiet(DEBOUNCE * 3).await;
    drop(stuck);
}

/// `body` with a trailing unknown field of `len` bytes (prost skips it on decode).
fn pad(mut body: Vec<u8>, len: usize) -> Vec<u8> {
    // Field 999, wire type 2 (length-delimited).
    prost::encoding::encode_key(999, prost::encoding::WireType::LengthDelimited, &mut body);
    prost::encoding::encode_varint(len as u64, &mut body);
    body.extend(std::iter::repeat_n(7u8, len));
    body
}

/// Istio's on-demand client: nothing at first (`*` in and out), then one address at
/// a time; each is answered with the workload it names (with the address as alias),
/// which the stream then follows, and nothing else is pushed.
#[tokio::test]
async fn on_demand_lookups_are_answered_by_address_and_followed() {
    let f = start().await;
    f.publish_workloads(&[("a", 1), ("bb", 1)]);
    let raw = f.raw(Some(&f.ztunnel_token().await)).await;
    let mut first = subscribe(ADDRESS_TYPE_URL, "istio-system", &[]);
    first.resource_names_subscribe = vec!["*".into()];
    first.resource_names_unsubscribe = vec!["*".into()];
    let mut s = raw.open(vec![first]).await.unwrap();
    let empty = s.next().await;
    assert!(empty.resources.is_empty(), "{:?}", names(&empty));
    s.send(ack(&empty, None)).await;

    s.send(lookup("/10.0.1.1")).await;
    let found = s.next().await;
    assert_eq!(names(&found), vec![uid("a")]);
    assert_eq!(found.resources[0].aliases, vec!["/10.0.1.1"]);
    s.send(ack(&found, None)).await;

    // Only what it looked up is followed.
    f.publish_workloads(&[("a", 1), ("bb", 2)]);
    s.quiet(DEBOUNCE * 3).await;
    f.publish_workloads(&[("a", 2), ("bb", 2)]);
    let push = s.next().await;
    assert_eq!(names(&push), vec![uid("a")]);
    // An address nothing has is answered as removed: the xDS spec's "does not exist".
    s.send(ack(&push, None)).await;
    s.send(lookup("/10.9.9.9")).await;
    let missing = s.next().await;
    assert!(missing.resources.is_empty());
    assert_eq!(missing.removed_resources, vec!["/10.9.9.9"]);
    s.send(ack(&missing, None)).await;

    // A Service VIP comes with the Service's endpoints, which are followed from then on.
    let service = pb::Address {
        r#type: Some(pb::address::Type::Service(pb::Service {
            name: "web".into(),
            namespace: "app".into(),
            hostname: "web.app.svc.cluster.local".into(),
            ..Default::default()
        })),
    };
    let publish_with_service = |bb: u8| {
        let mut resources = vec![
            Published {
                name: uid("a"),
                body: workload_body("a", 2),
                aliases: vec!["/10.0.2.1".into()],
                related: Vec::new(),
            },
            Published {
                name: uid("bb"),
                body: workload_body("bb", bb),
                aliases: vec![format!("/10.0.{bb}.2")],
                related: Vec::new(),
            },
        ];
        resources.push(Published {
            name: "app/web.app.svc.cluster.local".into(),
            body: any(ADDRESS_TYPE_URL, service.encode_to_vec()),
            aliases: vec!["/10.96.0.1".into()],
            related: vec![uid("bb")],
        });
        f.store.replace_all(ADDRESS_TYPE_URL, resources);
    };
    publish_with_service(2);
    s.quiet(DEBOUNCE * 3).await;
    s.send(lookup("/10.96.0.1")).await;
    let vip = s.next().await;
    assert_eq!(
        names(&vip),
        vec![uid("bb"), "app/web.app.svc.cluster.local".to_string()]
    );
    s.send(ack(&vip, None)).await;
    publish_with_service(3);
    let endpoint = s.next().await;
    assert_eq!(names(&endpoint), vec![uid("bb")]);
}

/// ztunnel with `XDS_ON_DEMAND`: in sync with policies and no address, then each
/// address a connection looks up is fetched and followed; an unknown one is answered
/// at once (not left to time out).
#[tokio::test]
async fn ztunnel_on_demand_fetches_and_follows_what_connections_look_up() {
    let f = start().await;
    f.publish_workloads(&[("a", 1), ("bb", 1)]);
    f.publish_policies(&["deny"]);
    let ztunnel = f.ztunnel_with(f.ztunnel_token().await, Some(String::new()));
    eventually("ztunnel synced", WAIT, || {
        f.connections
            .snapshot()
            .iter()
            .any(|p| p.types.len() == 2 && p.types.values().all(|t| t.state() == SyncState::Synced))
    })
    .await;
    assert_eq!(
        ztunnel.snapshot().counts(),
        (0, 0, 1),
        "policies come whole"
    );

    let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
    ztunnel.fetch_address(ip("10.0.1.1")).await;
    let a = ztunnel.workload_by_ip(ip("10.0.1.1")).expect("fetched");
    assert_eq!(a.uid, uid("a"));
    assert_eq!(ztunnel.snapshot().counts(), (1, 0, 1));
    tokio::time::timeout(LOOKUP_TIMEOUT / 2, ztunnel.fetch_address(ip("10.9.9.9")))
        .await
        .expect("an unknown address is answered, not timed out");
    assert_eq!(ztunnel.snapshot().counts(), (1, 0, 1));

    // What was fetched is followed; what was not stays out.
    f.publish_workloads(&[("a", 2), ("bb", 2)]);
    eventually("a's change is pushed", WAIT, || {
        ztunnel
            .workload_by_uid(&uid("a"))
            .is_some_and(|w| w.workload_ips == [ip("10.0.2.1")])
    })
    .await;
    assert!(ztunnel.workload_by_uid(&uid("bb")).is_none());
}

fn lookup(key: &str) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: ADDRESS_TYPE_URL.into(),
        resource_names_subscribe: vec![key.into()],
        ..Default::default()
    }
}

/// GAMMA end to end: HTTPRoutes bound to a Service, applied to the API server, reach a
/// waypoint-typed xDS client as `WaypointRoute`s (the model publishing into the served
/// store), and the leader's status writer gives each route istiod's `status.parents`.
#[tokio::test]
async fn gamma_routes_reach_a_waypoint_and_get_their_status() {
    use istiod_lite::kube::route_status;
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::DynamicObject;
    use kube::ResourceExt;

    let f = start().await;
    let crds: Api<CustomResourceDefinition> = Api::all(f.client.clone());
    for crd in test_support::crds::shipped().expect("the shipped CRDs") {
        crds.create(&PostParams::default(), &object(crd))
            .await
            .expect("create a CRD");
    }
    for name in ["web", "web-v2"] {
        Api::<Service>::namespaced(f.client.clone(), "app")
            .create(
                &PostParams::default(),
                &object(json!({
                    "metadata": {"name": name, "namespace": "app"},
                    "spec": {"selector": {"app": name}, "ports": [{"name": "http", "port": 80}]},
                })),
            )
            .await
            .unwrap();
    }
    let http_routes = Api::<DynamicObject>::namespaced_with(
        f.client.clone(),
        "app",
        &istiod_lite::model::routes::ROUTE_KINDS[0].resource(),
    );
    for (name, backend) in [("web", "web-v2"), ("broken", "missing")] {
        let route = object(json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "HTTPRoute",
            "metadata": {"name": name, "namespace": "app"},
            "spec": {
                "parentRefs": [{"group": "", "kind": "Service", "name": "web", "port": 80}],
                "rules": [{
                    "matches": [{"path": {"type": "PathPrefix", "value": "/v2"}}],
                    "backendRefs": [{"name": backend, "port": 80}],
                }],
            },
        }));
        http_routes
            .create(&PostParams::default(), &route)
            .await
            .expect("create the HTTPRoute");
    }

    // The model, serving the routes from the fixture's store; the status writer, as
    // the leader runs it.
    model::start(
        f.client.clone(),
        model::Options::default(),
        f.store.clone(),
        PodIndex::default(),
        f.cancel.clone(),
    );
    tokio::spawn(route_status::run(
        f.client.clone(),
        TD.into(),
        f.cancel.clone(),
    ));

    let waypoint = f.waypoint(f.ztunnel_token().await);
    eventually("the waypoint holds both routes", WAIT, || {
        let mut keys: Vec<String> = waypoint
            .snapshot()
            .waypoint_routes()
            .map(|r| r.key())
            .collect();
        keys.sort();
        keys == ["HTTPRoute/app/broken", "HTTPRoute/app/web"]
    })
    .await;
    let snapshot = waypoint.snapshot();
    let web = snapshot
        .waypoint_routes()
        .find(|r| r.name == "web")
        .unwrap();
    let spec: serde_json::Value = serde_json::from_str(&web.spec_json).unwrap();
    assert_eq!(spec["rules"][0]["backendRefs"][0]["name"], "web-v2");
    assert_eq!(web.generation, 1);
    assert!(!web.created.is_empty());

    // (type, status, reason) of each condition of the route's one parent.
    let conditions = |route: &DynamicObject| -> Vec<(String, String, String)> {
        route.data["status"]["parents"][0]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                let s = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
                (s("type"), s("status"), s("reason"))
            })
            .collect()
    };
    let expect = |rows: [(&str, &str, &str); 2]| -> Vec<(String, String, String)> {
        rows.iter()
            .map(|(t, s, r)| (t.to_string(), s.to_string(), r.to_string()))
            .collect()
    };
    for (name, want) in [
        (
            "web",
            expect([
                ("Accepted", "True", "Accepted"),
                ("ResolvedRefs", "True", "ResolvedRefs"),
            ]),
        ),
        (
            "broken",
            expect([
                ("Accepted", "True", "Accepted"),
                ("ResolvedRefs", "False", "BackendNotFound"),
            ]),
        ),
    ] {
        let mut last = Vec::new();
        let found = tokio::time::timeout(WAIT, async {
            loop {
                let route = http_routes.get(name).await.unwrap();
                last = conditions(&route);
                if last == want {
                    return route;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        let route = found.unwrap_or_else(|_| panic!("{name}: status {last:?}, want {want:?}"));
        let parent = &route.data["status"]["parents"][0];
        assert_eq!(parent["controllerName"], "istio.io/gateway-controller");
        assert_eq!(parent["parentRef"]["name"], "web");
        assert!(parent["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["observedGeneration"] == 1 && c["lastTransitionTime"].is_string()));
    }

    // The missing backend appears: the broken route's refs resolve.
    Api::<Service>::namespaced(f.client.clone(), "app")
        .create(
            &PostParams::default(),
            &object(json!({
                "metadata": {"name": "missing", "namespace": "app"},
                "spec": {"ports": [{"name": "http", "port": 80}]},
            })),
        )
        .await
        .unwrap();
    let resolved = tokio::time::timeout(WAIT, async {
        loop {
            let route = http_routes.get("broken").await.unwrap();
            if conditions(&route).get(1).is_some_and(|c| c.1 == "True") {
                return route;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the broken route's refs resolve once its backend exists");
    let version = resolved.resource_version();
    // Nothing changes after that: no write loop.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        http_routes.get("broken").await.unwrap().resource_version(),
        version,
        "the status is not rewritten when nothing changed"
    );
}
