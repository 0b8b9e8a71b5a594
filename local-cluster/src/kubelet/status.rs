//! The pod status the kubelet writes: phase, conditions (each keeping the time it
//! last changed), addresses and container statuses.

use serde_json::{json, Value};

use super::sandbox::Sandbox;
use super::NodeInfo;
use crate::kubelet::containers::{Container, RestartPolicy};
use crate::objects::now_rfc3339;

pub(super) fn status_path(pod: &Value) -> String {
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

/// The pod conditions kubelet writes, each keeping the time it last changed.
#[derive(Default)]
pub(super) struct Conditions(Vec<(&'static str, bool, String)>);

impl Conditions {
    fn set(&mut self, kind: &'static str, ok: bool) -> Value {
        match self.0.iter_mut().find(|(k, _, _)| *k == kind) {
            Some(entry) if entry.1 == ok => {}
            Some(entry) => *entry = (kind, ok, now_rfc3339()),
            None => self.0.push((kind, ok, now_rfc3339())),
        }
        let (_, _, since) = self
            .0
            .iter()
            .find(|(k, _, _)| *k == kind)
            .cloned()
            .unwrap_or_default();
        condition(kind, ok, &since)
    }
}

pub(super) fn pod_status(
    node: &NodeInfo,
    sandbox: &Sandbox,
    policy: RestartPolicy,
    conditions: &mut Conditions,
) -> Value {
    let containers: Vec<Value> = sandbox.containers.iter().map(Container::status).collect();
    let all_ready = sandbox.containers.iter().all(Container::ready);
    let done: Vec<bool> = containers
        .iter()
        .filter_map(|c| {
            c["state"]["terminated"]["exitCode"]
                .as_i64()
                .map(|code| code == 0)
        })
        .collect();
    // Finished once every container terminated for good (only without restarts).
    let phase = if done.len() == containers.len() && policy != RestartPolicy::Always {
        if done.iter().all(|ok| *ok) {
            "Succeeded"
        } else {
            "Failed"
        }
    } else {
        "Running"
    };
    let conditions: Vec<Value> = [
        ("PodScheduled", true),
        ("Initialized", true),
        ("PodReadyToStartContainers", true),
        ("ContainersReady", all_ready),
        ("Ready", all_ready),
    ]
    .into_iter()
    .map(|(kind, ok)| conditions.set(kind, ok))
    .collect();
    json!({"status": {
        "phase": phase,
        "hostIP": node.host_ip, "hostIPs": [{"ip": node.host_ip}],
        "podIP": sandbox.ips[0],
        "podIPs": sandbox.ips.iter().map(|ip| json!({"ip": ip})).collect::<Vec<_>>(),
        "startTime": conditions_start(&conditions),
        "conditions": conditions,
        "containerStatuses": containers,
    }})
}

/// `startTime`: when the sandbox came up (the first condition's time).
fn conditions_start(conditions: &[Value]) -> Value {
    conditions
        .first()
        .map(|c| c["lastTransitionTime"].clone())
        .unwrap_or(Value::Null)
}

pub(super) fn waiting_status(pod: &Value, node: &NodeInfo) -> Value {
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
