//! istiod-lite's settings: Istio's environment names, each with a clap flag.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use shared_types::constants::{DEFAULT_TRUST_DOMAIN, SYSTEM_NAMESPACE};
use shared_types::duration::parse_duration;

/// The token audience istiod accepts by default.
pub const DEFAULT_AUDIENCE: &str = "istio-ca";

#[derive(Clone, Debug, Args)]
pub struct Config {
    /// Istio's plug-in CA files (ca-cert.pem, ca-key.pem, root-cert.pem,
    /// cert-chain.pem), mounted from the `cacerts` Secret into this Deployment only.
    #[arg(long, env = "CA_CERTS_DIR", default_value = "/etc/cacerts")]
    pub ca_certs_dir: PathBuf,
    #[arg(long, env = "TRUST_DOMAIN", default_value = DEFAULT_TRUST_DOMAIN)]
    pub trust_domain: String,
    /// This cluster's id: callers naming another cluster in `clusterid` are refused.
    #[arg(long, env = "CLUSTER_ID", default_value = "Kubernetes")]
    pub cluster_id: String,
    /// Namespace istiod runs in (names its Service in the serving certificate).
    #[arg(long, env = "POD_NAMESPACE", default_value = SYSTEM_NAMESPACE)]
    pub namespace: String,
    /// Cluster DNS domain, for the serving certificate's long names.
    #[arg(long, env = "DOMAIN_SUFFIX", default_value = "cluster.local")]
    pub domain_suffix: String,
    /// More DNS names (or IPs) for the serving certificate, comma-separated.
    #[arg(long, env = "ISTIOD_CUSTOM_HOST", value_delimiter = ',')]
    pub custom_hosts: Vec<String>,
    /// Token audiences accepted, comma-separated.
    #[arg(long, env = "TOKEN_AUDIENCES", value_delimiter = ',', default_value = DEFAULT_AUDIENCE)]
    pub token_audiences: Vec<String>,
    /// Service accounts (`namespace/name`, comma-separated) allowed to ask for
    /// the identities of pods on their own node. Empty: no impersonation at all.
    #[arg(
        long,
        env = "CA_TRUSTED_NODE_ACCOUNTS",
        value_delimiter = ',',
        default_value = "istio-system/ztunnel"
    )]
    pub trusted_node_accounts: Vec<String>,
    /// Lifetime of a workload certificate when the request asks for none.
    #[arg(long, env = "DEFAULT_WORKLOAD_CERT_TTL", default_value = "24h", value_parser = parse_duration)]
    pub default_cert_ttl: Duration,
    /// Requests for longer lifetimes are refused.
    #[arg(long, env = "MAX_WORKLOAD_CERT_TTL", default_value = "2160h", value_parser = parse_duration)]
    pub max_cert_ttl: Duration,
    /// Lifetime of istiod's own serving certificate; renewed at half-life.
    #[arg(long, env = "ISTIOD_SERVING_CERT_TTL", default_value = "24h", value_parser = parse_duration)]
    pub serving_cert_ttl: Duration,
    /// A burst of changes within this window is one xDS push per proxy (Istio's name).
    #[arg(long, env = "PILOT_DEBOUNCE_AFTER", default_value = "100ms", value_parser = parse_duration)]
    pub debounce: Duration,
    /// The gRPC-over-TLS listener: the CA and xDS.
    #[arg(long, env = "GRPC_ADDR", default_value = "0.0.0.0:15012")]
    pub grpc_addr: SocketAddr,
    /// Prometheus metrics (`/metrics`), as istiod's monitoring port.
    #[arg(long, env = "MONITORING_ADDR", default_value = "0.0.0.0:15014")]
    pub monitoring_addr: SocketAddr,
    /// Readiness (`/ready`), as istiod's.
    #[arg(long, env = "READY_ADDR", default_value = "0.0.0.0:8080")]
    pub ready_addr: SocketAddr,
    /// The image waypoint Deployments run (it holds the `waypoint` binary); the chart
    /// sets istiod-lite's own.
    #[arg(long, env = "WAYPOINT_IMAGE", default_value = concat!("ghcr.io/ambient-rs/ambient-rs:", env!("CARGO_PKG_VERSION")))]
    pub waypoint_image: String,
    /// This replica's pod (downward API): its identity in leader elections.
    #[arg(long, env = "POD_NAME", default_value = "istiod")]
    pub pod_name: String,
    /// How long a leader that stopped renewing keeps its Lease (client-go's 15 s);
    /// it renews every 2/15 of it.
    #[arg(long, env = "LEADER_ELECTION_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub leader_lease_duration: Duration,
}

impl Config {
    /// The names istiod's Service answers to, as Istio signs them, plus custom hosts.
    pub fn serving_names(&self) -> Vec<String> {
        let ns = &self.namespace;
        let mut names = vec![
            format!("istiod.{ns}.svc"),
            format!("istiod.{ns}.svc.{}", self.domain_suffix),
            format!("istiod.{ns}"),
            "istiod".to_owned(),
        ];
        for host in &self.custom_hosts {
            let host = host.trim();
            if !host.is_empty() && !names.iter().any(|n| n == host) {
                names.push(host.to_owned());
            }
        }
        names
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        config: Config,
    }

    #[test]
    fn defaults_are_istios() {
        let c = Cli::try_parse_from(["istiod-lite"]).unwrap().config;
        assert_eq!(c.token_audiences, ["istio-ca"]);
        assert_eq!(c.trusted_node_accounts, ["istio-system/ztunnel"]);
        assert_eq!(c.max_cert_ttl, Duration::from_secs(90 * 24 * 3600));
        assert_eq!(c.grpc_addr.port(), 15012);
        assert_eq!(
            c.serving_names(),
            [
                "istiod.istio-system.svc",
                "istiod.istio-system.svc.cluster.local",
                "istiod.istio-system",
                "istiod"
            ]
        );
    }

    #[test]
    fn custom_hosts_are_added_once() {
        let c = Cli::try_parse_from([
            "istiod-lite",
            "--custom-hosts",
            "10.1.0.1,istiod,cp.example.org",
        ])
        .unwrap()
        .config;
        let names = c.serving_names();
        assert_eq!(&names[4..], ["10.1.0.1", "cp.example.org"]);
    }
}
