//! The outbound proxy on loopback, without root: connections are handed to
//! [`Outbound::proxy`] with the original destination a REDIRECT would have given.

use std::net::IpAddr;

use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use super::*;
use crate::proxy::fixtures::*;
use crate::proxy::inbound::Inbound;
use crate::socket::LocalSocketFactory;

/// The local workload: its IP is not on this host, so nothing is ever dialed there.
const CLIENT: &str = r#"
- uid: Kubernetes//Pod/test/client
  name: client
  namespace: test
  serviceAccount: client
  workloadIps: ["10.0.0.1"]
  protocol: HBONE
"#;

/// A plain-TCP workload at 127.0.0.3 (not captured: no HBONE).
const LEGACY: &str = r#"
- uid: Kubernetes//Pod/test/legacy
  name: legacy
  namespace: test
  serviceAccount: legacy
  workloadIps: ["127.0.0.3"]
  protocol: TCP
"#;

fn outbound(yaml: &str) -> Outbound {
    Outbound::new(inputs(&state(yaml), &certs(), "test", "client"))
}

/// Hands `outbound` a connection redirected from `orig_dst`; returns the application's
/// end and the proxy's task.
async fn redirect(outbound: &Outbound, orig_dst: SocketAddr) -> (TcpStream, JoinHandle<()>) {
    let (app, proxied, peer) = accepted_pair().await;
    let this = outbound.clone();
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
const FAILED: &str = "istio_tcp_connections_failed_total";

#[tokio::test]
async fn connections_to_ztunnel_itself_are_refused_as_self_calls() {
    let outbound = outbound(&format!("workloads:{CLIENT}"));
    let metrics = outbound.inputs.metrics.clone();
    // A port of ours on loopback, on "any", and on the local workload's own IP.
    let dsts = [
        "127.0.0.1:15008",
        "0.0.0.0:15001",
        "10.0.0.1:15006",
        "[::1]:15020",
    ];
    for dst in dsts {
        let (mut app, task) = redirect(&outbound, dst.parse().unwrap()).await;
        finished(task).await;
        assert_closed(&mut app).await;
    }
    assert_eq!(errors(&metrics, "self_call_outbound"), dsts.len() as u64);

    // The listener that accepted the connection, whatever its port.
    let (mut app, proxied, peer) = accepted_pair().await;
    let listener = proxied.local_addr().unwrap();
    tokio::time::timeout(WAIT, outbound.proxy(proxied, peer, listener))
        .await
        .expect("refused at once");
    assert_closed(&mut app).await;
    assert_eq!(
        errors(&metrics, "self_call_outbound"),
        dsts.len() as u64 + 1
    );
    // Refused before anything was dialed.
    assert_eq!(connections(&metrics, OPENED, &[]), 0);
    assert_eq!(connections(&metrics, FAILED, &[]), 0);
}

#[tokio::test]
async fn only_ztunnel_ports_on_local_addresses_are_self_calls() {
    let outbound = outbound(&format!("workloads:{CLIENT}"));
    let listener: SocketAddr = "127.0.0.1:40001".parse().unwrap();
    let is_self = |dst: &str| outbound.is_self_call(dst.parse().unwrap(), Some(listener));
    assert!(is_self("127.0.0.1:15008") && is_self("10.0.0.1:15001") && is_self("127.0.0.1:40001"));
    // Another host's 15008 is its ztunnel (which refuses what it must), and a local
    // port that is not ours is an ordinary destination.
    assert!(!is_self("10.0.0.2:15008"));
    assert!(!is_self("127.0.0.1:8080"));
    assert!(!is_self("10.0.0.1:8080"));
}

#[tokio::test]
async fn a_connection_that_was_not_redirected_is_refused() {
    let outbound = outbound(&format!("workloads:{CLIENT}"));
    let metrics = outbound.inputs.metrics.clone();
    let listener = LocalSocketFactory { mark: 0 }
        .listener("127.0.0.1:0".parse().unwrap(), false)
        .unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(outbound.run(listener));
    // Usually the kernel has no original destination for it; where conntrack tracks
    // loopback anyway, it reports the listener itself, which is a loop.
    let (expected, other) = match original_dst_without_redirect().await {
        None => ("no_original_destination", "self_call_outbound"),
        Some(_) => ("self_call_outbound", "no_original_destination"),
    };
    let mut app = TcpStream::connect(addr).await.unwrap();
    assert_closed(&mut app).await;
    assert_eq!(errors(&metrics, expected), 1);
    assert_eq!(errors(&metrics, other), 0);
    assert_eq!(connections(&metrics, OPENED, &[]), 0);
}

#[tokio::test]
async fn destinations_outside_the_mesh_or_without_hbone_pass_through_as_plain_tcp() {
    let outside = echo_server("127.0.0.2").await;
    let legacy = echo_server("127.0.0.3").await;
    let outbound = outbound(&format!("workloads:{CLIENT}{LEGACY}"));
    let metrics = outbound.inputs.metrics.clone();
    for (dst, workload) in [(outside, "unknown"), (legacy, "legacy")] {
        let (mut app, task) = redirect(&outbound, dst).await;
        // The echo server reads our bytes as they are: no TLS, no HBONE.
        round_trip(&mut app, b"plain bytes").await;
        drop(app);
        finished(task).await;
        let labels = [
            "reporter=\"source\"",
            "source_workload=\"client\"",
            &format!("destination_workload=\"{workload}\""),
            "connection_security_policy=\"unknown\"",
        ];
        assert_eq!(connections(&metrics, OPENED, &labels), 1, "{workload}");
        assert_eq!(
            connections(&metrics, "istio_tcp_received_bytes_total", &labels),
            11
        );
    }
    assert!(
        !metrics.encode().contains("ztunnel_errors_total{"),
        "{}",
        metrics.encode()
    );
}

/// `XDS_ON_DEMAND`: a destination the state misses is asked for, and routed with
/// the answer (here a plain-TCP workload, so the labels name it).
#[tokio::test]
async fn on_demand_a_missed_destination_is_fetched_before_it_is_routed() {
    let legacy = echo_server("127.0.0.3").await;
    let outbound = outbound(&format!("workloads:{CLIENT}"));
    let state = outbound.inputs.state.clone();
    let (demand, mut lookups) = crate::state::demand::Demand::new(String::new());
    state.enable_on_demand(demand);
    let source = state.clone();
    let asked = Arc::new(std::sync::Mutex::new(Vec::new()));
    let keys = asked.clone();
    // The control plane's part: answers every lookup, knows only 127.0.0.3.
    tokio::spawn(async move {
        while let Some((key, waiter)) = lookups.next().await {
            if key == "/127.0.0.3" {
                let answer =
                    crate::discovery::local::parse_local_config(&format!("workloads:{LEGACY}"))
                        .unwrap();
                source.replace_source("xds", answer);
            }
            keys.lock().unwrap().push(key);
            let _ = waiter.send(());
        }
    });
    let metrics = outbound.inputs.metrics.clone();
    let (mut app, task) = redirect(&outbound, legacy).await;
    round_trip(&mut app, b"plain bytes").await;
    drop(app);
    finished(task).await;
    assert!(asked.lock().unwrap().contains(&"/127.0.0.3".to_string()));
    let labels = ["destination_workload=\"legacy\""];
    assert_eq!(connections(&metrics, OPENED, &labels), 1);
}

#[tokio::test]
async fn a_service_vip_goes_to_a_healthy_endpoint_on_its_target_port() {
    let healthy = echo_server("127.0.0.4").await;
    // The unhealthy endpoint has nothing listening: picking it fails the connection.
    let endpoint = |name: &str, ip: &str, status: &str, services: &str| {
        format!(
            r#"
- uid: Kubernetes//Pod/test/{name}
  name: {name}
  namespace: test
  serviceAccount: server
  workloadIps: ["{ip}"]
  protocol: TCP
  status: {status}
  services:
{services}"#
        )
    };
    let port = healthy.port();
    let yaml = format!(
        r#"workloads:{CLIENT}{}{}
services:
- name: server
  namespace: test
  hostname: server.test.svc.cluster.local
  vips: ["/10.96.0.10"]
  ports: {{80: 9}}
- name: drained
  namespace: test
  hostname: drained.test.svc.cluster.local
  vips: ["/10.96.0.11"]
  ports: {{80: 9}}
"#,
        endpoint(
            "healthy",
            "127.0.0.4",
            "Healthy",
            &format!("    test/server.test.svc.cluster.local: {{80: {port}}}"),
        ),
        endpoint(
            "unhealthy",
            "127.0.0.5",
            "Unhealthy",
            &format!(
                "    test/server.test.svc.cluster.local: {{80: {port}}}\n    \
                 test/drained.test.svc.cluster.local: {{80: {port}}}"
            ),
        ),
    );
    let outbound = outbound(&yaml);
    let metrics = outbound.inputs.metrics.clone();
    // With two endpoints picked at random, 20 connections would reach the unhealthy
    // one with probability 1 - 2^-20 if health were ignored.
    for _ in 0..20 {
        let (mut app, task) = redirect(&outbound, "10.96.0.10:80".parse().unwrap()).await;
        round_trip(&mut app, b"to the service").await;
        drop(app);
        finished(task).await;
    }
    let labels = [
        "destination_service=\"server.test.svc.cluster.local\"",
        "destination_workload=\"healthy\"",
    ];
    assert_eq!(connections(&metrics, OPENED, &labels), 20);
    assert_eq!(connections(&metrics, FAILED, &[]), 0);

    // A service whose only endpoint is unhealthy has nowhere to go.
    let (mut app, task) = redirect(&outbound, "10.96.0.11:80".parse().unwrap()).await;
    finished(task).await;
    assert_closed(&mut app).await;
    assert_eq!(errors(&metrics, "no_healthy_upstream"), 1);
    assert_eq!(connections(&metrics, OPENED, &[]), 20);
}

/// A loopback address of its own, so the fixed HBONE port (15008) bound on it clashes
/// with no other test running at the same time.
fn random_loopback() -> IpAddr {
    let octet = || rand::random_range(1..=254u8);
    IpAddr::from([127, octet(), octet(), octet()])
}

#[tokio::test]
async fn a_service_vip_with_an_hbone_endpoint_is_tunnelled_to_its_ztunnel() {
    let ip = random_loopback();
    let echo = echo_server(&ip.to_string()).await;
    let state = state(&format!(
        r#"workloads:{CLIENT}
- uid: Kubernetes//Pod/test/server
  name: server
  namespace: test
  serviceAccount: server
  workloadIps: ["{ip}"]
  protocol: HBONE
  services:
    test/tunnel.test.svc.cluster.local: {{80: {}}}
services:
- name: tunnel
  namespace: test
  hostname: tunnel.test.svc.cluster.local
  vips: ["/10.96.0.12"]
"#,
        echo.port()
    ));
    let certs = certs();
    // The endpoint's ztunnel, on its HBONE port.
    let server = inputs(&state, &certs, "test", "server");
    let listener = LocalSocketFactory { mark: 0 }
        .listener(SocketAddr::new(ip, HBONE_PORT), false)
        .unwrap();
    tokio::spawn(Inbound::new(server.clone()).run(listener));

    let outbound = Outbound::new(inputs(&state, &certs, "test", "client"));
    let (mut app, task) = redirect(&outbound, "10.96.0.12:80".parse().unwrap()).await;
    round_trip(&mut app, b"through the tunnel").await;
    drop(app);
    finished(task).await;

    // Both ends saw mutual TLS between the two identities, i.e. it went through HBONE.
    let sent = [
        "reporter=\"source\"",
        "destination_service=\"tunnel.test.svc.cluster.local\"",
        "destination_principal=\"spiffe://cluster.local/ns/test/sa/server\"",
        "connection_security_policy=\"mutual_tls\"",
    ];
    assert_eq!(connections(&outbound.inputs.metrics, OPENED, &sent), 1);
    let received = [
        "reporter=\"destination\"",
        "source_principal=\"spiffe://cluster.local/ns/test/sa/client\"",
        "connection_security_policy=\"mutual_tls\"",
    ];
    assert_eq!(connections(&server.metrics, OPENED, &received), 1);
}

#[test]
fn a_vip_goes_to_the_endpoint_address_of_the_services_family() {
    let yaml = r#"workloads:
- uid: Kubernetes//Pod/test/dual
  name: dual
  namespace: test
  serviceAccount: server
  workloadIps: ["10.0.0.7", "fd00::7"]
services:
- {name: dual, namespace: test, hostname: dual.test.svc.cluster.local, vips: ["/10.96.0.7", "/fd00:96::7"], ipFamilies: Dual}
- {name: auto, namespace: test, hostname: auto.test.svc.cluster.local, vips: ["/fd00:96::8"]}
- {name: v4, namespace: test, hostname: v4.test.svc.cluster.local, vips: ["/fd00:96::9"], ipFamilies: IPv4}
"#;
    let state = state(yaml);
    let workload = state.workload_by_name("test", "dual").unwrap();
    let pick = |vip: &str| {
        let vip: IpAddr = vip.parse().unwrap();
        let service = state.service_by_vip(vip).unwrap();
        endpoint_ip(&service, &workload, vip).unwrap().to_string()
    };
    // Dual or unset: the VIP's family.
    assert_eq!(pick("10.96.0.7"), "10.0.0.7");
    assert_eq!(pick("fd00:96::7"), "fd00::7");
    assert_eq!(pick("fd00:96::8"), "fd00::7");
    // One family: that family, whatever the VIP.
    assert_eq!(pick("fd00:96::9"), "10.0.0.7");
}

#[tokio::test]
async fn a_bound_service_or_workload_is_routed_to_its_waypoint_and_never_around_it() {
    let waypoint = "waypoint: {destination: test/wp.test.svc.cluster.local, hboneMtlsPort: 15008}";
    let yaml = |instances: &str| {
        format!(
            r#"workloads:{CLIENT}
- uid: Kubernetes//Pod/test/server
  name: server
  namespace: test
  serviceAccount: server
  workloadIps: ["10.0.0.2"]
  protocol: HBONE
  {waypoint}
  services:
    test/echo.test.svc.cluster.local: {{80: 8080}}
- uid: Kubernetes//Pod/test/wp
  name: wp
  namespace: test
  serviceAccount: wp
  workloadIps: [{instances}]
  protocol: HBONE
  services:
    test/wp.test.svc.cluster.local: {{15008: 15008}}
services:
- {{name: echo, namespace: test, hostname: echo.test.svc.cluster.local, vips: ["/10.96.0.5"], {waypoint}}}
- {{name: wp, namespace: test, hostname: wp.test.svc.cluster.local, vips: ["/10.96.0.6"]}}
"#
        )
    };
    let outbound = outbound(&yaml("\"10.0.0.9\""));
    let state = &outbound.inputs.state;
    let client = state.workload_by_name("test", "client");
    for dst in ["10.96.0.5:80", "10.0.0.2:8080"] {
        match outbound.route(dst.parse().unwrap(), client.as_deref()) {
            Some(Route::Waypoint {
                waypoint, hbone, ..
            }) => {
                assert_eq!(waypoint.name, "wp", "{dst}");
                assert_eq!(hbone.to_string(), "10.0.0.9:15008", "{dst}");
            }
            other => panic!("{dst}: {other:?}"),
        }
    }
    // The waypoint's own traffic goes on to the endpoint.
    let wp = state.workload_by_name("test", "wp");
    assert!(matches!(
        outbound.route("10.96.0.5:80".parse().unwrap(), wp.as_deref()),
        Some(Route::Hbone { .. })
    ));
    // A waypoint with no instance address: refused, never around it.
    let outbound = self::outbound(&yaml(""));
    let client = outbound.inputs.state.workload_by_name("test", "client");
    for dst in ["10.96.0.5:80", "10.0.0.2:8080"] {
        assert!(
            matches!(
                outbound.route(dst.parse().unwrap(), client.as_deref()),
                Some(Route::WaypointUnavailable { .. })
            ),
            "{dst}"
        );
    }
}
