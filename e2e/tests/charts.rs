//! The charts against the binaries they run: every environment variable a chart sets
//! is one its binary reads (a misspelt or stale name would be silently ignored), and
//! `istioctl-lite install` runs the whole mesh on the local cluster from the charts'
//! own pod specs (volumes, capabilities, probes, env): enrollment, upgrades under
//! traffic, uninstall.

use std::time::Duration;

use local_cluster::charts::{install_manifests, unread_env};
use local_cluster::cluster::LocalCluster;
use serde_json::Value;
use test_support::poll::wait_for;

const T: Duration = Duration::from_secs(30);

/// Value sets whose renders differ in the environment they give.
const VARIANTS: &[&[&str]] = &[
    &[],
    &["ztunnel.discovery.source=local"],
    &["cni.nativeNftables=true", "cni.ambient.dnsCapture=false"],
];

#[test]
fn every_env_var_the_charts_set_is_read_by_its_binary() {
    if !test_support::prerequisite(
        istioctl_lite_charts_render(),
        "helm on PATH (scripts/install-chart-tools.sh)",
    ) {
        return;
    }
    for sets in VARIANTS {
        let objects = install_manifests(sets).unwrap();
        let containers = local_cluster::charts::containers(&objects).unwrap();
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

/// With the built image (`MESH_IMAGE=image`, as CI runs it): the charts installed are
/// the packaged archives pinned to its digest when `MESH_CHARTS=packaged`, and every
/// mesh process runs in a root that is the image's (its binary is the image's, byte
/// for byte, and its `/` holds the image's Debian packages, not the host's
/// distribution). Otherwise the pods run the workspace's binaries, which the test says.
fn check_image_source(c: &LocalCluster) {
    use local_cluster::images::{mesh_image, MeshImage};
    let image = match mesh_image().unwrap() {
        MeshImage::Built(image) => image,
        MeshImage::Binaries(why) => {
            assert_ne!(
                std::env::var("MESH_IMAGE").as_deref(),
                Ok("image"),
                "MESH_IMAGE=image"
            );
            eprintln!("the mesh's pods ran the workspace's binaries: {why}");
            return;
        }
    };
    if std::env::var("MESH_CHARTS").as_deref() == Ok("packaged") {
        let pods = c
            .api()
            .list("/api/v1/namespaces/istio-system/pods")
            .unwrap();
        for p in &pods {
            assert_eq!(
                p["spec"]["containers"][0]["image"],
                format!("{}:{}@{}", image.repository, image.version, image.digest),
                "{} from the packaged chart, pinned",
                p["metadata"]["name"]
            );
        }
    }
    let rootfs = image.rootfs().unwrap();
    let marker = test_support::owner::cluster_marker("chall");
    let mut seen = std::collections::BTreeSet::new();
    for (pid, cmdline) in test_support::owner::marked_processes(&marker) {
        let Some(binary) = ["ztunnel", "cni-agent", "istiod-lite"]
            .into_iter()
            .find(|b| cmdline.starts_with(&format!("/usr/local/bin/{b}")))
        else {
            continue;
        };
        let root = std::path::PathBuf::from(format!("/proc/{pid}/root"));
        let Ok(running) = std::fs::read(root.join("usr/local/bin").join(binary)) else {
            continue; // exited meanwhile
        };
        assert!(
            running == std::fs::read(rootfs.join("usr/local/bin").join(binary)).unwrap(),
            "pid {pid} ({cmdline}) runs the image's {binary}"
        );
        let packages = std::fs::read_dir(root.join("var/lib/dpkg/status.d"))
            .map(|d| d.count())
            .unwrap_or(0);
        assert!(packages > 0, "pid {pid}'s root is the image's");
        assert!(
            !root.join("usr/bin/dpkg").exists() && !root.join("bin/sh").exists(),
            "pid {pid}'s root has no dpkg or shell: not the host's distribution"
        );
        seen.insert(binary);
    }
    assert_eq!(
        seen.into_iter().collect::<Vec<_>>(),
        ["cni-agent", "istiod-lite", "ztunnel"],
        "every mesh binary ran from the image"
    );
}

fn istioctl_lite_charts_render() -> bool {
    std::process::Command::new("helm")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn istioctl_lite_install_runs_the_whole_mesh_from_the_charts() {
    if !test_support::can_run_root_tests() {
        return;
    }
    let c = LocalCluster::with_mesh_from_charts("chall", INSTALL).unwrap();
    assert!(c.control_plane.istiods.is_empty(), "no harness istiod");
    for n in 1..=2 {
        assert!(c.node(n).ztunnel.is_none() && c.node(n).agent.is_none());
    }
    let deployment = kubectl_json(&c, &["get", "deployment", "istiod"]);
    assert!(
        deployment["status"]["availableReplicas"].as_u64() >= Some(1),
        "{deployment}"
    );
    for ds in ["ztunnel", "istio-cni-node"] {
        let status = kubectl_json(&c, &["get", "ds", ds])["status"].clone();
        for field in [
            "desiredNumberScheduled",
            "numberReady",
            "updatedNumberScheduled",
        ] {
            assert_eq!(status[field], 2, "{ds} {field}: {status}");
        }
    }
    // One agent pod per node, in the node's network namespace; ztunnel and istiod in
    // pod namespaces of their own, as the charts say.
    let pods = c
        .api()
        .list("/api/v1/namespaces/istio-system/pods")
        .unwrap();
    let (agents, others): (Vec<&Value>, Vec<&Value>) = pods
        .iter()
        .partition(|p| p["metadata"]["labels"]["k8s-app"] == "istio-cni-node");
    let mut nodes: Vec<&str> = agents
        .iter()
        .filter_map(|p| p["spec"]["nodeName"].as_str())
        .collect();
    nodes.sort();
    assert_eq!(nodes, ["node-1", "node-2"]);
    for p in agents {
        assert_eq!(p["status"]["podIP"], p["status"]["hostIP"], "hostNetwork");
    }
    for p in others {
        assert_ne!(
            p["status"]["podIP"], p["status"]["hostIP"],
            "{}",
            p["metadata"]["name"]
        );
    }
    // Where the pods' containers came from: the image `make image` built (CI, and
    // whenever it is current) or the workspace's binaries.
    check_image_source(&c);

    // The command the plugin's errors suggest works: the agent's pods log.
    let logs = c
        .kubectl(&["-n", "istio-system", "logs", "ds/istio-cni-node"])
        .unwrap();
    assert!(logs.contains("cni_agent"), "the agent's log: {logs}");

    // istioctl-lite reaches istiod by its Service name, as from inside the cluster.
    let xds = c.proxy_status_args();
    let xds: Vec<&str> = xds.iter().map(String::as_str).collect();
    wait_for("both ztunnels SYNCED", T, || {
        let table = c.istioctl(&xds).map_err(|e| eprintln!("{e:#}")).ok()?;
        (table.matches("SYNCED").count() == 4).then_some(table)
    })
    .unwrap();

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
        (
            "echo",
            2,
            &["e2e-app", "echo", "--listen", "0.0.0.0:9001"][..],
        ),
        ("client", 1, &["sleep", "3600"][..]),
    ] {
        c.create_pod("m", name, node, name, &[], argv).unwrap();
        let p = c.wait_pod_running("m", name, T).unwrap();
        c.wait_redirection("m", name, Some("enabled"), T)
            .unwrap_or_else(|e| panic!("{e:#}\n{}", c.system_pod_logs()));
        for n in 1..=2 {
            c.wait_ztunnel_sees_hbone(n, &p.ip, T).unwrap();
        }
        ips.push(p.ip);
    }
    let answer = c
        .send("m", "client", &format!("{}:9000", ips[0]), 10_000)
        .unwrap();
    assert_eq!(answer["bytes"], 10_000, "{answer}");
    let mtls = local_cluster::mesh::metric_sum(
        &c.ztunnel_metrics(2).unwrap(),
        "istio_tcp_received_bytes_total",
        &[
            ("source_principal", "spiffe://cluster.local/ns/m/sa/client"),
            ("connection_security_policy", "mutual_tls"),
        ],
    );
    assert!(mtls >= 10_000.0, "the bytes crossed HBONE: {mtls}");

    // Every command `make demo-up` prints (the demo's cluster is this one) works here,
    // in a root shell.
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

    // The agent's upgrade: a changed value rolls its DaemonSet node by node
    // (maxUnavailable 1); a connection between enrolled pods lives through both
    // agents' replacement, and each new agent restores its pods and its ztunnel.
    let echo = format!("{}:9001", ips[1]);
    let mut ping = c.spawn_ping(("m", "client"), &echo, 200, 50).unwrap();
    std::thread::sleep(Duration::from_secs(1));
    let old_agents = pod_names(&c, "k8s-app%3Distio-cni-node");
    c.istioctl_install(&values(&["cni.logLevel=debug"]))
        .unwrap_or_else(|e| panic!("{e:#}"));
    let new_agents = pod_names(&c, "k8s-app%3Distio-cni-node");
    assert_eq!(new_agents.len(), 2);
    assert!(
        new_agents.iter().all(|p| !old_agents.contains(p)),
        "both agents replaced: {old_agents:?} -> {new_agents:?}"
    );
    for node in [1u8, 2] {
        let ns = &c.node(node).ns;
        wait_for(
            &format!("node-{node}'s new agent to restore its pods"),
            T,
            || {
                let m = local_cluster::mesh::http_get(ns, "http://127.0.0.1:15014/metrics").ok()?;
                let connected =
                    local_cluster::mesh::metric_sum(&m, "istio_cni_zds_connections", &[]) == 1.0;
                let restored =
                    local_cluster::mesh::metric_sum(&m, "istio_cni_pods_enrolled", &[]) >= 1.0;
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
        "the connection broke during the agent's rollout: {}",
        ping.log()
    );

    // ztunnel's rollout under traffic: a long-lived connection, and a new connection
    // every 100 ms, both from node-1 to node-2 through both nodes' ztunnels.
    let old_ztunnels = pod_names(&c, "app%3Dztunnel");
    let mut ping = c.spawn_ping(("m", "client"), &echo, 400, 50).unwrap();
    let mut stream = c
        .spawn_in_pod(
            "m",
            "client",
            &[
                "e2e-app",
                "stream",
                "--connect",
                &echo,
                "--marker",
                "rollout",
                "--interval-ms",
                "100",
                "--duration-secs",
                "25",
            ],
        )
        .unwrap();
    let sampler = Sampler::start(&c);
    std::thread::sleep(Duration::from_secs(1));
    c.istioctl_install(&values(&["cni.logLevel=debug", "ztunnel.logLevel=debug"]))
        .unwrap_or_else(|e| panic!("{e:#}"));
    wait_for("the old ztunnel pods to be gone", T, || {
        let now = pod_names(&c, "app%3Dztunnel");
        (now.len() == 2 && now.iter().all(|p| !old_ztunnels.contains(p))).then_some(())
    })
    .unwrap();
    let per_node = sampler.stop();
    for (node, (most, fewest_ready)) in &per_node {
        // maxSurge 1: the new pod starts beside the old; maxUnavailable 0: the node
        // always has a ready ztunnel.
        assert_eq!(
            (*most, *fewest_ready),
            (2, 1),
            "ztunnel pods on {node} (most, fewest ready)"
        );
    }
    let stream_status = stream
        .wait_timeout(Duration::from_secs(40))
        .expect("stream ended");
    let log = stream.log();
    let lines: Vec<Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let failed: Vec<&Value> = lines.iter().filter(|l| l["ok"] != true).collect();
    assert!(
        stream_status.success() || lines.len() > 100,
        "{}",
        stream.log()
    );
    assert!(lines.len() >= 100, "new connections made: {}", lines.len());
    assert!(
        failed.is_empty(),
        "new connections failed during ztunnel's rollout: {failed:?}"
    );
    // The long-lived connection lives on the old ztunnels, which drain when their pods
    // are deleted: it is closed at the end of the drain (TERMINATION_GRACE_PERIOD,
    // the grace period less 5 s), as with Istio's ztunnel; the client reconnects.
    let ping_status = ping
        .wait_timeout(Duration::from_secs(40))
        .expect("ping ended");
    eprintln!(
        "long-lived connection through the rollout: {ping_status:?}: {}",
        ping.log()
    );
    assert_eq!(
        ping_status.code(),
        Some(3),
        "closed at the drain deadline: {}",
        ping.log()
    );

    // Uninstall refuses while pods are in the mesh: with ztunnel gone their
    // connections would be refused until they restart.
    let refused = format!("{:#}", c.istioctl_uninstall().unwrap_err());
    assert!(
        // `default` too: the demo's commands enrolled a pod there.
        refused.contains("pods in default, m are in the mesh")
            && refused.contains("dataplane-mode disable m"),
        "{refused}"
    );
    assert!(c
        .api()
        .get_opt("/apis/apps/v1/namespaces/istio-system/daemonsets/ztunnel")
        .unwrap()
        .is_some());
    // Taken out of the mesh first (the agents undo their rules), the pods keep
    // talking, in plain TCP, through and after the uninstall.
    for ns in ["default", "m"] {
        c.istioctl(&["dataplane-mode", "disable", ns]).unwrap();
    }
    assert_eq!(c.redirection_of("m", "client").unwrap(), "none");
    // Every chart's object goes but the CA Secret; the agents, rolled to uninstall on
    // exit first, take the plugin out of each node's chain, so new pods do not wait.
    c.istioctl_uninstall().unwrap();
    wait_for("the mesh's pods to be gone", T, || {
        pod_names(&c, "").is_empty().then_some(())
    })
    .unwrap();
    for n in 1..=2 {
        wait_for(&format!("node-{n}'s chain without istio-cni"), T, || {
            (!c.node(n).plugin_installed()).then_some(())
        })
        .unwrap();
    }
    assert!(c
        .api()
        .get_opt("/api/v1/namespaces/istio-system/secrets/cacerts")
        .unwrap()
        .is_some());
    let answer = c
        .send("m", "client", &format!("{}:9000", ips[0]), 1000)
        .unwrap();
    assert_eq!(answer["bytes"], 1000, "{answer}");
    c.label_namespace("m", "istio.io/dataplane-mode", Some("ambient"))
        .unwrap();
    c.create_pod("m", "after", 1, "after", &[], &["sleep", "3600"])
        .unwrap();
    c.wait_pod_running("m", "after", T).unwrap();
    assert_eq!(c.redirection_of("m", "after").unwrap(), "none");
    c.shutdown().unwrap();
}

/// Values of the full install: ztunnel drains for 3 s (8 s grace less 5).
const INSTALL: &[&str] = &["ztunnel.terminationGracePeriodSeconds=8"];

/// The install's values and `changed`, as `istioctl-lite install` takes them again.
fn values(changed: &[&str]) -> Vec<String> {
    let mut values: Vec<String> = INSTALL
        .iter()
        .chain(changed)
        .map(|v| v.to_string())
        .collect();
    values.push(format!(
        "nativeNftables={}",
        local_cluster::cluster::native_nftables()
    ));
    values
}

/// Names of the mesh's pods matching the (escaped) label `selector`.
fn pod_names(c: &LocalCluster, selector: &str) -> Vec<String> {
    c.api()
        .list(&format!(
            "/api/v1/namespaces/istio-system/pods?labelSelector={selector}"
        ))
        .unwrap()
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
        .collect()
}

/// Samples ztunnel's pods every 50 ms: per node, the most pods and fewest ready.
struct Sampler {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<std::collections::BTreeMap<String, (usize, usize)>>,
}

impl Sampler {
    fn start(c: &LocalCluster) -> Self {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (api, flag) = (c.api(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut seen: std::collections::BTreeMap<String, (usize, usize)> = Default::default();
            while !flag.load(Ordering::Relaxed) {
                let pods = api
                    .list("/api/v1/namespaces/istio-system/pods?labelSelector=app%3Dztunnel")
                    .unwrap_or_default();
                for node in ["node-1", "node-2"] {
                    let on: Vec<&Value> = pods
                        .iter()
                        .filter(|p| p["spec"]["nodeName"] == node)
                        .collect();
                    let ready = on
                        .iter()
                        .filter(|p| local_cluster::controllers::ready(p))
                        .count();
                    let entry = seen.entry(node.to_owned()).or_insert((0, usize::MAX));
                    entry.0 = entry.0.max(on.len());
                    entry.1 = entry.1.min(ready);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            seen
        });
        Sampler { stop, thread }
    }

    fn stop(self) -> std::collections::BTreeMap<String, (usize, usize)> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

/// `kubectl -n istio-system <args> -o json`, parsed.
fn kubectl_json(c: &LocalCluster, args: &[&str]) -> Value {
    let mut argv = vec!["-n", "istio-system"];
    argv.extend_from_slice(args);
    argv.extend_from_slice(&["-o", "json"]);
    serde_json::from_str(&c.kubectl(&argv).unwrap()).unwrap()
}
