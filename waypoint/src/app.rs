//! Wires the waypoint into ztunnel's dedicated-mode runtime: ztunnel's app sets up
//! identity, discovery and the admin, metrics and readiness servers, and hands the
//! workload's inputs to the waypoint's own listener.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use shared_types::duration::parse_duration;

use anyhow::Context;
use futures::FutureExt;
use tracing::info;
use ztunnel::config::{Config, ProxyMode};
use ztunnel::metrics::Metrics;

use crate::metrics::RequestMetrics;
use crate::policy::{parse_policies, Policies, WaypointRef};
use crate::proxy::Waypoint;

/// The waypoint's own settings, beside ztunnel's.
#[derive(Clone, Debug, clap::Args)]
pub struct WaypointArgs {
    /// The Gateway this waypoint is (its `targetRefs` name); by default the workload's
    /// name from PROXY_WORKLOAD_INFO.
    #[arg(long, env = "GATEWAY_NAME")]
    pub gateway_name: Option<String>,
    /// AuthorizationPolicy objects (a YAML stream, as `kubectl apply -f` takes), for a
    /// waypoint without a control plane.
    #[arg(long, env = "WAYPOINT_POLICY_PATH")]
    pub policy_path: Option<PathBuf>,
    /// How long a client may take to send a request's headers (slow clients are
    /// closed: a slowloris cannot hold the waypoint's connections).
    #[arg(long, env = "HEADER_READ_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub header_read_timeout: Duration,
}

pub async fn run(
    mut config: Config,
    args: WaypointArgs,
    logging: Option<mesh_runtime::logging::LogHandle>,
) -> anyhow::Result<()> {
    // A waypoint serves one workload: itself.
    config.proxy_mode = ProxyMode::Dedicated;
    let info = config
        .proxy_workload_info
        .clone()
        .context("the waypoint needs PROXY_WORKLOAD_INFO=<namespace>/<name>/<service-account>")?;
    let waypoint = WaypointRef {
        namespace: info.namespace.clone(),
        name: args.gateway_name.clone().unwrap_or(info.name.clone()),
        root_namespace: config.root_namespace.clone(),
    };
    let policies = match &args.policy_path {
        Some(path) => {
            let yaml = std::fs::read_to_string(path)
                .with_context(|| format!("reading WAYPOINT_POLICY_PATH {}", path.display()))?;
            let all = parse_policies(&yaml)
                .with_context(|| format!("WAYPOINT_POLICY_PATH {}", path.display()))?;
            Policies::for_waypoint(all, &waypoint)
        }
        None => Policies::default(),
    };
    info!(gateway = %format!("{}/{}", waypoint.namespace, waypoint.name), policies = policies.len(), "waypoint policies loaded");
    let policies = Arc::new(RwLock::new(Arc::new(policies)));
    let requests = RequestMetrics::default();
    let metrics = {
        let requests = requests.clone();
        Arc::new(Metrics::for_component("waypoint", move |registry| {
            requests.register(registry)
        }))
    };
    let proxy: ztunnel::app::DedicatedProxy = Box::new(move |config, inputs| {
        let addr = config.inbound_addr;
        async move {
            let listener = inputs
                .sockets
                .tcp_listener(addr, false)
                .await
                .with_context(|| format!("binding the waypoint's HBONE listener {addr}"))?;
            info!(%addr, "waypoint listening for HBONE");
            let waypoint = Waypoint::new(inputs, policies, requests, args.header_read_timeout);
            tokio::spawn(waypoint.run(listener));
            Ok(())
        }
        .boxed()
    });
    ztunnel::app::run_with(config, logging, metrics, Some(proxy)).await
}
