//! Installing the mesh on the cluster as a user does: `istioctl-lite install` from the
//! charts (with the CA Secret from the harness's CA), `uninstall`, and the check that
//! no node outside istiod-lite's pods holds the CA key.

use anyhow::{Context, Result};
use std::path::PathBuf;

use super::{tail, LocalCluster, SYSTEM_NAMESPACE};

impl LocalCluster {
    /// `istioctl-lite install` with `values`, as a user runs it (again: an upgrade):
    /// the CA Secret from the harness's CA (the plug-in CA flow, so tests know the
    /// root), then the charts, waiting for each workload's rollout.
    pub fn istioctl_install(&self, values: &[String]) -> Result<()> {
        self.create_ca_secret()?;
        self.istioctl_charts("install", values)
    }

    /// `istioctl-lite uninstall` (every chart's objects but the CA Secret).
    pub fn istioctl_uninstall(&self) -> Result<()> {
        self.istioctl_charts("uninstall", &[])
    }

    fn istioctl_charts(&self, verb: &str, values: &[String]) -> Result<()> {
        let charts = crate::charts::charts_dir();
        let mut args: Vec<String> = vec![
            verb.into(),
            "--charts-dir".into(),
            charts.to_string_lossy().into_owned(),
        ];
        if verb == "install" {
            args.extend(["--timeout".into(), "90s".into()]);
        }
        for v in values {
            args.extend(["--set".into(), v.clone()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.istioctl(&args).with_context(|| {
            let events = self.kubectl(&["get", "events", "-A"]).unwrap_or_default();
            let pods = self
                .kubectl(&["get", "pods", "-A", "-o", "wide"])
                .unwrap_or_default();
            format!("{pods}\n{events}\n{}", self.system_pod_logs())
        })?;
        Ok(())
    }

    /// Secret `cacerts` from the control plane's CA files, as `kubectl create secret
    /// generic cacerts --from-file=<dir>` makes it.
    fn create_ca_secret(&self) -> Result<()> {
        use base64::Engine as _;
        let mut data = serde_json::Map::new();
        for entry in std::fs::read_dir(&self.control_plane.ca_dir)? {
            let path = entry?.path();
            if let Some(name) = path.file_name().and_then(|n| n.to_str()) {
                let bytes = std::fs::read(&path)?;
                data.insert(
                    name.to_owned(),
                    base64::engine::general_purpose::STANDARD
                        .encode(bytes)
                        .into(),
                );
            }
        }
        self.api().create_if_absent(
            &format!("/api/v1/namespaces/{SYSTEM_NAMESPACE}/secrets"),
            &serde_json::json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "cacerts", "namespace": SYSTEM_NAMESPACE},
                "type": "Opaque", "data": data,
            }),
        )
    }

    /// Logs of the mesh's pods the kubelets run (the chart-run agent's), for failures.
    pub fn system_pod_logs(&self) -> String {
        let mut text = String::new();
        for k in self.kubelets.iter().flatten() {
            for (ns, name) in k
                .pod_names()
                .into_iter()
                .filter(|(ns, _)| ns == SYSTEM_NAMESPACE)
            {
                // A crashing container's words are in the instance before this one.
                let log = k
                    .log(&ns, &name)
                    .filter(|l| !l.trim().is_empty())
                    .or_else(|| k.container_log(&ns, &name, None, true))
                    .unwrap_or_default();
                text.push_str(&format!("--- {ns}/{name} ---\n{}\n", tail(&log, 40)));
            }
        }
        if let Some(services) = &self.services {
            text.push_str(&format!(
                "--- cluster DNS ---\n{}\n",
                tail(&services.dns.log(), 20)
            ));
        }
        text
    }

    /// Files under the nodes' directories, outside istiod-lite's own pods (their
    /// `cacerts` volume), that hold the mesh CA's key (by name or content). Empty is
    /// the point: no agent, ztunnel or other pod has it.
    pub fn node_files_with_ca_key(&self) -> Result<Vec<std::path::PathBuf>> {
        let key = std::fs::read_to_string(self.control_plane.ca_dir.join("ca-key.pem"))?;
        let istiod_pods: Vec<String> = self
            .api()
            .list(&format!(
                "/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods?labelSelector=app%3Distiod"
            ))?
            .iter()
            .filter_map(|p| p["metadata"]["uid"].as_str().map(str::to_owned))
            .collect();
        let mut found = Vec::new();
        for node in &self.nodes {
            let pods_dir = node.dir.join("pods");
            let istiods: Vec<PathBuf> = istiod_pods.iter().map(|uid| pods_dir.join(uid)).collect();
            for file in files_under(&node.dir)
                .into_iter()
                .filter(|f| !istiods.iter().any(|dir| f.starts_with(dir)))
            {
                let text = std::fs::read(&file).unwrap_or_default();
                if file.ends_with("ca-key.pem")
                    || String::from_utf8_lossy(&text).contains(key.trim())
                {
                    found.push(file);
                }
            }
        }
        Ok(found)
    }
}

/// Every regular file under `dir`, recursively (sockets and links skipped).
fn files_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        match entry.file_type() {
            Ok(t) if t.is_dir() => out.extend(files_under(&path)),
            Ok(t) if t.is_file() => out.push(path),
            _ => {}
        }
    }
    out
}
