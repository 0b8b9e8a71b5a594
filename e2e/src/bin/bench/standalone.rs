//! Through one HBONE hop between two dedicated-mode ztunnels (`e2e::standalone`):
//! throughput, latency, CPU, connection churn, pooling and memory.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use e2e::mesh;
use e2e::netns::Netns;
use e2e::process::{wait_for, ChildGuard};
use e2e::standalone::{Standalone, DIRECT_ECHO_PORT, ECHO_PORT, SERVER_IP};

use crate::procfs::{clock_ticks, cpu_ticks, rss_kib};
use crate::report::{added, ratio, single, Figure};
use crate::Plan;

pub fn run(plan: &Plan) -> Result<Vec<Figure>> {
    eprintln!("building the standalone topology (two ztunnels, one veth hop)...");
    let topology = Standalone::new("bench")?;
    let rss_idle = rss_kib(topology.ztunnel_a.pid()) as f64;
    let iperf_mesh = iperf_server(&topology.b, 5201)?;
    let iperf_direct = iperf_server(&topology.b, 5202)?;
    let mut figures = Vec::new();

    eprintln!(
        "throughput: single stream, {} x {} s each way...",
        plan.throughput_reps, plan.throughput_secs
    );
    figures.push(throughput(&topology.a, plan, 1)?);
    eprintln!("throughput: 8 streams...");
    figures.push(throughput(&topology.a, plan, 8)?);

    eprintln!(
        "latency: {} round trips of 64 bytes on one connection...",
        plan.pings
    );
    let direct = ping(&topology.a, DIRECT_ECHO_PORT, plan.pings, 0)?;
    let meshed = ping(&topology.a, ECHO_PORT, plan.pings, 0)?;
    for (key, label, goal) in [
        (
            "p50_us",
            "added latency p50",
            "<= 100 µs added (Istio ~120)",
        ),
        ("p99_us", "added latency p99", ""),
        ("p999_us", "added latency p99.9", ""),
    ] {
        figures.push(added(
            label,
            direct[key].as_f64().unwrap_or(0.0),
            meshed[key].as_f64().unwrap_or(0.0),
            goal,
        ));
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
    figures.push(single(
        "paced p50 latency",
        "µs",
        paced["p50_us"].as_f64().unwrap_or(0.0),
        "",
    ));
    figures.push(single(
        "ztunnel CPU per 1000 req/s (both ends)",
        "vCPU",
        vcpu * 1000.0 / rate,
        "Istio ~0.06 vCPU",
    ));

    eprintln!(
        "connection churn: {} short connections each way...",
        plan.churn
    );
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

    eprintln!(
        "pooling: {} concurrent connections to one destination...",
        plan.held
    );
    let (hbone_connections, rss_held) = hold(&topology, plan.held)?;
    figures.push(single(
        &format!("HBONE connections for {} user connections", plan.held),
        "conns",
        hbone_connections as f64,
        "ceil(N/100)",
    ));
    figures.push(single(
        "ztunnel RSS at start (client side)",
        "MiB",
        rss_idle / 1024.0,
        "",
    ));
    figures.push(single(
        &format!("ztunnel RSS with {} connections (client side)", plan.held),
        "MiB",
        rss_held as f64 / 1024.0,
        "",
    ));
    drop((iperf_mesh, iperf_direct));
    Ok(figures)
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
    let goal = if streams == 1 {
        ">= 0.45 of direct (Istio ~0.34)"
    } else {
        ""
    };
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
    app(
        a,
        &[
            "ping",
            "--connect",
            &format!("{SERVER_IP}:{port}"),
            "--count",
            &count.to_string(),
            "--interval-ms",
            &interval_ms.to_string(),
        ],
    )
}

fn churn(a: &Netns, port: u16, count: u64) -> Result<serde_json::Value> {
    app(
        a,
        &[
            "churn",
            "--connect",
            &format!("{SERVER_IP}:{port}"),
            "--count",
            &count.to_string(),
        ],
    )
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
        .args([
            "hold",
            "--connect",
            &format!("{SERVER_IP}:{ECHO_PORT}"),
            "--count",
            &count.to_string(),
            "--hold-secs",
            "60",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().context("stdout")?).read_line(&mut line)?;
    if !line.starts_with("open") {
        let _ = child.kill();
        bail!("hold failed: {line}");
    }
    let hbone = wait_for(
        "HBONE connections to settle",
        Duration::from_secs(5),
        || {
            let out = topology
                .a
                .stdout(&["ss", "-Htn", "state", "established", "( dport = :15008 )"])
                .ok()?;
            Some(out.lines().filter(|l| !l.trim().is_empty()).count())
        },
    )?;
    let rss = rss_kib(topology.ztunnel_a.pid());
    let _ = child.kill();
    let _ = child.wait();
    Ok((hbone, rss))
}
