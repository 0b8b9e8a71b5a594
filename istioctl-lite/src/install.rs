//! `install` / `uninstall`: the charts rendered by helm, applied server-side. Install
//! makes sure the CA Secret exists, applies the control plane (istiod-lite) and waits
//! for Deployment istiod, then applies cni and ztunnel and waits for their DaemonSets,
//! with one live progress line per workload.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::Client;
use shared_types::constants::{DATAPLANE_MODE_LABEL, REDIRECTION_ANNOTATION, REDIRECTION_ENABLED};

use crate::apply::{unknown_kind, Outcome, Resolver, FIELD_MANAGER};
use crate::ca;
use crate::charts::{self, describe, Rendered, CNI, CONTROL_PLANE};
use crate::cli::{Global, InstallArgs, UninstallArgs};
use crate::kubeclient;

pub async fn install(global: &Global, args: &InstallArgs) -> Result<()> {
    let rendered = charts::render(&args.charts)?;
    let ca_secret = CaSecret::from_rendered(&rendered, &args.charts.namespace);
    if args.dry_run {
        for r in &rendered {
            print!("{}", r.yaml);
        }
        if let Some(s) = &ca_secret {
            eprintln!(
                "note: install also creates Secret {}/{} with {} if it does not exist (not written by --dry-run)",
                s.namespace,
                s.name,
                ca::fresh_root_description(&s.trust_domain)
            );
        }
        return Ok(());
    }
    let client = kubeclient::client(global).await?;
    let resolver = Resolver::new(client.clone()).await?;
    // Refuse before the first write, so a failure leaves the cluster untouched.
    for obj in rendered.iter().flat_map(|r| &r.objects) {
        if !resolver.serves(obj) {
            unknown_kind(obj, args.charts.skip_unknown_kinds)?;
        }
    }
    ensure_namespace(&client, &args.charts.namespace).await?;
    if let Some(s) = &ca_secret {
        s.ensure(&client).await?;
    }
    let deadline = Instant::now() + args.timeout;
    // The control plane first: ztunnel asks istiod for certificates as it starts.
    let (control, data): (Vec<&Rendered>, Vec<&Rendered>) =
        rendered.iter().partition(|r| r.chart == CONTROL_PLANE);
    let workloads = apply_all(&resolver, &control).await?;
    if args.wait {
        wait_ready(&client, &workloads, deadline, args.timeout)
            .await
            .context("the control plane is not available, so cni and ztunnel were not applied")?;
    }
    let workloads = apply_all(&resolver, &data).await?;
    if args.wait {
        wait_ready(&client, &workloads, deadline, args.timeout).await?;
        println!("✔ installation complete");
    }
    Ok(())
}

/// Applies every object of `charts`; returns the workloads to wait for.
async fn apply_all(resolver: &Resolver, charts: &[&Rendered]) -> Result<Vec<Workload>> {
    let mut workloads = Vec::new();
    for r in charts {
        for obj in &r.objects {
            match resolver.apply(obj).await? {
                // Already reported above.
                Outcome::Unknown => continue,
                _ => println!("✔ {} applied ({})", describe(obj), r.chart),
            }
            workloads.extend(Workload::of(obj));
        }
    }
    Ok(workloads)
}

pub async fn uninstall(global: &Global, args: &UninstallArgs) -> Result<()> {
    let rendered = charts::render(&args.charts)?;
    let ca_secret = CaSecret::from_rendered(&rendered, &args.charts.namespace);
    // Reverse install order: ztunnel, cni, then the control plane.
    let objects: Vec<&DynamicObject> = rendered
        .iter()
        .rev()
        .flat_map(|r| r.objects.iter().rev())
        .filter(|o| args.purge || !is_crd(o))
        .collect();
    if args.dry_run {
        for obj in objects {
            println!("would delete {}", describe(obj));
        }
        return Ok(());
    }
    let client = kubeclient::client(global).await?;
    let resolver = Resolver::new(client.clone()).await?;
    refuse_while_pods_are_enrolled(&client, args.force).await?;
    if !args.keep_cni_config {
        agents_uninstall_on_exit(&client, &resolver, args).await?;
    }
    for obj in objects {
        match resolver.delete(obj).await? {
            Outcome::Done => println!("✔ {} deleted", describe(obj)),
            Outcome::Absent => println!("✔ {} already absent", describe(obj)),
            // Nothing of an unserved kind can exist.
            Outcome::Unknown => println!("✔ {} not served by the API server", describe(obj)),
        }
    }
    // The CA outlives the install: deleting it would orphan every issued identity.
    if let Some(s) = &ca_secret {
        let api: Api<Secret> = Api::namespaced(client, &s.namespace);
        if api.get_opt(&s.name).await?.is_some() {
            println!(
                "✔ Secret {ns}/{name} kept (the mesh CA; `kubectl -n {ns} delete secret {name}` removes it)",
                ns = s.namespace,
                name = s.name
            );
        }
    }
    Ok(())
}

/// Pods the agents enrolled keep their redirection after the mesh is gone, and with
/// no ztunnel their connections are refused until they restart: so they are to be
/// taken out of the mesh first (the agents undo their rules), unless `force`.
async fn refuse_while_pods_are_enrolled(client: &Client, force: bool) -> Result<()> {
    let pods: Api<Pod> = Api::all(client.clone());
    let mut namespaces: Vec<String> = pods
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|p| {
            p.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(REDIRECTION_ANNOTATION))
                == Some(&REDIRECTION_ENABLED.to_owned())
        })
        .filter_map(|p| p.metadata.namespace.clone())
        .collect();
    namespaces.sort();
    namespaces.dedup();
    if namespaces.is_empty() {
        return Ok(());
    }
    let advice: Vec<String> = namespaces
        .iter()
        .map(|ns| format!("  istioctl-lite dataplane-mode disable {ns}"))
        .collect();
    let message = format!(
        "pods in {} are in the mesh: without ztunnel their connections would be refused until they restart. Take them out first:\n{}\n(pods labelled one by one: remove their label `{DATAPLANE_MODE_LABEL}`), or uninstall anyway with --force",
        namespaces.join(", "),
        advice.join("\n")
    );
    if force {
        eprintln!("warning: {message}");
        return Ok(());
    }
    bail!("{message}")
}

/// The agents keep their CNI chain entry when they stop, so that during an upgrade
/// new pods wait for the next agent instead of starting outside the mesh. Before an
/// uninstall they are rolled to take the entry and the plugin off their node as they
/// stop (the cni chart's documented procedure: `uninstallOnExit=true`, then delete).
async fn agents_uninstall_on_exit(
    client: &Client,
    resolver: &Resolver,
    args: &UninstallArgs,
) -> Result<()> {
    let mut charts = args.charts.clone();
    charts.set.push("cni.uninstallOnExit=true".into());
    let rendered = charts::render(&charts)?;
    let Some(cni) = rendered.iter().find(|r| r.chart == CNI) else {
        return Ok(());
    };
    let agents: Vec<Workload> = cni.objects.iter().filter_map(Workload::of).collect();
    let mut installed = Vec::new();
    for w in &agents {
        let api: Api<DaemonSet> = Api::namespaced(client.clone(), &w.namespace);
        if api.get_opt(&w.name).await?.is_some() {
            installed.push(w.clone());
        }
    }
    if installed.is_empty() {
        return Ok(());
    }
    for obj in &cni.objects {
        resolver.apply(obj).await?;
    }
    println!("✔ node agents rolled to uninstall the CNI plugin as they stop");
    wait_ready(
        client,
        &installed,
        Instant::now() + args.timeout,
        args.timeout,
    )
    .await
    .context("the node agents did not roll out with uninstallOnExit=true; nothing was deleted (`--keep-cni-config` skips this step)")
}

async fn ensure_namespace(client: &Client, name: &str) -> Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns =
        serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&ns),
    )
    .await?;
    println!("✔ Namespace/{name} ready");
    Ok(())
}

/// The plug-in CA Secret the control plane mounts, read from its rendered Deployment
/// (so `--set istiod.caSecretName=…` and `istiod.trustDomain=…` are honoured).
#[derive(Debug, PartialEq)]
struct CaSecret {
    namespace: String,
    name: String,
    trust_domain: String,
}

impl CaSecret {
    fn from_rendered(rendered: &[Rendered], namespace: &str) -> Option<Self> {
        let deployment = rendered
            .iter()
            .filter(|r| r.chart == CONTROL_PLANE)
            .flat_map(|r| &r.objects)
            .find(|o| kind(o) == "Deployment")?;
        let pod = &deployment.data["spec"]["template"]["spec"];
        let name = pod["volumes"]
            .as_array()?
            .iter()
            .find(|v| v["name"] == "cacerts")?["secret"]["secretName"]
            .as_str()?
            .to_string();
        let trust_domain = pod["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|c| c["env"].as_array().into_iter().flatten())
            .find(|e| e["name"] == "TRUST_DOMAIN")
            .and_then(|e| e["value"].as_str())
            .unwrap_or("cluster.local")
            .to_string();
        Some(CaSecret {
            namespace: deployment
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| namespace.to_string()),
            name,
            trust_domain,
        })
    }

    /// Istio's istiod self-signs when no `cacerts` exist; istiod-lite needs the Secret,
    /// so install makes the same kind of root when there is none. An existing Secret
    /// (a plugged-in CA) is never touched.
    async fn ensure(&self, client: &Client) -> Result<()> {
        let created =
            ca::create_if_missing(client, &self.namespace, &self.name, &self.trust_domain).await?;
        if created {
            let (ns, name) = (&self.namespace, &self.name);
            let plug_in = if name == ca::SECRET_NAME {
                format!("istioctl-lite ca init -n {ns} --from-dir DIR --overwrite")
            } else {
                format!(
                    "kubectl -n {ns} delete secret {name} && kubectl -n {ns} create secret generic {name} --from-file=DIR"
                )
            };
            println!(
                "✔ Secret {ns}/{name} created with {} (there was none; Istio's istiod self-signs likewise)",
                ca::fresh_root_description(&self.trust_domain),
            );
            println!(
                "  to plug in your own CA instead: `{plug_in}`, then `kubectl -n {ns} rollout restart deployment/istiod`"
            );
        } else {
            println!(
                "✔ Secret {}/{} present (the mesh CA; left as is)",
                self.namespace, self.name
            );
        }
        Ok(())
    }
}

fn kind(obj: &DynamicObject) -> &str {
    obj.types
        .as_ref()
        .map(|t| t.kind.as_str())
        .unwrap_or_default()
}

fn is_crd(obj: &DynamicObject) -> bool {
    kind(obj) == "CustomResourceDefinition"
}

/// A Deployment or DaemonSet the install waits for.
#[derive(Debug, Clone, PartialEq)]
struct Workload {
    kind: WorkloadKind,
    namespace: String,
    name: String,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum WorkloadKind {
    Deployment,
    DaemonSet,
}

impl Workload {
    fn of(obj: &DynamicObject) -> Option<Self> {
        let kind = match kind(obj) {
            "Deployment" => WorkloadKind::Deployment,
            "DaemonSet" => WorkloadKind::DaemonSet,
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
async fn wait_ready(
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

    #[test]
    fn the_ca_secret_comes_from_the_rendered_deployment() {
        let yaml = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: istiod\nspec:\n  template:\n    spec:\n      containers:\n        - name: discovery\n          env:\n            - name: TRUST_DOMAIN\n              value: example.org\n      volumes:\n        - name: cacerts\n          secret:\n            secretName: my-ca\n";
        let rendered = vec![Rendered {
            chart: CONTROL_PLANE,
            yaml: yaml.into(),
            objects: charts::parse_objects(yaml, "mesh").unwrap(),
        }];
        assert_eq!(
            CaSecret::from_rendered(&rendered, "mesh"),
            Some(CaSecret {
                namespace: "mesh".into(),
                name: "my-ca".into(),
                trust_domain: "example.org".into(),
            })
        );
        assert_eq!(CaSecret::from_rendered(&rendered[..0], "mesh"), None);
    }
}
