//! waypoint binary: Istio's environment (as ztunnel's dedicated mode reads it), plus
//! the waypoint's own settings.

use clap::Parser;
use waypoint::app::WaypointArgs;
use ztunnel::config::Config;

#[derive(Parser)]
#[command(
    name = "waypoint",
    version,
    about = "Ambient mesh waypoint: L7 authorization and telemetry over HBONE"
)]
struct Cli {
    #[command(flatten)]
    config: Config,
    #[command(flatten)]
    waypoint: WaypointArgs,
}

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let logging = mesh_runtime::logging::init(&mesh_runtime::logging::Settings::from_env(
        "info",
        Some("waypoint::"),
    ));
    let workers = cli.config.worker_threads;
    ztunnel::workers::run(
        workers,
        waypoint::app::run(cli.config, cli.waypoint, Some(logging)),
    )?
}
