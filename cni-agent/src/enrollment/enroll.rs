//! Enrolling and un-enrolling one pod, in Istio's order: netns, in-pod rules, probe
//! SNAT, ZDS add (acked), then the `ambient.istio.io/redirection` annotation. Every step
//! is idempotent, so a retry (work queue, kubelet retrying the sandbox) converges.
//!
//! A pod's netns is opened once, when it is enrolled, and held as that open file (as
//! Istio does, compared by inode) for everything after: ZDS replay, rule repair and
//! removal. A path is never reopened: `/proc/<pid>/ns/net` names another pod's netns
//! once the pid is reused.

use crate::enrollment::discover::ProcIndex;
use crate::enrollment::eligibility::Selection;
use crate::enrollment::kube::KubeCache;
use crate::enrollment::podlock::{PodLockGuard, PodLocks};
use crate::enrollment::queue::WorkQueue;
use crate::ops::metrics::Metrics;
use crate::zds::{EnrolledPod, ZdsError, ZdsServer};
use ::kube::api::{Api, Patch, PatchParams, PostParams};
use k8s_openapi::api::core::v1::{Event, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use mesh_runtime::netns::NetnsHandle;
use redirection::{InpodRules, ProbeSnat, Redirector};
use serde_json::json;
use shared_types::constants::{
    BYPASS_INBOUND_CAPTURE_ANNOTATION, DNS_CAPTURE_ANNOTATION, REDIRECTION_ANNOTATION,
    REDIRECTION_ENABLED, REDIRECTION_PENDING,
};
use shared_types::zds::WorkloadInfo;
use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Reason of the Kubernetes Event emitted when enrollment fails.
pub const FAILURE_EVENT_REASON: &str = "AmbientEnrollmentFailed";
/// How long one `/proc` scan serves further lookups (see [`ProcIndex`]).
const PROC_SCAN_REUSE: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum EnrollError {
    #[error("the pod's network namespace was not found: {0}")]
    Netns(String),
    /// The CNI ADD does not match the cluster (wrong node, UID, netns or IPs).
    #[error("{0}")]
    Refused(String),
    #[error("programming the pod's redirection failed: {0}")]
    Redirect(String),
    #[error("adding the pod to the probe SNAT set failed: {0}")]
    Probe(String),
    #[error("{0}; check `kubectl -n istio-system get pods -l app=ztunnel`")]
    Zds(#[from] ZdsError),
    #[error("Kubernetes API: {0}")]
    Kube(String),
}

impl EnrollError {
    /// Short label for `istio_cni_enrollment_failures_total{reason}`.
    pub fn reason(&self) -> &'static str {
        match self {
            EnrollError::Netns(_) => "netns_not_found",
            EnrollError::Refused(_) => "cni_add_refused",
            EnrollError::Redirect(_) => "redirect_failed",
            EnrollError::Probe(_) => "probe_snat_failed",
            EnrollError::Zds(ZdsError::NotConnected(_)) => "ztunnel_not_connected",
            EnrollError::Zds(ZdsError::Nack(_)) => "ztunnel_nack",
            EnrollError::Zds(_) => "ztunnel_error",
            EnrollError::Kube(_) => "kube_api",
        }
    }
}

/// What enrolling one pod depends on: which pods are ambient, where their
/// namespaces are, and the in-pod options every pod gets.
#[derive(Debug, Clone)]
pub struct PodEnrollmentConfig {
    pub selection: Selection,
    /// The host's `/proc` as mounted here (discovery, and `/proc/...` netns paths).
    pub host_proc: PathBuf,
    /// `CNI_NETNS_DIR`: where the runtime bind-mounts pod netns files, mounted at the
    /// same path here. A CNI event's netns must be a file in it or `/proc/<pid>/ns/net`.
    pub netns_dir: PathBuf,
    pub dns_capture: bool,
    pub ipv6: bool,
    /// How long a CNI ADD may wait for enrollment.
    pub cni_event_timeout: Duration,
}

/// What the engine remembers of an enrolled pod.
#[derive(Debug, Clone)]
pub struct Enrolled {
    pub uid: String,
    /// Opened at enrollment and held until un-enrollment.
    pub netns: Arc<NetnsHandle>,
    pub ips: Vec<IpAddr>,
    pub rules: InpodRules,
}

/// The enrollment engine. Cheap to clone.
#[derive(Clone)]
pub struct Enroller {
    pub config: Arc<PodEnrollmentConfig>,
    pub kube: KubeCache,
    pub zds: ZdsServer,
    pub redirector: Redirector,
    pub probe: Option<ProbeSnat>,
    pub metrics: Metrics,
    pub queue: WorkQueue,
    enrolled: Arc<Mutex<HashMap<String, Enrolled>>>,
    locks: PodLocks,
    /// One `/proc` scan per burst of enrollments of running pods.
    proc_index: Arc<ProcIndex>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Enroller {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        config: PodEnrollmentConfig,
        kube: KubeCache,
        zds: ZdsServer,
        redirector: Redirector,
        probe: Option<ProbeSnat>,
        metrics: Metrics,
        queue: WorkQueue,
    ) -> Self {
        let proc_index = Arc::new(ProcIndex::new(&config.host_proc, PROC_SCAN_REUSE));
        Enroller {
            config: Arc::new(config),
            kube,
            zds,
            redirector,
            probe,
            metrics,
            queue,
            enrolled: Arc::default(),
            locks: PodLocks::new(),
            proc_index,
        }
    }

    /// Serializes work on one pod (CNI path and queue).
    pub async fn pod_lock(&self, key: &str) -> PodLockGuard {
        self.locks.lock(key).await
    }

    /// Pod keys with a held or awaited lock (the map is pruned as locks are released).
    pub fn pod_locks_len(&self) -> usize {
        self.locks.len()
    }

    pub fn enrolled(&self, key: &str) -> Option<Enrolled> {
        lock(&self.enrolled).get(key).cloned()
    }

    fn set_enrolled(&self, key: &str, pod: Option<Enrolled>) {
        let mut map = lock(&self.enrolled);
        match pod {
            Some(p) => map.insert(key.to_string(), p),
            None => map.remove(key),
        };
        self.metrics.pods_enrolled.set(map.len() as i64);
    }

    /// The rules for this pod: IPv6 only when enabled and the pod has an IPv6 address;
    /// annotations override the DNS flag and turn inbound capture off.
    pub fn rules_for(&self, pod: &Pod, ips: &[IpAddr]) -> InpodRules {
        let dns = match mesh_kube::pod::annotation(pod, DNS_CAPTURE_ANNOTATION) {
            Some(v) => v == "true",
            None => self.config.dns_capture,
        };
        InpodRules {
            ipv6: self.config.ipv6 && ips.iter().any(|ip| ip.is_ipv6()),
            dns_capture: dns,
            inbound_capture: mesh_kube::pod::annotation(pod, BYPASS_INBOUND_CAPTURE_ANNOTATION)
                != Some("true"),
            ..InpodRules::default()
        }
    }

    /// Where this process opens the netns a CNI event names: see
    /// [`event_netns_path`].
    pub fn event_netns_path(&self, raw: &str) -> Result<PathBuf, EnrollError> {
        event_netns_path(raw, &self.config.netns_dir, &self.config.host_proc)
            .map_err(EnrollError::Refused)
    }

    /// Opens the netns a CNI event names (see [`Enroller::event_netns_path`]).
    pub fn open_event_netns(&self, raw: &str) -> Result<Arc<NetnsHandle>, EnrollError> {
        let path = self.event_netns_path(raw)?;
        NetnsHandle::open(&path)
            .map(Arc::new)
            .map_err(|e| EnrollError::Netns(e.to_string()))
    }

    /// Finds a running pod's netns through a `/proc` scan (no CNI event).
    pub async fn find_netns(&self, uid: &str, ips: &[IpAddr]) -> Result<NetnsHandle, EnrollError> {
        let (index, uid, ips) = (self.proc_index.clone(), uid.to_string(), ips.to_vec());
        let found = tokio::task::spawn_blocking(move || index.find(&uid, &ips))
            .await
            .map_err(|e| EnrollError::Netns(e.to_string()))?
            .map_err(|e| EnrollError::Netns(e.to_string()))?;
        found
            .map(|f| f.netns)
            .ok_or_else(|| EnrollError::Netns("no process of the pod is running".into()))
    }

    /// Enrolls `pod` (caller holds the pod lock) in `netns`, the one a CNI event named
    /// (already checked), or else the one a `/proc` scan finds. On a ztunnel failure
    /// the pod is annotated `pending`; the caller reports the failure once it gives up
    /// ([`Enroller::report_failure`]), so retries do not flood the pod's events.
    pub async fn enroll(
        &self,
        pod: &Pod,
        netns: Option<&Arc<NetnsHandle>>,
        ips: &[IpAddr],
    ) -> Result<(), EnrollError> {
        let key = mesh_kube::pod::key(pod);
        let started = Instant::now();
        let result = self.enroll_steps(pod, &key, netns, ips).await;
        match &result {
            Ok(took) => {
                self.metrics.record(Ok(started.elapsed()));
                tracing::info!(
                    pod = %key,
                    total_us = started.elapsed().as_micros() as u64,
                    netns_us = took.netns.as_micros() as u64,
                    rules_us = took.rules.as_micros() as u64,
                    probe_us = took.probe.as_micros() as u64,
                    zds_us = took.zds.as_micros() as u64,
                    annotate_us = took.annotate.as_micros() as u64,
                    "pod enrolled in ambient"
                );
            }
            Err(e) => {
                self.metrics.record(Err(e.reason()));
                tracing::warn!(pod = %key, "enrollment failed: {e}");
                if matches!(e, EnrollError::Zds(_)) {
                    let _ = self.annotate(pod, Some(REDIRECTION_PENDING)).await;
                }
            }
        }
        result.map(drop)
    }

    async fn enroll_steps(
        &self,
        pod: &Pod,
        key: &str,
        netns: Option<&Arc<NetnsHandle>>,
        ips: &[IpAddr],
    ) -> Result<StepTimes, EnrollError> {
        let mut took = StepTimes::default();
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let step = Instant::now();
        // A netns a CNI ADD names was just created: no need to read it before writing.
        let (netns, fresh) = match netns {
            Some(netns) => (netns.clone(), true),
            None => (Arc::new(self.find_netns(&uid, ips).await?), false),
        };
        took.netns = step.elapsed();
        let rules = self.rules_for(pod, ips);
        let step = Instant::now();
        let enabled = if fresh {
            self.redirector.enable_fresh(&netns, &rules).await
        } else {
            self.redirector.enable(&netns, &rules).await
        };
        enabled.map_err(|e| EnrollError::Redirect(e.to_string()))?;
        took.rules = step.elapsed();
        let info = workload_info(pod);
        // The probe set entry and the hand-off to ztunnel are independent (both only
        // need the rules in place): do them at once, it is on the pod's start-up path.
        // Both are idempotent if a retry follows a failure.
        let probe = timed(async {
            let Some(probe) = self.probe else {
                return Ok(());
            };
            let (ips, uid) = (ips.to_vec(), uid.clone());
            tokio::task::spawn_blocking(move || {
                ips.iter()
                    .try_for_each(|ip| probe.add_pod(*ip, &uid).map(|_| ()))
            })
            .await
            .map_err(|e| EnrollError::Probe(e.to_string()))?
            .map_err(|e| EnrollError::Probe(e.to_string()))
        });
        let handoff = timed(self.zds.add(&uid, info, &netns));
        let ((probed, probe_took), (handed, zds_took)) = tokio::join!(probe, handoff);
        (took.probe, took.zds) = (probe_took, zds_took);
        probed?;
        handed?;
        self.set_enrolled(
            key,
            Some(Enrolled {
                uid,
                netns,
                ips: ips.to_vec(),
                rules,
            }),
        );
        let step = Instant::now();
        self.annotate(pod, Some(REDIRECTION_ENABLED)).await?;
        took.annotate = step.elapsed();
        Ok(took)
    }

    /// Reverses [`Enroller::enroll`]; each step is tried even if one before failed.
    /// `pod` is the pod as it still exists (opted out, or terminating); `None` when it
    /// is gone (deleted, or replaced by a new pod of the same name): then its netns,
    /// with the rules in it, goes away with its sandbox and is not entered.
    pub async fn unenroll(&self, key: &str, pod: Option<&Pod>, known: &Enrolled) {
        if let Err(e) = self.zds.del(&known.uid).await {
            tracing::info!(pod = %key, "ZDS del: {e}");
        }
        // Through the fd held since enrollment: the pod's own netns, whatever runs at
        // the pid its path once named.
        if pod.is_some() {
            if let Err(e) = self.redirector.disable(&known.netns, &known.rules).await {
                tracing::warn!(pod = %key, "removing the pod's rules failed: {e}");
            }
        } else {
            tracing::info!(
                pod = %key,
                netns_inode = known.netns.inode(),
                "the pod is gone: its network namespace and the redirection rules in it \
                 go with its sandbox; releasing our handle"
            );
        }
        if let Some(probe) = self.probe {
            let uid = known.uid.clone();
            let removed = tokio::task::spawn_blocking(move || probe.remove_pod_uid(&uid)).await;
            if let Ok(Err(e)) = removed {
                tracing::warn!(pod = %key, "removing the pod from the probe set failed: {e}");
            }
        }
        self.set_enrolled(key, None);
        if let Some(pod) = pod {
            if let Err(e) = self.annotate(pod, None).await {
                tracing::info!(pod = %key, "removing the annotation: {e}");
            }
        }
        tracing::info!(pod = %key, "pod removed from ambient");
    }

    /// Sets (or with `None` removes) the redirection annotation through `pods/status`,
    /// which our RBAC grants without write access to pod specs.
    pub async fn annotate(&self, pod: &Pod, value: Option<&str>) -> Result<(), EnrollError> {
        let (Some(ns), Some(name)) = (&pod.metadata.namespace, &pod.metadata.name) else {
            return Ok(());
        };
        let api: Api<Pod> = Api::namespaced(self.kube.client.clone(), ns);
        let patch = json!({"metadata": {"annotations": {REDIRECTION_ANNOTATION: value}}});
        match api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(()),
            Err(::kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(EnrollError::Kube(e.to_string())),
        }
    }

    /// Records a Warning Event on the pod saying what is missing.
    pub async fn report_failure(&self, pod: &Pod, error: &EnrollError) {
        let message = format!("ambient enrollment failed: {error}");
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let event = Event {
            metadata: ObjectMeta {
                generate_name: Some(format!(
                    "{}.",
                    pod.metadata.name.as_deref().unwrap_or("pod")
                )),
                namespace: Some(ns.clone()),
                ..Default::default()
            },
            involved_object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: pod.metadata.name.clone(),
                namespace: Some(ns.clone()),
                uid: pod.metadata.uid.clone(),
                ..Default::default()
            },
            reason: Some(FAILURE_EVENT_REASON.into()),
            message: Some(message),
            type_: Some("Warning".into()),
            count: Some(1),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now),
            reporting_component: Some("istio-cni-node".into()),
            reporting_instance: Some(self.kube.node.clone()),
            source: Some(k8s_openapi::api::core::v1::EventSource {
                component: Some("istio-cni-node".into()),
                host: Some(self.kube.node.clone()),
            }),
            ..Default::default()
        };
        let api: Api<Event> = Api::namespaced(self.kube.client.clone(), &ns);
        if let Err(e) = api.create(&PostParams::default(), &event).await {
            tracing::debug!("emitting the failure event failed: {e}");
        }
    }

    /// An enrolled pod whose annotations now ask for other rules (DNS capture, inbound
    /// bypass) gets them in place, in one transaction, without leaving the mesh.
    async fn update_rules(
        &self,
        key: &str,
        pod: &Pod,
        enrolled: Enrolled,
    ) -> Result<(), EnrollError> {
        let rules = self.rules_for(pod, &enrolled.ips);
        if rules == enrolled.rules {
            return Ok(());
        }
        self.redirector
            .enable(&enrolled.netns, &rules)
            .await
            .map_err(|e| EnrollError::Redirect(e.to_string()))?;
        tracing::info!(
            pod = %key,
            dns_capture = rules.dns_capture,
            inbound_capture = rules.inbound_capture,
            "in-pod rules changed with the pod's annotations"
        );
        self.set_enrolled(key, Some(Enrolled { rules, ..enrolled }));
        Ok(())
    }

    /// The queue's handler: converge `key` to what the cluster says.
    pub async fn reconcile(&self, key: &str) -> Result<(), EnrollError> {
        let _guard = self.pod_lock(key).await;
        let pod = self
            .kube
            .pod(key)
            .await
            .map_err(|e| EnrollError::Kube(e.to_string()))?;
        let known = self.enrolled(key);
        let live = pod.as_ref().filter(|p| {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            p.metadata.deletion_timestamp.is_none()
                && !matches!(phase, Some("Succeeded") | Some("Failed"))
        });
        let Some(pod) = live else {
            if let Some(known) = known {
                self.unenroll(key, pod.as_deref(), &known).await;
            }
            self.queue.forget(key);
            return Ok(());
        };
        let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        let namespace = self.kube.namespace(ns);
        let ambient = self.config.selection.decide(pod, namespace.as_deref());
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        match (ambient.is_ambient(), known) {
            (true, Some(k)) if k.uid == uid => self.update_rules(key, pod, k).await,
            (true, stale) => {
                if let Some(stale) = stale {
                    self.unenroll(key, None, &stale).await;
                }
                let ips = mesh_kube::pod::ips(pod);
                if ips.is_empty() {
                    // Not networked yet: the CNI ADD will enroll it.
                    return Ok(());
                }
                let result = self.enroll(pod, None, &ips).await;
                if let Err(e) = &result {
                    self.report_failure(pod, e).await;
                }
                result
            }
            (false, Some(k)) => {
                self.unenroll(key, Some(pod), &k).await;
                Ok(())
            }
            (false, None) => Ok(()),
        }
    }

    /// Startup: takes back this node's pods annotated `enabled` (rules verified and
    /// repaired in one transaction when `repair`), registered for the first ztunnel's
    /// snapshot. Returns how many were restored.
    pub async fn restore(&self, repair: bool) -> usize {
        let mut restored = 0;
        for pod in self.kube.pods() {
            if !mesh_kube::pod::is_redirected(&pod) {
                continue;
            }
            let key = mesh_kube::pod::key(&pod);
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            let ips = mesh_kube::pod::ips(&pod);
            let netns = match self.find_netns(&uid, &ips).await {
                Ok(netns) => Arc::new(netns),
                Err(e) => {
                    tracing::warn!(
                        pod = %key,
                        "cannot restore: {e}; if the pod's network namespace is gone, its \
                         redirection rules went with it (it is enrolled again once it runs)"
                    );
                    continue;
                }
            };
            let rules = self.rules_for(&pod, &ips);
            match self.redirector.restore(&netns, &rules, repair).await {
                Ok(true) => tracing::info!(pod = %key, "rules repaired or converted"),
                Ok(false) => {}
                Err(e) => tracing::warn!(pod = %key, "restoring rules failed: {e}"),
            }
            let info = workload_info(&pod);
            self.zds.register(
                &uid,
                EnrolledPod {
                    info,
                    netns: Some(netns.clone()),
                },
            );
            self.set_enrolled(
                &key,
                Some(Enrolled {
                    uid,
                    netns,
                    ips,
                    rules,
                }),
            );
            restored += 1;
        }
        restored
    }
}

/// How long each step of one enrollment took; logged with it (`make bench` reads them).
#[derive(Debug, Default)]
struct StepTimes {
    /// Opening the event's netns was done by the caller; this is the `/proc` scan.
    netns: Duration,
    rules: Duration,
    probe: Duration,
    zds: Duration,
    annotate: Duration,
}

/// Runs `f`, returning its output and how long it took.
async fn timed<T>(f: impl std::future::Future<Output = T>) -> (T, Duration) {
    let started = Instant::now();
    let out = f.await;
    (out, started.elapsed())
}

/// Where this process opens the netns a CNI event names: a file of `netns_dir`
/// (`CNI_NETNS_DIR`, the runtime's bind mounts, mounted at the same path here), or
/// `/proc/<pid>/ns/net`, which means the HOST's proc (`host_proc`, `HOST_PROC_DIR`).
/// Any other path is refused, with the reason: the agent opens only pod netns files,
/// wherever an event points. (Istio opens any path under its host mount.)
pub fn event_netns_path(raw: &str, netns_dir: &Path, host_proc: &Path) -> Result<PathBuf, String> {
    let refuse = |why: &str| {
        format!(
            "netns path {raw:?} {why}; accepted: a file in CNI_NETNS_DIR ({}) or /proc/<pid>/ns/net",
            netns_dir.display()
        )
    };
    let path = Path::new(raw);
    let mut parts = Vec::new();
    for (i, c) in path.components().enumerate() {
        match c {
            Component::RootDir if i == 0 => {}
            Component::Normal(part) if i > 0 => parts.push(part),
            _ => return Err(refuse("is not an absolute path without . or ..")),
        }
    }
    if let [proc, pid, ns, net] = parts.as_slice() {
        let pid = pid.to_str().and_then(|p| p.parse::<u32>().ok());
        if let (true, Some(pid)) = (*proc == "proc" && *ns == "ns" && *net == "net", pid) {
            return Ok(host_proc.join(pid.to_string()).join("ns/net"));
        }
    }
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(refuse("names no file"));
    };
    // `/run/netns` and `/var/run/netns` are one dir on most hosts.
    let same_dir = dir == netns_dir
        || matches!(
            (std::fs::canonicalize(dir), std::fs::canonicalize(netns_dir)),
            (Ok(a), Ok(b)) if a == b
        );
    if same_dir {
        Ok(netns_dir.join(name))
    } else {
        Err(refuse("is outside CNI_NETNS_DIR"))
    }
}

/// What ztunnel is told about a pod over ZDS (its identity is `ns/sa`).
fn workload_info(pod: &Pod) -> WorkloadInfo {
    WorkloadInfo {
        name: pod.metadata.name.clone().unwrap_or_default(),
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        service_account: mesh_kube::pod::service_account(pod).to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_netns_paths_resolve_only_in_the_netns_dir_or_proc() {
        let (dir, proc) = (Path::new("/var/run/netns"), Path::new("/host/proc"));
        let ok = |raw: &str| event_netns_path(raw, dir, proc).unwrap();
        assert_eq!(
            ok("/var/run/netns/cni-1"),
            Path::new("/var/run/netns/cni-1")
        );
        assert_eq!(ok("/proc/42/ns/net"), Path::new("/host/proc/42/ns/net"));
        let err = |raw: &str| event_netns_path(raw, dir, proc).unwrap_err();
        assert!(err("/tmp/cni-1").contains("outside CNI_NETNS_DIR"));
        assert!(err("/var/run/netns/a/b").contains("outside CNI_NETNS_DIR"));
        assert!(err("/var/run/netns/../netns/x").contains("without . or .."));
        assert!(err("var/run/netns/x").contains("without . or .."));
        assert!(err("/proc/self/ns/net").contains("outside CNI_NETNS_DIR"));
        assert!(err("/proc/42/ns/mnt").contains("outside CNI_NETNS_DIR"));
        assert!(err("/").contains("names no file"));
        // The same dir through a symlink (`/var/run` -> `/run`) is the same dir.
        let tmp = tempfile::tempdir().unwrap();
        let real = tmp.path().join("netns");
        std::fs::create_dir(&real).unwrap();
        std::os::unix::fs::symlink(tmp.path(), tmp.path().join("run")).unwrap();
        let via_link = tmp.path().join("run/netns/cni-2");
        assert_eq!(
            event_netns_path(via_link.to_str().unwrap(), &real, proc).unwrap(),
            real.join("cni-2")
        );
    }
}
