//! ztunnel's DNS proxy in in-pod mode. One node namespace runs ztunnel, driven over ZDS
//! by the node agent's test double; pods get the node agent's own in-pod rules (as
//! cni-agent renders them, DNS capture on or off) and Kubernetes-style resolv.conf
//! files; a test upstream (`e2e-app dns`) runs in a namespace of its own behind the
//! node. The upstream knows no mesh Service, so every answer shows who gave it: a
//! Service VIP comes from ztunnel, NXDOMAIN for a Service name from the upstream.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RecordType};
use local_cluster::dns::{
    addresses, ask_udp, pod_resolv_conf, query_bytes, Upstream, BIG_NAME, BIG_RECORDS, EXTERNAL_IP,
    UPSTREAM_IP,
};
use local_cluster::mesh::{self, metric_sum, ztunnel_metrics};
use local_cluster::zds_agent::FakeAgent;
use redirection::rules::InpodRules;
use redirection::{Backend, Mode};
use shared_types::zds::WorkloadInfo;
use test_support::poll::wait_for;
use test_support::process::ChildGuard;
use test_support::topology::{Node, Pod};

const NAMESPACE: &str = "demo";
const CLUSTER_DOMAIN: &str = "cluster.local";
const SERVICE: &str = "server.demo.svc.cluster.local.";
const VIP: &str = "10.96.0.10";
/// A dual-stack Service on the same workload.
const DUAL_VIP4: &str = "10.96.0.11";
const DUAL_VIP6: &str = "fd00:96::11";
/// The headless Service's endpoints: workloads only discovery knows (no pod namespace).
const DB_IPS: [&str; 2] = ["10.244.1.200", "10.244.1.201"];
/// ztunnel's DNS proxy inside each pod.
const PROXY_ADDR: &str = "127.0.0.1:15053";
/// ztunnel's own answers (the upstream's carry 300).
const LOCAL_TTL: u32 = 30;

/// How a client pod is programmed and enrolled: with or without DNS capture.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Start {
    DnsCapture,
    NoDnsCapture,
}

/// One node: ztunnel, the fake agent, the upstream, the `server` pod (a sink on 9000
/// behind Service `server`) and the test's client pods.
struct DnsCluster {
    // Fields drop in order: processes, namespaces, files.
    apps: Vec<ChildGuard>,
    ztunnel: ChildGuard,
    agent: FakeAgent,
    upstream: Upstream,
    pods: Vec<Pod>,
    node: Node,
    /// ztunnel runs its DNS proxy (it is on unless `ISTIO_META_DNS_CAPTURE` says not).
    proxy_on: bool,
    /// The CA and the local config, kept until ztunnel is gone.
    _dir: tempfile::TempDir,
}

fn workload(name: &str, ip: &str, services: &[(&str, u16)]) -> String {
    let mut text = format!(
        "- uid: uid-{name}\n  name: {name}\n  namespace: {NAMESPACE}\n  serviceAccount: {name}\n  workloadIps: [\"{ip}\"]\n  protocol: HBONE\n  node: node1\n"
    );
    if !services.is_empty() {
        text.push_str("  services:\n");
        for (service, port) in services {
            text.push_str(&format!(
                "    \"{NAMESPACE}/{service}.{NAMESPACE}.svc.{CLUSTER_DOMAIN}\":\n      {port}: {port}\n"
            ));
        }
    }
    text
}

fn service(name: &str, vips: &[&str], port: u16) -> String {
    let vips: Vec<String> = vips.iter().map(|v| format!("\"/{v}\"")).collect();
    format!(
        "- name: {name}\n  namespace: {NAMESPACE}\n  hostname: {name}.{NAMESPACE}.svc.{CLUSTER_DOMAIN}\n  vips: [{}]\n  ports:\n    {port}: {port}\n",
        vips.join(", ")
    )
}

impl DnsCluster {
    fn new(tag: &str, clients: &[(&str, Start)]) -> Result<Self> {
        Self::with_env(tag, clients, &[])
    }

    fn with_env(tag: &str, clients: &[(&str, Start)], env: &[(&str, &str)]) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        mesh::ca_init(&dir.path().join("ca"))?;
        let node = Node::new(tag, 1)?;
        let upstream = Upstream::start(&node.ns, tag, true)?;
        // ztunnel's own resolv.conf, as a ztunnel pod would get it: its upstreams.
        node.ns.set_resolv_conf(&pod_resolv_conf(
            UPSTREAM_IP,
            "istio-system",
            CLUSTER_DOMAIN,
        ))?;
        let mut pods = vec![node.add_pod(tag, "server")?];
        for (name, _) in clients {
            pods.push(node.add_pod(tag, name)?);
        }
        let mut workloads = String::new();
        for pod in &pods {
            pod.ns
                .set_resolv_conf(&pod_resolv_conf(UPSTREAM_IP, NAMESPACE, CLUSTER_DOMAIN))?;
            let services: &[(&str, u16)] = if pod.name == "server" {
                &[("server", 9000), ("dual", 9000)]
            } else {
                &[]
            };
            workloads.push_str(&workload(&pod.name, &pod.ip, services));
        }
        for (i, ip) in DB_IPS.iter().enumerate() {
            workloads.push_str(&workload(&format!("db-{i}"), ip, &[("db", 5432)]));
        }
        let config = format!(
            "workloads:\n{workloads}services:\n{}{}{}",
            service("server", &[VIP], 9000),
            service("dual", &[DUAL_VIP4, DUAL_VIP6], 9000),
            service("db", &[], 5432),
        );
        std::fs::write(dir.path().join("config.yaml"), config)?;
        let agent = FakeAgent::start(&dir.path().join("node1.sock"))?;
        let mut ztunnel_env = vec![("TERMINATION_GRACE_PERIOD", "1s"), ("NODE_NAME", "node1")];
        ztunnel_env.extend_from_slice(env);
        let ztunnel = mesh::start_shared_ztunnel(
            &node.ns,
            &agent.socket,
            &dir.path().join("ca"),
            &dir.path().join("config.yaml"),
            &ztunnel_env,
        )?;
        let proxy_on = !env
            .iter()
            .any(|(k, v)| *k == "ISTIO_META_DNS_CAPTURE" && !v.eq_ignore_ascii_case("true"));
        let mut cluster = DnsCluster {
            apps: vec![],
            ztunnel,
            agent,
            upstream,
            pods,
            node,
            proxy_on,
            _dir: dir,
        };
        cluster.enroll("server", true)?;
        for (name, start) in clients {
            cluster.enroll(name, *start == Start::DnsCapture)?;
        }
        let server = cluster.pod("server");
        let mut cmd = server.ns.command(
            test_support::built_binary("e2e-app")?
                .to_str()
                .context("path")?,
        );
        cmd.args(["sink", "--listen", "0.0.0.0:9000"]);
        let sink = ChildGuard::spawn(&format!("sink-{}", server.ns.name()), cmd)?;
        cluster.apps.push(sink);
        wait_for("the sink", Duration::from_secs(10), || {
            let ports = cluster.pod("server").ns.stdout(&["ss", "-Hltn"]).ok()?;
            local_ports(&ports).contains(&9000).then_some(())
        })?;
        Ok(cluster)
    }

    fn pod(&self, name: &str) -> &Pod {
        self.pods
            .iter()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("no pod {name} in this cluster"))
    }

    /// Programs the agent's in-pod rules (with or without DNS capture) and hands the
    /// pod to ztunnel; with the proxy on, waits until its DNS server is up in the pod.
    fn enroll(&self, name: &str, dns_capture: bool) -> Result<()> {
        let pod = self.pod(name);
        local_cluster::inpod::capture(
            pod,
            &InpodRules {
                dns_capture,
                ..Default::default()
            },
        )?;
        let info = WorkloadInfo {
            name: pod.name.clone(),
            namespace: NAMESPACE.into(),
            service_account: pod.name.clone(),
        };
        let (answer, _) = self
            .agent
            .add(&format!("uid-{name}"), info, &pod.ns.path())?;
        answer.map_err(|reason| anyhow::anyhow!("ztunnel refused {name}: {reason}"))?;
        if self.proxy_on {
            wait_for(
                &format!("ztunnel's DNS proxy on {PROXY_ADDR} (UDP and TCP) in pod {name}"),
                Duration::from_secs(5),
                || (dns_sockets(pod).ok()? == (true, true)).then_some(()),
            )
            .with_context(|| self.diagnostics())?;
        }
        Ok(())
    }

    /// `dig` in pod `name` (with the pod's resolv.conf), asking the upstream's address:
    /// with DNS capture, ztunnel answers instead.
    fn ask(&self, name: &str, args: &[&str]) -> Result<Dig> {
        let server = format!("@{UPSTREAM_IP}");
        let mut all = vec![server.as_str()];
        all.extend_from_slice(args);
        self.dig(name, &all)
    }

    /// `dig` in pod `name` with `args` (server included).
    fn dig(&self, name: &str, args: &[&str]) -> Result<Dig> {
        let mut argv = vec![
            "dig",
            "+tries=1",
            "+time=3",
            "+noall",
            "+comments",
            "+answer",
        ];
        argv.extend_from_slice(args);
        let out = self
            .pod(name)
            .ns
            .stdout(&argv)
            .with_context(|| format!("{argv:?} in pod {name}\n{}", self.diagnostics()))?;
        Dig::parse(&out)
    }

    fn metrics(&self) -> Result<String> {
        ztunnel_metrics(&self.node.ns)
    }

    fn upstream_addr(&self) -> SocketAddr {
        SocketAddr::new(UPSTREAM_IP.parse().expect("upstream IP"), 53)
    }

    /// The ends of ztunnel's and the upstream's logs, for failure messages.
    fn diagnostics(&self) -> String {
        format!(
            "--- ztunnel log (end) ---\n{}\n--- upstream log (end) ---\n{}",
            tail(&self.ztunnel.log(), 30),
            tail(&self.upstream.log(), 30)
        )
    }
}

/// Whether the upstream's log has a query for `name` (absolute), from `ip` if given.
fn upstream_saw(log: &str, name: &str, from: Option<&str>) -> bool {
    log.lines().any(|line| {
        line.contains(&format!(": {name} "))
            && from.is_none_or(|ip| line.contains(&format!(" from {ip}:")))
    })
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Local ports in `ss -H` output (the fourth column is the local address).
fn local_ports(ss: &str) -> Vec<u16> {
    ss.lines()
        .filter_map(|line| line.split_whitespace().nth(3))
        .filter_map(|local| local.rsplit_once(':')?.1.parse().ok())
        .collect()
}

/// Whether anything in the pod has a UDP socket, and a TCP listener, on port 15053.
fn dns_sockets(pod: &Pod) -> Result<(bool, bool)> {
    let udp = pod.ns.stdout(&["ss", "-Hluan"])?;
    let tcp = pod.ns.stdout(&["ss", "-Hltn"])?;
    Ok((
        local_ports(&udp).contains(&15053),
        local_ports(&tcp).contains(&15053),
    ))
}

/// `dig +noall +comments +answer` output: the status, the header flags and the answer
/// records.
#[derive(Debug)]
struct Dig {
    status: String,
    flags: Vec<String>,
    answers: Vec<Rr>,
    text: String,
}

#[derive(Debug, Clone)]
struct Rr {
    name: String,
    ttl: u32,
    rtype: String,
    data: String,
}

impl Dig {
    fn parse(text: &str) -> Result<Self> {
        let status = text
            .split_once("status: ")
            .and_then(|(_, rest)| rest.split(',').next())
            .with_context(|| format!("no status in dig's output:\n{text}"))?
            .to_owned();
        let flags = text
            .split_once(";; flags:")
            .and_then(|(_, rest)| rest.split(';').next())
            .with_context(|| format!("no flags in dig's output:\n{text}"))?
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        let mut answers = Vec::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with(';') {
                continue;
            }
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [name, ttl, _class, rtype, data @ ..] = fields.as_slice() else {
                bail!("unexpected answer line {line:?} in:\n{text}");
            };
            answers.push(Rr {
                name: name.to_string(),
                ttl: ttl.parse().with_context(|| format!("TTL in {line:?}"))?,
                rtype: rtype.to_string(),
                data: data.join(" "),
            });
        }
        Ok(Dig {
            status,
            flags,
            answers,
            text: text.to_owned(),
        })
    }

    fn has_flag(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }

    /// The data of the answers of type `rtype`, sorted.
    fn data(&self, rtype: &str) -> Vec<String> {
        let mut data: Vec<String> = self
            .answers
            .iter()
            .filter(|r| r.rtype == rtype)
            .map(|r| r.data.clone())
            .collect();
        data.sort();
        data
    }
}

impl std::fmt::Display for Dig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// Checks a local answer: NOERROR, authoritative with recursion available, TTL 30,
/// and exactly `addresses` of `rtype`.
fn expect_local(dig: &Dig, rtype: &str, addresses: &[&str], what: &str) {
    assert_eq!(dig.status, "NOERROR", "{what}:\n{dig}");
    assert!(
        dig.has_flag("aa") && dig.has_flag("ra"),
        "{what}: ztunnel's answers are authoritative with RA set:\n{dig}"
    );
    assert_eq!(dig.data(rtype), addresses, "{what}:\n{dig}");
    for rr in &dig.answers {
        assert_eq!(rr.ttl, LOCAL_TTL, "{what}: TTL of {rr:?}:\n{dig}");
    }
}

#[test]
fn service_names_are_answered_by_ztunnel_and_other_names_by_the_upstream() -> Result<()> {
    if !test_support::can_run_root_tests() {
        return Ok(());
    }
    let c = DnsCluster::new("dq", &[("client", Start::DnsCapture)])?;
    let client_ip = c.pod("client").ip.clone();

    // Every spelling of the Service, asked as is: ztunnel expands from the client's
    // namespace itself.
    for name in [
        "server.demo.svc.cluster.local",
        "server.demo.svc",
        "server.demo",
        "server",
    ] {
        let dig = c.ask("client", &[name, "A"])?;
        expect_local(&dig, "A", &[VIP], name);
    }
    let dig = c.ask("client", &["+tcp", "server", "A"])?;
    expect_local(&dig, "A", &[VIP], "server over TCP");
    // The pod's resolver path: the search list (ndots:5) asks the full name first.
    let dig = c.ask("client", &["+search", "server"])?;
    expect_local(&dig, "A", &[VIP], "server with the search list");
    assert_eq!(dig.answers[0].name, SERVICE, "{dig}");
    // A search domain appended to a full name is stripped: CNAME, then the address.
    let doubled = "server.demo.svc.cluster.local.demo.svc.cluster.local.";
    let dig = c.ask("client", &[doubled, "A"])?;
    assert_eq!(dig.status, "NOERROR", "{dig}");
    let first = dig.answers.first().context("no answers")?;
    assert_eq!(
        (
            first.name.as_str(),
            first.rtype.as_str(),
            first.data.as_str()
        ),
        (doubled, "CNAME", SERVICE),
        "{dig}"
    );
    let a: Vec<&Rr> = dig.answers.iter().filter(|r| r.rtype == "A").collect();
    assert!(
        a.len() == 1 && a[0].name == SERVICE && a[0].data == VIP,
        "{dig}"
    );

    // Address families: a v4-only Service has no AAAA (empty NOERROR), a dual one has.
    let dig = c.ask("client", &["server", "AAAA"])?;
    expect_local(&dig, "AAAA", &[], "AAAA of a v4-only Service");
    let dig = c.ask("client", &["dual", "AAAA"])?;
    expect_local(&dig, "AAAA", &[DUAL_VIP6], "AAAA of a dual-stack Service");
    let dig = c.ask("client", &["dual", "A"])?;
    expect_local(&dig, "A", &[DUAL_VIP4], "A of a dual-stack Service");
    // A headless Service: one address per endpoint.
    let dig = c.ask("client", &["db.demo.svc.cluster.local", "A"])?;
    expect_local(&dig, "A", &DB_IPS, "headless Service");
    assert!(
        !upstream_saw(&c.upstream.log(), SERVICE, None),
        "ztunnel forwarded a Service name it knows:\n{}",
        c.upstream.log()
    );

    // Everything else is the upstream's, asked from the pod's own namespace.
    let dig = c.ask("client", &["external.test", "A"])?;
    assert_eq!(dig.status, "NOERROR", "{dig}");
    assert_eq!(dig.data("A"), [EXTERNAL_IP.to_string()], "{dig}");
    let dig = c.ask("client", &["nope.demo.svc.cluster.local", "A"])?;
    assert_eq!(dig.status, "NXDOMAIN", "the upstream's code passes: {dig}");
    let log = c.upstream.log();
    for name in ["external.test.", "nope.demo.svc.cluster.local."] {
        assert!(
            upstream_saw(&log, name, Some(&client_ip)),
            "the upstream saw no query for {name} from the pod's address {client_ip}:\n{log}"
        );
    }

    // Too big for UDP without EDNS: truncated; over TCP: whole.
    let dig = c.ask("client", &["+ignore", "+noedns", BIG_NAME, "A"])?;
    assert!(dig.has_flag("tc"), "{dig}");
    let dig = c.ask("client", &["+tcp", BIG_NAME, "A"])?;
    assert_eq!(dig.status, "NOERROR", "{dig}");
    assert!(!dig.has_flag("tc"), "{dig}");
    assert_eq!(dig.data("A").len(), BIG_RECORDS, "{dig}");
    Ok(())
}

#[test]
fn the_pods_own_resolver_finds_a_service_by_short_name_and_connects_to_it() -> Result<()> {
    if !test_support::can_run_root_tests() {
        return Ok(());
    }
    let c = DnsCluster::new("dr", &[("client", Start::DnsCapture)])?;
    let client = c.pod("client");
    // glibc with the pod's resolv.conf (search list, ndots:5), as any app.
    let out = client.ns.stdout(&["getent", "hosts", "server"])?;
    assert_eq!(
        out.split_whitespace().next(),
        Some(VIP),
        "getent hosts server: {out:?}\n{}",
        c.diagnostics()
    );
    // Connect by name: resolved through ztunnel, the VIP is captured and sent over HBONE.
    let answer =
        mesh::send_from(&client.ns, "server:9000", 4096).with_context(|| c.diagnostics())?;
    assert_eq!(answer["bytes"], 4096, "{answer}");
    assert_eq!(answer["connected"], format!("{VIP}:9000"), "{answer}");
    let peer = answer["peer"].as_str().unwrap_or_default();
    assert!(
        peer.starts_with(&format!("{}:", client.ip)),
        "the server saw {peer}"
    );
    let metrics = c.metrics()?;
    assert!(
        metric_sum(&metrics, "istio_dns_requests_total", &[]) >= 1.0,
        "{metrics}"
    );
    assert!(
        !upstream_saw(&c.upstream.log(), SERVICE, None),
        "ztunnel forwarded a Service name it knows:\n{}",
        c.upstream.log()
    );
    Ok(())
}

#[test]
fn without_dns_capture_the_pods_queries_go_straight_to_the_upstream() -> Result<()> {
    if !test_support::can_run_root_tests() {
        return Ok(());
    }
    let c = DnsCluster::new("dx", &[("nocap", Start::NoDnsCapture)])?;
    let dig = c.ask("nocap", &[SERVICE, "A"])?;
    assert_eq!(dig.status, "NXDOMAIN", "the upstream answered: {dig}");
    let dig = c.ask("nocap", &["external.test", "A"])?;
    assert_eq!(dig.data("A"), [EXTERNAL_IP.to_string()], "{dig}");
    let nocap_ip = &c.pod("nocap").ip;
    let log = c.upstream.log();
    assert!(
        upstream_saw(&log, SERVICE, Some(nocap_ip)),
        "the upstream saw no query for {SERVICE} from {nocap_ip}:\n{log}"
    );
    let metrics = c.metrics()?;
    assert_eq!(
        metric_sum(&metrics, "istio_dns_requests_total", &[]),
        0.0,
        "ztunnel saw queries of a pod without DNS capture:\n{metrics}"
    );
    // ztunnel's proxy is in the pod all the same, and knows the name when asked.
    let dig = c.dig("nocap", &["@127.0.0.1", "-p", "15053", SERVICE, "A"])?;
    expect_local(&dig, "A", &[VIP], "asked on 15053 directly");
    Ok(())
}

#[test]
fn a_pod_deleted_with_queries_in_flight_loses_its_dns_server_and_ztunnel_stays_healthy(
) -> Result<()> {
    if !test_support::can_run_root_tests() {
        return Ok(());
    }
    let c = DnsCluster::new(
        "dd",
        &[("client", Start::DnsCapture), ("other", Start::DnsCapture)],
    )?;
    let upstream = c.upstream_addr();
    // Sockets made in the pod, used from plain threads: UDP queries (Service and
    // forwarded names) and one TCP connection, both captured to ztunnel.
    let (udp, tcp) = c
        .pod("client")
        .ns
        .run_inside(|| -> Result<(UdpSocket, TcpStream)> {
            let udp = UdpSocket::bind("0.0.0.0:0")?;
            let tcp = TcpStream::connect_timeout(&upstream, Duration::from_secs(3))?;
            Ok((udp, tcp))
        })??;
    let stop = Arc::new(AtomicBool::new(false));
    let (udp_answers, tcp_answers) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let udp_loop = {
        let (stop, answers) = (stop.clone(), udp_answers.clone());
        std::thread::spawn(move || {
            let names = [SERVICE, "external.test."];
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let name = names[i % names.len()];
                i += 1;
                if ask_udp(
                    &udp,
                    upstream,
                    name,
                    RecordType::A,
                    Duration::from_millis(300),
                )
                .is_ok()
                {
                    answers.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };
    let (closed_tx, closed_rx) = std::sync::mpsc::channel();
    {
        let (stop, answers) = (stop.clone(), tcp_answers.clone());
        std::thread::spawn(move || {
            let end = tcp_queries(tcp, &stop, &answers);
            let _ = closed_tx.send(end);
        });
    }
    wait_for(
        "queries answered from the pod",
        Duration::from_secs(10),
        || {
            (udp_answers.load(Ordering::Relaxed) >= 10 && tcp_answers.load(Ordering::Relaxed) >= 10)
                .then_some(())
        },
    )
    .with_context(|| c.diagnostics())?;

    c.agent.del("uid-client")?;
    wait_for(
        "ztunnel's DNS sockets to leave the deleted pod",
        Duration::from_secs(3),
        || (dns_sockets(c.pod("client")).ok()? == (false, false)).then_some(()),
    )
    .with_context(|| {
        format!(
            "{:?}\n{}",
            c.pod("client").ns.stdout(&["ss", "-Hluan"]),
            c.diagnostics()
        )
    })?;
    // The held TCP connection is closed once the pod's drain deadline (1 s) passes.
    let end = closed_rx.recv_timeout(Duration::from_secs(5));
    stop.store(true, Ordering::Relaxed);
    let _ = udp_loop.join();
    let end = end.context("the TCP DNS connection of the deleted pod is still open after 5 s")?;
    eprintln!("the TCP DNS connection ended: {end}");

    // ztunnel is unharmed: ready, and serving the other pod.
    mesh::http_get(&c.node.ns, "http://127.0.0.1:15021/healthz/ready")
        .with_context(|| c.diagnostics())?;
    let dig = c.ask("other", &["server", "A"])?;
    expect_local(&dig, "A", &[VIP], "the other pod after the delete");
    Ok(())
}

/// Framed queries on `stream` until it ends (EOF or error: returned) or `stop`.
fn tcp_queries(mut stream: TcpStream, stop: &AtomicBool, answers: &AtomicUsize) -> String {
    if let Err(e) = stream.set_read_timeout(Some(Duration::from_secs(1))) {
        return format!("set_read_timeout: {e}");
    }
    let mut id = 0u16;
    while !stop.load(Ordering::Relaxed) {
        id = id.wrapping_add(1);
        let Ok(query) = query_bytes(id, SERVICE, RecordType::A, None) else {
            return "could not build a query".into();
        };
        let mut framed = (query.len() as u16).to_be_bytes().to_vec();
        framed.extend_from_slice(&query);
        if let Err(e) = stream.write_all(&framed) {
            return format!("write: {e}");
        }
        let mut len = [0u8; 2];
        match stream.read_exact(&mut len) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return "EOF".into(),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return format!("read: {e}"),
        }
        let mut answer = vec![0u8; u16::from_be_bytes(len).into()];
        if let Err(e) = stream.read_exact(&mut answer) {
            return format!("read: {e}");
        }
        answers.fetch_add(1, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(5));
    }
    "stopped".into()
}

/// The pod's conntrack entries (`/proc/net/nf_conntrack` inside it) for UDP port 53
/// with `port` on either side.
fn dns_conntrack(pod: &Pod, port: u16) -> Result<Vec<String>> {
    let table = pod.ns.stdout(&["cat", "/proc/net/nf_conntrack"])?;
    Ok(table
        .lines()
        .filter(|l| l.contains(" udp ") && l.contains("port=53 "))
        .filter(|l| l.contains(&format!("port={port} ")))
        .map(str::to_owned)
        .collect())
}

/// The raw-table rules put ztunnel's own upstream queries in conntrack zone 1: an app
/// flow captured to the proxy (DNAT to 127.0.0.1:15053) that is still in conntrack must
/// not capture ztunnel's query when ztunnel's ephemeral port is the app's old one
/// (istio/istio#33469): without the zone, ztunnel's query would be sent to itself.
#[test]
fn ztunnels_upstream_queries_live_in_their_own_conntrack_zone() -> Result<()> {
    if !test_support::can_run_root_tests() {
        return Ok(());
    }
    let c = DnsCluster::new("dz", &[("client", Start::DnsCapture)])?;
    let client = c.pod("client");
    let upstream = c.upstream_addr();
    // The app asks from port 40053 (captured, answered locally), then closes its
    // socket; the captured flow stays in conntrack.
    let app = client
        .ns
        .run_inside(|| UdpSocket::bind("0.0.0.0:40053"))?
        .context("binding UDP 40053 in the pod")?;
    let answer = ask_udp(
        &app,
        upstream,
        SERVICE,
        RecordType::A,
        Duration::from_secs(3),
    )?;
    assert_eq!(addresses(&answer), [VIP.parse::<IpAddr>()?], "{answer:?}");
    drop(app);
    let captured = dns_conntrack(client, 40053)?;
    assert!(
        captured.iter().any(|l| l.contains("sport=15053 ")),
        "no captured (DNAT to 15053) conntrack entry for port 40053: {captured:#?}"
    );
    // Now 40053 is the only ephemeral port in the pod: ztunnel's next upstream socket
    // gets it, and its query has the app's old 4-tuple.
    client
        .ns
        .exec(&["sysctl", "-qw", "net.ipv4.ip_local_port_range=40053 40053"])?;
    let app = client
        .ns
        .run_inside(|| UdpSocket::bind("0.0.0.0:40100"))?
        .context("binding UDP 40100 in the pod")?;
    let answer = ask_udp(
        &app,
        upstream,
        "external.test.",
        RecordType::A,
        Duration::from_secs(8),
    )
    .with_context(|| c.diagnostics())?;
    let conntrack = dns_conntrack(client, 40053)?;
    assert_eq!(
        addresses(&answer),
        [IpAddr::V4(EXTERNAL_IP)],
        "forwarded from port 40053: {answer:?}\npod conntrack: {conntrack:#?}\n{}",
        c.diagnostics()
    );
    let pod_ip = &client.ip;
    assert!(
        c.upstream
            .log()
            .contains(&format!("from {pod_ip}:40053: external.test. ")),
        "ztunnel's upstream query did not leave from {pod_ip}:40053, the test proves nothing:\n{}",
        c.upstream.log()
    );
    assert!(
        conntrack
            .iter()
            .any(|l| l.contains("zone=1") && l.contains("src=10.53.0.2 ")),
        "ztunnel's upstream flow is not in conntrack zone 1: {conntrack:#?}"
    );
    Ok(())
}

/// DNS capture turned on for a pod already in the mesh without it (the annotation
/// changed, or an upgrade turned the default on): the pod's netns already tracks
/// connections (its TCP capture rules need conntrack), so an app's DNS flow to the
/// upstream is in conntrack with no NAT. After the agent converges the pod's rules, the
/// same 4-tuple must reach ztunnel, not ride the old entry past the new redirect.
///
/// (A pod's first enrollment cannot hit this: a netns without rules that need
/// conntrack tracks nothing, so its first captured packet is always a new flow.)
#[test]
fn turning_dns_capture_on_captures_the_pods_existing_dns_flows() -> Result<()> {
    if !test_support::can_run_root_tests() {
        return Ok(());
    }
    let c = DnsCluster::new("de", &[("client", Start::NoDnsCapture)])?;
    let client = c.pod("client");
    let upstream = c.upstream_addr();
    // One socket with a fixed source port: both queries share a 4-tuple.
    let socket = client
        .ns
        .run_inside(|| UdpSocket::bind("0.0.0.0:40053"))?
        .context("binding UDP 40053 in the pod")?;
    let before = ask_udp(
        &socket,
        upstream,
        SERVICE,
        RecordType::A,
        Duration::from_secs(3),
    )?;
    assert_eq!(
        before.response_code(),
        ResponseCode::NXDomain,
        "without DNS capture, the upstream answers: {before:?}"
    );
    let tracked = dns_conntrack(client, 40053)?;
    assert!(
        tracked.iter().any(|l| l.contains("src=10.53.0.2 ")),
        "the uncaptured query is not in the pod's conntrack, the test proves nothing: {tracked:#?}"
    );
    let requests = |m: &str| metric_sum(m, "istio_dns_requests_total", &[]);
    let requests_before = requests(&c.metrics()?);

    // The node agent's own converge, as on an annotation change or an upgrade.
    let rules = InpodRules {
        dns_capture: true,
        ..Default::default()
    };
    client
        .ns
        .run_inside(|| redirection::enable_inpod(Mode::Iptables(Backend::detect()), &rules))??;
    let after = ask_udp(
        &socket,
        upstream,
        SERVICE,
        RecordType::A,
        Duration::from_secs(3),
    )?;
    assert_eq!(
        addresses(&after),
        [VIP.parse::<IpAddr>()?],
        "the same 4-tuple after DNS capture was turned on must reach ztunnel, got {:?}\npod conntrack: {:#?}\n{}",
        after.response_code(),
        dns_conntrack(client, 40053)?,
        c.diagnostics()
    );
    let requests_after = requests(&c.metrics()?);
    assert!(
        requests_after > requests_before,
        "istio_dns_requests_total {requests_before} -> {requests_after}"
    );
    Ok(())
}

/// Sends `request` to `proxy` and returns the first reply carrying `id`, if any
/// arrives within `timeout`.
fn reply_to(
    socket: &UdpSocket,
    proxy: SocketAddr,
    request: &[u8],
    id: u16,
    timeout: Duration,
) -> Result<Option<Message>> {
    socket.send_to(request, proxy)?;
    let deadline = Instant::now() + timeout;
    let mut buf = vec![0u8; 65535];
    while let Some(left) = deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
    {
        socket.set_read_timeout(Some(left))?;
        let Ok(n) = socket.recv(&mut buf) else {
            continue;
        };
        if let Ok(reply) = Message::from_vec(&buf[..n]) {
            if reply.id() == id {
                return Ok(Some(reply));
            }
        }
    }
    Ok(None)
}

/// Datagrams hickory (the parser ztunnel uses) cannot parse, in three kinds.
struct Garbage {
    /// Shorter than a header: nothing to answer.
    short: Vec<Vec<u8>>,
    /// A response's header (QR = 1) on garbage: never answered (no reflection loops).
    responses: Vec<Vec<u8>>,
    /// A query's header on garbage: dropped, or FORMERR under its id.
    queries: Vec<Vec<u8>>,
}

/// Ids of the garbage responses; no garbage query uses them.
const RESPONSE_IDS: std::ops::Range<u16> = 0xee00..0xef00;

fn unparseable_datagrams() -> Result<Garbage> {
    use rand::{Rng, SeedableRng};
    let short = vec![vec![], vec![0], vec![1, 2, 3], vec![0xff; 11]];
    let mut queries = Vec::new();
    // Every prefix of a real query that still holds its header.
    let query = query_bytes(0x0101, SERVICE, RecordType::A, None)?;
    for len in 12..query.len() {
        queries.push(query[..len].to_vec());
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(15053);
    let mut random = |qr: bool, id: Option<u16>| -> Vec<u8> {
        loop {
            let mut bytes = vec![0u8; rng.random_range(12..700)];
            rng.fill(&mut bytes[..]);
            if qr {
                bytes[2] |= 0x80;
            } else {
                bytes[2] &= 0x7f;
            }
            if let Some(id) = id {
                bytes[..2].copy_from_slice(&id.to_be_bytes());
            }
            let id = u16::from_be_bytes([bytes[0], bytes[1]]);
            let id_ok = qr || !RESPONSE_IDS.contains(&id);
            if id_ok && Message::from_vec(&bytes).is_err() {
                return bytes;
            }
        }
    };
    while queries.len() < 300 {
        queries.push(random(false, None));
    }
    let responses = RESPONSE_IDS
        .take(100)
        .map(|id| random(true, Some(id)))
        .collect();
    Ok(Garbage {
        short,
        responses,
        queries,
    })
}

/// A one-question message with `op_code`.
fn message_with_opcode(id: u16, op_code: OpCode) -> Result<Vec<u8>> {
    let mut message = Message::new();
    message
        .set_id(id)
        .set_message_type(MessageType::Query)
        .set_op_code(op_code)
        .add_query(Query::query(Name::from_ascii(SERVICE)?, RecordType::A));
    Ok(message.to_vec()?)
}

#[test]
fn garbage_on_the_dns_port_is_dropped_or_refused_and_ztunnel_keeps_answering() -> Result<()> {
    if !test_support::can_run_root_tests() {
        return Ok(());
    }
    let c = DnsCluster::new("dg", &[("client", Start::DnsCapture)])?;
    let proxy: SocketAddr = PROXY_ADDR.parse()?;
    let garbage = unparseable_datagrams()?;
    let query_ids: std::collections::HashSet<u16> = garbage
        .queries
        .iter()
        .map(|q| u16::from_be_bytes([q[0], q[1]]))
        .collect();
    let vip: IpAddr = VIP.parse()?;
    let result = c.pod("client").ns.run_inside(|| -> Result<()> {
        let socket = UdpSocket::bind("127.0.0.1:0")?;
        let all: Vec<&Vec<u8>> = garbage
            .short
            .iter()
            .chain(&garbage.responses)
            .chain(&garbage.queries)
            .collect();
        // Paced, so the socket's receive buffer (not ztunnel) never drops any.
        for batch in all.chunks(16) {
            for datagram in batch {
                socket.send_to(datagram, proxy)?;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        // A real query after the garbage is answered. It is sent again every 250 ms
        // until answered (UDP may drop it).
        let id = (0..=u16::MAX)
            .find(|i| !query_ids.contains(i) && !RESPONSE_IDS.contains(i))
            .context("no free id")?;
        let query = query_bytes(id, SERVICE, RecordType::A, None)?;
        let mut replies = Vec::new();
        let mut answered = None;
        let mut buf = vec![0u8; 65535];
        let mut resend = Instant::now();
        // Until the answer, then 300 ms more for late replies to the garbage.
        let mut until = Instant::now() + Duration::from_secs(3);
        while let Some(left) = until
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
        {
            if answered.is_none() && Instant::now() >= resend {
                socket.send_to(&query, proxy)?;
                resend = Instant::now() + Duration::from_millis(250);
            }
            let wait = if answered.is_none() {
                left.min(resend.saturating_duration_since(Instant::now()))
            } else {
                left
            };
            socket.set_read_timeout(Some(wait.max(Duration::from_millis(1))))?;
            let Ok(n) = socket.recv(&mut buf) else {
                continue;
            };
            match Message::from_vec(&buf[..n]) {
                Ok(m) if m.id() == id => {
                    if answered.is_none() {
                        answered = Some(m);
                        until = Instant::now() + Duration::from_millis(300);
                    }
                }
                reply => replies.push((buf[..n].to_vec(), reply.ok())),
            }
        }
        let answered = answered.context("no answer to a valid query sent after the garbage")?;
        ensure!(
            addresses(&answered) == [vip],
            "after the garbage: {answered:?}"
        );
        // What answers the garbage got: at most a FORMERR to a garbage query's id.
        for (bytes, reply) in &replies {
            let ok = reply.as_ref().is_some_and(|m| {
                m.message_type() == MessageType::Response
                    && m.response_code() == ResponseCode::FormErr
                    && m.answers().is_empty()
                    && query_ids.contains(&m.id())
            });
            ensure!(
                ok,
                "unparseable garbage got an answer other than FORMERR to a query's id \
                 (short datagrams and responses must get none): {bytes:02x?}"
            );
        }
        ensure!(
            replies.len() <= garbage.queries.len(),
            "{} replies to {} garbage queries",
            replies.len(),
            garbage.queries.len()
        );
        eprintln!(
            "{} of {} unparseable queries were answered FORMERR, the rest dropped",
            replies.len(),
            garbage.queries.len()
        );

        // Parseable but wrong: no question is FORMERR, other opcodes NOTIMP.
        let no_question = [0x12, 0x34, 0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        let reply = reply_to(&socket, proxy, &no_question, 0x1234, Duration::from_secs(2))?;
        ensure!(
            reply.as_ref().map(Message::response_code) == Some(ResponseCode::FormErr),
            "a query without a question: {reply:?}"
        );
        for (id, op_code) in [(0x2001, OpCode::Status), (0x2002, OpCode::Notify)] {
            let request = message_with_opcode(id, op_code)?;
            let reply = reply_to(&socket, proxy, &request, id, Duration::from_secs(2))?;
            ensure!(
                reply.as_ref().map(Message::response_code) == Some(ResponseCode::NotImp),
                "opcode {op_code:?}: {reply:?}"
            );
        }

        // TCP: a length it never sends, a short garbage frame, a silent connection.
        let mut huge = TcpStream::connect(proxy)?;
        huge.write_all(&[0xff, 0xff, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10])?;
        let mut short = TcpStream::connect(proxy)?;
        short.write_all(&[0, 5, 1, 2, 3, 4, 5])?;
        let silent = TcpStream::connect(proxy)?;
        drop((huge, short, silent));
        // Then a framed query on a fresh connection is answered.
        let mut stream = TcpStream::connect(proxy)?;
        stream.set_read_timeout(Some(Duration::from_secs(3)))?;
        let query = query_bytes(0x3003, SERVICE, RecordType::A, None)?;
        stream.write_all(&(query.len() as u16).to_be_bytes())?;
        stream.write_all(&query)?;
        let mut len = [0u8; 2];
        stream
            .read_exact(&mut len)
            .context("no TCP answer after the garbage")?;
        let mut answer = vec![0u8; u16::from_be_bytes(len).into()];
        stream.read_exact(&mut answer)?;
        let answer = Message::from_vec(&answer)?;
        ensure!(
            answer.id() == 0x3003 && addresses(&answer) == [vip],
            "TCP after the garbage: {answer:?}"
        );
        Ok(())
    })?;
    result.with_context(|| c.diagnostics())?;
    mesh::http_get(&c.node.ns, "http://127.0.0.1:15021/healthz/ready")
        .with_context(|| c.diagnostics())?;
    let dig = c.ask("client", &["server", "A"])?;
    expect_local(&dig, "A", &[VIP], "through capture after the garbage");
    Ok(())
}

#[test]
fn dns_metrics_count_queries_by_protocol_and_upstream_forwards() -> Result<()> {
    if !test_support::can_run_root_tests() {
        return Ok(());
    }
    let c = DnsCluster::new("dm", &[("client", Start::DnsCapture)])?;
    for _ in 0..3 {
        expect_local(&c.ask("client", &[SERVICE, "A"])?, "A", &[VIP], "udp");
    }
    for _ in 0..2 {
        expect_local(
            &c.ask("client", &["+tcp", "server", "A"])?,
            "A",
            &[VIP],
            "tcp",
        );
    }
    let dig = c.ask("client", &["external.test", "A"])?;
    assert_eq!(dig.data("A"), [EXTERNAL_IP.to_string()], "{dig}");
    let dig = c.ask("client", &["+tcp", "external.test", "A"])?;
    assert_eq!(dig.data("A"), [EXTERNAL_IP.to_string()], "{dig}");

    let m = c.metrics()?;
    let sum = |name: &str, labels: &[(&str, &str)]| metric_sum(&m, name, labels);
    assert_eq!(
        sum("istio_dns_requests_total", &[("request_protocol", "udp")]),
        4.0,
        "{m}"
    );
    assert_eq!(
        sum("istio_dns_requests_total", &[("request_protocol", "tcp")]),
        3.0,
        "{m}"
    );
    assert_eq!(
        sum("istio_dns_requests_total", &[("request_query_type", "A")]),
        7.0,
        "{m}"
    );
    // Only the two external.test queries went upstream.
    assert_eq!(sum("istio_dns_upstream_requests_total", &[]), 2.0, "{m}");
    assert!(
        sum(
            "istio_dns_upstream_requests_total",
            &[("request_protocol", "udp")]
        ) >= 1.0,
        "{m}"
    );
    assert_eq!(
        sum("istio_dns_upstream_request_duration_seconds_count", &[]),
        2.0,
        "{m}"
    );
    assert_eq!(sum("istio_dns_upstream_failures_total", &[]), 0.0, "{m}");
    Ok(())
}

#[test]
fn an_unreachable_upstream_gives_servfail_and_counts_a_failure() -> Result<()> {
    if !test_support::can_run_root_tests() {
        return Ok(());
    }
    let mut c = DnsCluster::new("df", &[("client", Start::DnsCapture)])?;
    c.upstream.app.kill();
    // ztunnel's own upstream timeout decides how long this takes; dig waits longer.
    let dig = c.dig(
        "client",
        &[&format!("@{UPSTREAM_IP}"), "+time=15", "external.test", "A"],
    )?;
    assert_eq!(dig.status, "SERVFAIL", "{dig}");
    // Service names need no upstream.
    expect_local(
        &c.ask("client", &["server", "A"])?,
        "A",
        &[VIP],
        "no upstream",
    );
    let m = c.metrics()?;
    assert!(
        metric_sum(&m, "istio_dns_upstream_failures_total", &[]) >= 1.0,
        "{m}"
    );
    Ok(())
}

#[test]
fn with_the_proxy_off_no_pod_gets_a_dns_server() -> Result<()> {
    if !test_support::can_run_root_tests() {
        return Ok(());
    }
    let c = DnsCluster::with_env(
        "do",
        &[("client", Start::DnsCapture)],
        &[("ISTIO_META_DNS_CAPTURE", "false")],
    )?;
    let client = c.pod("client");
    // The pod is served (its outbound listener is up), without a DNS server.
    wait_for(
        "the pod's outbound listener",
        Duration::from_secs(5),
        || {
            local_ports(&client.ns.stdout(&["ss", "-Hltn"]).ok()?)
                .contains(&15001)
                .then_some(())
        },
    )?;
    assert_eq!(
        dns_sockets(client)?,
        (false, false),
        "{:?}",
        client.ns.stdout(&["ss", "-Hluan"])
    );
    Ok(())
}

/// Dedicated mode (a VM): the proxy runs in ztunnel's own namespace, on the address
/// `ISTIO_META_DNS_PROXY_ADDR` gives, expands short names from `PROXY_WORKLOAD_INFO`'s
/// namespace, and with `IPV6_ENABLED=false` answers AAAA with no address.
#[test]
fn a_dedicated_ztunnel_serves_dns_on_its_configured_address() -> Result<()> {
    if !test_support::can_run_root_tests() {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    mesh::ca_init(&dir.path().join("ca"))?;
    let vm = test_support::netns::Netns::new("dvvm")?;
    let upstream = Upstream::start(&vm, "dv", true)?;
    vm.set_resolv_conf(&format!("nameserver {UPSTREAM_IP}\n"))?;
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "workloads:\n- uid: uid-vm\n  name: vm\n  namespace: vms\n  serviceAccount: vm\n  workloadIps: [\"10.53.0.1\"]\n  protocol: HBONE\n  node: vm\nservices:\n{}{}",
            service("server", &[VIP], 9000).replace(NAMESPACE, "vms"),
            service("dual", &[DUAL_VIP4, DUAL_VIP6], 9000).replace(NAMESPACE, "vms"),
        ),
    )?;
    let ztunnel = mesh::start_dedicated_ztunnel_with(
        &vm,
        "vms/vm/vm",
        &dir.path().join("ca"),
        &config,
        &[
            ("ISTIO_META_DNS_PROXY_ADDR", "127.0.0.1:15054"),
            ("IPV6_ENABLED", "false"),
        ],
    )?;
    let dig = |args: &[&str]| -> Result<Dig> {
        let mut argv = vec![
            "dig",
            "@127.0.0.1",
            "-p",
            "15054",
            "+tries=1",
            "+time=3",
            "+noall",
            "+comments",
            "+answer",
        ];
        argv.extend_from_slice(args);
        let out = vm
            .stdout(&argv)
            .with_context(|| format!("{argv:?}\n{}", ztunnel.log()))?;
        Dig::parse(&out)
    };
    for name in ["server", "server.vms", "server.vms.svc.cluster.local"] {
        expect_local(&dig(&[name, "A"])?, "A", &[VIP], name);
    }
    expect_local(&dig(&["+tcp", "server", "A"])?, "A", &[VIP], "over TCP");
    expect_local(&dig(&["dual", "A"])?, "A", &[DUAL_VIP4], "dual A");
    expect_local(&dig(&["dual", "AAAA"])?, "AAAA", &[], "AAAA, IPv6 off");
    let d = dig(&["external.test", "A"])?;
    assert_eq!(d.data("A"), [EXTERNAL_IP.to_string()], "{d}");
    assert!(
        upstream_saw(&upstream.log(), "external.test.", Some("10.53.0.1")),
        "forwarded from the VM's own address:\n{}",
        upstream.log()
    );
    let udp = vm.stdout(&["ss", "-Hluan"])?;
    let ports = local_ports(&udp);
    assert!(
        ports.contains(&15054) && !ports.contains(&15053),
        "the proxy's UDP socket should be on 15054 only:\n{udp}"
    );
    assert!(
        local_ports(&vm.stdout(&["ss", "-Hltn"])?).contains(&15054),
        "no TCP listener on 15054"
    );
    drop(ztunnel);
    drop(upstream);
    Ok(())
}
