//! The installer against golden conf dirs: `testdata/install/<case>/before` is loaded
//! into a temp conf dir, the installer runs, and the dir must equal `<case>/after`
//! byte for byte. `UPDATE_GOLDEN=1 cargo test -p cni-agent --test install_golden`
//! rewrites the `after` dirs (review the diff).

mod common;

use cni_agent::install::{Changes, InstallError};
use common::{mode, snapshot, Node};
use std::fs::{self, Permissions};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

#[derive(Clone, Copy, PartialEq)]
enum Op {
    Install,
    Uninstall,
}

fn case_dir(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/install")
        .join(case)
}

/// Runs `op` on the case's `before`, compares with `after`, and checks a second run
/// changes nothing (idempotence).
fn golden(case: &str, owned: Option<&str>, op: Op) -> Changes {
    let node = Node::new();
    node.load(&case_dir(case).join("before"));
    let installer = node.installer(owned);
    if op == Op::Uninstall {
        installer.ensure_binary().unwrap();
    }
    let run = || match op {
        Op::Install => installer.install(),
        Op::Uninstall => installer.uninstall(),
    };
    let changes = run().unwrap_or_else(|e| panic!("{case}: {e}"));
    let after = case_dir(case).join("after");
    let got = snapshot(&node.conf_dir);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        let _ = fs::remove_dir_all(&after);
        fs::create_dir_all(&after).unwrap();
        for (name, bytes) in &got {
            fs::write(after.join(name), bytes).unwrap();
        }
    }
    let want = snapshot(&after);
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "{case}: files"
    );
    for (name, bytes) in &want {
        assert_eq!(
            String::from_utf8_lossy(&got[name]),
            String::from_utf8_lossy(bytes),
            "{case}: {name}"
        );
    }
    let again = run().unwrap();
    assert!(again.is_empty(), "{case}: second pass changed {again}");
    assert_eq!(snapshot(&node.conf_dir), got, "{case}: second pass");
    changes
}

#[test]
fn conflist_insertion_appends_our_entry_and_keeps_key_order() {
    let changes = golden("conflist-insert", None, Op::Install);
    assert_eq!(changes.written.len(), 2, "binary and config: {changes}");
}

#[test]
fn lone_conf_is_wrapped_into_a_conflist() {
    let changes = golden("conf-wrap", None, Op::Install);
    assert_eq!(changes.removed.len(), 1, "{changes}");
}

#[test]
fn reinstall_replaces_a_stale_entry_in_place_without_duplicates() {
    golden("reinstall", None, Op::Install);
}

#[test]
fn unparseable_configs_are_skipped_for_the_next() {
    golden("broken-skipped", None, Op::Install);
}

#[test]
fn istio_owned_config_leaves_the_primary_untouched() {
    golden("istio-owned", Some("02-istio-cni.conflist"), Op::Install);
    golden(
        "istio-owned-conf",
        Some("02-istio-cni.conflist"),
        Op::Install,
    );
}

#[test]
fn uninstall_removes_only_our_entry() {
    let changes = golden("uninstall", None, Op::Uninstall);
    assert!(changes.removed.iter().any(|p| p.ends_with("istio-cni")));
    golden(
        "uninstall-owned",
        Some("02-istio-cni.conflist"),
        Op::Uninstall,
    );
}

#[test]
fn install_then_uninstall_restores_a_conflist() {
    let node = Node::new();
    let before = case_dir("conflist-insert").join("before");
    node.load(&before);
    let installer = node.installer(None);
    installer.install().unwrap();
    assert!(installer.is_installed());
    installer.uninstall().unwrap();
    assert!(!installer.is_installed());
    assert!(!installer.plugin_path().exists());
    // Same JSON as before (our formatting may differ from the original file's).
    for (name, bytes) in snapshot(&before) {
        let got: serde_json::Value =
            serde_json::from_slice(&fs::read(node.conf_dir.join(&name)).unwrap()).unwrap();
        let want: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn no_config_at_all_is_a_clear_error() {
    let node = Node::new();
    let err = node.installer(None).install().unwrap_err();
    assert!(matches!(err, InstallError::NoPrimaryConfig(_)), "{err}");
    let text = err.to_string();
    assert!(
        text.contains(&node.conf_dir.display().to_string()),
        "{text}"
    );
    assert!(text.contains("waiting"), "{text}");
    // Only broken files: the same.
    fs::write(node.conf_dir.join("10-x.conflist"), b"{").unwrap();
    assert!(matches!(
        node.installer(None).install(),
        Err(InstallError::NoPrimaryConfig(_))
    ));
}

#[test]
fn file_modes_are_kept_and_the_binary_is_executable() {
    let node = Node::new();
    node.load(&case_dir("conf-wrap").join("before"));
    let conf = node.conf_dir.join("10-bridge.conf");
    fs::set_permissions(&conf, Permissions::from_mode(0o600)).unwrap();
    let installer = node.installer(None);
    installer.install().unwrap();
    assert_eq!(mode(&node.conf_dir.join("10-bridge.conflist")), 0o600);
    assert_eq!(mode(&installer.plugin_path()), 0o755);
    assert_eq!(
        fs::read(installer.plugin_path()).unwrap(),
        fs::read(&node.plugin_source).unwrap()
    );
    // A new plugin build is installed on the next pass.
    fs::write(&node.plugin_source, b"#!/bin/sh\necho v2\n").unwrap();
    let changes = installer.install().unwrap();
    assert_eq!(changes.written, vec![installer.plugin_path()]);
    assert_eq!(
        fs::read(installer.plugin_path()).unwrap(),
        b"#!/bin/sh\necho v2\n"
    );
}

#[test]
fn missing_plugin_binary_is_reported_and_config_untouched() {
    let node = Node::new();
    node.load(&case_dir("conflist-insert").join("before"));
    fs::remove_file(&node.plugin_source).unwrap();
    let before = snapshot(&node.conf_dir);
    let err = node.installer(None).install().unwrap_err();
    assert!(err.to_string().contains("plugin binary"), "{err}");
    assert_eq!(snapshot(&node.conf_dir), before);
}

#[test]
fn a_config_being_written_is_waited_for_not_skipped() {
    let node = Node::new();
    node.load(&case_dir("broken-skipped").join("before"));
    // The primary CNI is writing its config (in place) right now; it sorts first.
    let primary = node.conf_dir.join("01-calico.conflist");
    fs::write(&primary, b"{\"name\": \"k8s-pod").unwrap();
    let before = snapshot(&node.conf_dir);
    let err = node.installer(None).install().unwrap_err();
    assert!(matches!(err, InstallError::ConfigInFlux(_)), "{err}");
    assert_eq!(snapshot(&node.conf_dir), before, "nothing edited meanwhile");
    // Done writing: it is the primary, the next file stays untouched.
    let calico = case_dir("conflist-insert").join("before/10-calico.conflist");
    fs::copy(calico, &primary).unwrap();
    node.installer(None).install().unwrap();
    assert!(node.installer(None).is_installed());
    assert_eq!(
        fs::read(node.conf_dir.join("10-ptp.conflist")).unwrap(),
        fs::read(case_dir("broken-skipped").join("before/10-ptp.conflist")).unwrap()
    );
}
