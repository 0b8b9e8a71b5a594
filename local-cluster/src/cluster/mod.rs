//! A local multi-node Kubernetes cluster in network namespaces, for the demo and the
//! end-to-end suite.
//!
//! - a control-plane namespace runs `kube-apiserver-lite` on [`API_ADDR`] and holds the
//!   cluster network bridge (10.1.0.0/24); nothing listens in the root namespace;
//! - each node namespace (`node-<i>`, pods 10.244.<i>.0/24) joins that network, routes
//!   the other nodes' pod CIDRs, and runs `cni-agent` and a shared-mode `ztunnel`;
//! - a kubelet stand-in per node creates pods through the node's CNI chain (the
//!   reference `bridge` plugin plus the `istio-cni` the agent chains in).
//!
//! Everything is torn down when the [`LocalCluster`] is dropped, also on panic; then no
//! process carrying the cluster's owner marker may remain (the drop panics, naming
//! them, unless already panicking; [`LocalCluster::shutdown`] returns it as an error).

mod install;
mod kubectl;
mod mesh;
mod pods;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};

pub use crate::api::Api;
use crate::control_plane::ControlPlane;
pub use crate::control_plane::{API_ADDR, ISTIOD_ADDR, ISTIOD_HOST};
use crate::controllers::Controllers;
use crate::kubelet::runtime::NodeSpawner;
use crate::kubelet::{Kubelet, NodeInfo};
pub use crate::node::Node;
use crate::services::cluster_dns;
use crate::services::kube_proxy::KubeProxy;
use crate::{control_plane, node, objects};
use test_support::capture::Capture;
use test_support::owner;

use test_support::process::ChildGuard;

/// Istio's system namespace, where the DaemonSet objects live.
pub const SYSTEM_NAMESPACE: &str = "istio-system";

/// Whether the nodes' agents run in native nftables mode by default: `NATIVE_NFTABLES=true`
/// in the test's environment (CI runs the cluster suite once per mode).
pub fn native_nftables() -> bool {
    std::env::var("NATIVE_NFTABLES").is_ok_and(|v| v == "true" || v == "1")
}

/// The redirection every enrolled pod should show ([`LocalCluster::redirection_of`]).
pub fn expected_redirection() -> &'static str {
    if native_nftables() {
        "nftables"
    } else {
        "iptables"
    }
}

/// The shape of a local cluster.
pub struct Topology {
    pub nodes: u8,
    pub istiod_replicas: u8,
    pub dual_stack: bool,
    pub native_nftables: bool,
    pub install: MeshInstall,
}

/// Who runs the mesh's components on the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MeshInstall {
    /// The harness starts istiod-lite, the node agents and ztunnels itself, for tests
    /// that stop, kill or restart one of them at a chosen moment.
    Harness,
    /// `istioctl-lite install --set <values>`: every component from its chart, on a
    /// cluster with a DNS and a service proxy, as a user installs it.
    Charts(Vec<String>),
}

impl Default for Topology {
    fn default() -> Self {
        Topology {
            nodes: 2,
            istiod_replicas: 1,
            dual_stack: false,
            native_nftables: native_nftables(),
            install: MeshInstall::Charts(Vec::new()),
        }
    }
}

/// What CoreDNS and kube-proxy do for a cluster installed from the charts.
struct ClusterServices {
    // Drop order: the poller, then the server.
    _proxy: KubeProxy,
    dns: ChildGuard,
}

/// The running cluster. Fields drop in order: controllers, kubelets (pods), nodes,
/// control plane.
pub struct LocalCluster {
    controllers: Option<Controllers>,
    /// DNS and service proxy, on a cluster installed from the charts.
    services: Option<ClusterServices>,
    /// One per node, by index; `None` while the node is powered off.
    kubelets: Vec<Option<Kubelet>>,
    pub nodes: Vec<Node>,
    pub control_plane: ControlPlane,
    pub tag: String,
    pub install: MeshInstall,
    dir: tempfile::TempDir,
    /// The leftover check already ran ([`LocalCluster::shutdown`]).
    torn_down: bool,
}

impl LocalCluster {
    /// Two nodes; `tag` keeps names unique (short: namespace names derive from it).
    pub fn start(tag: &str) -> Result<Self> {
        Self::with_nodes(tag, 2)
    }

    pub fn with_nodes(tag: &str, count: u8) -> Result<Self> {
        Self::with_topology(
            tag,
            Topology {
                nodes: count,
                ..Topology::default()
            },
        )
    }

    /// Two nodes with the mesh's processes started by the harness
    /// ([`MeshInstall::Harness`]), for tests that stop or restart them at will.
    pub fn with_harness(tag: &str) -> Result<Self> {
        Self::with_topology(
            tag,
            Topology {
                install: MeshInstall::Harness,
                ..Topology::default()
            },
        )
    }

    /// Two nodes, and `replicas` istiod-lite replicas the harness runs behind
    /// istiod's Service (tests stop and kill them one by one).
    pub fn with_istiod_replicas(tag: &str, replicas: u8) -> Result<Self> {
        Self::with_topology(
            tag,
            Topology {
                istiod_replicas: replicas,
                install: MeshInstall::Harness,
                ..Topology::default()
            },
        )
    }

    /// Two nodes whose agents run in native nftables mode or not, whatever the
    /// environment says (the bench compares both; it reads the harness's processes'
    /// memory, so they are the harness's).
    pub fn with_native_nftables(tag: &str, native_nftables: bool) -> Result<Self> {
        Self::with_topology(
            tag,
            Topology {
                native_nftables,
                install: MeshInstall::Harness,
                ..Topology::default()
            },
        )
    }

    /// Two dual-stack nodes: pods get an IPv4 and an IPv6 address (`status.podIPs`),
    /// nodes route both families, and Services may have ClusterIPs of both
    /// (`ipFamilyPolicy`). The control plane itself serves over IPv4.
    pub fn dual_stack(tag: &str) -> Result<Self> {
        Self::with_topology(
            tag,
            Topology {
                dual_stack: true,
                ..Topology::default()
            },
        )
    }

    /// Two nodes with every component installed by `istioctl-lite install` (with
    /// `values` as `--set`s) from the charts: istiod-lite's Deployment behind its
    /// Service, the cni and ztunnel DaemonSets, each pod run from its own spec.
    pub fn with_mesh_from_charts(tag: &str, values: &[&str]) -> Result<Self> {
        Self::with_topology(
            tag,
            Topology {
                install: MeshInstall::Charts(values.iter().map(|v| v.to_string()).collect()),
                ..Topology::default()
            },
        )
    }

    pub fn with_topology(tag: &str, topology: Topology) -> Result<Self> {
        let Topology {
            nodes: count,
            istiod_replicas,
            dual_stack,
            native_nftables,
            install,
        } = topology;
        owner::sweep_stale_processes();
        owner::sweep_stale_dirs();
        let dir = tempfile::Builder::new()
            .prefix(&owner::owner_marker())
            .tempdir()?;
        let harness_istiod = match install {
            MeshInstall::Charts(_) => 0,
            _ => istiod_replicas,
        };
        let control_plane = ControlPlane::start(tag, dir.path(), harness_istiod, dual_stack)?;
        let mut cluster = LocalCluster {
            controllers: None,
            services: None,
            kubelets: Vec::new(),
            nodes: Vec::new(),
            control_plane,
            tag: tag.to_owned(),
            install: install.clone(),
            dir,
            torn_down: false,
        };
        for index in 1..=count {
            let node = Node::create(
                tag,
                index,
                dual_stack,
                cluster.dir.path(),
                &cluster.control_plane.kubeconfig,
            )?;
            cluster
                .control_plane
                .attach(&node.ns, node.host(), dual_stack)?;
            cluster.nodes.push(node);
        }
        // Pod routes: every node (and the control plane) reaches every other node's pods.
        for b in &cluster.nodes {
            for (cidr, via) in b.pod_cidrs().iter().zip(b.ips()) {
                for a in cluster.nodes.iter().filter(|a| a.index != b.index) {
                    a.ns.exec(&["ip", "route", "add", cidr, "via", &via])?;
                }
                if !via.contains(':') {
                    cluster
                        .control_plane
                        .ns
                        .exec(&["ip", "route", "add", cidr, "via", &via])?;
                }
            }
        }
        cluster.create_objects(&install)?;
        let api = cluster.api();
        for node in &mut cluster.nodes {
            node.agent_env
                .push(("NATIVE_NFTABLES".into(), native_nftables.to_string()));
            if install == MeshInstall::Harness {
                node.start_agent()?;
            }
        }
        for node in &cluster.nodes {
            let info = cluster.kubelet_info(node)?;
            cluster
                .kubelets
                .push(Some(Kubelet::start(cluster.api(), info)?));
        }
        cluster.controllers = Some(Controllers::start(
            cluster.api(),
            cluster.control_plane.api_ca.clone(),
        ));
        if let MeshInstall::Charts(mut values) = install {
            cluster.services = Some(cluster.start_services()?);
            values.push(format!("nativeNftables={native_nftables}"));
            cluster.istioctl_install(&values)?;
            return Ok(cluster);
        }
        for node in &mut cluster.nodes {
            let pod = ztunnel_pod(&api, &node.name)?;
            node.project_ztunnel_volumes(api.clone(), pod)?;
            node.start_ztunnel()?;
        }
        Ok(cluster)
    }

    /// What the kubelet of `node` is told about it.
    fn kubelet_info(&self, node: &Node) -> Result<NodeInfo> {
        let harness = self.install == MeshInstall::Harness;
        Ok(NodeInfo {
            name: node.name.clone(),
            index: node.index,
            tag: format!("{}n{}", self.tag, node.index),
            host_netns: node.ns.name().to_owned(),
            host_ip: node.ip(),
            conf_dir: node.conf_dir(),
            cni_path: node.cni_path(),
            owner: owner::cluster_marker(&self.tag),
            root: node.root_dir(),
            pods_dir: node.dir.join("pods"),
            // The chart's agent names its run dir by its node path: the plugin
            // finds the agent's sockets where the agent says they are.
            plugins: NodeSpawner::start(
                &node.ns.path(),
                &if harness {
                    Vec::new()
                } else {
                    vec![(node.run_dir(), node::NODE_AGENT_RUN_DIR.to_owned())]
                },
            )?,
            api_addr: control_plane::api_addr(),
        })
    }

    /// Node `i` loses power: its agent and ztunnel are killed, its kubelet stops and
    /// every pod process dies with its network namespace (no CNI DEL, no preStop), and
    /// `/var/run` empties (the agent's sockets and enablement state; the ZDS socket).
    /// What is on disk stays: the CNI config and binaries, the IPAM store, tokens.
    /// The Pod objects stay too, as the API server keeps them. Harness clusters only.
    pub fn power_off_node(&mut self, i: u8) -> Result<()> {
        anyhow::ensure!(
            self.install == MeshInstall::Harness,
            "power_off_node needs a harness cluster: the charts' node pods belong to the kubelet"
        );
        let node = self.node_mut(i);
        for process in [node.agent.take(), node.ztunnel.take()]
            .into_iter()
            .flatten()
        {
            let mut process = process;
            process.kill();
        }
        for dir in [node.run_dir(), node.host_path(node::NODE_ZDS_DIR)] {
            for entry in std::fs::read_dir(&dir)? {
                let path = entry?.path();
                if path.is_dir() {
                    std::fs::remove_dir_all(&path)?;
                } else {
                    std::fs::remove_file(&path)?;
                }
            }
        }
        // The kubelet's drop kills its pods and deletes their namespaces at once.
        drop(self.kubelets[usize::from(i) - 1].take());
        Ok(())
    }

    /// Node `i`'s kubelet starts again after [`LocalCluster::power_off_node`]: it finds
    /// the node's Pod objects and creates a new sandbox for each, through whatever CNI
    /// config the node has now. The agent and ztunnel are the caller's to start.
    pub fn boot_node(&mut self, i: u8) -> Result<()> {
        let slot = usize::from(i) - 1;
        anyhow::ensure!(self.kubelets[slot].is_none(), "node-{i} is running");
        let info = self.kubelet_info(self.node(i))?;
        self.kubelets[slot] = Some(Kubelet::start(self.api(), info)?);
        Ok(())
    }

    /// The cluster's DNS and service proxy (what CoreDNS and kube-proxy do); the
    /// control plane resolves cluster names too, so istioctl-lite finds istiod there.
    fn start_services(&self) -> Result<ClusterServices> {
        let cp = &self.control_plane;
        let (service, endpoints) = cluster_dns::objects(control_plane::api_addr().ip());
        let api = self.api();
        api.create_if_absent(
            "/api/v1/namespaces",
            &objects::namespace("kube-system", &[]),
        )?;
        api.create_if_absent("/api/v1/namespaces/kube-system/services", &service)?;
        api.create_if_absent("/api/v1/namespaces/kube-system/endpoints", &endpoints)?;
        let mut cmd = cp.ns.command(
            test_support::built_binary("e2e-app")?
                .to_str()
                .context("path")?,
        );
        cmd.args(["cluster-dns", "--listen"])
            .arg(SocketAddr::new(control_plane::api_addr().ip(), 53).to_string())
            .arg("--api")
            .arg(control_plane::api_addr().to_string())
            .env(owner::OWNER_ENV, owner::cluster_marker(&self.tag));
        let dns = ChildGuard::spawn(&format!("cluster-dns-{}", self.tag), cmd)?;
        // The namespaces' own connections to a ClusterIP need a route before OUTPUT's
        // DNAT picks the endpoint (a host's default route, elsewhere).
        let service_range = kube_apiserver_lite::service_ips::DEFAULT_RANGE;
        for node in &self.nodes {
            node.ns
                .exec(&["ip", "route", "add", service_range, "dev", "eth0"])?;
        }
        cp.ns.exec(&[
            "ip",
            "route",
            "add",
            service_range,
            "dev",
            control_plane::BRIDGE,
        ])?;
        let mut netns: Vec<String> = self.nodes.iter().map(|n| n.ns.name().to_owned()).collect();
        netns.push(cp.ns.name().to_owned());
        let proxy = KubeProxy::start(self.api(), netns)?;
        cp.ns.set_resolv_conf(&crate::dns::pod_resolv_conf(
            cluster_dns::CLUSTER_DNS,
            SYSTEM_NAMESPACE,
            cluster_dns::CLUSTER_DOMAIN,
        ))?;
        Ok(ClusterServices { _proxy: proxy, dns })
    }

    /// Node objects and the system namespace; with the harness's processes, the
    /// DaemonSets and accounts standing for them.
    fn create_objects(&self, install: &MeshInstall) -> Result<()> {
        let api = self.api();
        for node in &self.nodes {
            api.create_if_absent(
                "/api/v1/nodes",
                &objects::node(&node.name, &node.ips(), &node.pod_cidrs()),
            )?;
        }
        api.create_if_absent(
            "/api/v1/namespaces",
            &objects::namespace(SYSTEM_NAMESPACE, &[]),
        )?;
        if let MeshInstall::Charts(_) = install {
            return Ok(());
        }
        // The CRDs `istioctl-lite install` would add: custom kinds are served only then.
        for crd in test_support::crds::shipped()? {
            api.create_if_absent(
                "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                &crd,
            )?;
        }
        // `default` as the service account controller makes it (istioctl's XDS token).
        for sa in ["ztunnel", "default"] {
            api.create_if_absent(
                &format!("/api/v1/namespaces/{SYSTEM_NAMESPACE}/serviceaccounts"),
                &objects::service_account(SYSTEM_NAMESPACE, sa),
            )?;
        }
        let path = format!("/apis/apps/v1/namespaces/{SYSTEM_NAMESPACE}/daemonsets");
        for (name, app) in [("ztunnel", "ztunnel"), ("istio-cni-node", "istio-cni-node")] {
            api.create_if_absent(
                &path,
                &objects::daemonset(SYSTEM_NAMESPACE, name, app, self.nodes.len()),
            )?;
        }
        Ok(())
    }

    /// A client for the API server (it connects from the control-plane namespace).
    /// Starts capturing on every node's link to the cluster network: every packet
    /// between nodes, and between a node and the control plane.
    pub fn capture_node_links(&self) -> Result<Capture> {
        let links: Vec<String> = self.nodes.iter().map(Node::cluster_link).collect();
        let links: Vec<&str> = links.iter().map(String::as_str).collect();
        Capture::start(&self.control_plane.ns, &links)
    }

    pub fn api(&self) -> Api {
        self.control_plane.api()
    }

    pub fn kubeconfig(&self) -> &Path {
        &self.control_plane.kubeconfig
    }

    /// Node `i` (1-based, as in `node-<i>`).
    pub fn node(&self, i: u8) -> &Node {
        &self.nodes[usize::from(i) - 1]
    }

    pub fn node_mut(&mut self, i: u8) -> &mut Node {
        &mut self.nodes[usize::from(i) - 1]
    }

    /// Stops every pod and process, then fails if any process marked with this
    /// cluster's owner marker is still alive (those are killed and named). Namespaces
    /// and files go when the value drops.
    pub fn shutdown(mut self) -> Result<()> {
        self.torn_down = true;
        self.stop_processes()
    }

    fn stop_processes(&mut self) -> Result<()> {
        drop(self.controllers.take());
        drop(self.services.take());
        self.kubelets.clear();
        for node in &mut self.nodes {
            drop(node.ztunnel.take());
            drop(node.agent.take());
            drop(node.projector.take());
        }
        self.control_plane.istiods.clear();
        drop(self.control_plane.apiserver.take());
        owner::check_no_leftovers(&owner::cluster_marker(&self.tag), LEFTOVER_GRACE)
    }

    /// Every namespace name this cluster created (control plane, nodes, pods).
    pub fn namespace_names(&self) -> Vec<String> {
        let mut names = vec![self.control_plane.ns.name().to_owned()];
        names.extend(self.nodes.iter().map(|n| n.ns.name().to_owned()));
        names
    }

    /// Pod, process and component logs for a failure message.
    pub fn diagnostics(&self, ns: &str, name: &str) -> String {
        let mut text = format!(
            "pod {ns}/{name}: {:?}\nevents: {:?}\n",
            self.get_pod(ns, name).ok(),
            self.pod_events(ns, name).ok()
        );
        for node in &self.nodes {
            text.push_str(&tail(&node.logs(), 40));
        }
        text
    }
}

/// How long killed processes may take to disappear before they count as left behind.
const LEFTOVER_GRACE: Duration = Duration::from_secs(3);

impl Drop for LocalCluster {
    fn drop(&mut self) {
        if self.torn_down {
            return;
        }
        if let Err(e) = self.stop_processes() {
            if std::thread::panicking() {
                eprintln!("{e:#}");
            } else {
                panic!("{e:#}");
            }
        }
    }
}

/// The Pod object of a node's ztunnel (which the harness runs itself, so it is a
/// mirror pod the kubelet stand-in leaves alone): its token is bound to it, and
/// istiod-lite finds the node through it. Returns (name, uid).
fn ztunnel_pod(api: &Api, node: &str) -> Result<(String, String)> {
    let name = format!("ztunnel-{node}");
    let path = format!("/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods");
    api.create_if_absent(
        &path,
        &objects::mirror_pod(
            SYSTEM_NAMESPACE,
            &name,
            node,
            "ztunnel",
            &[("app", "ztunnel")],
        ),
    )?;
    let pod = api.get(&format!("{path}/{name}"))?;
    let uid = pod["metadata"]["uid"].as_str().context("pod without uid")?;
    Ok((name, uid.to_owned()))
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n") + "\n"
}
