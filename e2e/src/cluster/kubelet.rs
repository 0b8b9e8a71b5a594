//! A kubelet stand-in per node: watches (polls) the pods bound to its node, creates
//! each pod's sandbox (a network namespace set up through the node's CNI chain),
//! starts the containers as processes in it, reports status, and tears it all down
//! when the pod is deleted. Sandbox failures become `FailedCreatePodSandBox` events
//! and are retried with kubelet's backoff (1 s doubling, capped at 10 s).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{bail, Result};
use serde_json::{json, Value};

use super::api::{query_escape, Api};
use super::cni::{self, NetConfList, Runtime};
use super::objects::{now_rfc3339, pod_event};
use crate::netns::Netns;
use crate::process::ChildGuard;

/// How often the pod list is read.
const POLL: Duration = Duration::from_millis(200);
const BACKOFF_START: Duration = Duration::from_secs(1);
const BACKOFF_CAP: Duration = Duration::from_secs(10);

/// What a kubelet needs to know about its node.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    pub name: String,
    pub index: u8,
    /// Tag for pod namespace names (short).
    pub tag: String,
    pub host_netns: String,
    pub host_ip: String,
    pub conf_dir: PathBuf,
    pub cni_path: Vec<PathBuf>,
    /// [`super::sweep::OWNER_ENV`] of the containers: the cluster's marker.
    pub owner: String,
}

/// A running pod: its namespace, its CNI state and its container processes.
pub struct Sandbox {
    // Drop order: processes, then the namespace.
    pub containers: Vec<ChildGuard>,
    pub netns: Netns,
    /// The pod's addresses, IPv4 (the primary family) first.
    pub ips: Vec<String>,
    result: Value,
    /// Each plugin's ADD time (ms), in chain order.
    add_timings: Vec<(String, f64)>,
    conf: NetConfList,
    rt: Runtime,
}

/// What tests may read about a pod the kubelet runs.
#[derive(Debug, Clone)]
pub struct PodHandle {
    pub uid: String,
    pub netns: String,
    /// The primary address (`status.podIP`).
    pub ip: String,
    /// Every address, primary first (`status.podIPs`).
    pub ips: Vec<String>,
    pub pids: Vec<u32>,
    /// Plugin types of the CNI chain the sandbox was created with.
    pub plugins: Vec<String>,
    /// Each plugin's ADD time (ms) for the sandbox that runs now.
    pub cni_add_ms: Vec<(String, f64)>,
}

struct Entry {
    namespace: String,
    name: String,
    cancel: Arc<AtomicBool>,
    worker: Option<JoinHandle<()>>,
    sandbox: Arc<Mutex<Option<Sandbox>>>,
}

type Pods = Arc<Mutex<HashMap<String, Entry>>>;

/// The kubelet thread of one node; stops (killing its pods) when dropped.
pub struct Kubelet {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    pods: Pods,
    teardowns: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Kubelet {
    pub fn start(api: Api, node: NodeInfo) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let pods: Pods = Arc::default();
        let teardowns: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let (s, p, t) = (stop.clone(), pods.clone(), teardowns.clone());
        let thread = std::thread::spawn(move || sync_loop(api, node, s, p, t));
        Kubelet {
            stop,
            thread: Some(thread),
            pods,
            teardowns,
        }
    }

    /// The running pod `namespace/name`, once its sandbox exists.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<PodHandle> {
        let pods = self.pods.lock().ok()?;
        pods.iter()
            .filter(|(_, e)| e.namespace == namespace && e.name == name)
            .find_map(|(uid, e)| {
                let sb = e.sandbox.lock().ok()?;
                sb.as_ref().map(|sb| PodHandle {
                    uid: uid.clone(),
                    netns: sb.netns.name().to_owned(),
                    ip: sb.ips[0].clone(),
                    ips: sb.ips.clone(),
                    pids: sb.containers.iter().map(ChildGuard::pid).collect(),
                    plugins: sb
                        .conf
                        .plugins
                        .iter()
                        .filter_map(|p| p["type"].as_str().map(str::to_owned))
                        .collect(),
                    cni_add_ms: sb.add_timings.clone(),
                })
            })
    }

    /// What the pod's first container printed so far.
    pub fn log(&self, namespace: &str, name: &str) -> Option<String> {
        let pods = self.pods.lock().ok()?;
        let entry = pods
            .values()
            .find(|e| e.namespace == namespace && e.name == name)?;
        let sandbox = entry.sandbox.lock().ok()?;
        sandbox.as_ref()?.containers.first().map(ChildGuard::log)
    }

    /// Every pod the kubelet currently tracks (namespace, name).
    pub fn pod_names(&self) -> Vec<(String, String)> {
        let pods = self.pods.lock().map(|p| {
            p.values()
                .map(|e| (e.namespace.clone(), e.name.clone()))
                .collect()
        });
        pods.unwrap_or_default()
    }

    /// Waits for pending teardowns (pod deletions) to finish.
    pub fn settle(&self) {
        let handles: Vec<_> = self
            .teardowns
            .lock()
            .map(|mut t| t.drain(..).collect())
            .unwrap_or_default();
        for h in handles {
            let _ = h.join();
        }
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.settle();
        let entries: Vec<Entry> = self
            .pods
            .lock()
            .map(|mut p| p.drain().map(|(_, e)| e).collect())
            .unwrap_or_default();
        for mut e in entries {
            e.cancel.store(true, Ordering::SeqCst);
            if let Some(w) = e.worker.take() {
                let _ = w.join();
            }
            // Processes and the namespace go; the node namespace takes the rest.
            drop(e.sandbox.lock().ok().and_then(|mut s| s.take()));
        }
    }
}

fn sync_loop(
    api: Api,
    node: NodeInfo,
    stop: Arc<AtomicBool>,
    pods: Pods,
    teardowns: Arc<Mutex<Vec<JoinHandle<()>>>>,
) {
    let path = format!(
        "/api/v1/pods?fieldSelector={}",
        query_escape(&format!("spec.nodeName={}", node.name))
    );
    let node = Arc::new(node);
    let seq = Arc::new(AtomicU64::new(0));
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(POLL);
        let Ok(items) = api.list(&path) else { continue };
        let mut live = HashMap::new();
        for pod in items {
            let uid = pod["metadata"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let finished = matches!(
                pod["status"]["phase"].as_str(),
                Some("Succeeded" | "Failed")
            );
            // Mirror pods stand for processes the harness runs itself.
            let mirror =
                !pod["metadata"]["annotations"][super::objects::MIRROR_ANNOTATION].is_null();
            if uid.is_empty()
                || finished
                || mirror
                || !pod["metadata"]["deletionTimestamp"].is_null()
            {
                continue;
            }
            live.insert(uid, pod);
        }
        let Ok(mut map) = pods.lock() else { return };
        let gone: Vec<String> = map
            .keys()
            .filter(|uid| !live.contains_key(*uid))
            .cloned()
            .collect();
        for uid in gone {
            if let Some(entry) = map.remove(&uid) {
                let handle = std::thread::spawn(move || teardown(entry));
                if let Ok(mut t) = teardowns.lock() {
                    t.push(handle);
                }
            }
        }
        for (uid, pod) in live {
            if map.contains_key(&uid) {
                continue;
            }
            let cancel = Arc::new(AtomicBool::new(false));
            let sandbox = Arc::new(Mutex::new(None));
            let entry = Entry {
                namespace: pod["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                name: pod["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                cancel: cancel.clone(),
                worker: None,
                sandbox: sandbox.clone(),
            };
            let (api, node, seq) = (api.clone(), node.clone(), seq.clone());
            let worker =
                std::thread::spawn(move || run_pod(&api, &node, &pod, &cancel, &sandbox, &seq));
            map.insert(
                uid,
                Entry {
                    worker: Some(worker),
                    ..entry
                },
            );
        }
    }
}

/// Creates the sandbox, retrying with backoff, then reports the pod Running.
fn run_pod(
    api: &Api,
    node: &NodeInfo,
    pod: &Value,
    cancel: &AtomicBool,
    slot: &Mutex<Option<Sandbox>>,
    seq: &AtomicU64,
) {
    let mut backoff = BACKOFF_START;
    let mut reported_waiting = false;
    while !cancel.load(Ordering::SeqCst) {
        match create_sandbox(node, pod, seq.fetch_add(1, Ordering::Relaxed)) {
            Ok(sandbox) => {
                let status = running_status(node, pod, &sandbox);
                if let Ok(mut s) = slot.lock() {
                    *s = Some(sandbox);
                }
                let _ = api.merge_patch(&status_path(pod), &status);
                return;
            }
            Err(e) => {
                let message = format!("Failed to create pod sandbox: {e:#}");
                let event = pod_event(
                    pod,
                    &node.name,
                    "FailedCreatePodSandBox",
                    &message,
                    seq.fetch_add(1, Ordering::Relaxed),
                );
                let namespace = pod["metadata"]["namespace"].as_str().unwrap_or_default();
                let _ = api.post(&format!("/api/v1/namespaces/{namespace}/events"), &event);
                if !reported_waiting {
                    reported_waiting = api
                        .merge_patch(&status_path(pod), &waiting_status(pod, node))
                        .is_ok();
                }
                let deadline = std::time::Instant::now() + backoff;
                while std::time::Instant::now() < deadline && !cancel.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(50));
                }
                backoff = (backoff * 2).min(BACKOFF_CAP);
            }
        }
    }
}

fn create_sandbox(node: &NodeInfo, pod: &Value, seq: u64) -> Result<Sandbox> {
    let meta = &pod["metadata"];
    let (namespace, name, uid) = (
        meta["namespace"].as_str().unwrap_or_default(),
        meta["name"].as_str().unwrap_or_default(),
        meta["uid"].as_str().unwrap_or_default(),
    );
    let conf = cni::find_config(&node.conf_dir)?;
    let netns = Netns::new(&format!("{}p{seq}", node.tag))?;
    netns.set_resolv_conf(&crate::dns::pod_resolv_conf(
        CLUSTER_DNS,
        namespace,
        "cluster.local",
    ))?;
    let container_id = format!("{:x}{seq:08x}", std::process::id());
    let rt = Runtime {
        host_netns: node.host_netns.clone(),
        container_id: container_id.clone(),
        netns_path: netns.path(),
        ifname: "eth0".into(),
        cni_path: node.cni_path.clone(),
        args: Runtime::k8s_args(namespace, name, uid, &container_id),
    };
    let (result, add_timings) = match cni::add(&conf, &rt) {
        Ok(r) => r,
        Err(e) => {
            let _ = cni::del(&conf, &rt, None);
            return Err(e.context(format!(
                "failed to setup network for sandbox {container_id:?}"
            )));
        }
    };
    let ips = cni::result_ips(&result);
    if ips.is_empty() {
        let _ = cni::del(&conf, &rt, Some(&result));
        bail!("the CNI result has no address: {result}");
    }
    let mut sandbox = Sandbox {
        containers: Vec::new(),
        netns,
        ips,
        result,
        add_timings,
        conf,
        rt,
    };
    for (i, c) in pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let words = |v: &Value| -> Vec<String> {
            v.as_array()
                .into_iter()
                .flatten()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        };
        let mut argv = words(&c["command"]);
        argv.extend(words(&c["args"]));
        let Some(program) = argv.first().map(|p| resolve(p)) else {
            continue;
        };
        let mut cmd = sandbox.netns.command(&program);
        cmd.args(&argv[1..])
            .env(super::sweep::OWNER_ENV, &node.owner);
        for env in c["env"].as_array().into_iter().flatten() {
            if let (Some(k), Some(v)) = (env["name"].as_str(), env["value"].as_str()) {
                cmd.env(k, v);
            }
        }
        let log_name = format!("{}-{namespace}-{name}-{i}", node.tag);
        // A container is a process tree (`sh -c` forks its commands): its own process
        // group, killed whole, as a runtime kills the container's cgroup.
        match ChildGuard::spawn_group(&log_name, cmd) {
            Ok(child) => sandbox.containers.push(child),
            Err(e) => {
                teardown_sandbox(sandbox);
                return Err(e);
            }
        }
    }
    Ok(sandbox)
}

/// kubelet's `clusterDNS`: the usual kube-dns ClusterIP (the local API server never
/// hands it to a Service). Nothing serves it here; in an enrolled pod the node agent's
/// DNS capture sends its queries to ztunnel instead.
pub const CLUSTER_DNS: &str = "10.96.0.10";

/// `e2e-app` and the other workspace binaries resolve to the build's own files.
fn resolve(program: &str) -> String {
    if !program.contains('/') {
        let local = crate::workspace_binary(program);
        if local.exists() {
            return local.to_string_lossy().into_owned();
        }
    }
    program.to_owned()
}

fn teardown(mut entry: Entry) {
    entry.cancel.store(true, Ordering::SeqCst);
    if let Some(w) = entry.worker.take() {
        let _ = w.join();
    }
    if let Some(sandbox) = entry.sandbox.lock().ok().and_then(|mut s| s.take()) {
        teardown_sandbox(sandbox);
    }
}

/// Kills the containers, runs CNI DEL with the cached result, deletes the namespace.
fn teardown_sandbox(mut sandbox: Sandbox) {
    for c in &mut sandbox.containers {
        c.kill();
    }
    let _ = cni::del(&sandbox.conf, &sandbox.rt, Some(&sandbox.result));
    drop(sandbox);
}

fn status_path(pod: &Value) -> String {
    let meta = &pod["metadata"];
    format!(
        "/api/v1/namespaces/{}/pods/{}/status",
        meta["namespace"].as_str().unwrap_or_default(),
        meta["name"].as_str().unwrap_or_default()
    )
}

fn condition(kind: &str, ok: bool, now: &str) -> Value {
    json!({"type": kind, "status": if ok { "True" } else { "False" }, "lastTransitionTime": now})
}

fn running_status(node: &NodeInfo, pod: &Value, sandbox: &Sandbox) -> Value {
    let now = now_rfc3339();
    let containers: Vec<Value> = pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .zip(&sandbox.containers)
        .map(|(c, p)| {
            json!({"name": c["name"], "image": c["image"], "imageID": "", "ready": true, "started": true,
                   "restartCount": 0, "containerID": format!("e2e://{}", p.pid()),
                   "state": {"running": {"startedAt": now}}})
        })
        .collect();
    let conditions: Vec<Value> = [
        "PodScheduled",
        "Initialized",
        "PodReadyToStartContainers",
        "ContainersReady",
        "Ready",
    ]
    .iter()
    .map(|k| condition(k, true, &now))
    .collect();
    json!({"status": {
        "phase": "Running",
        "hostIP": node.host_ip, "hostIPs": [{"ip": node.host_ip}],
        "podIP": sandbox.ips[0],
        "podIPs": sandbox.ips.iter().map(|ip| json!({"ip": ip})).collect::<Vec<_>>(),
        "startTime": now,
        "conditions": conditions,
        "containerStatuses": containers,
    }})
}

fn waiting_status(pod: &Value, node: &NodeInfo) -> Value {
    let now = now_rfc3339();
    let containers: Vec<Value> = pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            json!({"name": c["name"], "image": c["image"], "imageID": "", "ready": false, "started": false,
                   "restartCount": 0, "state": {"waiting": {"reason": "ContainerCreating"}}})
        })
        .collect();
    json!({"status": {
        "phase": "Pending", "hostIP": node.host_ip,
        "conditions": [condition("PodScheduled", true, &now), condition("Ready", false, &now)],
        "containerStatuses": containers,
    }})
}
