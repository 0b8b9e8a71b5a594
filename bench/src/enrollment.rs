//! The node agent on a local cluster (`local_cluster`): the gated CNI ADD (the
//! `istio-cni` step of the kubelet's chain, which returns only once the pod's rules
//! are in place and ztunnel acked) with where its time goes, enrolling running pods
//! after one namespace label, and the agent's and ztunnel's memory per enrolled pod.
//! Once per redirection mode, iptables then native nftables, each on its own cluster.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use local_cluster::cluster::LocalCluster;

use crate::report::{percentile, single, Figure};
use crate::Plan;
use test_support::procfs::rss_kib;

/// Where the agent's time on a gated ADD goes, as it logs it (`<step>_us` fields of its
/// "CNI ADD served" and "pod enrolled" lines): finding the pod, checking the netns,
/// the enrollment's steps, the enrollment and the whole ADD as the agent served it.
const STEPS: [&str; 7] = [
    "lookup", "verify", "rules", "probe", "zds", "annotate", "served",
];
/// ztunnel's side of the `zds` step, as it logs it ("serving pod"): the pod's
/// certificate, its listeners, its DNS proxy.
const ZTUNNEL_STEPS: [&str; 3] = ["cert", "listen", "dns"];

pub fn run(plan: &Plan) -> Result<Vec<Figure>> {
    let mut figures = run_mode(plan, "iptables")?;
    figures.extend(run_mode(plan, "nftables")?);
    Ok(figures)
}

fn run_mode(plan: &Plan, mode: &str) -> Result<Vec<Figure>> {
    eprintln!(
        "cluster ({mode}): gated CNI ADD and enrollment of {} pods...",
        plan.pods
    );
    let nftables = mode == "nftables";
    let cluster = LocalCluster::with_native_nftables(if nftables { "bf" } else { "bn" }, nftables)?;
    cluster.wait_ztunnels_ready(Duration::from_secs(30))?;
    let node = cluster.node(1);
    let pid = |p: &Option<test_support::process::ChildGuard>| p.as_ref().map_or(0, |c| c.pid());
    let (agent_idle, ztunnel_idle) = (rss_kib(pid(&node.agent)), rss_kib(pid(&node.ztunnel)));
    let app = test_support::built_binary("e2e-app")?;
    let app = app.to_string_lossy().into_owned();
    let argv = [app.as_str(), "echo", "--listen", "0.0.0.0:9001"];

    // New pods in an ambient namespace: each ADD waits for the agent.
    cluster.create_namespace("bench-cni", &[("istio.io/dataplane-mode", "ambient")])?;
    // One at a time: the figure is a pod's own ADD, not a queue behind others.
    let mut gated_ms = Vec::new();
    let mut gated_by_pod = HashMap::new();
    for i in 0..plan.pods {
        let name = format!("p{i}");
        cluster.create_pod("bench-cni", &name, 1, "default", &[], &argv)?;
        let pod = cluster.wait_pod_running("bench-cni", &name, Duration::from_secs(120))?;
        if let Some((_, ms)) = pod.cni_add_ms.iter().find(|(kind, _)| kind == "istio-cni") {
            gated_ms.push(*ms);
            gated_by_pod.insert(format!("bench-cni/{name}"), *ms);
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

    let log_of = |p: &Option<test_support::process::ChildGuard>| {
        p.as_ref().map(|c| c.log()).unwrap_or_default()
    };
    let lines = log_fields(
        &log_of(&node.agent),
        &["pod enrolled in ambient", "CNI ADD served"],
        ("pod", "bench-cni/"),
    );
    let steps = step_times(&lines, &STEPS);
    let ztunnel_steps = step_times(
        &log_fields(
            &log_of(&node.ztunnel),
            &["serving pod"],
            ("identity", "spiffe://cluster.local/ns/bench-cni/"),
        ),
        &ZTUNNEL_STEPS,
    );
    // Per pod, the gated ADD less the agent's part: the plugin's exec, its request over
    // the agent's socket, and the kubelet reading the result.
    let outside: Vec<f64> = lines
        .iter()
        .filter_map(|fields| {
            let served = fields.get("served_us")?.parse::<f64>().ok()? / 1000.0;
            Some(gated_by_pod.get(fields.get("pod")?.as_str())? - served)
        })
        .collect();
    let pct = |p| percentile(&gated_ms, p);
    let per_pod = |busy: u64, idle: u64| (busy.saturating_sub(idle)) as f64 / enrolled as f64;
    let mut figures = vec![
        single(
            &format!("{mode}: gated CNI ADD (istio-cni step) p50"),
            "ms",
            pct(0.5),
            "",
        ),
        single(
            &format!("{mode}: gated CNI ADD (istio-cni step) p99"),
            "ms",
            pct(0.99),
            "≤ 10 ms",
        ),
    ];
    let step_rows = [
        ("agent step", &STEPS[..], &steps),
        (
            "ztunnel's ZDS add, step",
            &ZTUNNEL_STEPS[..],
            &ztunnel_steps,
        ),
    ];
    for (whose, names, times) in step_rows {
        for step in names {
            let samples = times.get(step).cloned().unwrap_or_default();
            let name = |q| format!("{mode}: {whose} {step} {q} (of the gated ADD)");
            figures.push(single(&name("p50"), "ms", percentile(&samples, 0.5), ""));
            let mut p99 = single(&name("p99"), "ms", percentile(&samples, 0.99), "");
            p99.samples_mesh = samples;
            figures.push(p99);
        }
    }
    for (q, p) in [("p50", 0.5), ("p99", 0.99)] {
        figures.push(single(
            &format!("{mode}: outside the agent {q} (plugin exec, its request, the result)"),
            "ms",
            percentile(&outside, p),
            "",
        ));
    }
    figures.extend([
        single(
            &format!(
                "{mode}: enroll {} running pods after one namespace label",
                plan.pods
            ),
            "s",
            label_to_all,
            "≤ 1 s for 100",
        ),
        single(
            &format!("{mode}: agent RSS, {enrolled} pods enrolled"),
            "MiB",
            agent_busy as f64 / 1024.0,
            "",
        ),
        single(
            &format!("{mode}: agent memory per enrolled pod"),
            "KiB",
            per_pod(agent_busy, agent_idle),
            "",
        ),
        single(
            &format!("{mode}: ztunnel memory per enrolled pod (node)"),
            "KiB",
            per_pod(ztunnel_busy, ztunnel_idle),
            "< 100 KiB",
        ),
    ]);
    figures[1].samples_mesh = gated_ms;
    Ok(figures)
}

/// The `key=value` fields of the log lines that carry one of `messages` and whose
/// field `key` starts with `prefix`.
fn log_fields(
    log: &str,
    messages: &[&str],
    (key, prefix): (&str, &str),
) -> Vec<HashMap<String, String>> {
    log.lines()
        .filter(|l| messages.iter().any(|m| l.contains(m)))
        .map(|line| {
            strip_ansi(line)
                .split_whitespace()
                .filter_map(|token| token.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect::<HashMap<_, _>>()
        })
        .filter(|fields| fields.get(key).is_some_and(|v| v.starts_with(prefix)))
        .collect()
}

/// Each step's durations (ms), from the lines' `<step>_us` fields.
fn step_times(
    lines: &[HashMap<String, String>],
    steps: &[&'static str],
) -> HashMap<&'static str, Vec<f64>> {
    let mut times: HashMap<&'static str, Vec<f64>> = HashMap::new();
    for fields in lines {
        for step in steps {
            if let Some(us) = fields
                .get(&format!("{step}_us"))
                .and_then(|v| v.parse::<f64>().ok())
            {
                times.entry(step).or_default().push(us / 1000.0);
            }
        }
    }
    times
}

/// `line` without terminal colour codes (`ESC [ ... m`), which the agent's log may carry.
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            chars.by_ref().find(|&c| c == 'm');
        } else {
            out.push(c);
        }
    }
    out
}
