//! Renders the repository's charts with `helm template`, so install and uninstall
//! work from the very manifests Helm users get (no second copy).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use kube::api::DynamicObject;

use crate::cli::ChartArgs;

/// The charts, in install order: the node agent first, then ztunnel.
pub const CHARTS: [(&str, &str); 2] = [("cni", "istio-cni"), ("ztunnel", "ztunnel")];

/// One chart's rendering: its YAML text and the objects in it.
pub struct Rendered {
    pub chart: &'static str,
    pub yaml: String,
    pub objects: Vec<DynamicObject>,
}

/// `helm` on PATH, with a clear error when it is missing.
pub fn find_helm() -> Result<PathBuf> {
    find_on_path("helm")
        .context("helm not found on PATH: install Helm v3+ (e.g. scripts/install-chart-tools.sh)")
}

pub fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// `--charts-dir`, else `charts/` beside the binary, else the repository's
/// `manifests/charts` (found from the binary's location or the build tree).
pub fn charts_dir(flag: Option<&Path>) -> Result<PathBuf> {
    if let Some(dir) = flag {
        return Ok(dir.to_path_buf());
    }
    let mut candidates = Vec::new();
    if let Ok(exe) = std::env::current_exe() {
        if let Some(bin_dir) = exe.parent() {
            candidates.push(bin_dir.join("charts"));
            for ancestor in bin_dir.ancestors().skip(1) {
                candidates.push(ancestor.join("manifests/charts"));
            }
        }
    }
    candidates.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/charts"));
    candidates
        .into_iter()
        .find(|dir| {
            dir.join("cni/Chart.yaml").is_file() && dir.join("ztunnel/Chart.yaml").is_file()
        })
        .context("cannot find the charts (cni, ztunnel); pass --charts-dir")
}

/// `--set` values meant for `chart`: a `cni.`/`ztunnel.` prefix targets one chart
/// (the schemas reject unknown keys), anything else goes to both.
pub fn values_for(chart: &str, sets: &[String]) -> Vec<String> {
    sets.iter()
        .filter_map(|s| {
            for (other, _) in CHARTS {
                if let Some(rest) = s.strip_prefix(&format!("{other}.")) {
                    return (other == chart).then(|| rest.to_string());
                }
            }
            Some(s.clone())
        })
        .collect()
}

/// Runs `helm template` for both charts and parses the objects.
pub fn render(args: &ChartArgs) -> Result<Vec<Rendered>> {
    let helm = find_helm()?;
    let dir = charts_dir(args.charts_dir.as_deref())?;
    let mut out = Vec::new();
    for (chart, release) in CHARTS {
        let mut cmd = Command::new(&helm);
        cmd.arg("template")
            .arg(release)
            .arg(dir.join(chart))
            .args(["--namespace", &args.namespace]);
        for value in values_for(chart, &args.set) {
            cmd.args(["--set", &value]);
        }
        let output = cmd
            .output()
            .with_context(|| format!("cannot run {}", helm.display()))?;
        if !output.status.success() {
            bail!(
                "helm template {chart} failed: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        let yaml = String::from_utf8(output.stdout).context("helm printed non-UTF-8 output")?;
        let objects = parse_objects(&yaml, &args.namespace)
            .with_context(|| format!("cannot parse the {chart} chart's manifests"))?;
        out.push(Rendered {
            chart,
            yaml,
            objects,
        });
    }
    Ok(out)
}

/// Multi-document YAML to objects; empty documents are skipped. Objects without a
/// namespace get `namespace` (helm leaves it to the client, like kubectl -n).
pub fn parse_objects(yaml: &str, namespace: &str) -> Result<Vec<DynamicObject>> {
    use serde::Deserialize;
    let mut objects = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        let value = serde_json::Value::deserialize(doc)?;
        if value.is_null() {
            continue;
        }
        if value.get("kind").and_then(|k| k.as_str()).is_none() {
            bail!("a manifest has no kind");
        }
        let mut obj: DynamicObject = serde_json::from_value(value)?;
        if obj.metadata.name.is_none() {
            bail!("a manifest has no metadata.name");
        }
        if obj.metadata.namespace.is_none() {
            obj.metadata.namespace = Some(namespace.to_string());
        }
        objects.push(obj);
    }
    Ok(objects)
}

/// `Kind/name` for messages.
pub fn describe(obj: &DynamicObject) -> String {
    let kind = obj.types.as_ref().map(|t| t.kind.as_str()).unwrap_or("?");
    format!("{kind}/{}", obj.metadata.name.as_deref().unwrap_or("?"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_values_are_routed_by_prefix() {
        let sets = vec![
            "cni.logLevel=debug".to_string(),
            "ztunnel.trustDomain=example.org".to_string(),
            "image.tag=dev".to_string(),
        ];
        assert_eq!(
            values_for("cni", &sets),
            ["logLevel=debug", "image.tag=dev"]
        );
        assert_eq!(
            values_for("ztunnel", &sets),
            ["trustDomain=example.org", "image.tag=dev"]
        );
    }

    #[test]
    fn parses_documents_and_defaults_namespace() {
        let yaml = "---\n# comment only\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: b\n  namespace: keep\n";
        let objs = parse_objects(yaml, "istio-system").unwrap();
        assert_eq!(objs.len(), 2);
        assert_eq!(objs[0].metadata.namespace.as_deref(), Some("istio-system"));
        assert_eq!(describe(&objs[0]), "ConfigMap/a");
        assert!(parse_objects("kind: X\nmetadata: {}\n", "n").is_err());
        assert!(parse_objects("- not a map\n", "n").is_err());
    }
}
