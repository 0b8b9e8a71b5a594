//! Wires the waypoint into ztunnel's dedicated-mode runtime: ztunnel's app sets up
//! identity, discovery and the admin, metrics and readiness servers, and hands the
//! workload's inputs to the waypoint's own listener.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use futures::FutureExt;
use shared_types::duration::parse_duration;
use shared_types::istio::xds::ROUTER_NODE;
use tracing::info;
use ztunnel::config::{Config, ProxyMode};
use ztunnel::metrics::Metrics;

use crate::config::{ConfigFollower, SharedConfig};
use crate::metrics::RequestMetrics;
use crate::policy::WaypointRef;
use crate::proxy::Waypoint;

/// The waypoint's own settings, beside ztunnel's.
#[derive(Clone, Debug, clap::Args)]
pub struct WaypointArgs {
    /// The Gateway this waypoint is (its `targetRefs` name); by default the workload's
    /// name from PROXY_WORKLOAD_INFO.
    #[arg(long, env = "GATEWAY_NAME")]
    pub gateway_name: Option<String>,
    /// AuthorizationPolicy, HTTPRoute, GRPCRoute and TCPRoute objects (a YAML stream,
    /// as `kubectl apply -f` takes), for a waypoint without a control plane; followed
    /// as the file changes.
    #[arg(long, env = "WAYPOINT_CONFIG_PATH")]
    pub config_path: Option<PathBuf>,
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
    // A waypoint serves one workload: itself. Its pod is not captured (it terminates
    // HBONE itself), so its sockets need no mark (which would need CAP_NET_ADMIN), and
    // it resolves nothing through a DNS proxy.
    config.proxy_mode = ProxyMode::Dedicated;
    config.packet_mark = 0;
    config.dns_capture = false;
    let info = config
        .proxy_workload_info
        .clone()
        .context("the waypoint needs PROXY_WORKLOAD_INFO=<namespace>/<name>/<service-account>")?;
    let waypoint = WaypointRef {
        namespace: info.namespace.clone(),
        name: args.gateway_name.clone().unwrap_or(info.name.clone()),
        root_namespace: config.root_namespace.clone(),
    };
    let shared: SharedConfig = Arc::default();
    let requests = RequestMetrics::default();
    let metrics = {
        let requests = requests.clone();
        Arc::new(Metrics::for_component("waypoint", move |registry| {
            requests.register(registry)
        }))
    };
    let start: ztunnel::app::StartProxy = Box::new(move |config, inputs, synced| {
        let addr = config.inbound_addr;
        let cluster_domain = config.cluster_domain.clone();
        async move {
            if let Some(path) = args.config_path {
                ztunnel::discovery::watch_file(
                    crate::objects::watched(path.clone()),
                    inputs.state.clone(),
                    inputs.metrics.local_config_reloads.clone(),
                    inputs.metrics.local_config_errors.clone(),
                    inputs.drain.accepting_token(),
                )
                .await
                .with_context(|| format!("loading WAYPOINT_CONFIG_PATH {}", path.display()))?;
            }
            let listener = inputs
                .sockets
                .tcp_listener(addr, false)
                .await
                .with_context(|| format!("binding the waypoint's HBONE listener {addr}"))?;
            info!(%addr, "waypoint listening for HBONE");
            let state = inputs.state.clone();
            let proxy = Waypoint::new(
                inputs,
                shared.clone(),
                requests,
                args.header_read_timeout,
                cluster_domain,
            );
            tokio::spawn(async move {
                // Nothing is served before discovery's first complete state: until its
                // policies arrive, an empty set would allow everything. (Clients wait
                // in the listen backlog.)
                if let Some(synced) = synced {
                    if !synced.wait_synced().await {
                        return;
                    }
                }
                let mut follower = ConfigFollower::new(state, waypoint, shared);
                follower.refresh();
                tokio::spawn(follower.run());
                proxy.run(listener).await
            });
            Ok(())
        }
        .boxed()
    });
    let proxy = ztunnel::app::CustomProxy {
        xds_types: &ztunnel::discovery::xds::WAYPOINT_TYPES,
        node_type: ROUTER_NODE,
        start,
    };
    ztunnel::app::run_with(config, logging, metrics, Some(proxy)).await
}
