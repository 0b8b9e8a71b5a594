//! kube-apiserver-lite: the local Kubernetes API server of the demo and e2e tests.
//! Parses flags and runs `kube_apiserver_lite`; see that module for what is served.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use kube_apiserver_lite::{write_kubeconfig, ApiServer, Options, DEFAULT_ISSUER};

#[derive(Parser, Debug)]
#[command(about = "A small Kubernetes API server (plain HTTP, no auth) for tests and demos")]
struct Args {
    /// Address to listen on (port 0 picks a free port; see the printed URL).
    #[arg(long, default_value = "127.0.0.1:6443")]
    listen: String,
    /// JSON snapshot persisted on every change and loaded on start.
    #[arg(long)]
    state_file: Option<PathBuf>,
    /// Write a kubeconfig for this server to PATH once listening.
    #[arg(long, value_name = "PATH")]
    print_kubeconfig: Option<PathBuf>,
    /// Write the (self-signed) serving certificate to PATH once listening: the CA
    /// in-cluster clients trust.
    #[arg(long, value_name = "PATH")]
    tls_cert_file: Option<PathBuf>,
    /// Events kept for resuming watches; older resourceVersions get 410 Gone.
    #[arg(long, default_value_t = 10_000)]
    event_log_size: usize,
    /// Seconds between watch bookmarks.
    #[arg(long, default_value_t = 5)]
    bookmark_interval: u64,
    /// `iss` of service account tokens, and their default audience.
    #[arg(long, default_value = DEFAULT_ISSUER)]
    service_account_issuer: String,
    /// PKCS#8 PEM ECDSA P-256 key signing service account tokens (created when missing).
    /// Default: beside the state file (`<state>.sa.key`), else a key in memory only.
    #[arg(long, value_name = "PATH")]
    service_account_signing_key_file: Option<PathBuf>,
    /// Service ClusterIP ranges: one, or one per family for dual-stack Services
    /// (the first is the primary family), as kube-apiserver's flag.
    #[arg(long, default_value = kube_apiserver_lite::service_ips::DEFAULT_RANGE)]
    service_cluster_ip_range: kube_apiserver_lite::service_ips::ServiceRanges,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let options = Options {
        state_file: args.state_file,
        event_log_capacity: args.event_log_size,
        bookmark_interval: Duration::from_secs(args.bookmark_interval.max(1)),
        service_account_issuer: args.service_account_issuer,
        service_account_key_file: args.service_account_signing_key_file,
        service_cluster_ip_range: args.service_cluster_ip_range,
        ..Options::default()
    };
    let server = ApiServer::bind_with(args.listen.as_str(), options)
        .await
        .with_context(|| format!("starting on {}", args.listen))?;
    if let Some(path) = &args.print_kubeconfig {
        write_kubeconfig(path, &server.url())
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.tls_cert_file {
        let pem = server
            .certificate_pem()
            .context("no TLS certificate to write")?;
        std::fs::write(path, pem).with_context(|| format!("writing {}", path.display()))?;
    }
    // One line on stdout, so a parent using port 0 can learn the address.
    println!("kube-apiserver-lite listening on {}", server.url());
    let control = server.spawn();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    control.shutdown();
    control.stopped().await;
    Ok(())
}
