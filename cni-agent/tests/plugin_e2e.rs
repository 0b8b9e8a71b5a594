//! The real `istio-cni` binary against the agent's real servers: the netconf is the entry
//! our installer wrote (as libcni hands a chained plugin its entry), the ADD event must
//! reach the handler, and the plugin's log lines must come back out of our `tracing`.
//!
//! Needs `target/<profile>/istio-cni` (`make build` or `cargo build --bins`); without it
//! the test skips, except under CI where it fails.

mod common;

use cni_agent::install::conflist::PluginSettings;
use cni_agent::install::{InstallConfig, Installer};
use cni_agent::plugin_api::{self, event::CmdAddError};
use common::{capture_subscriber, Node};
use serde_json::{json, Value};
use shared_types::cni::CniPluginAddEvent;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;

fn plugin_binary() -> Option<PathBuf> {
    let path = test_support::workspace_binary("istio-cni");
    let built = path.is_file();
    let what = format!("{} not built (cargo build --bins)", path.display());
    test_support::prerequisite(built, &what).then_some(path)
}

/// Installs into `node` with the plugin pointed at `run_dir`, and returns the netconf
/// the runtime would give our plugin: our entry plus the list's name and version.
fn installed_netconf(node: &Node, run_dir: &Path, prev_result: Value) -> Value {
    node.load(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/install/conflist-insert/before"),
    );
    let installer = Installer::new(InstallConfig {
        conf_dir: node.conf_dir.clone(),
        bin_dir: node.bin_dir.clone(),
        plugin_source: node.plugin_source.clone(),
        owned_config: None,
        settings: PluginSettings {
            log_level: "debug".into(),
            run_dir: run_dir.to_path_buf(),
            exclude_namespaces: vec!["kube-system".into()],
            system_namespace: "istio-system".into(),
        },
    });
    installer.install().unwrap();
    let list: Value =
        serde_json::from_slice(&std::fs::read(node.conf_dir.join("10-calico.conflist")).unwrap())
            .unwrap();
    let mut entry = list["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["type"] == "istio-cni")
        .unwrap()
        .clone();
    entry["cniVersion"] = list["cniVersion"].clone();
    entry["name"] = list["name"].clone();
    entry["prevResult"] = prev_result;
    entry
}

struct PluginRun {
    success: bool,
    stdout: Value,
}

/// One pod to ADD: container id, pod name, pod UID.
struct Pod(&'static str, &'static str, &'static str);

/// Runs the plugin for `pod` in namespace `shop` as a runtime would (env + stdin).
async fn run_plugin(binary: &Path, netconf: &Value, pod: Pod) -> PluginRun {
    let Pod(container_id, name, uid) = pod;
    let mut child = tokio::process::Command::new(binary)
        .env_clear()
        .env("CNI_COMMAND", "ADD")
        .env("CNI_CONTAINERID", container_id)
        .env("CNI_NETNS", "/var/run/netns/cni-1")
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", "/opt/cni/bin")
        .env(
            "CNI_ARGS",
            format!(
                "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME={name};\
                 K8S_POD_INFRA_CONTAINER_ID={container_id};K8S_POD_UID={uid}"
            ),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(&serde_json::to_vec(netconf).unwrap())
        .await
        .unwrap();
    drop(stdin);
    let output = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("plugin hung")
        .unwrap();
    eprintln!(
        "plugin stderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    PluginRun {
        success: output.status.success(),
        stdout: serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
            panic!("stdout {:?}: {e}", String::from_utf8_lossy(&output.stdout))
        }),
    }
}

fn prev_result() -> Value {
    json!({
        "cniVersion": "0.3.1",
        "interfaces": [{"name": "eth0", "sandbox": "/var/run/netns/cni-1"}],
        "ips": [{"version": "4", "address": "10.1.0.5/24", "gateway": "10.1.0.1", "interface": 0}],
        "dns": {}
    })
}

#[tokio::test(flavor = "current_thread")]
async fn plugin_add_reaches_the_agent_and_its_logs_come_back() {
    let Some(binary) = plugin_binary() else {
        return;
    };
    let (capture, subscriber) = capture_subscriber();
    let _guard = tracing::subscriber::set_default(subscriber);
    let node = Node::new();
    let run_dir = node.root.path().join("run");
    let seen: Arc<Mutex<Vec<CniPluginAddEvent>>> = Default::default();
    let record = seen.clone();
    let handler = Arc::new(move |event: CniPluginAddEvent| {
        let record = record.clone();
        async move {
            let refuse = event.pod_uid == "refuse";
            record.lock().unwrap().push(event);
            if refuse {
                Err(CmdAddError::Failed("ztunnel has not acked the pod".into()))
            } else {
                Ok(())
            }
        }
    });
    let cancel = CancellationToken::new();
    plugin_api::start(&run_dir, handler, &common::access(), cancel.clone()).unwrap();
    let netconf = installed_netconf(&node, &run_dir, prev_result());

    let run = run_plugin(&binary, &netconf, Pod("abc123", "web-0", "uid-1")).await;
    assert!(run.success, "{}", run.stdout);
    assert_eq!(
        run.stdout["ips"][0]["address"], "10.1.0.5/24",
        "{}",
        run.stdout
    );
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 1);
        let event = &seen[0];
        assert_eq!(
            (event.pod_namespace.as_str(), event.pod_name.as_str()),
            ("shop", "web-0")
        );
        assert_eq!(event.netns, "/var/run/netns/cni-1");
        assert_eq!(event.container_id, "abc123");
        assert_eq!(event.pod_uid, "uid-1");
        assert_eq!(event.ips[0].address.to_string(), "10.1.0.5/24");
    }
    let plugin_lines: Vec<_> = capture
        .events()
        .into_iter()
        .filter(|e| e.target == "cni-plugin")
        .collect();
    assert!(!plugin_lines.is_empty(), "no plugin log line re-emitted");
    assert!(
        plugin_lines
            .iter()
            .all(|e| e.field("time").is_some_and(|t| t.ends_with('Z'))),
        "{plugin_lines:?}"
    );

    // The agent refuses: the plugin fails the ADD with our message and logs an error.
    let before = capture.events().len();
    let run = run_plugin(&binary, &netconf, Pod("def456", "web-1", "refuse")).await;
    assert!(!run.success);
    assert!(
        run.stdout
            .to_string()
            .contains("ztunnel has not acked the pod"),
        "{}",
        run.stdout
    );
    let errors = capture.events()[before..]
        .iter()
        .filter(|e| e.target == "cni-plugin" && e.level == tracing::Level::ERROR)
        .count();
    assert!(errors >= 1, "the plugin's error line was not re-emitted");
    cancel.cancel();
}
