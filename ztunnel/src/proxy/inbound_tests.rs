//! The inbound HBONE proxy on loopback with the real HBONE client (the outbound pool):
//! real TLS with leaves from a local CA, real HTTP/2. No root needed.

use std::time::Duration;
use test_support::poll::eventually;

use tokio_util::sync::CancellationToken;

use super::*;
use crate::discovery::local::parse_local_config;
use crate::hbone::pool::{ConnectRequest, Pool, PoolKey};
use crate::hbone::HboneError;
use crate::identity::SecretManager;
use crate::proxy::fixtures::*;
use crate::proxy::{OwnPorts, ProxyInputs};
use crate::socket::LocalSocketFactory;

/// The local workload `server` on 127.0.0.1, where its HBONE listener and app are.
const WORKLOADS: &str = r#"
workloads:
- uid: Kubernetes//Pod/test/server
  name: server
  namespace: test
  serviceAccount: server
  workloadIps: ["127.0.0.1"]
  protocol: HBONE
"#;

/// Connections from `test/client` are denied in namespace `test`.
const DENY_CLIENT: &str = r#"
policies:
- name: deny-client
  namespace: test
  scope: Namespace
  action: Deny
  rules:
  - - - principals: [!Exact cluster.local/ns/test/sa/client]
"#;

struct Server {
    inputs: ProxyInputs,
    hbone: SocketAddr,
}

/// The server's inbound proxy on 127.0.0.1 (its port is one of ztunnel's own, as
/// `OwnPorts::from_config` makes it).
fn start_server(certs: &SecretManager) -> Server {
    let mut inputs = inputs(&state(WORKLOADS), certs, "test", "server");
    let listener = LocalSocketFactory { mark: 0 }
        .listener("127.0.0.1:0".parse().unwrap(), false)
        .unwrap();
    let hbone = listener.local_addr().unwrap();
    inputs.own_ports = OwnPorts::new([hbone.port()]);
    tokio::spawn(Inbound::new(inputs.clone()).run(listener));
    Server { inputs, hbone }
}

fn client_pool(certs: &SecretManager) -> Arc<Pool> {
    Pool::new(
        certs.clone(),
        socket::local(0),
        Default::default(),
        Duration::from_secs(300),
    )
}

fn request(server: &Server, target: SocketAddr) -> ConnectRequest {
    ConnectRequest {
        key: PoolKey {
            src_identity: identity("test", "client"),
            dst_identity: identity("test", "server"),
            dst: server.hbone,
            src_ip: None,
        },
        expected_identities: vec![identity("test", "server")],
        authority: target,
        client: "127.0.0.1:40000".parse().unwrap(),
        baggage: String::new(),
    }
}

#[tokio::test]
async fn connect_to_a_ztunnel_port_is_refused_with_503() {
    let certs = certs();
    let server = start_server(&certs);
    let pool = client_pool(&certs);
    let targets = [
        "127.0.0.1:15001".parse().unwrap(),
        "127.0.0.1:15008".parse().unwrap(),
        "127.0.0.1:15020".parse().unwrap(),
        server.hbone,
    ];
    for target in targets {
        match pool.connect(&request(&server, target)).await {
            Err(HboneError::Status(status)) => {
                assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{target}")
            }
            Err(e) => panic!("{target}: {e}"),
            Ok(_) => panic!("{target}: CONNECT to a ztunnel port was accepted"),
        }
    }
    let metrics = &server.inputs.metrics;
    assert_eq!(errors(metrics, "self_call_hbone"), targets.len() as u64);
    assert_eq!(errors(metrics, "upstream_connect"), 0);
    assert_eq!(
        connections(metrics, "istio_tcp_connections_opened_total", &[]),
        0
    );
}

#[tokio::test]
async fn a_deny_policy_that_appears_closes_a_live_hbone_stream() {
    let echo = echo_server("127.0.0.1").await;
    let certs = certs();
    let server = start_server(&certs);
    let inputs = &server.inputs;
    let stop = CancellationToken::new();
    tokio::spawn(inputs.connections.clone().watch(
        inputs.state.clone(),
        inputs.metrics.clone(),
        stop.clone(),
    ));
    let pool = client_pool(&certs);
    let mut stream = pool.connect(&request(&server, echo)).await.unwrap();
    h2_round_trip(&mut stream, b"allowed for now").await;
    assert_eq!(inputs.connections.len(), 1);

    inputs.state.replace_source(
        "local",
        parse_local_config(&format!("{WORKLOADS}{DENY_CLIENT}")).unwrap(),
    );
    // The server resets (or ends) the stream.
    match tokio::time::timeout(WAIT, stream.recv.data()).await {
        Ok(None) | Ok(Some(Err(_))) => {}
        Ok(Some(Ok(data))) => panic!("unexpected data {data:?}"),
        Err(_) => panic!("the revoked stream stayed open"),
    }
    assert_eq!(inputs.metrics.policy_revoked.get(), 1);
    eventually("the revoked connection is unregistered", WAIT, || {
        inputs.connections.is_empty()
    })
    .await;

    // A new CONNECT is refused up front: 401.
    match pool.connect(&request(&server, echo)).await {
        Err(HboneError::Status(status)) => assert_eq!(status, StatusCode::UNAUTHORIZED),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a denied CONNECT was accepted"),
    }
    assert_eq!(errors(&inputs.metrics, "policy_denied"), 1);
    assert_eq!(inputs.metrics.policy_revoked.get(), 1);
    stop.cancel();
}
