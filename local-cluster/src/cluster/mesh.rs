//! The mesh's components on the cluster: each node's ztunnel (its namespace, admin
//! port, metrics, what it knows) and istiod-lite (its metrics, the flags that reach
//! it over XDS).

use crate::controllers;
use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::time::Duration;
use test_support::poll::wait_for;

use super::{LocalCluster, MeshInstall, ISTIOD_ADDR, ISTIOD_HOST, SYSTEM_NAMESPACE};

impl LocalCluster {
    /// Waits until node `node`'s ztunnel has learned (from Kubernetes) that the pod
    /// at `ip` takes HBONE. Between the agent's annotation and this moment a new
    /// connection to the pod still goes out as plain TCP, as with Istio.
    pub fn wait_ztunnel_sees_hbone(&self, node: u8, ip: &str, timeout: Duration) -> Result<()> {
        wait_for(
            &format!("node {node}'s ztunnel to see {ip} as HBONE"),
            timeout,
            || {
                let dump = self.ztunnel_get(node, "127.0.0.1:15000/config_dump").ok()?;
                let dump: Value = serde_json::from_str(&dump).ok()?;
                dump["workloads"]
                    .as_array()?
                    .iter()
                    .any(|w| {
                        w["protocol"] == "HBONE"
                            && w["workloadIps"]
                                .as_array()
                                .is_some_and(|ips| ips.iter().any(|i| i == ip))
                    })
                    .then_some(())
            },
        )
    }

    /// The network namespace node `node`'s ztunnel runs in: the node's when the
    /// harness runs it, else its pod's (the newest ready one while a rollout surges).
    pub fn ztunnel_netns(&self, node: u8) -> Result<String> {
        let node = self.node(node);
        if !matches!(self.install, MeshInstall::Charts(_)) {
            return Ok(node.ns.name().to_owned());
        }
        let pods = self.api().list(&format!(
            "/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods?labelSelector=app%3Dztunnel"
        ))?;
        let newest_ready = pods
            .iter()
            .filter(|p| p["spec"]["nodeName"] == node.name.as_str() && controllers::ready(p))
            .max_by_key(|p| {
                p["metadata"]["creationTimestamp"]
                    .as_str()
                    .map(str::to_owned)
            })
            .with_context(|| format!("no ready ztunnel pod on {}", node.name))?;
        let name = newest_ready["metadata"]["name"]
            .as_str()
            .unwrap_or_default();
        let handle = self
            .pod(SYSTEM_NAMESPACE, name)
            .with_context(|| format!("ztunnel pod {name} has no sandbox"))?;
        Ok(handle.netns)
    }

    /// `http://<addr_path>` fetched in node `node`'s ztunnel's namespace (its admin
    /// port listens on localhost only).
    pub fn ztunnel_get(&self, node: u8, addr_path: &str) -> Result<String> {
        let netns = self.ztunnel_netns(node)?;
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", &netns])
            .arg(test_support::built_binary("e2e-app")?)
            .args(["get", &format!("http://{addr_path}")])
            .output()?;
        if !out.status.success() {
            bail!(
                "GET {addr_path} in {netns}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `istioctl-lite proxy-status` as run from the control-plane namespace: istiod's
    /// Service by its name (the cluster's DNS) when installed from the charts, else
    /// the harness's Service address, checked against istiod's name.
    pub fn proxy_status_args(&self) -> Vec<String> {
        let mut args = vec!["proxy-status".to_owned()];
        args.extend(self.xds_args());
        args
    }

    /// istioctl-lite's flags to reach istiod over XDS from the control-plane
    /// namespace: none (its defaults, istiod's Service by name) when installed from
    /// the charts, else the harness's Service address checked against istiod's name.
    pub fn xds_args(&self) -> Vec<String> {
        if matches!(self.install, MeshInstall::Charts(_)) {
            return Vec::new();
        }
        ["--xds-address", ISTIOD_ADDR, "--xds-san", ISTIOD_HOST]
            .map(String::from)
            .to_vec()
    }

    /// Prometheus text of istiod-lite: replica 0's, or when installed from the charts
    /// every ready replica's one after the other (sums add up across replicas).
    pub fn istiod_metrics(&self) -> Result<String> {
        if !matches!(self.install, MeshInstall::Charts(_)) {
            return self.control_plane.istiod_metrics();
        }
        let pods = self.api().list(&format!(
            "/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods?labelSelector=app%3Distiod"
        ))?;
        let mut text = String::new();
        for ip in pods
            .iter()
            .filter(|p| controllers::ready(p))
            .filter_map(|p| p["status"]["podIP"].as_str())
        {
            text += &crate::mesh::http_get(
                &self.control_plane.ns,
                &format!("http://{ip}:15014/metrics"),
            )?;
        }
        Ok(text)
    }

    /// Prometheus text from node `node`'s ztunnel.
    pub fn ztunnel_metrics(&self, node: u8) -> Result<String> {
        self.ztunnel_get(node, "127.0.0.1:15020/metrics")
    }

    /// Waits until every node's ztunnel is ready (needs the agents' ZDS servers).
    pub fn wait_ztunnels_ready(&self, timeout: Duration) -> Result<()> {
        for node in &self.nodes {
            wait_for(
                &format!("ztunnel on {} to be ready", node.name),
                timeout,
                || {
                    self.ztunnel_get(node.index, "127.0.0.1:15021/healthz/ready")
                        .ok()
                        .map(drop)
                },
            )
            .with_context(|| format!("{}{}", node.logs(), self.system_pod_logs()))?;
        }
        Ok(())
    }
}
