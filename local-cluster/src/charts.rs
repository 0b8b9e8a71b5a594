//! What the Helm charts ask of the binaries: the manifests `istioctl-lite install`
//! applies, each workload container's image and command, the environment names it
//! sets, and the environment names the binary says it reads (`--help`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use serde_json::Value;

use crate::images;
use test_support::built_binary as binary;

/// The objects `istioctl-lite install --set <sets>` would apply, in its order.
pub fn install_manifests(sets: &[&str]) -> Result<Vec<Value>> {
    let mut cmd = Command::new(binary("istioctl-lite")?);
    cmd.args(["install", "--dry-run", "--charts-dir"])
        .arg(charts_dir());
    for set in sets {
        cmd.args(["--set", set]);
    }
    let out = cmd
        .output()
        .context("running istioctl-lite install --dry-run")?;
    if !out.status.success() {
        bail!(
            "istioctl-lite install --dry-run {sets:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let yaml = String::from_utf8(out.stdout).context("non-UTF-8 manifests")?;
    let mut objects = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&yaml) {
        let value = Value::deserialize(doc).context("rendered YAML")?;
        if !value.is_null() {
            objects.push(value);
        }
    }
    Ok(objects)
}

/// The charts the cluster installs: the repository's (`manifests/charts`), or with
/// `MESH_CHARTS=packaged` the archives `make charts` wrote (`target/charts`, the
/// image's digest pinned), unpacked as `helm install <archive>` reads them. CI
/// installs the packaged ones.
pub fn charts_dir() -> std::path::PathBuf {
    match std::env::var("MESH_CHARTS").as_deref() {
        Ok("packaged") => packaged_charts_dir(&packaged_charts_out())
            .unwrap_or_else(|e| panic!("MESH_CHARTS=packaged: {e:#}")),
        Ok("") | Ok("source") | Err(_) => source_charts_dir(),
        Ok(other) => panic!("MESH_CHARTS={other:?}: want packaged or source"),
    }
}

/// The repository's charts.
pub fn source_charts_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/charts")
}

/// Where `make charts` writes the archives: `CHARTS_OUT`, else `target/charts`.
pub fn packaged_charts_out() -> std::path::PathBuf {
    match std::env::var_os("CHARTS_OUT") {
        Some(dir) => dir.into(),
        None => images::image_dir()
            .parent()
            .map(|target| target.join("charts"))
            .unwrap_or_else(|| "target/charts".into()),
    }
}

/// The chart archives in `out` (`<chart>-<version>.tgz`), unpacked once per content
/// under `out/unpacked/<sha256 of the archives>`: a charts directory as
/// `istioctl-lite install --charts-dir` takes it.
pub fn packaged_charts_dir(out: &Path) -> Result<std::path::PathBuf> {
    use sha2::{Digest, Sha256};
    let mut archives: Vec<std::path::PathBuf> = std::fs::read_dir(out)
        .with_context(|| format!("reading {} (make charts writes it)", out.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "tgz"))
        .collect();
    archives.sort();
    if archives.is_empty() {
        bail!("no chart archive in {}: run make charts", out.display());
    }
    let mut hash = Sha256::new();
    for a in &archives {
        hash.update(std::fs::read(a)?);
    }
    let dir = out.join("unpacked").join(format!("{:x}", hash.finalize()));
    if dir.is_dir() {
        return Ok(dir);
    }
    let staging = out
        .join("unpacked")
        .join(format!(".{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging)?;
    for a in &archives {
        // Each archive holds one directory named after its chart.
        let status = Command::new("tar")
            .args(["--extract", "--gzip", "--no-same-owner", "--file"])
            .arg(a)
            .arg("--directory")
            .arg(&staging)
            .status()
            .context("running tar")?;
        if !status.success() {
            let _ = std::fs::remove_dir_all(&staging);
            bail!("unpacking {}: tar failed", a.display());
        }
    }
    if std::fs::rename(&staging, &dir).is_err() {
        // Another process unpacked the same archives first.
        std::fs::remove_dir_all(&staging)?;
    }
    Ok(dir)
}

/// One container of a rendered workload, with the environment names it is given.
#[derive(Debug)]
pub struct RenderedContainer {
    /// `Kind/name` of the workload.
    pub workload: String,
    pub name: String,
    pub image: String,
    pub command: Option<String>,
    /// Every name set by `env`, and by `envFrom` through a rendered ConfigMap.
    pub env_names: BTreeSet<String>,
}

/// The containers (init containers too) of every workload in `objects`.
pub fn containers(objects: &[Value]) -> Result<Vec<RenderedContainer>> {
    let config_maps: BTreeMap<&str, &Value> = objects
        .iter()
        .filter(|o| o["kind"] == "ConfigMap")
        .filter_map(|o| Some((o["metadata"]["name"].as_str()?, &o["data"])))
        .collect();
    let mut out = Vec::new();
    for workload in objects {
        let kind = workload["kind"].as_str().unwrap_or_default();
        if !matches!(kind, "DaemonSet" | "Deployment" | "StatefulSet" | "Job") {
            continue;
        }
        let spec = &workload["spec"]["template"]["spec"];
        let all = ["initContainers", "containers"]
            .iter()
            .flat_map(|k| spec[k].as_array().into_iter().flatten());
        for c in all {
            let mut env_names: BTreeSet<String> = c["env"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|e| e["name"].as_str().map(str::to_owned))
                .collect();
            for source in c["envFrom"].as_array().into_iter().flatten() {
                let Some(name) = source["configMapRef"]["name"].as_str() else {
                    bail!("{kind} envFrom other than a chart ConfigMap: {source}");
                };
                let Some(data) = config_maps.get(name) else {
                    bail!("{kind} envFrom names ConfigMap {name}, which the charts do not render");
                };
                let prefix = source["prefix"].as_str().unwrap_or_default();
                let keys = data.as_object().into_iter().flatten().map(|(k, _)| k);
                env_names.extend(keys.map(|k| format!("{prefix}{k}")));
            }
            out.push(RenderedContainer {
                workload: format!(
                    "{kind}/{}",
                    workload["metadata"]["name"].as_str().unwrap_or_default()
                ),
                name: c["name"].as_str().unwrap_or_default().to_owned(),
                image: c["image"].as_str().unwrap_or_default().to_owned(),
                command: c["command"][0].as_str().map(str::to_owned),
                env_names,
            });
        }
    }
    Ok(out)
}

/// The environment a binary says it reads: clap's `[env: NAME=...]` for each flag,
/// and its `Environment also read:` line (names, or prefixes ending in `*`).
#[derive(Debug, Default)]
pub struct EnvContract {
    names: BTreeSet<String>,
    prefixes: Vec<String>,
}

impl EnvContract {
    pub fn of_binary(program: &Path) -> Result<Self> {
        let out = Command::new(program)
            .arg("--help")
            .output()
            .with_context(|| format!("running {} --help", program.display()))?;
        if !out.status.success() {
            bail!("{} --help failed", program.display());
        }
        Ok(Self::parse(&String::from_utf8_lossy(&out.stdout)))
    }

    pub fn parse(help: &str) -> Self {
        let mut contract = EnvContract::default();
        for piece in help.split("[env: ").skip(1) {
            let name: String = piece
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            contract.names.insert(name);
        }
        for line in help.lines() {
            let Some(list) = line.trim().strip_prefix("Environment also read:") else {
                continue;
            };
            for word in list.split(',').map(str::trim).filter(|w| !w.is_empty()) {
                match word.strip_suffix('*') {
                    Some(prefix) => contract.prefixes.push(prefix.to_owned()),
                    None => {
                        contract.names.insert(word.to_owned());
                    }
                }
            }
        }
        contract
    }

    pub fn reads(&self, name: &str) -> bool {
        self.names.contains(name) || self.prefixes.iter().any(|p| name.starts_with(p.as_str()))
    }
}

/// Every environment name the rendered containers set that their binary does not
/// read, as `Kind/name container: NAME (binary)` lines.
pub fn unread_env(objects: &[Value]) -> Result<Vec<String>> {
    let mut contracts: BTreeMap<std::path::PathBuf, EnvContract> = BTreeMap::new();
    let mut unread = Vec::new();
    for c in containers(objects)? {
        let program = images::program_for(&c.image, c.command.as_deref())
            .with_context(|| format!("{} container {}", c.workload, c.name))?;
        if !contracts.contains_key(&program) {
            contracts.insert(program.clone(), EnvContract::of_binary(&program)?);
        }
        let contract = &contracts[&program];
        let binary = program.file_name().unwrap_or_default().to_string_lossy();
        unread.extend(
            c.env_names
                .iter()
                .filter(|n| !contract.reads(n))
                .map(|n| format!("{} container {}: {n} ({binary})", c.workload, c.name)),
        );
    }
    Ok(unread)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn help_lists_flag_env_and_the_extra_line() {
        let help =
            "Options:\n      --mode <MODE>  mode [env: PROXY_MODE=] [default: shared]\n      \
                    --x <X>  [env: X_Y=abc]\n\nEnvironment also read: RUST_LOG, ISTIO_META_*\n";
        let c = EnvContract::parse(help);
        assert!(c.reads("PROXY_MODE") && c.reads("X_Y") && c.reads("RUST_LOG"));
        assert!(c.reads("ISTIO_META_CLUSTER_ID"));
        assert!(!c.reads("POD_NAME") && !c.reads("ISTIO_META"));
    }
}
