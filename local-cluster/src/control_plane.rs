//! The control plane: a namespace holding `kube-apiserver-lite`, the `istiod-lite`
//! replicas (the mesh CA: the only place its key is) behind istiod's Service
//! ([`ServiceProxy`]), and the cluster network bridge every node joins.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};

use crate::api::Api;
use crate::services::service_proxy::{Endpoint, ServiceProxy};
use test_support::built_binary as binary;
use test_support::netns::Netns;
use test_support::poll::wait_for;
use test_support::process::ChildGuard;

/// The API server's address inside the control-plane namespace.
pub const API_ADDR: &str = "10.1.0.1:6443";
/// istiod's Service (ClusterIP) for the CA and xDS, and the name its certificate is
/// checked against. The replicas serve on their own addresses behind it.
pub const ISTIOD_ADDR: &str = "10.1.0.1:15012";
pub const ISTIOD_HOST: &str = "istiod.istio-system.svc";
/// A short lease, so a dead leader's work moves within a test's patience.
const LEADER_LEASE: &str = "2s";
/// The cluster network (a bridge in the control-plane namespace).
pub const CLUSTER_NET_PREFIX: &str = "10.1.0";
/// The cluster network's IPv6 prefix on a dual-stack cluster (nodes only: the
/// control plane serves over IPv4).
pub const CLUSTER_NET6_PREFIX: &str = "fd00:10:1::";
/// Service ClusterIP ranges of a dual-stack cluster, IPv4 primary.
pub const DUAL_STACK_SERVICE_RANGES: &str = "10.96.0.0/16,fd00:10:96::/112";
/// Name of the cluster network bridge.
pub const BRIDGE: &str = "cnet";

/// The control-plane namespace and the processes in it.
pub struct ControlPlane {
    // Drop order: the processes and the Service, then the namespace.
    /// The istiod-lite replicas (pods `istiod-<i>`), None while one is stopped.
    pub istiods: Vec<Option<ChildGuard>>,
    pub apiserver: Option<ChildGuard>,
    /// istiod's Service for the harness's replicas: held for its endpoint poller.
    _service: Option<ServiceProxy>,
    pub ns: Netns,
    pub kubeconfig: PathBuf,
    /// The API server's serving certificate: the CA in-cluster clients trust.
    pub api_ca: PathBuf,
    /// The `cacerts` files: mounted into istiod-lite only.
    pub ca_dir: PathBuf,
    state_file: PathBuf,
    tag: String,
    /// Services get a ClusterIP of each family ([`DUAL_STACK_SERVICE_RANGES`]).
    dual_stack: bool,
}

impl ControlPlane {
    /// Creates the namespace and the bridge and starts the API server and `replicas`
    /// istiod-lite replicas (none: istiod is installed as a Deployment) behind istiod's Service; `dir` holds the kubeconfig and
    /// the state file. `dual_stack`: Services may have IPv6 ClusterIPs too.
    pub fn start(tag: &str, dir: &Path, replicas: u8, dual_stack: bool) -> Result<Self> {
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
        for i in 0..replicas {
            let addr = format!("{}/24", replica_ip(i));
            ns.exec(&["ip", "addr", "add", &addr, "dev", BRIDGE])?;
        }
        ns.exec(&["ip", "link", "set", BRIDGE, "up"])?;
        let service = (replicas > 0)
            .then(|| {
                ServiceProxy::start(
                    &ns,
                    ISTIOD_ADDR.parse()?,
                    (0..replicas)
                        .map(|i| -> Result<Endpoint> {
                            Ok(Endpoint {
                                serving: format!("{}:15012", replica_ip(i)).parse()?,
                                ready: format!("{}:8080", replica_ip(i)).parse()?,
                            })
                        })
                        .collect::<Result<_>>()?,
                )
            })
            .transpose()?;
        let ca_dir = dir.join("control-plane").join("cacerts");
        crate::mesh::ca_init(&ca_dir)?;
        let mut cp = ControlPlane {
            istiods: (0..replicas).map(|_| None).collect(),
            apiserver: None,
            _service: service,
            ns,
            kubeconfig: dir.join("kubeconfig"),
            api_ca: dir.join("apiserver-ca.crt"),
            ca_dir,
            state_file: dir.join("apiserver-state.json"),
            tag: tag.to_owned(),
            dual_stack,
        };
        cp.start_apiserver()?;
        cp.start_istiod()?;
        Ok(cp)
    }

    /// Starts (or restarts) every istiod-lite replica, each waiting for its readiness.
    pub fn start_istiod(&mut self) -> Result<()> {
        for i in 0..self.istiods.len() {
            self.start_istiod_replica(i)?;
        }
        Ok(())
    }

    /// Starts (or restarts) replica `i` (pod `istiod-<i>`) and waits for its readiness.
    pub fn start_istiod_replica(&mut self, i: usize) -> Result<()> {
        self.stop_istiod_replica(i);
        let ip = replica_ip(i as u8);
        let mut cmd = self
            .ns
            .command(binary("istiod-lite")?.to_str().context("path")?);
        cmd.env("CA_CERTS_DIR", &self.ca_dir)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("POD_NAMESPACE", crate::cluster::SYSTEM_NAMESPACE)
            .env("POD_NAME", format!("istiod-{i}"))
            .env("LEADER_ELECTION_LEASE_DURATION", LEADER_LEASE)
            .env("GRPC_ADDR", format!("{ip}:15012"))
            .env("MONITORING_ADDR", format!("{ip}:15014"))
            .env("READY_ADDR", format!("{ip}:8080"))
            .env(
                test_support::owner::OWNER_ENV,
                test_support::owner::cluster_marker(&self.tag),
            )
            .env(
                "RUST_LOG",
                std::env::var("ISTIOD_TEST_LOG").unwrap_or_else(|_| "info".into()),
            );
        let guard = ChildGuard::spawn(&format!("istiod-{i}-{}", self.tag), cmd)?;
        let ready = format!("http://{ip}:8080/ready");
        wait_for("istiod-lite to be ready", Duration::from_secs(20), || {
            crate::mesh::http_get(&self.ns, &ready).ok()
        })
        .with_context(|| format!("istiod-lite log:\n{}", guard.log()))?;
        self.istiods[i] = Some(guard);
        Ok(())
    }

    /// Stops every replica (SIGTERM, then kill); ztunnels keep their cached certificates.
    pub fn stop_istiod(&mut self) {
        for i in 0..self.istiods.len() {
            self.stop_istiod_replica(i);
        }
    }

    /// Stops replica `i` as a pod deletion would: SIGTERM, then kill.
    pub fn stop_istiod_replica(&mut self, i: usize) {
        if let Some(mut old) = self.istiods.get_mut(i).and_then(Option::take) {
            old.signal(libc::SIGTERM);
            if old.wait_timeout(Duration::from_secs(5)).is_none() {
                old.kill();
            }
        }
    }

    /// Kills replica `i` outright, as a crashed node would lose it.
    pub fn kill_istiod_replica(&mut self, i: usize) {
        if let Some(mut old) = self.istiods.get_mut(i).and_then(Option::take) {
            old.kill();
        }
    }

    /// Replica 0's Prometheus text.
    pub fn istiod_metrics(&self) -> Result<String> {
        self.istiod_replica_metrics(0)
    }

    /// Replica `i`'s Prometheus text.
    pub fn istiod_replica_metrics(&self, i: usize) -> Result<String> {
        let ip = replica_ip(i as u8);
        crate::mesh::http_get(&self.ns, &format!("http://{ip}:15014/metrics"))
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
            .arg("--tls-cert-file")
            .arg(&self.api_ca);
        if self.dual_stack {
            cmd.args(["--service-cluster-ip-range", DUAL_STACK_SERVICE_RANGES]);
        }
        cmd.env(
            test_support::owner::OWNER_ENV,
            test_support::owner::cluster_marker(&self.tag),
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

    /// Joins `node` to the cluster network with address `<prefix>.<host>/24`, and
    /// `<prefix6><host>/64` when `ipv6`.
    pub fn attach(&self, node: &Netns, host: u8, ipv6: bool) -> Result<()> {
        let (node_if, cp_if) = ("eth0", bridge_port(host));
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
        if ipv6 {
            test_support::netns::add_addr(
                node,
                &format!("{CLUSTER_NET6_PREFIX}{host:x}/64"),
                node_if,
            )?;
        }
        node.exec(&["ip", "link", "set", node_if, "up"])?;
        self.ns
            .exec(&["ip", "link", "set", &cp_if, "master", BRIDGE, "up"])?;
        Ok(())
    }
}

/// Replica `i`'s own address on the cluster network (behind [`ISTIOD_ADDR`]).
fn replica_ip(i: u8) -> String {
    format!("{CLUSTER_NET_PREFIX}.{}", 101 + u16::from(i))
}

/// [`API_ADDR`] parsed.
pub fn api_addr() -> SocketAddr {
    API_ADDR.parse().expect("API_ADDR is a socket address")
}

/// The bridge port (in the control-plane namespace) of the node with host number `host`.
pub fn bridge_port(host: u8) -> String {
    format!("n{host}")
}
