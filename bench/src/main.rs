//! `make bench`: every cost a mesh user pays, measured twice in the same run (direct
//! and through the mesh) on the same namespaces, and reported as a ratio with the
//! raw numbers beside it. It measures; it never fails on a number.

mod ca;
mod callgrind;
mod cni;
mod dns;
mod enrollment;
mod http_load;
mod inpod;

mod report;
mod soak;
mod standalone;
mod waypoint;
mod xds;
mod xds_failover;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Result};
use clap::{Parser, ValueEnum};

use report::Figure;

#[derive(Parser)]
#[command(about = "Mesh against direct, side by side")]
struct Args {
    /// A short run (under 3 minutes) to check the benchmark itself works.
    #[arg(long)]
    quick: bool,
    /// Where every figure and raw sample goes: rows of the same name are replaced,
    /// others kept, so a run of some sections updates only theirs.
    #[arg(long, default_value = "bench/results.json")]
    out: PathBuf,
    /// Run only these sections (comma-separated or repeated; default: all).
    /// Only `ca` and `xds` run without root.
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<Section>,
    /// Fail if an exact figure (callgrind's instruction counts) is more than 5 % above
    /// its row in this file (CI: the committed `bench/results.json`).
    #[arg(long)]
    gate: Option<PathBuf>,
}

/// The sections, in the order they run.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Section {
    /// Two dedicated-mode ztunnels, one HBONE hop: throughput, latency, churn, pooling.
    Standalone,
    /// The L7 waypoint: HTTP/1.1 latency and saturation direct, L4 and through the
    /// waypoint; its CPU per 1000 req/s and memory.
    Waypoint,
    /// The CNI plugin's ADD against `loopback`.
    Cni,
    /// ZDS add-to-ack and ztunnel memory per pod.
    Inpod,
    /// The DNS proxy: added latency against the upstream, answers per second.
    Dns,
    /// The local cluster: gated CNI ADD, enrollment, agent memory.
    Enrollment,
    /// istiod-lite's CreateCertificate under load.
    Ca,
    /// istiod-lite's delta xDS: a large mesh, hundreds of ztunnel streams.
    Xds,
    /// Instructions per byte, per round trip and per new connection through one HBONE
    /// hop, both ztunnels under callgrind (valgrind): exact, so CI gates on them.
    Callgrind,
    /// The growth figures of the last `make soak` (read, not run).
    Soak,
}

impl Section {
    fn needs_root(self) -> bool {
        !matches!(self, Section::Ca | Section::Xds | Section::Soak)
    }

    fn run(self, plan: &Plan) -> Result<Vec<Figure>> {
        match self {
            Section::Standalone => standalone::run(plan),
            Section::Waypoint => waypoint::run(plan),
            Section::Cni => cni::run(plan),
            Section::Inpod => inpod::run(plan),
            Section::Dns => dns::run(plan),
            Section::Enrollment => enrollment::run(plan),
            Section::Ca => ca::run(plan),
            Section::Xds => xds::run(plan),
            Section::Callgrind => callgrind::run(plan),
            Section::Soak => soak::run(plan),
        }
    }
}

/// How much of everything to do.
pub struct Plan {
    throughput_secs: u32,
    throughput_reps: usize,
    pings: u64,
    rate_pings: u64,
    churn: u64,
    held: u64,
    cni_runs: usize,
    pods: usize,
    ca_requests: usize,
    ca_clients: usize,
    ca_cold: usize,
    /// The paced run: requests per second across all clients, and how many.
    ca_paced_rate: f64,
    ca_paced_requests: usize,
    /// How long the DNS load clients run.
    dns_load_secs: u64,
    xds_pods: usize,
    xds_services: usize,
    xds_policies: usize,
    xds_clients: usize,
    xds_changes: usize,
    /// ztunnel clients of the two replicas in the failover figure.
    xds_failover_clients: usize,
    /// The waypoint section: rounds over the three paths, and each path's paced and
    /// closed-loop windows per round.
    waypoint_rounds: usize,
    waypoint_paced_secs: u64,
    waypoint_saturation_secs: u64,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let sections: Vec<Section> = Section::value_variants()
        .iter()
        .copied()
        .filter(|s| args.only.is_empty() || args.only.contains(s))
        .collect();
    if sections.iter().any(|s| s.needs_root()) && !test_support::can_run_root_tests() {
        bail!("the benchmark builds network namespaces: run it as root");
    }
    let plan = if args.quick {
        Plan {
            throughput_secs: 2,
            throughput_reps: 1,
            pings: 2000,
            rate_pings: 1000,
            churn: 200,
            held: 200,
            cni_runs: 30,
            pods: 20,
            ca_requests: 200,
            ca_clients: 20,
            ca_cold: 10,
            ca_paced_rate: 200.0,
            ca_paced_requests: 200,
            dns_load_secs: 1,
            xds_pods: 500,
            xds_services: 50,
            xds_policies: 20,
            xds_clients: 50,
            xds_changes: 3,
            xds_failover_clients: 20,
            waypoint_rounds: 1,
            waypoint_paced_secs: 3,
            waypoint_saturation_secs: 2,
        }
    } else {
        Plan {
            throughput_secs: 10,
            throughput_reps: 3,
            pings: 20000,
            rate_pings: 5000,
            churn: 2000,
            held: 1000,
            cni_runs: 200,
            pods: 100,
            ca_requests: 1000,
            ca_clients: 50,
            ca_cold: 30,
            ca_paced_rate: 500.0,
            ca_paced_requests: 1000,
            dns_load_secs: 5,
            xds_pods: 10_000,
            xds_services: 1_000,
            xds_policies: 200,
            xds_clients: 500,
            xds_changes: 20,
            xds_failover_clients: 50,
            waypoint_rounds: 3,
            waypoint_paced_secs: 10,
            waypoint_saturation_secs: 5,
        }
    };
    // Both nodes' ztunnels share this machine's two cores; in a cluster each would
    // have its node to itself. One worker each models that (override with the env).
    if std::env::var_os("ZTUNNEL_WORKER_THREADS").is_none() {
        std::env::set_var("ZTUNNEL_WORKER_THREADS", "1");
    }
    let started = Instant::now();
    let mut figures = Vec::new();
    for section in sections {
        figures.extend(section.run(&plan)?);
    }

    report::print_table(&figures);
    eprintln!("(took {:.0} s)", started.elapsed().as_secs_f64());
    // Judged against the baseline before this run's figures are written anywhere.
    let regressions = match &args.gate {
        Some(baseline) => report::gate(&figures, baseline)?,
        None => Vec::new(),
    };
    report::merge_into(&args.out, &figures)?;
    eprintln!("figures and raw samples: {}", args.out.display());
    // Every process the run started carries its owner marker: none may outlive it.
    let marker = test_support::owner::owner_marker();
    test_support::owner::check_no_leftovers(&marker, std::time::Duration::from_secs(3))?;
    if !regressions.is_empty() {
        bail!(
            "regressions against the baseline:\n  {}",
            regressions.join("\n  ")
        );
    }
    Ok(())
}
