//! Two dedicated-mode ztunnels ("VMs") in two namespaces joined by a dual-stack veth
//! pair,
//! configured only through Istio's environment variables and an Istio-format local
//! config. A's outbound TCP of both families is captured with `ztunnel capture apply`
//! (REDIRECT to 15001, skipping mark 0x539); B's ztunnel terminates HBONE on 15008.
//!
//! Used by the standalone tests, the standalone demo and the benchmarks.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::mesh;
use test_support::netns::{link_addrs, Netns};
use test_support::poll::wait_for;
use test_support::process::ChildGuard;

pub const CLIENT_IP: &str = "10.10.0.1";
pub const SERVER_IP: &str = "10.10.0.2";
/// The VMs are dual-stack: these are their IPv6 addresses.
pub const CLIENT_IP6: &str = "fd00:10:10::1";
pub const SERVER_IP6: &str = "fd00:10:10::2";
pub const SERVICE_VIP: &str = "10.96.0.10";
pub const CLIENT_PRINCIPAL: &str = "spiffe://cluster.local/ns/vms/sa/client";
pub const SERVER_PRINCIPAL: &str = "spiffe://cluster.local/ns/vms/sa/server";
/// B's sink (`e2e-app sink`) and echo (`e2e-app echo`) ports.
pub const SINK_PORT: u16 = 9000;
pub const ECHO_PORT: u16 = 9001;
/// Destination ports A never captures: the same servers reached directly, for
/// side-by-side comparisons.
pub const DIRECT_SINK_PORT: u16 = 9100;
pub const DIRECT_ECHO_PORT: u16 = 9101;

/// Istio's local-config format, as written for Istio's own ztunnel. `policies` is
/// a YAML block list (empty for none).
pub fn local_config(policies: &str) -> String {
    let policies = if policies.trim().is_empty() {
        "[]"
    } else {
        policies
    };
    let policies_sep = if policies.starts_with('-') { "\n" } else { "" };
    format!(
        r#"workloads:
- uid: Kubernetes//v1/VM/vms/client-vm
  name: client-vm
  namespace: vms
  serviceAccount: client
  workloadIps: ["{CLIENT_IP}", "{CLIENT_IP6}"]
  protocol: HBONE
  node: vm-a
- uid: Kubernetes//v1/VM/vms/server-vm
  name: server-vm
  namespace: vms
  serviceAccount: server
  workloadIps: ["{SERVER_IP}", "{SERVER_IP6}"]
  protocol: HBONE
  node: vm-b
  services:
    "vms/echo.vms.svc.cluster.local":
      80: {SINK_PORT}
services:
- name: echo
  namespace: vms
  hostname: echo.vms.svc.cluster.local
  vips: ["/{SERVICE_VIP}"]
  ports:
    80: {SINK_PORT}
policies: {policies_sep}{policies}
"#
    )
}

pub struct Standalone {
    // Fields drop in declaration order: processes, then namespaces, then files.
    pub apps: Vec<ChildGuard>,
    pub ztunnel_a: ChildGuard,
    pub ztunnel_b: ChildGuard,
    pub a: Netns,
    pub b: Netns,
    pub config: PathBuf,
    pub dir: tempfile::TempDir,
}

impl Standalone {
    /// Builds the topology; `tag` keeps namespace names unique per test.
    pub fn new(tag: &str) -> Result<Self> {
        Self::with_ztunnel_env(tag, &[])
    }

    /// [`Standalone::new`] with more environment for both ztunnels.
    pub fn with_ztunnel_env(tag: &str, ztunnel_env: &[(&str, &str)]) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let ca = dir.path().join("ca");
        mesh::ca_init(&ca)?;
        let config = dir.path().join("ztunnel-config.yaml");
        std::fs::write(&config, local_config(""))?;

        let a = Netns::new(&format!("{tag}a"))?;
        let b = Netns::new(&format!("{tag}b"))?;
        link_addrs(
            &a,
            &[&format!("{CLIENT_IP}/24"), &format!("{CLIENT_IP6}/64")],
            &b,
            &[&format!("{SERVER_IP}/24"), &format!("{SERVER_IP6}/64")],
        )?;
        // The VIP range is routed towards B, like a ClusterIP range: only capture
        // gives it meaning.
        let a_dev = veth_name(&a)?;
        a.exec(&["ip", "route", "add", "10.96.0.0/16", "dev", &a_dev])?;

        let ztunnel_b = mesh::start_dedicated_ztunnel_with(
            &b,
            "vms/server-vm/server",
            &ca,
            &config,
            ztunnel_env,
        )?;
        let ztunnel_a = mesh::start_dedicated_ztunnel_with(
            &a,
            "vms/client-vm/client",
            &ca,
            &config,
            ztunnel_env,
        )?;
        let ztunnel = test_support::built_binary("ztunnel")?;
        let (direct_sink, direct_echo) =
            (DIRECT_SINK_PORT.to_string(), DIRECT_ECHO_PORT.to_string());
        let capture = [
            ztunnel.to_str().context("path")?,
            "capture",
            "apply",
            "--exclude-port",
            &direct_sink,
            "--exclude-port",
            &direct_echo,
            "--exclude-port",
            "5202",
        ];
        a.exec(&capture)?;
        a.exec(&[&capture[..], &["--ipv6"]].concat())?;

        let app = test_support::built_binary("e2e-app")?;
        let mut apps = Vec::new();
        for (mode, port) in [
            ("sink", SINK_PORT),
            ("echo", ECHO_PORT),
            ("sink", DIRECT_SINK_PORT),
            ("echo", DIRECT_ECHO_PORT),
        ] {
            let mut cmd = b.command(app.to_str().context("path")?);
            // `[::]`: both families (the apps report IPv4 peers unmapped).
            cmd.args([mode, "--listen", &format!("[::]:{port}")]);
            apps.push(ChildGuard::spawn(
                &format!("{mode}{port}-{}", b.name()),
                cmd,
            )?);
        }
        let topology = Standalone {
            apps,
            ztunnel_a,
            ztunnel_b,
            a,
            b,
            config,
            dir,
        };
        wait_for("the server apps", Duration::from_secs(10), || {
            topology.send(&format!("{SERVER_IP}:{SINK_PORT}"), 1).ok()
        })?;
        Ok(topology)
    }

    /// Runs `e2e-app send` in A; returns the sink's JSON answer.
    pub fn send(&self, target: &str, bytes: u64) -> Result<serde_json::Value> {
        mesh::send_from(&self.a, target, bytes)
    }

    /// Rewrites the local config with `policies` (YAML list), write-then-rename as
    /// editors and ConfigMap updates do.
    pub fn set_policies(&self, policies: &str) -> Result<()> {
        self.set_config(&local_config(policies))
    }

    /// Replaces the whole local config (both ztunnels read it), write-then-rename, and
    /// returns once both have read it (valid or not): a test that sends next is routed
    /// by the new config, not racing the file watch.
    pub fn set_config(&self, yaml: &str) -> Result<()> {
        if std::fs::read(&self.config).is_ok_and(|current| current == yaml.as_bytes()) {
            return Ok(()); // nothing to reload
        }
        let before = self.config_loads()?;
        mesh_runtime::fs::write_atomic(&self.config, yaml.as_bytes(), 0o644)?;
        wait_for(
            "both ztunnels to read the new local config",
            Duration::from_secs(10),
            || {
                let now = self.config_loads().ok()?;
                (now[0] > before[0] && now[1] > before[1]).then_some(())
            },
        )
    }

    /// How many times each ztunnel (A, B) has read the local config, whether it took
    /// it or refused it.
    fn config_loads(&self) -> Result<[f64; 2]> {
        Ok([mesh::config_loads(&self.a)?, mesh::config_loads(&self.b)?])
    }
}

/// The name of the (only) veth interface in `ns`.
pub fn veth_name(ns: &Netns) -> Result<String> {
    let out = ns.stdout(&["ip", "-o", "link", "show", "type", "veth"])?;
    out.split(':')
        .nth(1)
        .map(|name| name.trim().split('@').next().unwrap_or_default().to_owned())
        .filter(|name| !name.is_empty())
        .context("no veth interface")
}
