//! The installer's watch against a live conf dir: another writer drops our entry or
//! our binary while the watch runs, and the watch puts them back; with no config at all
//! it waits (not ready) until the primary CNI writes one.

mod common;

use cni_agent::install::watch::{self, WatchSettings, READY_CNI_CONFIG};
use common::Node;
use mesh_runtime::readiness::Readiness;
use std::fs;
use std::path::Path;
use std::time::Duration;
use test_support::poll::eventually;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(10);

fn testdata(case: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/install")
        .join(case)
}

struct Running {
    readiness: Readiness,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), watch::WatchError>>,
}

fn start(node: &Node) -> Running {
    let readiness = Readiness::new();
    let cancel = CancellationToken::new();
    let task = tokio::spawn(watch::run(
        node.installer(None),
        readiness.clone(),
        WatchSettings::default(),
        cancel.clone(),
    ));
    Running {
        readiness,
        cancel,
        task,
    }
}

impl Running {
    async fn stop(self) {
        self.cancel.cancel();
        let ended = tokio::time::timeout(Duration::from_secs(5), self.task).await;
        assert!(matches!(ended, Ok(Ok(Ok(())))), "{ended:?}");
    }
}

#[tokio::test]
async fn repairs_a_config_rewritten_while_watching() {
    let node = Node::new();
    node.load(&testdata("conflist-insert").join("before"));
    let installer = node.installer(None);
    let running = start(&node);
    eventually("installed and ready", WAIT, || {
        installer.is_installed() && running.readiness.is_ready()
    })
    .await;

    // The primary CNI restarts and writes its config again, without us (in place,
    // not atomically, as some do).
    let primary = node.conf_dir.join("10-calico.conflist");
    let original = fs::read(testdata("conflist-insert").join("before/10-calico.conflist")).unwrap();
    fs::write(&primary, &original).unwrap();
    eventually("the chain repaired", WAIT, || installer.is_installed()).await;
    let golden = fs::read(testdata("conflist-insert").join("after/10-calico.conflist")).unwrap();
    assert_eq!(
        fs::read_to_string(&primary).unwrap(),
        String::from_utf8(golden).unwrap()
    );

    // Delete and re-create (another common pattern), twice in a burst.
    for _ in 0..2 {
        fs::remove_file(&primary).unwrap();
        fs::write(&primary, &original).unwrap();
    }
    eventually("the chain repaired after the burst", WAIT, || {
        installer.is_installed()
    })
    .await;

    // Someone removes the plugin binary.
    fs::remove_file(installer.plugin_path()).unwrap();
    eventually("the binary back", WAIT, || {
        installer.plugin_path().is_file()
    })
    .await;
    running.stop().await;
}

#[tokio::test]
async fn a_wrapped_conf_written_again_is_wrapped_again() {
    let node = Node::new();
    node.load(&testdata("conf-wrap").join("before"));
    let installer = node.installer(None);
    let running = start(&node);
    eventually("installed", WAIT, || installer.is_installed()).await;
    let conf = node.conf_dir.join("10-bridge.conf");
    assert!(!conf.exists());
    // The primary writes its `.conf` again: it sorts before our `.conflist`.
    fs::copy(testdata("conf-wrap").join("before/10-bridge.conf"), &conf).unwrap();
    eventually("the .conf folded into our conflist", WAIT, || {
        !conf.exists() && installer.is_installed()
    })
    .await;
    running.stop().await;
}

#[tokio::test]
async fn waits_for_the_primary_config_and_is_not_ready_until_then() {
    let node = Node::new();
    let installer = node.installer(None);
    let running = start(&node);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(running.readiness.pending(), [READY_CNI_CONFIG]);
    assert!(fs::read_dir(&node.conf_dir).unwrap().next().is_none());

    // The primary CNI comes up.
    fs::copy(
        testdata("broken-skipped").join("before/10-ptp.conflist"),
        node.conf_dir.join("10-ptp.conflist"),
    )
    .unwrap();
    eventually("installed and ready", WAIT, || {
        installer.is_installed() && running.readiness.is_ready()
    })
    .await;

    // And goes away again: not ready any more.
    fs::remove_file(node.conf_dir.join("10-ptp.conflist")).unwrap();
    eventually("not ready without a primary config", WAIT, || {
        !running.readiness.is_ready()
    })
    .await;
    running.stop().await;
}

#[tokio::test]
async fn creates_missing_dirs() {
    let node = Node::new();
    fs::remove_dir(&node.conf_dir).unwrap();
    let running = start(&node);
    eventually("the CNI dirs created", WAIT, || {
        node.conf_dir.is_dir() && node.bin_dir.is_dir()
    })
    .await;
    running.stop().await;
}
