//! DNS for the DNS-proxy tests and benchmark: a small authoritative test upstream
//! (`e2e-app dns`), the namespace it runs in, Kubernetes-style `resolv.conf` text, and
//! a UDP client that checks what came back.
//!
//! The upstream's zone is fixed so a test can tell who answered: ztunnel answers mesh
//! Service names with their VIPs, the upstream answers NXDOMAIN for them.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{Name, RData, Record, RecordType};

use test_support::netns::{link, Netns};
use test_support::poll::wait_for;
use test_support::process::ChildGuard;

/// The upstream's address in its own namespace, and the node side of its link.
pub const UPSTREAM_IP: &str = "10.53.0.2";
const UPSTREAM_GATEWAY: &str = "10.53.0.1";
/// `external.test.` has one A record: the upstream answered.
pub const EXTERNAL_NAME: &str = "external.test.";
pub const EXTERNAL_IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
/// `big.test.` has [`BIG_RECORDS`] A records: more than 512 bytes, so a UDP answer
/// without EDNS is truncated.
pub const BIG_NAME: &str = "big.test.";
pub const BIG_RECORDS: usize = 40;
/// TTL of the upstream's records (ztunnel's own answers carry 30).
pub const UPSTREAM_TTL: u32 = 300;
/// EDNS payload the upstream advertises when the client used EDNS.
const UPSTREAM_EDNS_PAYLOAD: u16 = 1232;

/// The `resolv.conf` Kubernetes gives a pod in `namespace` (`dnsPolicy: ClusterFirst`).
pub fn pod_resolv_conf(nameserver: &str, namespace: &str, cluster_domain: &str) -> String {
    format!(
        "nameserver {nameserver}\nsearch {namespace}.svc.{cluster_domain} svc.{cluster_domain} {cluster_domain}\noptions ndots:5\n"
    )
}

/// Which transport a message came over: UDP answers are truncated to the client's
/// size, TCP answers are whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Udp,
    Tcp,
}

/// The upstream's answer to the wire bytes `request`, or `None` when there is nothing
/// to answer (not a DNS message, or a response). Never panics on any input.
pub fn respond(request: &[u8], transport: Transport) -> Option<(Vec<u8>, Message)> {
    respond_from(request, transport, zone)
}

/// The answer to `request` from an authoritative server whose records for a query are
/// `zone(query)`: `Some(vec![])` for a name without records of the asked type, `None`
/// for a name that does not exist (NXDOMAIN).
pub fn respond_from(
    request: &[u8],
    transport: Transport,
    zone: impl FnOnce(&Query) -> Option<Vec<Record>>,
) -> Option<(Vec<u8>, Message)> {
    let request = Message::from_vec(request).ok()?;
    if request.message_type() != MessageType::Query {
        return None;
    }
    let mut response = Message::new();
    response
        .set_id(request.id())
        .set_message_type(MessageType::Response)
        .set_op_code(request.op_code())
        .set_recursion_desired(request.recursion_desired())
        .set_recursion_available(true);
    if request.extensions().is_some() {
        let mut edns = Edns::new();
        edns.set_max_payload(UPSTREAM_EDNS_PAYLOAD);
        response.set_edns(edns);
    }
    if request.op_code() != OpCode::Query {
        response.set_response_code(ResponseCode::NotImp);
    } else if let [query] = request.queries() {
        response.add_query(query.clone());
        response.set_authoritative(true);
        match zone(query) {
            Some(records) => {
                response.add_answers(records);
            }
            None => {
                response.set_response_code(ResponseCode::NXDomain);
            }
        }
    } else {
        response.set_response_code(ResponseCode::FormErr);
    }
    let mut bytes = response.to_vec().ok()?;
    if transport == Transport::Udp && bytes.len() > usize::from(request.max_payload()) {
        // RFC 1035 4.2.1 / RFC 2181 9: too big for UDP, so TC and no answers; the
        // client retries over TCP.
        response = response.truncate();
        bytes = response.to_vec().ok()?;
    }
    Some((bytes, response))
}

/// The records for `query`: `Some(vec![])` for a name that exists without records of
/// the asked type, `None` for a name that does not exist (NXDOMAIN), which is every
/// name but `external.test.` and `big.test.` (cluster names included).
fn zone(query: &Query) -> Option<Vec<Record>> {
    let name = query.name();
    let is = |zone_name: &str| Name::from_ascii(zone_name).is_ok_and(|n| &n == name);
    let a = |ip: Ipv4Addr| Record::from_rdata(name.clone(), UPSTREAM_TTL, RData::A(A(ip)));
    let wants_a = matches!(query.query_type(), RecordType::A | RecordType::ANY);
    if is(EXTERNAL_NAME) {
        Some(if wants_a {
            vec![a(EXTERNAL_IP)]
        } else {
            vec![]
        })
    } else if is(BIG_NAME) {
        Some(if wants_a {
            (0..BIG_RECORDS)
                .map(|i| a(Ipv4Addr::new(198, 51, 100, i as u8 + 1)))
                .collect()
        } else {
            vec![]
        })
    } else {
        None
    }
}

/// One line per answered query, for test logs.
fn describe(transport: Transport, peer: SocketAddr, response: &Message) -> String {
    let query = response
        .query()
        .map(|q| format!("{} {}", q.name(), q.query_type()))
        .unwrap_or_else(|| "-".into());
    format!(
        "{transport:?} from {peer}: {query} -> {} answers={} tc={}",
        response.response_code(),
        response.answers().len(),
        response.truncated()
    )
}

/// Serves the zone on UDP and TCP `listen` until the process is killed. With
/// `log_queries`, prints one line per answer (tests read it to see who asked).
pub fn serve(listen: SocketAddr, log_queries: bool) -> Result<()> {
    serve_with(listen, log_queries, respond)
}

/// Serves `answer`'s replies on UDP and TCP `listen` until the process is killed.
pub fn serve_with<A>(listen: SocketAddr, log_queries: bool, answer: A) -> Result<()>
where
    A: Fn(&[u8], Transport) -> Option<(Vec<u8>, Message)> + Clone + Send + 'static,
{
    let udp = UdpSocket::bind(listen).with_context(|| format!("binding UDP {listen}"))?;
    let tcp = TcpListener::bind(listen).with_context(|| format!("binding TCP {listen}"))?;
    eprintln!("dns: serving on {listen} (UDP, TCP)");
    let tcp_answer = answer.clone();
    std::thread::spawn(move || {
        for stream in tcp.incoming() {
            let Ok(stream) = stream else { continue };
            let answer = tcp_answer.clone();
            std::thread::spawn(move || {
                if let Err(e) = serve_tcp(stream, log_queries, answer) {
                    eprintln!("dns: TCP connection: {e:#}");
                }
            });
        }
    });
    let mut buf = vec![0u8; 65535];
    loop {
        let (n, peer) = match udp.recv_from(&mut buf) {
            Ok(received) => received,
            Err(e) => {
                eprintln!("dns: UDP receive: {e}");
                continue;
            }
        };
        let Some((reply, response)) = answer(&buf[..n], Transport::Udp) else {
            if log_queries {
                eprintln!("Udp from {peer}: {n} bytes not answered");
            }
            continue;
        };
        if log_queries {
            eprintln!("{}", describe(Transport::Udp, peer, &response));
        }
        if let Err(e) = udp.send_to(&reply, peer) {
            eprintln!("dns: UDP send to {peer}: {e}");
        }
    }
}

/// RFC 1035 4.2.2 framing: a 2-byte length before each message; many per connection.
fn serve_tcp(
    mut stream: TcpStream,
    log_queries: bool,
    answer: impl Fn(&[u8], Transport) -> Option<(Vec<u8>, Message)>,
) -> Result<()> {
    let peer = stream.peer_addr()?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    loop {
        let mut len = [0u8; 2];
        if stream.read_exact(&mut len).is_err() {
            return Ok(());
        }
        let mut request = vec![0u8; usize::from(u16::from_be_bytes(len))];
        stream
            .read_exact(&mut request)
            .context("reading a framed message")?;
        let Some((reply, response)) = answer(&request, Transport::Tcp) else {
            // Nothing sensible to say to a stream that is not DNS: close it.
            return Ok(());
        };
        if log_queries {
            eprintln!("{}", describe(Transport::Tcp, peer, &response));
        }
        let len = u16::try_from(reply.len()).context("answer over 64 KiB")?;
        stream.write_all(&len.to_be_bytes())?;
        stream.write_all(&reply)?;
    }
}

/// Wire bytes of a standard query (recursion desired) for `name`, with an EDNS OPT
/// record offering `edns_payload` bytes when given.
pub fn query_bytes(
    id: u16,
    name: &str,
    rtype: RecordType,
    edns_payload: Option<u16>,
) -> Result<Vec<u8>> {
    let name = Name::from_ascii(name).with_context(|| format!("query name {name:?}"))?;
    let mut message = Message::new();
    message
        .set_id(id)
        .set_message_type(MessageType::Query)
        .set_op_code(OpCode::Query)
        .set_recursion_desired(true)
        .add_query(Query::query(name, rtype));
    if let Some(payload) = edns_payload {
        let mut edns = Edns::new();
        edns.set_max_payload(payload);
        message.set_edns(edns);
    }
    Ok(message.to_vec()?)
}

/// Sends a query for `name` on `socket` to `server` and waits (up to `timeout`) for
/// the answer with the same id; answers to other ids are skipped.
pub fn ask_udp(
    socket: &UdpSocket,
    server: SocketAddr,
    name: &str,
    rtype: RecordType,
    timeout: Duration,
) -> Result<Message> {
    let id: u16 = rand::random();
    let request = query_bytes(id, name, rtype, Some(1232))?;
    socket
        .send_to(&request, server)
        .with_context(|| format!("sending a query for {name} to {server}"))?;
    let deadline = Instant::now() + timeout;
    let mut buf = vec![0u8; 65535];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!("no answer from {server} for {name} {rtype} within {timeout:?}");
        }
        socket.set_read_timeout(Some(left))?;
        let n = match socket.recv_from(&mut buf) {
            Ok((n, _)) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(e) => bail!("receiving the answer for {name} from {server}: {e}"),
        };
        let Ok(answer) = Message::from_vec(&buf[..n]) else {
            bail!(
                "unparseable answer from {server} for {name}: {:02x?}",
                &buf[..n]
            );
        };
        if answer.id() == id && answer.message_type() == MessageType::Response {
            return Ok(answer);
        }
    }
}

/// The A and AAAA addresses in `message`'s answer section, in order.
pub fn addresses(message: &Message) -> Vec<IpAddr> {
    message
        .answers()
        .iter()
        .filter_map(|r| r.data().ip_addr())
        .collect()
}

/// The test upstream: `e2e-app dns` on [`UPSTREAM_IP`]:53 in a namespace of its own,
/// linked to a node namespace (which routes pods' traffic to it).
pub struct Upstream {
    // Fields drop in order: the process, then its namespace.
    pub app: ChildGuard,
    pub ns: Netns,
}

impl Upstream {
    /// Starts the upstream in `<tag>up`, linked to `node`; returns once it answers.
    /// With `log_queries` its log has a line per answer (see [`Upstream::log`]).
    pub fn start(node: &Netns, tag: &str, log_queries: bool) -> Result<Self> {
        let ns = Netns::new(&format!("{tag}up"))?;
        link(
            node,
            &format!("{UPSTREAM_GATEWAY}/30"),
            &ns,
            &format!("{UPSTREAM_IP}/30"),
        )?;
        ns.exec(&["ip", "route", "add", "default", "via", UPSTREAM_GATEWAY])?;
        let mut cmd = ns.command(
            test_support::built_binary("e2e-app")?
                .to_str()
                .context("path")?,
        );
        cmd.args(["dns", "--listen", "0.0.0.0:53"]);
        if log_queries {
            cmd.arg("--log-queries");
        }
        let app = ChildGuard::spawn(&format!("dns-{}", ns.name()), cmd)?;
        let upstream = Upstream { app, ns };
        let server: SocketAddr = format!("{UPSTREAM_IP}:53").parse()?;
        wait_for("the test DNS upstream", Duration::from_secs(10), || {
            let answer = node
                .run_inside(|| -> Result<Message> {
                    let socket = UdpSocket::bind("0.0.0.0:0")?;
                    ask_udp(
                        &socket,
                        server,
                        EXTERNAL_NAME,
                        RecordType::A,
                        Duration::from_millis(200),
                    )
                })
                .ok()?
                .ok()?;
            (addresses(&answer) == [IpAddr::V4(EXTERNAL_IP)]).then_some(())
        })
        .with_context(|| format!("upstream log:\n{}", upstream.log()))?;
        Ok(upstream)
    }

    /// The upstream's log: one line per answer when started with `log_queries`.
    pub fn log(&self) -> String {
        self.app.log()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(bytes: &[u8], transport: Transport) -> Message {
        let (reply, _) = respond(bytes, transport).expect("an answer");
        Message::from_vec(&reply).expect("a parseable answer")
    }

    #[test]
    fn the_zone_answers_its_names_and_nxdomain_for_the_rest() {
        let q = query_bytes(7, "EXTERNAL.test.", RecordType::A, None).unwrap();
        let a = answer(&q, Transport::Udp);
        assert_eq!(a.id(), 7);
        assert_eq!(a.response_code(), ResponseCode::NoError);
        assert_eq!(addresses(&a), [IpAddr::V4(EXTERNAL_IP)]);
        let q = query_bytes(8, EXTERNAL_NAME, RecordType::AAAA, None).unwrap();
        let a = answer(&q, Transport::Udp);
        assert_eq!(a.response_code(), ResponseCode::NoError);
        assert!(a.answers().is_empty());
        for name in ["server.demo.svc.cluster.local.", "server.", "nope.test."] {
            let q = query_bytes(9, name, RecordType::A, None).unwrap();
            assert_eq!(
                answer(&q, Transport::Udp).response_code(),
                ResponseCode::NXDomain,
                "{name}"
            );
        }
    }

    #[test]
    fn big_answers_are_truncated_over_udp_only_without_room() {
        let q = query_bytes(1, BIG_NAME, RecordType::A, None).unwrap();
        let udp = answer(&q, Transport::Udp);
        assert!(udp.truncated());
        assert!(udp.answers().is_empty());
        let tcp = answer(&q, Transport::Tcp);
        assert!(!tcp.truncated());
        assert_eq!(tcp.answers().len(), BIG_RECORDS);
        let q = query_bytes(2, BIG_NAME, RecordType::A, Some(4096)).unwrap();
        let edns = answer(&q, Transport::Udp);
        assert!(!edns.truncated());
        assert_eq!(edns.answers().len(), BIG_RECORDS);
    }

    #[test]
    fn other_opcodes_and_bad_messages_are_refused_and_garbage_is_ignored() {
        let mut q = query_bytes(3, EXTERNAL_NAME, RecordType::A, None).unwrap();
        q[2] = (q[2] & !0x78) | (2 << 3); // opcode STATUS
        assert_eq!(
            answer(&q, Transport::Udp).response_code(),
            ResponseCode::NotImp
        );
        // A header asking nothing.
        let empty = [0, 4, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(
            answer(&empty, Transport::Udp).response_code(),
            ResponseCode::FormErr
        );
        assert!(respond(&[], Transport::Udp).is_none());
        assert!(respond(&[1, 2, 3], Transport::Tcp).is_none());
        let q = query_bytes(4, EXTERNAL_NAME, RecordType::A, None).unwrap();
        for len in 0..q.len() {
            assert!(respond(&q[..len], Transport::Udp).is_none(), "prefix {len}");
        }
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..2000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let len = (seed % 700) as usize;
            let bytes: Vec<u8> = (0..len)
                .map(|i| (seed.rotate_left(i as u32 % 64) >> 3) as u8)
                .collect();
            let _ = respond(&bytes, Transport::Udp);
        }
    }
}
