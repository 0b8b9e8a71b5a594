//! `istiod-lite`: flags and environment, then [`istiod_lite::app::run`].

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "istiod-lite",
    version,
    about = "The mesh control plane: Istio's certificate service with Kubernetes token authentication",
    // Read outside the flags (logging, kube client); listed so a chart's env can be
    // checked against it.
    after_help = "Environment also read: RUST_LOG, LOG_FORMAT, RUST_BACKTRACE, KUBECONFIG, KUBERNETES_SERVICE_HOST, KUBERNETES_SERVICE_PORT"
)]
struct Cli {
    #[command(flatten)]
    config: istiod_lite::config::Config,
}

/// mimalloc hands memory back after a burst (every ztunnel's initial sync at once)
/// where glibc's allocator keeps the peak.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    mesh_runtime::logging::init(&mesh_runtime::logging::Settings::from_env(
        "info",
        Some("istiod_lite::"),
    ));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(istiod_lite::app::run(cli.config))
}
