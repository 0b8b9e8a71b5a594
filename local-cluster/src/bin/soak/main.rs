//! `make soak`: the mesh under time. A two-node cluster installed from the charts runs
//! for `SOAK_MINUTES` (default 60; `--quick` is the 3-minute form CI runs) with pods
//! churning on every node (enrolled by namespace label, by pod label, or opted out),
//! long-lived connections and a steady rate of new connections between enrolled pods
//! (pod to pod and through a Service), while istiod-lite, the node agents, ztunnel and
//! the API server are killed, rolled or restarted in turn. Every 10 s it samples each
//! mesh process and what the mesh holds against the API server's truth into
//! `target/soak/samples.jsonl`; at the end it judges (`summary.json`), draws
//! `soak.png` (scripts/soak-plot.py) and exits 1 if any verdict failed.

mod faults;
mod judge;
mod sample;

use std::collections::VecDeque;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use clap::Parser;
use local_cluster::api::Api;
use local_cluster::load::{Failures, Report};
use local_cluster::{objects, LocalCluster};
use serde_json::json;
use test_support::process::ChildGuard;

use faults::Fault;
use sample::{Sample, Sampler};

#[derive(Parser, Debug, Clone)]
#[command(about = "The mesh under time: churn, traffic and faults, judged (needs root)")]
struct Args {
    /// How long to run.
    #[arg(long, env = "SOAK_MINUTES", default_value_t = 60)]
    minutes: u64,
    /// The 3-minute form CI runs: a smaller load, every fault once.
    #[arg(long)]
    quick: bool,
    /// Churning pods per node (default 100; 12 with --quick).
    #[arg(long, env = "SOAK_CHURN_PODS")]
    churn_pods: Option<usize>,
    /// Seconds each churning pod lives (default 300; 60 with --quick).
    #[arg(long, env = "SOAK_POD_LIFETIME")]
    pod_lifetime: Option<u64>,
    /// Long-lived connections in all (default 1000; 100 with --quick).
    #[arg(long, env = "SOAK_LONG_LIVED")]
    long_lived: Option<usize>,
    /// New connections per second in all (default 1200; 200 with --quick).
    #[arg(long, env = "SOAK_RATE")]
    rate: Option<u32>,
    /// The faults, injected in turn (default: all four; e.g. `api-server-restart` alone
    /// to see what one kind of fault does to the mesh over many rounds).
    #[arg(long, env = "SOAK_FAULTS", value_enum, value_delimiter = ',')]
    faults: Vec<faults::Kind>,
    /// Seconds between faults (default 300; 20 with --quick).
    #[arg(long, env = "SOAK_FAULT_EVERY")]
    fault_every: Option<u64>,
    /// Where samples, the summary and the plot go.
    #[arg(long, default_value = "target/soak")]
    out: PathBuf,
}

/// The soak's shape, from the arguments.
#[derive(Debug, Clone, serde::Serialize)]
struct Plan {
    duration_s: u64,
    churn_pods_per_node: usize,
    pod_lifetime_s: u64,
    long_lived: usize,
    new_connections_per_s: u32,
    /// Growth is judged from here on.
    warm_up_s: u64,
    first_fault_s: u64,
    fault_every_s: u64,
    faults: Vec<faults::Kind>,
    /// When the node link is captured for plaintext.
    capture_at_s: u64,
}

impl Plan {
    fn of(a: &Args) -> Plan {
        let (minutes, pods, life, long, rate) = if a.quick {
            (3, 12, 60, 100, 200)
        } else {
            (a.minutes, 100, 300, 1000, 1200)
        };
        let duration_s = minutes * 60;
        let warm_up_s = if a.quick { 60 } else { 300 };
        Plan {
            duration_s,
            churn_pods_per_node: a.churn_pods.unwrap_or(pods),
            pod_lifetime_s: a.pod_lifetime.unwrap_or(life).max(10),
            long_lived: a.long_lived.unwrap_or(long),
            new_connections_per_s: a.rate.unwrap_or(rate),
            warm_up_s,
            first_fault_s: warm_up_s + 10,
            fault_every_s: a.fault_every.unwrap_or(if a.quick { 20 } else { 300 }),
            faults: if a.faults.is_empty() {
                faults::SCHEDULE.to_vec()
            } else {
                a.faults.clone()
            },
            capture_at_s: warm_up_s - 20,
        }
    }
}

const SAMPLE_EVERY: Duration = Duration::from_secs(10);
const NS: &str = "soak";
const AMBIENT: (&str, &str) = ("istio.io/dataplane-mode", "ambient");
const OPT_OUT: (&str, &str) = ("istio.io/dataplane-mode", "none");
const ECHO_PORT: u16 = 9001;
const WAIT: Duration = Duration::from_secs(60);

fn main() -> Result<()> {
    let args = Args::parse();
    if !test_support::can_run_root_tests() {
        bail!("the soak builds network namespaces: run it as root (sudo make soak)");
    }
    let plan = Plan::of(&args);
    std::fs::create_dir_all(&args.out)?;
    println!("soak: {plan:?}");
    let mut c = LocalCluster::start("sok")?;
    let result = run(&mut c, &plan, &args.out);
    c.shutdown()?;
    let passed = result?;
    if !passed {
        bail!(
            "the soak failed: see {}",
            args.out.join("summary.json").display()
        );
    }
    Ok(())
}

/// The traffic pods' processes.
struct Load {
    guards: Vec<ChildGuard>,
}

impl Load {
    /// Every report line of every load process, parsed.
    fn reports(&self) -> Vec<Vec<Report>> {
        self.guards
            .iter()
            .map(|g| {
                g.log()
                    .lines()
                    .filter_map(|l| serde_json::from_str(l).ok())
                    .collect()
            })
            .collect()
    }

    /// The latest counts, summed over the load processes.
    fn totals(&self) -> Report {
        let mut sum = Report::default();
        for r in self.reports().iter().filter_map(|r| r.last().cloned()) {
            sum.short_opened += r.short_opened;
            sum.short_ok += r.short_ok;
            sum.short_skipped += r.short_skipped;
            sum.long_open += r.long_open;
            sum.long_round_trips += r.long_round_trips;
            for (k, v) in r.short_failed {
                *sum.short_failed.entry(k).or_default() += v;
            }
            for (k, v) in r.long_lost {
                *sum.long_lost.entry(k).or_default() += v;
            }
        }
        sum
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

/// The echo servers, their Service and the load pods; returns the load processes.
fn start_traffic(c: &LocalCluster, plan: &Plan) -> Result<Load> {
    c.create_namespace(NS, &[AMBIENT])?;
    c.wait_ztunnels_ready(WAIT)?;
    let echo = [
        "e2e-app",
        "echo",
        "--listen",
        &format!("0.0.0.0:{ECHO_PORT}"),
    ];
    let service = objects::service(NS, "echo", &[("app", "echo")], ECHO_PORT, ECHO_PORT);
    let service = c
        .api()
        .post(&format!("/api/v1/namespaces/{NS}/services"), &service)?;
    let vip = service["spec"]["clusterIP"]
        .as_str()
        .context("the echo Service has no ClusterIP")?
        .to_owned();
    let nodes: Vec<u8> = c.nodes.iter().map(|n| n.index).collect();
    for &n in &nodes {
        c.create_pod(
            NS,
            &format!("echo-{n}"),
            n,
            "echo",
            &[("app", "echo")],
            &echo,
        )?;
        c.create_pod(
            NS,
            &format!("load-{n}"),
            n,
            "load",
            &[],
            &["sleep", "infinity"],
        )?;
    }
    let mut ips = Vec::new();
    for &n in &nodes {
        for name in [format!("echo-{n}"), format!("load-{n}")] {
            let pod = c.wait_pod_running(NS, &name, WAIT)?;
            c.wait_redirection(NS, &name, Some("enabled"), WAIT)?;
            for &z in &nodes {
                c.wait_ztunnel_sees_hbone(z, &pod.ip, WAIT)?;
            }
            if name.starts_with("echo") {
                ips.push(pod.ip);
            }
        }
    }
    let per_load = |total: usize| (total / nodes.len()).max(1).to_string();
    let long = per_load(plan.long_lived);
    let rate = per_load(plan.new_connections_per_s as usize);
    let mut guards = Vec::new();
    for (i, &n) in nodes.iter().enumerate() {
        // Each node's load talks to the other node's echo, directly and by the VIP.
        let other = format!("{}:{ECHO_PORT}", ips[(i + 1) % ips.len()]);
        let vip = format!("{vip}:{ECHO_PORT}");
        let argv = [
            "e2e-app",
            "soak-load",
            "--long-targets",
            &other,
            "--long",
            &long,
            "--short-targets",
            &format!("{other},{vip}"),
            "--rate",
            &rate,
        ];
        guards.push(c.spawn_in_pod(NS, &format!("load-{n}"), &argv)?);
    }
    Ok(Load { guards })
}

/// Pods created and deleted at a steady pace on every node until `stop`: half in an
/// ambient namespace, a quarter opting in by their own label, a quarter opting out.
fn churn(api: Api, nodes: Vec<String>, plan: Plan, stop: Arc<AtomicBool>) {
    const AMBIENT_NS: &str = "churn-ambient";
    const PLAIN_NS: &str = "churn-plain";
    for (ns, labels) in [(AMBIENT_NS, vec![AMBIENT]), (PLAIN_NS, vec![])] {
        let _ = api.create_if_absent("/api/v1/namespaces", &objects::namespace(ns, &labels));
    }
    let per_node = plan.churn_pods_per_node.max(1);
    let pace = Duration::from_secs(plan.pod_lifetime_s) / per_node as u32;
    let mut live: Vec<VecDeque<(String, String)>> = vec![VecDeque::new(); nodes.len()];
    // Each node's own count picks the mix, so every node gets the same mix.
    let mut made = vec![0usize; nodes.len()];
    let mut seq = 0usize;
    // Fill quickly (a pod a node every 200 ms), then replace the oldest at the pace.
    while !stop.load(Ordering::SeqCst) {
        let filling = live.iter().any(|l| l.len() < per_node);
        for (i, node) in nodes.iter().enumerate() {
            if live[i].len() >= per_node {
                if let Some((ns, name)) = live[i].pop_front() {
                    if let Err(e) = api.delete(&format!("/api/v1/namespaces/{ns}/pods/{name}")) {
                        tracing::warn!("churn: deleting {ns}/{name}: {e:#}");
                    }
                }
            }
            seq += 1;
            made[i] += 1;
            let (ns, labels): (&str, Vec<(&str, &str)>) = match made[i] % 4 {
                0 | 1 => (AMBIENT_NS, vec![]),
                2 => (PLAIN_NS, vec![AMBIENT]),
                _ => (AMBIENT_NS, vec![OPT_OUT]),
            };
            let name = format!("c{}-{seq}", i + 1);
            let sa = format!("churn-{}", seq % 3);
            let pod = objects::pod(ns, &name, node, &sa, &labels, &["sleep", "infinity"]);
            match api.post(&format!("/api/v1/namespaces/{ns}/pods"), &pod) {
                Ok(_) => live[i].push_back((ns.to_owned(), name)),
                Err(e) => tracing::warn!("churn: creating {ns}/{name}: {e:#}"),
            }
        }
        std::thread::sleep(if filling {
            Duration::from_millis(200)
        } else {
            pace
        });
    }
}

fn run(c: &mut LocalCluster, plan: &Plan, out: &std::path::Path) -> Result<bool> {
    let load = start_traffic(c, plan)?;
    let started = Instant::now();
    let start_ms = unix_ms();
    let t = || started.elapsed().as_secs_f64();
    let stop = Arc::new(AtomicBool::new(false));
    let churner = {
        let (api, nodes, plan, stop) = (
            c.api(),
            c.nodes.iter().map(|n| n.name.clone()).collect(),
            plan.clone(),
            stop.clone(),
        );
        std::thread::spawn(move || churn(api, nodes, plan, stop))
    };
    let mut samples_file = std::fs::File::create(out.join("samples.jsonl"))?;
    let mut sampler = Sampler::default();
    let mut samples: Vec<Sample> = Vec::new();
    let mut faults: Vec<Fault> = Vec::new();
    let mut active: Option<(Fault, Instant)> = None;
    let mut round = 0usize;
    let mut next_sample = 0.0;
    let mut next_fault = plan.first_fault_s as f64;
    let mut plaintext: Option<serde_json::Value> = None;
    let end = plan.duration_s as f64;
    // The last fault starts early enough to be over (a rollout drains for 30 s).
    let last_fault_by = end - if plan.duration_s <= 300 { 40.0 } else { 120.0 };
    loop {
        let now = t();
        if let Some((fault, since)) = active.as_mut() {
            if let Some(over) = faults::settle(c, fault, now, *since) {
                let what = if over {
                    "over"
                } else {
                    "NOT OVER: giving up on it"
                };
                println!("  {:>6.0}s  {} {what}", now, fault.name());
                faults.push(fault.clone());
                active = None;
            }
        } else if now >= next_fault && now < last_fault_by {
            let kind = plan.faults[round % plan.faults.len()];
            let fault = faults::inject(c, kind, round / plan.faults.len(), now)?;
            println!("  {:>6.0}s  {}", now, fault.name());
            active = Some((fault, Instant::now()));
            round += 1;
            next_fault = now + plan.fault_every_s as f64;
        }
        if plaintext.is_none() && now >= plan.capture_at_s as f64 && active.is_none() {
            plaintext = Some(capture_node_links(c)?);
        }
        if now >= next_sample {
            let mut s = Sample {
                t_s: now,
                processes: sampler.processes(c),
                faults: active.iter().map(|(f, _)| f.name()).collect(),
                traffic: load.totals(),
                ..Sample::default()
            };
            sample::mesh_state(c, &mut s);
            writeln!(samples_file, "{}", serde_json::to_string(&s)?)?;
            print_progress(&s);
            samples.push(s);
            next_sample += SAMPLE_EVERY.as_secs_f64();
        }
        if now >= end && active.is_none() {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    stop.store(true, Ordering::SeqCst);
    let _ = churner.join();
    let reports = load.reports();
    drop(load);

    let since_start = |ms: u64| ms.saturating_sub(start_ms) as f64 / 1000.0;
    let failures: Vec<(f64, f64, Failures)> = reports
        .iter()
        .flatten()
        .flat_map(|r| r.failures.iter().cloned())
        .map(|f| (since_start(f.first_ms), since_start(f.last_ms), f))
        .collect();
    let totals: Vec<Report> = reports.iter().filter_map(|r| r.last().cloned()).collect();
    let counted: u64 = totals
        .iter()
        .map(|r| r.short_failed.values().sum::<u64>() + r.long_lost.values().sum::<u64>())
        .sum();
    let in_flight = 2 * (plan.churn_pods_per_node * 10 / plan.pod_lifetime_s as usize).max(1) + 2;
    let (growth_verdict, growth) = judge::growth(&samples, plan.warm_up_s as f64);
    let plaintext =
        plaintext.unwrap_or_else(|| json!({"passed": false, "detail": "never captured"}));
    let mut verdicts = vec![
        growth_verdict,
        judge::failures(&failures, &faults, counted),
        judge::stale_state(&samples),
        judge::netns_held(&samples),
        judge::enrollment(&samples, plan.warm_up_s as f64, in_flight),
        judge::Verdict {
            check: "no enrolled pod's traffic in plaintext on the node links".into(),
            passed: plaintext["passed"] == true,
            detail: plaintext["detail"].as_str().unwrap_or_default().to_owned(),
        },
    ];
    let traffic_ok = totals.iter().map(|r| r.short_ok).sum::<u64>() > 0
        && totals.iter().map(|r| r.long_round_trips).sum::<u64>() > 0;
    let stuck: Vec<String> = faults
        .iter()
        .filter(|f| f.end_s.is_none())
        .map(|f| format!("{} at {:.0}s", f.name(), f.start_s))
        .collect();
    verdicts.push(judge::Verdict {
        check: format!("every fault is over within {}s", faults::LIMIT.as_secs()),
        passed: stuck.is_empty(),
        detail: if stuck.is_empty() {
            format!("{} faults injected, all over", faults.len())
        } else {
            format!("not over: {}", stuck.join(", "))
        },
    });
    verdicts.push(judge::Verdict {
        check: "traffic flowed (short and long-lived round trips)".into(),
        passed: traffic_ok,
        detail: format!("{totals:?}"),
    });
    let passed = verdicts.iter().all(|v| v.passed);
    let summary = json!({
        "plan": plan,
        "duration_s": t(),
        "passed": passed,
        "verdicts": verdicts,
        "faults": faults,
        "growth": growth,
        "traffic": samples.last().map(|s| s.traffic.clone()),
        "failures": failures
            .iter()
            .map(|(first, last, f)| json!({"first_s": first, "last_s": last, "failures": f}))
            .collect::<Vec<_>>(),
    });
    std::fs::write(
        out.join("summary.json"),
        serde_json::to_vec_pretty(&summary)?,
    )?;
    println!("\nverdicts:");
    for v in &verdicts {
        println!(
            "  {} {}: {}",
            if v.passed { "ok  " } else { "FAIL" },
            v.check,
            v.detail
        );
    }
    plot(out)?;
    Ok(passed)
}

/// Captures both nodes' links to the cluster network for a while: the soak's echo
/// port must never be on the wire (every byte of it is between enrolled pods), and
/// HBONE must be.
fn capture_node_links(c: &LocalCluster) -> Result<serde_json::Value> {
    let capture = c.capture_node_links()?;
    std::thread::sleep(Duration::from_secs(10));
    let captured = capture.stop()?;
    let plain = captured
        .packets
        .iter()
        .filter(|p| p.sport == ECHO_PORT || p.dport == ECHO_PORT)
        .count();
    let hbone = captured
        .packets
        .iter()
        .filter(|p| p.sport == 15008 || p.dport == 15008)
        .count();
    let passed = plain == 0 && hbone > 0 && captured.dropped == 0;
    Ok(json!({
        "passed": passed,
        "detail": format!(
            "10 s on the node links: {plain} packets on the echo port, {hbone} HBONE packets, {} dropped by the capture",
            captured.dropped
        ),
    }))
}

fn print_progress(s: &Sample) {
    let rss: Vec<String> = s
        .processes
        .iter()
        .map(|p| format!("{} {}M", p.pod, p.rss_kib / 1024))
        .collect();
    println!(
        "  {:>6.0}s  pods {} (meshed {} / enrolled {})  short ok {} failed {:?}  long open {} lost {:?}  {}",
        s.t_s,
        s.pods_running,
        s.meshed_expected,
        s.meshed_enrolled,
        s.traffic.short_ok,
        s.traffic.short_failed,
        s.traffic.long_open,
        s.traffic.long_lost,
        rss.join(" ")
    );
}

/// Draws the samples (scripts/soak-plot.py) with Debian's python3 and its
/// python3-matplotlib (scripts/setup.sh), whatever other python3 is first on PATH.
fn plot(out: &std::path::Path) -> Result<()> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/soak-plot.py");
    let status = std::process::Command::new("/usr/bin/python3")
        .arg(script)
        .arg(out)
        .status()
        .context("running scripts/soak-plot.py")?;
    if !status.success() {
        bail!("scripts/soak-plot.py failed: {status}");
    }
    Ok(())
}
