//! The CustomResourceDefinitions the mesh needs (the `base` chart), weighed against what
//! the cluster already has: install adds a missing CRD and upgrades an older one, but
//! never replaces one that is as new or newer (Istio's base chart or a platform's
//! Gateway API install); precheck shows the same verdicts as a table.

use std::cmp::Ordering;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject};
use kube::Client;
use serde::Serialize;
use serde_json::Value;

use crate::apply::Resolver;
use crate::charts::{self, describe};

/// The Gateway API's release of a CRD bundle.
const BUNDLE_VERSION: &str = "gateway.networking.k8s.io/bundle-version";
/// Set by Helm on what a release installed.
const HELM_RELEASE: &str = "meta.helm.sh/release-name";

/// A CRD's versions as the server would serve them, and its bundle release if any.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Versions {
    pub served: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bundle: Option<String>,
}

impl Versions {
    pub fn of(crd: &Value) -> Self {
        let served = crd["spec"]["versions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|v| v["served"] == true)
            .filter_map(|v| v["name"].as_str().map(str::to_owned))
            .collect();
        let bundle = crd["metadata"]["annotations"][BUNDLE_VERSION]
            .as_str()
            .map(str::to_owned);
        Versions { served, bundle }
    }

    /// `v1, v1beta1 (bundle v1.3.0)`.
    fn describe(&self) -> String {
        let mut out = self.served.join(", ");
        if let Some(b) = &self.bundle {
            out.push_str(&format!(" (bundle {b})"));
        }
        out
    }
}

/// What install does with one of our CRDs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Not in the cluster: install adds it.
    Missing,
    /// Serves fewer versions or an older bundle than ours: install upgrades it.
    Older,
    /// The same versions and bundle: kept as is.
    Same,
    /// Serves more versions or a newer bundle: kept as is.
    Newer,
}

impl Verdict {
    /// What install does, in words.
    pub fn action(self) -> &'static str {
        match self {
            Verdict::Missing => "install adds it",
            Verdict::Older => "install upgrades it",
            Verdict::Same | Verdict::Newer => "kept as is",
        }
    }

    fn applies(self) -> bool {
        matches!(self, Verdict::Missing | Verdict::Older)
    }
}

/// Weighs the installed CRD against ours. Newer-or-equal means it serves every
/// version ours serves and, where both name a Gateway API bundle, its release is not
/// older; a bundle CRD of ours over one without the annotation counts as older.
pub fn verdict(ours: &Versions, installed: Option<&Versions>) -> Verdict {
    let Some(installed) = installed else {
        return Verdict::Missing;
    };
    if !ours.served.iter().all(|v| installed.served.contains(v)) {
        return Verdict::Older;
    }
    let bundles = match (&ours.bundle, &installed.bundle) {
        (Some(o), Some(i)) => release(i).cmp(&release(o)),
        (Some(_), None) => return Verdict::Older,
        (None, _) => Ordering::Equal,
    };
    match bundles {
        Ordering::Less => Verdict::Older,
        Ordering::Greater => Verdict::Newer,
        Ordering::Equal if installed.served.len() > ours.served.len() => Verdict::Newer,
        Ordering::Equal => Verdict::Same,
    }
}

/// `v1.3.0` as comparable numbers; a pre-release (`v1.3.0-rc.1`) sorts below its
/// release, and anything unparsable below every release.
fn release(version: &str) -> (Option<semver::Version>, bool) {
    let parsed = semver::Version::parse(version.trim_start_matches('v')).ok();
    let released = parsed.as_ref().is_some_and(|v| v.pre.is_empty());
    (
        parsed.map(|v| semver::Version::new(v.major, v.minor, v.patch)),
        released,
    )
}

/// The Helm release that installed `crd`, if any: a CRD of another release (Istio's
/// base chart) is never deleted by our uninstall.
pub fn helm_owner(crd: &Value) -> Option<&str> {
    crd["metadata"]["annotations"][HELM_RELEASE].as_str()
}

/// Why uninstall --purge must keep `crd` (`None`: it is ours to delete): another Helm
/// release installed it, or it is newer than ours, so someone else put it there.
pub async fn not_ours(client: &Client, crd: &DynamicObject) -> Result<Option<String>> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = crd.metadata.name.as_deref().unwrap_or_default();
    let Some(existing) = api.get_opt(name).await? else {
        return Ok(None);
    };
    let existing = serde_json::to_value(existing)?;
    if let Some(release) = helm_owner(&existing) {
        return Ok(Some(format!("Helm release {release} installed it")));
    }
    let ours = Versions::of(&serde_json::to_value(crd)?);
    Ok(
        (verdict(&ours, Some(&Versions::of(&existing))) == Verdict::Newer)
            .then(|| "the cluster's is newer than ours".to_string()),
    )
}

/// One row of precheck's table.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub installed: Option<Versions>,
    pub ours: Versions,
    pub verdict: Verdict,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

/// The CRDs the `base` chart ships (its `files/crd-*.yaml`, experimental ones included),
/// read without helm so precheck runs anywhere.
pub fn shipped(charts_dir: &Path) -> Result<Vec<DynamicObject>> {
    let dir = charts_dir.join(charts::BASE).join("files");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .with_context(|| format!("cannot read {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("crd-") && n.ends_with(".yaml"))
        })
        .collect();
    files.sort();
    let mut crds = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("cannot read {}", file.display()))?;
        crds.extend(
            charts::parse_objects(&text, "")
                .with_context(|| format!("cannot parse {}", file.display()))?,
        );
    }
    Ok(crds)
}

/// Precheck's rows: each of our CRDs against the cluster's.
pub async fn rows(client: &Client, ours: &[DynamicObject]) -> Result<Vec<Row>> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut rows = Vec::new();
    for crd in ours {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let existing = match api.get_opt(&name).await? {
            Some(e) => Some(serde_json::to_value(e)?),
            None => None,
        };
        let ours = Versions::of(&serde_json::to_value(crd)?);
        let installed = existing.as_ref().map(Versions::of);
        rows.push(Row {
            verdict: verdict(&ours, installed.as_ref()),
            owner: existing
                .as_ref()
                .and_then(helm_owner)
                .map(|r| format!("helm release {r}")),
            name,
            installed,
            ours,
        });
    }
    Ok(rows)
}

/// The table precheck prints.
pub fn table(rows: &[Row]) -> String {
    let lines: Vec<[String; 5]> = rows
        .iter()
        .map(|r| {
            [
                r.name.clone(),
                r.installed.as_ref().map_or("-".into(), Versions::describe),
                r.ours.describe(),
                r.owner.clone().unwrap_or_else(|| "-".into()),
                format!("{:?}: {}", r.verdict, r.verdict.action()).to_lowercase(),
            ]
        })
        .collect();
    let header = ["CRD", "INSTALLED", "OURS", "OWNER", "RESULT"].map(String::from);
    let mut widths = [0; 5];
    for line in std::iter::once(&header).chain(&lines) {
        for (w, cell) in widths.iter_mut().zip(line) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for line in std::iter::once(&header).chain(&lines) {
        let cells: Vec<String> = line
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(cells.join("   ").trim_end());
        out.push('\n');
    }
    out
}

/// Applies each of `crds` the cluster lacks or has older, keeps the others, then waits
/// until every applied one is Established (its kinds served) or `deadline`.
pub async fn install(
    client: &Client,
    resolver: &Resolver,
    crds: &[&DynamicObject],
    deadline: Instant,
) -> Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut applied = Vec::new();
    for crd in crds {
        let name = crd.metadata.name.clone().context("a CRD without a name")?;
        let installed = match api.get_opt(&name).await? {
            Some(e) => Some(Versions::of(&serde_json::to_value(e)?)),
            None => None,
        };
        let ours = Versions::of(&serde_json::to_value(crd)?);
        let verdict = verdict(&ours, installed.as_ref());
        if verdict.applies() {
            resolver.apply(crd).await?;
            println!("✔ {} applied (base)", describe(crd));
            applied.push(name);
        } else {
            let installed = installed.map(|v| v.describe()).unwrap_or_default();
            println!(
                "✔ {} kept: the cluster's serves {installed}, ours {} ({verdict:?})",
                describe(crd),
                ours.describe()
            );
        }
    }
    for name in applied {
        wait_established(&api, &name, deadline).await?;
    }
    Ok(())
}

async fn wait_established(
    api: &Api<CustomResourceDefinition>,
    name: &str,
    deadline: Instant,
) -> Result<()> {
    loop {
        let established = api.get_opt(name).await?.is_some_and(|crd| {
            crd.status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        });
        if established {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("timed out waiting for CustomResourceDefinition {name} to be Established");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Whether `obj` is a CustomResourceDefinition.
pub fn is_crd(obj: &DynamicObject) -> bool {
    obj.types
        .as_ref()
        .is_some_and(|t| t.kind == "CustomResourceDefinition")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(served: &[&str], bundle: Option<&str>) -> Versions {
        Versions {
            served: served.iter().map(|s| s.to_string()).collect(),
            bundle: bundle.map(str::to_owned),
        }
    }

    #[test]
    fn verdicts_never_downgrade() {
        let istio = v(&["v1", "v1beta1"], None);
        assert_eq!(verdict(&istio, None), Verdict::Missing);
        assert_eq!(
            verdict(&istio, Some(&v(&["v1beta1"], None))),
            Verdict::Older
        );
        assert_eq!(verdict(&istio, Some(&istio)), Verdict::Same);
        let more = v(&["v1", "v1beta1", "v1alpha1"], None);
        assert_eq!(verdict(&istio, Some(&more)), Verdict::Newer);

        let gw = v(&["v1", "v1beta1"], Some("v1.3.0"));
        assert_eq!(verdict(&gw, Some(&gw)), Verdict::Same);
        let newer = v(&["v1"], Some("v1.4.0"));
        // A newer bundle that stopped serving v1beta1 still lacks a version of ours.
        assert_eq!(verdict(&gw, Some(&newer)), Verdict::Older);
        let newer = v(&["v1", "v1beta1"], Some("v1.4.0"));
        assert_eq!(verdict(&gw, Some(&newer)), Verdict::Newer);
        let older = v(&["v1", "v1beta1"], Some("v1.2.1"));
        assert_eq!(verdict(&gw, Some(&older)), Verdict::Older);
        let rc = v(&["v1", "v1beta1"], Some("v1.3.0-rc.1"));
        assert_eq!(verdict(&gw, Some(&rc)), Verdict::Older);
        let unknown = v(&["v1", "v1beta1"], None);
        assert_eq!(verdict(&gw, Some(&unknown)), Verdict::Older);
        let garbage = v(&["v1", "v1beta1"], Some("latest"));
        assert_eq!(verdict(&gw, Some(&garbage)), Verdict::Older);
    }

    #[test]
    fn the_base_chart_ships_every_crd_the_mesh_reads() {
        let crds = shipped(&charts::charts_dir(None).unwrap()).unwrap();
        let names: Vec<&str> = crds
            .iter()
            .filter_map(|c| c.metadata.name.as_deref())
            .collect();
        for needed in [
            "authorizationpolicies.security.istio.io",
            "peerauthentications.security.istio.io",
            "gatewayclasses.gateway.networking.k8s.io",
            "gateways.gateway.networking.k8s.io",
            "httproutes.gateway.networking.k8s.io",
        ] {
            assert!(names.contains(&needed), "{needed} in {names:?}");
        }
        assert!(crds.iter().all(is_crd));
    }

    #[test]
    fn the_table_aligns_its_columns() {
        let rows = [Row {
            name: "gateways.gateway.networking.k8s.io".into(),
            installed: None,
            ours: v(&["v1", "v1beta1"], Some("v1.3.0")),
            verdict: Verdict::Missing,
            owner: None,
        }];
        let text = table(&rows);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0].find("INSTALLED"), lines[1].find("-   "));
        assert!(lines[1].ends_with("missing: install adds it"), "{text}");
        assert!(lines[1].contains("v1, v1beta1 (bundle v1.3.0)"));
    }
}
