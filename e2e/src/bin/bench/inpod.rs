//! In-pod mode: ztunnel's ZDS add-to-ack time and its memory per enrolled (idle)
//! pod, driven by the ZDS test double of the node agent.

use std::time::Duration;

use anyhow::Result;
use e2e::mesh;
use e2e::netns::Netns;
use e2e::zds_agent::FakeAgent;
use shared_types::zds::WorkloadInfo;

use crate::procfs::rss_kib;
use crate::report::{percentile, single, Figure};
use crate::Plan;

pub fn run(plan: &Plan) -> Result<Vec<Figure>> {
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
