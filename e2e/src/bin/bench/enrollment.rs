//! The node agent on a local cluster (e2e::cluster): the gated CNI ADD (the
//! `istio-cni` step of the kubelet's chain, which returns only once the pod's rules
//! are in place and ztunnel acked), enrolling running pods after one namespace
//! label, and the agent's and ztunnel's memory per enrolled pod.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use e2e::cluster::LocalCluster;
use e2e::mesh;

use crate::procfs::rss_kib;
use crate::report::{percentile, single, Figure};
use crate::Plan;

pub fn run(plan: &Plan) -> Result<Vec<Figure>> {
    eprintln!(
        "cluster: gated CNI ADD and enrollment of {} pods...",
        plan.pods
    );
    let cluster = LocalCluster::start("bn")?;
    cluster.wait_ztunnels_ready(Duration::from_secs(30))?;
    let node = cluster.node(1);
    let pid = |p: &Option<e2e::process::ChildGuard>| p.as_ref().map_or(0, |c| c.pid());
    let (agent_idle, ztunnel_idle) = (rss_kib(pid(&node.agent)), rss_kib(pid(&node.ztunnel)));
    let app = mesh::binary("e2e-app")?;
    let app = app.to_string_lossy().into_owned();
    let argv = [app.as_str(), "echo", "--listen", "0.0.0.0:9001"];

    // New pods in an ambient namespace: each ADD waits for the agent.
    cluster.create_namespace("bench-cni", &[("istio.io/dataplane-mode", "ambient")])?;
    // One at a time: the figure is a pod's own ADD, not a queue behind others.
    let mut gated_ms = Vec::new();
    for i in 0..plan.pods {
        cluster.create_pod("bench-cni", &format!("p{i}"), 1, "default", &[], &argv)?;
        let pod =
            cluster.wait_pod_running("bench-cni", &format!("p{i}"), Duration::from_secs(120))?;
        if let Some((_, ms)) = pod.cni_add_ms.iter().find(|(kind, _)| kind == "istio-cni") {
            gated_ms.push(*ms);
        }
    }

    // Running pods, enrolled by one namespace label.
    cluster.create_namespace("bench-run", &[])?;
    for i in 0..plan.pods {
        cluster.create_pod("bench-run", &format!("r{i}"), 1, "default", &[], &argv)?;
    }
    for i in 0..plan.pods {
        cluster.wait_pod_running("bench-run", &format!("r{i}"), Duration::from_secs(120))?;
    }
    let started = Instant::now();
    cluster.label_namespace("bench-run", "istio.io/dataplane-mode", Some("ambient"))?;
    let deadline = started + Duration::from_secs(120);
    loop {
        let pods = cluster.api().list("/api/v1/namespaces/bench-run/pods")?;
        let enabled = pods
            .iter()
            .filter(|p| p["metadata"]["annotations"]["ambient.istio.io/redirection"] == "enabled")
            .count();
        if enabled == plan.pods {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "only {enabled} of {} running pods were enrolled in 120 s",
                plan.pods
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let label_to_all = started.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_millis(300));
    let enrolled = 2 * plan.pods;
    let (agent_busy, ztunnel_busy) = (rss_kib(pid(&node.agent)), rss_kib(pid(&node.ztunnel)));

    let pct = |p| percentile(&gated_ms, p);
    let per_pod = |busy: u64, idle: u64| (busy.saturating_sub(idle)) as f64 / enrolled as f64;
    let mut figures = vec![
        single("gated CNI ADD (istio-cni step) p50", "ms", pct(0.5), ""),
        single(
            "gated CNI ADD (istio-cni step) p99",
            "ms",
            pct(0.99),
            "< 20 ms",
        ),
        single(
            &format!(
                "enroll {} running pods after one namespace label",
                plan.pods
            ),
            "s",
            label_to_all,
            "< 2 s for 100",
        ),
        single(
            &format!("agent RSS, {enrolled} pods enrolled"),
            "MiB",
            agent_busy as f64 / 1024.0,
            "",
        ),
        single(
            "agent memory per enrolled pod",
            "KiB",
            per_pod(agent_busy, agent_idle),
            "",
        ),
        single(
            "ztunnel memory per enrolled pod (node)",
            "KiB",
            per_pod(ztunnel_busy, ztunnel_idle),
            "< 100 KiB",
        ),
    ];
    figures[1].samples_mesh = gated_ms;
    Ok(figures)
}
