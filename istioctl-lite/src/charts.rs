//! Renders the repository's charts with `helm template`, so install and uninstall
//! work from the very manifests Helm users get (no second copy).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use kube::api::DynamicObject;

use crate::cli::ChartArgs;

/// One chart of the repository.
pub struct Chart {
    /// Directory under the charts dir (the chart's name).
    pub dir: &'static str,
    /// Helm release name (Istio's).
    pub release: &'static str,
    /// `--set PREFIX.KEY=V` targets this chart only.
    pub prefix: &'static str,
}

/// The charts, in install order: the CRDs, then the control plane (the CA ztunnel
/// needs), then the node agent, then ztunnel.
pub const CHARTS: [Chart; 4] = [
    Chart {
        dir: BASE,
        release: "istio-base",
        prefix: "base",
    },
    Chart {
        dir: "istiod-lite",
        release: "istiod",
        prefix: "istiod",
    },
    Chart {
        dir: "cni",
        release: "istio-cni",
        prefix: "cni",
    },
    Chart {
        dir: "ztunnel",
        release: "ztunnel",
        prefix: "ztunnel",
    },
];

/// The CRDs' chart directory (`Rendered::chart`).
pub const BASE: &str = "base";

/// The node agent's chart directory (`Rendered::chart`).
pub const CNI: &str = "cni";

/// The control plane chart's directory (`Rendered::chart`).
pub const CONTROL_PLANE: &str = "istiod-lite";

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
            CHARTS
                .iter()
                .all(|c| dir.join(c.dir).join("Chart.yaml").is_file())
        })
        .context("cannot find the charts (base, istiod-lite, cni, ztunnel); pass --charts-dir")
}

/// The top-level value names a chart's values.schema.json allows, or `None` when it
/// has no schema that rejects unknown keys (then it accepts anything).
pub fn declared_values(chart_dir: &Path) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(chart_dir.join("values.schema.json")).ok()?;
    let schema: serde_json::Value = serde_json::from_str(&text).ok()?;
    if schema.get("additionalProperties") != Some(&serde_json::Value::Bool(false)) {
        return None;
    }
    let props = schema.get("properties")?.as_object()?;
    Some(props.keys().cloned().collect())
}

/// The first segment of a `--set` key (`image` of `image.tag=x`, `env` of
/// `env.A\.B=1`, `tolerations` of `tolerations[0].key=k`).
fn top_level_key(set: &str) -> String {
    let mut key = String::new();
    let mut chars = set.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => key.extend(chars.next()),
            '.' | '[' | '=' => break,
            c => key.push(c),
        }
    }
    key
}

/// `--set` values meant for the chart with `prefix`: `istiod.`/`cni.`/`ztunnel.`
/// targets one chart; anything else goes to every chart whose values declare its
/// first segment (`declared`: prefix to top-level names, `None` = accepts anything),
/// or to all of them when none does (so helm's schema error names the key).
pub fn values_for(
    prefix: &str,
    sets: &[String],
    declared: &dyn Fn(&str) -> Option<Vec<String>>,
) -> Vec<String> {
    sets.iter()
        .filter_map(|s| {
            for other in &CHARTS {
                if let Some(rest) = s.strip_prefix(&format!("{}.", other.prefix)) {
                    return (other.prefix == prefix).then(|| rest.to_string());
                }
            }
            let key = top_level_key(s);
            let takes = |p: &str| declared(p).is_none_or(|names| names.contains(&key));
            let anyone = CHARTS.iter().any(|c| takes(c.prefix));
            (takes(prefix) || !anyone).then(|| s.clone())
        })
        .collect()
}

/// Runs `helm template` for every chart (install order) and parses the objects.
pub fn render(args: &ChartArgs) -> Result<Vec<Rendered>> {
    let helm = find_helm()?;
    let dir = charts_dir(args.charts_dir.as_deref())?;
    let declared = |prefix: &str| {
        let chart = CHARTS.iter().find(|c| c.prefix == prefix)?;
        declared_values(&dir.join(chart.dir))
    };
    let mut out = Vec::new();
    for chart in &CHARTS {
        let mut cmd = Command::new(&helm);
        cmd.arg("template")
            .arg(chart.release)
            .arg(dir.join(chart.dir))
            .args(["--namespace", &args.namespace]);
        for value in values_for(chart.prefix, &args.set, &declared) {
            cmd.args(["--set", &value]);
        }
        let output = cmd
            .output()
            .with_context(|| format!("cannot run {}", helm.display()))?;
        if !output.status.success() {
            bail!(
                "helm template {} failed: {}",
                chart.dir,
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        let yaml = String::from_utf8(output.stdout).context("helm printed non-UTF-8 output")?;
        let objects = parse_objects(&yaml, &args.namespace)
            .with_context(|| format!("cannot parse the {} chart's manifests", chart.dir))?;
        out.push(Rendered {
            chart: chart.dir,
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
    fn set_values_are_routed_by_prefix_then_by_schema() {
        let sets = vec![
            "cni.logLevel=debug".to_string(),
            "ztunnel.trustDomain=example.org".to_string(),
            "istiod.replicaCount=2".to_string(),
            "image.tag=dev".to_string(),
            "trustDomain=example.com".to_string(),
            "noSuchValue=1".to_string(),
        ];
        let declared = |prefix: &str| match prefix {
            "cni" => Some(vec!["image".to_string(), "logLevel".to_string()]),
            "ztunnel" => Some(vec!["image".to_string(), "trustDomain".to_string()]),
            _ => Some(vec!["image".to_string(), "trustDomain".to_string()]),
        };
        assert_eq!(
            values_for("cni", &sets, &declared),
            ["logLevel=debug", "image.tag=dev", "noSuchValue=1"]
        );
        assert_eq!(
            values_for("ztunnel", &sets, &declared),
            [
                "trustDomain=example.org",
                "image.tag=dev",
                "trustDomain=example.com",
                "noSuchValue=1"
            ]
        );
        assert_eq!(
            values_for("istiod", &sets, &declared),
            [
                "replicaCount=2",
                "image.tag=dev",
                "trustDomain=example.com",
                "noSuchValue=1"
            ]
        );
        // A chart without a strict schema takes every unprefixed value.
        let lax = |prefix: &str| (prefix != "cni").then(|| vec!["image".to_string()]);
        assert_eq!(
            values_for("cni", &["trustDomain=x".to_string()], &lax),
            ["trustDomain=x"]
        );
    }

    #[test]
    fn top_level_keys_follow_helm_set_syntax() {
        assert_eq!(top_level_key("image.tag=x"), "image");
        assert_eq!(top_level_key("logLevel=debug"), "logLevel");
        assert_eq!(top_level_key("tolerations[0].key=k"), "tolerations");
        assert_eq!(top_level_key("a\\.b.c=1"), "a.b");
    }

    #[test]
    fn the_repository_charts_declare_their_values() {
        let dir = charts_dir(None).unwrap();
        for chart in CHARTS.iter().filter(|c| c.dir != BASE) {
            let names = declared_values(&dir.join(chart.dir)).unwrap();
            assert!(names.iter().any(|n| n == "image"), "{}", chart.dir);
        }
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
