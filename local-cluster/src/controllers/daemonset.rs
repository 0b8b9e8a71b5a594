//! The DaemonSet controller: one pod on each node the template fits (nodeSelector,
//! tolerations), rolling updates node by node within `maxUnavailable`/`maxSurge`,
//! and the status `kubectl rollout status` reads.

use std::collections::BTreeMap;

use anyhow::Result;
use serde_json::{json, Value};

use super::rollout::scaled;
use super::{available, create_pod, delete_pod, fits, name, name_suffix, new_pod, owned, ready};
use super::{template_hash, write_status, World};
use crate::api::Api;

const HASH_LABEL: &str = "controller-revision-hash";

pub fn reconcile(api: &Api, world: &World, ds: &Value) -> Result<()> {
    let hash = template_hash(ds);
    let template_spec = &ds["spec"]["template"]["spec"];
    let min_ready = ds["spec"]["minReadySeconds"].as_u64().unwrap_or(0);
    let eligible: Vec<&str> = world
        .nodes
        .iter()
        .filter(|n| fits(template_spec, n))
        .map(name)
        .collect();
    let mut by_node: BTreeMap<&str, Vec<&Value>> = eligible.iter().map(|n| (*n, vec![])).collect();
    let mut misscheduled = 0;
    for pod in owned(world, ds) {
        let node = pod["spec"]["nodeName"].as_str().unwrap_or_default();
        match by_node.get_mut(node) {
            Some(pods) => pods.push(pod),
            None => {
                misscheduled += 1;
                delete_pod(api, ds, pod)?;
            }
        }
    }
    let is_new = |p: &Value| p["metadata"]["labels"][HASH_LABEL] == hash.as_str();
    let desired = eligible.len();
    let rolling = &ds["spec"]["updateStrategy"]["rollingUpdate"];
    let on_delete = ds["spec"]["updateStrategy"]["type"] == "OnDelete";
    let max_surge = scaled(&rolling["maxSurge"], "0", desired, true);
    let default_unavailable = if max_surge > 0 { "0" } else { "1" };
    let max_unavailable = scaled(
        &rolling["maxUnavailable"],
        default_unavailable,
        desired,
        true,
    );

    let node_available = |pods: &[&Value]| pods.iter().any(|p| available(p, min_ready));
    let mut unavailable = by_node.values().filter(|p| !node_available(p)).count();
    let mut surging = by_node
        .values()
        .filter(|p| p.iter().any(|p| is_new(p)) && p.iter().any(|p| !is_new(p)))
        .count();
    // A pod of the current template on `node`.
    let place = |node: &str| {
        let pod_name = format!("{}-{}", name(ds), name_suffix());
        create_pod(
            api,
            ds,
            &new_pod(ds, HASH_LABEL, &hash, pod_name, Some(node)),
        )
    };
    for (node, pods) in &by_node {
        let (new, old): (Vec<&Value>, Vec<&Value>) = pods.iter().partition(|p| is_new(p));
        if pods.is_empty() {
            place(node)?;
            continue;
        }
        // Duplicates of one revision on a node: keep one.
        for extra in new.iter().skip(1) {
            delete_pod(api, ds, extra)?;
        }
        if on_delete || old.is_empty() {
            continue;
        }
        if new.first().is_some_and(|p| available(p, min_ready)) {
            // A surged pod took over: the old one goes.
            for p in &old {
                delete_pod(api, ds, p)?;
            }
        } else if !new.is_empty() {
            // Waiting for the surged pod.
        } else if !node_available(&old) {
            // Already unavailable: replacing it costs nothing.
            for p in &old {
                delete_pod(api, ds, p)?;
            }
        } else if max_surge > surging {
            surging += 1;
            place(node)?;
        } else if unavailable < max_unavailable {
            unavailable += 1;
            for p in &old {
                delete_pod(api, ds, p)?;
            }
        }
    }

    let count = |f: &dyn Fn(&[&Value]) -> bool| by_node.values().filter(|p| f(p)).count();
    let number_available = count(&|p| node_available(p));
    let status = json!({
        "observedGeneration": ds["metadata"]["generation"],
        "desiredNumberScheduled": desired,
        "currentNumberScheduled": count(&|p| !p.is_empty()),
        "numberMisscheduled": misscheduled,
        "numberReady": count(&|p| p.iter().any(|p| ready(p))),
        "numberAvailable": number_available,
        "numberUnavailable": desired - number_available,
        "updatedNumberScheduled": count(&|p| p.iter().any(|p| is_new(p))),
    });
    write_status(api, ds, "daemonsets", status)
}
