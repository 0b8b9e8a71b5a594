//! In-pod (shared) mode: one ztunnel per node namespace, driven over ZDS by a test
//! double of the node agent, serving pods from inside their own namespaces.

use std::time::Duration;

use anyhow::{Context, Result};
use local_cluster::mesh::{self, metric_sum, ztunnel_metrics};
use local_cluster::zds_agent::FakeAgent;
use redirection::rules::InpodRules;
use shared_types::zds::WorkloadInfo;
use test_support::poll::wait_for;
use test_support::process::ChildGuard;
use test_support::topology::{connect_nodes, Node, Pod};

const CLIENT: &str = "spiffe://cluster.local/ns/demo/sa/client";
const SERVER: &str = "spiffe://cluster.local/ns/demo/sa/server";

/// Two nodes; pods `client` and `local-server` on node 1, `server` on node 2.
/// Dual-stack, node 2 also has `only6` (IPv6 only) and `no-ipv6` (IPv6 disabled in
/// its namespace), both serving as `server`.
struct Cluster {
    apps: Vec<ChildGuard>,
    ztunnels: Vec<Option<ChildGuard>>,
    agents: Vec<FakeAgent>,
    client: Pod,
    local_server: Pod,
    server: Pod,
    only6: Option<Pod>,
    no_ipv6: Option<Pod>,
    nodes: Vec<Node>,
    dir: tempfile::TempDir,
}

fn workload(pod: &Pod, sa: &str, node: &str) -> String {
    let ips: Vec<String> = std::iter::once(&pod.ip)
        .chain(&pod.ip6)
        .map(|ip| format!("\"{ip}\""))
        .collect();
    format!(
        "- uid: uid-{name}\n  name: {name}\n  namespace: demo\n  serviceAccount: {sa}\n  workloadIps: [{ips}]\n  protocol: HBONE\n  node: {node}\n",
        name = pod.name,
        ips = ips.join(", ")
    )
}

/// Denies the client's IPv6 prefix to the servers' echo port (9001) only.
const DENY_CLIENT_IPV6_TO_ECHO: &str = "\
policies:
- name: deny-client-ipv6-echo
  namespace: demo
  scope: Namespace
  action: Deny
  rules:
  - - - sourceIps: [\"fd00:10:244:1::/64\"]
    - - destinationPorts: [9001]
";

fn info(pod: &Pod, sa: &str) -> WorkloadInfo {
    WorkloadInfo {
        name: pod.name.clone(),
        namespace: "demo".into(),
        service_account: sa.into(),
    }
}

impl Cluster {
    fn new(tag: &str) -> Result<Self> {
        Self::build(tag, false)
    }

    /// Dual-stack nodes and pods: every pod has an IPv4 and an IPv6 address, is
    /// captured for both families (the agent's rule sets), and its apps listen on both.
    fn dual_stack(tag: &str) -> Result<Self> {
        Self::build(tag, true)
    }

    fn build(tag: &str, dual_stack: bool) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        mesh::ca_init(&dir.path().join("ca"))?;
        let node = if dual_stack {
            Node::dual_stack
        } else {
            Node::new
        };
        let nodes = vec![node(tag, 1)?, node(tag, 2)?];
        connect_nodes(&nodes[0], &nodes[1])?;
        let client = nodes[0].add_pod(tag, "client")?;
        let local_server = nodes[0].add_pod(tag, "local-server")?;
        let server = nodes[1].add_pod(tag, "server")?;
        let (only6, no_ipv6) = if dual_stack {
            (
                Some(nodes[1].add_pod_ipv6_only(tag, "only6")?),
                Some(nodes[1].add_pod_without_ipv6(tag, "no-ipv6")?),
            )
        } else {
            (None, None)
        };
        let mut config = format!(
            "workloads:\n{}{}{}",
            workload(&client, "client", "node1"),
            workload(&local_server, "server", "node1"),
            workload(&server, "server", "node2"),
        );
        for pod in only6.iter().chain(&no_ipv6) {
            config.push_str(&workload(pod, "server", "node2"));
        }
        if dual_stack {
            config.push_str(DENY_CLIENT_IPV6_TO_ECHO);
        }
        std::fs::write(dir.path().join("config.yaml"), config)?;
        let mut cluster = Cluster {
            apps: vec![],
            ztunnels: vec![],
            agents: vec![],
            client,
            local_server,
            server,
            only6,
            no_ipv6,
            nodes,
            dir,
        };
        for i in 0..2 {
            let agent = FakeAgent::start(&cluster.dir.path().join(format!("node{}.sock", i + 1)))?;
            cluster.agents.push(agent);
            cluster.ztunnels.push(Some(cluster.start_ztunnel(i)?));
        }
        let both_families = InpodRules {
            ipv6: true,
            ..Default::default()
        };
        let pods = [&cluster.client, &cluster.local_server, &cluster.server];
        for pod in pods.into_iter().chain(&cluster.only6) {
            if dual_stack {
                local_cluster::inpod::capture(pod, &both_families)?;
            } else {
                local_cluster::inpod::capture(pod, &InpodRules::default())?;
            }
        }
        if let Some(pod) = &cluster.no_ipv6 {
            local_cluster::inpod::capture(pod, &InpodRules::default())?; // as the agent does for a pod without an IPv6 address
        }
        cluster.enroll(0, &cluster.client, "client")?;
        cluster.enroll(0, &cluster.local_server, "server")?;
        cluster.enroll(1, &cluster.server, "server")?;
        for pod in cluster.only6.iter().chain(&cluster.no_ipv6) {
            cluster.enroll(1, pod, "server")?;
        }
        // `[::]` takes both families (and the app reports IPv4 peers unmapped).
        let any = if dual_stack { "[::]" } else { "0.0.0.0" };
        let mut apps = Vec::new();
        for pod in [&cluster.local_server, &cluster.server] {
            apps.push((pod, "sink", format!("{any}:9000")));
            apps.push((pod, "echo", format!("{any}:9001")));
        }
        if let (Some(only6), Some(no_ipv6)) = (&cluster.only6, &cluster.no_ipv6) {
            apps.push((only6, "sink", "[::]:9000".into()));
            apps.push((no_ipv6, "sink", "0.0.0.0:9000".into()));
        }
        let app = test_support::built_binary("e2e-app")?;
        let app = app.to_str().context("path")?;
        for (pod, mode, listen) in apps {
            let mut cmd = pod.ns.command(app);
            cmd.args([mode, "--listen", &listen]);
            let guard = ChildGuard::spawn(&format!("{mode}-{}", pod.ns.name()), cmd)?;
            cluster.apps.push(guard);
        }
        let target = format!("{}:9000", cluster.server.ip);
        wait_for("the apps", Duration::from_secs(10), || {
            cluster.send(&target, 1).ok()
        })?;
        Ok(cluster)
    }

    fn start_ztunnel(&self, node: usize) -> Result<ChildGuard> {
        let dir = self.dir.path();
        // The node names the local config gives the pods.
        let node_name = format!("node{}", node + 1);
        mesh::start_shared_ztunnel(
            &self.nodes[node].ns,
            &self.agents[node].socket,
            &dir.join("ca"),
            &dir.join("config.yaml"),
            &[
                ("TERMINATION_GRACE_PERIOD", "1s"),
                ("NODE_NAME", &node_name),
            ],
        )
    }

    fn enroll(&self, node: usize, pod: &Pod, sa: &str) -> Result<()> {
        let (answer, _) =
            self.agents[node].add(&format!("uid-{}", pod.name), info(pod, sa), &pod.ns.path())?;
        answer.map_err(|reason| anyhow::anyhow!("ztunnel refused {}: {reason}", pod.name))
    }

    /// `e2e-app send` from the client pod; returns the sink's JSON answer.
    fn send(&self, target: &str, bytes: u64) -> Result<serde_json::Value> {
        mesh::send_from(&self.client.ns, target, bytes)
    }
}

fn listening_ports(pod_ns: &test_support::netns::Netns) -> Result<String> {
    pod_ns.stdout(&["ss", "-Hltn"])
}

#[test]
fn pods_talk_over_hbone_and_servers_see_the_client_ip() -> Result<()> {
    if !test_support::can_run_root_tests() {
        return Ok(());
    }
    let cluster = Cluster::new("ip1")?;
    const SIZE: u64 = 10 * 1024 * 1024;

    // Across nodes.
    let answer = cluster.send(&format!("{}:9000", cluster.server.ip), SIZE)?;
    let peer = answer["peer"].as_str().unwrap_or_default();
    assert!(
        peer.starts_with(&format!("{}:", cluster.client.ip)),
        "server saw {peer}"
    );
    // On the same node.
    let answer = cluster.send(&format!("{}:9000", cluster.local_server.ip), SIZE)?;
    let peer = answer["peer"].as_str().unwrap_or_default();
    assert!(
        peer.starts_with(&format!("{}:", cluster.client.ip)),
        "server saw {peer}"
    );

    let node1 = ztunnel_metrics(&cluster.nodes[0].ns)?;
    let node2 = ztunnel_metrics(&cluster.nodes[1].ns)?;
    let ids = [
        ("source_principal", CLIENT),
        ("destination_principal", SERVER),
        ("connection_security_policy", "mutual_tls"),
    ];
    let with = |reporter, extra: &[(&'static str, &'static str)]| {
        let mut labels = vec![("reporter", reporter)];
        labels.extend(ids);
        labels.extend_from_slice(extra);
        labels
    };
    // Node 1 reports both connections as source, and the same-node one as destination.
    assert!(
        metric_sum(
            &node1,
            "istio_tcp_received_bytes_total",
            &with("source", &[])
        ) >= 2.0 * SIZE as f64,
        "{node1}"
    );
    assert!(
        metric_sum(
            &node1,
            "istio_tcp_received_bytes_total",
            &with("destination", &[("destination_workload", "local-server")])
        ) >= SIZE as f64,
        "{node1}"
    );
    assert!(
        metric_sum(
            &node2,
            "istio_tcp_received_bytes_total",
            &with("destination", &[("destination_workload", "server")])
        ) >= SIZE as f64,
        "{node2}"
    );

    // Plaintext from outside the mesh (the node itself) is captured into 15006 inside
    // the server pod, and still arrives from its own source address.
    let answer = mesh::send_from(
        &cluster.nodes[1].ns,
        &format!("{}:9000", cluster.server.ip),
        4096,
    )?;
    assert_eq!(answer["bytes"], 4096);
    let plaintext = [
        ("reporter", "destination"),
        ("destination_workload", "server"),
        ("connection_security_policy", "unknown"),
    ];
    let node2 = ztunnel_metrics(&cluster.nodes[1].ns)?;
    assert!(
        metric_sum(&node2, "istio_tcp_received_bytes_total", &plaintext) >= 4096.0,
        "{node2}"
    );

    // istioctl-lite reads node 2's live dump: the pod it serves, as it serves it.
    let dump = mesh::http_get(&cluster.nodes[1].ns, "http://127.0.0.1:15000/config_dump")?;
    let file = cluster.dir.path().join("node2-dump.json");
    std::fs::write(&file, dump)?;
    let state: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&file)?)?;
    let served = &state["workloadState"]["uid-server"];
    assert_eq!(served["state"], "Up", "{served}");
    assert_eq!(served["info"]["name"], "server", "{served}");
    assert_eq!(served["identity"], SERVER, "{served}");
    let out = std::process::Command::new(test_support::built_binary("istioctl-lite")?)
        .args(["ztunnel-config", "workload", "-f"])
        .arg(&file)
        .output()?;
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.lines().any(|l| {
            let cells: Vec<&str> = l.split_whitespace().collect();
            cells.starts_with(&["demo", "server"]) && cells.ends_with(&["None", "HBONE"])
        }),
        "{table}"
    );

    // The pods' listeners live in the pods' namespaces, none in the node's.
    for port in [":15001", ":15006", ":15008", ":15053"] {
        assert!(
            listening_ports(&cluster.server.ns)?.contains(port),
            "server pod lacks {port}"
        );
        assert!(
            !listening_ports(&cluster.nodes[1].ns)?.contains(port),
            "node namespace has {port}"
        );
    }
    // The DNS proxy answers on both loopbacks of the pod (its namespace has ::1).
    let lo6 = cluster
        .server
        .ns
        .stdout(&["ip", "-6", "addr", "show", "dev", "lo"])?;
    assert!(lo6.contains("::1/128"), "{lo6}");
    for (proto, list) in [("tcp", "-Hltn"), ("udp", "-Hlun")] {
        let sockets = cluster.server.ns.stdout(&["ss", list])?;
        assert!(
            sockets.contains("[::1]:15053"),
            "no {proto} [::1]:15053: {sockets}"
        );
    }
    Ok(())
}

/// One echo round trip from the client pod to `target`; whether it came back.
fn echo_once(cluster: &Cluster, target: &str) -> Result<bool> {
    let app = test_support::built_binary("e2e-app")?;
    let app = app.to_str().context("path")?;
    let status = cluster
        .client
        .ns
        .command(app)
        .args(["ping", "--connect", target, "--count", "1"])
        .output()?
        .status;
    Ok(status.success())
}

#[test]
fn dual_stack_pods_talk_over_hbone_on_both_families() -> Result<()> {
    if !test_support::can_run_root_tests() {
        return Ok(());
    }
    let cluster = Cluster::dual_stack("ip6")?;
    const SIZE: u64 = 1024 * 1024;
    let v6 = |pod: &Pod| -> Result<String> {
        Ok(format!(
            "[{}]",
            pod.ip6.as_deref().context("no IPv6 address")?
        ))
    };
    let client6 = v6(&cluster.client)?;

    // Across nodes and on one node, each over both families: the server sees the
    // client's own address of that family.
    for server in [&cluster.server, &cluster.local_server] {
        for (dst, src) in [
            (server.ip.clone(), cluster.client.ip.clone()),
            (v6(server)?, client6.clone()),
        ] {
            let answer = cluster.send(&format!("{dst}:9000"), SIZE)?;
            let peer = answer["peer"].as_str().unwrap_or_default();
            assert!(
                peer.starts_with(&format!("{src}:")),
                "{dst}: server saw {peer}"
            );
        }
    }
    // All four went over mTLS with both identities (IPv6 included: nothing else
    // reaches a captured pod, the rules send it to ztunnel's `[::]`/`[::1]` sockets).
    let mtls = [
        ("source_principal", CLIENT),
        ("destination_principal", SERVER),
        ("connection_security_policy", "mutual_tls"),
    ];
    let sum = |node: usize, reporter| -> Result<f64> {
        let text = ztunnel_metrics(&cluster.nodes[node].ns)?;
        let mut labels = vec![("reporter", reporter)];
        labels.extend(mtls);
        Ok(metric_sum(&text, "istio_tcp_received_bytes_total", &labels))
    };
    assert!(sum(0, "source")? >= 4.0 * SIZE as f64);
    assert!(sum(1, "destination")? >= 2.0 * SIZE as f64);
    let ports = listening_ports(&cluster.server.ns)?;
    for socket in [
        "127.0.0.1:15001",
        "[::1]:15001",
        "0.0.0.0:15008",
        "[::]:15008",
        "0.0.0.0:15006",
        "[::]:15006",
    ] {
        assert!(ports.contains(socket), "server pod lacks {socket}: {ports}");
    }

    // A policy denying the client's IPv6 prefix to port 9001: IPv6 is refused, IPv4
    // to the same port still passes.
    let server6 = v6(&cluster.server)?;
    assert!(echo_once(&cluster, &format!("{}:9001", cluster.server.ip))?);
    assert!(!echo_once(&cluster, &format!("{server6}:9001"))?);
    let node2 = ztunnel_metrics(&cluster.nodes[1].ns)?;
    let denied = [("response_flags", "DENY"), ("source_principal", CLIENT)];
    assert!(
        metric_sum(&node2, "istio_tcp_connections_failed_total", &denied) >= 1.0,
        "{node2}"
    );

    // An IPv6-only pod is reached over IPv6, as any other.
    let only6 = cluster.only6.as_ref().context("no IPv6-only pod")?;
    let answer = cluster.send(&format!("[{}]:9000", only6.ip), SIZE)?;
    let peer = answer["peer"].as_str().unwrap_or_default();
    assert!(
        peer.starts_with(&format!("{client6}:")),
        "server saw {peer}"
    );

    // A pod whose namespace has IPv6 disabled (no `::1`) was enrolled and is served
    // over IPv4: its IPv6 sockets were skipped, the add did not fail.
    let no_ipv6 = cluster.no_ipv6.as_ref().context("no IPv4-only pod")?;
    let ports = listening_ports(&no_ipv6.ns)?;
    assert!(
        ports.contains("127.0.0.1:15001") && !ports.contains("[::1]:15001"),
        "{ports}"
    );
    let answer = cluster.send(&format!("{}:9000", no_ipv6.ip), SIZE)?;
    let peer = answer["peer"].as_str().unwrap_or_default();
    assert!(
        peer.starts_with(&format!("{}:", cluster.client.ip)),
        "server saw {peer}"
    );
    assert!(sum(1, "destination")? >= 4.0 * SIZE as f64);
    Ok(())
}

#[test]
fn a_deleted_pod_is_drained_and_its_listeners_removed() -> Result<()> {
    if !test_support::can_run_root_tests() {
        return Ok(());
    }
    let cluster = Cluster::new("del")?;
    let app = test_support::built_binary("e2e-app")?;
    let mut cmd = cluster.client.ns.command(app.to_str().context("path")?);
    cmd.args([
        "ping",
        "--connect",
        &format!("{}:9001", cluster.server.ip),
        "--count",
        "100000",
        "--interval-ms",
        "10",
    ]);
    let mut pinger = ChildGuard::spawn("del-ping", cmd)?;
    wait_for("the long-lived connection", Duration::from_secs(10), || {
        let node2 = ztunnel_metrics(&cluster.nodes[1].ns).ok()?;
        (metric_sum(
            &node2,
            "istio_tcp_received_bytes_total",
            &[("reporter", "destination")],
        ) > 640.0)
            .then_some(())
    })?;

    assert!(
        certificates(&cluster.nodes[1].ns)?.contains(&SERVER.to_string()),
        "the served pod's leaf is cached"
    );
    cluster.agents[1].del("uid-server")?;
    // No other pod on node 2 has the server identity: its leaf is forgotten at once.
    let left = certificates(&cluster.nodes[1].ns)?;
    assert!(!left.contains(&SERVER.to_string()), "{left:?}");
    let ports = listening_ports(&cluster.server.ns)?;
    for port in [":15001", ":15006", ":15008", ":15053"] {
        assert!(!ports.contains(port), "{port} left behind:\n{ports}");
    }
    // Its connections drain (deadline 1 s in this test), then close; none leak.
    let status = pinger
        .wait_timeout(Duration::from_secs(10))
        .context("the connection was not closed")?;
    assert_eq!(status.code(), Some(3), "{}", pinger.log());
    wait_for("connections to close", Duration::from_secs(5), || {
        let node2 = ztunnel_metrics(&cluster.nodes[1].ns).ok()?;
        let labels = [
            ("reporter", "destination"),
            ("destination_workload", "server"),
        ];
        let opened = metric_sum(&node2, "istio_tcp_connections_opened_total", &labels);
        let closed = metric_sum(&node2, "istio_tcp_connections_closed_total", &labels);
        (opened >= 1.0 && opened == closed).then_some(())
    })?;
    let dump = mesh::http_get(&cluster.nodes[1].ns, "http://127.0.0.1:15000/config_dump")?;
    let dump: serde_json::Value = serde_json::from_str(&dump)?;
    assert_eq!(
        dump["workloadState"].as_object().map(|p| p.len()),
        Some(0),
        "{dump}"
    );
    // Still forgotten once the drained connections are gone.
    assert_eq!(
        dump["certificates"].as_array().map(|c| c.len()),
        Some(0),
        "{dump}"
    );
    Ok(())
}

/// Identities (SPIFFE URIs) of the leaves ztunnel in `node` holds (`/config_dump`).
fn certificates(node: &test_support::netns::Netns) -> Result<Vec<String>> {
    let dump = mesh::http_get(node, "http://127.0.0.1:15000/config_dump")?;
    let dump: serde_json::Value = serde_json::from_str(&dump)?;
    Ok(dump["certificates"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["identity"].as_str().map(str::to_owned))
        .collect())
}

#[test]
fn a_pod_of_another_node_is_refused() -> Result<()> {
    if !test_support::can_run_root_tests() {
        return Ok(());
    }
    let cluster = Cluster::new("nod")?;
    // Node 1's agent hands over the server pod, which discovery places on node 2.
    let (answer, _) = cluster.agents[0].add(
        "uid-server",
        info(&cluster.server, "server"),
        &cluster.server.ns.path(),
    )?;
    let reason = answer.expect_err("refused");
    assert!(
        reason.contains("node2") && reason.contains("NODE_NAME"),
        "{reason}"
    );
    let node1 = ztunnel_metrics(&cluster.nodes[0].ns)?;
    assert!(
        metric_sum(
            &node1,
            "ztunnel_errors_total",
            &[("reason", "zds_pod_on_other_node")]
        ) >= 1.0,
        "{node1}"
    );
    let dump = mesh::http_get(&cluster.nodes[0].ns, "http://127.0.0.1:15000/config_dump")?;
    let dump: serde_json::Value = serde_json::from_str(&dump)?;
    assert_eq!(
        dump["workloadState"].as_object().map(|p| p.len()),
        Some(2),
        "{dump}"
    );
    Ok(())
}

#[test]
fn a_restarted_ztunnel_gets_its_pods_back_from_the_snapshot() -> Result<()> {
    if !test_support::can_run_root_tests() {
        return Ok(());
    }
    let mut cluster = Cluster::new("rst")?;
    for node in 0..2 {
        // Kill (not drain) ztunnel and start a new one: the agent replays its pods.
        if let Some(mut ztunnel) = cluster.ztunnels[node].take() {
            ztunnel.kill();
        }
        cluster.ztunnels[node] = Some(cluster.start_ztunnel(node)?);
    }
    cluster.agents[0].wait_for_hellos(2, Duration::from_secs(10))?;
    let dump = mesh::http_get(&cluster.nodes[0].ns, "http://127.0.0.1:15000/config_dump")?;
    let dump: serde_json::Value = serde_json::from_str(&dump)?;
    assert_eq!(
        dump["workloadState"].as_object().map(|p| p.len()),
        Some(2),
        "{dump}"
    );
    let answer = cluster.send(&format!("{}:9000", cluster.server.ip), 1 << 20)?;
    assert_eq!(answer["bytes"], 1 << 20);
    let node2 = ztunnel_metrics(&cluster.nodes[1].ns)?;
    assert!(
        metric_sum(
            &node2,
            "istio_tcp_received_bytes_total",
            &[("reporter", "destination"), ("source_principal", CLIENT)]
        ) >= (1 << 20) as f64
    );
    Ok(())
}

#[test]
fn malformed_zds_requests_are_nacked_and_ztunnel_keeps_serving() -> Result<()> {
    if !test_support::can_run_root_tests() {
        return Ok(());
    }
    use prost::Message;
    use shared_types::zds::WorkloadRequest;
    let cluster = Cluster::new("bad")?;
    let agent = &cluster.agents[0];
    let null = || -> Option<std::os::fd::OwnedFd> {
        Some(std::fs::File::open("/dev/null").unwrap().into())
    };
    let nack = |answer: Result<(), String>, needle: &str| match answer {
        Err(reason) => assert!(
            reason.contains(needle),
            "nack {reason:?} should mention {needle:?}"
        ),
        Ok(()) => panic!("expected a nack mentioning {needle:?}"),
    };
    nack(
        agent.send_raw(&[0xff, 0xff, 0xff, 0xff], None)?,
        "undecodable",
    );
    nack(agent.send_raw(&[0x0a; 2048], None)?, "truncated");
    let add = WorkloadRequest::add("uid-x", info(&cluster.client, "client")).encode_to_vec();
    nack(agent.send_raw(&add, None)?, "no netns file descriptor");
    nack(agent.send_raw(&add, null())?, "not a namespace");
    nack(
        agent.send_raw(&WorkloadRequest::del("uid-x").encode_to_vec(), null())?,
        "must not carry a file descriptor",
    );
    nack(
        agent.send_raw(&WorkloadRequest::snapshot_sent().encode_to_vec(), None)?,
        "twice",
    );
    // Still serving, and still accepting good requests on the same connection.
    let answer = cluster.send(&format!("{}:9000", cluster.server.ip), 4096)?;
    assert_eq!(answer["bytes"], 4096);
    cluster.enroll(0, &cluster.client, "client")?;
    Ok(())
}
