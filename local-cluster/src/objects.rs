//! Kubernetes objects the harness writes: pods, namespaces, nodes, the mesh's
//! DaemonSets, events; and timestamps in the API's format.

use serde_json::{json, Value};

/// A pod bound to `node` running `argv` (the first word may name a workspace binary,
/// e.g. `e2e-app`), with service account `sa` and `labels`.
pub fn pod(
    namespace: &str,
    name: &str,
    node: &str,
    sa: &str,
    labels: &[(&str, &str)],
    argv: &[&str],
) -> Value {
    let labels: serde_json::Map<String, Value> = labels
        .iter()
        .map(|(k, v)| ((*k).into(), json!(v)))
        .collect();
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "nodeName": node,
            "serviceAccountName": sa,
            "containers": [{
                "name": "app",
                "image": "e2e-app:local",
                "command": argv.first().map(|c| vec![*c]).unwrap_or_default(),
                "args": argv.iter().skip(1).collect::<Vec<_>>(),
            }],
        }
    })
}

/// The API object of a pod the harness runs itself on `node` (kubelet's static
/// pods have such mirrors): the kubelet stand-in does not run it again.
pub fn mirror_pod(
    namespace: &str,
    name: &str,
    node: &str,
    sa: &str,
    labels: &[(&str, &str)],
) -> Value {
    let mut pod = pod(namespace, name, node, sa, labels, &[]);
    pod["metadata"]["annotations"] = json!({ MIRROR_ANNOTATION: "harness" });
    pod["status"] = json!({"phase": "Running"});
    pod
}

/// kubelet's mark on the API object of a static pod.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

pub fn service_account(namespace: &str, name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": namespace}})
}

pub fn namespace(name: &str, labels: &[(&str, &str)]) -> Value {
    let labels: serde_json::Map<String, Value> = labels
        .iter()
        .map(|(k, v)| ((*k).into(), json!(v)))
        .collect();
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
}

/// A ClusterIP Service selecting `selector`, port `port` -> `target_port`.
pub fn service(
    namespace: &str,
    name: &str,
    selector: &[(&str, &str)],
    port: u16,
    target_port: u16,
) -> Value {
    let selector: serde_json::Map<String, Value> = selector
        .iter()
        .map(|(k, v)| ((*k).into(), json!(v)))
        .collect();
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"selector": selector, "ports": [{"name": "tcp", "port": port, "targetPort": target_port, "protocol": "TCP"}]}
    })
}

/// A Ready Node with one cluster-network InternalIP and one pod CIDR per family
/// (primary first).
pub fn node(name: &str, ips: &[String], pod_cidrs: &[String]) -> Value {
    let now = now_rfc3339();
    let mut addresses: Vec<Value> = ips
        .iter()
        .map(|ip| json!({"type": "InternalIP", "address": ip}))
        .collect();
    addresses.push(json!({"type": "Hostname", "address": name}));
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}},
        "spec": {"podCIDR": pod_cidrs.first(), "podCIDRs": pod_cidrs},
        "status": {
            "addresses": addresses,
            "daemonEndpoints": {"kubeletEndpoint": {"Port": crate::kubelet::server::KUBELET_PORT}},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "lastHeartbeatTime": now, "lastTransitionTime": now}],
            "nodeInfo": {"kubeletVersion": "v1.33.0-e2e", "containerRuntimeVersion": "e2e://netns",
                         "operatingSystem": "linux", "architecture": std::env::consts::ARCH},
        }
    })
}

/// A DaemonSet object standing for one of the mesh's node components that the
/// harness runs itself (so the controllers leave it alone).
pub fn daemonset(namespace: &str, name: &str, app: &str, nodes: usize) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": app},
                     "annotations": {crate::controllers::HARNESS_RUN_ANNOTATION: "true"}},
        "spec": {
            "selector": {"matchLabels": {"app": app}},
            "template": {
                "metadata": {"labels": {"app": app}},
                "spec": {"containers": [{"name": app, "image": format!("{app}:local")}]}
            }
        },
        "status": {"desiredNumberScheduled": nodes, "currentNumberScheduled": nodes,
                   "numberReady": nodes, "numberAvailable": nodes, "updatedNumberScheduled": nodes}
    })
}

/// An Event about `object` (a Pod, a DaemonSet...) from `component` on `host`:
/// Warning or Normal.
pub fn event(
    object: &Value,
    (component, host): (&str, &str),
    warning: bool,
    reason: &str,
    message: &str,
) -> Value {
    let meta = &object["metadata"];
    let name = meta["name"].as_str().unwrap_or_default();
    let now = now_rfc3339();
    json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": format!("{name}."), "namespace": meta["namespace"]},
        "involvedObject": {"apiVersion": object["apiVersion"].as_str().unwrap_or("v1"),
                           "kind": object["kind"].as_str().unwrap_or("Pod"), "name": name,
                           "namespace": meta["namespace"], "uid": meta["uid"]},
        "reason": reason,
        "message": message,
        "type": if warning { "Warning" } else { "Normal" },
        "count": 1,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "source": {"component": component, "host": host},
        "reportingComponent": component,
        "reportingInstance": host,
    })
}

/// The current UTC time as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    rfc3339(secs)
}

/// Kubernetes' metav1.Time form: RFC 3339, UTC, whole seconds.
fn rfc3339(secs: u64) -> String {
    let format =
        time::macros::format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]Z");
    time::OffsetDateTime::from_unix_timestamp(secs as i64)
        .ok()
        .and_then(|t| t.format(&format).ok())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_timestamps() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_709_210_096), "2024-02-29T12:34:56Z");
    }

    #[test]
    fn pod_splits_command_and_args() {
        let p = pod(
            "d",
            "p",
            "node-1",
            "sa",
            &[("app", "x")],
            &["e2e-app", "sink", "--listen", "0.0.0.0:9000"],
        );
        assert_eq!(p["spec"]["containers"][0]["command"], json!(["e2e-app"]));
        assert_eq!(p["spec"]["containers"][0]["args"][0], "sink");
        assert_eq!(p["metadata"]["labels"]["app"], "x");
    }
}
