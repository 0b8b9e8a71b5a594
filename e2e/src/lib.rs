//! End-to-end harness shared by every root test: isolated network namespaces with
//! guaranteed teardown, child processes that die with the test, and small helpers.
//!
//! Every object a test creates carries [`netns::PREFIX`] plus the test process id, so a
//! later run can sweep what a crashed run left behind without touching anything else.

pub mod apiserver;
pub mod capture;
pub mod cluster;
pub mod mesh;
pub mod netns;
pub mod pods;
pub mod process;
pub mod standalone;
pub mod zds_agent;

/// True when the test may build namespaces. Root tests call this first and return
/// early (with a message) when it is false, so `cargo test` works unprivileged too.
pub fn can_run_root_tests() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        eprintln!("skipping: this test needs root (network namespaces, iptables)");
    }
    root
}

/// Path of a binary built by this workspace (`target/<profile>/<name>`), found
/// from the running executable: a test (in `target/<profile>/deps/`) or one of the
/// harness binaries (in `target/<profile>/`).
pub fn workspace_binary(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("current executable path");
    let mut dir = exe.parent().expect("executable directory");
    if dir.ends_with("deps") {
        dir = dir.parent().expect("target/<profile> directory");
    }
    dir.join(name)
}

/// Directory holding Debian's CNI reference plugins (`containernetworking-plugins`).
pub fn cni_reference_plugin_dir() -> std::path::PathBuf {
    for dir in ["/usr/lib/cni", "/opt/cni/bin"] {
        let path = std::path::Path::new(dir);
        if path.join("bridge").exists() {
            return path.to_path_buf();
        }
    }
    panic!("CNI reference plugins not found: apt-get install containernetworking-plugins");
}
