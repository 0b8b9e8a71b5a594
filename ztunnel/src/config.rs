//! ztunnel's configuration: Istio's environment variable names, with a clap flag
//! beside each, so an Istio user's settings carry over unchanged.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use clap::{Args, ValueEnum};
use shared_types::constants::{
    DEFAULT_PACKET_MARK, DEFAULT_TRUST_DOMAIN, DEFAULT_ZDS_SOCKET, SYSTEM_NAMESPACE,
    ZTUNNEL_DEFAULT_WORKER_THREADS,
};
use shared_types::duration::parse_duration;

/// Where Istio's ztunnel chart mounts the ConfigMap istio-ca-root-cert (ztunnel runs in /).
pub const DEFAULT_CA_ROOT_CA: &str = "./var/run/secrets/istio/root-cert.pem";
/// Where Istio's ztunnel chart mounts the projected token (audience istio-ca).
pub const DEFAULT_AUTH_TOKEN: &str = "./var/run/secrets/tokens/istio-token";

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Serialize)]
pub enum ProxyMode {
    /// One ztunnel per node serving every enrolled pod (in-pod mode, driven over ZDS).
    Shared,
    /// One ztunnel serving one workload, e.g. on a VM (`PROXY_WORKLOAD_INFO`).
    Dedicated,
}

/// Where workloads, services and policies come from (`DISCOVERY_SOURCE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DiscoverySource {
    /// Only the LOCAL_XDS_PATH file (if set): a VM without a control plane.
    Local,
    /// istiod over delta xDS (XDS_ADDRESS, required); LOCAL_XDS_PATH is ignored.
    Xds,
}

/// `PROXY_WORKLOAD_INFO=<namespace>/<name>/<service account>`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct WorkloadInfo {
    pub namespace: String,
    pub name: String,
    pub service_account: String,
}

impl FromStr for WorkloadInfo {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split('/').collect::<Vec<_>>()[..] {
            [ns, name, sa] if !ns.is_empty() && !name.is_empty() && !sa.is_empty() => {
                Ok(WorkloadInfo {
                    namespace: ns.into(),
                    name: name.into(),
                    service_account: sa.into(),
                })
            }
            _ => Err(format!(
                "expected <namespace>/<name>/<service-account>, got {s:?}"
            )),
        }
    }
}

#[derive(Clone, Debug, Args, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Config {
    /// Shared (node proxy, in-pod) or dedicated (one workload, e.g. a VM).
    #[arg(long, env = "PROXY_MODE", value_enum, default_value = "shared")]
    pub proxy_mode: ProxyMode,
    /// The workload a dedicated ztunnel serves: namespace/name/serviceaccount.
    #[arg(long, env = "PROXY_WORKLOAD_INFO")]
    pub proxy_workload_info: Option<WorkloadInfo>,
    /// istiod's delta xDS, e.g. `istiod.istio-system.svc:15012`: workloads, services
    /// and policies come from it. Empty: from LOCAL_XDS_PATH.
    #[arg(long, env = "XDS_ADDRESS", default_value = "")]
    pub xds_address: String,
    /// The root istiod's serving certificate chains to, for XDS_ADDRESS.
    #[arg(long, env = "XDS_ROOT_CA", default_value = DEFAULT_CA_ROOT_CA)]
    pub xds_root_ca: String,
    /// The name istiod's certificate is checked against, when XDS_ADDRESS is not it.
    #[arg(long, env = "ALT_XDS_HOSTNAME")]
    pub alt_xds_hostname: Option<String>,
    /// Ask istiod for addresses as connections need them instead of receiving every
    /// workload and Service (Istio's on-demand mode). Policies still come whole.
    #[arg(long, env = "XDS_ON_DEMAND", default_value = "false", value_parser = parse_istio_bool)]
    pub xds_on_demand: bool,
    /// This ztunnel's network (multi-network meshes): the network of on-demand keys.
    #[arg(long, env = "NETWORK", default_value = "")]
    pub network: String,
    /// This ztunnel's own pod (downward API), sent to istiod as xDS node identity.
    #[arg(long, env = "POD_NAME", default_value = "")]
    pub pod_name: String,
    /// Its namespace: istiod checks the xDS stream's token belongs to it.
    #[arg(long, env = "POD_NAMESPACE", default_value = "")]
    pub pod_namespace: String,
    #[arg(long, env = "INSTANCE_IP", default_value = "")]
    pub instance_ip: String,
    /// istiod's certificate service, e.g. `istiod.istio-system.svc:15012`. Set in a
    /// cluster: no CA key on the node.
    #[arg(long, env = "CA_ADDRESS", default_value = "")]
    pub ca_address: String,
    /// The root istiod's serving certificate chains to: a file, or inline PEM.
    #[arg(long, env = "CA_ROOT_CA", default_value = DEFAULT_CA_ROOT_CA)]
    pub ca_root_ca: String,
    /// The service-account token sent to istiod: a file (re-read for every call)
    /// or the token itself. Default: the projected token, if mounted.
    #[arg(long, env = "AUTH_TOKEN")]
    #[serde(skip)]
    pub auth_token: Option<String>,
    /// The name istiod's certificate is checked against, when CA_ADDRESS is not it.
    #[arg(long, env = "ALT_CA_HOSTNAME")]
    pub alt_ca_hostname: Option<String>,
    /// Only without CA_ADDRESS (a VM with no control plane): a directory in
    /// Istio's plug-in CA layout (ca-cert.pem, ca-key.pem, root-cert.pem,
    /// cert-chain.pem) that signs workload certificates here.
    #[arg(long, env = "CA_CERTS_DIR")]
    pub ca_certs_dir: Option<PathBuf>,
    /// Istio ztunnel local config (YAML: workloads, services, policies). Reloaded on change.
    #[arg(long, env = "LOCAL_XDS_PATH")]
    pub local_xds_path: Option<PathBuf>,
    /// xds | local. Unset: `xds` when XDS_ADDRESS is set, else `local`.
    #[arg(long, env = "DISCOVERY_SOURCE", value_enum)]
    pub discovery_source: Option<DiscoverySource>,
    /// Cluster DNS domain: Kubernetes services are `<name>.<namespace>.svc.<domain>`.
    #[arg(long, env = "CLUSTER_DOMAIN", default_value = "cluster.local")]
    pub cluster_domain: String,
    /// Istio's DNS proxy (`ISTIO_META_DNS_CAPTURE`): on unless set to something other
    /// than "true". The node agent's DNS capture sends pods' queries to it.
    #[arg(long, env = "ISTIO_META_DNS_CAPTURE", default_value = "true", value_parser = parse_istio_bool)]
    pub dns_capture: bool,
    /// Where the DNS proxy listens (UDP and TCP): inside each pod in shared mode, on the
    /// host in dedicated mode.
    #[arg(
        long,
        env = "ISTIO_META_DNS_PROXY_ADDR",
        default_value = "127.0.0.1:15053"
    )]
    pub dns_proxy_addr: SocketAddr,
    /// False: no IPv6 listeners (beside the IPv4 ones), and the DNS proxy answers AAAA
    /// queries for mesh services with no address.
    #[arg(long, env = "IPV6_ENABLED", default_value = "true", value_parser = parse_istio_bool)]
    pub ipv6_enabled: bool,
    /// Istio's root namespace: its AuthorizationPolicies without a selector apply
    /// mesh-wide, those with a selector to matching pods in every namespace.
    #[arg(long, env = "ROOT_NAMESPACE", default_value = SYSTEM_NAMESPACE)]
    pub root_namespace: String,
    /// ZDS socket of the node agent (shared mode).
    #[arg(long, env = "INPOD_UDS", default_value = DEFAULT_ZDS_SOCKET)]
    pub inpod_uds: PathBuf,
    /// SO_MARK on every socket ztunnel owns, so capture rules skip it.
    #[arg(long, env = "PACKET_MARK", default_value_t = DEFAULT_PACKET_MARK)]
    pub packet_mark: u32,
    /// This node's name (downward API `spec.nodeName`), as Istio's ztunnel: it tells
    /// which workloads are local. A pod handed over ZDS (or the dedicated workload)
    /// that discovery places on another node is refused. Empty: no such check.
    #[arg(long, env = "NODE_NAME", default_value = "")]
    pub node_name: String,
    #[arg(long, env = "TRUST_DOMAIN", default_value = DEFAULT_TRUST_DOMAIN)]
    pub trust_domain: String,
    /// The cluster sent to istiod (`clusterid`) and shown in metrics;
    /// ISTIO_META_CLUSTER_ID wins over it, as in Istio.
    #[arg(long, env = "CLUSTER_ID", default_value = "Kubernetes")]
    pub cluster_id: String,
    #[arg(long, env = "ISTIO_META_CLUSTER_ID")]
    #[serde(skip)]
    pub meta_cluster_id: Option<String>,
    #[arg(long, env = "ZTUNNEL_WORKER_THREADS", default_value_t = ZTUNNEL_DEFAULT_WORKER_THREADS)]
    pub worker_threads: usize,
    /// Lifetime asked for workload certificates (Istio's SECRET_TTL); renewed at half-life.
    #[arg(long, env = "SECRET_TTL", default_value = "24h", value_parser = parse_duration)]
    pub workload_cert_ttl: Duration,
    /// How long in-flight connections may take to finish on shutdown.
    #[arg(long, env = "TERMINATION_GRACE_PERIOD", default_value = "5s", value_parser = parse_duration)]
    pub drain_deadline: Duration,
    #[arg(long, env = "ADMIN_ADDR", default_value = "127.0.0.1:15000")]
    pub admin_addr: SocketAddr,
    #[arg(long, env = "STATS_ADDR", default_value = "0.0.0.0:15020")]
    pub metrics_addr: SocketAddr,
    #[arg(long, env = "READINESS_ADDR", default_value = "0.0.0.0:15021")]
    pub readiness_addr: SocketAddr,
    /// Outbound capture listener (dedicated mode; REDIRECT sends captured traffic here).
    #[arg(long, env = "OUTBOUND_ADDR", default_value = "127.0.0.1:15001")]
    pub outbound_addr: SocketAddr,
    /// Inbound HBONE listener (dedicated mode).
    #[arg(long, env = "INBOUND_ADDR", default_value = "0.0.0.0:15008")]
    pub inbound_addr: SocketAddr,
    /// Inbound plaintext listener (dedicated mode).
    #[arg(long, env = "INBOUND_PLAINTEXT_ADDR", default_value = "0.0.0.0:15006")]
    pub inbound_plaintext_addr: SocketAddr,
}

/// Istio's boolean settings: "true" in any case is on, anything else off.
fn parse_istio_bool(s: &str) -> Result<bool, String> {
    Ok(s.trim().eq_ignore_ascii_case("true"))
}

impl Config {
    /// The effective discovery source: `DISCOVERY_SOURCE` if set, else xDS when
    /// XDS_ADDRESS is set, else the local file.
    pub fn discovery(&self) -> DiscoverySource {
        self.discovery_source
            .unwrap_or(if self.xds_address.is_empty() {
                DiscoverySource::Local
            } else {
                DiscoverySource::Xds
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workload_info_parses_istio_form() {
        let info: WorkloadInfo = "vms/db-1/db".parse().unwrap();
        assert_eq!(info.namespace, "vms");
        assert_eq!(info.name, "db-1");
        assert_eq!(info.service_account, "db");
        assert!("vms/db-1".parse::<WorkloadInfo>().is_err());
        assert!("a//c".parse::<WorkloadInfo>().is_err());
    }

    #[test]
    fn discovery_source_default_and_override() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            config: Config,
        }
        // Fields are set explicitly so DISCOVERY_SOURCE etc. in the test's env cannot leak in.
        let mut c = Cli::try_parse_from(["ztunnel"]).unwrap().config;
        let mut with = |xds: &str, source| {
            c.xds_address = xds.into();
            c.discovery_source = source;
            c.discovery()
        };
        use DiscoverySource::*;
        assert_eq!(with("", None), Local);
        assert_eq!(with("istiod.istio-system.svc:15012", None), Xds);
        assert_eq!(with("istiod.istio-system.svc:15012", Some(Local)), Local);
        assert!(Cli::try_parse_from(["ztunnel", "--discovery-source", "kubernetes"]).is_err());
    }
}
