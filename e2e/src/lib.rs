//! End-to-end harness shared by every root test: isolated network namespaces with
//! guaranteed teardown, child processes that die with the test, and small helpers.
//!
//! Every object a test creates carries [`netns::PREFIX`] plus the test process id, so a
//! later run can sweep what a crashed run left behind without touching anything else.

pub mod mesh;
pub mod netns;
pub mod process;
pub mod standalone;

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

/// Path of a binary built by this workspace (`target/<profile>/<name>`).
pub fn workspace_binary(name: &str) -> std::path::PathBuf {
    // Test executables live in target/<profile>/deps/.
    let exe = std::env::current_exe().expect("test executable path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile> directory");
    profile_dir.join(name)
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
