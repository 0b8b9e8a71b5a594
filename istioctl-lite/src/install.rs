//! `install` / `uninstall`: the charts rendered by helm, applied server-side, then a
//! readiness wait on the DaemonSets with one progress line per DaemonSet.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::Client;

use crate::apply::{unknown_kind, Outcome, Resolver, FIELD_MANAGER};
use crate::charts::{self, describe};
use crate::cli::{Global, InstallArgs, UninstallArgs};
use crate::kubeclient;

pub async fn install(global: &Global, args: &InstallArgs) -> Result<()> {
    let rendered = charts::render(&args.charts)?;
    if args.dry_run {
        for r in &rendered {
            print!("{}", r.yaml);
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
    let mut daemonsets = Vec::new();
    for r in &rendered {
        for obj in &r.objects {
            match resolver.apply(obj).await? {
                // Already reported above.
                Outcome::Unknown => {}
                _ => println!("✔ {} applied ({})", describe(obj), r.chart),
            }
            if is_daemonset(obj) {
                daemonsets.push(obj.clone());
            }
        }
    }
    if !args.wait {
        return Ok(());
    }
    wait_ready(&client, &daemonsets, args.timeout).await
}

pub async fn uninstall(global: &Global, args: &UninstallArgs) -> Result<()> {
    let rendered = charts::render(&args.charts)?;
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
    let resolver = Resolver::new(client).await?;
    for obj in objects {
        match resolver.delete(obj).await? {
            Outcome::Done => println!("✔ {} deleted", describe(obj)),
            Outcome::Absent => println!("✔ {} already absent", describe(obj)),
            // Nothing of an unserved kind can exist.
            Outcome::Unknown => println!("✔ {} not served by the API server", describe(obj)),
        }
    }
    Ok(())
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

fn kind(obj: &DynamicObject) -> &str {
    obj.types
        .as_ref()
        .map(|t| t.kind.as_str())
        .unwrap_or_default()
}

fn is_daemonset(obj: &DynamicObject) -> bool {
    kind(obj) == "DaemonSet"
}

fn is_crd(obj: &DynamicObject) -> bool {
    kind(obj) == "CustomResourceDefinition"
}

/// Ready means every scheduled pod is ready, and at least one is scheduled.
pub fn ready_line(ds: Option<&DaemonSet>) -> (bool, String) {
    let status = ds.and_then(|d| d.status.as_ref());
    let ready = status.map(|s| s.number_ready).unwrap_or(0);
    let desired = status.map(|s| s.desired_number_scheduled).unwrap_or(0);
    let done = desired > 0 && ready == desired;
    (done, format!("{ready}/{desired} ready"))
}

async fn wait_ready(
    client: &Client,
    daemonsets: &[DynamicObject],
    timeout: Duration,
) -> Result<()> {
    let tty = std::io::stderr().is_terminal();
    let deadline = Instant::now() + timeout;
    let mut last: Vec<String> = Vec::new();
    loop {
        let mut lines = Vec::new();
        let mut all_ready = true;
        for obj in daemonsets {
            let ns = obj.metadata.namespace.as_deref().unwrap_or("default");
            let name = obj.metadata.name.as_deref().unwrap_or_default();
            let api: Api<DaemonSet> = Api::namespaced(client.clone(), ns);
            let ds = api.get_opt(name).await?;
            let (done, text) = ready_line(ds.as_ref());
            all_ready &= done;
            let mark = if done { "✔" } else { "…" };
            lines.push(format!("{mark} DaemonSet {ns}/{name}: {text}"));
        }
        if lines != last {
            let mut err = std::io::stderr().lock();
            if tty && !last.is_empty() {
                // Redraw in place: one line per DaemonSet.
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
        if all_ready {
            println!("✔ installation complete");
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "timed out after {:?} waiting for the DaemonSets to be ready (see `kubectl get pods -n {}`)",
                timeout,
                daemonsets
                    .first()
                    .and_then(|d| d.metadata.namespace.as_deref())
                    .unwrap_or("istio-system")
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::DaemonSetStatus;

    #[test]
    fn readiness_needs_all_scheduled_pods_and_at_least_one() {
        let ds = |ready, desired| DaemonSet {
            status: Some(DaemonSetStatus {
                number_ready: ready,
                desired_number_scheduled: desired,
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(!ready_line(None).0);
        assert!(!ready_line(Some(&ds(0, 0))).0);
        assert!(!ready_line(Some(&ds(1, 2))).0);
        assert_eq!(ready_line(Some(&ds(2, 2))), (true, "2/2 ready".into()));
    }
}
