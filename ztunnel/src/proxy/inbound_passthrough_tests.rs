//! The inbound plaintext proxy on loopback, without root: connections are handed to
//! [`InboundPassthrough::proxy`] with the original destination a REDIRECT would give.

use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::discovery::local::parse_local_config;
use crate::proxy::fixtures::*;
use crate::proxy::{OwnPorts, ProxyInputs};
use crate::socket::LocalSocketFactory;

/// The local workload `server` (127.0.0.6) and a neighbour that is not local.
const WORKLOADS: &str = r#"
workloads:
- uid: Kubernetes//Pod/test/server
  name: server
  namespace: test
  serviceAccount: server
  workloadIps: ["127.0.0.6"]
  protocol: HBONE
- uid: Kubernetes//Pod/test/neighbour
  name: neighbour
  namespace: test
  serviceAccount: neighbour
  workloadIps: ["127.0.0.7"]
  protocol: HBONE
"#;

/// Plaintext from loopback is denied in namespace `test`.
const DENY_LOOPBACK: &str = r#"
policies:
- name: deny-loopback
  namespace: test
  scope: Namespace
  action: Deny
  rules:
  - - - sourceIps: [127.0.0.0/8]
"#;

fn server_inputs() -> ProxyInputs {
    inputs(&state(WORKLOADS), &certs(), "test", "server")
}

async fn redirect(proxy: &InboundPassthrough, orig_dst: SocketAddr) -> (TcpStream, JoinHandle<()>) {
    let (app, proxied, peer) = accepted_pair().await;
    let this = proxy.clone();
    let task = tokio::spawn(async move { this.proxy(proxied, peer, orig_dst).await });
    (app, task)
}

async fn finished(task: JoinHandle<()>) {
    tokio::time::timeout(WAIT, task)
        .await
        .expect("the proxy finished")
        .unwrap();
}

const OPENED: &str = "istio_tcp_connections_opened_total";

#[tokio::test]
async fn plaintext_to_a_ztunnel_port_is_refused() {
    let inputs = server_inputs();
    let proxy = InboundPassthrough::new(inputs.clone());
    for dst in ["127.0.0.6:15008", "127.0.0.6:15001", "127.0.0.6:15021"] {
        let (mut app, task) = redirect(&proxy, dst.parse().unwrap()).await;
        finished(task).await;
        assert_closed(&mut app).await;
    }
    assert_eq!(errors(&inputs.metrics, "self_call_inbound_plaintext"), 3);
    assert_eq!(connections(&inputs.metrics, OPENED, &[]), 0);
    assert_eq!(
        connections(&inputs.metrics, "istio_tcp_connections_failed_total", &[]),
        0
    );
}

#[tokio::test]
async fn a_connection_that_was_not_redirected_is_refused() {
    let mut inputs = server_inputs();
    let listener = LocalSocketFactory { mark: 0 }
        .listener("127.0.0.1:0".parse().unwrap(), false)
        .unwrap();
    let addr = listener.local_addr().unwrap();
    // As `OwnPorts::from_config`: the listener's own port is ours.
    inputs.own_ports = OwnPorts::new([addr.port()]);
    tokio::spawn(InboundPassthrough::new(inputs.clone()).run(listener));
    // Usually the kernel has no original destination for it; where conntrack tracks
    // loopback anyway, it reports the listener itself, a port of ours.
    let (expected, other) = match original_dst_without_redirect().await {
        None => ("no_original_destination", "self_call_inbound_plaintext"),
        Some(_) => ("self_call_inbound_plaintext", "no_original_destination"),
    };
    let mut app = TcpStream::connect(addr).await.unwrap();
    assert_closed(&mut app).await;
    assert_eq!(errors(&inputs.metrics, expected), 1);
    assert_eq!(errors(&inputs.metrics, other), 0);
}

#[tokio::test]
async fn plaintext_reaches_the_local_workload_and_nothing_else() {
    let echo = echo_server("127.0.0.6").await;
    let inputs = server_inputs();
    let proxy = InboundPassthrough::new(inputs.clone());
    let (mut app, task) = redirect(&proxy, echo).await;
    round_trip(&mut app, b"hello server").await;
    drop(app);
    finished(task).await;
    let labels = [
        "reporter=\"destination\"",
        "destination_workload=\"server\"",
        "destination_principal=\"spiffe://cluster.local/ns/test/sa/server\"",
        "source_principal=\"unknown\"",
        "connection_security_policy=\"unknown\"",
    ];
    assert_eq!(connections(&inputs.metrics, OPENED, &labels), 1);

    // The neighbour is in the mesh but served by another ztunnel; 127.0.0.8 is nobody.
    let neighbour = echo_server("127.0.0.7").await;
    let nobody = echo_server("127.0.0.8").await;
    for dst in [neighbour, nobody] {
        let (mut app, task) = redirect(&proxy, dst).await;
        finished(task).await;
        assert_closed(&mut app).await;
    }
    assert_eq!(errors(&inputs.metrics, "unknown_workload"), 2);
    assert_eq!(connections(&inputs.metrics, OPENED, &[]), 1);
}

#[tokio::test]
async fn a_deny_policy_that_appears_closes_a_live_plaintext_connection() {
    let echo = echo_server("127.0.0.6").await;
    let inputs = server_inputs();
    let stop = CancellationToken::new();
    tokio::spawn(inputs.connections.clone().watch(
        inputs.state.clone(),
        inputs.metrics.clone(),
        stop.clone(),
    ));
    let proxy = InboundPassthrough::new(inputs.clone());
    let (mut app, task) = redirect(&proxy, echo).await;
    round_trip(&mut app, b"allowed for now").await;
    assert_eq!(inputs.connections.len(), 1);

    inputs.state.replace_source(
        "local",
        parse_local_config(&format!("{WORKLOADS}{DENY_LOOPBACK}")).unwrap(),
    );
    assert_closed(&mut app).await;
    finished(task).await;
    assert_eq!(inputs.metrics.policy_revoked.get(), 1);
    assert!(inputs.connections.is_empty());

    // New connections are denied up front (not revoked).
    let (mut app, task) = redirect(&proxy, echo).await;
    finished(task).await;
    assert_closed(&mut app).await;
    assert_eq!(errors(&inputs.metrics, "policy_denied"), 1);
    assert_eq!(inputs.metrics.policy_revoked.get(), 1);
    stop.cancel();
}
