//! `install` / `uninstall`: the charts rendered by helm, applied server-side. Install
//! makes sure the CA Secret exists, adds or upgrades the CRDs the cluster lacks (never
//! replacing a newer one; see `crds`), applies the control plane (istiod-lite) and
//! waits for Deployment istiod, then applies cni and ztunnel and waits for their
//! DaemonSets, with one live progress line per workload.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::Client;
use shared_types::constants::{DATAPLANE_MODE_LABEL, REDIRECTION_ANNOTATION, REDIRECTION_ENABLED};

use crate::apply::{unknown_kind, Outcome, Resolver, FIELD_MANAGER};
use crate::ca;
use crate::charts::{self, describe, Rendered, BASE, CNI, CONTROL_PLANE};
use crate::cli::{Global, InstallArgs, UninstallArgs};
use crate::crds::{self, is_crd};
use crate::kubeclient;
use crate::rollout::{wait_ready, Workload};

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
    let (crds, rendered): (Vec<&Rendered>, Vec<&Rendered>) =
        rendered.iter().partition(|r| r.chart == BASE);
    let crds: Vec<&DynamicObject> = crds.iter().flat_map(|r| &r.objects).collect();
    // Refuse before the first write, so a failure leaves the cluster untouched.
    for obj in rendered.iter().flat_map(|r| &r.objects) {
        if !resolver.serves(obj) && !crds.iter().any(|crd| defines(crd, obj)) {
            unknown_kind(obj, args.charts.skip_unknown_kinds)?;
        }
    }
    ensure_namespace(&client, &args.charts.namespace).await?;
    if let Some(s) = &ca_secret {
        s.ensure(&client).await?;
    }
    let deadline = Instant::now() + args.timeout;
    crds::install(&client, &resolver, &crds, deadline).await?;
    // Discovery again: the kinds of the CRDs just added are served now.
    let resolver = Resolver::new(client.clone()).await?;
    // The control plane first: ztunnel asks istiod for certificates as it starts.
    let (control, data): (Vec<&Rendered>, Vec<&Rendered>) =
        rendered.into_iter().partition(|r| r.chart == CONTROL_PLANE);
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
    // Reverse install order: ztunnel, cni, the control plane, then (with --purge) CRDs.
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
        if is_crd(obj) {
            if let Some(reason) = crds::not_ours(&client, obj).await? {
                println!("✔ {} kept: {reason}", describe(obj));
                continue;
            }
        }
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

/// Whether `crd` defines the kind of `obj`.
fn defines(crd: &DynamicObject, obj: &DynamicObject) -> bool {
    let Some(types) = &obj.types else {
        return false;
    };
    let group = types.api_version.rsplit_once('/').map_or("", |(g, _)| g);
    crd.data["spec"]["group"] == group && crd.data["spec"]["names"]["kind"] == types.kind
}

#[cfg(test)]
mod tests {
    use super::*;

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
