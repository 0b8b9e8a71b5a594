//! One sample of the soak (every 10 s): each mesh process's RSS, descriptors, threads
//! and CPU; what the node agents enrolled against what should be; what each ztunnel
//! holds (xDS workloads, certificates, pods served, pod namespaces, HBONE pool) against
//! the API server's truth; and the traffic's counts so far.

use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

use local_cluster::cluster::SYSTEM_NAMESPACE;
use local_cluster::load::Report;
use local_cluster::mesh::{http_get, metric_sum};
use local_cluster::LocalCluster;
use serde::Serialize;
use serde_json::Value;
use test_support::procfs;

/// A mesh process at one moment.
#[derive(Debug, Clone, Serialize)]
pub struct Process {
    /// `ztunnel`, `istio-cni-node`, `istiod` or `kube-apiserver`.
    pub component: String,
    /// The pod (or `apiserver`) and the node it runs on.
    pub pod: String,
    pub node: String,
    pub pid: u32,
    pub rss_kib: u64,
    pub fds: usize,
    pub threads: u64,
    /// CPU used since the previous sample, in cores (None on its first sample).
    pub cpu_cores: Option<f64>,
}

/// What one node's ztunnel holds, against what the API server says should be there.
#[derive(Debug, Clone, Serialize, Default)]
pub struct ZtunnelState {
    pub node: String,
    pub hbone_pool: f64,
    /// Workloads in its xDS state, and those whose pod the API server no longer has.
    pub xds_workloads: usize,
    pub xds_stale: Vec<String>,
    /// Certificates held, and the identities among them no pod of the node has.
    pub certificates: usize,
    pub certificates_stale: Vec<String>,
    /// Pods it serves (ZDS), and those the API server no longer places on the node.
    pub pods_served: usize,
    pub pods_served_stale: Vec<String>,
    /// Network namespaces it holds open (one per pod served, plus its own).
    pub netns_fds: usize,
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct Sample {
    /// Seconds since the soak started.
    pub t_s: f64,
    pub processes: Vec<Process>,
    /// Running pods that should be in the mesh, and what the agents report enrolled.
    pub meshed_expected: usize,
    pub meshed_enrolled: f64,
    pub pods_running: usize,
    /// Pods in the API server (every namespace), for the xDS comparison.
    pub api_pods: usize,
    pub ztunnels: Vec<ZtunnelState>,
    /// The traffic's cumulative counts (summed over the load pods).
    pub traffic: Report,
    /// The faults active during this sample.
    pub faults: Vec<String>,
}

/// Remembers each pid's CPU ticks, for the next sample's rate.
#[derive(Default)]
pub struct Sampler {
    ticks: HashMap<u32, (u64, Instant)>,
}

impl Sampler {
    pub fn processes(&mut self, c: &LocalCluster) -> Vec<Process> {
        let mut out = Vec::new();
        let pods = c
            .api()
            .list(&format!("/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods"))
            .unwrap_or_default();
        let mut found: Vec<(String, String, String, u32)> = Vec::new();
        for pod in &pods {
            let name = pod["metadata"]["name"].as_str().unwrap_or_default();
            let node = pod["spec"]["nodeName"].as_str().unwrap_or_default();
            let component = ["istio-cni-node", "ztunnel", "istiod"]
                .into_iter()
                .find(|prefix| name.starts_with(prefix));
            let (Some(component), Some(handle)) = (component, c.pod(SYSTEM_NAMESPACE, name)) else {
                continue;
            };
            for pid in handle.pids {
                found.push((component.into(), name.into(), node.into(), pid));
            }
        }
        if let Some(api) = &c.control_plane.apiserver {
            found.push((
                "kube-apiserver".into(),
                "apiserver".into(),
                "control-plane".into(),
                api.pid(),
            ));
        }
        let hz = procfs::clock_ticks();
        let now = Instant::now();
        let mut ticks = HashMap::new();
        for (component, pod, node, pid) in found {
            let rss_kib = procfs::rss_kib(pid);
            if rss_kib == 0 {
                continue; // gone between the listing and now
            }
            let cpu = procfs::cpu_ticks(pid);
            let cpu_cores = self.ticks.get(&pid).map(|(before, at)| {
                (cpu.saturating_sub(*before)) as f64 / hz / now.duration_since(*at).as_secs_f64()
            });
            ticks.insert(pid, (cpu, now));
            out.push(Process {
                component,
                pod,
                node,
                pid,
                rss_kib,
                fds: procfs::open_fds(pid).values().sum(),
                threads: procfs::threads(pid),
                cpu_cores,
            });
        }
        self.ticks = ticks;
        out
    }
}

/// Whether `pod` should be in the mesh: its own `istio.io/dataplane-mode` label wins
/// (`none` opts out), else its namespace's; never the mesh's own pods.
pub fn meshed(pod: &Value, ambient_namespaces: &BTreeSet<String>) -> bool {
    let ns = pod["metadata"]["namespace"].as_str().unwrap_or_default();
    if ns == SYSTEM_NAMESPACE || pod["spec"]["hostNetwork"] == true {
        return false;
    }
    match pod["metadata"]["labels"]["istio.io/dataplane-mode"].as_str() {
        Some("ambient") => true,
        Some(_) => false,
        None => ambient_namespaces.contains(ns),
    }
}

fn running(pod: &Value) -> bool {
    pod["status"]["phase"] == "Running" && pod["metadata"]["deletionTimestamp"].is_null()
}

/// Istio's workload uid of a pod.
fn workload_uid(pod: &Value) -> String {
    format!(
        "Kubernetes//Pod/{}/{}",
        pod["metadata"]["namespace"].as_str().unwrap_or_default(),
        pod["metadata"]["name"].as_str().unwrap_or_default()
    )
}

fn identity(pod: &Value) -> String {
    format!(
        "spiffe://cluster.local/ns/{}/sa/{}",
        pod["metadata"]["namespace"].as_str().unwrap_or_default(),
        pod["spec"]["serviceAccountName"]
            .as_str()
            .unwrap_or("default")
    )
}

/// The mesh's state against the API server's: enrolled pods and each ztunnel's.
pub fn mesh_state(c: &LocalCluster, sample: &mut Sample) {
    let api = c.api();
    let (Ok(pods), Ok(namespaces)) = (api.list("/api/v1/pods"), api.list("/api/v1/namespaces"))
    else {
        return; // the API server is restarting: nothing to compare against
    };
    let ambient: BTreeSet<String> = namespaces
        .iter()
        .filter(|ns| ns["metadata"]["labels"]["istio.io/dataplane-mode"] == "ambient")
        .filter_map(|ns| ns["metadata"]["name"].as_str().map(str::to_owned))
        .collect();
    sample.api_pods = pods.len();
    sample.pods_running = pods.iter().filter(|p| running(p)).count();
    sample.meshed_expected = pods
        .iter()
        .filter(|p| running(p) && meshed(p, &ambient))
        .count();
    let all_uids: BTreeSet<String> = pods.iter().map(workload_uid).collect();
    for node in &c.nodes {
        if let Ok(m) = http_get(&node.ns, "http://127.0.0.1:15014/metrics") {
            sample.meshed_enrolled += metric_sum(&m, "istio_cni_pods_enrolled", &[]);
        }
        let on_node: Vec<&Value> = pods
            .iter()
            .filter(|p| p["spec"]["nodeName"] == node.name.as_str())
            .collect();
        let identities: BTreeSet<String> = on_node
            .iter()
            .filter(|p| meshed(p, &ambient))
            .map(|p| identity(p))
            .collect();
        // Pods served are keyed by the Pod object's uid.
        let node_uids: BTreeSet<String> = on_node
            .iter()
            .filter_map(|p| p["metadata"]["uid"].as_str().map(str::to_owned))
            .collect();
        let Some(state) = ztunnel_state(c, node.index, &all_uids, &node_uids, &identities) else {
            continue;
        };
        sample.ztunnels.push(ZtunnelState {
            node: node.name.clone(),
            ..state
        });
    }
}

fn ztunnel_state(
    c: &LocalCluster,
    node: u8,
    all_uids: &BTreeSet<String>,
    node_uids: &BTreeSet<String>,
    identities: &BTreeSet<String>,
) -> Option<ZtunnelState> {
    let dump: Value =
        serde_json::from_str(&c.ztunnel_get(node, "127.0.0.1:15000/config_dump").ok()?).ok()?;
    let metrics = c
        .ztunnel_get(node, "127.0.0.1:15020/metrics")
        .unwrap_or_default();
    let workloads = dump["workloads"].as_array().cloned().unwrap_or_default();
    let uid = |w: &Value| w["uid"].as_str().unwrap_or_default().to_owned();
    let certs = dump["certificates"].as_array().cloned().unwrap_or_default();
    let served = dump["workloadState"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    // The ztunnel's pid, for its namespace descriptors: the newest ready ztunnel pod.
    let netns_fds = ztunnel_pid(c, node)
        .map(|pid| procfs::open_fds(pid).get("net").copied().unwrap_or(0))
        .unwrap_or(0);
    Some(ZtunnelState {
        node: String::new(),
        hbone_pool: metric_sum(&metrics, "ztunnel_hbone_pool_connections", &[]),
        xds_workloads: workloads.len(),
        xds_stale: workloads
            .iter()
            .map(uid)
            .filter(|u| u.starts_with("Kubernetes//Pod/") && !all_uids.contains(u))
            .collect(),
        certificates: certs.len(),
        certificates_stale: certs
            .iter()
            .filter_map(|c| c["identity"].as_str())
            .filter(|id| !identities.contains(*id) && !id.contains("/ns/istio-system/"))
            .map(str::to_owned)
            .collect(),
        pods_served: served.len(),
        pods_served_stale: served
            .iter()
            .filter(|(uid, _)| !node_uids.contains(*uid))
            .map(|(_, state)| {
                let info = &state["info"];
                format!(
                    "{}/{}",
                    info["namespace"].as_str().unwrap_or_default(),
                    info["name"].as_str().unwrap_or_default()
                )
            })
            .collect(),
        netns_fds,
    })
}

fn ztunnel_pid(c: &LocalCluster, node: u8) -> Option<u32> {
    let name = c.node(node).name.clone();
    let pods = c
        .api()
        .list(&format!(
            "/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods?labelSelector=app%3Dztunnel"
        ))
        .ok()?;
    let pod = pods
        .iter()
        .filter(|p| p["spec"]["nodeName"] == name.as_str())
        .max_by_key(|p| {
            p["metadata"]["creationTimestamp"]
                .as_str()
                .map(str::to_owned)
        })?;
    let handle = c.pod(SYSTEM_NAMESPACE, pod["metadata"]["name"].as_str()?)?;
    handle.pids.first().copied()
}
