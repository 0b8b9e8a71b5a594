//! The `cni-agent` binary as a DaemonSet runs it, pointed at temp dirs by flags: it
//! installs, serves, becomes ready, and on SIGTERM leaves the chain entry in place
//! (fail closed) unless told to uninstall.

mod common;

use common::{exchange, Node};
use shared_types::cni::AmbientEnablementState;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use test_support::poll::eventually;
use test_support::process::ChildGuard;
use tokio::net::{TcpStream, UnixStream};

const WAIT: Duration = Duration::from_secs(20);

struct Agent {
    node: Node,
    run_dir: PathBuf,
    port: u16,
    child: ChildGuard,
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

fn start(name: &str, extra: &[&str]) -> Agent {
    let node = Node::new();
    node.load(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/install/conflist-insert/before"),
    );
    let run_dir = node.root.path().join("run");
    let port = free_port();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cni-agent"));
    // These tests cover the installer and sockets: no cluster, so no enrollment engine.
    cmd.env("RUST_LOG", "debug")
        .env("AMBIENT_ENABLED", "false")
        .arg("--cni-conf-dir")
        .arg(&node.conf_dir)
        .arg("--cni-bin-dir")
        .arg(&node.bin_dir)
        .arg("--run-dir")
        .arg(&run_dir)
        .arg("--plugin-binary")
        .arg(&node.plugin_source)
        .arg("--health-port")
        .arg(port.to_string())
        .args(extra);
    let child = ChildGuard::spawn(name, cmd).unwrap();
    Agent {
        node,
        run_dir,
        port,
        child,
    }
}

impl Agent {
    async fn probe(&self, path: &str) -> Option<u16> {
        let stream = TcpStream::connect(("127.0.0.1", self.port)).await.ok()?;
        Some(exchange(stream, "GET", path, b"").await.status)
    }

    async fn wait_ready(&self) {
        let deadline = tokio::time::Instant::now() + WAIT;
        while self.probe("/readyz").await != Some(200) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "agent never ready:\n{}",
                self.child.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn primary(&self) -> String {
        std::fs::read_to_string(self.node.conf_dir.join("10-calico.conflist")).unwrap()
    }

    fn plugin(&self) -> PathBuf {
        self.node.bin_dir.join("istio-cni")
    }

    fn terminate(&mut self) {
        self.child.signal(libc::SIGTERM);
        let status = self.child.wait_timeout(WAIT);
        assert!(
            status.is_some_and(|s| s.success()),
            "{status:?}\n{}",
            self.child.log()
        );
    }
}

#[tokio::test]
async fn installs_serves_and_leaves_the_entry_on_sigterm() {
    let mut agent = start("agent-leave", &[]);
    agent.wait_ready().await;
    assert_eq!(agent.probe("/healthz").await, Some(200));
    assert!(
        agent.primary().contains("\"istio-cni\""),
        "{}",
        agent.primary()
    );
    assert!(agent.plugin().is_file());
    let state = std::fs::read(agent.run_dir.join("ambient-enablement.json")).unwrap();
    let state = AmbientEnablementState::parse(&state).unwrap();
    assert!(state.ambient_namespaces.is_empty());
    assert_eq!(state.excluded_namespaces, ["kube-system"]);

    // Until enrollment exists every pod is admitted.
    let stream = UnixStream::connect(agent.run_dir.join("pluginevent.sock"))
        .await
        .unwrap();
    let body = br#"{"Netns":"/proc/1/ns/net","PodName":"a","PodNamespace":"b","IPs":null}"#;
    assert_eq!(exchange(stream, "POST", "/cmdadd", body).await.status, 200);

    agent.terminate();
    assert!(agent.primary().contains("\"istio-cni\""), "entry must stay");
    assert!(agent.plugin().is_file(), "binary must stay");
    assert!(agent
        .child
        .log()
        .contains("leaving istio-cni in the CNI chain"));
}

#[tokio::test]
async fn uninstalls_on_sigterm_when_asked() {
    let mut agent = start("agent-uninstall", &["--uninstall-on-exit"]);
    agent.wait_ready().await;
    assert!(agent.primary().contains("\"istio-cni\""));
    agent.terminate();
    assert!(
        !agent.primary().contains("istio-cni"),
        "{}",
        agent.primary()
    );
    assert!(!agent.plugin().exists());
}

#[tokio::test]
async fn repairs_while_running() {
    let mut agent = start("agent-repair", &["--plugin-log-level", "debug"]);
    agent.wait_ready().await;
    let original = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata/install/conflist-insert/before/10-calico.conflist"),
    )
    .unwrap();
    std::fs::write(agent.node.conf_dir.join("10-calico.conflist"), original).unwrap();
    let primary = agent.node.conf_dir.join("10-calico.conflist");
    // On a timeout the agent's log is printed (its guard drops while panicking).
    eventually("the new plugin log level in the chain", WAIT, || {
        std::fs::read_to_string(&primary)
            .is_ok_and(|t| t.contains("\"plugin_log_level\": \"debug\""))
    })
    .await;
    agent.terminate();
}
