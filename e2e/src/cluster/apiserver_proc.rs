//! The control plane: a namespace holding `kube-apiserver-lite` and the cluster
//! network bridge every node joins.

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
/// The cluster network (a bridge in the control-plane namespace).
pub const CLUSTER_NET_PREFIX: &str = "10.1.0";
/// Name of the cluster network bridge.
const BRIDGE: &str = "cnet";

/// The control-plane namespace and the API server process in it.
pub struct ControlPlane {
    // Drop order: the process, then the namespace.
    pub apiserver: Option<ChildGuard>,
    pub ns: Netns,
    pub kubeconfig: PathBuf,
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
        let mut cp = ControlPlane {
            apiserver: None,
            ns,
            kubeconfig: dir.join("kubeconfig"),
            state_file: dir.join("apiserver-state.json"),
            tag: tag.to_owned(),
        };
        cp.start_apiserver()?;
        Ok(cp)
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
            .env(super::sweep::OWNER_ENV, super::sweep::owner_marker())
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
