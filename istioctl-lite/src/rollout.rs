//! Waiting for a rollout as `kubectl rollout status` does: a Deployment or DaemonSet
//! is ready when its controller has seen the latest spec and every pod it wants runs
//! that spec and is ready, with one live progress line per workload.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use kube::api::{Api, DynamicObject};
use kube::Client;

/// A Deployment or DaemonSet the install waits for.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    pub kind: WorkloadKind,
    pub namespace: String,
    pub name: String,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum WorkloadKind {
    Deployment,
    DaemonSet,
}

impl Workload {
    pub fn of(obj: &DynamicObject) -> Option<Self> {
        let kind = match obj.types.as_ref().map(|t| t.kind.as_str()) {
            Some("Deployment") => WorkloadKind::Deployment,
            Some("DaemonSet") => WorkloadKind::DaemonSet,
            _ => return None,
        };
        Some(Workload {
            kind,
            namespace: obj
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into()),
            name: obj.metadata.name.clone().unwrap_or_default(),
        })
    }

    fn label(&self) -> String {
        let kind = match self.kind {
            WorkloadKind::Deployment => "Deployment",
            WorkloadKind::DaemonSet => "DaemonSet",
        };
        format!("{kind} {}/{}", self.namespace, self.name)
    }

    async fn progress(&self, client: &Client) -> Result<(bool, String)> {
        Ok(match self.kind {
            WorkloadKind::Deployment => {
                let api: Api<Deployment> = Api::namespaced(client.clone(), &self.namespace);
                deployment_line(api.get_opt(&self.name).await?.as_ref())
            }
            WorkloadKind::DaemonSet => {
                let api: Api<DaemonSet> = Api::namespaced(client.clone(), &self.namespace);
                ready_line(api.get_opt(&self.name).await?.as_ref())
            }
        })
    }
}

/// Ready as `kubectl rollout status` means it: the controller has seen the latest
/// spec, every scheduled pod runs it, every one is ready, and at least one is
/// scheduled. (After an upgrade the old pods are ready too, but not updated.)
pub fn ready_line(ds: Option<&DaemonSet>) -> (bool, String) {
    let status = ds.and_then(|d| d.status.as_ref());
    let ready = status.map(|s| s.number_ready).unwrap_or(0);
    let desired = status.map(|s| s.desired_number_scheduled).unwrap_or(0);
    let updated = status.and_then(|s| s.updated_number_scheduled).unwrap_or(0);
    let done = desired > 0 && ready == desired && updated == desired && observed(ds);
    (done, format!("{ready}/{desired} ready, {updated} updated"))
}

/// Available means as many available replicas as `spec.replicas` (readyReplicas when
/// the server reports no availableReplicas), and at least one, all of the latest spec.
pub fn deployment_line(d: Option<&Deployment>) -> (bool, String) {
    let desired = d
        .and_then(|d| d.spec.as_ref())
        .and_then(|s| s.replicas)
        .unwrap_or(1);
    let status = d.and_then(|d| d.status.as_ref());
    let available = status
        .and_then(|s| s.available_replicas.or(s.ready_replicas))
        .unwrap_or(0);
    let updated = status.and_then(|s| s.updated_replicas).unwrap_or(available);
    let done = d.is_some() && available >= desired.max(1) && updated >= desired && observed(d);
    (done, format!("{available}/{desired} available"))
}

/// Whether the controller has acted on the object's latest generation.
fn observed<K: kube::Resource + WithObservedGeneration>(obj: Option<&K>) -> bool {
    let Some(obj) = obj else { return false };
    match (obj.meta().generation, obj.observed_generation()) {
        (Some(generation), Some(observed)) => observed >= generation,
        _ => true,
    }
}

trait WithObservedGeneration {
    fn observed_generation(&self) -> Option<i64>;
}

impl WithObservedGeneration for DaemonSet {
    fn observed_generation(&self) -> Option<i64> {
        self.status.as_ref()?.observed_generation
    }
}

impl WithObservedGeneration for Deployment {
    fn observed_generation(&self) -> Option<i64> {
        self.status.as_ref()?.observed_generation
    }
}

/// Polls until every workload is ready, redrawing one line per workload in place on
/// a terminal (appending changed states otherwise).
pub async fn wait_ready(
    client: &Client,
    workloads: &[Workload],
    deadline: Instant,
    timeout: Duration,
) -> Result<()> {
    let tty = std::io::stderr().is_terminal();
    let mut last: Vec<String> = Vec::new();
    loop {
        let mut lines = Vec::new();
        let mut waiting = Vec::new();
        for w in workloads {
            let (done, text) = w.progress(client).await?;
            if !done {
                waiting.push(w);
            }
            let mark = if done { "✔" } else { "…" };
            lines.push(format!("{mark} {}: {text}", w.label()));
        }
        if lines != last {
            let mut err = std::io::stderr().lock();
            if tty && !last.is_empty() {
                write!(err, "\x1b[{}A", last.len())?;
            }
            for line in &lines {
                if tty {
                    writeln!(err, "\x1b[2K{line}")?;
                } else {
                    writeln!(err, "{line}")?;
                }
            }
            last = lines;
        }
        let Some(first) = waiting.first() else {
            return Ok(());
        };
        if Instant::now() >= deadline {
            let names: Vec<String> = waiting.iter().map(|w| w.label()).collect();
            let hint = match first.kind {
                WorkloadKind::Deployment => format!(
                    "`kubectl -n {} describe deployment {}`",
                    first.namespace, first.name
                ),
                WorkloadKind::DaemonSet => format!("`kubectl get pods -n {}`", first.namespace),
            };
            bail!(
                "timed out after {timeout:?} waiting for {} to be ready (see {hint})",
                names.join(", ")
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::{DaemonSetStatus, DeploymentSpec, DeploymentStatus};

    #[test]
    fn readiness_needs_all_scheduled_pods_and_at_least_one() {
        let ds = |ready, desired, updated| DaemonSet {
            status: Some(DaemonSetStatus {
                number_ready: ready,
                desired_number_scheduled: desired,
                updated_number_scheduled: Some(updated),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(!ready_line(None).0);
        assert!(!ready_line(Some(&ds(0, 0, 0))).0);
        assert!(!ready_line(Some(&ds(1, 2, 2))).0);
        assert_eq!(
            ready_line(Some(&ds(2, 2, 2))),
            (true, "2/2 ready, 2 updated".into())
        );
        // An upgrade in progress: the old pods are ready, not updated.
        assert!(!ready_line(Some(&ds(2, 2, 1))).0);
        // Nor before the controller has seen the new spec.
        let mut unseen = ds(2, 2, 2);
        unseen.metadata.generation = Some(3);
        unseen.status.as_mut().unwrap().observed_generation = Some(2);
        assert!(!ready_line(Some(&unseen)).0);
    }

    #[test]
    fn deployment_availability_counts_available_else_ready_replicas() {
        let d = |replicas, available, ready| Deployment {
            spec: Some(DeploymentSpec {
                replicas,
                ..Default::default()
            }),
            status: Some(DeploymentStatus {
                available_replicas: available,
                ready_replicas: ready,
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(!deployment_line(None).0);
        assert_eq!(
            deployment_line(Some(&d(Some(1), None, None))),
            (false, "0/1 available".into())
        );
        assert!(deployment_line(Some(&d(Some(1), Some(1), Some(1)))).0);
        assert!(deployment_line(Some(&d(Some(1), None, Some(1)))).0);
        // Ready but not yet available (minReadySeconds): keep waiting.
        assert!(!deployment_line(Some(&d(Some(2), Some(1), Some(2)))).0);
        assert!(!deployment_line(Some(&d(Some(0), Some(0), None))).0);
        assert_eq!(
            deployment_line(Some(&d(None, Some(1), None))),
            (true, "1/1 available".into())
        );
    }
}
