//! A kubelet stand-in per node: watches (polls) the pods bound to its node, creates
//! each pod's sandbox (a network namespace set up through the node's CNI chain),
//! runs the containers from their spec (image table, env, restart policy, probes),
//! reports status, and stops them gracefully and tears it all down when the pod is
//! deleted. Sandbox failures become `FailedCreatePodSandBox` events and are retried
//! with kubelet's backoff (1 s doubling, capped at 10 s).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Result;
use serde_json::Value;

pub mod cni;
pub mod container_env;
pub mod container_log;
pub mod containers;
mod launch;
pub mod probes;
pub mod projected;
pub mod runtime;
mod sandbox;
pub mod server;
mod status;
pub mod volumes;

use crate::kubelet::runtime::NodeSpawner;
use launch::{container_command, with_api_access};
pub use sandbox::Sandbox;
use sandbox::{create_sandbox, teardown_sandbox, Network};
use status::{pod_status, status_path, waiting_status, Conditions};

use crate::api::{query_escape, Api};
use crate::kubelet::containers::{Container, RestartPolicy};
use crate::kubelet::probes::HttpGet;
use crate::kubelet::server::{KubeletServer, LogLookup, KUBELET_PORT};
use crate::objects::event;
use test_support::process::ChildGuard;

/// How often the pod list is read.
const POLL: Duration = Duration::from_millis(200);
const BACKOFF_START: Duration = Duration::from_secs(1);
const BACKOFF_CAP: Duration = Duration::from_secs(10);
/// Numbers sandboxes (their container IDs and namespace names) across every kubelet of
/// the process: a kubelet started again after a node's power cycle must not reuse an ID
/// the IPAM store still holds an address for, as a real runtime never does.
static SANDBOX_SEQ: AtomicU64 = AtomicU64::new(0);

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
    /// [`test_support::owner::OWNER_ENV`] of the containers: the cluster's marker.
    pub owner: String,
    /// The node's own filesystem tree (`hostPath` volumes live under it).
    pub root: PathBuf,
    /// Where pods' volumes and container roots are kept.
    pub pods_dir: PathBuf,
    /// Starts the CNI plugins as processes of the node ([`cni::Runtime`]).
    pub plugins: NodeSpawner,
    /// The API server, as in-cluster clients reach it (`KUBERNETES_SERVICE_*`).
    pub api_addr: std::net::SocketAddr,
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
    /// The Pod object as first seen (its spec does not change).
    pod: Value,
    cancel: Arc<AtomicBool>,
    worker: Option<JoinHandle<()>>,
    sandbox: Arc<Mutex<Option<Sandbox>>>,
}

type Pods = Arc<Mutex<HashMap<String, Entry>>>;

/// The kubelet thread of one node; stops (killing its pods) when dropped.
pub struct Kubelet {
    /// Its HTTP endpoint (logs), stopped first.
    server: Option<KubeletServer>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    pods: Pods,
    teardowns: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Kubelet {
    /// Starts the kubelet of `node`, with its HTTP endpoint on the node's address.
    pub fn start(api: Api, node: NodeInfo) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let pods: Pods = Arc::default();
        let teardowns: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let addr = std::net::SocketAddr::new(node.host_ip.parse()?, KUBELET_PORT);
        let netns = PathBuf::from("/var/run/netns").join(&node.host_netns);
        let server = KubeletServer::start(&netns, addr, log_lookup(pods.clone()))?;
        let (s, p, t) = (stop.clone(), pods.clone(), teardowns.clone());
        let thread = std::thread::spawn(move || sync_loop(api, node, s, p, t));
        Ok(Kubelet {
            server: Some(server),
            stop,
            thread: Some(thread),
            pods,
            teardowns,
        })
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
                    netns: sb.netns_name().to_owned(),
                    ip: sb.ips[0].clone(),
                    ips: sb.ips.clone(),
                    pids: sb.containers.iter().filter_map(Container::pid).collect(),
                    plugins: match &sb.network {
                        Network::Pod(pod) => pod
                            .conf
                            .plugins
                            .iter()
                            .filter_map(|p| p["type"].as_str().map(str::to_owned))
                            .collect(),
                        Network::Host { .. } => Vec::new(),
                    },
                    cni_add_ms: match &sb.network {
                        Network::Pod(pod) => pod.add_timings.clone(),
                        Network::Host { .. } => Vec::new(),
                    },
                })
            })
    }

    /// What the pod's first container printed so far.
    pub fn log(&self, namespace: &str, name: &str) -> Option<String> {
        self.container_log(namespace, name, None, false)
    }

    /// A container's log (the first container when `container` is None): this
    /// instance's, or with `previous` the one before its last restart.
    pub fn container_log(
        &self,
        namespace: &str,
        name: &str,
        container: Option<&str>,
        previous: bool,
    ) -> Option<String> {
        let pods = self.pods.lock().ok()?;
        let entry = pods
            .values()
            .find(|e| e.namespace == namespace && e.name == name)?;
        let sandbox = entry.sandbox.lock().ok()?;
        let containers = &sandbox.as_ref()?.containers;
        let c = match container {
            Some(n) => containers.iter().find(|c| c.name == n)?,
            None => containers.first()?,
        };
        if previous {
            c.previous_log()
        } else {
            Some(c.log())
        }
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
        drop(self.server.take());
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
            // Processes and the namespace go (at once: the harness is stopping); the
            // node namespace takes the rest.
            drop(e.sandbox.lock().ok().and_then(|mut s| s.take()));
        }
    }
}

/// How the kubelet's endpoint finds a container's log, with kubelet's messages.
fn log_lookup(pods: Pods) -> Arc<LogLookup> {
    Arc::new(move |namespace, name, container, previous| {
        let pods = pods
            .lock()
            .map_err(|_| (500, "kubelet state lost".to_owned()))?;
        let entry = pods
            .values()
            .find(|e| e.namespace == namespace && e.name == name)
            .ok_or_else(|| (404, format!("pod \"{name}\" not found\n")))?;
        let sandbox = entry
            .sandbox
            .lock()
            .map_err(|_| (500, "kubelet state lost".to_owned()))?;
        let waiting = |reason: &str| {
            (
                400,
                format!(
                    "container \"{container}\" in pod \"{name}\" is waiting to start: {reason}\n"
                ),
            )
        };
        let sandbox = sandbox
            .as_ref()
            .ok_or_else(|| waiting("ContainerCreating"))?;
        let c = sandbox
            .containers
            .iter()
            .find(|c| c.name == container)
            .ok_or_else(|| {
                (
                    400,
                    format!("container {container} is not valid for pod {name}\n"),
                )
            })?;
        match c.log_file(previous) {
            Some(log) => Ok(log.clone()),
            None if previous => Err((
                400,
                format!(
                    "previous terminated container \"{container}\" in pod \"{name}\" not found\n"
                ),
            )),
            None => Err(waiting(
                c.status()["state"]["waiting"]["reason"]
                    .as_str()
                    .unwrap_or("ContainerCreating"),
            )),
        }
    })
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
                !pod["metadata"]["annotations"][crate::objects::MIRROR_ANNOTATION].is_null();
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
                let (api, node) = (api.clone(), node.clone());
                let handle = std::thread::spawn(move || teardown(&api, &node, entry));
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
                pod: pod.clone(),
                cancel: cancel.clone(),
                worker: None,
                sandbox: sandbox.clone(),
            };
            let (api, node) = (api.clone(), node.clone());
            let worker = std::thread::spawn(move || run_pod(&api, &node, &pod, &cancel, &sandbox));
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

/// Creates the sandbox, retrying with backoff, then runs its containers until the
/// pod is deleted.
fn run_pod(
    api: &Api,
    node: &NodeInfo,
    pod: &Value,
    cancel: &AtomicBool,
    slot: &Mutex<Option<Sandbox>>,
) {
    let pod = &with_api_access(api, pod);
    // ContainerCreating while the sandbox is made (a gated CNI ADD may wait long).
    let _ = api.merge_patch(&status_path(pod), &waiting_status(pod, node));
    let mut backoff = BACKOFF_START;
    while !cancel.load(Ordering::SeqCst) {
        match create_sandbox(api, node, pod, SANDBOX_SEQ.fetch_add(1, Ordering::Relaxed)) {
            Ok(sandbox) => {
                if let Ok(mut s) = slot.lock() {
                    *s = Some(sandbox);
                }
                supervise(api, node, pod, cancel, slot);
                return;
            }
            Err(e) => {
                let message = format!("{e:#}");
                let (reason, message) = if message.starts_with("MountVolume.SetUp failed") {
                    ("FailedMount", message)
                } else {
                    (
                        "FailedCreatePodSandBox",
                        format!("Failed to create pod sandbox: {message}"),
                    )
                };
                post_event(api, node, pod, true, reason, &message);
                let deadline = std::time::Instant::now() + backoff;
                while std::time::Instant::now() < deadline && !cancel.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(50));
                }
                backoff = (backoff * 2).min(BACKOFF_CAP);
            }
        }
    }
}

/// How often containers are checked (exits, due starts, due probes).
const SUPERVISE_TICK: Duration = Duration::from_millis(100);

/// Starts the containers, restarts them by the pod's policy, runs their probes and
/// writes the pod's status whenever it changes, until the pod is deleted.
fn supervise(
    api: &Api,
    node: &NodeInfo,
    pod: &Value,
    cancel: &AtomicBool,
    slot: &Mutex<Option<Sandbox>>,
) {
    let policy = RestartPolicy::of(pod);
    let grace = termination_grace(pod);
    let pod_ref = format!(
        "{}_{}({})",
        pod["metadata"]["name"].as_str().unwrap_or_default(),
        pod["metadata"]["namespace"].as_str().unwrap_or_default(),
        pod["metadata"]["uid"].as_str().unwrap_or_default()
    );
    let node_netns = PathBuf::from("/var/run/netns").join(&node.host_netns);
    let mut conditions = Conditions::default();
    let mut reported = Value::Null;
    while !cancel.load(Ordering::SeqCst) {
        let now = Instant::now();
        // (Warning?, reason, message): posted once the lock is released.
        let mut events: Vec<(bool, &str, String)> = Vec::new();
        // Exits and starts, then the probes that are due, without holding the lock
        // while a probe waits.
        let (due, pod_ip) = {
            let Ok(mut guard) = slot.lock() else { return };
            let Some(sandbox) = guard.as_mut() else {
                return;
            };
            for i in 0..sandbox.containers.len() {
                let c = &mut sandbox.containers[i];
                c.enforce_kill(now);
                if c.reap(policy, &pod_ref) && c.restart_count > 1 {
                    let message = format!("Back-off restarting failed container {}", c.name);
                    events.push((true, "BackOff", message));
                }
                if c.start_due(now) {
                    let cmd =
                        container_command(api, node, sandbox, pod, &sandbox.containers[i].spec);
                    let c = &mut sandbox.containers[i];
                    match c.start(cmd) {
                        Ok(()) => {
                            events.push((false, "Started", format!("Started container {}", c.name)))
                        }
                        Err(e) => events.push((true, "Failed", format!("Error: {e:#}"))),
                    }
                }
            }
            let due: Vec<(usize, bool, HttpGet, Duration)> = sandbox
                .containers
                .iter()
                .enumerate()
                .flat_map(|(i, c)| {
                    [(false, &c.readiness), (true, &c.liveness)]
                        .into_iter()
                        .filter_map(move |(liveness, p)| {
                            let p = p.as_ref().filter(|p| c.running() && p.due(now))?;
                            Some((i, liveness, p.get.clone(), p.timeout))
                        })
                })
                .collect();
            (due, sandbox.ips[0].clone())
        };
        let results: Vec<_> = due
            .into_iter()
            .map(|(i, liveness, get, timeout)| {
                (i, liveness, get.run(&node_netns, &pod_ip, timeout))
            })
            .collect();
        let status = {
            let Ok(mut guard) = slot.lock() else { return };
            let Some(sandbox) = guard.as_mut() else {
                return;
            };
            let now = Instant::now();
            for (i, liveness, result) in results {
                let c = &mut sandbox.containers[i];
                let probe = if liveness {
                    &mut c.liveness
                } else {
                    &mut c.readiness
                };
                let Some(probe) = probe.as_mut() else {
                    continue;
                };
                if probe.record(result, now) && probe.passing == Some(false) {
                    let kind = if liveness { "Liveness" } else { "Readiness" };
                    let why = probe.last_error.clone().unwrap_or_default();
                    events.push((true, "Unhealthy", format!("{kind} probe failed: {why}")));
                    if liveness {
                        let message = format!(
                            "Container {} failed liveness probe, will be restarted",
                            c.name
                        );
                        events.push((false, "Killing", message));
                        c.kill_for_liveness(grace);
                    }
                }
            }
            pod_status(node, sandbox, policy, &mut conditions)
        };
        for (warning, reason, message) in events {
            post_event(api, node, pod, warning, reason, &message);
        }
        if status != reported && api.merge_patch(&status_path(pod), &status).is_ok() {
            reported = status;
        }
        std::thread::sleep(SUPERVISE_TICK);
    }
}

/// An event about `pod` from this kubelet.
fn post_event(api: &Api, node: &NodeInfo, pod: &Value, warning: bool, reason: &str, message: &str) {
    let event = event(pod, ("kubelet", &node.name), warning, reason, message);
    let namespace = pod["metadata"]["namespace"].as_str().unwrap_or_default();
    let _ = api.post(&format!("/api/v1/namespaces/{namespace}/events"), &event);
}

/// `terminationGracePeriodSeconds` (default 30 s).
fn termination_grace(pod: &Value) -> Duration {
    Duration::from_secs(
        pod["spec"]["terminationGracePeriodSeconds"]
            .as_u64()
            .unwrap_or(30),
    )
}

/// A deleted pod: its worker stops, its containers get their `preStop` hooks and
/// SIGTERM, and whatever still runs after the grace period is killed.
fn teardown(api: &Api, node: &NodeInfo, mut entry: Entry) {
    let pod = &std::mem::take(&mut entry.pod);
    entry.cancel.store(true, Ordering::SeqCst);
    if let Some(w) = entry.worker.take() {
        let _ = w.join();
    }
    let Some(mut sandbox) = entry.sandbox.lock().ok().and_then(|mut s| s.take()) else {
        return;
    };
    let deadline = Instant::now() + termination_grace(pod);
    std::thread::scope(|scope| {
        for c in sandbox.containers.iter().filter(|c| c.running()) {
            let sandbox = &sandbox;
            scope.spawn(move || run_pre_stop(api, node, sandbox, pod, &c.spec, deadline));
        }
    });
    for c in &sandbox.containers {
        c.signal_stop();
    }
    for c in &mut sandbox.containers {
        c.finish_stop(deadline);
    }
    teardown_sandbox(sandbox);
}

/// A container's `lifecycle.preStop` (exec, httpGet or sleep), bounded by `deadline`.
fn run_pre_stop(
    api: &Api,
    node: &NodeInfo,
    sandbox: &Sandbox,
    pod: &Value,
    container: &Value,
    deadline: Instant,
) {
    let hook = &container["lifecycle"]["preStop"];
    let left = deadline.saturating_duration_since(Instant::now());
    if let Some(secs) = hook["sleep"]["seconds"].as_u64() {
        std::thread::sleep(Duration::from_secs(secs).min(left));
    } else if hook["exec"].is_object() {
        let mut spec = container.clone();
        spec["command"] = hook["exec"]["command"].clone();
        spec["args"] = Value::Null;
        let hook = container_command(api, node, sandbox, pod, &spec)
            .and_then(|cmd| ChildGuard::spawn_group(&format!("{}-prestop", node.tag), cmd));
        if let Ok(mut child) = hook {
            let _ = child.wait_timeout(left);
        }
    } else if hook["httpGet"].is_object() {
        if let Ok(get) = HttpGet::parse(&hook["httpGet"], container) {
            let netns = PathBuf::from("/var/run/netns").join(&node.host_netns);
            let _ = get.run(&netns, &sandbox.ips[0], left.max(Duration::from_millis(1)));
        }
    }
}
