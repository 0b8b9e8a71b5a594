//! Command-line surface (clap derive). Only flags live here; each command's logic
//! lives in its own module.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use shared_types::duration::parse_duration;

#[derive(Parser, Debug)]
#[command(
    name = "istioctl-lite",
    version,
    about = "Operate the ambient mesh: install, CA, enroll namespaces, waypoints, inspect ztunnel, precheck"
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

/// Flags every command accepts, like kubectl's.
#[derive(Args, Debug, Clone)]
pub struct Global {
    /// Output format.
    #[arg(
        short = 'o',
        long = "output",
        global = true,
        value_enum,
        default_value = "table"
    )]
    pub output: Output,
    /// Path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context to use (default: the current context).
    #[arg(long, global = true)]
    pub context: Option<String>,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// Tables (istioctl's `short`).
    #[value(alias = "short")]
    Table,
    Json,
    Yaml,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Render the istiod-lite, cni and ztunnel charts with helm and server-side apply
    /// them: the control plane first (creating the `cacerts` CA Secret with a fresh
    /// root when there is none), then the data plane.
    Install(InstallArgs),
    /// Delete exactly the objects the charts render (CRDs stay unless --purge; the
    /// `cacerts` CA Secret always stays).
    Uninstall(UninstallArgs),
    /// Mesh CA helpers.
    Ca {
        #[command(subcommand)]
        command: CaCommand,
    },
    /// Enroll (enable) or remove (disable) a namespace from ambient mode.
    DataplaneMode {
        #[command(subcommand)]
        command: DataplaneCommand,
    },
    /// Show ztunnel's configuration from its /config_dump, or set its log levels
    /// (Istio's `istioctl ztunnel-config`).
    #[command(visible_alias = "zc")]
    ZtunnelConfig(ZtunnelConfigArgs),
    /// Check a node and the cluster before installing.
    Precheck(PrecheckArgs),
    /// Every ztunnel connected to the control plane, with each xDS type's sync state
    /// (SYNCED, STALE, NACK, NOT SENT), read from istiod-lite over XDS.
    ProxyStatus(ProxyStatusArgs),
    /// Manage waypoints: the `istio-waypoint` Gateways that give a namespace, its
    /// services or workloads an L7 proxy (Istio's `istioctl waypoint`).
    Waypoint {
        #[command(subcommand)]
        command: WaypointCommand,
    },
}

/// How to reach the control plane over XDS (istioctl's XDS connection flags).
#[derive(Args, Debug, Clone)]
pub struct XdsArgs {
    /// istiod's XDS address (HOST:PORT).
    #[arg(long, default_value = "istiod.istio-system.svc:15012")]
    pub xds_address: String,
    /// Directory with `root-cert.pem` to verify istiod (default: the
    /// `istio-ca-root-cert` ConfigMap of --istio-namespace, read through the kubeconfig).
    #[arg(long)]
    pub cert_dir: Option<PathBuf>,
    /// How long to wait for the answer.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Skip verifying istiod's certificate.
    #[arg(long)]
    pub insecure: bool,
    /// The name istiod's certificate must carry (default: the address's host).
    #[arg(long)]
    pub xds_san: Option<String>,
    /// No TLS at all.
    #[arg(long)]
    pub plaintext: bool,
    /// Bearer token to send (default: a TokenRequest, audience istio-ca, for the
    /// `default` service account of --istio-namespace, through the kubeconfig).
    #[arg(long)]
    pub token: Option<String>,
}

#[derive(Args, Debug)]
pub struct ProxyStatusArgs {
    #[command(flatten)]
    pub xds: XdsArgs,
    /// istiod's namespace.
    #[arg(short = 'i', long, default_value = "istio-system")]
    pub istio_namespace: String,
}

/// How the charts are found and rendered; shared by install and uninstall.
#[derive(Args, Debug, Clone)]
pub struct ChartArgs {
    /// Directory holding the `base`, `istiod-lite`, `cni` and `ztunnel` charts (default:
    /// `charts` beside the binary, else the repository's manifests/charts).
    #[arg(long)]
    pub charts_dir: Option<PathBuf>,
    /// Namespace of the releases.
    #[arg(short = 'n', long, default_value = "istio-system")]
    pub namespace: String,
    /// Chart value, repeatable. `base.KEY=V` goes to the CRD chart only, `istiod.KEY=V`
    /// to the istiod-lite chart only, `cni.KEY=V` to the cni chart only, `ztunnel.KEY=V`
    /// to the ztunnel chart only; anything else to every chart whose values declare
    /// KEY's first segment (e.g. `image.tag` to the three workload charts,
    /// `trustDomain` to istiod-lite and ztunnel).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Skip objects whose kind the API server does not serve (with a warning)
    /// instead of failing.
    #[arg(long)]
    pub skip_unknown_kinds: bool,
}

#[derive(Args, Debug)]
pub struct InstallArgs {
    #[command(flatten)]
    pub charts: ChartArgs,
    /// Print the rendered manifests instead of applying them (writes nothing, not
    /// even the CA Secret).
    #[arg(long)]
    pub dry_run: bool,
    /// Wait for Deployment istiod to be available before applying cni and ztunnel,
    /// then for their DaemonSets to be ready (`--wait=false` applies all at once).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub wait: bool,
    /// How long to wait for readiness in all, e.g. 90s, 5m.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub timeout: Duration,
}

#[derive(Args, Debug)]
pub struct UninstallArgs {
    #[command(flatten)]
    pub charts: ChartArgs,
    /// Also delete the CustomResourceDefinitions of the base chart, and with them every
    /// object of their kinds; a CRD another Helm release installed is still kept.
    #[arg(long)]
    pub purge: bool,
    /// Print what would be deleted without deleting it.
    #[arg(long)]
    pub dry_run: bool,
    /// Delete the node agents as they are, leaving their CNI chain entry on the nodes
    /// (new pods of ambient namespaces then wait for an agent). By default they are
    /// first rolled to take the plugin off their node as they stop.
    #[arg(long)]
    pub keep_cni_config: bool,
    /// Uninstall even while pods are in the mesh (their connections are then refused
    /// until they restart).
    #[arg(long)]
    pub force: bool,
    /// How long to wait for the agents' roll before deleting, e.g. 90s, 5m.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub timeout: Duration,
}

#[derive(Subcommand, Debug)]
pub enum CaCommand {
    /// Create the `cacerts` Secret (Istio plug-in CA layout) from a fresh self-signed
    /// RSA-2048 root or files.
    Init(CaInitArgs),
}

#[derive(Args, Debug)]
pub struct CaInitArgs {
    /// Namespace of the Secret.
    #[arg(short = 'n', long, default_value = "istio-system")]
    pub namespace: String,
    /// Use ca-cert.pem, ca-key.pem, root-cert.pem, cert-chain.pem from this directory
    /// instead of generating a fresh root.
    #[arg(long)]
    pub from_dir: Option<PathBuf>,
    /// Trust domain of a freshly generated root.
    #[arg(long, default_value = "cluster.local")]
    pub trust_domain: String,
    /// Replace an existing Secret (by default an existing one is left alone).
    #[arg(long)]
    pub overwrite: bool,
}

#[derive(Subcommand, Debug)]
pub enum DataplaneCommand {
    /// Label the namespace istio.io/dataplane-mode=ambient and wait for enrollment.
    Enable(DataplaneArgs),
    /// Remove the label and wait for the pods to leave the mesh.
    Disable(DataplaneArgs),
}

#[derive(Args, Debug)]
pub struct DataplaneArgs {
    /// The namespace.
    pub namespace: String,
    /// How long to wait for every running pod to reach the wanted state.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub timeout: Duration,
}

/// `ztunnel-config` (Istio's `istioctl ztunnel-config`, alias `zc`).
#[derive(Args, Debug)]
pub struct ZtunnelConfigArgs {
    #[command(subcommand)]
    pub command: ZtunnelConfigCommand,
}

/// Istio's subcommands, with its aliases.
#[derive(Subcommand, Debug)]
pub enum ZtunnelConfigCommand {
    /// Show or set the log levels of ztunnels (POST /logging on their admin port);
    /// without a pod, every ztunnel pod.
    #[command(visible_alias = "o")]
    Log(ZtunnelLogArgs),
    /// The workloads a ztunnel knows.
    #[command(visible_aliases = ["w", "workloads"])]
    Workload(WorkloadArgs),
    /// The certificates a ztunnel holds.
    #[command(visible_aliases = ["certificates", "certs", "cert"])]
    Certificate(DumpSource),
    /// The services a ztunnel knows.
    #[command(visible_aliases = ["services", "s", "svc"])]
    Service(ServiceArgs),
    /// The authorization policies a ztunnel knows.
    #[command(visible_aliases = ["policies", "p", "pol"])]
    Policy(PolicyArgs),
    /// The Gateway API routes (HTTPRoute, GRPCRoute, TCPRoute) a waypoint applies:
    /// one row per rule, in the order the waypoint tries them for each Service, a
    /// route that does not compile shown INVALID with its error. The pod is a
    /// waypoint's (`<name>[.<namespace>]`, default namespace: the context's); its
    /// admin port listens on localhost, so use --ztunnel-admin through a
    /// port-forward, or -f.
    #[command(visible_aliases = ["routes", "r"])]
    Route(RouteArgs),
    /// Everything: every table, or with -o json|yaml the whole dump.
    All(DumpSource),
    /// The live connections of the pods a ztunnel serves.
    #[command(visible_alias = "cons")]
    Connections(ConnectionsArgs),
}

/// Which ztunnel (or file) to read: Istio's common flags, plus ways to reach the
/// admin port without a port-forward.
#[derive(Args, Debug, Clone)]
pub struct DumpSource {
    /// The ztunnel pod: `[<type>/]<name>[.<namespace>]`.
    pub pod: Option<String>,
    /// Read the dump from a file (`-` for stdin), e.g. `curl localhost:15000/config_dump > FILE`.
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// The ztunnel pod on this node.
    #[arg(long)]
    pub node: Option<String>,
    /// ztunnel's admin port (reached at the pod's IP, which needs its ADMIN_ADDR
    /// bound to 0.0.0.0; else use --ztunnel-admin through a port-forward).
    #[arg(long, default_value_t = 15000)]
    pub proxy_admin_port: u16,
    /// A ztunnel admin address (HOST:PORT), e.g. from `kubectl port-forward ds/ztunnel 15000`.
    #[arg(long)]
    pub ztunnel_admin: Option<String>,
    /// Namespace of the ztunnel pods (default: --istio-namespace).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// Istio's namespace.
    #[arg(
        short = 'i',
        long = "istio-namespace",
        alias = "istioNamespace",
        default_value = "istio-system"
    )]
    pub istio_namespace: String,
    /// Read the control plane's view over XDS instead of a ztunnel's dump (no
    /// ztunnel admin port needed; no certificates or connections).
    #[arg(long, conflicts_with_all = ["file", "ztunnel_admin"])]
    pub from_control_plane: bool,
    #[command(flatten)]
    pub xds: XdsArgs,
}

#[derive(Args, Debug)]
pub struct WorkloadArgs {
    #[command(flatten)]
    pub source: DumpSource,
    /// Only workloads with this IP address.
    #[arg(long)]
    pub address: Option<String>,
    /// Only workloads in this namespace.
    #[arg(long)]
    pub workload_namespace: Option<String>,
    /// Only workloads on this node.
    #[arg(long)]
    pub workload_node: Option<String>,
}

#[derive(Args, Debug)]
pub struct ServiceArgs {
    #[command(flatten)]
    pub source: DumpSource,
    /// Only services in this namespace.
    #[arg(long, alias = "workload-namespace")]
    pub service_namespace: Option<String>,
}

#[derive(Args, Debug)]
pub struct PolicyArgs {
    #[command(flatten)]
    pub source: DumpSource,
    /// Only policies in this namespace.
    #[arg(long, alias = "workload-namespace")]
    pub policy_namespace: Option<String>,
}

#[derive(Args, Debug)]
pub struct RouteArgs {
    #[command(flatten)]
    pub source: DumpSource,
    /// Only routes in this namespace.
    #[arg(long)]
    pub route_namespace: Option<String>,
}

#[derive(Args, Debug)]
pub struct ConnectionsArgs {
    #[command(flatten)]
    pub source: DumpSource,
    /// Only the connections of pods in this namespace.
    #[arg(long)]
    pub workload_namespace: Option<String>,
    /// `inbound` or `outbound` only; anything else shows both.
    #[arg(long, default_value = "")]
    pub direction: String,
    /// Addresses as they are, not resolved to service and workload names.
    #[arg(long)]
    pub raw: bool,
}

#[derive(Args, Debug)]
pub struct ZtunnelLogArgs {
    #[command(flatten)]
    pub source: DumpSource,
    /// Levels to set: `<level>` or `<target>=<level>,...` (trace, debug, info, warn,
    /// error, off).
    #[arg(long, default_value = "")]
    pub level: String,
    /// Reset levels to the default value (info).
    #[arg(short = 'r', long)]
    pub reset: bool,
}

#[derive(Args, Debug)]
pub struct PrecheckArgs {
    /// CNI network configuration directory of the node.
    #[arg(long, default_value = "/etc/cni/net.d")]
    pub cni_conf_dir: PathBuf,
    /// CNI plugin binary directory of the node.
    #[arg(long, default_value = "/opt/cni/bin")]
    pub cni_bin_dir: PathBuf,
    /// Skip the checks of this machine (run from an operator's laptop).
    #[arg(long)]
    pub skip_node: bool,
    /// Skip the checks against the API server.
    #[arg(long)]
    pub skip_cluster: bool,
    /// Directory holding the charts, whose `base` CRDs are compared with the
    /// cluster's (default: as for install).
    #[arg(long)]
    pub charts_dir: Option<PathBuf>,
}

/// `waypoint` (Istio's `istioctl waypoint`), with its flags.
#[derive(Subcommand, Debug)]
pub enum WaypointCommand {
    /// Server-side apply a waypoint Gateway (class istio-waypoint, listener mesh on
    /// 15008/HBONE), optionally enroll the namespace and wait until it is programmed.
    Apply(WaypointApplyArgs),
    /// Print a waypoint Gateway as YAML without applying it.
    Generate(WaypointGenerateArgs),
    /// List the waypoints (Gateways of class istio-waypoint) of a namespace or all.
    List(WaypointListArgs),
    /// Delete waypoints by name, every one of the namespace (--all) or of a revision.
    Delete(WaypointDeleteArgs),
    /// Show the status conditions of the namespace's waypoints (or one with --name).
    Status(WaypointStatusArgs),
}

/// Which traffic a waypoint takes (its `istio.io/waypoint-for` label).
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaypointFor {
    /// Traffic addressed to the namespace's services.
    Service,
    /// Traffic addressed to the namespace's pods by IP.
    Workload,
    /// Both.
    All,
    /// Neither (a waypoint nothing is routed to by address).
    None,
}

impl WaypointFor {
    pub fn as_str(self) -> &'static str {
        match self {
            WaypointFor::Service => "service",
            WaypointFor::Workload => "workload",
            WaypointFor::All => "all",
            WaypointFor::None => "none",
        }
    }
}

/// The namespace flag of every waypoint command (istioctl's `-n`).
#[derive(Args, Debug, Clone)]
pub struct WaypointNamespace {
    /// Namespace of the waypoint (default: the kubeconfig context's, else `default`).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
}

/// What apply and generate build.
#[derive(Args, Debug, Clone)]
pub struct WaypointSpecArgs {
    #[command(flatten)]
    pub namespace: WaypointNamespace,
    /// Name of the waypoint (`none` is reserved; empty means the default).
    #[arg(long, default_value = "waypoint")]
    pub name: String,
    /// Which traffic the waypoint takes (label `istio.io/waypoint-for`).
    #[arg(long = "for", value_enum, default_value = "service")]
    pub traffic: WaypointFor,
    /// The revision to label the waypoint with (`istio.io/rev`).
    #[arg(short = 'r', long)]
    pub revision: Option<String>,
}

#[derive(Args, Debug)]
pub struct WaypointApplyArgs {
    #[command(flatten)]
    pub spec: WaypointSpecArgs,
    /// Also label the namespace `istio.io/use-waypoint=<name>`, so that its traffic
    /// uses this waypoint.
    #[arg(long)]
    pub enroll_namespace: bool,
    /// With --enroll-namespace: replace a namespace's label naming another waypoint
    /// (without it, such a namespace is left alone and nothing is applied).
    #[arg(long)]
    pub overwrite: bool,
    /// Wait until the Gateway's status reports Programmed=True.
    #[arg(short = 'w', long)]
    pub wait: bool,
    /// How long --wait waits, e.g. 30s, 5m.
    #[arg(long, visible_alias = "waypoint-timeout", default_value = "90s", value_parser = parse_duration)]
    pub timeout: Duration,
}

#[derive(Args, Debug)]
pub struct WaypointGenerateArgs {
    #[command(flatten)]
    pub spec: WaypointSpecArgs,
}

#[derive(Args, Debug)]
pub struct WaypointListArgs {
    #[command(flatten)]
    pub namespace: WaypointNamespace,
    /// List the waypoints of every namespace.
    #[arg(short = 'A', long, conflicts_with = "namespace")]
    pub all_namespaces: bool,
}

#[derive(Args, Debug)]
pub struct WaypointDeleteArgs {
    /// Names of the waypoints to delete.
    #[arg(required_unless_present_any = ["all", "revision"], conflicts_with_all = ["all", "revision"])]
    pub names: Vec<String>,
    #[command(flatten)]
    pub namespace: WaypointNamespace,
    /// Delete every waypoint of the namespace.
    #[arg(long)]
    pub all: bool,
    /// Delete the namespace's waypoints labelled with this revision (`istio.io/rev`).
    #[arg(short = 'r', long)]
    pub revision: Option<String>,
}

#[derive(Args, Debug)]
pub struct WaypointStatusArgs {
    #[command(flatten)]
    pub namespace: WaypointNamespace,
    /// Only this waypoint (default: every waypoint of the namespace).
    #[arg(long)]
    pub name: Option<String>,
    /// Wait until the waypoints report Programmed=True.
    #[arg(short = 'w', long)]
    pub wait: bool,
    /// How long --wait waits, e.g. 30s, 5m.
    #[arg(long, visible_alias = "waypoint-timeout", default_value = "90s", value_parser = parse_duration)]
    pub timeout: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }
}
