//! The Deployment controller, managing pods directly (no ReplicaSet objects): the
//! replica count, pods spread over the nodes they fit, rolling updates within
//! `maxSurge`/`maxUnavailable` (or `Recreate`), and the status and conditions
//! `kubectl rollout status` reads.

use std::collections::BTreeMap;

use anyhow::Result;
use serde_json::{json, Value};

use super::rollout::scaled;
use super::{available, create_pod, delete_pod, fits, name, name_suffix, new_pod, owned, ready};
use super::{template_hash, write_status, World};
use crate::api::Api;
use crate::objects::now_rfc3339;

const HASH_LABEL: &str = "pod-template-hash";

pub fn reconcile(api: &Api, world: &World, d: &Value) -> Result<()> {
    let replicas = d["spec"]["replicas"].as_u64().unwrap_or(1) as usize;
    let hash = template_hash(d);
    let min_ready = d["spec"]["minReadySeconds"].as_u64().unwrap_or(0);
    let pods = owned(world, d);
    let is_new = |p: &Value| p["metadata"]["labels"][HASH_LABEL] == hash.as_str();
    let (new, old): (Vec<&Value>, Vec<&Value>) = pods.iter().partition(|p| is_new(p));
    let is_available = |p: &&Value| available(p, min_ready);
    let available_count = pods.iter().filter(|p| is_available(p)).count();

    let recreate = d["spec"]["strategy"]["type"] == "Recreate";
    let rolling = &d["spec"]["strategy"]["rollingUpdate"];
    let max_surge = scaled(&rolling["maxSurge"], "25%", replicas, true);
    // The API refuses both at 0; keep the rollout moving if it ever sees that.
    let max_unavailable = match scaled(&rolling["maxUnavailable"], "25%", replicas, false) {
        0 if max_surge == 0 => 1,
        n => n,
    };
    let min_available = replicas.saturating_sub(max_unavailable);

    let mut scheduler = Scheduler::new(world, d, &pods);
    let mut create = |count: usize| -> Result<()> {
        for _ in 0..count {
            let pod_name = format!("{}-{hash}-{}", name(d), name_suffix());
            let node = scheduler.pick();
            create_pod(
                api,
                d,
                &new_pod(d, HASH_LABEL, &hash, pod_name, node.as_deref()),
            )?;
        }
        Ok(())
    };
    // Surplus new pods go first, the ones not ready before the rest.
    let mut surplus: Vec<&Value> = new.clone();
    surplus.sort_by_key(|p| ready(p));
    for p in surplus.iter().take(new.len().saturating_sub(replicas)) {
        delete_pod(api, d, p)?;
    }
    if recreate {
        if old.is_empty() {
            create(replicas.saturating_sub(new.len()))?;
        }
        for p in &old {
            delete_pod(api, d, p)?;
        }
    } else {
        let room = (replicas + max_surge).saturating_sub(pods.len());
        create(replicas.saturating_sub(new.len()).min(room))?;
        // Old pods that are not available cost no availability; then as many
        // available ones as the budget allows.
        let (old_available, old_unavailable): (Vec<&Value>, Vec<&Value>) =
            old.iter().partition(|p| is_available(p));
        for p in &old_unavailable {
            delete_pod(api, d, p)?;
        }
        let budget = available_count.saturating_sub(min_available);
        for p in old_available.iter().take(budget) {
            delete_pod(api, d, p)?;
        }
    }

    let ready_count = pods.iter().filter(|p| ready(p)).count();
    let complete = old.is_empty() && new.len() == replicas && new.iter().all(is_available);
    let conditions = [
        condition(
            d,
            "Available",
            available_count >= min_available,
            if available_count >= min_available {
                (
                    "MinimumReplicasAvailable",
                    "Deployment has minimum availability.",
                )
            } else {
                (
                    "MinimumReplicasUnavailable",
                    "Deployment does not have minimum availability.",
                )
            },
        ),
        condition(
            d,
            "Progressing",
            true,
            if complete {
                (
                    "NewReplicaSetAvailable",
                    "Deployment has successfully progressed.",
                )
            } else {
                ("ReplicaSetUpdated", "Deployment is progressing.")
            },
        ),
    ];
    let status = json!({
        "observedGeneration": d["metadata"]["generation"],
        "replicas": pods.len(),
        "updatedReplicas": new.len(),
        "readyReplicas": ready_count,
        "availableReplicas": available_count,
        "unavailableReplicas": pods.len().saturating_sub(available_count),
        "conditions": conditions,
    });
    write_status(api, d, "deployments", status)
}

/// A condition; its times stay as they were while its status and reason do.
fn condition(d: &Value, kind: &str, ok: bool, (reason, message): (&str, &str)) -> Value {
    let status = if ok { "True" } else { "False" };
    let old = d["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == kind);
    let (updated, transition) = match old {
        Some(c) if c["status"] == status && c["reason"] == reason => {
            (c["lastUpdateTime"].clone(), c["lastTransitionTime"].clone())
        }
        Some(c) if c["status"] == status => (json!(now_rfc3339()), c["lastTransitionTime"].clone()),
        _ => (json!(now_rfc3339()), json!(now_rfc3339())),
    };
    json!({"type": kind, "status": status, "reason": reason, "message": message,
           "lastUpdateTime": updated, "lastTransitionTime": transition})
}

/// The scheduler's part for new pods: the node the template fits that runs the
/// fewest of this Deployment's pods (by name on a tie).
struct Scheduler {
    load: BTreeMap<String, usize>,
}

impl Scheduler {
    fn new(world: &World, d: &Value, pods: &[&Value]) -> Self {
        let spec = &d["spec"]["template"]["spec"];
        let mut load: BTreeMap<String, usize> = world
            .nodes
            .iter()
            .filter(|n| fits(spec, n))
            .map(|n| (name(n).to_owned(), 0))
            .collect();
        for p in pods {
            if let Some(n) = load.get_mut(p["spec"]["nodeName"].as_str().unwrap_or_default()) {
                *n += 1;
            }
        }
        Scheduler { load }
    }

    /// `None` when no node fits: the pod stays Pending, unscheduled.
    fn pick(&mut self) -> Option<String> {
        let (node, count) = self.load.iter_mut().min_by_key(|(_, c)| **c)?;
        *count += 1;
        Some(node.clone())
    }
}
