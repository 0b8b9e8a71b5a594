//! Wires ztunnel's parts together and runs them until shutdown.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use futures::future::BoxFuture;
use shared_types::istio::xds::ZTUNNEL_NODE;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::admin::Admin;
use crate::config::{Config, DiscoverySource, ProxyMode, DEFAULT_AUTH_TOKEN};
use crate::control_plane::{ControlPlaneConfig, TokenSource};
use crate::discovery::local::watch_local_file;
use crate::discovery::{xds, FirstSync};
use crate::dns::DnsProxy;
use crate::drain::Drain;
use crate::identity::caclient::CaClient;
use crate::identity::{CertificateAuthority, CertificateSource, Identity, SecretManager};
use crate::inpod::run_zds_client;
use crate::inpod::statemanager::{PodProxies, PodRegistry, SharedInputs};
use crate::metrics::Metrics;
use crate::proxy::connections::ConnectionManager;
use crate::proxy::{
    check_local_node, ListenAddrs, Listeners, LocalWorkload, OwnPorts, ProxyInputs,
};
use crate::socket::{LocalSocketFactory, SocketFactory};
use crate::state::StateStore;
use mesh_runtime::http_server::{self, Handler, Limits, Request, Server};
use mesh_runtime::logging::LogHandle;
use mesh_runtime::netns::NetnsSwitch;
use mesh_runtime::readiness::{BlockReady, Readiness};

/// Another proxy built on ztunnel's parts (the waypoint), serving a dedicated-mode
/// workload instead of ztunnel's own three listeners: ztunnel's app sets up its
/// identity, discovery and admin servers, then `start` binds its listeners and spawns
/// their tasks.
pub struct CustomProxy {
    /// The xDS types it subscribes to.
    pub xds_types: &'static [&'static str],
    /// The first part of its xDS node id.
    pub node_type: &'static str,
    pub start: StartProxy,
}

/// Binds a [`CustomProxy`]'s listeners and spawns their tasks; with xDS, the
/// [`FirstSync`] says when every subscribed type has arrived.
pub type StartProxy = Box<
    dyn FnOnce(&Config, ProxyInputs, Option<FirstSync>) -> BoxFuture<'static, anyhow::Result<()>>
        + Send,
>;

/// Runs ztunnel until SIGTERM, SIGINT or `/quitquitquit`, then drains.
pub async fn run(config: Config, logging: Option<LogHandle>) -> anyhow::Result<()> {
    run_with(config, logging, Arc::new(Metrics::new()), None).await
}

/// [`run`], with the metrics registry given and, in dedicated mode, `proxy` serving
/// the workload instead of ztunnel's listeners.
pub async fn run_with(
    mut config: Config,
    logging: Option<LogHandle>,
    metrics: Arc<Metrics>,
    proxy: Option<CustomProxy>,
) -> anyhow::Result<()> {
    let (xds_types, node_type) = match &proxy {
        Some(p) => (p.xds_types, p.node_type),
        None => (&xds::TYPES[..], ZTUNNEL_NODE),
    };
    if let Some(cluster) = config.meta_cluster_id.take() {
        config.cluster_id = cluster;
    }
    let certs = SecretManager::new(
        certificate_source(&config)?,
        config.workload_cert_ttl,
        metrics.certs.clone(),
    );
    let state = StateStore::new();
    let readiness = Readiness::new();
    let startup = readiness.register("startup");
    let shutdown = CancellationToken::new();
    let drain = Drain::new();
    let connections = ConnectionManager::new();
    let dns = DnsProxy::from_config(&config, &state, &metrics.dns);

    let registry = PodRegistry::default();
    let drained = CancellationToken::new();
    let admin = Admin {
        state: state.clone(),
        certs: certs.clone(),
        logging,
        shutdown: shutdown.clone(),
        drained: drained.clone(),
        drain_deadline: config.drain_deadline,
        config: crate::admin::config::config(&config),
        local_config: config.local_xds_path.clone(),
        workload_state: {
            let (registry, connections) = (registry.clone(), connections.clone());
            Arc::new(move || crate::admin::workload_state(&registry.summaries(), &connections))
        },
        profile_duration: crate::admin::pprof::PROFILE_DURATION,
    };
    let admin_stop = CancellationToken::new();
    let admin_servers =
        serve_operations(&config, admin, &metrics, &readiness, &shutdown, &admin_stop).await?;

    // xDS fills the store in the background: pods wait for its first sync.
    let from_xds = match config.discovery() {
        DiscoverySource::Xds => Some(start_xds_discovery(
            &config,
            (xds_types, node_type),
            &state,
            &metrics,
            &readiness,
            &shutdown,
        )?),
        DiscoverySource::Local => None,
    };
    if let Some(path) = config
        .local_xds_path
        .as_ref()
        .filter(|_| from_xds.is_none())
    {
        watch_local_file(
            path.clone(),
            state.clone(),
            metrics.local_config_reloads.clone(),
            metrics.local_config_errors.clone(),
            shutdown.clone(),
        )
        .await
        .with_context(|| format!("loading LOCAL_XDS_PATH {}", path.display()))?;
    }
    tokio::spawn(
        connections
            .clone()
            .watch(state.clone(), metrics.clone(), shutdown.clone()),
    );

    match config.proxy_mode {
        ProxyMode::Dedicated => {
            let info = config
                .proxy_workload_info
                .clone()
                .context("PROXY_MODE=dedicated needs PROXY_WORKLOAD_INFO=<namespace>/<name>/<service-account>")?;
            let local = LocalWorkload {
                identity: Identity::new(
                    &config.trust_domain,
                    &info.namespace,
                    &info.service_account,
                ),
                namespace: info.namespace,
                name: info.name,
            };
            check_local_node(&state, &local.namespace, &local.name, &config.node_name)
                .map_err(|e| anyhow::anyhow!("PROXY_WORKLOAD_INFO: {e}"))?;
            tokio::spawn(first_certificate(
                certs.clone(),
                local.identity.clone(),
                readiness.register("workload certificate"),
                shutdown.clone(),
            ));
            let local_sockets = LocalSocketFactory {
                mark: config.packet_mark,
            };
            let sockets: Arc<dyn SocketFactory> = Arc::new(local_sockets.clone());
            let inputs = ProxyInputs {
                state: state.clone(),
                certs: certs.clone(),
                metrics: metrics.clone(),
                connections,
                sockets: sockets.clone(),
                local: local.clone(),
                drain: drain.clone(),
                transparent_inbound: false,
                cluster_id: config.cluster_id.clone(),
                own_ports: OwnPorts::from_config(&config),
            };
            if let Some(proxy) = proxy {
                (proxy.start)(&config, inputs, from_xds.clone()).await?;
            } else {
                let addrs = ListenAddrs {
                    outbound: config.outbound_addr,
                    inbound: config.inbound_addr,
                    inbound_plaintext: config.inbound_plaintext_addr,
                    transparent: false,
                    ipv6: config.ipv6_enabled,
                };
                let listeners = Listeners::bind(&local_sockets, addrs)
                    .await
                    .context("binding the proxy listeners")?;
                info!(addrs = ?listeners.local_addrs(), "proxy listeners bound");
                if let Some(dns) = &dns {
                    dns.start(sockets, local, drain.clone())
                        .await
                        .with_context(|| format!("binding the DNS proxy to {}", dns.addr))?;
                }
                listeners.spawn(inputs);
            }
        }
        ProxyMode::Shared => {
            let netns_switch =
                NetnsSwitch::new().context("opening ztunnel's own network namespace")?;
            let shared = SharedInputs {
                state: state.clone(),
                certs: certs.clone(),
                metrics: metrics.clone(),
                connections,
                netns_switch,
                root_drain: drain.clone(),
                mark: config.packet_mark,
                trust_domain: config.trust_domain.clone(),
                cluster_id: config.cluster_id.clone(),
                drain_deadline: config.drain_deadline,
                own_ports: OwnPorts::from_config(&config),
                node_name: config.node_name.clone(),
                dns,
                listen: ListenAddrs::inpod(config.ipv6_enabled),
            };
            let pods = PodProxies::new(shared, registry.clone());
            info!(socket = %config.inpod_uds.display(), "waiting for the node agent over ZDS");
            let zds = run_zds_client(
                config.inpod_uds.clone(),
                pods,
                readiness.register("first ZDS snapshot"),
                shutdown.clone(),
            );
            tokio::spawn(async move {
                // No pod is served before the first xDS sync: until then its proxy
                // would not know which peers take HBONE and would send their traffic
                // as plaintext (a window at every ztunnel restart).
                if let Some(xds) = from_xds {
                    if !xds.wait_synced().await {
                        return;
                    }
                }
                zds.await
            });
        }
    }
    drop(startup);
    info!(mode = ?config.proxy_mode, "ztunnel started");

    wait_for_shutdown(&shutdown).await;
    info!(deadline = ?config.drain_deadline, active = drain.active(), "draining");
    registry.drain_all(config.drain_deadline).await;
    let cut = drain.drain(config.drain_deadline).await;
    shutdown.cancel();
    // A `/quitquitquit` waiting for the drain answers now; the admin server stops
    // once it has.
    drained.cancel();
    admin_stop.cancel();
    let _ = tokio::time::timeout(
        ADMIN_STOP_DEADLINE,
        futures::future::join_all(admin_servers),
    )
    .await;
    info!(cut, "ztunnel stopped");
    Ok(())
}

/// The dedicated workload's first certificate, retried with backoff until the CA
/// gives it. Readiness waits for it, so a VM is not ready without its identity; a CA
/// that cannot answer at start is waited for, not fatal.
async fn first_certificate(
    certs: SecretManager,
    identity: Identity,
    ready: BlockReady,
    shutdown: CancellationToken,
) {
    let mut delay = Duration::from_millis(500);
    loop {
        match certs.fetch(&identity).await {
            Ok(_) => break drop(ready),
            Err(e) => {
                warn!(%identity, ?delay, "getting the workload certificate failed, retrying: {e}")
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(Duration::from_secs(30));
    }
}

/// xDS discovery (XDS_ADDRESS). Readiness waits for a response of each type; an
/// unreachable istiod is retried, not fatal.
fn start_xds_discovery(
    config: &Config,
    (types, node_type): (&'static [&'static str], &'static str),
    state: &StateStore,
    metrics: &Metrics,
    readiness: &Readiness,
    shutdown: &CancellationToken,
) -> anyhow::Result<FirstSync> {
    if config.xds_address.is_empty() {
        bail!("DISCOVERY_SOURCE=xds needs XDS_ADDRESS (istiod's address, e.g. istiod.istio-system.svc:15012)");
    }
    if let Some(path) = &config.local_xds_path {
        warn!(path = %path.display(), "XDS_ADDRESS is set: ignoring LOCAL_XDS_PATH");
    }
    let missing: Vec<&str> = [
        ("POD_NAME", &config.pod_name),
        ("POD_NAMESPACE", &config.pod_namespace),
        ("INSTANCE_IP", &config.instance_ip),
    ]
    .into_iter()
    .filter(|(_, value)| value.is_empty())
    .map(|(name, _)| name)
    .collect();
    if !missing.is_empty() {
        bail!("XDS_ADDRESS needs {} (this ztunnel's pod, from the downward API): istiod identifies the proxy by them", missing.join(", "));
    }
    let xds = xds::XdsConfig {
        control_plane: control_plane_config(
            config,
            "XDS",
            &config.xds_address,
            &config.xds_root_ca,
            &config.alt_xds_hostname,
        )?,
        node: xds::NodeIdentity {
            node_type,
            pod_name: config.pod_name.clone(),
            pod_namespace: config.pod_namespace.clone(),
            instance_ip: config.instance_ip.clone(),
            node_name: config.node_name.clone(),
            cluster_id: config.cluster_id.clone(),
            extra_metadata: xds::NodeIdentity::istio_meta_from_env(),
        },
        on_demand: config.xds_on_demand.then(|| config.network.clone()),
        types,
    };
    let ready = readiness.register("xds");
    let synced = xds::start(
        xds,
        state.clone(),
        metrics.xds.clone(),
        Some(ready),
        shutdown.clone(),
    )
    .context("configuring the xDS client")?;
    info!(address = %config.xds_address, on_demand = config.xds_on_demand, "workloads, services and policies come from istiod over xDS");
    Ok(synced)
}

/// istiod (CA_ADDRESS) in a cluster; the CA files (CA_CERTS_DIR) on a VM without
/// a control plane. Never both: a node that holds the CA key defeats istiod.
fn certificate_source(config: &Config) -> anyhow::Result<CertificateSource> {
    match (config.ca_address.as_str(), config.ca_certs_dir.as_deref()) {
        ("", Some(dir)) => {
            let ca = CertificateAuthority::load(dir)
                .with_context(|| format!("loading the mesh CA from {}", dir.display()))?;
            info!(dir = %dir.display(), "workload certificates are signed here, from CA_CERTS_DIR");
            Ok(CertificateSource::Local(Arc::new(ca)))
        }
        ("", None) => bail!("no certificate authority: set CA_ADDRESS (istiod's certificate service) or, on a VM without a control plane, CA_CERTS_DIR (Istio's plug-in CA files, e.g. from `ztunnel ca init --out DIR`)"),
        (_, Some(_)) => bail!("CA_ADDRESS and CA_CERTS_DIR are both set: with a control plane the CA key stays in istiod; unset CA_CERTS_DIR"),
        (address, None) => {
            let control_plane = control_plane_config(
                config,
                "CA",
                address,
                &config.ca_root_ca,
                &config.alt_ca_hostname,
            )?;
            let client = CaClient::new(&control_plane, config.proxy_mode == ProxyMode::Shared)
                .context("configuring the CA client")?;
            info!(%address, "workload certificates come from istiod");
            Ok(CertificateSource::Remote(Arc::new(client)))
        }
    }
}

/// istiod as one client (`prefix`: `CA` or `XDS`) reaches it: its address, root and
/// name, with the token, cluster id and packet mark both use.
fn control_plane_config(
    config: &Config,
    prefix: &str,
    address: &str,
    root_ca: &str,
    alt_hostname: &Option<String>,
) -> anyhow::Result<ControlPlaneConfig> {
    Ok(ControlPlaneConfig {
        address: address.to_owned(),
        root_ca: root_ca
            .parse()
            .map_err(|e| anyhow::anyhow!("{prefix}_ROOT_CA: {e}"))?,
        token: TokenSource::from_setting(config.auth_token.as_deref(), DEFAULT_AUTH_TOKEN),
        cluster_id: config.cluster_id.clone(),
        alt_hostname: alt_hostname.clone(),
        extra_headers: ControlPlaneConfig::headers_from_env(prefix),
        packet_mark: config.packet_mark,
    })
}

/// How long the admin server may take to send its last answers after the drain.
const ADMIN_STOP_DEADLINE: Duration = Duration::from_secs(2);

/// Admin (15000), metrics (15020) and readiness (15021). The admin server stops on
/// `admin_stop` (after the drain, so `/quitquitquit` can answer); its tasks are
/// returned to be awaited.
async fn serve_operations(
    config: &Config,
    admin: Admin,
    metrics: &Arc<Metrics>,
    readiness: &Readiness,
    shutdown: &CancellationToken,
    admin_stop: &CancellationToken,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    let ipv6 = config.ipv6_enabled;
    let listeners = bind(config.admin_addr, ipv6, "admin").await?;
    // A profile samples for 10 s and `/quitquitquit` waits for the drain: the
    // request deadline covers both.
    let limits = Limits {
        request_timeout: admin.profile_duration.max(admin.drain_deadline) + Duration::from_secs(5),
        ..Limits::default()
    };
    let admin_servers: Vec<_> = listeners
        .into_iter()
        .map(|listener| {
            let admin = admin.clone();
            let handler = move |req: Request| {
                let admin = admin.clone();
                async move { admin.handle(req).await }
            };
            let server = Server::new(handler, limits, admin_stop.clone());
            tokio::spawn(server.serve_tcp(listener))
        })
        .collect();

    let listeners = bind(config.metrics_addr, ipv6, "metrics").await?;
    let metrics = metrics.clone();
    spawn_server(listeners, shutdown, move |req: Request| {
        let metrics = metrics.clone();
        async move {
            match req.path.as_str() {
                "/metrics" | "/stats/prometheus" => http_server::prometheus(metrics.encode()),
                path => http_server::not_found(path),
            }
        }
    });

    let listeners = bind(config.readiness_addr, ipv6, "readiness").await?;
    let readiness = readiness.clone();
    spawn_server(listeners, shutdown, move |req: Request| {
        let readiness = readiness.clone();
        async move {
            match req.path.as_str() {
                "/healthz/ready" => readiness.response(),
                path => http_server::not_found(path),
            }
        }
    });
    Ok(admin_servers)
}

/// Serves `handler` on each listener of one server (one per address family).
fn spawn_server<H: Handler + Clone>(
    listeners: Vec<TcpListener>,
    shutdown: &CancellationToken,
    handler: H,
) {
    for listener in listeners {
        let server = Server::new(handler.clone(), Limits::default(), shutdown.clone());
        tokio::spawn(server.serve_tcp(listener));
    }
}

/// Binds one of ztunnel's own servers on `addr`, and on its IPv6 twin with
/// `IPV6_ENABLED` (a kubelet probing an IPv6 pod address must reach readiness).
async fn bind(
    addr: std::net::SocketAddr,
    ipv6: bool,
    what: &str,
) -> anyhow::Result<Vec<TcpListener>> {
    crate::socket::bind_with_ipv6_twin(addr, ipv6, |a| {
        std::future::ready(crate::socket::server_listener(a))
    })
    .await
    .with_context(|| format!("binding the {what} server"))
}

async fn wait_for_shutdown(shutdown: &CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(term) => term,
        Err(e) => {
            warn!(error = %e, "cannot listen for SIGTERM");
            return shutdown.cancelled().await;
        }
    };
    tokio::select! {
        _ = term.recv() => info!("SIGTERM received"),
        _ = tokio::signal::ctrl_c() => info!("SIGINT received"),
        () = shutdown.cancelled() => info!("shutdown requested"),
    }
}
