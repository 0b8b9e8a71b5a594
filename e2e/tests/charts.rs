//! The charts against the binaries they run: every environment variable a chart sets
//! is one its binary reads (a misspelt or stale name would be silently ignored), and
//! the cni chart's DaemonSet runs the node agent on the local cluster from its own
//! pod spec (volumes, capabilities, probes, env), enrolling pods into the mesh.

use std::time::Duration;

use e2e::charts::{install_manifests, unread_env};
use e2e::cluster::LocalCluster;
use e2e::process::wait_for;
use serde_json::Value;

const T: Duration = Duration::from_secs(30);

/// Value sets whose renders differ in the environment they give.
const VARIANTS: &[&[&str]] = &[
    &[],
    &[
        "ztunnel.discovery.source=local",
        "ztunnel.crds.enabled=true",
    ],
    &["cni.nativeNftables=true", "cni.ambient.dnsCapture=false"],
];

#[test]
fn every_env_var_the_charts_set_is_read_by_its_binary() {
    if !e2e::prerequisite(
        istioctl_lite_charts_render(),
        "helm on PATH (scripts/install-chart-tools.sh)",
    ) {
        return;
    }
    for sets in VARIANTS {
        let objects = install_manifests(sets).unwrap();
        let containers = e2e::charts::containers(&objects).unwrap();
        // The mesh's three workloads, each with a non-empty environment.
        for workload in [
            "DaemonSet/istio-cni-node",
            "DaemonSet/ztunnel",
            "Deployment/istiod",
        ] {
            let c = containers.iter().find(|c| c.workload == workload);
            assert!(
                c.is_some_and(|c| !c.env_names.is_empty()),
                "{workload} with env in {sets:?}: {containers:#?}"
            );
        }
        let unread = unread_env(&objects).unwrap();
        assert!(
            unread.is_empty(),
            "with --set {sets:?}, names the binaries do not read:\n{}",
            unread.join("\n")
        );
    }
}

fn istioctl_lite_charts_render() -> bool {
    std::process::Command::new("helm")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn ds_status(c: &LocalCluster) -> Value {
    let ds = c
        .kubectl(&[
            "-n",
            "istio-system",
            "get",
            "ds",
            "istio-cni-node",
            "-o",
            "json",
        ])
        .unwrap();
    serde_json::from_str::<Value>(&ds).unwrap()["status"].clone()
}

#[test]
fn the_cni_charts_daemonset_runs_the_node_agent_that_enrolls_pods() {
    if !e2e::can_run_root_tests() {
        return;
    }
    let c = LocalCluster::with_agent_from_chart("chcni", &[]).unwrap();
    let status = ds_status(&c);
    for field in [
        "desiredNumberScheduled",
        "numberReady",
        "updatedNumberScheduled",
    ] {
        assert_eq!(status[field], 2, "{field}: {status}");
    }
    // One agent pod per node, in the node's network namespace, as the chart says.
    let pods = c
        .api()
        .list("/api/v1/namespaces/istio-system/pods?labelSelector=k8s-app%3Distio-cni-node")
        .unwrap();
    let mut nodes: Vec<&str> = pods
        .iter()
        .filter_map(|p| p["spec"]["nodeName"].as_str())
        .collect();
    nodes.sort();
    assert_eq!(nodes, ["node-1", "node-2"]);
    for p in &pods {
        assert_eq!(p["status"]["podIP"], p["status"]["hostIP"], "hostNetwork");
    }

    // The command the plugin's errors suggest works: the agent's pods log.
    let logs = c
        .kubectl(&["-n", "istio-system", "logs", "ds/istio-cni-node"])
        .unwrap();
    assert!(logs.contains("cni_agent"), "the agent's log: {logs}");
    c.create_namespace("m", &[("istio.io/dataplane-mode", "ambient")])
        .unwrap();
    c.wait_ztunnels_ready(T).unwrap();
    let mut ips = Vec::new();
    for (name, node, argv) in [
        (
            "server",
            2,
            &["e2e-app", "sink", "--listen", "0.0.0.0:9000"][..],
        ),
        ("client", 1, &["sleep", "3600"][..]),
    ] {
        c.create_pod("m", name, node, name, &[], argv).unwrap();
        let p = c.wait_pod_running("m", name, T).unwrap();
        c.wait_redirection("m", name, Some("enabled"), T)
            .unwrap_or_else(|e| panic!("{e:#}\n{}", c.system_pod_logs()));
        assert_eq!(
            c.redirection_of("m", name).unwrap(),
            e2e::cluster::expected_redirection()
        );
        for n in 1..=2 {
            c.wait_ztunnel_sees_hbone(n, &p.ip, T).unwrap();
        }
        ips.push(p.ip);
    }
    let answer = c
        .send("m", "client", &format!("{}:9000", ips[0]), 10_000)
        .unwrap();
    assert_eq!(answer["bytes"], 10_000, "{answer}");
    let metrics = c.node(2).ztunnel_metrics().unwrap();
    let mtls = e2e::mesh::metric_sum(
        &metrics,
        "istio_tcp_received_bytes_total",
        &[
            ("source_principal", "spiffe://cluster.local/ns/m/sa/client"),
            ("connection_security_policy", "mutual_tls"),
        ],
    );
    assert!(mtls >= 10_000.0, "the bytes crossed HBONE: {mtls}");

    // Every command `make demo-up` prints works here, in a root shell.
    let commands = c.try_it_commands().unwrap();
    let (alias, lines) = commands.split_first().unwrap();
    for line in lines {
        let script = format!("set -e\n{alias}\n{line}\n");
        wait_for(line, T, || {
            let out = std::process::Command::new("bash")
                .args(["-O", "expand_aliases", "-c", &script])
                .output()
                .ok()?;
            out.status.success().then_some(())
        })
        .unwrap_or_else(|e| panic!("{e:#}"));
    }

    // Upgrade: a changed value rolls the DaemonSet node by node (maxUnavailable 1);
    // a connection between enrolled pods lives through both agents' replacement.
    let echo = ["e2e-app", "echo", "--listen", "0.0.0.0:9001"];
    c.create_pod("m", "echo", 2, "echo", &[], &echo).unwrap();
    let echo_ip = c.wait_pod_running("m", "echo", T).unwrap().ip;
    c.wait_redirection("m", "echo", Some("enabled"), T).unwrap();
    for n in 1..=2 {
        c.wait_ztunnel_sees_hbone(n, &echo_ip, T).unwrap();
    }
    let target = format!("{echo_ip}:9001");
    let ping = [
        "e2e-app",
        "ping",
        "--connect",
        &target,
        "--count",
        "300",
        "--interval-ms",
        "100",
    ];
    let mut ping = c.spawn_in_pod("m", "client", &ping).unwrap();
    std::thread::sleep(Duration::from_secs(1));
    let old_pods = agent_pods(&c);
    let mut values = vec!["logLevel=debug".to_owned()];
    values.push(format!(
        "nativeNftables={}",
        e2e::cluster::native_nftables()
    ));
    c.install_agent_chart(&values).unwrap();
    let new_pods = agent_pods(&c);
    assert_eq!(new_pods.len(), 2);
    assert!(
        new_pods.iter().all(|p| !old_pods.contains(p)),
        "both agents replaced: {old_pods:?} -> {new_pods:?}"
    );
    for node in [1u8, 2] {
        let ns = &c.node(node).ns;
        wait_for(
            &format!("node-{node}'s new agent to restore its pods"),
            T,
            || {
                let m = e2e::mesh::http_get(ns, "http://127.0.0.1:15014/metrics").ok()?;
                let connected = e2e::mesh::metric_sum(&m, "istio_cni_zds_connections", &[]) == 1.0;
                let restored = e2e::mesh::metric_sum(&m, "istio_cni_pods_enrolled", &[]) >= 1.0;
                (connected && restored).then_some(())
            },
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", c.system_pod_logs()));
    }
    let status = ping
        .wait_timeout(Duration::from_secs(60))
        .expect("ping finished");
    assert!(
        status.success(),
        "the connection broke during the rollout: {}",
        ping.log()
    );
    c.shutdown().unwrap();
}

/// The names of the agent's pods.
fn agent_pods(c: &LocalCluster) -> Vec<String> {
    c.api()
        .list("/api/v1/namespaces/istio-system/pods?labelSelector=k8s-app%3Distio-cni-node")
        .unwrap()
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
        .collect()
}
