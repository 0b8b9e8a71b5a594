//! The local multi-node cluster end to end: pods created by the kubelet stand-in
//! through the node's CNI chain (reference `bridge` + the agent's `istio-cni`), and
//! the mesh on top. Root only; each test builds its own cluster, one at a time.
//!
//! Every traffic test through the mesh asserts from ztunnel's metrics that the bytes
//! crossed HBONE over mutual TLS with the expected SPIFFE identities.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use local_cluster::cluster::LocalCluster;
use local_cluster::mesh::metric_sum;
use test_support::poll::wait_for;

const T: Duration = Duration::from_secs(30);
const AMBIENT: (&str, &str) = ("istio.io/dataplane-mode", "ambient");

/// Clusters are heavy (two cores): one at a time.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

fn sink(port: u16) -> Vec<String> {
    ["e2e-app", "sink", "--listen", &format!("0.0.0.0:{port}")]
        .map(String::from)
        .to_vec()
}

fn args(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// A client pod that only sleeps; tests exec `e2e-app send` in it.
const IDLE: &[&str] = &["sleep", "3600"];

fn principal(ns: &str, sa: &str) -> String {
    format!("spiffe://cluster.local/ns/{ns}/sa/{sa}")
}

/// Bytes the destination node's ztunnel received over mTLS from `src` to `dst`.
fn mtls_bytes(c: &LocalCluster, dst_node: u8, src: (&str, &str), dst: (&str, &str)) -> f64 {
    let text = c.ztunnel_metrics(dst_node).unwrap_or_default();
    let (sp, dp) = (principal(src.0, src.1), principal(dst.0, dst.1));
    metric_sum(
        &text,
        "istio_tcp_received_bytes_total",
        &[
            ("reporter", "destination"),
            ("connection_security_policy", "mutual_tls"),
            ("source_principal", &sp),
            ("destination_principal", &dp),
        ],
    )
}

/// Waits until the destination ztunnel reports at least `bytes` over mTLS.
fn assert_mtls(c: &LocalCluster, dst_node: u8, src: (&str, &str), dst: (&str, &str), bytes: f64) {
    wait_for("mutual-TLS bytes in ztunnel's metrics", T, || {
        (mtls_bytes(c, dst_node, src, dst) >= bytes).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}: {}", c.ztunnel_metrics(dst_node).unwrap_or_default()));
}

// ---------------------------------------------------------------- infrastructure

#[test]
fn cluster_comes_up_with_the_plugin_installed() {
    if !test_support::can_run_root_tests() {
        return;
    }
    let _s = serial();
    let c = LocalCluster::start("cup").unwrap();
    for node in &c.nodes {
        assert!(node.plugin_installed(), "{}", node.logs());
    }
    let nodes = c.kubectl(&["get", "nodes", "-o", "name"]).unwrap();
    assert!(
        nodes.contains("node/node-1") && nodes.contains("node/node-2"),
        "{nodes}"
    );
    let ds = c
        .kubectl(&["get", "daemonsets", "-n", "istio-system", "-o", "name"])
        .unwrap();
    assert!(
        ds.contains("istio-cni-node") && ds.contains("ztunnel"),
        "{ds}"
    );
}

#[test]
fn pods_start_through_the_cni_chain_and_talk_without_the_mesh() {
    if !test_support::can_run_root_tests() {
        return;
    }
    let _s = serial();
    let c = LocalCluster::start("pln").unwrap();
    c.create_namespace("plain", &[]).unwrap();
    c.create_pod("plain", "server", 2, "server", &[], &args(&sink(9000)))
        .unwrap();
    c.create_pod("plain", "near", 1, "server", &[], &args(&sink(9000)))
        .unwrap();
    c.create_pod("plain", "client", 1, "client", &[], IDLE)
        .unwrap();
    let server = c.wait_pod_running("plain", "server", T).unwrap();
    let near = c.wait_pod_running("plain", "near", T).unwrap();
    let client = c.wait_pod_running("plain", "client", T).unwrap();
    assert!(
        server.ip.starts_with("10.244.2.") && client.ip.starts_with("10.244.1."),
        "{server:?} {client:?}"
    );
    assert_eq!(client.plugins, ["bridge", "istio-cni"]);
    // The bridge plugin made the node's pod bridge.
    assert!(c.node(1).ns.stdout(&["ip", "link", "show", "cni0"]).is_ok());
    for (what, ip) in [("cross-node", &server.ip), ("same-node", &near.ip)] {
        let answer = wait_for(what, T, || {
            c.send("plain", "client", &format!("{ip}:9000"), 10_000)
                .ok()
        })
        .unwrap();
        assert_eq!(answer["bytes"], 10_000, "{what}");
        let peer = answer["peer"].as_str().unwrap_or_default();
        assert!(
            peer.starts_with(&format!("{}:", client.ip)),
            "{what}: the server saw {peer}"
        );
    }
    let pod = c.get_pod("plain", "client").unwrap();
    assert_eq!(pod["status"]["podIP"], client.ip.as_str());
    assert!(
        c.redirection("plain", "client").is_none(),
        "a non-ambient pod is never redirected"
    );
}

#[test]
fn deleting_a_pod_removes_its_processes_and_namespace() {
    if !test_support::can_run_root_tests() {
        return;
    }
    let _s = serial();
    let c = LocalCluster::start("del").unwrap();
    c.create_namespace("d", &[]).unwrap();
    c.create_pod("d", "p", 1, "default", &[], &args(&sink(9000)))
        .unwrap();
    let p = c.wait_pod_running("d", "p", T).unwrap();
    c.delete_pod("d", "p").unwrap();
    wait_for("the sandbox to go", T, || {
        c.pod("d", "p").is_none().then_some(())
    })
    .unwrap();
    c.settle();
    let list = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&list.stdout).contains(&p.netns),
        "{} left behind",
        p.netns
    );
    for pid in p.pids {
        assert!(!process_alive(pid), "container process {pid} survived");
    }
}

#[test]
fn twenty_pods_per_node_created_at_once() {
    if !test_support::can_run_root_tests() {
        return;
    }
    let _s = serial();
    let c = LocalCluster::start("many").unwrap();
    c.create_namespace("many", &[]).unwrap();
    for node in 1..=2u8 {
        for i in 0..20 {
            c.create_pod("many", &format!("p{node}-{i}"), node, "default", &[], IDLE)
                .unwrap();
        }
    }
    let mut ips = std::collections::BTreeSet::new();
    for node in 1..=2u8 {
        for i in 0..20 {
            let p = c
                .wait_pod_running("many", &format!("p{node}-{i}"), Duration::from_secs(90))
                .unwrap();
            assert!(ips.insert(p.ip.clone()), "IP {} given twice", p.ip);
        }
    }
}

#[test]
fn overwritten_conflist_is_repaired_and_new_pods_get_the_plugin() {
    if !test_support::can_run_root_tests() {
        return;
    }
    let _s = serial();
    let c = LocalCluster::start("ovw").unwrap();
    c.node(1).write_bridge_conflist().unwrap();
    wait_for("the agent to repair the chain", T, || {
        c.node(1).plugin_installed().then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}: {}", c.node(1).logs()));
    c.create_namespace("o", &[]).unwrap();
    c.create_pod("o", "after", 1, "default", &[], IDLE).unwrap();
    let p = c.wait_pod_running("o", "after", T).unwrap();
    assert_eq!(p.plugins, ["bridge", "istio-cni"]);
}

#[test]
fn teardown_leaves_no_namespace_link_or_process() {
    if !test_support::can_run_root_tests() {
        return;
    }
    let _s = serial();
    let c = LocalCluster::start("tdn").unwrap();
    c.create_namespace("t", &[]).unwrap();
    c.create_pod("t", "a", 1, "default", &[], &args(&sink(9000)))
        .unwrap();
    c.create_pod("t", "b", 2, "default", &[], IDLE).unwrap();
    let mut names = c.namespace_names();
    let mut pids = vec![];
    for (n, p) in [("t", "a"), ("t", "b")] {
        let h = c.wait_pod_running(n, p, T).unwrap();
        names.push(h.netns);
        pids.extend(h.pids);
    }
    // The mesh's pods (installed from the charts) and their namespaces.
    for name in c.pod_names_in("istio-system") {
        let h = c.pod("istio-system", &name).unwrap();
        names.push(h.netns);
        pids.extend(h.pids);
    }
    assert!(pids.len() >= 2 + 6, "pods' processes: {pids:?}");
    pids.extend(c.control_plane.apiserver.as_ref().map(|p| p.pid()));
    drop(c);
    let list = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .unwrap();
    let list = String::from_utf8_lossy(&list.stdout);
    for name in names {
        assert!(!list.contains(&name), "namespace {name} left behind");
    }
    for pid in pids {
        assert!(!process_alive(pid), "process {pid} left behind");
    }
    // Links and rules lived only inside the deleted namespaces; the root has none of ours.
    let links = std::process::Command::new("ip")
        .args(["-o", "link"])
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&links.stdout).contains("cni0"),
        "a pod bridge leaked into the root namespace"
    );
}

#[test]
fn a_deleted_pods_forked_processes_go_too() {
    // `make demo` once left a client pod's `sleep 3600` behind, in the deleted pod's
    // (now unnamed) network namespace: the container was `sh -c`, which forks its
    // commands, and only the shell was killed.
    if !test_support::can_run_root_tests() {
        return;
    }
    let _s = serial();
    let c = LocalCluster::start("frk").unwrap();
    c.create_namespace("f", &[]).unwrap();
    c.create_pod(
        "f",
        "sh",
        1,
        "default",
        &[],
        &["sh", "-c", "sleep 3600; true"],
    )
    .unwrap();
    c.wait_pod_running("f", "sh", T).unwrap();
    let marker = test_support::owner::cluster_marker(&c.tag);
    let sleep = || {
        test_support::owner::marked_processes(&marker)
            .into_iter()
            .find(|(_, cmd)| cmd == "sleep 3600")
    };
    let (pid, _) = wait_for("the forked sleep", T, sleep).unwrap();
    c.delete_pod("f", "sh").unwrap();
    wait_for("the sandbox to go", T, || {
        c.pod("f", "sh").is_none().then_some(())
    })
    .unwrap();
    c.settle();
    wait_for("the forked sleep to die", Duration::from_secs(5), || {
        (!process_alive(pid as u32)).then_some(())
    })
    .unwrap();
    // And the cluster's drop checks no process with its marker is left.
    drop(c);
}

fn process_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or_default()
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(false)
}

// ---------------------------------------------------------------- the mesh

/// A cluster installed from the charts, with the ambient namespace `m` and ready
/// ztunnels.
fn mesh_cluster(tag: &str) -> LocalCluster {
    with_mesh_namespace(LocalCluster::start(tag).unwrap())
}

/// The same with the mesh's processes run by the harness, for the tests that stop,
/// restart or reconfigure one of them at a moment of their choosing.
fn harness_cluster(tag: &str) -> LocalCluster {
    with_mesh_namespace(LocalCluster::with_harness(tag).unwrap())
}

fn with_mesh_namespace(c: LocalCluster) -> LocalCluster {
    c.create_namespace("m", &[AMBIENT]).unwrap();
    c.wait_ztunnels_ready(T).unwrap();
    c
}

/// Starts `name` in namespace `m` and waits until it runs with redirection enabled.
fn ambient_pod(
    c: &LocalCluster,
    name: &str,
    node: u8,
    sa: &str,
    labels: &[(&str, &str)],
    argv: &[&str],
) -> String {
    c.create_pod("m", name, node, sa, labels, argv).unwrap();
    let p = c.wait_pod_running("m", name, T).unwrap();
    c.wait_redirection("m", name, Some("enabled"), T).unwrap();
    assert_eq!(
        c.redirection_of("m", name).unwrap(),
        local_cluster::cluster::expected_redirection()
    );
    for node in 1..=c.nodes.len() as u8 {
        c.wait_ztunnel_sees_hbone(node, &p.ip, T).unwrap();
    }
    p.ip
}

/// `name`, looked up by `m/client`'s own resolver, is `ip`.
fn assert_resolves(c: &LocalCluster, name: &str, ip: &str) {
    let hosts = c
        .exec_in_pod("m", "client", &["getent", "hosts", name])
        .unwrap();
    assert_eq!(hosts.split_whitespace().next(), Some(ip), "{hosts}");
}

/// Sends `bytes` from `from` until the sink answers; the answer.
fn send_ok(c: &LocalCluster, ns: &str, from: &str, target: &str, bytes: u64) -> serde_json::Value {
    wait_for(&format!("{from} -> {target}"), T, || {
        c.send(ns, from, target, bytes).ok()
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", c.diagnostics(ns, from)))
}

#[test]
fn ambient_pods_talk_over_hbone_across_nodes_and_on_one_node() {
    if !test_support::can_run_root_tests() {
        return;
    }
    let _s = serial();
    let c = mesh_cluster("xnd");
    let server = ambient_pod(&c, "server", 2, "server", &[], &args(&sink(9000)));
    let near = ambient_pod(&c, "near", 1, "near", &[], &args(&sink(9000)));
    let client = ambient_pod(&c, "client", 1, "client", &[], IDLE);
    let answer = send_ok(&c, "m", "client", &format!("{server}:9000"), 20_000);
    assert!(
        answer["peer"]
            .as_str()
            .unwrap_or_default()
            .starts_with(&format!("{client}:")),
        "{answer}"
    );
    assert_mtls(&c, 2, ("m", "client"), ("m", "server"), 20_000.0);
    send_ok(&c, "m", "client", &format!("{near}:9000"), 30_000);
    assert_mtls(&c, 1, ("m", "client"), ("m", "near"), 30_000.0);
}

#[test]
fn a_service_vip_is_resolved_by_ztunnel() {
    if !test_support::can_run_root_tests() {
        return;
    }
    let _s = serial();
    let c = mesh_cluster("svc");
    ambient_pod(
        &c,
        "server",
        2,
        "server",
        &[("app", "server")],
        &args(&sink(9000)),
    );
    ambient_pod(&c, "client", 1, "client", &[], IDLE);
    let svc = local_cluster::objects::service("m", "sink", &[("app", "server")], 80, 9000);
    let svc = c.api().post("/api/v1/namespaces/m/services", &svc).unwrap();
    let vip = svc["spec"]["clusterIP"].as_str().unwrap().to_owned();
    let answer = send_ok(&c, "m", "client", &format!("{vip}:80"), 5_000);
    assert_eq!(answer["bytes"], 5_000);
    assert_mtls(&c, 2, ("m", "client"), ("m", "server"), 5_000.0);

    // And by name: the agent captures DNS by default, and the pod's resolver (kubelet's
    // resolv.conf: clusterDNS, `m.svc.cluster.local` first in the search path) gets
    // the VIP from ztunnel's DNS proxy inside the pod.
    assert_resolves(&c, "sink", &vip);
    let answer = send_ok(&c, "m", "client", "sink:80", 3_000);
    assert_eq!(answer["bytes"], 3_000);
    assert_mtls(&c, 2, ("m", "client"), ("m", "server"), 8_000.0);
    let dns = ztunnel_counter(&c, 1, "istio_dns_requests_total", &[]);
    assert!(dns >= 1.0, "node-1's ztunnel answered no DNS query");
}

#[test]
fn an_authorization_policy_denies_one_client_and_not_the_other() {
    if !test_support::can_run_root_tests() {
        return;
    }
    let _s = serial();
    let c = mesh_cluster("pol");
    let server = ambient_pod(
        &c,
        "server",
        2,
        "server",
        &[("app", "server")],
        &args(&sink(9000)),
    );
    ambient_pod(&c, "client", 1, "client", &[], IDLE);
    ambient_pod(&c, "intruder", 1, "intruder", &[], IDLE);
    let target = format!("{server}:9000");
    send_ok(&c, "m", "intruder", &target, 100);
    c.kubectl_apply(
        "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: deny, namespace: m}\n\
         spec:\n  selector: {matchLabels: {app: server}}\n  action: DENY\n  rules:\n  \
         - from: [{source: {principals: [cluster.local/ns/m/sa/intruder]}}]\n",
    )
    .unwrap();
    // A send in flight when the policy lands fails too (its connection is revoked):
    // wait for one refused at connect, which the server's ztunnel counts as denied.
    wait_for("the policy to deny the intruder", T, || {
        c.send("m", "intruder", &target, 100).err()?;
        let m = c.ztunnel_metrics(2).ok()?;
        (metric_sum(&m, "ztunnel_errors_total", &[("reason", "policy_denied")]) >= 1.0)
            .then_some(())
    })
    .unwrap();
    send_ok(&c, "m", "client", &target, 4_000);
    assert_mtls(&c, 2, ("m", "client"), ("m", "server"), 4_000.0);
}

#[test]
fn running_pods_are_enrolled_and_unenrolled_by_namespace_label() {
    if !test_support::can_run_root_tests() {
        return;
    }
    let _s = serial();
    let c = LocalCluster::start("enr").unwrap();
    c.wait_ztunnels_ready(T).unwrap();
    c.create_namespace("late", &[]).unwrap();
    c.create_pod("late", "server", 2, "server", &[], &args(&sink(9000)))
        .unwrap();
    c.create_pod("late", "client", 1, "client", &[], IDLE)
        .unwrap();
    let server = c.wait_pod_running("late", "server", T).unwrap();
    let client = c.wait_pod_running("late", "client", T).unwrap();
    let target = format!("{}:9000", server.ip);
    send_ok(&c, "late", "client", &target, 1_000);
    assert_eq!(
        mtls_bytes(&c, 2, ("late", "client"), ("late", "server")),
        0.0
    );

    c.label_namespace("late", AMBIENT.0, Some(AMBIENT.1))
        .unwrap();
    for pod in ["server", "client"] {
        c.wait_redirection("late", pod, Some("enabled"), T).unwrap();
    }
    c.wait_ztunnel_sees_hbone(1, &server.ip, T).unwrap();
    let again = c.pod("late", "client").unwrap();
    assert_eq!(
        (again.uid, again.pids),
        (client.uid, client.pids),
        "enrolled without a restart"
    );
    send_ok(&c, "late", "client", &target, 7_000);
    assert_mtls(&c, 2, ("late", "client"), ("late", "server"), 7_000.0);

    c.label_namespace("late", AMBIENT.0, None).unwrap();
    for pod in ["server", "client"] {
        c.wait_redirection("late", pod, None, T).unwrap();
    }
    let before = mtls_bytes(&c, 2, ("late", "client"), ("late", "server"));
    send_ok(&c, "late", "client", &target, 3_000);
    assert_eq!(
        mtls_bytes(&c, 2, ("late", "client"), ("late", "server")),
        before,
        "plain again"
    );
}

/// One connection from `m/client` to `target`: 60 pings 100 ms apart (6 s).
fn long_ping(c: &LocalCluster, target: &str) -> test_support::process::ChildGuard {
    c.spawn_ping(("m", "client"), target, 60, 100).unwrap()
}

#[test]
fn a_long_lived_connection_survives_an_agent_restart() {
    if !test_support::can_run_root_tests() {
        return;
    }
    let _s = serial();
    let mut c = harness_cluster("agr");
    let echo = ["e2e-app", "echo", "--listen", "0.0.0.0:9001"];
    let server = ambient_pod(&c, "server", 2, "server", &[], &echo);
    ambient_pod(&c, "client", 1, "client", &[], IDLE);
    let target = format!("{server}:9001");
    let mut ping = long_ping(&c, &target);
    std::thread::sleep(Duration::from_secs(1));
    c.node_mut(1).start_agent().unwrap();
    c.node_mut(2).start_agent().unwrap();
    // Each new agent becomes ready, found its node's enrolled pod in its startup
    // reconcile, and has its node's ztunnel back on ZDS.
    for node in [1u8, 2] {
        let ns = &c.node(node).ns;
        wait_for(&format!("node-{node}'s new agent to be ready"), T, || {
            local_cluster::mesh::http_get(ns, "http://127.0.0.1:8000/readyz").ok()
        })
        .unwrap();
        wait_for(
            &format!("node-{node}'s agent to restore its pod and ztunnel to reconnect"),
            T,
            || {
                let m = local_cluster::mesh::http_get(ns, "http://127.0.0.1:15014/metrics").ok()?;
                let restored = metric_sum(&m, "istio_cni_pods_enrolled", &[]) == 1.0;
                let connected = metric_sum(&m, "istio_cni_zds_connections", &[]) == 1.0;
                (restored && connected).then_some(())
            },
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", c.node(node).logs()));
        // Restored by the startup reconcile, not enrolled anew by the pod watch.
        let m = local_cluster::mesh::http_get(ns, "http://127.0.0.1:15014/metrics").unwrap();
        assert_eq!(
            metric_sum(&m, "istio_cni_enrollments_total", &[]),
            0.0,
            "node-{node}'s new agent enrolled its pod again instead of restoring it\n{}",
            c.node(node).logs()
        );
    }
    let status = ping.wait_timeout(T).expect("ping finished");
    assert!(status.success(), "the connection broke: {}", ping.log());
    assert_mtls(&c, 2, ("m", "client"), ("m", "server"), 60.0 * 64.0);

    // A pod created after the restart is enrolled by the new agent.
    ambient_pod(&c, "late", 1, "late", &[], IDLE);
    let ping = ["e2e-app", "ping", "--connect", &target, "--count", "3"];
    c.exec_in_pod("m", "late", &ping).unwrap();
    assert_mtls(&c, 2, ("m", "late"), ("m", "server"), 3.0 * 64.0);
}

#[test]
fn new_connections_work_after_a_ztunnel_restart() {
    if !test_support::can_run_root_tests() {
        return;
    }
    let _s = serial();
    let mut c = harness_cluster("ztr");
    let server = ambient_pod(&c, "server", 2, "server", &[], &args(&sink(9000)));
    ambient_pod(&c, "client", 1, "client", &[], IDLE);
    let target = format!("{server}:9000");
    send_ok(&c, "m", "client", &target, 1_000);
    for node in [2u8, 1] {
        c.node_mut(node).stop_ztunnel();
        c.node_mut(node).start_ztunnel().unwrap();
    }
    c.wait_ztunnels_ready(T).unwrap();
    send_ok(&c, "m", "client", &target, 6_000);
    assert_mtls(&c, 2, ("m", "client"), ("m", "server"), 6_000.0);
}

#[test]
fn pods_fail_closed_while_ztunnel_is_down() {
    if !test_support::can_run_root_tests() {
        return;
    }
    let _s = serial();
    let mut c = harness_cluster("fcl");
    c.create_namespace("plain", &[]).unwrap();
    let server = ambient_pod(&c, "server", 2, "server", &[], &args(&sink(9000)));
    c.node_mut(1).stop_ztunnel();
    c.create_pod("m", "late", 1, "client", &[], IDLE).unwrap();
    c.create_pod("plain", "bystander", 1, "default", &[], IDLE)
        .unwrap();
    c.wait_pod_running("plain", "bystander", T).unwrap();
    let events = wait_for("a FailedCreatePodSandBox event", T, || {
        let ev = c.pod_events("m", "late").ok()?;
        ev.into_iter()
            .find(|(reason, _)| reason == "FailedCreatePodSandBox")
    })
    .unwrap();
    assert!(
        events.1.to_lowercase().contains("ztunnel"),
        "the event says why: {}",
        events.1
    );
    assert!(
        c.pod("m", "late").is_none(),
        "an ambient pod started without ztunnel"
    );
    // What a user sees with kubectl: why the pod waits, from the kubelet and the agent.
    let agent_event = wait_for("the agent's Warning event", T, || {
        let ev = c.pod_events("m", "late").ok()?;
        ev.into_iter()
            .find(|(reason, _)| reason == "AmbientEnrollmentFailed")
    })
    .unwrap();
    let table = c
        .kubectl(&["-n", "m", "get", "pod", "late", "--no-headers"])
        .unwrap();
    assert_eq!(
        table.split_whitespace().nth(2),
        Some("ContainerCreating"),
        "{table}"
    );
    let describe = c.kubectl(&["-n", "m", "describe", "pod", "late"]).unwrap();
    for wanted in [
        "Warning  FailedCreatePodSandBox",
        "Warning  AmbientEnrollmentFailed",
    ] {
        assert!(
            describe.contains(wanted),
            "{wanted} missing from describe:\n{describe}"
        );
    }
    assert!(describe.contains(&agent_event.1[..40]), "{describe}");
    let all = c.kubectl(&["get", "events", "-A"]).unwrap();
    assert!(
        all.contains("AmbientEnrollmentFailed") && all.contains("pod/late"),
        "{all}"
    );
    // `describe`'s query: only the named object's events.
    let about = |name: &str| -> Vec<String> {
        let selector = format!("involvedObject.name={name}");
        let out = c
            .kubectl(&[
                "-n",
                "m",
                "get",
                "events",
                "--field-selector",
                &selector,
                "-o",
                "json",
            ])
            .unwrap();
        let list: serde_json::Value = serde_json::from_str(&out).unwrap();
        list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| {
                e["involvedObject"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect()
    };
    for name in ["late", "server"] {
        let names = about(name);
        assert!(
            !names.is_empty() && names.iter().all(|n| n == name),
            "{name}: {names:?}"
        );
    }
    let new_api = c
        .kubectl(&["-n", "m", "get", "events.v1.events.k8s.io", "-o", "json"])
        .unwrap();
    let new_api: serde_json::Value = serde_json::from_str(&new_api).unwrap();
    assert!(
        new_api["items"].as_array().into_iter().flatten().any(|e| {
            e["regarding"]["name"] == "late"
                && e["reason"] == "AmbientEnrollmentFailed"
                && e["note"]
                    .as_str()
                    .is_some_and(|n| n.contains("ambient enrollment failed"))
        }),
        "events.k8s.io/v1 serves the same events: {new_api}"
    );
    c.node_mut(1).start_ztunnel().unwrap();
    c.wait_pod_running("m", "late", Duration::from_secs(60))
        .unwrap();
    c.wait_redirection("m", "late", Some("enabled"), T).unwrap();
    send_ok(&c, "m", "late", &format!("{server}:9000"), 2_000);
    assert_mtls(&c, 2, ("m", "client"), ("m", "server"), 2_000.0);
}

#[test]
fn twenty_ambient_pods_per_node_are_enrolled() {
    if !test_support::can_run_root_tests() {
        return;
    }
    let _s = serial();
    let c = mesh_cluster("m20");
    let server = ambient_pod(&c, "server", 2, "server", &[], &args(&sink(9000)));
    for node in 1..=2u8 {
        for i in 0..20 {
            c.create_pod("m", &format!("p{node}-{i}"), node, "many", &[], IDLE)
                .unwrap();
        }
    }
    for node in 1..=2u8 {
        for i in 0..20 {
            let name = format!("p{node}-{i}");
            c.wait_pod_running("m", &name, Duration::from_secs(90))
                .unwrap();
            c.wait_redirection("m", &name, Some("enabled"), Duration::from_secs(60))
                .unwrap();
        }
    }
    send_ok(&c, "m", "p1-7", &format!("{server}:9000"), 1_500);
    assert_mtls(&c, 2, ("m", "many"), ("m", "server"), 1_500.0);
}

/// Pods of a node, by how they join the mesh: (namespace, name, meshed).
fn node_pods(node: u8) -> [(&'static str, String, bool); 4] {
    [
        ("m", format!("server{node}"), true),
        ("m", format!("client{node}"), true),
        ("plain", format!("opted-in{node}"), true),
        ("plain", format!("bystander{node}"), false),
    ]
}

/// The messages of a pod's `FailedCreatePodSandBox` events.
fn sandbox_refusals(events: &[(String, String)]) -> impl Iterator<Item = &str> {
    events
        .iter()
        .filter(|(reason, _)| reason == "FailedCreatePodSandBox")
        .map(|(_, message)| message.as_str())
}

/// A power cycle of a node (istio/istio#60882): every process of the node dies at once
/// and its kubelet recreates the pods before the agent is back. None of them starts
/// while the agent cannot vouch for it (the plugin holds them: the enablement state in
/// `/var/run` is gone with the reboot), every meshed pod's new sandbox went through
/// istio-cni, and once the agent and ztunnel are back all are enrolled and talk over
/// HBONE. Node-1 chains into the primary's conflist (the default); node-2 keeps the chain
/// in its own file (the chart's `chained=false`), and there the primary rewrites its
/// conflist during the boot, dropping our entry from its file.
#[test]
fn a_rebooted_node_holds_its_meshed_pods_until_the_agent_is_back() {
    if !test_support::can_run_root_tests() {
        return;
    }
    let _s = serial();
    let mut c = harness_cluster("rbt");
    c.node_mut(2)
        .agent_env
        .push(("ISTIO_OWNED_CNI_CONFIG".into(), "true".into()));
    c.node_mut(2).start_agent().unwrap();
    c.create_namespace("plain", &[]).unwrap();
    let sink = sink(9000);
    for node in [1u8, 2] {
        for (ns, name, meshed) in node_pods(node) {
            let argv = if name.starts_with("server") {
                args(&sink)
            } else {
                IDLE.to_vec()
            };
            // The pod opts in by its own label where its namespace is not ambient.
            let labels = if ns == "plain" && meshed {
                vec![AMBIENT]
            } else {
                vec![]
            };
            c.create_pod(ns, &name, node, &name, &labels, &argv)
                .unwrap();
        }
    }
    for node in [1u8, 2] {
        for (ns, name, _) in node_pods(node) {
            c.wait_pod_running(ns, &name, T).unwrap();
        }
    }

    for node in [1u8, 2] {
        let before: Vec<usize> = node_pods(node)
            .iter()
            .map(|(ns, name, _)| sandbox_refusals(&c.pod_events(ns, name).unwrap()).count())
            .collect();
        c.power_off_node(node).unwrap();
        if node == 2 {
            // The primary CNI's installer writes its file afresh at boot.
            c.node(node).write_bridge_conflist().unwrap();
        }
        assert!(
            c.node(node).plugin_installed(),
            "node-{node}: the chain the kubelet uses lost istio-cni over the reboot"
        );
        c.boot_node(node).unwrap();
        // Each pod's sandbox is refused by istio-cni (and retried) or, wrongly, starts.
        for ((ns, name, _), before) in node_pods(node).iter().zip(before) {
            let refusal = wait_for(&format!("{ns}/{name}'s new sandbox"), T, || {
                if c.pod(ns, name).is_some() {
                    return Some(None);
                }
                let events = c.pod_events(ns, name).unwrap_or_default();
                let refusals: Vec<_> = sandbox_refusals(&events).collect();
                (refusals.len() > before).then(|| refusals.last().map(|m| m.to_string()))
            })
            .unwrap();
            let refusal = refusal.unwrap_or_else(|| {
                panic!("{ns}/{name} started on node-{node} before its agent was back")
            });
            assert!(
                refusal.contains("istio-cni node agent unreachable"),
                "{ns}/{name} was refused for another reason: {refusal}"
            );
        }

        c.node_mut(node).start_agent().unwrap();
        c.node_mut(node).start_ztunnel().unwrap();
        c.wait_ztunnels_ready(T).unwrap();
        for (ns, name, meshed) in node_pods(node) {
            let pod = c
                .wait_pod_running(ns, &name, Duration::from_secs(60))
                .unwrap();
            assert!(
                pod.plugins.iter().any(|p| p == "istio-cni"),
                "{ns}/{name}'s sandbox was made without istio-cni: {:?}",
                pod.plugins
            );
            let expected = if meshed {
                local_cluster::cluster::expected_redirection()
            } else {
                "none"
            };
            assert_eq!(
                c.redirection_of(ns, &name).unwrap(),
                expected,
                "{ns}/{name}"
            );
        }
        let agent_metrics =
            local_cluster::mesh::http_get(&c.node(node).ns, "http://127.0.0.1:15014/metrics")
                .unwrap();
        assert_eq!(
            metric_sum(&agent_metrics, "istio_cni_pods_enrolled", &[]),
            3.0,
            "node-{node}'s agent\n{}",
            c.node(node).logs()
        );

        // Both ways across the nodes, from a namespace-enrolled and a pod-enrolled client.
        let other = 3 - node;
        for (from_ns, from, to) in [
            ("m", format!("client{node}"), format!("server{other}")),
            ("plain", format!("opted-in{node}"), format!("server{other}")),
            ("m", format!("client{other}"), format!("server{node}")),
        ] {
            let to_node = if to.ends_with(&node.to_string()) {
                node
            } else {
                other
            };
            let server_ip = c.pod("m", &to).unwrap().ip;
            for n in [1u8, 2] {
                c.wait_ztunnel_sees_hbone(n, &server_ip, T).unwrap();
            }
            let (src, dst) = ((from_ns, from.as_str()), ("m", to.as_str()));
            let before = mtls_bytes(&c, to_node, src, dst);
            send_ok(&c, from_ns, &from, &format!("{server_ip}:9000"), 5_000);
            assert_mtls(&c, to_node, src, dst, before + 5_000.0);
        }
    }
}

/// The API server restarts (its state and serving certificate kept, as a real one
/// keeps them): every in-cluster watcher of the mesh (istiod-lite, the node agents,
/// installed from the charts and trusting the `ca.crt` they were given) carries on, so
/// a pod created afterwards is enrolled and reachable over HBONE, and a pod deleted
/// afterwards leaves the agent's count and every ztunnel's workloads.
#[test]
fn the_mesh_follows_pods_after_an_api_server_restart() {
    if !test_support::can_run_root_tests() {
        return;
    }
    let _s = serial();
    let mut c = mesh_cluster("apr");
    let server = ambient_pod(&c, "server", 2, "server", &[], &args(&sink(9000)));
    let gone = ambient_pod(&c, "gone", 1, "gone", &[], IDLE);
    c.control_plane.start_apiserver().unwrap();

    ambient_pod(&c, "late", 1, "late", &[], IDLE);
    send_ok(&c, "m", "late", &format!("{server}:9000"), 3_000);
    assert_mtls(&c, 2, ("m", "late"), ("m", "server"), 3_000.0);

    c.delete_pod("m", "gone").unwrap();
    for node in [1u8, 2] {
        wait_for(
            &format!("node-{node}'s ztunnel to forget m/gone"),
            T,
            || {
                let dump = c.ztunnel_get(node, "127.0.0.1:15000/config_dump").ok()?;
                (!has_hbone_workload(&serde_json::from_str(&dump).ok()?, &gone)).then_some(())
            },
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", c.node(node).logs()));
    }
    let ns = &c.node(1).ns;
    wait_for("node-1's agent to count m/gone out", T, || {
        let m = local_cluster::mesh::http_get(ns, "http://127.0.0.1:15014/metrics").ok()?;
        (metric_sum(&m, "istio_cni_pods_enrolled", &[]) == 1.0).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", c.node(1).logs()));
}

// ---------------------------------------------------------------- the mesh CA

fn ztunnel_counter(c: &LocalCluster, node: u8, name: &str, labels: &[(&str, &str)]) -> f64 {
    metric_sum(&c.ztunnel_metrics(node).unwrap_or_default(), name, labels)
}

#[test]
fn ztunnels_get_certificates_from_istiod_and_ride_out_its_outage() {
    if !test_support::can_run_root_tests() {
        return;
    }
    let _s = serial();
    let mut c = harness_cluster("ca");

    // No node holds the CA key: it is only in the control plane's cacerts.
    assert_eq!(
        c.node_files_with_ca_key().unwrap(),
        Vec::<std::path::PathBuf>::new()
    );

    // Short-lived leaves: renewed at half-life (8 s), valid 16 s.
    for node in [1u8, 2] {
        let n = c.node_mut(node);
        n.ztunnel_env = vec![("SECRET_TTL".into(), "16s".into())];
        n.stop_ztunnel();
        n.start_ztunnel().unwrap();
    }
    c.wait_ztunnels_ready(T).unwrap();
    let server = ambient_pod(&c, "server", 2, "server", &[], &args(&sink(9000)));
    ambient_pod(&c, "client", 1, "client", &[], IDLE);
    let target = format!("{server}:9000");
    send_ok(&c, "m", "client", &target, 10_000);
    assert_mtls(&c, 2, ("m", "client"), ("m", "server"), 10_000.0);
    let issued = metric_sum(
        &c.control_plane.istiod_metrics().unwrap(),
        "citadel_server_success_cert_issuance_count_total",
        &[],
    );
    assert!(issued >= 2.0, "istiod-lite issued {issued} certificates");

    let fetched =
        |c: &LocalCluster| ztunnel_counter(c, 1, "ztunnel_certificates_fetched_total", &[]);
    let before = fetched(&c);
    wait_for("a renewal before expiry", T, || {
        (fetched(&c) > before).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", c.node(1).logs()));

    // istiod-lite goes away: renewal fails, traffic goes on with the cached leaves.
    let unavailable = |c: &LocalCluster| {
        let failures = "ztunnel_certificate_fetch_failures_total";
        ztunnel_counter(c, 1, failures, &[("reason", "unavailable")])
    };
    c.control_plane.stop_istiod();
    wait_for("a failed renewal", T, || {
        (unavailable(&c) >= 1.0).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", c.node(1).logs()));
    send_ok(&c, "m", "client", &target, 20_000);
    assert_mtls(&c, 2, ("m", "client"), ("m", "server"), 30_000.0);

    // A pod created during the outage, with an identity no ztunnel holds a leaf for,
    // does not start uncaptured or unidentified: its ADD fails closed, saying why, and
    // the kubelet retries it (istio/istio#54889: it must not wait forever either).
    c.create_pod("m", "late", 2, "late", &[], IDLE).unwrap();
    let refused = wait_for("the late pod's ADD refused", T, || {
        let events = c.pod_events("m", "late").ok()?;
        events
            .into_iter()
            .find(|(reason, _)| reason == "FailedCreatePodSandBox")
    })
    .unwrap();
    assert!(
        refused.1.contains("certificate"),
        "the event says why: {}",
        refused.1
    );
    assert!(
        c.pod("m", "late").is_none(),
        "an ambient pod started without its identity"
    );

    // Node 1's ztunnel restarts during the outage: with no control plane it has
    // neither the mesh's workloads nor leaves, so it stays unready and serves no pod
    // (fail closed), as Istio's ztunnel waits for its first xDS sync.
    c.node_mut(1).stop_ztunnel();
    c.node_mut(1).start_ztunnel().unwrap();
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        !c.node(1).ztunnel_ready(),
        "ready without the control plane: {}",
        c.node(1).logs()
    );

    // Back: node 1 syncs and gets ready, renewal resumes, and the agent's retried
    // client pod is served again (the fresh ztunnel's counters count from zero).
    let before = ztunnel_counter(&c, 2, "ztunnel_certificates_fetched_total", &[]);
    c.control_plane.start_istiod().unwrap();
    c.wait_ztunnels_ready(T)
        .unwrap_or_else(|e| panic!("{e}\n{}", c.node(1).logs()));
    wait_for("renewal to resume", T, || {
        (ztunnel_counter(&c, 2, "ztunnel_certificates_fetched_total", &[]) > before).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", c.node(2).logs()));
    send_ok(&c, "m", "client", &target, 5_000);
    assert!(fetched(&c) >= 1.0, "{}", c.node(1).logs());
    // The pod created during the outage starts with the kubelet's next retry, with
    // its own identity.
    c.wait_pod_running("m", "late", Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{e}\n{}", c.node(2).logs()));
    c.wait_redirection("m", "late", Some("enabled"), T).unwrap();
    send_ok(&c, "m", "late", &target, 3_000);
    assert_mtls(&c, 2, ("m", "late"), ("m", "server"), 3_000.0);
}

/// `istioctl-lite proxy-status` over XDS, as an operator runs it: a token from a
/// TokenRequest through the kubeconfig, istiod's root from the istio-ca-root-cert
/// ConfigMap. Both node ztunnels are listed, each type SYNCED; a policy change is
/// pushed, ACKed, and shows as a newer version, still SYNCED; `ztunnel-config
/// --from-control-plane` shows the policy as istiod-lite serves it.
#[test]
fn proxy_status_shows_every_ztunnel_synced_over_xds() {
    if !test_support::can_run_root_tests() {
        return;
    }
    let _s = serial();
    let c = mesh_cluster("pst");
    let mut xds = c.proxy_status_args();
    xds.extend(["-o".into(), "json".into()]);
    let xds: Vec<&str> = xds.iter().map(String::as_str).collect();
    let table_args = &xds[..xds.len() - 2];
    let status = |c: &LocalCluster| -> Vec<serde_json::Value> {
        serde_json::from_str(&c.istioctl(&xds).unwrap()).unwrap()
    };
    let synced = |p: &serde_json::Value| {
        p["address"]["state"] == "SYNCED" && p["authorization"]["state"] == "SYNCED"
    };
    let proxies = wait_for("both ztunnels SYNCED", T, || {
        let proxies = status(&c);
        (proxies.len() == 2 && proxies.iter().all(synced)).then_some(proxies)
    })
    .unwrap();
    let names: Vec<&str> = proxies
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    let expected: Vec<String> = c
        .api()
        .list("/api/v1/namespaces/istio-system/pods?labelSelector=app%3Dztunnel")
        .unwrap()
        .iter()
        .map(|p| format!("{}.istio-system", p["metadata"]["name"].as_str().unwrap()))
        .collect();
    // One proxy per ztunnel pod, whichever istiod replica it is connected to.
    assert_eq!(names.len(), expected.len(), "{names:?} {expected:?}");
    for pod in &expected {
        let named = names
            .iter()
            .filter(|n| n.starts_with("ztunnel~") && n.contains(pod.as_str()));
        assert_eq!(named.count(), 1, "{pod} in {names:?}");
    }
    for proxy in &proxies {
        assert_eq!(
            proxy["identity"],
            "spiffe://cluster.local/ns/istio-system/sa/ztunnel"
        );
    }
    let version = |p: &serde_json::Value| {
        p["authorization"]["version"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
    };
    let before = version(&proxies[0]);

    c.kubectl_apply(
        "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\n\
         metadata: {name: deny-nothing, namespace: default}\n\
         spec: {action: DENY, rules: [{from: [{source: {namespaces: [nowhere]}}]}]}\n",
    )
    .unwrap();
    wait_for("the policy pushed and ACKed", T, || {
        let proxies = status(&c);
        proxies
            .iter()
            .all(|p| synced(p) && version(p) > before)
            .then_some(())
    })
    .unwrap();

    // The control plane's view of the mesh, without any ztunnel's admin port.
    let xds_args = c.xds_args();
    let policies = c
        .istioctl(
            &[
                &["ztunnel-config", "policies", "--from-control-plane"][..],
                &xds_args.iter().map(String::as_str).collect::<Vec<_>>(),
            ]
            .concat(),
        )
        .unwrap();
    let row = policies
        .lines()
        .find(|l| l.contains("deny-nothing"))
        .unwrap_or_else(|| panic!("{policies}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        cells,
        ["default", "deny-nothing", "Deny", "Namespace"],
        "{policies}"
    );

    // Without a token the control plane refuses, and istioctl says why.
    let refused = c
        .istioctl(&[table_args, &["--token", "not-a-token"]].concat())
        .unwrap_err()
        .to_string();
    assert!(refused.contains("Unauthenticated"), "{refused}");
    // The table form, as people read it.
    let table = c.istioctl(table_args).unwrap();
    assert!(table.starts_with("NAME"), "{table}");
    assert_eq!(table.matches("SYNCED").count(), 4, "{table}");
}

/// Whether a JSON dump (ztunnel's `/config_dump`, or the control plane's view) holds
/// an HBONE workload at `ip`.
fn has_hbone_workload(dump: &serde_json::Value, ip: &str) -> bool {
    dump["workloads"].as_array().is_some_and(|all| {
        all.iter().any(|w| {
            w["protocol"] == "HBONE"
                && w["workloadIps"]
                    .as_array()
                    .is_some_and(|ips| ips.iter().any(|i| i == ip))
        })
    })
}

/// `XDS_ON_DEMAND` ztunnels: each learns only the addresses its pods' connections
/// name, fetched from istiod-lite when the connection starts, and carries them over
/// HBONE with both identities, across nodes and through a Service VIP.
#[test]
fn on_demand_ztunnels_fetch_only_what_their_pods_connect_to() {
    if !test_support::can_run_root_tests() {
        return;
    }
    let _s = serial();
    let mut c = LocalCluster::with_harness("ond").unwrap();
    for node in [1u8, 2] {
        let n = c.node_mut(node);
        n.ztunnel_env.push(("XDS_ON_DEMAND".into(), "true".into()));
        n.stop_ztunnel();
        n.start_ztunnel().unwrap();
    }
    c.create_namespace("m", &[AMBIENT]).unwrap();
    c.wait_ztunnels_ready(T).unwrap();
    let mut ips = Vec::new();
    for (name, node, labels, argv) in [
        ("server", 2, &[("app", "server")][..], sink(9000)),
        ("bystander", 2, &[][..], sink(9000)),
        (
            "client",
            1,
            &[][..],
            IDLE.iter().map(|s| s.to_string()).collect(),
        ),
    ] {
        c.create_pod("m", name, node, name, labels, &args(&argv))
            .unwrap();
        ips.push(c.wait_pod_running("m", name, T).unwrap().ip);
        c.wait_redirection("m", name, Some("enabled"), T).unwrap();
    }
    let (server, bystander) = (ips[0].clone(), ips[1].clone());
    let from_control_plane = [
        "ztunnel-config",
        "all",
        "--from-control-plane",
        "--xds-address",
        local_cluster::cluster::ISTIOD_ADDR,
        "--xds-san",
        "istiod.istio-system.svc",
        "-o",
        "json",
    ];
    wait_for("istiod-lite to serve the server as HBONE", T, || {
        let dump = c.istioctl(&from_control_plane).ok()?;
        let dump: serde_json::Value = serde_json::from_str(&dump).ok()?;
        has_hbone_workload(&dump, &server).then_some(())
    })
    .unwrap();
    let node_dump = |node: u8| -> serde_json::Value {
        let dump =
            local_cluster::mesh::http_get(&c.node(node).ns, "http://127.0.0.1:15000/config_dump")
                .unwrap();
        serde_json::from_str(&dump).unwrap()
    };
    assert!(
        !has_hbone_workload(&node_dump(1), &server),
        "node-1's ztunnel knows the server before any connection"
    );

    send_ok(&c, "m", "client", &format!("{server}:9000"), 20_000);
    assert_mtls(&c, 2, ("m", "client"), ("m", "server"), 20_000.0);
    let dump = node_dump(1);
    assert!(has_hbone_workload(&dump, &server), "{dump}");
    assert!(
        !has_hbone_workload(&dump, &bystander),
        "node-1's ztunnel fetched a pod nobody connected to: {dump}"
    );

    // A Service VIP comes with its endpoints.
    let svc = local_cluster::objects::service("m", "sink", &[("app", "server")], 80, 9000);
    let svc = c.api().post("/api/v1/namespaces/m/services", &svc).unwrap();
    let vip = svc["spec"]["clusterIP"].as_str().unwrap().to_owned();
    wait_for("istiod-lite to serve the Service", T, || {
        let dump = c.istioctl(&from_control_plane).ok()?;
        let dump: serde_json::Value = serde_json::from_str(&dump).ok()?;
        dump["services"]
            .as_array()?
            .iter()
            .any(|s| s["vips"].to_string().contains(&vip))
            .then_some(())
    })
    .unwrap();
    send_ok(&c, "m", "client", &format!("{vip}:80"), 5_000);
    assert_mtls(&c, 2, ("m", "client"), ("m", "server"), 25_000.0);

    // By name: the DNS proxy asks istiod for a Service nothing has connected to yet.
    let named = local_cluster::objects::service("m", "named", &[("app", "server")], 80, 9000);
    let named = c
        .api()
        .post("/api/v1/namespaces/m/services", &named)
        .unwrap();
    let named_vip = named["spec"]["clusterIP"].as_str().unwrap().to_owned();
    wait_for("istiod-lite to serve the second Service", T, || {
        let dump = c.istioctl(&from_control_plane).ok()?;
        dump.contains(&named_vip).then_some(())
    })
    .unwrap();
    assert_resolves(&c, "named", &named_vip);
}

/// Two istiod-lite replicas behind istiod's Service: killing the one the ztunnels
/// stream from moves them to the other within their backoff; traffic and new
/// connections go on, a pod created during the failover gets its certificate and is
/// reachable, and no ztunnel stops being ready.
#[test]
fn ztunnels_fail_over_to_the_other_istiod_replica() {
    if !test_support::can_run_root_tests() {
        return;
    }
    let _s = serial();
    let mut c = LocalCluster::with_istiod_replicas("rep", 2).unwrap();
    c.create_namespace("m", &[AMBIENT]).unwrap();
    c.wait_ztunnels_ready(T).unwrap();
    let server = ambient_pod(&c, "server", 2, "server", &[], &args(&sink(9000)));
    ambient_pod(&c, "client", 1, "client", &[], IDLE);
    send_ok(&c, "m", "client", &format!("{server}:9000"), 1_000);
    let streams = |c: &LocalCluster, replica: usize| {
        metric_sum(
            &c.control_plane
                .istiod_replica_metrics(replica)
                .unwrap_or_default(),
            "pilot_xds",
            &[],
        )
    };
    wait_for("both ztunnels streaming from a replica", T, || {
        (streams(&c, 0) + streams(&c, 1) == 2.0).then_some(())
    })
    .unwrap();
    let victim = if streams(&c, 0) >= 1.0 { 0 } else { 1 };
    let survivor = 1 - victim;

    c.control_plane.kill_istiod_replica(victim);
    c.create_pod("m", "late", 2, "late", &[], &args(&sink(9000)))
        .unwrap();
    wait_for("both ztunnels streaming from the survivor", T, || {
        for node in [1u8, 2] {
            assert!(
                c.node(node).ztunnel_ready(),
                "node {node}'s ztunnel went unready during the failover"
            );
        }
        (streams(&c, survivor) == 2.0).then_some(())
    })
    .unwrap();

    let late = c.wait_pod_running("m", "late", T).unwrap().ip;
    c.wait_redirection("m", "late", Some("enabled"), T).unwrap();
    for node in [1u8, 2] {
        c.wait_ztunnel_sees_hbone(node, &late, T).unwrap();
    }
    send_ok(&c, "m", "client", &format!("{late}:9000"), 7_000);
    assert_mtls(&c, 2, ("m", "client"), ("m", "late"), 7_000.0);
    send_ok(&c, "m", "client", &format!("{server}:9000"), 2_000);
    assert_mtls(&c, 2, ("m", "client"), ("m", "server"), 3_000.0);
}

/// A rolling update of istiod-lite (each replica stopped as a pod is, then started
/// again, one at a time) under traffic: the long-lived connection never breaks, new
/// connections keep working after each step, and no ztunnel goes unready.
#[test]
fn a_rolling_update_of_istiod_loses_no_connection() {
    if !test_support::can_run_root_tests() {
        return;
    }
    let _s = serial();
    let mut c = LocalCluster::with_istiod_replicas("rol", 2).unwrap();
    c.create_namespace("m", &[AMBIENT]).unwrap();
    c.wait_ztunnels_ready(T).unwrap();
    let echo = ["e2e-app", "echo", "--listen", "0.0.0.0:9001"];
    let server = ambient_pod(&c, "server", 2, "server", &[], &echo);
    ambient_pod(&c, "client", 1, "client", &[], IDLE);
    let target = format!("{server}:9001");
    let mut ping = long_ping(&c, &target);
    let once = ["e2e-app", "ping", "--connect", &target, "--count", "1"];
    for replica in 0..2 {
        c.control_plane.stop_istiod_replica(replica);
        c.control_plane.start_istiod_replica(replica).unwrap();
        for node in [1u8, 2] {
            assert!(
                c.node(node).ztunnel_ready(),
                "node {node}'s ztunnel is not ready"
            );
        }
        c.exec_in_pod("m", "client", &once)
            .unwrap_or_else(|e| panic!("a new connection after restarting istiod-{replica}: {e}"));
    }
    let status = ping.wait_timeout(T).expect("ping finished");
    assert!(status.success(), "the connection broke: {}", ping.log());
    assert_mtls(&c, 2, ("m", "client"), ("m", "server"), 62.0 * 64.0);
}

// ---------------------------------------------------------------- dual-stack

#[test]
fn a_dual_stack_cluster_carries_both_families_over_hbone() {
    if !test_support::can_run_root_tests() {
        return;
    }
    let _s = serial();
    let c = LocalCluster::dual_stack("ds6").unwrap();
    c.create_namespace("m", &[AMBIENT]).unwrap();
    c.wait_ztunnels_ready(T).unwrap();
    // `[::]` accepts both families; the sink reports IPv4 peers unmapped.
    let sink6 = ["e2e-app", "sink", "--listen", "[::]:9000"];
    ambient_pod(&c, "server", 2, "server", &[("app", "server")], &sink6);
    ambient_pod(&c, "near", 1, "near", &[("app", "near")], &sink6);
    ambient_pod(&c, "client", 1, "client", &[], IDLE);
    let ips = |name| c.pod("m", name).unwrap().ips;
    let (client, server, near) = (ips("client"), ips("server"), ips("near"));
    assert!(
        client.len() == 2 && client[1].starts_with("fd00:10:244:1::"),
        "{client:?}"
    );
    let pod = c.get_pod("m", "client").unwrap();
    assert_eq!(pod["status"]["podIPs"][1]["ip"], client[1].as_str());

    // Pod to pod across nodes and on one node, each family; the server sees the
    // client's address of that family, and every byte crossed HBONE over mTLS.
    let bracket = |ip: &str| {
        if ip.contains(':') {
            format!("[{ip}]")
        } else {
            ip.to_owned()
        }
    };
    let mut sent = [0.0, 0.0];
    for (node, dst) in [(2u8, &server), (1, &near)] {
        for family in 0..2 {
            let target = format!("{}:9000", bracket(&dst[family]));
            let answer = send_ok(&c, "m", "client", &target, 10_000);
            let peer = answer["peer"].as_str().unwrap_or_default();
            let expected = format!("{}:", bracket(&client[family]));
            assert!(peer.starts_with(&expected), "{target}: server saw {peer}");
            sent[usize::from(node) - 1] += 10_000.0;
        }
    }
    assert_mtls(&c, 2, ("m", "client"), ("m", "server"), sent[1]);
    assert_mtls(&c, 1, ("m", "client"), ("m", "near"), sent[0]);

    // A dual-stack Service: a ClusterIP of each family, each routed to the endpoint
    // over HBONE, and AAAA answered by ztunnel's DNS proxy.
    let mut svc = local_cluster::objects::service("m", "sink", &[("app", "server")], 80, 9000);
    svc["spec"]["ipFamilyPolicy"] = "PreferDualStack".into();
    let svc = c.api().post("/api/v1/namespaces/m/services", &svc).unwrap();
    let vips: Vec<String> = serde_json::from_value(svc["spec"]["clusterIPs"].clone()).unwrap();
    assert!(
        vips.len() == 2 && vips[1].starts_with("fd00:10:96::"),
        "{svc}"
    );
    assert_eq!(
        svc["spec"]["ipFamilies"],
        serde_json::json!(["IPv4", "IPv6"])
    );
    for vip in &vips {
        let answer = send_ok(&c, "m", "client", &format!("{}:80", bracket(vip)), 5_000);
        assert_eq!(answer["bytes"], 5_000);
    }
    assert_mtls(&c, 2, ("m", "client"), ("m", "server"), sent[1] + 10_000.0);
    let v6 = c
        .exec_in_pod("m", "client", &["getent", "ahostsv6", "sink"])
        .unwrap();
    assert!(v6.contains(&vips[1]), "{v6}");

    // A policy denying node-1's IPv6 pod range to `near`: IPv6 is refused, IPv4 from
    // the same client still passes.
    c.kubectl_apply(
        "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: deny-v6, namespace: m}\n\
         spec:\n  selector: {matchLabels: {app: near}}\n  action: DENY\n  rules:\n  \
         - from: [{source: {ipBlocks: [\"fd00:10:244:1::/64\"]}}]\n",
    )
    .unwrap();
    let near6 = format!("[{}]:9000", near[1]);
    wait_for("the policy to deny IPv6", T, || {
        c.send("m", "client", &near6, 100).err()
    })
    .unwrap();
    send_ok(&c, "m", "client", &format!("{}:9000", near[0]), 100);
}

// ---------------------------------------------------------------- waypoints

/// `GET url` from `m/client`: the status and body (e2e-app prints the body of a 200
/// and fails naming the status line otherwise).
fn http_get(c: &LocalCluster, url: &str) -> (u16, String) {
    match c.exec_in_pod("m", "client", &["e2e-app", "get", url]) {
        Ok(body) => (200, body),
        Err(e) => {
            let text = e.to_string();
            let status = text
                .split("answered HTTP/1.")
                .nth(1)
                .and_then(|rest| rest.get(2..5))
                .and_then(|code| code.parse().ok())
                .unwrap_or(0);
            (status, text)
        }
    }
}

/// The waypoint pods' logs and state, for a failure message.
fn waypoint_diagnostics(c: &LocalCluster) -> String {
    c.pod_names_in("m")
        .into_iter()
        .filter(|n| n.starts_with("waypoint"))
        .map(|n| {
            let log = c.pod_log("m", &n).unwrap_or_default();
            format!("{n}:\n{log}\n{}", c.diagnostics("m", &n))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_namespace_bound_to_a_waypoint_gets_its_l7_policy_and_request_metrics() {
    if !test_support::can_run_root_tests() {
        return;
    }
    let _s = serial();
    let c = mesh_cluster("wpt");
    let http = ["e2e-app", "http", "--listen", "0.0.0.0:9002"];
    ambient_pod(&c, "server", 2, "server", &[("app", "server")], &http);
    ambient_pod(&c, "client", 1, "client", &[], IDLE);
    // The port's name says HTTP, as Istio reads it.
    let svc = serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "m"},
        "spec": {"selector": {"app": "server"},
                 "ports": [{"name": "http-web", "port": 80, "targetPort": 9002}]},
    });
    let svc = c.api().post("/api/v1/namespaces/m/services", &svc).unwrap();
    let vip = svc["spec"]["clusterIP"].as_str().unwrap().to_owned();
    let url = |path: &str| format!("http://{vip}:80{path}");
    wait_for("the Service before any waypoint", T, || {
        (http_get(&c, &url("/before")).0 == 200).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}: {:?}", http_get(&c, &url("/before"))));

    // Istio's flow: a waypoint for the namespace, then a policy on its Gateway.
    let applied = c
        .istioctl(&[
            "waypoint",
            "apply",
            "-n",
            "m",
            "--enroll-namespace",
            "--wait",
            "--timeout",
            "60s",
        ])
        .unwrap_or_else(|e| panic!("{e}\n{}", waypoint_diagnostics(&c)));
    assert!(applied.contains("waypoint m/waypoint applied"), "{applied}");
    // proxy-status lists it beside the ztunnels, its policies in sync.
    let mut status_args = c.proxy_status_args();
    status_args.extend(["-o".into(), "json".into()]);
    let status_args: Vec<&str> = status_args.iter().map(String::as_str).collect();
    wait_for("the waypoint SYNCED in proxy-status", T, || {
        let proxies: Vec<serde_json::Value> =
            serde_json::from_str(&c.istioctl(&status_args).ok()?).ok()?;
        proxies
            .into_iter()
            .find(|p| {
                p["proxy_type"] == "waypoint"
                    && p["identity"] == principal("m", "waypoint")
                    && p["waypoint_policy"]["state"] == "SYNCED"
                    && p["address"]["state"] == "SYNCED"
            })
            .map(drop)
    })
    .unwrap();
    c.kubectl_apply(
        "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: no-admin, namespace: m}\n\
         spec:\n  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: waypoint}]\n  action: DENY\n  \
         rules:\n  - to: [{operation: {paths: [\"/admin*\"]}}]\n",
    )
    .unwrap();
    wait_for("the waypoint to deny /admin", T, || {
        let (status, body) = http_get(&c, &url("/admin/x"));
        (status == 403).then_some(body)
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", c.diagnostics("m", "client")));
    let (status, body) = http_get(&c, &url("/hello"));
    assert_eq!(status, 200, "{body}");

    // Each hop from its metrics: the server's ztunnel saw the waypoint's identity, the
    // waypoint counted both requests for the client.
    assert_mtls(&c, 2, ("m", "waypoint"), ("m", "server"), 1.0);
    let waypoint_ip = c
        .get_pod(
            "m",
            &c.pod_names_in("m")
                .into_iter()
                .find(|n| n.starts_with("waypoint"))
                .unwrap(),
        )
        .unwrap()["status"]["podIP"]
        .as_str()
        .unwrap()
        .to_owned();
    let metrics = c
        .exec_in_pod(
            "m",
            "client",
            &[
                "e2e-app",
                "get",
                &format!("http://{waypoint_ip}:15020/metrics"),
            ],
        )
        .unwrap();
    let requests = |code: &str| {
        metric_sum(
            &metrics,
            "istio_requests_total",
            &[
                ("reporter", "waypoint"),
                ("response_code", code),
                ("source_principal", &principal("m", "client")),
                ("destination_service", "web.m.svc.cluster.local"),
            ],
        )
    };
    assert!(
        requests("200") >= 1.0 && requests("403") >= 1.0,
        "{metrics}"
    );

    // `istio.io/use-waypoint: none` on the Service opts it out: /admin is allowed.
    c.kubectl(&[
        "label",
        "service",
        "-n",
        "m",
        "web",
        "istio.io/use-waypoint=none",
    ])
    .unwrap();
    wait_for("the Service to leave the waypoint", T, || {
        (http_get(&c, &url("/admin/x")).0 == 200).then_some(())
    })
    .unwrap();

    // The waypoint deleted: bound traffic is refused, never sent around it.
    c.kubectl(&[
        "label",
        "service",
        "-n",
        "m",
        "web",
        "istio.io/use-waypoint-",
    ])
    .unwrap();
    wait_for("the Service back on its waypoint", T, || {
        (http_get(&c, &url("/admin/x")).0 == 403).then_some(())
    })
    .unwrap();
    let deleted = c
        .istioctl(&["waypoint", "delete", "-n", "m", "waypoint"])
        .unwrap();
    assert!(deleted.contains("deleted"), "{deleted}");
    wait_for("the waypoint's traffic to be refused", T, || {
        (http_get(&c, &url("/hello")).0 == 0).then_some(())
    })
    .unwrap();
    wait_for(
        "the waypoint's Deployment to go with its Gateway",
        T,
        || {
            c.kubectl(&["get", "deployment", "-n", "m", "waypoint"])
                .is_err()
                .then_some(())
        },
    )
    .unwrap();
}
