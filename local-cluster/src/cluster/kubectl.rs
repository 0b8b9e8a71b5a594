//! The cluster through the real `kubectl` and `istioctl-lite`, from the control-plane
//! namespace: applying manifests, namespaces and labels, and the commands `make
//! demo-up` prints for a root shell.

use crate::objects;
use anyhow::{bail, Context, Result};
use serde_json::json;

use super::{LocalCluster, SYSTEM_NAMESPACE};

impl LocalCluster {
    /// A shell command line that runs kubectl against this cluster (ready to paste).
    pub fn kubectl_prefix(&self) -> String {
        format!(
            "ip netns exec {} kubectl --kubeconfig {}",
            self.control_plane.ns.name(),
            self.kubeconfig().display()
        )
    }

    /// Runs the real `kubectl` (inside the control-plane namespace); its stdout.
    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        self.run_with_kubeconfig("kubectl", args)
    }

    /// istioctl-lite with this cluster's kubeconfig, from the control-plane namespace
    /// (so it reaches istiod-lite at [`ISTIOD_ADDR`]).
    pub fn istioctl(&self, args: &[&str]) -> Result<String> {
        let binary = test_support::built_binary("istioctl-lite")?;
        self.run_with_kubeconfig(binary.to_str().context("path")?, args)
    }

    fn run_with_kubeconfig(&self, program: &str, args: &[&str]) -> Result<String> {
        let mut cmd = self.control_plane.ns.command(program);
        cmd.arg("--kubeconfig").arg(self.kubeconfig()).args(args);
        let out = cmd.output().with_context(|| format!("running {program}"))?;
        if !out.status.success() {
            bail!(
                "{program} {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Commands to try the cluster by hand, for a root shell: `make demo-up` prints
    /// them and a test runs them. The first defines the alias `k` (kubectl against
    /// this cluster).
    pub fn try_it_commands(&self) -> Result<Vec<String>> {
        let istioctl = test_support::built_binary("istioctl-lite")?;
        let kubeconfig = self.kubeconfig().display();
        let pod = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"s"},"spec":{"nodeName":"node-2","containers":[{"name":"s","image":"e2e-app:local","command":["e2e-app","sink","--listen","0.0.0.0:9000"]}]}}"#;
        Ok(vec![
            format!("alias k='{}'", self.kubectl_prefix()),
            "k get nodes,pods -A -o wide".into(),
            "k label namespace default istio.io/dataplane-mode=ambient".into(),
            format!("k apply -f - <<< '{pod}'"),
            "k logs s".into(),
            "k describe pod s".into(),
            "k get events -A".into(),
            // Where the CNI plugin's errors point to.
            format!("k -n {SYSTEM_NAMESPACE} logs ds/istio-cni-node"),
            format!(
                "ip netns exec {} {} --kubeconfig {kubeconfig} ztunnel-config workloads --ztunnel-admin 127.0.0.1:15000",
                self.ztunnel_netns(1)?,
                istioctl.display()
            ),
            format!(
                "ip netns exec {} {} --kubeconfig {kubeconfig} {}",
                self.control_plane.ns.name(),
                istioctl.display(),
                self.proxy_status_args().join(" ")
            ),
        ])
    }

    /// `kubectl apply -f -` with `manifest` on stdin.
    pub fn kubectl_apply(&self, manifest: &str) -> Result<String> {
        self.apply(None, manifest)
    }

    /// `kubectl -n namespace apply -f -`: objects without a namespace go there.
    pub fn kubectl_apply_in(&self, namespace: &str, manifest: &str) -> Result<String> {
        self.apply(Some(namespace), manifest)
    }

    fn apply(&self, namespace: Option<&str>, manifest: &str) -> Result<String> {
        use std::io::Write;
        let mut child = self
            .control_plane
            .ns
            .command("kubectl")
            .arg("--kubeconfig")
            .arg(self.kubeconfig())
            .args(namespace.map(|ns| ["-n", ns]).into_iter().flatten())
            .args(["apply", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        child
            .stdin
            .take()
            .context("stdin")?
            .write_all(manifest.as_bytes())?;
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!(
                "kubectl apply failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    pub fn create_namespace(&self, name: &str, labels: &[(&str, &str)]) -> Result<()> {
        self.api()
            .post("/api/v1/namespaces", &objects::namespace(name, labels))?;
        Ok(())
    }

    /// Sets (or with `None` removes) a namespace label.
    pub fn label_namespace(&self, name: &str, key: &str, value: Option<&str>) -> Result<()> {
        let patch = json!({"metadata": {"labels": {key: value}}});
        self.api()
            .merge_patch(&format!("/api/v1/namespaces/{name}"), &patch)?;
        Ok(())
    }
}
