//! `make bench`: every cost a mesh user pays, measured twice in the same run (direct
//! and through the mesh) on the same namespaces, and reported as a ratio with the
//! raw numbers beside it. It measures; it never fails on a number.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use e2e::mesh;
use e2e::netns::Netns;
use e2e::process::{wait_for, ChildGuard};
use e2e::standalone::{Standalone, DIRECT_ECHO_PORT, ECHO_PORT, SERVER_IP};
use serde::Serialize;

#[derive(Parser)]
#[command(about = "Mesh against direct, side by side")]
struct Args {
    /// A short run (under 3 minutes) to check the benchmark itself works.
    #[arg(long)]
    quick: bool,
    /// Where every raw sample goes.
    #[arg(long, default_value = "bench/results.json")]
    out: PathBuf,
}

/// One row of the report.
#[derive(Serialize)]
struct Figure {
    name: String,
    unit: &'static str,
    direct: Option<f64>,
    mesh: f64,
    /// mesh / direct, or mesh - direct for added latency (see `ratio_kind`).
    ratio: Option<f64>,
    ratio_kind: &'static str,
    goal: &'static str,
    samples_direct: Vec<f64>,
    samples_mesh: Vec<f64>,
}

struct Plan {
    throughput_secs: u32,
    throughput_reps: usize,
    pings: u64,
    rate_pings: u64,
    churn: u64,
    held: u64,
}

fn main() -> Result<()> {
    let args = Args::parse();
    if !e2e::can_run_root_tests() {
        bail!("the benchmark builds network namespaces: run it as root");
    }
    let plan = if args.quick {
        Plan { throughput_secs: 2, throughput_reps: 1, pings: 2000, rate_pings: 1000, churn: 200, held: 200 }
    } else {
        Plan { throughput_secs: 10, throughput_reps: 3, pings: 20000, rate_pings: 5000, churn: 2000, held: 1000 }
    };
    // Both nodes' ztunnels share this machine's two cores; in a cluster each would
    // have its node to itself. One worker each models that (override with the env).
    if std::env::var_os("ZTUNNEL_WORKER_THREADS").is_none() {
        std::env::set_var("ZTUNNEL_WORKER_THREADS", "1");
    }
    let started = Instant::now();
    eprintln!("building the standalone topology (two ztunnels, one veth hop)...");
    let topology = Standalone::new("bench")?;
    let iperf_mesh = iperf_server(&topology.b, 5201)?;
    let iperf_direct = iperf_server(&topology.b, 5202)?;
    let mut figures = Vec::new();

    eprintln!("throughput: single stream, {} x {} s each way...", plan.throughput_reps, plan.throughput_secs);
    figures.push(throughput(&topology.a, &plan, 1)?);
    eprintln!("throughput: 8 streams...");
    figures.push(throughput(&topology.a, &plan, 8)?);

    eprintln!("latency: {} round trips of 64 bytes on one connection...", plan.pings);
    let direct = ping(&topology.a, DIRECT_ECHO_PORT, plan.pings, 0)?;
    let meshed = ping(&topology.a, ECHO_PORT, plan.pings, 0)?;
    for (key, label, goal) in [
        ("p50_us", "added latency p50", "<= 100 µs added (Istio ~120)"),
        ("p99_us", "added latency p99", ""),
        ("p999_us", "added latency p99.9", ""),
    ] {
        figures.push(added(label, direct[key].as_f64().unwrap_or(0.0), meshed[key].as_f64().unwrap_or(0.0), goal));
    }

    eprintln!("latency at ~1000 req/s with ztunnel CPU...");
    let pids = [topology.ztunnel_a.pid(), topology.ztunnel_b.pid()];
    let cpu_before: u64 = pids.iter().map(|p| cpu_ticks(*p)).sum();
    let t0 = Instant::now();
    let paced = ping(&topology.a, ECHO_PORT, plan.rate_pings, 1)?;
    let elapsed = t0.elapsed().as_secs_f64();
    let cpu_after: u64 = pids.iter().map(|p| cpu_ticks(*p)).sum();
    let rate = plan.rate_pings as f64 / elapsed;
    let vcpu = (cpu_after - cpu_before) as f64 / clock_ticks() / elapsed;
    figures.push(single("paced rate (req/s)", "req/s", rate, ""));
    figures.push(single("paced p50 latency", "µs", paced["p50_us"].as_f64().unwrap_or(0.0), ""));
    figures.push(single(
        "ztunnel CPU per 1000 req/s (both ends)",
        "vCPU",
        vcpu * 1000.0 / rate,
        "Istio ~0.06 vCPU",
    ));

    eprintln!("connection churn: {} short connections each way...", plan.churn);
    let direct = churn(&topology.a, DIRECT_ECHO_PORT, plan.churn)?;
    let meshed = churn(&topology.a, ECHO_PORT, plan.churn)?;
    figures.push(ratio(
        "connections per second (pool warm)",
        "conn/s",
        vec![direct["connections_per_second"].as_f64().unwrap_or(0.0)],
        vec![meshed["connections_per_second"].as_f64().unwrap_or(0.0)],
        "",
    ));
    figures.push(added(
        "added setup latency p50 (pool warm)",
        direct["p50_us"].as_f64().unwrap_or(0.0),
        meshed["p50_us"].as_f64().unwrap_or(0.0),
        "",
    ));

    eprintln!("pooling: {} concurrent connections to one destination...", plan.held);
    let rss_idle = rss_kib(topology.ztunnel_a.pid()) as f64;
    let (hbone_connections, rss_held) = hold(&topology, plan.held)?;
    figures.push(single(
        &format!("HBONE connections for {} user connections", plan.held),
        "conns",
        hbone_connections as f64,
        "ceil(N/100)",
    ));
    figures.push(single("ztunnel RSS idle (client side)", "MiB", rss_idle / 1024.0, ""));
    figures.push(single(
        &format!("ztunnel RSS with {} connections (client side)", plan.held),
        "MiB",
        rss_held as f64 / 1024.0,
        "",
    ));
    drop((iperf_mesh, iperf_direct));
    drop(topology);

    print_table(&figures);
    eprintln!("(took {:.0} s)", started.elapsed().as_secs_f64());
    if let Some(parent) = args.out.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&args.out, serde_json::to_string_pretty(&figures)?)?;
    eprintln!("raw samples: {}", args.out.display());
    Ok(())
}

fn iperf_server(ns: &Netns, port: u16) -> Result<ChildGuard> {
    let mut cmd = ns.command("iperf3");
    cmd.args(["-s", "-p", &port.to_string()]);
    let guard = ChildGuard::spawn(&format!("iperf3-{port}"), cmd)?;
    std::thread::sleep(Duration::from_millis(300));
    Ok(guard)
}

/// Alternates direct and mesh runs so slow drifts of the machine hit both alike.
fn throughput(a: &Netns, plan: &Plan, streams: u32) -> Result<Figure> {
    let mut direct = Vec::new();
    let mut meshed = Vec::new();
    for _ in 0..plan.throughput_reps {
        direct.push(iperf(a, 5202, plan.throughput_secs, streams)?);
        meshed.push(iperf(a, 5201, plan.throughput_secs, streams)?);
    }
    let name = if streams == 1 {
        "throughput, 1 stream (median)".to_owned()
    } else {
        format!("throughput, {streams} streams (median)")
    };
    let goal = if streams == 1 { ">= 0.45 of direct (Istio ~0.34)" } else { "" };
    Ok(ratio(&name, "Gbit/s", direct, meshed, goal))
}

fn iperf(a: &Netns, port: u16, secs: u32, streams: u32) -> Result<f64> {
    let out = a.stdout(&[
        "iperf3",
        "-c",
        SERVER_IP,
        "-p",
        &port.to_string(),
        "-t",
        &secs.to_string(),
        "-P",
        &streams.to_string(),
        "-J",
    ])?;
    let json: serde_json::Value = serde_json::from_str(&out).context("iperf3 JSON")?;
    json["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .map(|bps| bps / 1e9)
        .context("iperf3 reported no throughput")
}

fn ping(a: &Netns, port: u16, count: u64, interval_ms: u64) -> Result<serde_json::Value> {
    app(a, &["ping", "--connect", &format!("{SERVER_IP}:{port}"), "--count", &count.to_string(), "--interval-ms", &interval_ms.to_string()])
}

fn churn(a: &Netns, port: u16, count: u64) -> Result<serde_json::Value> {
    app(a, &["churn", "--connect", &format!("{SERVER_IP}:{port}"), "--count", &count.to_string()])
}

fn app(a: &Netns, args: &[&str]) -> Result<serde_json::Value> {
    let binary = mesh::binary("e2e-app")?;
    let mut argv = vec![binary.to_str().context("path")?];
    argv.extend_from_slice(args);
    let out = a.stdout(&argv)?;
    Ok(serde_json::from_str(out.trim())?)
}

/// Holds `count` mesh connections open; returns the HBONE connections A's ztunnel
/// used for them and its RSS meanwhile.
fn hold(topology: &Standalone, count: u64) -> Result<(usize, u64)> {
    let binary = mesh::binary("e2e-app")?;
    let mut child = topology
        .a
        .command(binary.to_str().context("path")?)
        .args(["hold", "--connect", &format!("{SERVER_IP}:{ECHO_PORT}"), "--count", &count.to_string(), "--hold-secs", "60"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().context("stdout")?).read_line(&mut line)?;
    if !line.starts_with("open") {
        let _ = child.kill();
        bail!("hold failed: {line}");
    }
    let hbone = wait_for("HBONE connections to settle", Duration::from_secs(5), || {
        let out = topology.a.stdout(&["ss", "-Htn", "state", "established", "( dport = :15008 )"]).ok()?;
        Some(out.lines().filter(|l| !l.trim().is_empty()).count())
    })?;
    let rss = rss_kib(topology.ztunnel_a.pid());
    let _ = child.kill();
    let _ = child.wait();
    Ok((hbone, rss))
}

fn ratio(name: &str, unit: &'static str, direct: Vec<f64>, meshed: Vec<f64>, goal: &'static str) -> Figure {
    let (d, m) = (median(&direct), median(&meshed));
    Figure {
        name: name.to_owned(),
        unit,
        direct: Some(d),
        mesh: m,
        ratio: (d > 0.0).then(|| m / d),
        ratio_kind: "mesh/direct",
        goal,
        samples_direct: direct,
        samples_mesh: meshed,
    }
}

fn added(name: &str, direct: f64, meshed: f64, goal: &'static str) -> Figure {
    Figure {
        name: name.to_owned(),
        unit: "µs",
        direct: Some(direct),
        mesh: meshed,
        ratio: Some(meshed - direct),
        ratio_kind: "mesh-direct",
        goal,
        samples_direct: vec![direct],
        samples_mesh: vec![meshed],
    }
}

fn single(name: &str, unit: &'static str, value: f64, goal: &'static str) -> Figure {
    Figure {
        name: name.to_owned(),
        unit,
        direct: None,
        mesh: value,
        ratio: None,
        ratio_kind: "",
        goal,
        samples_direct: vec![],
        samples_mesh: vec![value],
    }
}

fn median(samples: &[f64]) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(0.0)
}

fn print_table(figures: &[Figure]) {
    println!("{:<48} {:>12} {:>12} {:>14}  {:<8} goal", "figure", "direct", "mesh", "ratio", "unit");
    for f in figures {
        let direct = f.direct.map_or("-".to_owned(), |d| format!("{d:.3}"));
        let ratio = match (f.ratio, f.ratio_kind) {
            (Some(r), "mesh-direct") => format!("+{r:.1} µs"),
            (Some(r), _) => format!("{r:.3}x"),
            (None, _) => "-".to_owned(),
        };
        let spread = if f.samples_mesh.len() > 1 {
            let lo = f.samples_mesh.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = f.samples_mesh.iter().copied().fold(0.0, f64::max);
            format!(" (mesh {lo:.2}..{hi:.2})")
        } else {
            String::new()
        };
        println!("{:<48} {:>12} {:>12.3} {:>14}  {:<8} {}{}", f.name, direct, f.mesh, ratio, f.unit, f.goal, spread);
    }
}

fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may contain spaces) start after ") ".
    let rest = stat.rsplit_once(") ").map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    field(11) + field(12) // utime, stime
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }) as f64
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}
