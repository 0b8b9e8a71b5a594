//! The control plane: a namespace holding `kube-apiserver-lite`, `istiod-lite`
//! (the mesh CA: the only place its key is) and the cluster network bridge every
//! node joins.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};

use super::api::Api;
use crate::mesh::binary;
use crate::netns::Netns;
use crate::process::{wait_for, ChildGuard};

/// The API server's address inside the control-plane namespace.
pub const API_ADDR: &str = "10.1.0.1:6443";
/// istiod-lite's gRPC (CA) address, and the name its certificate is checked against.
pub const ISTIOD_ADDR: &str = "10.1.0.1:15012";
pub const ISTIOD_HOST: &str = "istiod.istio-system.svc";
const ISTIOD_READY_URL: &str = "http://10.1.0.1:8080/ready";
/// The cluster network (a bridge in the control-plane namespace).
pub const CLUSTER_NET_PREFIX: &str = "10.1.0";
/// Name of the cluster network bridge.
const BRIDGE: &str = "cnet";

/// The control-plane namespace and the API server process in it.
pub struct ControlPlane {
    // Drop order: the processes, then the namespace.
    pub istiod: Option<ChildGuard>,
    pub apiserver: Option<ChildGuard>,
    pub ns: Netns,
    pub kubeconfig: PathBuf,
    /// The `cacerts` files: mounted into istiod-lite only.
    pub ca_dir: PathBuf,
    state_file: PathBuf,
    tag: String,
}

impl ControlPlane {
    /// Creates the namespace and the bridge and starts the API server; `dir` holds the
    /// kubeconfig and the state file.
    pub fn start(tag: &str, dir: &Path) -> Result<Self> {
        let ns = Netns::new(&format!("{tag}cp"))?;
        ns.exec(&["ip", "link", "add", BRIDGE, "type", "bridge"])?;
        ns.exec(&[
            "ip",
            "addr",
            "add",
            &format!("{CLUSTER_NET_PREFIX}.1/24"),
            "dev",
            BRIDGE,
        ])?;
        ns.exec(&["ip", "link", "set", BRIDGE, "up"])?;
        let ca_dir = dir.join("control-plane").join("cacerts");
        crate::mesh::ca_init(&ca_dir)?;
        let mut cp = ControlPlane {
            istiod: None,
            apiserver: None,
            ns,
            kubeconfig: dir.join("kubeconfig"),
            ca_dir,
            state_file: dir.join("apiserver-state.json"),
            tag: tag.to_owned(),
        };
        cp.start_apiserver()?;
        cp.start_istiod()?;
        Ok(cp)
    }

    /// Starts (or restarts) istiod-lite and waits for its readiness.
    pub fn start_istiod(&mut self) -> Result<()> {
        self.stop_istiod();
        let mut cmd = self
            .ns
            .command(binary("istiod-lite")?.to_str().context("path")?);
        cmd.env("CA_CERTS_DIR", &self.ca_dir)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("POD_NAMESPACE", super::SYSTEM_NAMESPACE)
            .env("GRPC_ADDR", ISTIOD_ADDR)
            .env("MONITORING_ADDR", format!("{CLUSTER_NET_PREFIX}.1:15014"))
            .env("READY_ADDR", format!("{CLUSTER_NET_PREFIX}.1:8080"))
            .env(
                super::sweep::OWNER_ENV,
                super::sweep::cluster_marker(&self.tag),
            )
            .env(
                "RUST_LOG",
                std::env::var("ISTIOD_TEST_LOG").unwrap_or_else(|_| "info".into()),
            );
        let guard = ChildGuard::spawn(&format!("istiod-{}", self.tag), cmd)?;
        wait_for("istiod-lite to be ready", Duration::from_secs(20), || {
            crate::mesh::http_get(&self.ns, ISTIOD_READY_URL).ok()
        })
        .with_context(|| format!("istiod-lite log:\n{}", guard.log()))?;
        self.istiod = Some(guard);
        Ok(())
    }

    /// Stops istiod-lite (SIGTERM, then kill); ztunnels keep their cached certificates.
    pub fn stop_istiod(&mut self) {
        if let Some(mut old) = self.istiod.take() {
            old.signal(libc::SIGTERM);
            if old.wait_timeout(Duration::from_secs(5)).is_none() {
                old.kill();
            }
        }
    }

    /// istiod-lite's Prometheus text.
    pub fn istiod_metrics(&self) -> Result<String> {
        crate::mesh::http_get(
            &self.ns,
            &format!("http://{CLUSTER_NET_PREFIX}.1:15014/metrics"),
        )
    }

    /// Starts (or restarts) the API server; objects survive in the state file.
    pub fn start_apiserver(&mut self) -> Result<()> {
        if let Some(mut old) = self.apiserver.take() {
            old.kill();
        }
        let _ = std::fs::remove_file(&self.kubeconfig);
        let mut cmd = self
            .ns
            .command(binary("kube-apiserver-lite")?.to_str().context("path")?);
        cmd.args(["--listen", API_ADDR, "--state-file"])
            .arg(&self.state_file)
            .arg("--print-kubeconfig")
            .arg(&self.kubeconfig)
            .env(
                super::sweep::OWNER_ENV,
                super::sweep::cluster_marker(&self.tag),
            )
            .env("RUST_LOG", "warn");
        let guard = ChildGuard::spawn(&format!("apiserver-{}", self.tag), cmd)?;
        let api = self.api();
        wait_for("the API server", Duration::from_secs(20), || {
            api.get("/api/v1/namespaces/default").ok()
        })
        .with_context(|| format!("apiserver log:\n{}", guard.log()))?;
        self.apiserver = Some(guard);
        Ok(())
    }

    /// A client connecting from inside the control-plane namespace.
    pub fn api(&self) -> Api {
        Api::new(self.ns.path(), api_addr())
    }

    /// Joins `node` to the cluster network with address `<prefix>.<host>/24`.
    pub fn attach(&self, node: &Netns, host: u8) -> Result<()> {
        let (node_if, cp_if) = ("eth0", format!("n{host}"));
        node.exec(&[
            "ip",
            "link",
            "add",
            node_if,
            "type",
            "veth",
            "peer",
            "name",
            &cp_if,
            "netns",
            self.ns.name(),
        ])?;
        node.exec(&[
            "ip",
            "addr",
            "add",
            &format!("{CLUSTER_NET_PREFIX}.{host}/24"),
            "dev",
            node_if,
        ])?;
        node.exec(&["ip", "link", "set", node_if, "up"])?;
        self.ns
            .exec(&["ip", "link", "set", &cp_if, "master", BRIDGE, "up"])?;
        Ok(())
    }
}

/// [`API_ADDR`] parsed.
pub fn api_addr() -> SocketAddr {
    API_ADDR.parse().expect("API_ADDR is a socket address")
}
