//! `make bench`: every cost a mesh user pays, measured twice in the same run (direct
//! and through the mesh) on the same namespaces, and reported as a ratio with the
//! raw numbers beside it. It measures; it never fails on a number.

mod cni;
mod enrollment;
mod inpod;
mod procfs;
mod report;
mod standalone;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Result};
use clap::Parser;

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
}

fn main() -> Result<()> {
    let args = Args::parse();
    if !e2e::can_run_root_tests() {
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
        }
    };
    // Both nodes' ztunnels share this machine's two cores; in a cluster each would
    // have its node to itself. One worker each models that (override with the env).
    if std::env::var_os("ZTUNNEL_WORKER_THREADS").is_none() {
        std::env::set_var("ZTUNNEL_WORKER_THREADS", "1");
    }
    let started = Instant::now();
    let mut figures = standalone::run(&plan)?;
    figures.extend(cni::run(&plan)?);
    figures.extend(inpod::run(&plan)?);
    figures.extend(enrollment::run(&plan)?);

    report::print_table(&figures);
    eprintln!("(took {:.0} s)", started.elapsed().as_secs_f64());
    if let Some(parent) = args.out.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&args.out, serde_json::to_string_pretty(&figures)?)?;
    eprintln!("raw samples: {}", args.out.display());
    Ok(())
}
