//! Pods on the cluster: created through the API and run by the kubelet stand-ins,
//! their redirection annotation and in-netns rules, commands inside them, and the
//! test app's clients run from them.

use crate::kubelet::PodHandle;
use crate::objects;
use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::time::Duration;
use test_support::owner;
use test_support::poll::wait_for;
use test_support::process::ChildGuard;

use super::LocalCluster;

impl LocalCluster {
    /// Creates a pod on node `node` (1-based) running `argv` as service account `sa`.
    pub fn create_pod(
        &self,
        ns: &str,
        name: &str,
        node: u8,
        sa: &str,
        labels: &[(&str, &str)],
        argv: &[&str],
    ) -> Result<()> {
        let pod = objects::pod(ns, name, &self.node(node).name, sa, labels, argv);
        self.api()
            .post(&format!("/api/v1/namespaces/{ns}/pods"), &pod)?;
        Ok(())
    }

    pub fn delete_pod(&self, ns: &str, name: &str) -> Result<()> {
        self.api()
            .delete(&format!("/api/v1/namespaces/{ns}/pods/{name}"))
    }

    pub fn get_pod(&self, ns: &str, name: &str) -> Result<Value> {
        self.api()
            .get(&format!("/api/v1/namespaces/{ns}/pods/{name}"))
    }

    /// The kubelet's view of a running pod (namespace, IP, container pids).
    pub fn pod(&self, ns: &str, name: &str) -> Option<PodHandle> {
        self.kubelets.iter().flatten().find_map(|k| k.pod(ns, name))
    }

    /// What the pod's first container printed so far (`kubectl logs`).
    pub fn pod_log(&self, ns: &str, name: &str) -> Option<String> {
        self.kubelets.iter().flatten().find_map(|k| k.log(ns, name))
    }

    /// Waits until the pod runs and the API shows it Running with its IP.
    pub fn wait_pod_running(&self, ns: &str, name: &str, timeout: Duration) -> Result<PodHandle> {
        wait_for(&format!("pod {ns}/{name} to run"), timeout, || {
            let handle = self.pod(ns, name)?;
            let pod = self.get_pod(ns, name).ok()?;
            (pod["status"]["phase"] == "Running" && pod["status"]["podIP"] == handle.ip.as_str())
                .then_some(handle)
        })
        .with_context(|| self.diagnostics(ns, name))
    }

    /// The pod's `ambient.istio.io/redirection` annotation.
    pub fn redirection(&self, ns: &str, name: &str) -> Option<String> {
        let pod = self.get_pod(ns, name).ok()?;
        pod["metadata"]["annotations"]["ambient.istio.io/redirection"]
            .as_str()
            .map(str::to_owned)
    }

    /// Waits until the redirection annotation equals `want` (`None`: absent).
    pub fn wait_redirection(
        &self,
        ns: &str,
        name: &str,
        want: Option<&str>,
        timeout: Duration,
    ) -> Result<()> {
        wait_for(
            &format!("{ns}/{name} redirection={want:?}"),
            timeout,
            || (self.redirection(ns, name).as_deref() == want).then_some(()),
        )
        .with_context(|| self.diagnostics(ns, name))
    }

    /// Names of the pods of `namespace` (every node's).
    pub fn pod_names_in(&self, namespace: &str) -> Vec<String> {
        self.kubelets
            .iter()
            .flatten()
            .flat_map(|k| k.pod_names())
            .filter(|(ns, _)| ns == namespace)
            .map(|(_, name)| name)
            .collect()
    }

    /// Messages of the events recorded about a pod.
    pub fn pod_events(&self, ns: &str, name: &str) -> Result<Vec<(String, String)>> {
        let events = self
            .api()
            .list(&format!("/api/v1/namespaces/{ns}/events"))?;
        Ok(events
            .iter()
            .filter(|e| e["involvedObject"]["name"] == name)
            .map(|e| {
                let text = |k: &str| e[k].as_str().unwrap_or_default().to_owned();
                (text("reason"), text("message"))
            })
            .collect())
    }

    /// Runs `argv` inside the pod's namespace; its stdout.
    pub fn exec_in_pod(&self, ns: &str, name: &str, argv: &[&str]) -> Result<String> {
        let handle = self
            .pod(ns, name)
            .with_context(|| format!("pod {ns}/{name} is not running"))?;
        let program = resolve_program(argv.first().copied().unwrap_or_default());
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", &handle.netns, &program])
            .args(&argv[1..])
            .output()?;
        if !out.status.success() {
            bail!(
                "{argv:?} in {ns}/{name} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// How the pod's traffic is redirected, read from its netns: `"nftables"` (our
    /// `inet istio-ambient-nat` table), `"iptables"` (our `ISTIO_OUTPUT` chain) or `"none"`.
    pub fn redirection_of(&self, ns: &str, name: &str) -> Result<&'static str> {
        if self
            .exec_in_pod(ns, name, &["nft", "list", "tables"])?
            .contains("istio-ambient-nat")
        {
            return Ok("nftables");
        }
        let save = self.exec_in_pod(ns, name, &["iptables-save", "-t", "nat"])?;
        Ok(if save.contains(":ISTIO_OUTPUT") {
            "iptables"
        } else {
            "none"
        })
    }

    /// Starts `argv` as a background process inside the pod's namespace.
    pub fn spawn_in_pod(&self, ns: &str, name: &str, argv: &[&str]) -> Result<ChildGuard> {
        let handle = self
            .pod(ns, name)
            .with_context(|| format!("pod {ns}/{name} is not running"))?;
        let mut cmd = std::process::Command::new("ip");
        cmd.args([
            "netns",
            "exec",
            &handle.netns,
            &resolve_program(argv.first().copied().unwrap_or_default()),
        ])
        .args(&argv[1..])
        .env(owner::OWNER_ENV, owner::cluster_marker(&self.tag));
        ChildGuard::spawn_group(&format!("{}-exec-{ns}-{name}", self.tag), cmd)
    }

    /// `e2e-app ping` from a pod, in the background: one connection to an echo server
    /// at `target`, `count` round trips `interval_ms` apart; the process exits 3 if the
    /// connection closes before the last.
    pub fn spawn_ping(
        &self,
        (ns, from): (&str, &str),
        target: &str,
        count: u32,
        interval_ms: u32,
    ) -> Result<ChildGuard> {
        let (count, interval) = (count.to_string(), interval_ms.to_string());
        let argv = [
            "e2e-app",
            "ping",
            "--connect",
            target,
            "--count",
            &count,
            "--interval-ms",
            &interval,
        ];
        self.spawn_in_pod(ns, from, &argv)
    }

    /// `e2e-app send` from a pod; the sink's JSON answer.
    pub fn send(&self, ns: &str, from: &str, target: &str, bytes: u64) -> Result<Value> {
        let out = self.exec_in_pod(
            ns,
            from,
            &[
                "e2e-app",
                "send",
                "--connect",
                target,
                "--bytes",
                &bytes.to_string(),
            ],
        )?;
        Ok(serde_json::from_str(out.trim())?)
    }

    /// Waits until the kubelets finished tearing down deleted pods.
    pub fn settle(&self) {
        for k in self.kubelets.iter().flatten() {
            k.settle();
        }
    }
}

fn resolve_program(program: &str) -> String {
    let local = test_support::workspace_binary(program);
    if !program.contains('/') && local.exists() {
        return local.to_string_lossy().into_owned();
    }
    program.to_owned()
}
