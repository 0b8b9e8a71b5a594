//! The L7 waypoint (`local_cluster::waypoint`): HTTP/1.1 GETs answered with 1 KiB,
//! from VM A to VM B's server over four paths side by side in one topology, round
//! by round: (a) direct (a port A's capture skips), (b) the L4 mesh (A's ztunnel to
//! B's ztunnel, the Service not bound to the waypoint), (c) through the waypoint
//! (A's ztunnel -> waypoint -> B's ztunnel) and (d) through the waypoint with an
//! HTTPRoute: two rules, the request taking a 90/10 split between two Services. For
//! each: latency at a paced 1000 req/s and the rate at saturation; the waypoint's CPU
//! per 1000 req/s and its RSS idle and under load. The same namespaces switch between
//! (b) and (c) by rewriting the local config, as a user binds a Service with
//! `istio.io/use-waypoint`, and between (c) and (d) by applying the route.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use local_cluster::mesh::{metric_sum, ztunnel_metrics};
use local_cluster::standalone::SERVER_IP;
use local_cluster::waypoint::{waypoint_config, WaypointMesh, HTTP_TARGET_PORT, VERSIONS};
use test_support::poll::wait_for;
use test_support::process::ChildGuard;
use test_support::procfs::{clock_ticks, cpu_ticks, rss_kib};

use crate::http_load::{self, Outcome, Pace};
use crate::report::{median, percentile, ratio, single, Figure};
use crate::Plan;

/// Every answer's body.
const BODY_BYTES: usize = 1024;
/// The paced rate, across the paced connections.
const PACED_RATE: f64 = 1000.0;
const PACED_CONNECTIONS: usize = 10;
const SATURATION_CONNECTIONS: usize = 16;
/// B's second HTTP server, for the direct path: a port A's capture excludes
/// (`Standalone` skips it for the standalone section's direct iperf3, which does not
/// run in this topology).
const DIRECT_HTTP_PORT: u16 = 5202;

/// What the waypoint enforces: Istio's AuthorizationPolicies, so every request is
/// authorized on its own (the GETs match the ALLOW rule and no DENY rule).
const POLICIES: &str = r#"
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: no-admin, namespace: vms}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: waypoint}]
  action: DENY
  rules:
  - to: [{operation: {paths: ["/admin*"]}}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: client-reads, namespace: vms}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: waypoint}]
  action: ALLOW
  rules:
  - from: [{source: {principals: [cluster.local/ns/vms/sa/client]}}]
    to: [{operation: {methods: [GET, HEAD]}}]
"#;

/// The routed path's HTTPRoute: a header-matched rule the load does not take, then
/// the 90/10 split it does (echo-v1 and echo-v2, servers like the Service's).
const ROUTE: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: split, namespace: vms}
spec:
  parentRefs: [{group: "", kind: Service, name: echo, port: 8080}]
  rules:
  - matches: [{headers: [{name: x-canary, value: "yes"}]}]
    backendRefs: [{name: echo-v2, port: 8080}]
  - backendRefs: [{name: echo-v1, port: 8080, weight: 90}, {name: echo-v2, port: 8080, weight: 10}]
"#;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Path {
    Direct,
    L4,
    Waypoint,
    Routed,
}

/// One load window on one path, and what the proxies spent meanwhile.
struct Window {
    outcome: Outcome,
    /// Requests made, the untimed first one per connection included.
    requests: u64,
    waypoint_ticks: u64,
    ztunnel_ticks: u64,
    /// The waypoint's largest RSS seen during the window, KiB.
    waypoint_rss_peak: u64,
}

#[derive(Default)]
struct PathRuns {
    paced: Vec<Window>,
    saturated: Vec<Window>,
}

pub fn run(plan: &Plan) -> Result<Vec<Figure>> {
    eprintln!("waypoint: VMs A and B with a waypoint W, HTTP/1.1 GETs with 1 KiB answers...");
    let mut wp = WaypointMesh::new("bwp", POLICIES)?;
    // Up and ready, before any request.
    let rss_idle = rss_kib(wp.waypoint.pid());
    fixed_size_servers(&mut wp)?;
    route(&wp, true)?;
    check_direct_is_not_captured(&wp)?;

    let mut runs: [PathRuns; 4] = Default::default();
    let (mut through_waypoint, mut routed) = (true, false);
    for round in 0..plan.waypoint_rounds {
        // The mesh paths in turns, so few switches of the config per round.
        let order = if round % 2 == 0 {
            [Path::Direct, Path::Routed, Path::Waypoint, Path::L4]
        } else {
            [Path::Direct, Path::L4, Path::Waypoint, Path::Routed]
        };
        for path in order {
            if path != Path::Direct {
                let want = path != Path::L4;
                if want != through_waypoint {
                    route(&wp, want)?;
                    through_waypoint = want;
                }
            }
            if matches!(path, Path::Waypoint | Path::Routed) && routed != (path == Path::Routed) {
                routed = path == Path::Routed;
                let objects = if routed {
                    format!("{POLICIES}---{ROUTE}")
                } else {
                    POLICIES.to_owned()
                };
                wp.set_objects(&objects)?;
            }
            eprintln!(
                "waypoint: round {}/{}, {path:?}: {} s at {PACED_RATE} req/s, {} s closed loop...",
                round + 1,
                plan.waypoint_rounds,
                plan.waypoint_paced_secs,
                plan.waypoint_saturation_secs
            );
            let slot = &mut runs[path as usize];
            let paced = Pace::Paced { rate: PACED_RATE };
            slot.paced.push(window(
                &wp,
                path,
                paced,
                PACED_CONNECTIONS,
                plan.waypoint_paced_secs,
            )?);
            slot.saturated.push(window(
                &wp,
                path,
                Pace::Closed,
                SATURATION_CONNECTIONS,
                plan.waypoint_saturation_secs,
            )?);
        }
    }
    let rss_after = rss_kib(wp.waypoint.pid());
    warn_about_failures(&runs);
    Ok(figures(&runs, rss_idle, rss_after))
}

/// The topology's server behind the Service answers JSON of varying size: it is
/// restarted answering `BODY_BYTES`, and a twin on `DIRECT_HTTP_PORT` serves the
/// direct path. Both are checked to answer so.
fn fixed_size_servers(wp: &mut WaypointMesh) -> Result<()> {
    let body_bytes = BODY_BYTES.to_string();
    wp.restart_http_server(&["--body-bytes", &body_bytes])?;
    wp.start_versions(&["--body-bytes", &body_bytes])?;
    let app = test_support::built_binary("e2e-app")?;
    let mut cmd = wp.mesh.b.command(app.to_str().context("path")?);
    cmd.args(["http", "--listen", &format!("0.0.0.0:{DIRECT_HTTP_PORT}")]);
    cmd.args(["--body-bytes", &body_bytes]);
    let direct = ChildGuard::spawn(&format!("http{DIRECT_HTTP_PORT}-{}", wp.mesh.b.name()), cmd)?;
    wp.mesh.apps.push(direct);
    let versions = VERSIONS.map(|(_, _, port)| port);
    for port in [HTTP_TARGET_PORT, DIRECT_HTTP_PORT, versions[0], versions[1]] {
        let addr: SocketAddr = format!("{SERVER_IP}:{port}").parse()?;
        // From B itself: no capture there.
        wait_for(
            "B's HTTP server with fixed-size answers",
            Duration::from_secs(10),
            || {
                let (status, body) = wp
                    .mesh
                    .b
                    .run_inside(|| test_support::http::request(addr, "GET", "/", &[]))
                    .ok()?
                    .ok()?;
                (status == 200 && body.len() == BODY_BYTES).then_some(())
            },
        )?;
    }
    Ok(())
}

/// A request from A to the direct port must not open a connection at A's ztunnel
/// (where one to the Service's VIP does).
fn check_direct_is_not_captured(wp: &WaypointMesh) -> Result<()> {
    let opened = || -> Result<f64> {
        Ok(metric_sum(
            &ztunnel_metrics(&wp.mesh.a)?,
            "istio_tcp_connections_opened_total",
            &[("reporter", "source")],
        ))
    };
    let before = opened()?;
    let direct = direct_addr();
    let (status, _) = wp
        .mesh
        .a
        .run_inside(move || test_support::http::request(direct, "GET", "/", &[]))??;
    let after_direct = opened()?;
    wp.request("GET", "/", &[])?;
    let after_vip = opened()?;
    if status != 200 || after_direct != before || after_vip <= after_direct {
        bail!(
            "the direct path to {direct} is not direct (status {status}; A's ztunnel opened {} connections for it, {} for one to the VIP): is its port still excluded from A's capture?",
            after_direct - before,
            after_vip - after_direct
        );
    }
    Ok(())
}

fn direct_addr() -> SocketAddr {
    SocketAddr::new(SERVER_IP.parse().expect("address"), DIRECT_HTTP_PORT)
}

/// Binds the Service to the waypoint (or not) and waits until A's new connections
/// take that path: three requests in a row answered 200, and each counted by the
/// waypoint (or none).
fn route(wp: &WaypointMesh, through_waypoint: bool) -> Result<()> {
    wp.mesh
        .set_config(&waypoint_config(through_waypoint, false))?;
    let counted = || -> Option<f64> {
        Some(metric_sum(
            &ztunnel_metrics(&wp.w).ok()?,
            "istio_requests_total",
            &[("reporter", "waypoint")],
        ))
    };
    let what = if through_waypoint {
        "requests to take the waypoint"
    } else {
        "requests to bypass the waypoint (L4 only)"
    };
    wait_for(what, Duration::from_secs(15), || {
        let before = counted()?;
        for _ in 0..3 {
            let (status, _) = wp.request("GET", "/", &[]).ok()?;
            (status == 200).then_some(())?;
        }
        let seen = counted()? - before;
        let expected = if through_waypoint { 3.0 } else { 0.0 };
        (seen == expected).then_some(())
    })
}

/// One load window on `path`, with the proxies' CPU and the waypoint's RSS peak.
fn window(
    wp: &WaypointMesh,
    path: Path,
    pace: Pace,
    connections: usize,
    secs: u64,
) -> Result<Window> {
    let target = match path {
        Path::Direct => direct_addr(),
        _ => WaypointMesh::http_vip(),
    };
    let waypoint = wp.waypoint.pid();
    let ztunnels = [wp.mesh.ztunnel_a.pid(), wp.mesh.ztunnel_b.pid()];
    let ztunnel_ticks = || ztunnels.iter().map(|p| cpu_ticks(*p)).sum::<u64>();
    let (w0, z0) = (cpu_ticks(waypoint), ztunnel_ticks());
    let stop = AtomicBool::new(false);
    let (outcome, waypoint_rss_peak) = std::thread::scope(|scope| {
        let sampler = scope.spawn(|| {
            let mut peak = rss_kib(waypoint);
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
                peak = peak.max(rss_kib(waypoint));
            }
            peak
        });
        let outcome = http_load::run(
            &wp.mesh.a,
            target,
            connections,
            pace,
            Duration::from_secs(secs),
            BODY_BYTES,
        );
        stop.store(true, Ordering::Relaxed);
        (outcome, sampler.join().unwrap_or(0))
    });
    let outcome = outcome.with_context(|| format!("HTTP load on the {path:?} path"))?;
    Ok(Window {
        requests: outcome.ok + outcome.failed + connections as u64,
        // Saturating: a proxy that died meanwhile reads as 0.
        waypoint_ticks: cpu_ticks(waypoint).saturating_sub(w0),
        ztunnel_ticks: ztunnel_ticks().saturating_sub(z0),
        waypoint_rss_peak,
        outcome,
    })
}

fn warn_about_failures(runs: &[PathRuns; 4]) {
    let paths = [Path::Direct, Path::L4, Path::Waypoint, Path::Routed];
    for (path, run) in paths.iter().zip(runs) {
        for (kind, windows) in [("paced", &run.paced), ("closed-loop", &run.saturated)] {
            let failed: u64 = windows.iter().map(|w| w.outcome.failed).sum();
            let queued: u64 = windows.iter().map(|w| w.outcome.queued).sum();
            if failed > 0 {
                let first = windows
                    .iter()
                    .find_map(|w| w.outcome.first_error.clone())
                    .unwrap_or_default();
                eprintln!("waypoint: {path:?}, {kind}: {failed} requests failed (first: {first})");
            }
            let requests: u64 = windows.iter().map(|w| w.requests).sum();
            // A few stragglers are the scheduler's; more is the path falling behind.
            if queued * 100 > requests {
                eprintln!(
                    "waypoint: {path:?}, {kind}: {queued} of {requests} requests were due before the previous answer on their connection (the path fell behind the pace)"
                );
            }
        }
    }
}

fn figures(runs: &[PathRuns; 4], rss_idle: u64, rss_after: u64) -> Vec<Figure> {
    let [direct, l4, waypoint, routed] = runs;
    // Percentiles over every paced request of a path; the JSON keeps each round's.
    let pooled = |run: &PathRuns, p: f64| {
        let all: Vec<f64> = run
            .paced
            .iter()
            .flat_map(|w| w.outcome.latencies_us.iter().copied())
            .collect();
        percentile(&all, p)
    };
    let per_round = |run: &PathRuns, p: f64| -> Vec<f64> {
        run.paced
            .iter()
            .map(|w| percentile(&w.outcome.latencies_us, p))
            .collect()
    };
    let added = |name: &str, base: &PathRuns, over: &PathRuns, p: f64, goal: &'static str| {
        let (b, o) = (pooled(base, p), pooled(over, p));
        Figure {
            name: name.to_owned(),
            unit: "µs",
            direct: Some(b),
            mesh: o,
            ratio: Some(o - b),
            ratio_kind: "mesh-direct",
            goal,
            samples_direct: per_round(base, p),
            samples_mesh: per_round(over, p),
            ..Figure::default()
        }
    };
    let rates =
        |run: &PathRuns| -> Vec<f64> { run.saturated.iter().map(|w| w.outcome.rate()).collect() };
    // CPU-seconds per request x 1000 = vCPU kept busy by 1000 req/s.
    let per_1000 = |windows: &[Window], ticks: &dyn Fn(&Window) -> u64| -> Vec<f64> {
        windows
            .iter()
            .map(|w| ticks(w) as f64 / clock_ticks() * 1000.0 / w.requests.max(1) as f64)
            .collect()
    };
    let waypoint_ticks = |w: &Window| w.waypoint_ticks;
    let proxies_ticks = |w: &Window| w.ztunnel_ticks;
    let all_ticks = |w: &Window| w.ztunnel_ticks + w.waypoint_ticks;
    let mib = |kib: u64| kib as f64 / 1024.0;
    let peaks = |windows: &[Window]| -> Vec<f64> {
        windows.iter().map(|w| mib(w.waypoint_rss_peak)).collect()
    };
    let max = |samples: &[f64]| samples.iter().copied().fold(0.0, f64::max);
    let paced_rate: Vec<f64> = waypoint.paced.iter().map(|w| w.outcome.rate()).collect();
    // Totals over the paced and closed-loop windows; the JSON keeps each window's.
    let failed = |run: &PathRuns| -> Vec<f64> {
        run.paced
            .iter()
            .chain(&run.saturated)
            .map(|w| w.outcome.failed as f64)
            .collect()
    };
    let failures = |name: &str, base: Option<&PathRuns>, over: &PathRuns| Figure {
        name: name.to_owned(),
        unit: "requests",
        direct: base.map(|b| failed(b).iter().sum()),
        mesh: failed(over).iter().sum(),
        goal: "0",
        samples_direct: base.map(failed).unwrap_or_default(),
        samples_mesh: failed(over),
        ..Figure::default()
    };

    vec![
        added(
            "waypoint: L4 added p50, 1000 req/s (vs direct)",
            direct,
            l4,
            0.5,
            "",
        ),
        added(
            "waypoint: L4 added p99, 1000 req/s (vs direct)",
            direct,
            l4,
            0.99,
            "",
        ),
        added(
            "waypoint: added p50, 1000 req/s (vs L4)",
            l4,
            waypoint,
            0.5,
            "<= +150 µs",
        ),
        added(
            "waypoint: added p99, 1000 req/s (vs L4)",
            l4,
            waypoint,
            0.99,
            "",
        ),
        series(
            "waypoint: paced rate achieved",
            "req/s",
            paced_rate,
            median,
            "1000",
        ),
        ratio(
            "waypoint: saturation req/s, L4 / direct",
            "req/s",
            rates(direct),
            rates(l4),
            "",
        ),
        ratio(
            "waypoint: saturation req/s, waypoint / L4",
            "req/s",
            rates(l4),
            rates(waypoint),
            "",
        ),
        series(
            "waypoint: CPU per 1000 req/s (paced)",
            "vCPU",
            per_1000(&waypoint.paced, &waypoint_ticks),
            median,
            "<= 0.10 vCPU",
        ),
        series(
            "waypoint: CPU per 1000 req/s (saturation)",
            "vCPU",
            per_1000(&waypoint.saturated, &waypoint_ticks),
            median,
            "",
        ),
        ratio(
            "waypoint: all proxies' CPU per 1000 req/s vs L4",
            "vCPU",
            per_1000(&l4.paced, &proxies_ticks),
            per_1000(&waypoint.paced, &all_ticks),
            "",
        ),
        single(
            "waypoint: RSS idle (ready, before any request)",
            "MiB",
            mib(rss_idle),
            "<= 20 MiB",
        ),
        series(
            "waypoint: RSS at 1000 req/s (peak)",
            "MiB",
            peaks(&waypoint.paced),
            max,
            "<= 40 MiB",
        ),
        series(
            &format!("waypoint: RSS at saturation, {SATURATION_CONNECTIONS} conns (peak)"),
            "MiB",
            peaks(&waypoint.saturated),
            max,
            "<= 40 MiB",
        ),
        single("waypoint: RSS after the load", "MiB", mib(rss_after), ""),
        failures("waypoint: failed requests (vs L4)", Some(l4), waypoint),
        added(
            "waypoint: routed 90/10 added p50 (vs waypoint)",
            waypoint,
            routed,
            0.5,
            "<= +20 µs (issue 38)",
        ),
        ratio(
            "waypoint: routed 90/10 CPU per 1000 req/s / wp",
            "vCPU",
            per_1000(&waypoint.paced, &waypoint_ticks),
            per_1000(&routed.paced, &waypoint_ticks),
            "<= 1.10 (issue 38)",
        ),
        failures("waypoint: routed 90/10, failed requests", None, routed),
    ]
}

/// A row of one value, `summary` of `samples`, with every sample kept for the JSON.
fn series(
    name: &str,
    unit: &'static str,
    samples: Vec<f64>,
    summary: impl Fn(&[f64]) -> f64,
    goal: &'static str,
) -> Figure {
    let mut figure = single(name, unit, summary(&samples), goal);
    figure.samples_mesh = samples;
    figure
}
