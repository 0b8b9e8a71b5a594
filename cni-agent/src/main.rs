//! `cni-agent`: flags (each with an environment variable, named like Istio's install-cni
//! where Istio has one), logging, signals; everything else is in the library.

use anyhow::Context;
use clap::builder::BoolishValueParser;
use clap::Parser;
use cni_agent::app::{self, AgentConfig};
use cni_agent::enrollment::eligibility::Selection;
use cni_agent::enrollment::enroll::PodEnrollmentConfig;
use cni_agent::enrollment::{BackendChoice, EnrollmentConfig};
use cni_agent::install::conflist::PluginSettings;
use cni_agent::install::{InstallConfig, DEFAULT_OWNED_CONFIG_NAME, PLUGIN_BINARY_NAME};
use cni_agent::plugin_api::event::admit_all;
use shared_types::constants::{
    AGENT_HEALTH_PORT, AGENT_METRICS_PORT, DEFAULT_CNI_BIN_DIR, DEFAULT_CNI_CONF_DIR,
    DEFAULT_CNI_RUN_DIR, DEFAULT_ZDS_SOCKET, SYSTEM_NAMESPACE,
};
use std::path::PathBuf;
use std::sync::Arc;
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Parser)]
#[command(
    name = "cni-agent",
    version,
    about = "istio-cni node agent",
    // Read outside the flags (logging, kube client); listed so a chart's env can be
    // checked against it.
    after_help = "Environment also read: RUST_LOG, LOG_FORMAT, RUST_BACKTRACE, KUBECONFIG, KUBERNETES_SERVICE_HOST, KUBERNETES_SERVICE_PORT"
)]
struct Args {
    /// CNI config dir, where the primary CNI's config gets our entry.
    #[arg(long, env = "CNI_NET_DIR", default_value = DEFAULT_CNI_CONF_DIR)]
    cni_conf_dir: PathBuf,
    /// CNI bin dir, where the `istio-cni` plugin binary is installed.
    #[arg(long, env = "CNI_BIN_DIR", default_value = DEFAULT_CNI_BIN_DIR)]
    cni_bin_dir: PathBuf,
    /// Run dir for the plugin sockets and the enablement state (as the host sees it:
    /// the plugin is told this path). Forced to be root's with mode 0700 (0711 with
    /// `--plugin-peer-uid`) at every start, even when it exists.
    #[arg(long, env = "CNI_AGENT_RUN_DIR", default_value = DEFAULT_CNI_RUN_DIR)]
    run_dir: PathBuf,
    /// A uid admitted on the plugin sockets besides root (a runtime whose CNI plugins
    /// run as that user); it then owns the 0600 sockets. 0: root only.
    #[arg(long, env = "CNI_PLUGIN_PEER_UID", default_value_t = 0)]
    plugin_peer_uid: u32,
    /// The plugin binary to install [default: `istio-cni` beside this executable].
    #[arg(long, env = "CNI_PLUGIN_BINARY")]
    plugin_binary: Option<PathBuf>,
    /// Write our chain to a config file of our own instead of editing the primary.
    #[arg(long, env = "ISTIO_OWNED_CNI_CONFIG", num_args = 0..=1, default_value = "false",
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
    istio_owned_cni_config: bool,
    /// File name of that config; it must sort before the primary's.
    #[arg(long, env = "ISTIO_OWNED_CNI_CONFIG_FILENAME", default_value = DEFAULT_OWNED_CONFIG_NAME,
          value_parser = conflist_file_name)]
    istio_owned_cni_config_filename: String,
    /// `plugin_log_level` written into our entry.
    #[arg(long, env = "PLUGIN_LOG_LEVEL", default_value = "info",
          value_parser = ["debug", "info", "warn", "error", "none"])]
    plugin_log_level: String,
    /// Namespaces whose pods never wait for the agent (comma-separated).
    #[arg(
        long,
        env = "EXCLUDE_NAMESPACES",
        value_delimiter = ',',
        default_value = "kube-system"
    )]
    exclude_namespaces: Vec<String>,
    /// The mesh's system namespace (ztunnel and this agent run there).
    #[arg(long, env = "POD_NAMESPACE", default_value = SYSTEM_NAMESPACE)]
    pod_namespace: String,
    /// On SIGTERM, remove our CNI entry and binary. Default: leave them, so pods created
    /// while the agent is away wait for it (upgrade, reboot).
    #[arg(long, env = "CNI_UNINSTALL_ON_EXIT", num_args = 0..=1, default_value = "false",
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
    uninstall_on_exit: bool,
    /// Port of `/healthz` and `/readyz`.
    #[arg(long, env = "CNI_HEALTH_PORT", default_value_t = AGENT_HEALTH_PORT)]
    health_port: u16,
    /// Enroll ambient pods (in-pod redirection + ZDS). false: install the plugin only.
    #[arg(long, env = "AMBIENT_ENABLED", num_args = 0..=1, default_value = "true",
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
    ambient_enabled: bool,
    /// This node's name (required when ambient is enabled).
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// The ZDS socket ztunnel connects to.
    #[arg(long, env = "ZTUNNEL_UDS_ADDRESS", default_value = DEFAULT_ZDS_SOCKET)]
    ztunnel_uds_address: PathBuf,
    /// A uid admitted on the ZDS socket besides root (ztunnel running as that user); it
    /// then owns the 0600 socket. 0: root only.
    #[arg(long, env = "ZTUNNEL_PEER_UID", default_value_t = 0)]
    ztunnel_peer_uid: u32,
    /// The host's /proc as mounted here (pod netns discovery, `/proc/<pid>/ns/net` paths).
    #[arg(long, env = "HOST_PROC_DIR", default_value = "/proc")]
    host_proc_dir: PathBuf,
    /// Where the runtime bind-mounts pod netns files (as the host sees it, mounted at
    /// the same path here; Istio's chart value `cniNetnsDir`). A CNI event's netns is
    /// opened only if it is a file of this dir or `/proc/<pid>/ns/net` (then under
    /// HOST_PROC_DIR); any other path is refused.
    #[arg(long, env = "CNI_NETNS_DIR", default_value = "/var/run/netns")]
    cni_netns_dir: PathBuf,
    /// Redirect DNS to ztunnel's DNS proxy (per pod: `ambient.istio.io/dns-capture`).
    #[arg(long, env = "AMBIENT_DNS_CAPTURE", num_args = 0..=1, default_value = "true",
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
    ambient_dns_capture: bool,
    /// Program ip6tables too (for pods with an IPv6 address).
    #[arg(long, env = "AMBIENT_IPV6", num_args = 0..=1, default_value = "true",
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
    ambient_ipv6: bool,
    /// On start, verify and repair the rules of pods already enrolled.
    #[arg(long, env = "AMBIENT_RECONCILE_POD_RULES_ON_STARTUP", num_args = 0..=1,
          default_value = "true", default_missing_value = "true",
          value_parser = BoolishValueParser::new())]
    ambient_reconcile_pod_rules_on_startup: bool,
    /// How long a CNI ADD waits for enrollment, in seconds (below the plugin's 30 s).
    #[arg(long, env = "CNI_EVENT_TIMEOUT", default_value_t = 25)]
    cni_event_timeout: u64,
    /// Port of `/metrics`.
    #[arg(long, env = "METRICS_PORT", default_value_t = AGENT_METRICS_PORT)]
    metrics_port: u16,
    /// xtables backend: auto-detected from the host's rules, or forced.
    #[arg(long, env = "IPTABLES_BACKEND", value_enum, default_value = "auto")]
    iptables_backend: BackendChoice,
    /// Program pods with Istio's native nftables tables instead of iptables (falls back
    /// to iptables while the host has the iptables-mode probe ipsets).
    #[arg(long, env = "NATIVE_NFTABLES", num_args = 0..=1, default_value = "false",
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
    native_nftables: bool,
}

/// A bare `*.conflist` name: anything else would not be read by the runtime or would
/// escape the conf dir.
fn conflist_file_name(name: &str) -> Result<String, String> {
    if name.contains('/') || name.starts_with('.') || !name.ends_with(".conflist") {
        return Err(format!("{name:?} is not a file name ending in .conflist"));
    }
    Ok(name.to_string())
}

impl Args {
    fn into_config(self) -> anyhow::Result<AgentConfig> {
        let plugin_source = match self.plugin_binary {
            Some(path) => path,
            None => std::env::current_exe()
                .context("locating our own executable")?
                .with_file_name(PLUGIN_BINARY_NAME),
        };
        // The plugin runs in the runtime's working directory, so the run dir it is told
        // must be absolute; the dirs are resolved too so file events match them.
        let absolute = |path: &PathBuf| {
            std::path::absolute(path).with_context(|| format!("resolving {}", path.display()))
        };
        let run_dir = absolute(&self.run_dir)?;
        let exclude_namespaces: Vec<String> = self
            .exclude_namespaces
            .into_iter()
            .map(|n| n.trim().to_string())
            .filter(|n| !n.is_empty())
            .collect();
        let enrollment = if self.ambient_enabled {
            let node_name = self
                .node_name
                .filter(|n| !n.is_empty())
                .context("NODE_NAME is required when AMBIENT_ENABLED is true")?;
            Some(EnrollmentConfig {
                node_name,
                zds_socket: absolute(&self.ztunnel_uds_address)?,
                ztunnel_peer_uid: self.ztunnel_peer_uid,
                reconcile_on_startup: self.ambient_reconcile_pod_rules_on_startup,
                metrics_port: self.metrics_port,
                backend: self.iptables_backend,
                native_nftables: self.native_nftables,
                pods: PodEnrollmentConfig {
                    selection: Selection {
                        excluded_namespaces: exclude_namespaces.clone(),
                        system_namespace: self.pod_namespace.clone(),
                        ..Selection::default()
                    },
                    host_proc: self.host_proc_dir,
                    netns_dir: absolute(&self.cni_netns_dir)?,
                    dns_capture: self.ambient_dns_capture,
                    ipv6: self.ambient_ipv6,
                    cni_event_timeout: std::time::Duration::from_secs(
                        self.cni_event_timeout.max(1),
                    ),
                },
            })
        } else {
            None
        };
        Ok(AgentConfig {
            enrollment,
            install: InstallConfig {
                conf_dir: absolute(&self.cni_conf_dir)?,
                bin_dir: absolute(&self.cni_bin_dir)?,
                plugin_source,
                owned_config: self
                    .istio_owned_cni_config
                    .then(|| self.istio_owned_cni_config_filename.into()),
                settings: PluginSettings {
                    log_level: self.plugin_log_level,
                    run_dir: run_dir.clone(),
                    exclude_namespaces,
                    system_namespace: self.pod_namespace,
                },
            },
            run_dir,
            plugin_peer_uid: self.plugin_peer_uid,
            health_port: self.health_port,
            uninstall_on_exit: self.uninstall_on_exit,
            watch: Default::default(),
        })
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    mesh_runtime::logging::init(&mesh_runtime::logging::Settings::from_env(
        app::DEFAULT_LOG_FILTER,
        Some("cni_agent::"),
    ));
    let config = Args::parse().into_config()?;
    tracing::info!(?config, "starting");

    let shutdown = CancellationToken::new();
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let trigger = shutdown.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = int.recv() => tracing::info!("SIGINT received"),
        }
        trigger.cancel();
    });
    app::run(config, Arc::new(admit_all), shutdown).await
}
