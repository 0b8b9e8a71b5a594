//! `precheck`: node facts the agent depends on (iptables backend, netns, capabilities,
//! CNI directories and configs) and cluster facts (API version, existing installs,
//! namespaces labelled for both sidecars and ambient, Istio's IST0123).

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Result};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams};
use serde::Serialize;
use shared_types::constants::{DATAPLANE_MODE_AMBIENT, DATAPLANE_MODE_LABEL};

use crate::charts::{charts_dir, find_on_path};
use crate::cli::{Global, Output, PrecheckArgs};
use crate::crds;
use crate::kubeclient;
use crate::output::print_structured;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Ok,
    Warning,
    Error,
}

#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub level: Level,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

fn ok(message: impl Into<String>) -> Check {
    Check {
        level: Level::Ok,
        message: message.into(),
        fix: None,
    }
}
fn warn(message: impl Into<String>, fix: impl Into<String>) -> Check {
    Check {
        level: Level::Warning,
        message: message.into(),
        fix: Some(fix.into()),
    }
}
fn error(message: impl Into<String>, fix: impl Into<String>) -> Check {
    Check {
        level: Level::Error,
        message: message.into(),
        fix: Some(fix.into()),
    }
}

/// What precheck found: the checks, and the CRD table.
#[derive(Debug, Serialize)]
struct Report {
    checks: Vec<Check>,
    crds: Vec<crds::Row>,
}

pub async fn run(global: &Global, args: &PrecheckArgs) -> Result<()> {
    let mut report = Report {
        checks: Vec::new(),
        crds: Vec::new(),
    };
    if !args.skip_node {
        report.checks.extend(node_checks(args));
    }
    if !args.skip_cluster {
        cluster_checks(global, args, &mut report).await;
    }
    if global.output == Output::Table {
        for c in &report.checks {
            let mark = match c.level {
                Level::Ok => "✔",
                Level::Warning => "⚠",
                Level::Error => "✘",
            };
            println!("{mark} {}", c.message);
            if let Some(fix) = &c.fix {
                println!("    fix: {fix}");
            }
        }
        if !report.crds.is_empty() {
            println!("\n{}", crds::table(&report.crds).trim_end());
        }
    } else {
        print_structured(global.output, &report)?;
    }
    let errors = report
        .checks
        .iter()
        .filter(|c| c.level == Level::Error)
        .count();
    if errors > 0 {
        bail!("precheck found {errors} error(s)");
    }
    Ok(())
}

pub fn node_checks(args: &PrecheckArgs) -> Vec<Check> {
    let mut out = iptables_checks();
    out.push(if Path::new("/proc/self/ns/net").exists() {
        ok("network namespaces supported (/proc/self/ns/net)")
    } else {
        error(
            "no /proc/self/ns/net: the kernel lacks network namespaces",
            "use a kernel with CONFIG_NET_NS",
        )
    });
    out.push(match Command::new("ip").args(["netns", "list"]).output() {
        Ok(o) if o.status.success() => ok("`ip netns` works"),
        _ => warn(
            "`ip netns` unavailable",
            "install iproute2 (only needed for debugging)",
        ),
    });
    let caps = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| cap_eff(&s));
    for (bit, name) in [(12, "CAP_NET_ADMIN"), (21, "CAP_SYS_ADMIN")] {
        out.push(match caps {
            Some(c) if c & (1u64 << bit) != 0 => ok(format!("{name} held by this process")),
            Some(_) => warn(
                format!("{name} missing in this process"),
                "run precheck as root on the node; the agent needs CAP_NET_ADMIN and CAP_SYS_ADMIN",
            ),
            None => warn("cannot read CapEff from /proc/self/status", "run on Linux"),
        });
    }
    for (dir, flag) in [
        (&args.cni_conf_dir, "--cni-conf-dir"),
        (&args.cni_bin_dir, "--cni-bin-dir"),
    ] {
        out.push(if dir.is_dir() {
            ok(format!("CNI directory {} exists", dir.display()))
        } else {
            error(
                format!("CNI directory {} missing", dir.display()),
                format!(
                    "install the primary CNI first, or point {flag} at your runtime's directory"
                ),
            )
        });
    }
    if args.cni_conf_dir.is_dir() {
        out.extend(cni_config_checks(&args.cni_conf_dir));
    }
    out
}

/// CapEff as a bit set.
pub fn cap_eff(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("CapEff:"))?;
    u64::from_str_radix(line.trim_start_matches("CapEff:").trim(), 16).ok()
}

fn count_rules(binary: &str) -> Option<usize> {
    let path = find_on_path(binary)?;
    let out = Command::new(path).output().ok()?;
    out.status.success().then(|| {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.starts_with("-A "))
            .count()
    })
}

fn iptables_checks() -> Vec<Check> {
    let backends: Vec<(&str, Option<usize>, bool)> = [
        ("nft", "iptables-nft-save"),
        ("legacy", "iptables-legacy-save"),
    ]
    .into_iter()
    .map(|(name, bin)| (name, count_rules(bin), find_on_path(bin).is_some()))
    .collect();
    let present: Vec<&str> = backends.iter().filter(|b| b.2).map(|b| b.0).collect();
    if present.is_empty() {
        if find_on_path("iptables").is_some() {
            return vec![ok(
                "iptables present (backend unknown: no iptables-nft-save/iptables-legacy-save)",
            )];
        }
        return vec![error(
            "no iptables binaries found",
            "install iptables (nft or legacy backend)",
        )];
    }
    let mut out = vec![ok(format!(
        "iptables backends present: {}",
        present.join(", ")
    ))];
    let with_rules: Vec<String> = backends
        .iter()
        .filter_map(|(name, rules, _)| {
            rules
                .filter(|n| *n > 0)
                .map(|n| format!("{name} ({n} rules)"))
        })
        .collect();
    match with_rules.len() {
        0 => out.push(warn(
            "no iptables rules readable in either backend",
            "run as root to read the rules; the agent uses the backend that holds the host's rules",
        )),
        1 => out.push(ok(format!("host rules live in {}", with_rules[0]))),
        _ => out.push(warn(
            format!("rules in both backends: {}", with_rules.join(", ")),
            "mixing nft and legacy iptables breaks redirection; make the node use one backend",
        )),
    }
    out
}

/// Primary configs (the runtime uses the first by name) and istio-cni entries.
pub fn cni_config_checks(dir: &Path) -> Vec<Check> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    files.retain(|p| {
        matches!(
            p.extension().and_then(|e| e.to_str()),
            Some("conf" | "conflist")
        )
    });
    files.sort();
    let mut out = Vec::new();
    let mut primaries = Vec::new();
    for (i, file) in files.iter().enumerate() {
        let Some(json) = std::fs::read_to_string(file)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        else {
            out.push(warn(
                format!("{} is not valid JSON", file.display()),
                "fix or remove it",
            ));
            continue;
        };
        let plugins: Vec<&serde_json::Value> = match json.get("plugins").and_then(|p| p.as_array())
        {
            Some(list) => list.iter().collect(),
            None => vec![&json],
        };
        let istio = plugins
            .iter()
            .filter(|p| p.get("type").and_then(|t| t.as_str()) == Some("istio-cni"))
            .count();
        if istio > 1 {
            out.push(error(
                format!("{} chains istio-cni {istio} times", file.display()),
                "remove the duplicate istio-cni entries (a stale install?)",
            ));
        } else if istio == 1 && i > 0 {
            out.push(warn(
                format!(
                    "{} chains istio-cni but is not the active (first) config",
                    file.display()
                ),
                "remove the stale file; the agent chains into the first config",
            ));
        }
        primaries.push(file.display().to_string());
    }
    match primaries.len() {
        0 => out.push(warn(
            format!("no CNI config in {}", dir.display()),
            "the primary CNI has not written its config yet; the agent waits for it",
        )),
        1 => out.push(ok(format!("one primary CNI config: {}", primaries[0]))),
        _ => out.push(warn(
            format!(
                "{} CNI configs; only the first is used: {}",
                primaries.len(),
                primaries.join(", ")
            ),
            "remove the unused configs so the runtime and the agent agree",
        )),
    }
    out
}

async fn cluster_checks(global: &Global, args: &PrecheckArgs, report: &mut Report) {
    let client = match kubeclient::client(global).await {
        Ok(c) => c,
        Err(e) => {
            report.checks.push(warn(
                format!("cluster checks skipped: {e:#}"),
                "pass --kubeconfig (or --skip-cluster)",
            ));
            return;
        }
    };
    let out = &mut report.checks;
    match client.apiserver_version().await {
        Ok(v) => out.push(ok(format!(
            "API server reachable, Kubernetes {}.{} ({})",
            v.major, v.minor, v.git_version
        ))),
        Err(e) => {
            out.push(error(
                format!("API server unreachable: {e}"),
                "check --kubeconfig/--context and the network",
            ));
            return;
        }
    }
    let daemonsets: Api<DaemonSet> = Api::all(client.clone());
    match daemonsets.list(&ListParams::default()).await {
        Ok(list) => {
            for name in ["istio-cni-node", "ztunnel"] {
                let found: Vec<String> = list
                    .items
                    .iter()
                    .filter(|d| d.metadata.name.as_deref() == Some(name))
                    .map(|d| d.metadata.namespace.clone().unwrap_or_default())
                    .collect();
                out.push(if found.is_empty() {
                    ok(format!("no existing DaemonSet {name}"))
                } else {
                    warn(
                        format!("DaemonSet {name} already exists in {}", found.join(", ")),
                        "install upgrades it in place; uninstall Istio's own first if it is not ours",
                    )
                });
            }
        }
        Err(e) => out.push(warn(
            format!("cannot list DaemonSets: {e}"),
            "grant list on apps/daemonsets",
        )),
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    match namespaces.list(&ListParams::default()).await {
        Ok(list) => {
            let both: Vec<String> = list
                .items
                .iter()
                .filter(|n| sidecar_and_ambient(n))
                .filter_map(|n| n.metadata.name.clone())
                .collect();
            out.push(if both.is_empty() {
                ok("no namespace labelled for both sidecar injection and ambient")
            } else {
                warn(
                    format!(
                        "IST0123: namespaces labelled for both sidecar injection and ambient: {}",
                        both.join(", ")
                    ),
                    "remove istio-injection / istio.io/rev or istio.io/dataplane-mode from them",
                )
            });
        }
        Err(e) => out.push(warn(
            format!("cannot list namespaces: {e}"),
            "grant list on namespaces",
        )),
    }
    let ours = charts_dir(args.charts_dir.as_deref()).and_then(|dir| crds::shipped(&dir));
    match ours {
        Ok(ours) => match crds::rows(&client, &ours).await {
            Ok(rows) => {
                report.checks.extend(crd_checks(&rows));
                report.crds = rows;
            }
            Err(e) => report.checks.push(warn(
                format!("cannot read CustomResourceDefinitions: {e:#}"),
                "grant get on apiextensions.k8s.io/customresourcedefinitions",
            )),
        },
        Err(e) => report.checks.push(warn(
            format!("CRD checks skipped: {e:#}"),
            "pass --charts-dir",
        )),
    }
}

/// The CRD table summed up: what install will add, and which CRD of another Helm
/// release (Istio's base chart) it would upgrade.
fn crd_checks(rows: &[crds::Row]) -> Vec<Check> {
    let named = |verdict: crds::Verdict| -> Vec<&str> {
        rows.iter()
            .filter(|r| r.verdict == verdict)
            .map(|r| r.name.as_str())
            .collect()
    };
    let mut out = Vec::new();
    let missing = named(crds::Verdict::Missing);
    if !missing.is_empty() {
        out.push(warn(
            format!("CRDs not installed: {}", missing.join(", ")),
            "install adds them (the base chart)",
        ));
    }
    for row in rows.iter().filter(|r| r.verdict == crds::Verdict::Older) {
        out.push(match &row.owner {
            Some(owner) => warn(
                format!("CRD {} of {owner} is older than ours: install upgrades it", row.name),
                format!(
                    "upgrade that release instead, or keep it with --set 'base.excludedCRDs={{{}}}'",
                    row.name
                ),
            ),
            None => ok(format!("CRD {} is older than ours: install upgrades it", row.name)),
        });
    }
    let kept = rows
        .iter()
        .filter(|r| matches!(r.verdict, crds::Verdict::Same | crds::Verdict::Newer))
        .count();
    if kept > 0 {
        out.push(ok(format!(
            "{kept} CRD(s) installed at our version or newer: kept"
        )));
    }
    out
}

pub fn sidecar_and_ambient(ns: &Namespace) -> bool {
    let Some(labels) = ns.metadata.labels.as_ref() else {
        return false;
    };
    let sidecar = labels.get("istio-injection").map(String::as_str) == Some("enabled")
        || labels.contains_key("istio.io/rev");
    let ambient =
        labels.get(DATAPLANE_MODE_LABEL).map(String::as_str) == Some(DATAPLANE_MODE_AMBIENT);
    sidecar && ambient
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cap_eff() {
        let caps = cap_eff("Name:\tx\nCapEff:\t0000000000201000\n").unwrap();
        assert!(caps & (1 << 12) != 0 && caps & (1 << 21) != 0);
        assert_eq!(cap_eff("nothing"), None);
    }

    #[test]
    fn cni_configs_conflicts() {
        let dir = tempfile::tempdir().unwrap();
        let levels = |d: &Path| {
            cni_config_checks(d)
                .into_iter()
                .map(|c| c.level)
                .collect::<Vec<_>>()
        };
        assert_eq!(levels(dir.path()), [Level::Warning]);
        std::fs::write(
            dir.path().join("10-kindnet.conflist"),
            r#"{"plugins":[{"type":"ptp"},{"type":"istio-cni"},{"type":"istio-cni"}]}"#,
        )
        .unwrap();
        assert_eq!(levels(dir.path()), [Level::Error, Level::Ok]);
        std::fs::write(
            dir.path().join("10-kindnet.conflist"),
            r#"{"plugins":[{"type":"ptp"},{"type":"istio-cni"}]}"#,
        )
        .unwrap();
        std::fs::write(dir.path().join("20-old.conf"), r#"{"type":"istio-cni"}"#).unwrap();
        assert_eq!(levels(dir.path()), [Level::Warning, Level::Warning]);
    }

    #[test]
    fn ist0123_needs_both_labels() {
        let ns = |labels: serde_json::Value| -> Namespace {
            serde_json::from_value(serde_json::json!({"metadata": {"name": "x", "labels": labels}}))
                .unwrap()
        };
        assert!(sidecar_and_ambient(&ns(
            serde_json::json!({"istio-injection": "enabled", DATAPLANE_MODE_LABEL: "ambient"})
        )));
        assert!(sidecar_and_ambient(&ns(
            serde_json::json!({"istio.io/rev": "canary", DATAPLANE_MODE_LABEL: "ambient"})
        )));
        assert!(!sidecar_and_ambient(&ns(
            serde_json::json!({DATAPLANE_MODE_LABEL: "ambient"})
        )));
    }
}
