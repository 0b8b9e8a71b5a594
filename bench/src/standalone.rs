//! Through one HBONE hop between two dedicated-mode ztunnels (`local_cluster::standalone`):
//! throughput, latency, CPU, connection churn, pooling and memory.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use local_cluster::standalone::{Standalone, DIRECT_ECHO_PORT, ECHO_PORT, SERVER_IP, SERVER_IP6};
use test_support::netns::Netns;
use test_support::poll::wait_for;
use test_support::process::ChildGuard;

use shared_types::constants::ZTUNNEL_DEFAULT_WORKER_THREADS;

use crate::report::{added, median, ratio, single, Figure};
use crate::Plan;
use test_support::procfs::{clock_ticks, cpu_ticks, machine_busy_ticks, rss_kib, SchedCounters};

/// One ztunnel configuration under test: a topology, and what its rows are called.
struct Setup {
    topology: Standalone,
    /// Appended to each row's name ("" for the one-worker rows).
    suffix: String,
    _iperf: ChildGuard,
}

impl Setup {
    fn new(tag: &str, workers: usize, suffix: String) -> Result<Self> {
        let topology =
            Standalone::with_ztunnel_env(tag, &[("ZTUNNEL_WORKER_THREADS", &workers.to_string())])?;
        let iperf = iperf_server(&topology.b, MESH_IPERF_PORT)?;
        Ok(Setup {
            topology,
            suffix,
            _iperf: iperf,
        })
    }

    fn is_default(&self) -> bool {
        !self.suffix.is_empty()
    }

    fn ztunnels(&self) -> [u32; 2] {
        [self.topology.ztunnel_a.pid(), self.topology.ztunnel_b.pid()]
    }
}

const MESH_IPERF_PORT: u16 = 5201;
const DIRECT_IPERF_PORT: u16 = 5202;

/// The data path is measured for two configurations side by side, alternating run
/// by run so the machine's drifts hit both alike: one worker thread per ztunnel
/// (the data path alone, as if each node had its cores to itself) and ztunnel's
/// default worker count (what users run). The rest runs on the one-worker setup.
pub fn run(plan: &Plan) -> Result<Vec<Figure>> {
    eprintln!("building the standalone topologies (two ztunnels each, one hop)...");
    let one = Setup::new("bench", 1, String::new())?;
    let rss_idle = rss_kib(one.topology.ztunnel_a.pid());
    let workers = ZTUNNEL_DEFAULT_WORKER_THREADS;
    let default = Setup::new("benchw", workers, format!(", {workers} workers (default)"))?;
    let direct_iperf = iperf_server(&one.topology.b, DIRECT_IPERF_PORT)?;
    let setups = [one, default];

    let mut figures = Vec::new();
    eprintln!(
        "throughput: single stream, {} x {} s each way and setup...",
        plan.throughput_reps, plan.throughput_secs
    );
    figures.extend(throughput(&setups, plan, 1)?);
    eprintln!("throughput: 8 streams...");
    figures.extend(throughput(&setups, plan, 8)?);
    eprintln!(
        "latency: {} round trips of 64 bytes on one connection, with ztunnel CPU...",
        plan.pings
    );
    figures.extend(latency(&setups, plan)?);
    eprintln!("IPv6 beside IPv4: single-stream throughput and latency...");
    figures.extend(ipv6(&setups[0], plan)?);
    figures.extend(the_rest(&setups[0].topology, plan, rss_idle)?);
    drop(direct_iperf); // before its namespace goes
    Ok(figures)
}

/// Alternates direct and each setup's mesh run; rows per setup, plus the ztunnels'
/// context switches and CPU migrations per MiB moved, which show how work spreads
/// over threads.
fn throughput(setups: &[Setup], plan: &Plan, streams: u32) -> Result<Vec<Figure>> {
    let a = &setups[0].topology.a;
    let mut direct = Vec::new();
    let mut meshed = vec![Vec::new(); setups.len()];
    let mut switches = vec![SchedCounters::default(); setups.len()];
    let mut cpu_ticks_used = vec![0u64; setups.len()];
    let mut mib = vec![0.0; setups.len()];
    let ticks = |setup: &Setup| setup.ztunnels().iter().map(|&p| cpu_ticks(p)).sum::<u64>();
    let gib = |gbits: f64| gbits * 1e9 / 8.0 * plan.throughput_secs as f64 / (1u64 << 30) as f64;
    // The whole machine's busy CPU per GiB moved, direct and through the mesh.
    let (mut machine_direct, mut machine_mesh) = ((0u64, 0.0), vec![(0u64, 0.0); setups.len()]);
    for _ in 0..plan.throughput_reps {
        let busy = machine_busy_ticks();
        let gbits = iperf(a, DIRECT_IPERF_PORT, plan.throughput_secs, streams)?;
        machine_direct.0 += machine_busy_ticks() - busy;
        machine_direct.1 += gib(gbits);
        direct.push(gbits);
        for (i, setup) in setups.iter().enumerate() {
            let before = SchedCounters::of(&setup.ztunnels());
            let ticks_before = ticks(setup);
            let busy = machine_busy_ticks();
            let gbits = iperf(
                &setup.topology.a,
                MESH_IPERF_PORT,
                plan.throughput_secs,
                streams,
            )?;
            machine_mesh[i].0 += machine_busy_ticks() - busy;
            machine_mesh[i].1 += gib(gbits);
            cpu_ticks_used[i] += ticks(setup) - ticks_before;
            switches[i] += SchedCounters::of(&setup.ztunnels()) - before;
            mib[i] += gbits * 1e9 / 8.0 * plan.throughput_secs as f64 / (1 << 20) as f64;
            meshed[i].push(gbits);
        }
    }
    let streams_label = if streams == 1 {
        "1 stream".to_owned()
    } else {
        format!("{streams} streams")
    };
    let mut figures = Vec::new();
    for (i, setup) in setups.iter().enumerate() {
        // Issue 42's goals: 1 stream on either setup, 8 streams on the default one.
        let goal = match (streams, setup.is_default()) {
            (1, _) => ">= 0.45 of direct (Istio ~0.34)",
            (8, true) => ">= 0.45 of direct (Istio ~0.28, 2 workers)",
            _ => "",
        };
        let suffix = &setup.suffix;
        // On a machine whose cores are all busy, throughput is what the CPU per
        // byte allows: mesh/direct throughput is at most direct/mesh CPU per GiB.
        let per_gib =
            |(ticks, gib): (u64, f64)| ticks as f64 / clock_ticks() / gib.max(f64::MIN_POSITIVE);
        let (machine_direct, machine_mesh) = (per_gib(machine_direct), per_gib(machine_mesh[i]));
        // CPU time is steadier than Gbit/s on shared cores: what a GiB costs.
        let gib = mib[i] / 1024.0;
        let ztunnel_per_gib = cpu_ticks_used[i] as f64 / clock_ticks() / gib.max(f64::MIN_POSITIVE);
        let mut throughput = ratio(
            &format!("throughput, {streams_label} (median){suffix}"),
            "Gbit/s",
            direct.clone(),
            meshed[i].clone(),
            goal,
        );
        throughput.limit = Some(format!(
            "CPU: a GiB costs the machine {:.1}x what it costs direct, the two ztunnels {ztunnel_per_gib:.2} CPU s of it",
            machine_mesh / machine_direct.max(f64::MIN_POSITIVE)
        ));
        figures.push(throughput);
        let mut machine = ratio(
            &format!("machine CPU per GiB, all processes, {streams_label}{suffix}"),
            "CPU s/GiB",
            vec![machine_direct],
            vec![machine_mesh],
            if streams == 1 { "<= 2.5x direct" } else { "" },
        );
        machine.limit = Some(format!(
            "the ztunnels' own {ztunnel_per_gib:.2} CPU s/GiB; the rest is the kernel carrying each byte over two more sockets each way"
        ));
        figures.push(machine);
        figures.push(single(
            &format!("ztunnel CPU per GiB transferred, both ends, {streams_label}{suffix}"),
            "CPU s/GiB",
            ztunnel_per_gib,
            "",
        ));
        if streams > 1 {
            let per_mib = |n: u64| n as f64 / mib[i].max(f64::MIN_POSITIVE);
            figures.push(single(
                &format!("ztunnel context switches per MiB, {streams_label}{suffix}"),
                "/MiB",
                per_mib(switches[i].switches),
                "",
            ));
            figures.push(single(
                &format!("ztunnel CPU migrations per MiB, {streams_label}{suffix}"),
                "/MiB",
                per_mib(switches[i].migrations),
                "",
            ));
        }
    }
    Ok(figures)
}

/// Ping-pong on one connection: added latency, and the ztunnels' CPU and context
/// switches per round trip (/proc/<pid>/stat and the threads' sched) over the run.
fn latency(setups: &[Setup], plan: &Plan) -> Result<Vec<Figure>> {
    let direct = ping(&setups[0].topology.a, DIRECT_ECHO_PORT, plan.pings, 0)?;
    let mut figures = Vec::new();
    for setup in setups {
        let pids = setup.ztunnels();
        let cpu_before: u64 = pids.iter().map(|p| cpu_ticks(*p)).sum();
        let sched_before = SchedCounters::of(&pids);
        let meshed = ping(&setup.topology.a, ECHO_PORT, plan.pings, 0)?;
        let switches =
            (SchedCounters::of(&pids) - sched_before).switches as f64 / plan.pings as f64;
        let cpu_after: u64 = pids.iter().map(|p| cpu_ticks(*p)).sum();
        let cpu_us = (cpu_after - cpu_before) as f64 / clock_ticks() * 1e6 / plan.pings as f64;
        let suffix = &setup.suffix;
        let limit = format!(
            "per round trip, the two ztunnels spend {cpu_us:.0} µs of CPU and switch context {switches:.1} times"
        );
        for (key, label, goal) in [
            (
                "p50_us",
                "added latency p50, 64 B round trip",
                "<= +30 µs (issue 42; Istio +71, 2 workers)",
            ),
            (
                "p99_us",
                "added latency p99, 64 B round trip",
                "<= +80 µs (issue 42)",
            ),
            ("p999_us", "added latency p99.9, 64 B round trip", ""),
        ] {
            let mut row = added(
                &format!("{label}{suffix}"),
                direct[key].as_f64().unwrap_or(0.0),
                meshed[key].as_f64().unwrap_or(0.0),
                goal,
            );
            row.limit = Some(limit.clone());
            figures.push(row);
        }
        figures.push(single(
            &format!("ztunnel CPU per round trip (both ends){suffix}"),
            "µs",
            cpu_us,
            if setup.is_default() {
                "<= the 1-worker figure (Istio 95 µs)"
            } else {
                ""
            },
        ));
        let mut row = single(
            &format!("ztunnel context switches per 64 B round trip (both ends){suffix}"),
            "/req",
            switches,
            "<= 4 (issue 42)",
        );
        row.limit = Some(
            "4 is this design's floor: each of the two ztunnels is woken once per direction (the request, then the answer)"
                .to_owned(),
        );
        figures.push(row);
    }
    Ok(figures)
}

/// IPv6 beside IPv4 on one setup, run by run alternating the paths (direct IPv6, mesh
/// IPv4, mesh IPv6): single-stream throughput and added latency of IPv6 against direct
/// IPv6, and mesh IPv6 against mesh IPv4 (the goal: within 5 %). Latency percentiles
/// are the median over the rounds, each round a share of the pings.
fn ipv6(setup: &Setup, plan: &Plan) -> Result<Vec<Figure>> {
    const ROUNDS: u64 = 5;
    let a = &setup.topology.a;
    let secs = plan.throughput_secs;
    let (mut direct6, mut mesh4, mut mesh6) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..plan.throughput_reps {
        direct6.push(iperf_to(a, SERVER_IP6, DIRECT_IPERF_PORT, secs, 1)?);
        mesh4.push(iperf_to(a, SERVER_IP, MESH_IPERF_PORT, secs, 1)?);
        mesh6.push(iperf_to(a, SERVER_IP6, MESH_IPERF_PORT, secs, 1)?);
    }
    let v6 = format!("[{SERVER_IP6}]");
    let paths = [
        (v6.as_str(), DIRECT_ECHO_PORT),
        (SERVER_IP, ECHO_PORT),
        (v6.as_str(), ECHO_PORT),
    ];
    // [path][percentile] -> one sample per round.
    let mut rounds = vec![[Vec::new(), Vec::new()]; paths.len()];
    for _ in 0..ROUNDS {
        for (i, (server, port)) in paths.iter().enumerate() {
            let result = ping_to(a, server, *port, (plan.pings / ROUNDS).max(1), 0)?;
            for (j, key) in ["p50_us", "p99_us"].iter().enumerate() {
                rounds[i][j].push(result[key].as_f64().unwrap_or(0.0));
            }
        }
    }
    let at = |path: usize, percentile: usize| median(&rounds[path][percentile]);
    Ok(vec![
        ratio(
            "throughput, 1 stream, IPv6 (median)",
            "Gbit/s",
            direct6,
            mesh6.clone(),
            "",
        ),
        ratio(
            "throughput, 1 stream, mesh IPv6 / mesh IPv4 (median)",
            "Gbit/s",
            mesh4,
            mesh6,
            ">= 0.95 (within 5 %)",
        ),
        added("added latency p50, IPv6", at(0, 0), at(2, 0), ""),
        added("added latency p99, IPv6", at(0, 1), at(2, 1), ""),
        ratio(
            "round-trip p50 through the mesh, IPv6 / IPv4",
            "µs",
            rounds[1][0].clone(),
            rounds[2][0].clone(),
            "<= 1.05 (within 5 %)",
        ),
    ])
}

/// Paced latency with CPU, connection churn, pooling and memory (`rss_idle`: A's
/// ztunnel before any traffic, in KiB).
fn the_rest(topology: &Standalone, plan: &Plan, rss_idle: u64) -> Result<Vec<Figure>> {
    let mut figures = Vec::new();
    eprintln!("latency at ~1000 req/s with ztunnel CPU...");
    let pids = [topology.ztunnel_a.pid(), topology.ztunnel_b.pid()];
    let cpu_before: u64 = pids.iter().map(|p| cpu_ticks(*p)).sum();
    let sched_before = SchedCounters::of(&pids);
    let t0 = Instant::now();
    let paced = ping(&topology.a, ECHO_PORT, plan.rate_pings, 1)?;
    let elapsed = t0.elapsed().as_secs_f64();
    let cpu_after: u64 = pids.iter().map(|p| cpu_ticks(*p)).sum();
    let rate = plan.rate_pings as f64 / elapsed;
    let vcpu = (cpu_after - cpu_before) as f64 / clock_ticks() / elapsed;
    let switches =
        (SchedCounters::of(&pids) - sched_before).switches as f64 / plan.rate_pings as f64;
    figures.push(single("paced rate (req/s)", "req/s", rate, ""));
    figures.push(single(
        "paced p50 latency",
        "µs",
        paced["p50_us"].as_f64().unwrap_or(0.0),
        "",
    ));
    let mut per_1000 = single(
        "ztunnel CPU per 1000 req/s, 64 B round trips (both ends)",
        "vCPU",
        vcpu * 1000.0 / rate,
        "<= 0.08 vCPU (issue 42; Istio ~0.06)",
    );
    per_1000.limit = Some(format!(
        "{:.0} µs of CPU and {switches:.1} context switches per request at this rate: each request wakes the ztunnels from idle",
        vcpu / rate * 1e6
    ));
    figures.push(per_1000);

    eprintln!(
        "connection churn: {} short connections each way...",
        plan.churn
    );
    // Rounds alternate direct and mesh, so the machine's drifts hit both alike; each
    // figure is the median over the rounds.
    const CHURN_ROUNDS: u64 = 5;
    let (mut rate, mut p50) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
    for _ in 0..CHURN_ROUNDS {
        for (i, port) in [DIRECT_ECHO_PORT, ECHO_PORT].into_iter().enumerate() {
            let result = churn(&topology.a, port, (plan.churn / CHURN_ROUNDS).max(1), 64)?;
            rate[i].push(result["connections_per_second"].as_f64().unwrap_or(0.0));
            p50[i].push(result["p50_us"].as_f64().unwrap_or(0.0));
        }
    }
    let [direct_rate, mesh_rate] = rate;
    figures.push(ratio(
        "connections per second (pool warm)",
        "conn/s",
        direct_rate,
        mesh_rate,
        "",
    ));
    let mut setup = added(
        "added setup latency p50, new connection (pool warm)",
        median(&p50[0]),
        median(&p50[1]),
        "<= +120 µs (issue 42)",
    );
    let churn_cpu = churn_cpu(topology, plan)?;
    // vCPU per 1000 new connections a second = CPU ms per connection.
    setup.limit = Some(format!(
        "{:.0} µs of ztunnel CPU per new connection with 1 KiB each way (both ends): a new HTTP/2 stream and a TCP connect to the destination",
        churn_cpu[1].mesh * 1000.0
    ));
    figures.push(setup);
    figures.extend(churn_cpu);

    eprintln!(
        "pooling: {} concurrent connections to one destination...",
        plan.held
    );
    let rss_before = pids.map(rss_kib);
    let (hbone_connections, rss_held) = hold(topology, plan.held)?;
    let added_kib: u64 = rss_held
        .iter()
        .zip(rss_before)
        .map(|(held, before)| held.saturating_sub(before))
        .sum();
    figures.push(single(
        &format!("HBONE connections for {} user connections", plan.held),
        "conns",
        hbone_connections as f64,
        "ceil(N/100)",
    ));
    figures.push(single(
        "ztunnel RSS at start (client side)",
        "MiB",
        rss_idle as f64 / 1024.0,
        "",
    ));
    figures.push(single(
        &format!("ztunnel RSS with {} connections (client side)", plan.held),
        "MiB",
        rss_held[0] as f64 / 1024.0,
        "",
    ));
    figures.push(single(
        "ztunnel RSS per 1000 idle long-lived connections (both ends)",
        "MiB",
        added_kib as f64 / 1024.0 * 1000.0 / plan.held as f64,
        "<= 2 MiB",
    ));
    Ok(figures)
}

/// CPU of new connections with 1 KiB each way, pool warm: the machine's for direct
/// against mesh, and the two ztunnels' own. CPU-seconds per 1000 connections is the
/// vCPU that 1000 new connections a second keep busy.
fn churn_cpu(topology: &Standalone, plan: &Plan) -> Result<Vec<Figure>> {
    const ROUNDS: usize = 3;
    eprintln!(
        "new connections with 1 KiB each way: {ROUNDS} rounds of {} each way...",
        plan.churn
    );
    let pids = [topology.ztunnel_a.pid(), topology.ztunnel_b.pid()];
    let ztunnel_ticks = || pids.iter().map(|p| cpu_ticks(*p)).sum::<u64>();
    let per_1000 = |ticks: u64| ticks as f64 / clock_ticks() * 1000.0 / plan.churn as f64;
    let (mut machine, mut ztunnel) = ([Vec::new(), Vec::new()], Vec::new());
    for _ in 0..ROUNDS {
        for (i, port) in [DIRECT_ECHO_PORT, ECHO_PORT].into_iter().enumerate() {
            let (busy, own) = (machine_busy_ticks(), ztunnel_ticks());
            churn(&topology.a, port, plan.churn, 1024)?;
            machine[i].push(per_1000(machine_busy_ticks() - busy));
            if port == ECHO_PORT {
                ztunnel.push(per_1000(ztunnel_ticks() - own));
            }
        }
    }
    let [direct, mesh] = machine;
    Ok(vec![
        ratio(
            "machine CPU per 1000 new conn/s, 1 KiB each way",
            "vCPU",
            direct,
            mesh,
            "",
        ),
        single(
            "ztunnel CPU per 1000 new conn/s, 1 KiB each way (both ends)",
            "vCPU",
            median(&ztunnel),
            "<= 0.3 vCPU",
        ),
    ])
}

fn iperf_server(ns: &Netns, port: u16) -> Result<ChildGuard> {
    let mut cmd = ns.command("iperf3");
    cmd.args(["-s", "-p", &port.to_string()]);
    let guard = ChildGuard::spawn(&format!("iperf3-{port}"), cmd)?;
    std::thread::sleep(Duration::from_millis(300));
    Ok(guard)
}

fn iperf(a: &Netns, port: u16, secs: u32, streams: u32) -> Result<f64> {
    iperf_to(a, SERVER_IP, port, secs, streams)
}

/// iperf3 from A to `server` (either family, no brackets); Gbit/s received.
fn iperf_to(a: &Netns, server: &str, port: u16, secs: u32, streams: u32) -> Result<f64> {
    let out = a.stdout(&[
        "iperf3",
        "-c",
        server,
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
    ping_to(a, SERVER_IP, port, count, interval_ms)
}

/// `e2e-app ping` from A to `server` (IPv6 in brackets).
pub(crate) fn ping_to(
    a: &Netns,
    server: &str,
    port: u16,
    count: u64,
    interval_ms: u64,
) -> Result<serde_json::Value> {
    app(
        a,
        &[
            "ping",
            "--connect",
            &format!("{server}:{port}"),
            "--count",
            &count.to_string(),
            "--interval-ms",
            &interval_ms.to_string(),
        ],
    )
}

fn churn(a: &Netns, port: u16, count: u64, bytes: usize) -> Result<serde_json::Value> {
    churn_to(a, SERVER_IP, port, count, bytes)
}

/// `e2e-app churn` from `ns`: `count` new connections, one exchange of `bytes` each.
pub(crate) fn churn_to(
    ns: &Netns,
    server: &str,
    port: u16,
    count: u64,
    bytes: usize,
) -> Result<serde_json::Value> {
    app(
        ns,
        &[
            "churn",
            "--connect",
            &format!("{server}:{port}"),
            "--count",
            &count.to_string(),
            "--bytes",
            &bytes.to_string(),
        ],
    )
}

fn app(a: &Netns, args: &[&str]) -> Result<serde_json::Value> {
    let binary = test_support::built_binary("e2e-app")?;
    let mut argv = vec![binary.to_str().context("path")?];
    argv.extend_from_slice(args);
    let out = a.stdout(&argv)?;
    Ok(serde_json::from_str(out.trim())?)
}

/// Holds `count` connections open from A; the HBONE connections they use, and both
/// ztunnels' RSS (KiB) meanwhile.
fn hold(topology: &Standalone, count: u64) -> Result<(usize, [u64; 2])> {
    let binary = test_support::built_binary("e2e-app")?;
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
            // To this destination only: the IPv6 section's connection idles in the pool.
            let filter = format!("( dst {SERVER_IP} and dport = :15008 )");
            let out = topology
                .a
                .stdout(&["ss", "-Htn", "state", "established", &filter])
                .ok()?;
            Some(out.lines().filter(|l| !l.trim().is_empty()).count())
        },
    )?;
    let rss = [topology.ztunnel_a.pid(), topology.ztunnel_b.pid()].map(rss_kib);
    let _ = child.kill();
    let _ = child.wait();
    Ok((hbone, rss))
}
