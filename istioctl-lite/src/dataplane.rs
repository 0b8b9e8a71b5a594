//! `dataplane-mode enable|disable NS`: (un)label the namespace, then watch the node
//! agent's per-pod redirection annotation until every running pod got there.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde::Serialize;
use shared_types::constants::{
    DATAPLANE_MODE_AMBIENT, DATAPLANE_MODE_LABEL, REDIRECTION_ANNOTATION, REDIRECTION_ENABLED,
};

use crate::cli::{DataplaneArgs, Global, Output};
use crate::kubeclient;
use crate::output::{print_structured, Table};

/// One pod's enrollment as the agent reports it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PodState {
    pub name: String,
    /// `enabled`, `pending`, or `absent` (no annotation).
    pub redirection: String,
}

pub async fn run(global: &Global, args: &DataplaneArgs, enable: bool) -> Result<()> {
    let client = kubeclient::client(global).await?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let value = if enable {
        serde_json::Value::from(DATAPLANE_MODE_AMBIENT)
    } else {
        serde_json::Value::Null
    };
    let patch = serde_json::json!({"metadata": {"labels": {DATAPLANE_MODE_LABEL: value}}});
    namespaces
        .patch(
            &args.namespace,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(|e| anyhow::anyhow!("cannot label namespace {}: {e}", args.namespace))?;
    if global.output == Output::Table {
        let verb = if enable { "labelled" } else { "unlabelled" };
        println!(
            "✔ namespace {} {verb} {DATAPLANE_MODE_LABEL}",
            args.namespace
        );
    }

    let want = if enable {
        REDIRECTION_ENABLED
    } else {
        "absent"
    };
    let pods: Api<Pod> = Api::namespaced(client, &args.namespace);
    let deadline = Instant::now() + args.timeout;
    let states = loop {
        let states = pod_states(&pods.list(&ListParams::default()).await?.items);
        if states.iter().all(|s| s.redirection == want) || Instant::now() >= deadline {
            break states;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    report(global.output, &states)?;
    let missing = states.iter().filter(|s| s.redirection != want).count();
    if missing > 0 {
        bail!(
            "{missing} of {} pods not {want} after {:?}; check the istio-cni-node agent logs on their nodes",
            states.len(),
            args.timeout
        );
    }
    Ok(())
}

/// Running pods outside the host network (the only ones the agent enrolls), sorted.
pub fn pod_states(pods: &[Pod]) -> Vec<PodState> {
    let mut states: Vec<PodState> = pods
        .iter()
        .filter(|p| {
            !p.spec
                .as_ref()
                .and_then(|s| s.host_network)
                .unwrap_or(false)
        })
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| PodState {
            name: p.metadata.name.clone().unwrap_or_default(),
            redirection: p
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(REDIRECTION_ANNOTATION))
                .cloned()
                .unwrap_or_else(|| "absent".into()),
        })
        .collect();
    states.sort_by(|a, b| a.name.cmp(&b.name));
    states
}

fn report(format: Output, states: &[PodState]) -> Result<()> {
    if format != Output::Table {
        return print_structured(format, &states);
    }
    let mut table = Table::new(1, &["POD", "REDIRECTION"]);
    for s in states {
        table.row(vec![s.name.clone(), s.redirection.clone()]);
    }
    print!("{}", table.render());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, phase: &str, host: bool, annotation: Option<&str>) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "annotations": annotation.map(|a| serde_json::json!({REDIRECTION_ANNOTATION: a}))},
            "spec": {"containers": [], "hostNetwork": host},
            "status": {"phase": phase},
        }))
        .unwrap()
    }

    #[test]
    fn only_running_pod_network_pods_count() {
        let pods = [
            pod("b", "Running", false, Some("enabled")),
            pod("a", "Running", false, None),
            pod("host", "Running", true, None),
            pod("done", "Succeeded", false, None),
            pod("c", "Running", false, Some("pending")),
        ];
        let got: Vec<_> = pod_states(&pods)
            .into_iter()
            .map(|s| (s.name, s.redirection))
            .collect();
        assert_eq!(
            got,
            [
                ("a".into(), "absent".into()),
                ("b".into(), "enabled".into()),
                ("c".into(), "pending".into())
            ]
        );
    }
}
