//! The DNS proxy over real loopback sockets: local answers, forwarding to a test
//! upstream, truncation, and hostile input.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{Name, RData, Record, RecordType};
use rand::RngCore;
use tokio::net::{TcpStream, UdpSocket};

use super::forward::{read_framed, write_framed};
use super::*;
use crate::drain::Drain;
use crate::identity::Identity;
use crate::metrics::Metrics;
use crate::socket::LocalSocketFactory;
use crate::state::{NetworkAddress, ProxyState, Service};

fn service(hostname: &str, vips: impl IntoIterator<Item = Ipv4Addr>) -> Service {
    Service {
        name: hostname.split('.').next().unwrap_or_default().into(),
        namespace: "demo".into(),
        hostname: hostname.into(),
        vips: vips
            .into_iter()
            .map(|ip| NetworkAddress {
                network: String::new(),
                address: ip.into(),
            })
            .collect(),
        ..Default::default()
    }
}

fn handler(upstreams: Vec<SocketAddr>) -> (DnsHandler, Arc<Metrics>) {
    let state = StateStore::new();
    let mut s = ProxyState::new();
    s.insert_service(service(
        "server.demo.svc.cluster.local",
        [Ipv4Addr::new(10, 96, 0, 20)],
    ));
    // 60 VIPs: about 1 KB of answers, more than a classic UDP answer holds.
    s.insert_service(service(
        "wide.demo.svc.cluster.local",
        (1..=60).map(|i| Ipv4Addr::new(10, 96, 1, i)),
    ));
    state.replace_source("local", s);
    let metrics = Arc::new(Metrics::new());
    let handler = DnsHandler {
        state,
        zone: Arc::new(LocalZone {
            cluster_domain: "cluster.local".into(),
            ipv6_enabled: true,
        }),
        metrics: metrics.dns.clone(),
        forwarder: Forwarder {
            upstreams: upstreams.into(),
            sockets: Arc::new(LocalSocketFactory { mark: 0 }),
        },
        client: crate::proxy::LocalWorkload {
            namespace: "demo".into(),
            name: "client".into(),
            identity: Identity::new("cluster.local", "demo", "client"),
        },
    };
    (handler, metrics)
}

fn query(name: &str, qtype: RecordType) -> Message {
    let mut m = Message::new();
    m.set_id(rand::random())
        .set_message_type(MessageType::Query)
        .set_op_code(OpCode::Query)
        .set_recursion_desired(true)
        .add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
    m
}

fn reply(step: Step) -> Message {
    match step {
        Step::Reply(bytes) => Message::from_vec(&bytes).expect("a valid answer"),
        Step::Forward(_) => panic!("expected a local answer, got a forward"),
        Step::Ignore => panic!("expected a local answer, got nothing"),
    }
}

fn a_records(m: &Message) -> Vec<Ipv4Addr> {
    m.answers()
        .iter()
        .filter_map(|r| match r.data() {
            RData::A(a) => Some(a.0),
            _ => None,
        })
        .collect()
}

#[test]
fn mesh_names_are_answered_locally_and_authoritatively() {
    let (handler, metrics) = handler(vec![]);
    let q = query("server.", RecordType::A);
    let answer = reply(handler.step(&q.to_vec().unwrap(), Protocol::Udp));
    assert_eq!(answer.id(), q.id());
    assert_eq!(answer.message_type(), MessageType::Response);
    assert_eq!(answer.response_code(), ResponseCode::NoError);
    assert!(answer.authoritative() && answer.recursion_available());
    assert_eq!(answer.queries(), q.queries());
    assert_eq!(a_records(&answer), [Ipv4Addr::new(10, 96, 0, 20)]);
    assert_eq!(answer.answers()[0].ttl(), local::TTL);
    let text = metrics.encode();
    assert!(
        text.contains(
            "istio_dns_requests_total{request_query_type=\"A\",request_protocol=\"udp\",source_canonical_service=\"unknown\",source_canonical_revision=\"unknown\"} 1"
        ),
        "{text}"
    );
}

#[test]
fn addresses_are_shuffled_per_answer() {
    let (handler, _) = handler(vec![]);
    let q = query("wide.demo.svc.cluster.local.", RecordType::A);
    let bytes = q.to_vec().unwrap();
    let orders: std::collections::HashSet<Vec<Ipv4Addr>> = (0..5)
        .map(|_| a_records(&reply(handler.step(&bytes, Protocol::Tcp))))
        .collect();
    // Five answers of 60 addresses all in one order: a chance of 1 in (60!)^4.
    assert!(orders.len() > 1, "always {orders:?}");
    for order in &orders {
        let mut sorted = order.clone();
        sorted.sort();
        assert_eq!(
            sorted,
            (1..=60)
                .map(|i| Ipv4Addr::new(10, 96, 1, i))
                .collect::<Vec<_>>()
        );
    }
}

#[test]
fn large_answers_are_truncated_over_udp_only() {
    let (handler, _) = handler(vec![]);
    let q = query("wide.demo.svc.cluster.local.", RecordType::A);
    let bytes = q.to_vec().unwrap();

    let udp = reply(handler.step(&bytes, Protocol::Udp));
    assert!(udp.truncated());
    assert!(udp.answers().is_empty());
    assert_eq!(udp.queries(), q.queries());

    let tcp = reply(handler.step(&bytes, Protocol::Tcp));
    assert!(!tcp.truncated());
    assert_eq!(a_records(&tcp).len(), 60);

    // A client that takes 4096 bytes over UDP (EDNS) gets it whole.
    let mut edns_query = q.clone();
    let mut edns = Edns::new();
    edns.set_max_payload(4096);
    edns_query.set_edns(edns);
    let big = reply(handler.step(&edns_query.to_vec().unwrap(), Protocol::Udp));
    assert!(!big.truncated());
    assert_eq!(a_records(&big).len(), 60);
}

#[test]
fn other_opcodes_malformed_queries_and_responses() {
    let (handler, _) = handler(vec![]);
    let mut notify = query("server.", RecordType::A);
    notify.set_op_code(OpCode::Notify);
    let answer = reply(handler.step(&notify.to_vec().unwrap(), Protocol::Udp));
    assert_eq!(answer.response_code(), ResponseCode::NotImp);

    let mut two = query("server.", RecordType::A);
    two.add_query(Query::query(Name::from_ascii("x.").unwrap(), RecordType::A));
    let answer = reply(handler.step(&two.to_vec().unwrap(), Protocol::Udp));
    assert_eq!(answer.response_code(), ResponseCode::FormErr);

    // A header that claims a question that is not there.
    let mut garbage = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    garbage.extend_from_slice(&[0xff; 7]);
    let answer = reply(handler.step(&garbage, Protocol::Udp));
    assert_eq!(answer.id(), 0x1234);
    assert_eq!(answer.response_code(), ResponseCode::FormErr);

    // Too short for a header, or a response: no answer at all.
    assert!(matches!(
        handler.step(&[1, 2, 3], Protocol::Udp),
        Step::Ignore
    ));
    let mut response = query("server.", RecordType::A);
    response.set_message_type(MessageType::Response);
    assert!(matches!(
        handler.step(&response.to_vec().unwrap(), Protocol::Udp),
        Step::Ignore
    ));
}

#[test]
fn random_and_mutated_input_never_panics() {
    let (handler, _) = handler(vec![]);
    let mut rng = rand::rng();
    let valid = query("server.demo.svc.cluster.local.", RecordType::A)
        .to_vec()
        .unwrap();
    for i in 0..20_000 {
        let mut bytes = if i % 2 == 0 {
            let mut b = vec![0u8; (rng.next_u32() % 600) as usize];
            rng.fill_bytes(&mut b);
            b
        } else {
            let mut b = valid.clone();
            for _ in 0..1 + rng.next_u32() % 4 {
                let at = rng.next_u32() as usize % b.len();
                b[at] = rng.next_u32() as u8;
            }
            b.truncate(rng.next_u32() as usize % (b.len() + 1));
            b
        };
        if let Step::Reply(answer) = handler.step(&bytes, Protocol::Udp) {
            assert!(answer.len() <= 512 || bytes.len() > 12, "{bytes:?}");
            assert!(
                Message::from_vec(&answer).is_ok(),
                "unparseable answer to {bytes:?}"
            );
        }
        bytes.clear();
    }
}

/// A test upstream on loopback: `external.test.` A 192.0.2.1, everything else
/// NXDOMAIN; UDP and TCP on the same port.
async fn upstream() -> SocketAddr {
    // The UDP port is ephemeral; the same TCP port may be taken by another test's
    // socket, so try again with another.
    let mut attempts = 0;
    let (udp, addr, tcp) = loop {
        let udp = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = udp.local_addr().unwrap();
        match tokio::net::TcpListener::bind(addr).await {
            Ok(tcp) => break (udp, addr, tcp),
            Err(_) if attempts < 20 => attempts += 1,
            Err(e) => panic!("no port free for both UDP and TCP: {e}"),
        }
    };
    fn answer(query: &[u8]) -> Vec<u8> {
        let q = Message::from_vec(query).unwrap();
        let mut m = Message::new();
        m.set_id(q.id())
            .set_message_type(MessageType::Response)
            .add_queries(q.queries().iter().cloned());
        let name = q.queries()[0].name().clone();
        if name == Name::from_ascii("external.test.").unwrap() {
            m.add_answer(Record::from_rdata(name, 60, RData::A(A::new(192, 0, 2, 1))));
        } else {
            m.set_response_code(ResponseCode::NXDomain);
        }
        m.to_vec().unwrap()
    }
    tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        while let Ok((n, peer)) = udp.recv_from(&mut buf).await {
            let _ = udp.send_to(&answer(&buf[..n]), peer).await;
        }
    });
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = tcp.accept().await {
            tokio::spawn(async move {
                while let Ok(Some(q)) = read_framed(&mut stream).await {
                    let _ = write_framed(&mut stream, &answer(&q)).await;
                }
            });
        }
    });
    addr
}

/// A DnsServer for `handler` on a free loopback port (UDP and TCP).
async fn serve(
    handler: DnsHandler,
    drain: &Drain,
) -> (SocketAddr, Vec<tokio::task::JoinHandle<()>>) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let server = DnsServer::bind(&LocalSocketFactory { mark: 0 }, addr)
        .await
        .unwrap();
    (addr, server.spawn(Arc::new(handler), drain.clone()))
}

async fn ask_udp(server: SocketAddr, q: &Message) -> Message {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    socket.send_to(&q.to_vec().unwrap(), server).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(10), socket.recv(&mut buf))
        .await
        .expect("an answer in time")
        .unwrap();
    Message::from_vec(&buf[..n]).unwrap()
}

async fn ask_tcp(server: SocketAddr, q: &Message) -> Message {
    let mut stream = TcpStream::connect(server).await.unwrap();
    write_framed(&mut stream, &q.to_vec().unwrap())
        .await
        .unwrap();
    let answer = read_framed(&mut stream).await.unwrap().unwrap();
    Message::from_vec(&answer).unwrap()
}

#[tokio::test]
async fn other_names_are_forwarded_and_upstream_codes_pass_through() {
    let (handler, metrics) = handler(vec![upstream().await]);
    let drain = Drain::new();
    let (server, handles) = serve(handler, &drain).await;

    for protocol in [Protocol::Udp, Protocol::Tcp] {
        let ask = |q: Message| async move {
            match protocol {
                Protocol::Udp => ask_udp(server, &q).await,
                Protocol::Tcp => ask_tcp(server, &q).await,
            }
        };
        let q = query("external.test.", RecordType::A);
        let answer = ask(q.clone()).await;
        assert_eq!(answer.id(), q.id());
        assert_eq!(a_records(&answer), [Ipv4Addr::new(192, 0, 2, 1)]);

        let q = query("nope.demo.svc.cluster.local.", RecordType::A);
        assert_eq!(ask(q).await.response_code(), ResponseCode::NXDomain);

        // Mesh names never reach the upstream (which would say NXDOMAIN).
        let q = query("server.demo.svc.cluster.local.", RecordType::A);
        assert_eq!(a_records(&ask(q).await), [Ipv4Addr::new(10, 96, 0, 20)]);
    }
    let text = metrics.encode();
    for protocol in ["udp", "tcp"] {
        let line = format!("istio_dns_upstream_requests_total{{request_query_type=\"A\",request_protocol=\"{protocol}\",source_canonical_service=\"unknown\",source_canonical_revision=\"unknown\"}} 2");
        assert!(text.contains(&line), "{text}");
    }
    assert!(
        !text.contains("istio_dns_upstream_failures_total{"),
        "{text}"
    );
    assert!(text.contains("istio_dns_upstream_request_duration_seconds_bucket{"));

    drain.stop_accepting();
    for handle in handles {
        handle.await.unwrap();
    }
    // Its sockets are gone with it.
    assert!(UdpSocket::bind(server).await.is_ok());
}

#[tokio::test]
async fn an_unreachable_upstream_is_servfail() {
    // A port nothing listens on: the kernel refuses at once.
    let closed = {
        let s = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        s.local_addr().unwrap()
    };
    let (handler, metrics) = handler(vec![closed]);
    let drain = Drain::new();
    let (server, _handles) = serve(handler, &drain).await;
    let q = query("external.test.", RecordType::A);
    let answer = ask_udp(server, &q).await;
    assert_eq!(answer.response_code(), ResponseCode::ServFail);
    assert_eq!(answer.id(), q.id());
    assert!(metrics.encode().contains(
        "istio_dns_upstream_failures_total{request_query_type=\"A\",request_protocol=\"udp\""
    ));
    drain.stop_accepting();
}

/// `XDS_ON_DEMAND`: a Service name the state misses is asked of istiod (Istio's
/// `namespace/hostname` key) and answered locally once known, with no upstream
/// involved; a name that is no Kubernetes Service is not asked for.
#[tokio::test]
async fn on_demand_a_missed_service_name_is_fetched_and_answered_locally() {
    let (handler, _) = handler(vec![]);
    let (demand, mut lookups) = crate::state::demand::Demand::new(String::new());
    handler.state.enable_on_demand(demand);
    let state = handler.state.clone();
    let asked = Arc::new(std::sync::Mutex::new(Vec::new()));
    let keys = asked.clone();
    // istiod's part: knows demo/late, answers every key.
    tokio::spawn(async move {
        while let Some((key, waiter)) = lookups.next().await {
            if key == "demo/late.demo.svc.cluster.local" {
                let mut s = (*state.snapshot()).clone();
                s.insert_service(service(
                    "late.demo.svc.cluster.local",
                    [Ipv4Addr::new(10, 96, 0, 30)],
                ));
                state.replace_source("xds", s);
            }
            keys.lock().unwrap().push(key);
            let _ = waiter.send(());
        }
    });

    // "late" from a pod in demo: its search path makes it late.demo.svc.cluster.local.
    let q = query("late.", RecordType::A);
    let Step::Forward(upstream) = handler.step(&q.to_vec().unwrap(), Protocol::Udp) else {
        panic!("not in the state yet: the query goes the upstream way");
    };
    // No upstream is configured: only a local answer can be NOERROR.
    let answer = Message::from_vec(&handler.forward(upstream, Protocol::Udp).await).unwrap();
    assert_eq!(answer.response_code(), ResponseCode::NoError);
    assert_eq!(a_records(&answer), [Ipv4Addr::new(10, 96, 0, 30)]);
    assert!(asked
        .lock()
        .unwrap()
        .contains(&"demo/late.demo.svc.cluster.local".to_owned()));

    let before = asked.lock().unwrap().len();
    let q = query("example.com.", RecordType::A);
    let Step::Forward(upstream) = handler.step(&q.to_vec().unwrap(), Protocol::Udp) else {
        panic!("an outside name goes upstream");
    };
    let answer = Message::from_vec(&handler.forward(upstream, Protocol::Udp).await).unwrap();
    assert_eq!(answer.response_code(), ResponseCode::ServFail);
    assert!(
        asked.lock().unwrap()[before..]
            .iter()
            .all(|k| k.ends_with(".svc.cluster.local")),
        "{asked:?}"
    );
}
