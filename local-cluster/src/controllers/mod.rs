//! The workload controllers of the local cluster (kube-controller-manager's part of
//! them): DaemonSets and Deployments get their pods, their rolling updates and their
//! status; pods whose owner is gone are garbage-collected. One thread polls the API
//! and reconciles every workload each round, as the real controllers converge.

mod daemonset;
mod deployment;
mod rollout;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::Result;
use serde_json::{json, Value};

use crate::api::Api;

/// Marks a workload object that stands for processes the harness runs itself (its
/// hand-started mode): the controllers leave it alone.
pub const HARNESS_RUN_ANNOTATION: &str = "e2e.ambient-rs.dev/run-by-harness";

const POLL: Duration = Duration::from_millis(200);

/// The controller thread; stops when dropped.
pub struct Controllers {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Controllers {
    /// `api_ca`: the API server's certificate, published in every namespace.
    pub fn start(api: Api, api_ca: PathBuf) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                if let Err(e) = reconcile_all(&api, &api_ca) {
                    tracing::debug!("controllers: {e:#}");
                }
                std::thread::sleep(POLL);
            }
        });
        Controllers {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Controllers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What one round sees of the cluster.
pub struct World {
    pub nodes: Vec<Value>,
    pub pods: Vec<Value>,
}

fn reconcile_all(api: &Api, api_ca: &Path) -> Result<()> {
    let world = World {
        nodes: api.list("/api/v1/nodes")?,
        pods: api.list("/api/v1/pods")?,
    };
    let daemonsets = api.list("/apis/apps/v1/daemonsets")?;
    let deployments = api.list("/apis/apps/v1/deployments")?;
    let mut owners = HashSet::new();
    for ds in &daemonsets {
        owners.insert(uid(ds).to_owned());
        if !harness_run(ds) {
            daemonset::reconcile(api, &world, ds)?;
        }
    }
    for d in &deployments {
        owners.insert(uid(d).to_owned());
        if !harness_run(d) {
            deployment::reconcile(api, &world, d)?;
        }
    }
    collect_orphans(api, &world.pods, &owners)?;
    namespace_defaults(api, api_ca)
}

/// What every namespace gets from kube-controller-manager: the `default`
/// ServiceAccount, and the API server's CA as ConfigMap `kube-root-ca.crt`.
fn namespace_defaults(api: &Api, api_ca: &Path) -> Result<()> {
    let ca = std::fs::read_to_string(api_ca).unwrap_or_default();
    for ns in api.list("/api/v1/namespaces")? {
        let ns = name(&ns);
        let path = format!("/api/v1/namespaces/{ns}/serviceaccounts");
        if api.get_opt(&format!("{path}/default"))?.is_none() {
            api.create_if_absent(&path, &crate::objects::service_account(ns, "default"))?;
        }
        let path = format!("/api/v1/namespaces/{ns}/configmaps");
        if !ca.is_empty() && api.get_opt(&format!("{path}/kube-root-ca.crt"))?.is_none() {
            let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "kube-root-ca.crt", "namespace": ns},
                "data": {"ca.crt": ca}});
            api.create_if_absent(&path, &cm)?;
        }
    }
    Ok(())
}

/// Deletes pods a DaemonSet or Deployment of ours owned that no longer exists
/// (the garbage collector's background cascading deletion).
fn collect_orphans(api: &Api, pods: &[Value], owners: &HashSet<String>) -> Result<()> {
    for pod in pods {
        let orphaned = pod["metadata"]["ownerReferences"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|o| {
                matches!(o["kind"].as_str(), Some("DaemonSet" | "Deployment"))
                    && o["controller"] == true
                    && !owners.contains(o["uid"].as_str().unwrap_or_default())
            });
        if orphaned {
            remove_pod(api, pod)?;
        }
    }
    Ok(())
}

fn harness_run(workload: &Value) -> bool {
    !workload["metadata"]["annotations"][HARNESS_RUN_ANNOTATION].is_null()
}

pub fn uid(object: &Value) -> &str {
    object["metadata"]["uid"].as_str().unwrap_or_default()
}

fn name(object: &Value) -> &str {
    object["metadata"]["name"].as_str().unwrap_or_default()
}

fn namespace(object: &Value) -> &str {
    object["metadata"]["namespace"]
        .as_str()
        .unwrap_or("default")
}

/// The pods `workload` controls (by its uid in their ownerReferences).
fn owned<'a>(world: &'a World, workload: &Value) -> Vec<&'a Value> {
    let owner = uid(workload);
    world
        .pods
        .iter()
        .filter(|p| {
            p["metadata"]["ownerReferences"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|o| o["uid"] == owner && o["controller"] == true)
        })
        .collect()
}

/// A short hash of the pod template (the controllers' `controller-revision-hash` /
/// `pod-template-hash`): it changes exactly when the template does.
fn template_hash(workload: &Value) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(workload["spec"]["template"].to_string().as_bytes());
    // Kubernetes' alphabet for generated names: no vowels, no look-alikes.
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    digest
        .iter()
        .take(10)
        .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
        .collect()
}

/// A new pod of `workload` from its template: owned by it, labelled with its
/// `hash_label`, and bound to `node` when given (the scheduler's part).
fn new_pod(
    workload: &Value,
    hash_label: &str,
    hash: &str,
    name: String,
    node: Option<&str>,
) -> Value {
    let template = &workload["spec"]["template"];
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": template["metadata"].clone(),
        "spec": template["spec"].clone(),
    });
    let meta = &mut pod["metadata"];
    if !meta.is_object() {
        *meta = json!({});
    }
    meta["name"] = json!(name);
    meta["namespace"] = json!(namespace(workload));
    meta["labels"][hash_label] = json!(hash);
    meta["ownerReferences"] = json!([{
        "apiVersion": "apps/v1",
        "kind": workload["kind"],
        "name": self::name(workload),
        "uid": uid(workload),
        "controller": true,
        "blockOwnerDeletion": true,
    }]);
    if let Some(node) = node {
        pod["spec"]["nodeName"] = json!(node);
    }
    pod
}

/// A generated name suffix (`generateName`), 5 characters as the API server's.
fn name_suffix() -> String {
    use rand::Rng;
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    (0..5)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

/// Creates a pod of `workload`, with the controller's `SuccessfulCreate` event.
fn create_pod(api: &Api, workload: &Value, pod: &Value) -> Result<()> {
    let ns = namespace(pod);
    api.post(&format!("/api/v1/namespaces/{ns}/pods"), pod)?;
    record(
        api,
        workload,
        "SuccessfulCreate",
        &format!("Created pod: {}", name(pod)),
    );
    Ok(())
}

/// Deletes a pod of `workload`, with the controller's `SuccessfulDelete` event.
fn delete_pod(api: &Api, workload: &Value, pod: &Value) -> Result<()> {
    remove_pod(api, pod)?;
    record(
        api,
        workload,
        "SuccessfulDelete",
        &format!("Deleted pod: {}", name(pod)),
    );
    Ok(())
}

fn remove_pod(api: &Api, pod: &Value) -> Result<()> {
    api.delete(&format!(
        "/api/v1/namespaces/{}/pods/{}",
        namespace(pod),
        name(pod)
    ))
}

/// A Normal event about `workload` from its controller.
fn record(api: &Api, workload: &Value, reason: &str, message: &str) {
    let controller = match workload["kind"].as_str() {
        Some("DaemonSet") => "daemonset-controller",
        _ => "deployment-controller",
    };
    let event = crate::objects::event(workload, (controller, ""), false, reason, message);
    let path = format!("/api/v1/namespaces/{}/events", namespace(workload));
    let _ = api.post(&path, &event);
}

/// Writes `status` to the workload's status subresource when it differs.
fn write_status(api: &Api, workload: &Value, plural: &str, status: Value) -> Result<()> {
    if workload["status"] == status {
        return Ok(());
    }
    api.merge_patch(
        &format!(
            "/apis/apps/v1/namespaces/{}/{plural}/{}/status",
            namespace(workload),
            name(workload)
        ),
        &json!({ "status": status }),
    )?;
    Ok(())
}

/// Whether `pod` can run on `node`: its nodeSelector matches the node's labels and
/// it tolerates the node's NoSchedule/NoExecute taints.
fn fits(pod_spec: &Value, node: &Value) -> bool {
    let labels = &node["metadata"]["labels"];
    let selected = pod_spec["nodeSelector"]
        .as_object()
        .into_iter()
        .flatten()
        .all(|(k, v)| labels[k] == *v);
    let tolerations = pod_spec["tolerations"].as_array();
    let tolerated = node["spec"]["taints"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| matches!(t["effect"].as_str(), Some("NoSchedule" | "NoExecute")))
        .all(|taint| {
            tolerations
                .into_iter()
                .flatten()
                .any(|t| tolerates(t, taint))
        });
    selected && tolerated
}

fn tolerates(toleration: &Value, taint: &Value) -> bool {
    let effect_ok = toleration["effect"]
        .as_str()
        .is_none_or(|e| e.is_empty() || e == taint["effect"]);
    let key_ok = match toleration["key"].as_str() {
        None | Some("") => toleration["operator"] == "Exists",
        Some(k) => k == taint["key"],
    };
    let value_ok = match toleration["operator"].as_str() {
        Some("Exists") => true,
        _ => {
            toleration["value"].as_str().unwrap_or_default()
                == taint["value"].as_str().unwrap_or_default()
        }
    };
    effect_ok && key_ok && value_ok
}

/// The pod's Ready condition holds.
pub fn ready(pod: &Value) -> bool {
    pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// Ready, and for `min_ready_secs`: available, as the controllers count it.
fn available(pod: &Value, min_ready_secs: u64) -> bool {
    if !ready(pod) {
        return false;
    }
    if min_ready_secs == 0 {
        return true;
    }
    let since = pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Ready")
        .and_then(|c| c["lastTransitionTime"].as_str())
        .and_then(|t| {
            time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok()
        });
    since.is_some_and(|t| {
        (time::OffsetDateTime::now_utc() - t).whole_seconds() >= min_ready_secs as i64
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_selection_and_taints() {
        let node = json!({"metadata": {"labels": {"kubernetes.io/os": "linux", "tier": "a"}},
            "spec": {"taints": [{"key": "dedicated", "value": "x", "effect": "NoSchedule"},
                                {"key": "soft", "effect": "PreferNoSchedule"}]}});
        let spec = |s: Value| s;
        assert!(!fits(&spec(json!({})), &node), "the taint is not tolerated");
        assert!(fits(
            &spec(json!({"tolerations": [{"operator": "Exists"}]})),
            &node
        ));
        assert!(fits(
            &spec(
                json!({"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "x"}]})
            ),
            &node
        ));
        assert!(!fits(
            &spec(json!({"tolerations": [{"key": "dedicated", "value": "y"}]})),
            &node
        ));
        assert!(fits(
            &spec(
                json!({"tolerations": [{"effect": "NoSchedule", "operator": "Exists"}],
            "nodeSelector": {"tier": "a"}})
            ),
            &node
        ));
        assert!(!fits(
            &spec(json!({"tolerations": [{"operator": "Exists"}],
            "nodeSelector": {"tier": "b"}})),
            &node
        ));
    }

    #[test]
    fn template_hash_follows_the_template_only() {
        let a = json!({"spec": {"replicas": 1, "template": {"spec": {"containers": [{"image": "x:1"}]}}}});
        let mut b = a.clone();
        b["spec"]["replicas"] = json!(3);
        assert_eq!(template_hash(&a), template_hash(&b));
        b["spec"]["template"]["spec"]["containers"][0]["image"] = json!("x:2");
        assert_ne!(template_hash(&a), template_hash(&b));
    }
}
