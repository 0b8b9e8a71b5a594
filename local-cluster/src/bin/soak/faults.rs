//! The faults the soak injects, one at a time, each with the window in which the
//! traffic may suffer from it: from its start until the mesh is whole again, plus a
//! grace for the connections the fault broke to be counted.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use local_cluster::cluster::SYSTEM_NAMESPACE;
use local_cluster::controllers;
use local_cluster::LocalCluster;
use serde::Serialize;
use serde_json::json;

/// After a fault's end, failures are still counted as its own for this long (a round
/// trip's timeout plus a report interval).
const GRACE: Duration = Duration::from_secs(15);
/// A fault that is not over after this long fails the soak (which goes on without it).
pub const LIMIT: Duration = Duration::from_secs(180);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// SIGKILL to istiod-lite; the kubelet restarts the container.
    IstiodKilled,
    /// SIGKILL to one node's agent; the kubelet restarts it.
    AgentKilled,
    /// `kubectl rollout restart daemonset/ztunnel`: long-lived connections on the old
    /// ztunnels end at their drain deadline (documented).
    ZtunnelRollout,
    /// The API server stops and starts again.
    ApiServerRestart,
}

/// In turn; the rollout last, as it takes longest (the old ztunnels' drain).
pub const SCHEDULE: [Kind; 4] = [
    Kind::IstiodKilled,
    Kind::AgentKilled,
    Kind::ApiServerRestart,
    Kind::ZtunnelRollout,
];

/// A fault injected at `start_s` (seconds into the soak), over at `end_s`.
#[derive(Debug, Clone, Serialize)]
pub struct Fault {
    pub kind: Kind,
    /// The node, for a node's fault.
    pub node: Option<String>,
    pub start_s: f64,
    pub end_s: Option<f64>,
    /// The pods of the component before the fault (to see them replaced), and their
    /// processes (to see a killed one restarted, a replaced one's exit: it may still
    /// be draining).
    #[serde(skip)]
    before: Vec<String>,
    #[serde(skip)]
    before_pids: Vec<u32>,
}

impl Fault {
    /// Whether a failure at `t_s` belongs to this fault.
    pub fn covers(&self, t_s: f64) -> bool {
        let end = self.end_s.unwrap_or(f64::INFINITY) + GRACE.as_secs_f64();
        t_s >= self.start_s && t_s <= end
    }

    pub fn name(&self) -> String {
        let kind = serde_json::to_value(self.kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        match &self.node {
            Some(node) => format!("{kind} ({node})"),
            None => kind,
        }
    }
}

fn kill(pid: u32) {
    // SAFETY: kill(2) on a pid our kubelet stand-in started and still supervises.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
}

fn system_pods(c: &LocalCluster, prefix: &str, node: Option<&str>) -> Vec<String> {
    c.api()
        .list(&format!("/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods"))
        .unwrap_or_default()
        .iter()
        .filter(|p| node.is_none_or(|n| p["spec"]["nodeName"] == n))
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
        .filter(|name| name.starts_with(prefix))
        .collect()
}

fn first_pid(c: &LocalCluster, pod: &str) -> Option<u32> {
    c.pod(SYSTEM_NAMESPACE, pod)?.pids.first().copied()
}

/// Injects `kind` (`round` picks the node for a node's fault).
pub fn inject(c: &mut LocalCluster, kind: Kind, round: usize, t_s: f64) -> Result<Fault> {
    let mut fault = Fault {
        kind,
        node: None,
        start_s: t_s,
        end_s: None,
        before: Vec::new(),
        before_pids: Vec::new(),
    };
    match kind {
        Kind::IstiodKilled => {
            let pod = system_pods(c, "istiod", None)
                .into_iter()
                .next()
                .context("no istiod pod")?;
            let pid = first_pid(c, &pod).context("istiod has no process")?;
            kill(pid);
            fault.before = vec![pod];
            fault.before_pids = vec![pid];
        }
        Kind::AgentKilled => {
            let node = c.nodes[round % c.nodes.len()].name.clone();
            let pod = system_pods(c, "istio-cni-node", Some(&node))
                .into_iter()
                .next()
                .context("no agent pod")?;
            let pid = first_pid(c, &pod).context("the agent has no process")?;
            kill(pid);
            fault.node = Some(node);
            fault.before = vec![pod];
            fault.before_pids = vec![pid];
        }
        Kind::ZtunnelRollout => {
            fault.before = system_pods(c, "ztunnel", None);
            fault.before_pids = fault
                .before
                .iter()
                .filter_map(|p| first_pid(c, p))
                .collect();
            let restarted = json!({"spec": {"template": {"metadata": {"annotations": {
                "kubectl.kubernetes.io/restartedAt": local_cluster::objects::now_rfc3339()
            }}}}});
            c.api().merge_patch(
                &format!("/apis/apps/v1/namespaces/{SYSTEM_NAMESPACE}/daemonsets/ztunnel"),
                &restarted,
            )?;
        }
        Kind::ApiServerRestart => {
            c.control_plane.start_apiserver()?;
        }
    }
    Ok(fault)
}

/// Whether the mesh is whole again after `fault`: the component's pods are back and
/// ready (and, for a rollout, every old pod is gone).
pub fn recovered(c: &LocalCluster, fault: &Fault) -> bool {
    let ready = |prefix: &str, node: Option<&str>| {
        let pods = c
            .api()
            .list(&format!("/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods"))
            .unwrap_or_default();
        let mine: Vec<_> = pods
            .iter()
            .filter(|p| {
                p["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with(prefix))
            })
            .filter(|p| node.is_none_or(|n| p["spec"]["nodeName"] == n))
            .collect();
        !mine.is_empty() && mine.iter().all(|p| controllers::ready(p))
    };
    // A killed pod is back once its container runs a new process (until the kubelet
    // sees the exit, the pod still reads ready).
    let restarted = || {
        fault
            .before
            .iter()
            .zip(&fault.before_pids)
            .all(|(pod, pid)| first_pid(c, pod).is_some_and(|now| now != *pid))
    };
    match fault.kind {
        Kind::IstiodKilled => restarted() && ready("istiod", None),
        Kind::AgentKilled => restarted() && ready("istio-cni-node", fault.node.as_deref()),
        Kind::ZtunnelRollout => {
            let now = system_pods(c, "ztunnel", None);
            // Over once the old ztunnels finished draining, not when their pods went.
            let exited = |pid: &u32| !std::path::Path::new(&format!("/proc/{pid}")).exists();
            now.len() == c.nodes.len()
                && now.iter().all(|p| !fault.before.contains(p))
                && fault.before_pids.iter().all(exited)
                && ready("ztunnel", None)
        }
        Kind::ApiServerRestart => c.api().get("/api/v1/namespaces/default").is_ok(),
    }
}

/// Ends `fault` if the mesh recovered (`Some(true)`), or gives up on it once it took
/// longer than [`LIMIT`] (`Some(false)`: it stays without an end, and fails the soak).
pub fn settle(c: &LocalCluster, fault: &mut Fault, t_s: f64, started: Instant) -> Option<bool> {
    if recovered(c, fault) {
        fault.end_s = Some(t_s);
        return Some(true);
    }
    (started.elapsed() >= LIMIT).then_some(false)
}

#[cfg(test)]
impl Fault {
    /// A fault of `kind` that ran from `start_s` to `end_s`, for the judge's tests.
    pub fn ran(kind: Kind, start_s: f64, end_s: f64) -> Fault {
        Fault {
            kind,
            node: None,
            start_s,
            end_s: Some(end_s),
            before: Vec::new(),
            before_pids: Vec::new(),
        }
    }
}
