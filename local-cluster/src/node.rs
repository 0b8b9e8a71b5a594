//! One node: its namespace, its CNI directories, and the mesh's node components
//! (`cni-agent` and a shared-mode `ztunnel`) running in it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};

use crate::api::Api;
use crate::cluster::SYSTEM_NAMESPACE;
use crate::control_plane::{
    self, CLUSTER_NET6_PREFIX, CLUSTER_NET_PREFIX, ISTIOD_ADDR, ISTIOD_HOST,
};
use crate::kubelet::cni;
use crate::kubelet::projected::{ProjectedConfigMap, ProjectedToken, Projector};
use test_support::built_binary as binary;
use test_support::netns::Netns;
use test_support::owner::{cluster_marker, OWNER_ENV};
use test_support::poll::wait_for;
use test_support::process::ChildGuard;

/// The node paths the charts use (Istio's): CNI config and binaries, the agent's
/// sockets, and the ZDS socket's directory.
pub const NODE_CNI_CONF_DIR: &str = "/etc/cni/net.d";
pub const NODE_CNI_BIN_DIR: &str = "/opt/cni/bin";
pub const NODE_AGENT_RUN_DIR: &str = "/var/run/istio-cni";
pub const NODE_ZDS_DIR: &str = "/var/run/ztunnel";

/// Name of the reference conflist written into every node's conf dir.
pub const BRIDGE_CONFLIST: &str = "10-bridge.conflist";

/// Paths and processes of one node.
pub struct Node {
    // Drop order: processes first, then the namespace.
    pub ztunnel: Option<ChildGuard>,
    pub agent: Option<ChildGuard>,
    /// ztunnel's projected token and root certificate, kept fresh.
    pub projector: Option<Projector>,
    /// Extra environment for ztunnel (tests: e.g. a short SECRET_TTL).
    pub ztunnel_env: Vec<(String, String)>,
    /// Extra environment for the agent, over the harness's (its mode: NATIVE_NFTABLES).
    pub agent_env: Vec<(String, String)>,
    pub index: u8,
    pub name: String,
    /// Pods get an IPv6 address too, and the node routes IPv6.
    pub dual_stack: bool,
    pub ns: Netns,
    pub dir: PathBuf,
    kubeconfig: PathBuf,
    /// [`OWNER_ENV`] of the node's processes: the cluster's marker.
    owner: String,
}

impl Node {
    /// Creates the namespace and directories and writes the reference conflist.
    pub fn create(
        tag: &str,
        index: u8,
        dual_stack: bool,
        root: &Path,
        kubeconfig: &Path,
    ) -> Result<Self> {
        let ns = Netns::new(&format!("{tag}n{index}"))?;
        ns.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"])?;
        if dual_stack {
            ns.exec(&["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"])?;
            // No duplicate address detection on the node's links (the pod bridge the
            // CNI plugin creates included): nothing else can hold these addresses, and
            // DAD would leave a new bridge's gateway unanswered for its first seconds.
            for conf in ["all", "default"] {
                ns.exec(&[
                    "sysctl",
                    "-qw",
                    &format!("net.ipv6.conf.{conf}.accept_dad=0"),
                ])?;
            }
        }
        let dir = root.join(format!("node-{index}"));
        // The node's own tree: the paths the charts' hostPath volumes name.
        for sub in [
            NODE_CNI_CONF_DIR,
            NODE_CNI_BIN_DIR,
            NODE_AGENT_RUN_DIR,
            NODE_ZDS_DIR,
        ] {
            std::fs::create_dir_all(dir.join("root").join(sub.trim_start_matches('/')))?;
        }
        std::fs::create_dir_all(dir.join("ipam"))?;
        let node = Node {
            ztunnel: None,
            agent: None,
            projector: None,
            ztunnel_env: Vec::new(),
            agent_env: Vec::new(),
            index,
            name: format!("node-{index}"),
            dual_stack,
            ns,
            dir,
            kubeconfig: kubeconfig.to_owned(),
            owner: cluster_marker(tag),
        };
        node.write_bridge_conflist()?;
        Ok(node)
    }

    /// The node's host number on the cluster network (its addresses end in it).
    pub fn host(&self) -> u8 {
        10 + self.index
    }

    /// The node's link to the cluster network, as the control plane's bridge port
    /// (`ControlPlane::attach`): what leaves and reaches the node passes there.
    pub fn cluster_link(&self) -> String {
        control_plane::bridge_port(self.host())
    }

    /// The node's address on the cluster network.
    pub fn ip(&self) -> String {
        format!("{CLUSTER_NET_PREFIX}.{}", self.host())
    }

    /// The node's IPv6 address on the cluster network (dual-stack clusters).
    pub fn ip6(&self) -> Option<String> {
        self.dual_stack
            .then(|| format!("{CLUSTER_NET6_PREFIX}{:x}", self.host()))
    }

    /// The node's addresses, IPv4 first (`status.addresses`, `hostIPs`).
    pub fn ips(&self) -> Vec<String> {
        std::iter::once(self.ip()).chain(self.ip6()).collect()
    }

    /// The IPv4 pod CIDR (`spec.podCIDR`).
    pub fn pod_cidr(&self) -> String {
        self.pod_cidrs().remove(0)
    }

    /// One pod CIDR per family, IPv4 first (`spec.podCIDRs`).
    pub fn pod_cidrs(&self) -> Vec<String> {
        cni::pod_cidrs(self.index, self.dual_stack)
    }

    /// The node's own filesystem tree: `hostPath` volumes of its pods live under it.
    pub fn root_dir(&self) -> PathBuf {
        self.dir.join("root")
    }

    /// A path of the node's own tree, on the host.
    pub fn host_path(&self, node_path: &str) -> PathBuf {
        self.root_dir().join(node_path.trim_start_matches('/'))
    }

    pub fn conf_dir(&self) -> PathBuf {
        self.host_path(NODE_CNI_CONF_DIR)
    }

    pub fn bin_dir(&self) -> PathBuf {
        self.host_path(NODE_CNI_BIN_DIR)
    }

    pub fn run_dir(&self) -> PathBuf {
        self.host_path(NODE_AGENT_RUN_DIR)
    }

    /// ztunnel's projected service-account token (audience istio-ca), as the
    /// chart mounts it at /var/run/secrets/tokens/istio-token.
    pub fn token_path(&self) -> PathBuf {
        self.dir.join("secrets/tokens/istio-token")
    }

    /// The root from ConfigMap istio-ca-root-cert, as the chart mounts it at
    /// /var/run/secrets/istio/root-cert.pem.
    pub fn root_cert_path(&self) -> PathBuf {
        self.dir.join("secrets/istio/root-cert.pem")
    }

    /// Projects ztunnel's token (bound to its Pod object `pod`) and the root, as
    /// kubelet does for the chart's volumes, before ztunnel starts.
    pub fn project_ztunnel_volumes(&mut self, api: Api, pod: (String, String)) -> Result<()> {
        let token = ProjectedToken {
            namespace: SYSTEM_NAMESPACE.into(),
            service_account: "ztunnel".into(),
            audience: "istio-ca".into(),
            expiration_secs: 43200,
            pod,
            path: self.token_path(),
        };
        let root = ProjectedConfigMap {
            namespace: SYSTEM_NAMESPACE.into(),
            name: "istio-ca-root-cert".into(),
            key: "root-cert.pem".into(),
            path: self.root_cert_path(),
        };
        self.projector = Some(Projector::start(api, token, root, Duration::from_secs(20))?);
        Ok(())
    }

    /// Where the agent serves ZDS and ztunnel connects.
    pub fn zds_socket(&self) -> PathBuf {
        self.host_path(NODE_ZDS_DIR).join("ztunnel.sock")
    }

    /// `CNI_PATH`: the reference plugins, then the agent's bin dir.
    pub fn cni_path(&self) -> Vec<PathBuf> {
        vec![test_support::cni_reference_plugin_dir(), self.bin_dir()]
    }

    /// (Re)writes the primary CNI's config, as a CNI installer would on its start.
    pub fn write_bridge_conflist(&self) -> Result<()> {
        let list = cni::bridge_conflist(self.index, self.dual_stack, &self.dir.join("ipam"));
        mesh_runtime::fs::write_atomic(
            &self.conf_dir().join(BRIDGE_CONFLIST),
            &serde_json::to_vec_pretty(&list)?,
            0o644,
        )?;
        Ok(())
    }

    /// Whether the primary conflist chains `istio-cni` and the binary is installed.
    pub fn plugin_installed(&self) -> bool {
        let chained = cni::find_config(&self.conf_dir())
            .map(|l| l.plugins.iter().any(|p| p["type"] == "istio-cni"))
            .unwrap_or(false);
        chained && self.bin_dir().join("istio-cni").exists()
    }

    /// Starts the node agent and waits until it installed the plugin.
    pub fn start_agent(&mut self) -> Result<()> {
        if let Some(mut old) = self.agent.take() {
            old.kill();
        }
        let mut cmd = self
            .ns
            .command(binary("cni-agent")?.to_str().context("path")?);
        cmd.arg("--cni-conf-dir")
            .arg(self.conf_dir())
            .arg("--cni-bin-dir")
            .arg(self.bin_dir())
            .arg("--run-dir")
            .arg(self.run_dir())
            .env("NODE_NAME", &self.name)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("ZTUNNEL_UDS_ADDRESS", self.zds_socket())
            .env(OWNER_ENV, &self.owner)
            .env(
                "RUST_LOG",
                std::env::var("CNI_AGENT_TEST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .envs(self.agent_env.iter().map(|(k, v)| (k, v)));
        let guard = ChildGuard::spawn(&format!("cni-agent-{}", self.ns.name()), cmd)?;
        wait_for(
            "the agent to install istio-cni",
            Duration::from_secs(20),
            || self.plugin_installed().then_some(()),
        )
        .with_context(|| format!("cni-agent log:\n{}", guard.log()))?;
        self.agent = Some(guard);
        Ok(())
    }

    /// Starts the node's ztunnel (shared mode; workloads, services and policies over
    /// xDS and certificates from istiod-lite: no CA key and no API access on the
    /// node), as the pod `ztunnel-<node>` its token is bound to. It does not wait
    /// for readiness: that needs the agent's ZDS snapshot (see [`Node::ztunnel_ready`]).
    pub fn start_ztunnel(&mut self) -> Result<()> {
        if let Some(mut old) = self.ztunnel.take() {
            old.kill();
        }
        let mut cmd = self
            .ns
            .command(binary("ztunnel")?.to_str().context("path")?);
        cmd.env("PROXY_MODE", "shared")
            .env("XDS_ADDRESS", ISTIOD_ADDR)
            .env("ALT_XDS_HOSTNAME", ISTIOD_HOST)
            .env("XDS_ROOT_CA", self.root_cert_path())
            .env("POD_NAME", format!("ztunnel-{}", self.name))
            .env("POD_NAMESPACE", crate::cluster::SYSTEM_NAMESPACE)
            .env("INSTANCE_IP", self.ip())
            .env("CA_ADDRESS", ISTIOD_ADDR)
            .env("ALT_CA_HOSTNAME", ISTIOD_HOST)
            .env("CA_ROOT_CA", self.root_cert_path())
            .env("AUTH_TOKEN", self.token_path())
            .envs(self.ztunnel_env.iter().map(|(k, v)| (k, v)))
            .env("INPOD_UDS", self.zds_socket())
            .env("NODE_NAME", &self.name)
            .env(OWNER_ENV, &self.owner)
            .env(
                "RUST_LOG",
                std::env::var("ZTUNNEL_TEST_LOG").unwrap_or_else(|_| "info".into()),
            );
        self.ztunnel = Some(ChildGuard::spawn(
            &format!("ztunnel-{}", self.ns.name()),
            cmd,
        )?);
        Ok(())
    }

    /// Stops the node's ztunnel (SIGTERM, then kill).
    pub fn stop_ztunnel(&mut self) {
        if let Some(mut z) = self.ztunnel.take() {
            z.signal(libc::SIGTERM);
            if z.wait_timeout(Duration::from_secs(8)).is_none() {
                z.kill();
            }
        }
    }

    /// Whether ztunnel's readiness endpoint answers 200.
    pub fn ztunnel_ready(&self) -> bool {
        crate::mesh::http_get(&self.ns, "http://127.0.0.1:15021/healthz/ready").is_ok()
    }

    /// Prometheus text from this node's ztunnel.
    pub fn ztunnel_metrics(&self) -> Result<String> {
        crate::mesh::ztunnel_metrics(&self.ns)
    }

    /// Logs of the node's processes, for failure messages.
    pub fn logs(&self) -> String {
        let mut text = String::new();
        for (what, p) in [("cni-agent", &self.agent), ("ztunnel", &self.ztunnel)] {
            if let Some(p) = p {
                text.push_str(&format!("--- {what} on {} ---\n{}\n", self.name, p.log()));
            }
        }
        text
    }
}
