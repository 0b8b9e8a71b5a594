//! The proof a security reviewer asks for: a capture of every packet on the wire
//! between the two nodes of the local cluster, showing that traffic between enrolled
//! pods is never plaintext, also while pods enroll, the node agents restart, the
//! ztunnels restart and pods are deleted and recreated. Root only; one cluster at a time.
//!
//! The capture is an `AF_PACKET` socket in the control-plane namespace reading every
//! frame that enters the cluster bridge from a node's port (`n11`, `n12`): each packet
//! between nodes once (see `test_support::capture`). The cluster is dual-stack: both pods stream
//! marker-carrying payloads to each other's echo server on new connections every few
//! ms, over IPv4 and over IPv6.
//!
//! A flow is judged when both its ends are pods that every ztunnel already knew as HBONE
//! when its first packet (the SYN) crossed, plus [`MARGIN`]: before that, plaintext is
//! legitimate (the namespace is not enrolled yet, or a peer node's ztunnel has not
//! learned that a new pod speaks HBONE: Istio's enrollment window, which STRICT closes).

use std::net::IpAddr;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use local_cluster::mesh::metric_sum;
use local_cluster::{LocalCluster, MeshInstall, Topology};
use test_support::capture::{self, Capture, Captured, Flow};
use test_support::poll::wait_for;
use test_support::process::ChildGuard;

const T: Duration = Duration::from_secs(30);
const AMBIENT: (&str, &str) = ("istio.io/dataplane-mode", "ambient");
const HBONE_PORT: u16 = 15008;
const ECHO_PORT: u16 = 9001;
/// In every payload the pods send, repeated; it must never be seen on the wire.
const MARKER: &str = "zte-marker:plaintext-between-enrolled-pods;";
/// A connection whose route was chosen just before a ztunnel learned a peer may leave
/// a moment after we saw it learned: flows starting this close to that are not judged.
const MARGIN: Duration = Duration::from_millis(300);
/// Successful exchanges each stream must make in every phase.
const PROGRESS: usize = 50;

/// Clusters are heavy (two cores): one at a time.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// Captures on every node's link to the cluster network (its bridge port, see
/// `ControlPlane::attach`), in the control-plane namespace.
fn capture(c: &LocalCluster) -> Capture {
    c.capture_node_links().expect("starting the capture")
}

/// An echo server for both families (on a single-stack pod `[::]` takes IPv4 alone).
fn echo() -> Vec<String> {
    ["e2e-app", "echo", "--listen", &format!("[::]:{ECHO_PORT}")]
        .map(String::from)
        .to_vec()
}

fn args(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// A stream of marker-carrying connections from pod `from` to `to`'s echo server
/// (`to` is an address of either family).
fn stream(c: &LocalCluster, ns: &str, from: &str, to: &str, interval_ms: u64) -> ChildGuard {
    let target = std::net::SocketAddr::new(to.parse().expect("an IP"), ECHO_PORT).to_string();
    let interval = interval_ms.to_string();
    c.spawn_in_pod(
        ns,
        from,
        &[
            "e2e-app",
            "stream",
            "--connect",
            &target,
            "--marker",
            MARKER,
            "--bytes",
            "2048",
            "--interval-ms",
            &interval,
        ],
    )
    .unwrap()
}

fn all(streams: &[ChildGuard]) -> Vec<&ChildGuard> {
    streams.iter().collect()
}

/// (succeeded, failed) exchanges a stream reported so far.
fn counts(s: &ChildGuard) -> (usize, usize) {
    let log = s.log();
    let ok = log.lines().filter(|l| l.contains("\"ok\":true")).count();
    let failed = log.lines().filter(|l| l.contains("\"ok\":false")).count();
    (ok, failed)
}

/// Waits until every stream made [`PROGRESS`] more successful exchanges; panics if
/// they do not.
fn progress(c: &LocalCluster, streams: &[&ChildGuard], what: &str) {
    if let Err(e) = try_progress(c, streams, what) {
        panic!("{e}");
    }
}

/// [`progress`], returning the failure (with the streams' and nodes' last words).
fn try_progress(c: &LocalCluster, streams: &[&ChildGuard], what: &str) -> Result<(), String> {
    let start: Vec<usize> = streams.iter().map(|s| counts(s).0).collect();
    wait_for(&format!("traffic to flow again {what}"), T, || {
        streams
            .iter()
            .zip(&start)
            .all(|(s, n)| counts(s).0 >= n + PROGRESS)
            .then_some(())
    })
    .map_err(|e| {
        let logs: Vec<String> = streams.iter().map(|s| tail(&s.log(), 3)).collect();
        let nodes: Vec<String> = c.nodes.iter().map(|n| tail(&n.logs(), 15)).collect();
        format!("{e}\nstreams: {logs:?}\n{}", nodes.join("\n"))
    })
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("a pod IP")
}

/// Streams between pods `a` and `b` of namespace `np`, both ways, to every address
/// of the other (one per family).
fn streams_between(c: &LocalCluster, a: &[String], b: &[String]) -> Vec<ChildGuard> {
    let mut streams = Vec::new();
    for (from, to) in [("a", b), ("b", a)] {
        for ip in to {
            streams.push(stream(c, "np", from, ip, 20));
        }
    }
    streams
}

/// Waits until every node's ztunnel knows `ip` as HBONE.
fn wait_seen_everywhere(c: &LocalCluster, ip: &str) {
    for node in 1..=c.nodes.len() as u8 {
        c.wait_ztunnel_sees_hbone(node, ip, T).unwrap();
    }
}

/// When each pod IP was known as HBONE by every ztunnel: `[since, until)`.
#[derive(Default)]
struct Timeline(Vec<(IpAddr, SystemTime, Option<SystemTime>)>);

impl Timeline {
    /// A pod's addresses (every family: one workload) are known from now.
    fn enrolled(&mut self, ips: &[String]) {
        let now = SystemTime::now();
        for ip in ips {
            self.0.push((self::ip(ip), now, None));
        }
    }

    fn gone(&mut self, ips: &[String]) {
        let now = SystemTime::now();
        let ips: Vec<IpAddr> = ips.iter().map(|s| ip(s)).collect();
        for (i, _, until) in &mut self.0 {
            if ips.contains(i) && until.is_none() {
                *until = Some(now);
            }
        }
    }

    fn pod_ips(&self) -> Vec<IpAddr> {
        self.0.iter().map(|(ip, _, _)| *ip).collect()
    }

    /// Whether `ip` was known as HBONE everywhere, with the margin, at `t`.
    fn known_at(&self, ip: IpAddr, t: SystemTime) -> bool {
        self.0.iter().any(|(i, since, until)| {
            *i == ip && *since + MARGIN <= t && until.is_none_or(|u| t < u)
        })
    }

    /// A pod-to-pod flow that started when both ends were known as HBONE.
    fn judged(&self, f: &Flow) -> bool {
        self.known_at(f.client.0, f.start) && self.known_at(f.server.0, f.start)
    }
}

/// What the capture shows about pod-to-pod traffic.
#[derive(Debug, Default)]
struct Verdict {
    violations: Vec<String>,
    pod_flows: usize,
    /// Flows that started while both ends were enrolled and known as HBONE.
    judged: usize,
    /// Pod-to-pod packets captured while both ends were known as HBONE.
    judged_packets: usize,
    hbone_flows: usize,
    /// Of those, over IPv6.
    hbone_flows_v6: usize,
    hbone_bytes: usize,
    /// Plaintext flows before enrollment carrying the marker: proof the capture and
    /// the search work (and that the traffic really is plaintext without the mesh).
    marker_before: usize,
    /// Of those, over IPv6.
    marker_before_v6: usize,
}

fn judge(captured: &Captured, timeline: &Timeline) -> Verdict {
    let pods = timeline.pod_ips();
    let marker = MARKER.as_bytes();
    let mut v = Verdict {
        judged_packets: captured
            .packets
            .iter()
            .filter(|p| timeline.known_at(p.src, p.time) && timeline.known_at(p.dst, p.time))
            .count(),
        ..Verdict::default()
    };
    for f in capture::flows(&captured.packets) {
        if !pods.contains(&f.client.0) || !pods.contains(&f.server.0) {
            continue;
        }
        v.pod_flows += 1;
        let hbone = f.server.1 == HBONE_PORT || f.client.1 == HBONE_PORT;
        let has_payload = !f.to_server.is_empty() || !f.to_client.is_empty();
        let carries_marker =
            capture::contains(&f.to_server, marker) || capture::contains(&f.to_client, marker);
        let name = format!("{:?} -> {:?}", f.client, f.server);
        let judged = timeline.judged(&f);
        v.judged += usize::from(judged);
        if hbone {
            // (c) Every HBONE flow opens with a TLS handshake record, both ways, and
            // (b) never shows the marker, whenever it started.
            v.hbone_flows += 1;
            v.hbone_flows_v6 += usize::from(f.server.0.is_ipv6());
            v.hbone_bytes += f.to_server.len() + f.to_client.len();
            if has_payload && f.first_to_server != Some(0x16) {
                v.violations.push(format!(
                    "{name}: the first byte to 15008 is {:?}, not a TLS handshake (0x16)",
                    f.first_to_server
                ));
            }
            if !f.to_client.is_empty() && f.first_to_client != Some(0x16) {
                v.violations.push(format!(
                    "{name}: the first byte from 15008 is {:?}, not a TLS handshake (0x16)",
                    f.first_to_client
                ));
            }
            if carries_marker {
                v.violations
                    .push(format!("{name}: the marker is readable in an HBONE flow"));
            }
        } else if judged && has_payload {
            // (a) and (b): between enrolled pods, payload only ever goes to 15008.
            v.violations.push(format!(
                "{name}: {} + {} plaintext payload bytes between enrolled pods{}",
                f.to_server.len(),
                f.to_client.len(),
                if carries_marker {
                    ", with the marker"
                } else {
                    ""
                }
            ));
        } else if carries_marker {
            v.marker_before += 1;
            v.marker_before_v6 += usize::from(f.server.0.is_ipv6());
        }
    }
    v
}

fn assert_complete(captured: &Captured) {
    assert_eq!(captured.dropped, 0, "the kernel dropped captured frames");
    assert_eq!(
        captured.truncated, 0,
        "frames longer than the capture buffer"
    );
    assert!(!captured.packets.is_empty(), "nothing captured");
}

#[test]
fn no_plaintext_between_enrolled_pods_through_enrollment_and_restarts() {
    if !test_support::can_run_root_tests() {
        return;
    }
    let _s = serial();
    // The harness's processes: the test restarts the agents and ztunnels at moments
    // of its choosing, while capturing.
    let mut c = LocalCluster::with_topology(
        "npl",
        Topology {
            dual_stack: true,
            install: MeshInstall::Harness,
            ..Topology::default()
        },
    )
    .unwrap();
    c.wait_ztunnels_ready(T).unwrap();
    let cap = capture(&c);
    let mut timeline = Timeline::default();

    // Two pods on different nodes, not in the mesh yet, talking both ways over both
    // families.
    c.create_namespace("np", &[]).unwrap();
    c.create_pod("np", "a", 1, "a", &[], &args(&echo()))
        .unwrap();
    c.create_pod("np", "b", 2, "b", &[], &args(&echo()))
        .unwrap();
    let a = c.wait_pod_running("np", "a", T).unwrap().ips;
    let b = c.wait_pod_running("np", "b", T).unwrap().ips;
    assert!(a.len() == 2 && b.len() == 2, "not dual-stack: {a:?} {b:?}");
    let mut streams = streams_between(&c, &a, &b);
    progress(&c, &all(&streams), "before enrollment (plaintext)");

    // Enrollment of the running pods by the namespace label.
    c.label_namespace("np", AMBIENT.0, Some(AMBIENT.1)).unwrap();
    for pod in ["a", "b"] {
        c.wait_redirection("np", pod, Some("enabled"), T).unwrap();
    }
    wait_seen_everywhere(&c, &a[0]);
    wait_seen_everywhere(&c, &b[0]);
    timeline.enrolled(&a);
    timeline.enrolled(&b);
    progress(&c, &all(&streams), "after enrollment");

    // The node agents restart.
    for node in [1u8, 2] {
        c.node_mut(node).start_agent().unwrap();
    }
    // From here on, a phase where traffic does not resume is recorded and the scenario
    // goes on, so the capture is judged in any case.
    let mut stalls = Vec::new();
    stalls.extend(try_progress(&c, &all(&streams), "after the agents restarted").err());

    // The ztunnels restart, one after the other.
    for node in [1u8, 2] {
        c.node_mut(node).stop_ztunnel();
        c.node_mut(node).start_ztunnel().unwrap();
        c.wait_ztunnels_ready(T).unwrap();
        let what = format!("after node-{node}'s ztunnel restarted");
        stalls.extend(try_progress(&c, &all(&streams), &what).err());
    }

    // Both pods are deleted and recreated; the streams restart as soon as the new pods
    // run, before every ztunnel knows them (those first flows are not judged).
    let mut totals: Vec<(usize, usize)> = streams.iter().map(counts).collect();
    drop(streams);
    timeline.gone(&a);
    timeline.gone(&b);
    c.delete_pod("np", "a").unwrap();
    c.delete_pod("np", "b").unwrap();
    wait_for("the old sandboxes to go", T, || {
        (c.pod("np", "a").is_none() && c.pod("np", "b").is_none()).then_some(())
    })
    .unwrap();
    c.settle();
    c.create_pod("np", "a", 1, "a", &[], &args(&echo()))
        .unwrap();
    c.create_pod("np", "b", 2, "b", &[], &args(&echo()))
        .unwrap();
    let a2 = c.wait_pod_running("np", "a", T).unwrap().ips;
    let b2 = c.wait_pod_running("np", "b", T).unwrap().ips;
    streams = streams_between(&c, &a2, &b2);
    for pod in ["a", "b"] {
        c.wait_redirection("np", pod, Some("enabled"), T).unwrap();
    }
    wait_seen_everywhere(&c, &a2[0]);
    wait_seen_everywhere(&c, &b2[0]);
    timeline.enrolled(&a2);
    timeline.enrolled(&b2);
    stalls.extend(try_progress(&c, &all(&streams), "after the pods were recreated").err());
    totals.extend(streams.iter().map(counts));
    drop(streams);
    std::thread::sleep(Duration::from_millis(300));
    let captured = cap.stop().unwrap();

    assert_complete(&captured);
    let v = judge(&captured, &timeline);
    let exchanges: usize = totals.iter().map(|t| t.0).sum();
    let failed: usize = totals.iter().map(|t| t.1).sum();
    eprintln!(
        "capture: {} frames, {} TCP packets ({} between pods known as HBONE); {} pod-to-pod \
         flows, {} started with both ends enrolled; {} HBONE flows ({} bytes), all TLS from \
         the first byte ({} over IPv6); {} plaintext flows with the marker before \
         enrollment ({} over IPv6); streams: \
         {exchanges} exchanges ok, {failed} failed (during restarts)",
        captured.frames,
        captured.packets.len(),
        v.judged_packets,
        v.pod_flows,
        v.judged,
        v.hbone_flows,
        v.hbone_bytes,
        v.hbone_flows_v6,
        v.marker_before,
        v.marker_before_v6,
    );
    assert!(
        v.violations.is_empty(),
        "{} violations:\n{}",
        v.violations.len(),
        v.violations.join("\n")
    );
    assert!(
        v.marker_before_v6 > 0 && v.marker_before > v.marker_before_v6,
        "the marker was not seen over both families before enrollment: the capture \
         misses one: {v:?}"
    );
    assert!(
        v.hbone_flows_v6 > 0 && v.hbone_flows > v.hbone_flows_v6,
        "no HBONE flow over one of the families: {v:?}"
    );
    assert!(
        stalls.is_empty(),
        "no plaintext, but the mesh stopped carrying traffic in {} phase(s):\n{}",
        stalls.len(),
        stalls.join("\n---\n")
    );
    // New HBONE connections at least after each ztunnel restart and pod recreation.
    assert!(
        v.judged >= 2,
        "too few flows started between enrolled pods: {v:?}"
    );
    assert!(
        v.judged_packets >= 100,
        "too little traffic between enrolled pods: {v:?}"
    );
}

/// How many pods node `i`'s ztunnel serves (its admin `/config_dump`), if it answers.
fn served_pods(c: &LocalCluster, i: u8) -> Option<usize> {
    let dump =
        local_cluster::mesh::http_get(&c.node(i).ns, "http://127.0.0.1:15000/config_dump").ok()?;
    let dump: serde_json::Value = serde_json::from_str(&dump).ok()?;
    dump["workloadState"].as_object().map(|p| p.len())
}

#[test]
fn a_restarted_ztunnel_serves_no_pod_before_it_knows_the_peers() {
    // A ztunnel that served its pods before its first xDS sync would not know that
    // their peers take HBONE, and send their traffic in plaintext.
    if !test_support::can_run_root_tests() {
        return;
    }
    let _s = serial();
    // The harness's ztunnel: the test restarts it with a changed environment.
    let mut c = LocalCluster::with_harness("npr").unwrap();
    c.wait_ztunnels_ready(T).unwrap();
    c.create_namespace("r", &[AMBIENT]).unwrap();
    c.create_pod("r", "a", 1, "a", &[], &args(&echo())).unwrap();
    c.create_pod("r", "b", 2, "b", &[], &args(&echo())).unwrap();
    let a = c.wait_pod_running("r", "a", T).unwrap().ip;
    let b = c.wait_pod_running("r", "b", T).unwrap().ip;
    for pod in ["a", "b"] {
        c.wait_redirection("r", pod, Some("enabled"), T).unwrap();
    }
    wait_seen_everywhere(&c, &a);
    wait_seen_everywhere(&c, &b);
    assert_eq!(served_pods(&c, 1), Some(1));
    let cap = capture(&c);

    // node-1's ztunnel restarts claiming another namespace: istiod-lite refuses its
    // xDS stream (the token's namespace is not the node's), while the CA still
    // answers, so only the missing sync can keep the pod from being served.
    let node = c.node_mut(1);
    node.ztunnel_env
        .push(("POD_NAMESPACE".into(), "elsewhere".into()));
    node.stop_ztunnel();
    node.start_ztunnel().unwrap();
    let s = stream(&c, "r", "a", &b, 20);
    wait_for("the new ztunnel's admin", T, || served_pods(&c, 1)).unwrap();
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        served_pods(&c, 1),
        Some(0),
        "a pod is served before the first sync: {}",
        c.node(1).logs()
    );
    assert_eq!(counts(&s).0, 0, "an exchange succeeded without state");

    // Restarted as itself: it syncs, then serves the pod, over HBONE.
    let node = c.node_mut(1);
    node.ztunnel_env.retain(|(k, _)| k != "POD_NAMESPACE");
    node.stop_ztunnel();
    node.start_ztunnel().unwrap();
    wait_for("the pod to be served after the sync", T, || {
        (served_pods(&c, 1) == Some(1)).then_some(())
    })
    .unwrap();
    progress(&c, &[&s], "after node-1's ztunnel synced");
    drop(s);
    std::thread::sleep(Duration::from_millis(300));
    let captured = cap.stop().unwrap();
    assert_complete(&captured);
    let (a, b) = (ip(&a), ip(&b));
    let flows = capture::flows(&captured.packets);
    let plaintext: Vec<String> = flows
        .iter()
        .filter(|f| f.client.0 == a && f.server.0 == b && f.server.1 != HBONE_PORT)
        .map(|f| format!("{:?} -> {:?}", f.client, f.server))
        .collect();
    let hbone = flows
        .iter()
        .filter(|f| f.client.0 == a && f.server == (b, HBONE_PORT))
        .count();
    eprintln!(
        "restart without state: {} packets captured, {hbone} HBONE flows a -> b, plaintext: {plaintext:?}",
        captured.packets.len()
    );
    assert!(plaintext.is_empty(), "plaintext a -> b: {plaintext:?}");
    assert!(hbone > 0, "no HBONE flow from a to b");
}

// ---------------------------------------------------------------- waypoints

#[test]
fn the_waypoints_hops_carry_no_plaintext() {
    if !test_support::can_run_root_tests() {
        return;
    }
    let _s = serial();
    let c = LocalCluster::start("npw").unwrap();
    c.create_namespace("w", &[AMBIENT]).unwrap();
    c.wait_ztunnels_ready(T).unwrap();
    c.create_pod(
        "w",
        "server",
        2,
        "server",
        &[("app", "server")],
        &args(&echo()),
    )
    .unwrap();
    c.create_pod("w", "client", 1, "client", &[], &["sleep", "3600"])
        .unwrap();
    let server = c.wait_pod_running("w", "server", T).unwrap().ip;
    let client = c.wait_pod_running("w", "client", T).unwrap().ip;
    for pod in ["server", "client"] {
        c.wait_redirection("w", pod, Some("enabled"), T).unwrap();
    }
    let svc = serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "echo", "namespace": "w"},
        "spec": {"selector": {"app": "server"},
                 "ports": [{"name": "tcp-echo", "port": ECHO_PORT, "targetPort": ECHO_PORT}]},
    });
    let svc = c.api().post("/api/v1/namespaces/w/services", &svc).unwrap();
    let vip = svc["spec"]["clusterIP"].as_str().unwrap().to_owned();
    c.istioctl(&[
        "waypoint",
        "apply",
        "-n",
        "w",
        "--enroll-namespace",
        "--wait",
        "--timeout",
        "60s",
    ])
    .unwrap();
    let waypoint = c
        .pod_names_in("w")
        .into_iter()
        .find(|n| n.starts_with("waypoint"))
        .unwrap();
    let waypoint_ip = c.wait_pod_running("w", &waypoint, T).unwrap().ip;

    let cap = capture(&c);
    let s = stream(&c, "w", "client", &vip, 20);
    progress(&c, &[&s], "through the waypoint");
    drop(s);
    std::thread::sleep(Duration::from_millis(300));
    let captured = cap.stop().unwrap();
    assert_complete(&captured);

    // The client's ztunnel tunnels to the waypoint, the waypoint to the server's
    // ztunnel: whichever of these hops crosses the wire (the waypoint runs on one of
    // the two nodes) is HBONE, and no packet shows the marker.
    let (client, server, waypoint_ip) = (ip(&client), ip(&server), ip(&waypoint_ip));
    let flows = capture::flows(&captured.packets);
    let hops: Vec<&Flow> = flows
        .iter()
        .filter(|f| {
            (f.client.0 == client && f.server.0 == waypoint_ip)
                || (f.client.0 == waypoint_ip && f.server.0 == server)
        })
        .collect();
    assert!(
        !hops.is_empty(),
        "no hop through the waypoint crossed the wire"
    );
    for f in &hops {
        assert_eq!(
            f.server.1, HBONE_PORT,
            "{:?} -> {:?} is not HBONE",
            f.client, f.server
        );
        assert_eq!(
            f.first_to_server,
            Some(0x16),
            "{:?}: not TLS first",
            f.client
        );
    }
    let marker = MARKER.as_bytes();
    let leaked = captured
        .packets
        .iter()
        .filter(|p| capture::contains(&p.payload, marker))
        .count();
    assert_eq!(leaked, 0, "packets with the marker in plaintext");
    eprintln!(
        "waypoint hops: {} packets captured, {} flows through the waypoint, none plaintext",
        captured.packets.len(),
        hops.len()
    );
}

// ---------------------------------------------------------------- STRICT

const STRICT_MESH: &str = "apiVersion: security.istio.io/v1\nkind: PeerAuthentication\n\
    metadata: {name: default, namespace: istio-system}\nspec:\n  mtls: {mode: STRICT}\n";
const SERVER_PERMISSIVE: &str = "apiVersion: security.istio.io/v1beta1\nkind: PeerAuthentication\n\
    metadata: {name: server-permissive, namespace: s}\n\
    spec:\n  selector: {matchLabels: {app: server}}\n  mtls: {mode: PERMISSIVE}\n";

/// One round trip to `target`'s echo server from pod `s/from`.
fn ping(c: &LocalCluster, ns: &str, from: &str, target: &str) -> anyhow::Result<String> {
    c.exec_in_pod(
        ns,
        from,
        &["e2e-app", "ping", "--connect", target, "--count", "1"],
    )
}

/// Drops node `i`'s traffic with the control plane: the API server and istiod-lite
/// (the CA and xDS), both ways, established connections included, so watches and the
/// xDS stream stall rather than fail; lifted when dropped.
struct ControlPlaneBlock {
    netns: String,
}

impl ControlPlaneBlock {
    const PORTS: [&'static str; 2] = ["6443", "15012"];

    fn rules() -> Vec<[&'static str; 9]> {
        Self::PORTS
            .iter()
            .flat_map(|port| {
                [
                    [
                        "INPUT", "-p", "tcp", "-s", "10.1.0.1", "--sport", port, "-j", "DROP",
                    ],
                    [
                        "OUTPUT", "-p", "tcp", "-d", "10.1.0.1", "--dport", port, "-j", "DROP",
                    ],
                ]
            })
            .collect()
    }

    fn start(c: &LocalCluster, i: u8) -> Self {
        assert_eq!(
            (
                local_cluster::cluster::API_ADDR,
                local_cluster::cluster::ISTIOD_ADDR
            ),
            ("10.1.0.1:6443", "10.1.0.1:15012"),
            "the rules name the API server and istiod-lite"
        );
        let block = ControlPlaneBlock {
            netns: c.node(i).ns.name().to_owned(),
        };
        for rule in Self::rules() {
            assert!(block.iptables("-I", &rule), "blocking the control plane");
        }
        block
    }

    fn iptables(&self, op: &str, rule: &[&str]) -> bool {
        std::process::Command::new("ip")
            .args(["netns", "exec", &self.netns, "iptables", op])
            .args(rule)
            .status()
            .is_ok_and(|s| s.success())
    }
}

impl Drop for ControlPlaneBlock {
    fn drop(&mut self) {
        for rule in Self::rules() {
            self.iptables("-D", &rule);
        }
    }
}

fn strict_refusals(c: &LocalCluster, node: u8) -> f64 {
    metric_sum(
        &c.ztunnel_metrics(node).unwrap_or_default(),
        "ztunnel_errors_total",
        &[("reason", "strict_mtls")],
    )
}

#[test]
fn under_strict_no_plaintext_connection_succeeds() {
    if !test_support::can_run_root_tests() {
        return;
    }
    let _s = serial();
    // The harness's control plane: the test cuts node-1 off from it with rules at the
    // node's edge (istiod-lite's pods would otherwise run on the nodes themselves).
    let c = LocalCluster::with_harness("nps").unwrap();
    c.wait_ztunnels_ready(T).unwrap();
    c.create_namespace("s", &[AMBIENT]).unwrap();
    c.create_namespace("plain", &[]).unwrap();
    c.create_pod(
        "s",
        "server",
        2,
        "server",
        &[("app", "server")],
        &args(&echo()),
    )
    .unwrap();
    c.create_pod("s", "client", 1, "client", &[], &["sleep", "3600"])
        .unwrap();
    c.create_pod("plain", "outsider", 1, "default", &[], &["sleep", "3600"])
        .unwrap();
    let server = c.wait_pod_running("s", "server", T).unwrap().ip;
    let client = c.wait_pod_running("s", "client", T).unwrap().ip;
    c.wait_pod_running("plain", "outsider", T).unwrap();
    for pod in ["server", "client"] {
        c.wait_redirection("s", pod, Some("enabled"), T).unwrap();
    }
    wait_seen_everywhere(&c, &server);
    wait_seen_everywhere(&c, &client);
    let target = format!("{server}:{ECHO_PORT}");

    // PERMISSIVE (no policy): a pod outside the mesh reaches the server in plaintext.
    wait_for("plaintext from outside the mesh", T, || {
        ping(&c, "plain", "outsider", &target).ok()
    })
    .unwrap();
    let mut held = c
        .spawn_in_pod(
            "plain",
            "outsider",
            &[
                "e2e-app",
                "ping",
                "--connect",
                &target,
                "--count",
                "600",
                "--interval-ms",
                "50",
            ],
        )
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));

    // Mesh-wide STRICT: new plaintext is refused, the live plaintext connection is
    // closed by the re-check, mTLS goes on.
    let failed_before = metric_sum(
        &c.ztunnel_metrics(2).unwrap(),
        "istio_tcp_connections_failed_total",
        &[],
    );
    c.kubectl_apply(STRICT_MESH).unwrap();
    // A ping in flight when STRICT lands is closed by the re-check, not refused: wait
    // for a new connection refused as `strict_mtls`.
    wait_for("STRICT to refuse plaintext", T, || {
        ping(&c, "plain", "outsider", &target).err()?;
        (strict_refusals(&c, 2) >= 1.0).then_some(())
    })
    .unwrap();
    let status = held.wait_timeout(T).expect("the held connection ends");
    assert_eq!(
        status.code(),
        Some(3),
        "the live plaintext connection is closed: {}",
        held.log()
    );
    let failed_after = metric_sum(
        &c.ztunnel_metrics(2).unwrap(),
        "istio_tcp_connections_failed_total",
        &[],
    );
    assert!(
        failed_after > failed_before,
        "{failed_before} -> {failed_after}"
    );
    ping(&c, "s", "client", &target).expect("mTLS still allowed");

    // A workload-selector PERMISSIVE overrides the mesh's STRICT; removing it restores it.
    c.kubectl_apply(SERVER_PERMISSIVE).unwrap();
    wait_for("the workload's PERMISSIVE", T, || {
        ping(&c, "plain", "outsider", &target).ok()
    })
    .unwrap();
    c.kubectl(&[
        "delete",
        "peerauthentication",
        "-n",
        "s",
        "server-permissive",
    ])
    .unwrap();
    wait_for("STRICT again", T, || {
        ping(&c, "plain", "outsider", &target).err()
    })
    .unwrap();

    // The enrollment window, held open: node-1 stops hearing from the control plane, so
    // its ztunnel does not learn about a new server pod on node-2, which is enrolled
    // there (node-2's agent and ztunnel serve it). The client on node-1 streams to it:
    // its ztunnel does not know the destination takes HBONE and sends plaintext, which
    // node-2's ztunnel must refuse. Then node-1 hears again and HBONE takes over.
    let cap = capture(&c);
    let refused_before = strict_refusals(&c, 2);
    let api_blocked = ControlPlaneBlock::start(&c, 1);
    c.create_pod(
        "s",
        "fresh",
        2,
        "server",
        &[("app", "fresh")],
        &args(&echo()),
    )
    .unwrap();
    let fresh = c.wait_pod_running("s", "fresh", T).unwrap().ip;
    c.wait_redirection("s", "fresh", Some("enabled"), T)
        .unwrap();
    c.wait_ztunnel_sees_hbone(2, &fresh, T).unwrap();
    let s = stream(&c, "s", "client", &fresh, 20);
    wait_for("node-2 to refuse plaintext to the new pod", T, || {
        (strict_refusals(&c, 2) >= refused_before + 10.0).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\nstream: {}", tail(&s.log(), 5)));
    assert_eq!(
        counts(&s).0,
        0,
        "an exchange succeeded while node-1 was in the dark"
    );
    drop(api_blocked);
    wait_seen_everywhere(&c, &fresh);
    progress(&c, &[&s], "to the new pod over HBONE");
    let (ok, failed) = counts(&s);
    drop(s);
    std::thread::sleep(Duration::from_millis(300));
    let captured = cap.stop().unwrap();
    assert_complete(&captured);
    let (client, fresh) = (ip(&client), ip(&fresh));
    let flows: Vec<Flow> = capture::flows(&captured.packets)
        .into_iter()
        .filter(|f| f.client.0 == client && f.server.0 == fresh)
        .collect();
    let plaintext: Vec<&Flow> = flows.iter().filter(|f| f.server.1 != HBONE_PORT).collect();
    let answered: Vec<String> = plaintext
        .iter()
        .filter(|f| !f.to_client.is_empty())
        .map(|f| format!("{:?} answered {} bytes", f.client, f.to_client.len()))
        .collect();
    eprintln!(
        "STRICT window: {} flows client -> new pod ({} plaintext attempts, all refused \
         unless listed: {answered:?}); stream {ok} ok, {failed} failed; node-2 strict_mtls \
         refusals +{}",
        flows.len(),
        plaintext.len(),
        strict_refusals(&c, 2) - refused_before
    );
    assert!(
        !plaintext.is_empty(),
        "no plaintext attempt crossed the wire: the window was not exercised"
    );
    assert!(
        answered.is_empty(),
        "a plaintext connection succeeded under STRICT: {answered:?}"
    );
    assert!(
        flows.iter().any(|f| f.server.1 == HBONE_PORT),
        "the client never reached the new pod over HBONE"
    );
}
