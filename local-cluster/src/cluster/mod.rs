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

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

pub use crate::api::Api;
use crate::control_plane::ControlPlane;
pub use crate::control_plane::{API_ADDR, ISTIOD_ADDR, ISTIOD_HOST};
use crate::controllers::Controllers;
use crate::kubelet::runtime::NodeSpawner;
use crate::kubelet::{Kubelet, NodeInfo, PodHandle};
pub use crate::node::Node;
use crate::services::cluster_dns;
use crate::services::kube_proxy::KubeProxy;
use crate::{control_plane, controllers, node, objects};
use test_support::owner;

use test_support::poll::wait_for;
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
    kubelets: Vec<Kubelet>,
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
                .attach(&node.ns, 10 + index, dual_stack)?;
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
            let info = NodeInfo {
                name: node.name.clone(),
                index: node.index,
                tag: format!("{tag}n{}", node.index),
                host_netns: node.ns.name().to_owned(),
                host_ip: node.ip(),
                conf_dir: node.conf_dir(),
                cni_path: node.cni_path(),
                owner: owner::cluster_marker(tag),
                root: node.root_dir(),
                pods_dir: node.dir.join("pods"),
                // The chart's agent names its run dir by its node path: the plugin
                // finds the agent's sockets where the agent says they are.
                plugins: NodeSpawner::start(
                    &node.ns.path(),
                    &if install == MeshInstall::Harness {
                        Vec::new()
                    } else {
                        vec![(node.run_dir(), node::NODE_AGENT_RUN_DIR.to_owned())]
                    },
                )?,
                api_addr: control_plane::api_addr(),
            };
            cluster.kubelets.push(Kubelet::start(cluster.api(), info)?);
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

    /// `istioctl-lite install` with `values`, as a user runs it (again: an upgrade):
    /// the CA Secret from the harness's CA (the plug-in CA flow, so tests know the
    /// root), then the charts, waiting for each workload's rollout.
    pub fn istioctl_install(&self, values: &[String]) -> Result<()> {
        self.create_ca_secret()?;
        self.istioctl_charts("install", values)
    }

    /// `istioctl-lite uninstall` (every chart's objects but the CA Secret).
    pub fn istioctl_uninstall(&self) -> Result<()> {
        self.istioctl_charts("uninstall", &[])
    }

    fn istioctl_charts(&self, verb: &str, values: &[String]) -> Result<()> {
        let charts = crate::charts::charts_dir();
        let mut args: Vec<String> = vec![
            verb.into(),
            "--charts-dir".into(),
            charts.to_string_lossy().into_owned(),
        ];
        if verb == "install" {
            args.extend(["--timeout".into(), "90s".into()]);
        }
        for v in values {
            args.extend(["--set".into(), v.clone()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.istioctl(&args).with_context(|| {
            let events = self.kubectl(&["get", "events", "-A"]).unwrap_or_default();
            let pods = self
                .kubectl(&["get", "pods", "-A", "-o", "wide"])
                .unwrap_or_default();
            format!("{pods}\n{events}\n{}", self.system_pod_logs())
        })?;
        Ok(())
    }

    /// Secret `cacerts` from the control plane's CA files, as `kubectl create secret
    /// generic cacerts --from-file=<dir>` makes it.
    fn create_ca_secret(&self) -> Result<()> {
        use base64::Engine as _;
        let mut data = serde_json::Map::new();
        for entry in std::fs::read_dir(&self.control_plane.ca_dir)? {
            let path = entry?.path();
            if let Some(name) = path.file_name().and_then(|n| n.to_str()) {
                let bytes = std::fs::read(&path)?;
                data.insert(
                    name.to_owned(),
                    base64::engine::general_purpose::STANDARD
                        .encode(bytes)
                        .into(),
                );
            }
        }
        self.api().create_if_absent(
            &format!("/api/v1/namespaces/{SYSTEM_NAMESPACE}/secrets"),
            &serde_json::json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "cacerts", "namespace": SYSTEM_NAMESPACE},
                "type": "Opaque", "data": data,
            }),
        )
    }

    /// Logs of the mesh's pods the kubelets run (the chart-run agent's), for failures.
    pub fn system_pod_logs(&self) -> String {
        let mut text = String::new();
        for k in &self.kubelets {
            for (ns, name) in k
                .pod_names()
                .into_iter()
                .filter(|(ns, _)| ns == SYSTEM_NAMESPACE)
            {
                // A crashing container's words are in the instance before this one.
                let log = k
                    .log(&ns, &name)
                    .filter(|l| !l.trim().is_empty())
                    .or_else(|| k.container_log(&ns, &name, None, true))
                    .unwrap_or_default();
                text.push_str(&format!("--- {ns}/{name} ---\n{}\n", tail(&log, 40)));
            }
        }
        if let Some(services) = &self.services {
            text.push_str(&format!(
                "--- cluster DNS ---\n{}\n",
                tail(&services.dns.log(), 20)
            ));
        }
        text
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

    /// Files under the nodes' directories, outside istiod-lite's own pods (their
    /// `cacerts` volume), that hold the mesh CA's key (by name or content). Empty is
    /// the point: no agent, ztunnel or other pod has it.
    pub fn node_files_with_ca_key(&self) -> Result<Vec<std::path::PathBuf>> {
        let key = std::fs::read_to_string(self.control_plane.ca_dir.join("ca-key.pem"))?;
        let istiod_pods: Vec<String> = self
            .api()
            .list(&format!(
                "/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods?labelSelector=app%3Distiod"
            ))?
            .iter()
            .filter_map(|p| p["metadata"]["uid"].as_str().map(str::to_owned))
            .collect();
        let mut found = Vec::new();
        for node in &self.nodes {
            let pods_dir = node.dir.join("pods");
            let istiods: Vec<PathBuf> = istiod_pods.iter().map(|uid| pods_dir.join(uid)).collect();
            for file in files_under(&node.dir)
                .into_iter()
                .filter(|f| !istiods.iter().any(|dir| f.starts_with(dir)))
            {
                let text = std::fs::read(&file).unwrap_or_default();
                if file.ends_with("ca-key.pem")
                    || String::from_utf8_lossy(&text).contains(key.trim())
                {
                    found.push(file);
                }
            }
        }
        Ok(found)
    }

    /// A client for the API server (it connects from the control-plane namespace).
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

    /// A shell command line that runs kubectl against this cluster (ready to paste).
    pub fn kubectl_prefix(&self) -> String {
        format!(
            "ip netns exec {} kubectl --kubeconfig {}",
            self.control_plane.ns.name(),
            self.kubeconfig().display()
        )
    }

    /// Runs the real `kubectl` (inside the control-plane namespace); its stdout.
    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        self.run_with_kubeconfig("kubectl", args)
    }

    /// istioctl-lite with this cluster's kubeconfig, from the control-plane namespace
    /// (so it reaches istiod-lite at [`ISTIOD_ADDR`]).
    pub fn istioctl(&self, args: &[&str]) -> Result<String> {
        let binary = test_support::built_binary("istioctl-lite")?;
        self.run_with_kubeconfig(binary.to_str().context("path")?, args)
    }

    fn run_with_kubeconfig(&self, program: &str, args: &[&str]) -> Result<String> {
        let mut cmd = self.control_plane.ns.command(program);
        cmd.arg("--kubeconfig").arg(self.kubeconfig()).args(args);
        let out = cmd.output().with_context(|| format!("running {program}"))?;
        if !out.status.success() {
            bail!(
                "{program} {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Commands to try the cluster by hand, for a root shell: `make demo-up` prints
    /// them and a test runs them. The first defines the alias `k` (kubectl against
    /// this cluster).
    pub fn try_it_commands(&self) -> Result<Vec<String>> {
        let istioctl = test_support::built_binary("istioctl-lite")?;
        let kubeconfig = self.kubeconfig().display();
        let pod = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"s"},"spec":{"nodeName":"node-2","containers":[{"name":"s","image":"e2e-app:local","command":["e2e-app","sink","--listen","0.0.0.0:9000"]}]}}"#;
        Ok(vec![
            format!("alias k='{}'", self.kubectl_prefix()),
            "k get nodes,pods -A -o wide".into(),
            "k label namespace default istio.io/dataplane-mode=ambient".into(),
            format!("k apply -f - <<< '{pod}'"),
            "k logs s".into(),
            "k describe pod s".into(),
            "k get events -A".into(),
            // Where the CNI plugin's errors point to.
            format!("k -n {SYSTEM_NAMESPACE} logs ds/istio-cni-node"),
            format!(
                "ip netns exec {} {} --kubeconfig {kubeconfig} ztunnel-config workloads --ztunnel-admin 127.0.0.1:15000",
                self.ztunnel_netns(1)?,
                istioctl.display()
            ),
            format!(
                "ip netns exec {} {} --kubeconfig {kubeconfig} {}",
                self.control_plane.ns.name(),
                istioctl.display(),
                self.proxy_status_args().join(" ")
            ),
        ])
    }

    /// `kubectl apply -f -` with `manifest` on stdin.
    pub fn kubectl_apply(&self, manifest: &str) -> Result<String> {
        self.apply(None, manifest)
    }

    /// `kubectl -n namespace apply -f -`: objects without a namespace go there.
    pub fn kubectl_apply_in(&self, namespace: &str, manifest: &str) -> Result<String> {
        self.apply(Some(namespace), manifest)
    }

    fn apply(&self, namespace: Option<&str>, manifest: &str) -> Result<String> {
        use std::io::Write;
        let mut child = self
            .control_plane
            .ns
            .command("kubectl")
            .arg("--kubeconfig")
            .arg(self.kubeconfig())
            .args(namespace.map(|ns| ["-n", ns]).into_iter().flatten())
            .args(["apply", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        child
            .stdin
            .take()
            .context("stdin")?
            .write_all(manifest.as_bytes())?;
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!(
                "kubectl apply failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    pub fn create_namespace(&self, name: &str, labels: &[(&str, &str)]) -> Result<()> {
        self.api()
            .post("/api/v1/namespaces", &objects::namespace(name, labels))?;
        Ok(())
    }

    /// Sets (or with `None` removes) a namespace label.
    pub fn label_namespace(&self, name: &str, key: &str, value: Option<&str>) -> Result<()> {
        let patch = json!({"metadata": {"labels": {key: value}}});
        self.api()
            .merge_patch(&format!("/api/v1/namespaces/{name}"), &patch)?;
        Ok(())
    }

    /// Creates a pod on node `node` (1-based) running `argv` as service account `sa`.
    pub fn create_pod(
        &self,
        ns: &str,
        name: &str,
        node: u8,
        sa: &str,
        labels: &[(&str, &str)],
        argv: &[&str],
    ) -> Result<()> {
        let pod = objects::pod(ns, name, &self.node(node).name, sa, labels, argv);
        self.api()
            .post(&format!("/api/v1/namespaces/{ns}/pods"), &pod)?;
        Ok(())
    }

    pub fn delete_pod(&self, ns: &str, name: &str) -> Result<()> {
        self.api()
            .delete(&format!("/api/v1/namespaces/{ns}/pods/{name}"))
    }

    pub fn get_pod(&self, ns: &str, name: &str) -> Result<Value> {
        self.api()
            .get(&format!("/api/v1/namespaces/{ns}/pods/{name}"))
    }

    /// The kubelet's view of a running pod (namespace, IP, container pids).
    pub fn pod(&self, ns: &str, name: &str) -> Option<PodHandle> {
        self.kubelets.iter().find_map(|k| k.pod(ns, name))
    }

    /// What the pod's first container printed so far (`kubectl logs`).
    pub fn pod_log(&self, ns: &str, name: &str) -> Option<String> {
        self.kubelets.iter().find_map(|k| k.log(ns, name))
    }

    /// Waits until the pod runs and the API shows it Running with its IP.
    pub fn wait_pod_running(&self, ns: &str, name: &str, timeout: Duration) -> Result<PodHandle> {
        wait_for(&format!("pod {ns}/{name} to run"), timeout, || {
            let handle = self.pod(ns, name)?;
            let pod = self.get_pod(ns, name).ok()?;
            (pod["status"]["phase"] == "Running" && pod["status"]["podIP"] == handle.ip.as_str())
                .then_some(handle)
        })
        .with_context(|| self.diagnostics(ns, name))
    }

    /// The pod's `ambient.istio.io/redirection` annotation.
    pub fn redirection(&self, ns: &str, name: &str) -> Option<String> {
        let pod = self.get_pod(ns, name).ok()?;
        pod["metadata"]["annotations"]["ambient.istio.io/redirection"]
            .as_str()
            .map(str::to_owned)
    }

    /// Waits until the redirection annotation equals `want` (`None`: absent).
    pub fn wait_redirection(
        &self,
        ns: &str,
        name: &str,
        want: Option<&str>,
        timeout: Duration,
    ) -> Result<()> {
        wait_for(
            &format!("{ns}/{name} redirection={want:?}"),
            timeout,
            || (self.redirection(ns, name).as_deref() == want).then_some(()),
        )
        .with_context(|| self.diagnostics(ns, name))
    }

    /// Waits until node `node`'s ztunnel has learned (from Kubernetes) that the pod
    /// at `ip` takes HBONE. Between the agent's annotation and this moment a new
    /// connection to the pod still goes out as plain TCP, as with Istio.
    pub fn wait_ztunnel_sees_hbone(&self, node: u8, ip: &str, timeout: Duration) -> Result<()> {
        wait_for(
            &format!("node {node}'s ztunnel to see {ip} as HBONE"),
            timeout,
            || {
                let dump = self.ztunnel_get(node, "127.0.0.1:15000/config_dump").ok()?;
                let dump: Value = serde_json::from_str(&dump).ok()?;
                dump["workloads"]
                    .as_array()?
                    .iter()
                    .any(|w| {
                        w["protocol"] == "HBONE"
                            && w["workloadIps"]
                                .as_array()
                                .is_some_and(|ips| ips.iter().any(|i| i == ip))
                    })
                    .then_some(())
            },
        )
    }

    /// The network namespace node `node`'s ztunnel runs in: the node's when the
    /// harness runs it, else its pod's (the newest ready one while a rollout surges).
    pub fn ztunnel_netns(&self, node: u8) -> Result<String> {
        let node = self.node(node);
        if !matches!(self.install, MeshInstall::Charts(_)) {
            return Ok(node.ns.name().to_owned());
        }
        let pods = self.api().list(&format!(
            "/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods?labelSelector=app%3Dztunnel"
        ))?;
        let newest_ready = pods
            .iter()
            .filter(|p| p["spec"]["nodeName"] == node.name.as_str() && controllers::ready(p))
            .max_by_key(|p| {
                p["metadata"]["creationTimestamp"]
                    .as_str()
                    .map(str::to_owned)
            })
            .with_context(|| format!("no ready ztunnel pod on {}", node.name))?;
        let name = newest_ready["metadata"]["name"]
            .as_str()
            .unwrap_or_default();
        let handle = self
            .pod(SYSTEM_NAMESPACE, name)
            .with_context(|| format!("ztunnel pod {name} has no sandbox"))?;
        Ok(handle.netns)
    }

    /// `http://<addr_path>` fetched in node `node`'s ztunnel's namespace (its admin
    /// port listens on localhost only).
    pub fn ztunnel_get(&self, node: u8, addr_path: &str) -> Result<String> {
        let netns = self.ztunnel_netns(node)?;
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", &netns])
            .arg(test_support::built_binary("e2e-app")?)
            .args(["get", &format!("http://{addr_path}")])
            .output()?;
        if !out.status.success() {
            bail!(
                "GET {addr_path} in {netns}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `istioctl-lite proxy-status` as run from the control-plane namespace: istiod's
    /// Service by its name (the cluster's DNS) when installed from the charts, else
    /// the harness's Service address, checked against istiod's name.
    pub fn proxy_status_args(&self) -> Vec<String> {
        let mut args = vec!["proxy-status".to_owned()];
        args.extend(self.xds_args());
        args
    }

    /// istioctl-lite's flags to reach istiod over XDS from the control-plane
    /// namespace: none (its defaults, istiod's Service by name) when installed from
    /// the charts, else the harness's Service address checked against istiod's name.
    pub fn xds_args(&self) -> Vec<String> {
        if matches!(self.install, MeshInstall::Charts(_)) {
            return Vec::new();
        }
        ["--xds-address", ISTIOD_ADDR, "--xds-san", ISTIOD_HOST]
            .map(String::from)
            .to_vec()
    }

    /// Names of the pods of `namespace` (every node's).
    pub fn pod_names_in(&self, namespace: &str) -> Vec<String> {
        self.kubelets
            .iter()
            .flat_map(|k| k.pod_names())
            .filter(|(ns, _)| ns == namespace)
            .map(|(_, name)| name)
            .collect()
    }

    /// Prometheus text of istiod-lite: replica 0's, or when installed from the charts
    /// every ready replica's one after the other (sums add up across replicas).
    pub fn istiod_metrics(&self) -> Result<String> {
        if !matches!(self.install, MeshInstall::Charts(_)) {
            return self.control_plane.istiod_metrics();
        }
        let pods = self.api().list(&format!(
            "/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods?labelSelector=app%3Distiod"
        ))?;
        let mut text = String::new();
        for ip in pods
            .iter()
            .filter(|p| controllers::ready(p))
            .filter_map(|p| p["status"]["podIP"].as_str())
        {
            text += &crate::mesh::http_get(
                &self.control_plane.ns,
                &format!("http://{ip}:15014/metrics"),
            )?;
        }
        Ok(text)
    }

    /// Prometheus text from node `node`'s ztunnel.
    pub fn ztunnel_metrics(&self, node: u8) -> Result<String> {
        self.ztunnel_get(node, "127.0.0.1:15020/metrics")
    }

    /// Messages of the events recorded about a pod.
    pub fn pod_events(&self, ns: &str, name: &str) -> Result<Vec<(String, String)>> {
        let events = self
            .api()
            .list(&format!("/api/v1/namespaces/{ns}/events"))?;
        Ok(events
            .iter()
            .filter(|e| e["involvedObject"]["name"] == name)
            .map(|e| {
                let text = |k: &str| e[k].as_str().unwrap_or_default().to_owned();
                (text("reason"), text("message"))
            })
            .collect())
    }

    /// Runs `argv` inside the pod's namespace; its stdout.
    pub fn exec_in_pod(&self, ns: &str, name: &str, argv: &[&str]) -> Result<String> {
        let handle = self
            .pod(ns, name)
            .with_context(|| format!("pod {ns}/{name} is not running"))?;
        let program = resolve_program(argv.first().copied().unwrap_or_default());
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", &handle.netns, &program])
            .args(&argv[1..])
            .output()?;
        if !out.status.success() {
            bail!(
                "{argv:?} in {ns}/{name} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// How the pod's traffic is redirected, read from its netns: `"nftables"` (our
    /// `inet istio-ambient-nat` table), `"iptables"` (our `ISTIO_OUTPUT` chain) or `"none"`.
    pub fn redirection_of(&self, ns: &str, name: &str) -> Result<&'static str> {
        if self
            .exec_in_pod(ns, name, &["nft", "list", "tables"])?
            .contains("istio-ambient-nat")
        {
            return Ok("nftables");
        }
        let save = self.exec_in_pod(ns, name, &["iptables-save", "-t", "nat"])?;
        Ok(if save.contains(":ISTIO_OUTPUT") {
            "iptables"
        } else {
            "none"
        })
    }

    /// Starts `argv` as a background process inside the pod's namespace.
    pub fn spawn_in_pod(&self, ns: &str, name: &str, argv: &[&str]) -> Result<ChildGuard> {
        let handle = self
            .pod(ns, name)
            .with_context(|| format!("pod {ns}/{name} is not running"))?;
        let mut cmd = std::process::Command::new("ip");
        cmd.args([
            "netns",
            "exec",
            &handle.netns,
            &resolve_program(argv.first().copied().unwrap_or_default()),
        ])
        .args(&argv[1..])
        .env(owner::OWNER_ENV, owner::cluster_marker(&self.tag));
        ChildGuard::spawn_group(&format!("{}-exec-{ns}-{name}", self.tag), cmd)
    }

    /// `e2e-app ping` from a pod, in the background: one connection to an echo server
    /// at `target`, `count` round trips `interval_ms` apart; the process exits 3 if the
    /// connection closes before the last.
    pub fn spawn_ping(
        &self,
        (ns, from): (&str, &str),
        target: &str,
        count: u32,
        interval_ms: u32,
    ) -> Result<ChildGuard> {
        let (count, interval) = (count.to_string(), interval_ms.to_string());
        let argv = [
            "e2e-app",
            "ping",
            "--connect",
            target,
            "--count",
            &count,
            "--interval-ms",
            &interval,
        ];
        self.spawn_in_pod(ns, from, &argv)
    }

    /// `e2e-app send` from a pod; the sink's JSON answer.
    pub fn send(&self, ns: &str, from: &str, target: &str, bytes: u64) -> Result<Value> {
        let out = self.exec_in_pod(
            ns,
            from,
            &[
                "e2e-app",
                "send",
                "--connect",
                target,
                "--bytes",
                &bytes.to_string(),
            ],
        )?;
        Ok(serde_json::from_str(out.trim())?)
    }

    /// Waits until every node's ztunnel is ready (needs the agents' ZDS servers).
    pub fn wait_ztunnels_ready(&self, timeout: Duration) -> Result<()> {
        for node in &self.nodes {
            wait_for(
                &format!("ztunnel on {} to be ready", node.name),
                timeout,
                || {
                    self.ztunnel_get(node.index, "127.0.0.1:15021/healthz/ready")
                        .ok()
                        .map(drop)
                },
            )
            .with_context(|| format!("{}{}", node.logs(), self.system_pod_logs()))?;
        }
        Ok(())
    }

    /// Waits until the kubelets finished tearing down deleted pods.
    pub fn settle(&self) {
        for k in &self.kubelets {
            k.settle();
        }
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

/// Every regular file under `dir`, recursively (sockets and links skipped).
fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        match entry.file_type() {
            Ok(t) if t.is_dir() => out.extend(files_under(&path)),
            Ok(t) if t.is_file() => out.push(path),
            _ => {}
        }
    }
    out
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

fn resolve_program(program: &str) -> String {
    let local = test_support::workspace_binary(program);
    if !program.contains('/') && local.exists() {
        return local.to_string_lossy().into_owned();
    }
    program.to_owned()
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n") + "\n"
}
