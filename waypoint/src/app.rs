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
use shared_types::waypoint::WaypointPolicy;
use tracing::{info, warn};
use ztunnel::config::{Config, ProxyMode};
use ztunnel::metrics::Metrics;
use ztunnel::state::StateStore;

use crate::metrics::RequestMetrics;
use crate::policy::{parse_policies, Policies, Policy, WaypointRef};
use crate::proxy::{SharedPolicies, Waypoint};

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
    let from_file = match &args.policy_path {
        Some(path) => {
            let yaml = std::fs::read_to_string(path)
                .with_context(|| format!("reading WAYPOINT_POLICY_PATH {}", path.display()))?;
            parse_policies(&yaml)
                .with_context(|| format!("WAYPOINT_POLICY_PATH {}", path.display()))?
        }
        None => Vec::new(),
    };
    let policies: SharedPolicies = Arc::default();
    let requests = RequestMetrics::default();
    let metrics = {
        let requests = requests.clone();
        Arc::new(Metrics::for_component("waypoint", move |registry| {
            requests.register(registry)
        }))
    };
    let start: ztunnel::app::StartProxy = Box::new(move |config, inputs, synced| {
        let addr = config.inbound_addr;
        async move {
            let listener = inputs
                .sockets
                .tcp_listener(addr, false)
                .await
                .with_context(|| format!("binding the waypoint's HBONE listener {addr}"))?;
            info!(%addr, "waypoint listening for HBONE");
            let state = inputs.state.clone();
            let proxy = Waypoint::new(inputs, policies.clone(), requests, args.header_read_timeout);
            tokio::spawn(async move {
                // Nothing is served before discovery's first complete state: until its
                // policies arrive, an empty set would allow everything. (Clients wait
                // in the listen backlog.)
                if let Some(synced) = synced {
                    if !synced.wait_synced().await {
                        return;
                    }
                }
                let mut follower = PolicyFollower::new(state, from_file, waypoint, policies);
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

/// The policies of this waypoint now: those of the file, and those discovery holds
/// (istiod-lite's waypoint policies over xDS).
fn compile(
    discovered: &[Arc<WaypointPolicy>],
    from_file: &[Policy],
    waypoint: &WaypointRef,
) -> Policies {
    let mut all = from_file.to_vec();
    for p in discovered {
        match Policy::from_json(p.namespace.clone(), p.name.clone(), &p.spec_json) {
            Ok(policy) => all.push(policy),
            Err(e) => {
                let policy = format!("{}/{}", p.namespace, p.name);
                warn!(%policy, error = %e, "waypoint policy ignored")
            }
        }
    }
    Policies::for_waypoint(all, waypoint)
}

/// Keeps the shared policies in step with discovery's waypoint policies: recompiled
/// when those change, not at every other push (workloads and services come and go far
/// more often).
struct PolicyFollower {
    state: StateStore,
    changes: tokio::sync::watch::Receiver<u64>,
    from_file: Vec<Policy>,
    waypoint: WaypointRef,
    shared: SharedPolicies,
    /// The discovered policies compiled last, held so their addresses identify them (an
    /// unchanged one keeps its `Arc` from one snapshot to the next; a held one cannot
    /// be freed and its address reused by another).
    compiled: Option<Vec<Arc<WaypointPolicy>>>,
}

impl PolicyFollower {
    fn new(
        state: StateStore,
        from_file: Vec<Policy>,
        waypoint: WaypointRef,
        shared: SharedPolicies,
    ) -> Self {
        PolicyFollower {
            changes: state.subscribe(),
            state,
            from_file,
            waypoint,
            shared,
            compiled: None,
        }
    }

    /// Recompiles if discovery's policies changed since the last time.
    fn refresh(&mut self) {
        let mut current: Vec<Arc<WaypointPolicy>> =
            self.state.snapshot().waypoint_policies().cloned().collect();
        current.sort_unstable_by_key(|p| Arc::as_ptr(p) as usize);
        let unchanged = self.compiled.as_ref().is_some_and(|last| {
            last.len() == current.len() && last.iter().zip(&current).all(|(a, b)| Arc::ptr_eq(a, b))
        });
        if unchanged {
            return;
        }
        let policies = compile(&current, &self.from_file, &self.waypoint);
        let gateway = format!("{}/{}", self.waypoint.namespace, self.waypoint.name);
        info!(%gateway, policies = policies.len(), "waypoint policies in force");
        *self.shared.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(policies);
        self.compiled = Some(current);
    }

    /// Refreshes after every change, until the state store is dropped.
    async fn run(mut self) {
        while self.changes.changed().await.is_ok() {
            self.refresh();
        }
    }
}
