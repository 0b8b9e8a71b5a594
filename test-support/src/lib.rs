//! Test primitives shared by every crate's root tests: isolated network namespaces
//! with guaranteed teardown ([`netns`], [`topology`]), child processes that die with
//! the test ([`process`]), the owner marker and sweep of what a killed run left
//! ([`owner`]), packet capture ([`capture`]), polling ([`poll`]), golden files
//! ([`golden`]), the CRDs the mesh ships ([`crds`]) and what `/proc` says of a
//! process ([`procfs`]).
//!
//! Every object a test creates carries [`netns::PREFIX`] plus the test process id, so a
//! later run can sweep what a crashed run left behind without touching anything else.
//! This crate depends on no crate of the workspace: any crate may dev-depend on it.

pub mod capture;
pub mod crds;
pub mod golden;
pub mod http;
pub mod netns;
pub mod owner;
pub mod poll;
pub mod process;
pub mod procfs;
pub mod topology;

use std::path::{Path, PathBuf};

/// True when the test may build namespaces. Root tests call this first and return
/// early (with a message) when it is false, so `cargo test` works unprivileged too;
/// under CI the test fails instead (see [`prerequisite`]).
pub fn can_run_root_tests() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    prerequisite(root, "this test needs root (network namespaces, iptables)")
}

/// Whether a test's prerequisite (`met`) holds. Outside CI a test without it skips,
/// saying `what` is missing; under CI (`CI` set) it fails naming it, so a missing tool
/// or privilege can never hide a regression behind a green run.
pub fn prerequisite(met: bool, what: &str) -> bool {
    if !met {
        assert!(std::env::var_os("CI").is_none(), "CI: {what}");
        eprintln!("skipping: {what}");
    }
    met
}

/// Path of a binary built by this workspace (`target/<profile>/<name>`), found
/// from the running executable: a test (in `target/<profile>/deps/`) or one of the
/// harness binaries (in `target/<profile>/`).
pub fn workspace_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current executable path");
    let mut dir = exe.parent().expect("executable directory");
    if dir.ends_with("deps") {
        dir = dir.parent().expect("target/<profile> directory");
    }
    dir.join(name)
}

/// [`workspace_binary`], with a clear error when it was not built.
pub fn built_binary(name: &str) -> anyhow::Result<PathBuf> {
    let path = workspace_binary(name);
    if !path.exists() {
        anyhow::bail!(
            "{} is missing: run `cargo build --workspace --bins` first (make test does)",
            path.display()
        );
    }
    Ok(path)
}

/// Directory holding Debian's CNI reference plugins (`containernetworking-plugins`).
pub fn cni_reference_plugin_dir() -> PathBuf {
    for dir in ["/usr/lib/cni", "/opt/cni/bin"] {
        let path = Path::new(dir);
        if path.join("bridge").exists() {
            return path.to_path_buf();
        }
    }
    panic!("CNI reference plugins not found: apt-get install containernetworking-plugins");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_prerequisite_skips_outside_ci_and_fails_under_it() {
        // nextest runs each test in a process of its own: this variable is ours alone.
        std::env::remove_var("CI");
        assert!(prerequisite(true, "present"));
        assert!(!prerequisite(false, "widget missing"));

        std::env::set_var("CI", "true");
        assert!(prerequisite(true, "present"));
        let failure = std::panic::catch_unwind(|| prerequisite(false, "widget missing"))
            .expect_err("under CI a missing prerequisite fails the test");
        let message = failure
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_default();
        assert_eq!(message, "CI: widget missing");
        std::env::remove_var("CI");
    }
}
