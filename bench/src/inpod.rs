//! In-pod mode: ztunnel's ZDS add-to-ack time and its memory per enrolled (idle)
//! pod, driven by the ZDS test double of the node agent; and new connections and
//! round trips between pods on two nodes, each pod captured by Istio's in-pod rules
//! and served by its node's ztunnel, against two pods outside the mesh on the same
//! nodes.

use redirection::InpodRules;
use std::time::Duration;

use anyhow::{Context, Result};
use local_cluster::mesh;
use local_cluster::zds_agent::FakeAgent;
use shared_types::zds::WorkloadInfo;
use test_support::netns::Netns;
use test_support::poll::wait_for;
use test_support::process::ChildGuard;
use test_support::topology::{connect_nodes, Node, Pod};

use crate::report::{added, median, percentile, single, Figure};
use crate::standalone::{churn_to, ping_to};
use crate::Plan;
use test_support::procfs::rss_kib;

pub fn run(plan: &Plan) -> Result<Vec<Figure>> {
    let mut figures = zds_adds(plan)?;
    figures.extend(pod_to_pod(plan)?);
    Ok(figures)
}

fn zds_adds(plan: &Plan) -> Result<Vec<Figure>> {
    eprintln!("in-pod: ZDS add of {} pods to one ztunnel...", plan.pods);
    let dir = tempfile::tempdir()?;
    let ca = dir.path().join("ca");
    mesh::ca_init(&ca)?;
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, "workloads: []\n")?;
    let node = Netns::new("zdsnode")?;
    let agent = FakeAgent::start(&dir.path().join("ztunnel.sock"))?;
    let ztunnel = mesh::start_shared_ztunnel(&node, &agent.socket, &ca, &config, &[])?;
    agent.wait_for_hellos(1, Duration::from_secs(10))?;
    let rss_before = rss_kib(ztunnel.pid()) as f64;

    let mut pods = Vec::new();
    let mut acks_ms = Vec::new();
    for i in 0..plan.pods {
        let pod = Netns::new(&format!("zp{i}"))?;
        let info = WorkloadInfo {
            name: format!("pod-{i}"),
            namespace: "bench".into(),
            // A service account each: every add also mints a certificate.
            service_account: format!("sa-{i}"),
        };
        let (answer, took) = agent.add(&format!("uid-{i}"), info, &pod.path())?;
        if let Err(reason) = answer {
            anyhow::bail!("ztunnel refused pod {i}: {reason}");
        }
        acks_ms.push(took.as_secs_f64() * 1000.0);
        pods.push(pod);
    }
    std::thread::sleep(Duration::from_millis(200));
    let rss_after = rss_kib(ztunnel.pid()) as f64;
    let pct = |p| percentile(&acks_ms, p);
    let mut figures = vec![
        single("ZDS add to ack p50 (incl. cert mint)", "ms", pct(0.5), ""),
        single(
            "ZDS add to ack p99 (incl. cert mint)",
            "ms",
            pct(0.99),
            "< 5 ms",
        ),
        single("ztunnel RSS, no pods", "MiB", rss_before / 1024.0, ""),
        single(
            &format!("ztunnel RSS, {} idle pods", plan.pods),
            "MiB",
            rss_after / 1024.0,
            "",
        ),
        single(
            "ztunnel memory per idle pod",
            "KiB",
            (rss_after - rss_before) / plan.pods as f64,
            "< 100 KiB",
        ),
    ];
    figures[1].samples_mesh = acks_ms;
    drop(ztunnel);
    drop(pods);
    Ok(figures)
}

const ECHO_PORT: u16 = 9001;

/// New connections (pool warm) and 64-byte round trips from a pod on node 1 to a pod
/// on node 2: enrolled pods through both nodes' ztunnels, against two pods outside
/// the mesh on the same bridges and link. Rounds alternate direct and mesh.
fn pod_to_pod(plan: &Plan) -> Result<Vec<Figure>> {
    eprintln!("in-pod: connections between pods on two nodes, mesh against direct...");
    let dir = tempfile::tempdir()?;
    let ca = dir.path().join("ca");
    mesh::ca_init(&ca)?;
    let nodes = [Node::new("ipb", 1)?, Node::new("ipb", 2)?];
    connect_nodes(&nodes[0], &nodes[1])?;
    let client = nodes[0].add_pod("ipb", "client")?;
    let plain_client = nodes[0].add_pod("ipb", "pclient")?;
    let server = nodes[1].add_pod("ipb", "server")?;
    let plain_server = nodes[1].add_pod("ipb", "pserver")?;
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "workloads:\n{}{}",
            workload(&client, "node1"),
            workload(&server, "node2")
        ),
    )?;

    let mut agents = Vec::new();
    let mut ztunnels = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        let name = format!("node{}", i + 1);
        let agent = FakeAgent::start(&dir.path().join(format!("{name}.sock")))?;
        let env = [("NODE_NAME", name.as_str())];
        ztunnels.push(mesh::start_shared_ztunnel(
            &node.ns,
            &agent.socket,
            &ca,
            &config,
            &env,
        )?);
        agent.wait_for_hellos(1, Duration::from_secs(10))?;
        agents.push(agent);
    }
    for (agent, pod) in agents.iter().zip([&client, &server]) {
        local_cluster::inpod::capture(pod, &InpodRules::default())?;
        let info = WorkloadInfo {
            name: pod.name.clone(),
            namespace: "bench".into(),
            service_account: "default".into(),
        };
        if let Err(reason) = agent
            .add(&format!("uid-{}", pod.name), info, &pod.ns.path())?
            .0
        {
            anyhow::bail!("ztunnel refused {}: {reason}", pod.name);
        }
    }
    let app = test_support::built_binary("e2e-app")?;
    let app = app.to_str().context("path")?;
    let mut echoes = Vec::new();
    for pod in [&server, &plain_server] {
        let mut cmd = pod.ns.command(app);
        cmd.args(["echo", "--listen", &format!("0.0.0.0:{ECHO_PORT}")]);
        echoes.push(ChildGuard::spawn(&format!("echo-{}", pod.name), cmd)?);
    }
    // Direct first, then mesh: a new connection each way (the mesh's warms the pool).
    let pairs = [(&plain_client, &plain_server), (&client, &server)];
    for (from, to) in pairs {
        wait_for("the echo server", Duration::from_secs(10), || {
            churn_to(&from.ns, &to.ip, ECHO_PORT, 1, 64).ok()
        })?;
    }

    const ROUNDS: u64 = 5;
    let (mut setup, mut round_trip) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
    for _ in 0..ROUNDS {
        for (i, (from, to)) in pairs.iter().enumerate() {
            let churn = churn_to(
                &from.ns,
                &to.ip,
                ECHO_PORT,
                (plan.churn / ROUNDS).max(1),
                64,
            )?;
            setup[i].push(churn["p50_us"].as_f64().unwrap_or(0.0));
            let pings = ping_to(&from.ns, &to.ip, ECHO_PORT, (plan.pings / ROUNDS).max(1), 0)?;
            round_trip[i].push(pings["p50_us"].as_f64().unwrap_or(0.0));
        }
    }
    let figures = vec![
        added(
            "in-pod: added setup latency p50 (pool warm), pods on two nodes",
            median(&setup[0]),
            median(&setup[1]),
            "",
        ),
        added(
            "in-pod: added round-trip latency p50, 64 B, pods on two nodes",
            median(&round_trip[0]),
            median(&round_trip[1]),
            "",
        ),
    ];
    drop(echoes);
    drop(ztunnels);
    Ok(figures)
}

/// `pod` in ztunnel's local config: HBONE, on `node`.
fn workload(pod: &Pod, node: &str) -> String {
    format!(
        "- uid: uid-{name}\n  name: {name}\n  namespace: bench\n  serviceAccount: default\n  workloadIps: [\"{ip}\"]\n  protocol: HBONE\n  node: {node}\n",
        name = pod.name,
        ip = pod.ip
    )
}
