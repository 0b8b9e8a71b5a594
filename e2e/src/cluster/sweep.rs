//! Processes a killed run left behind. Every process the cluster starts carries
//! [`OWNER_ENV`] naming the harness process; those whose owner is gone are killed.

use crate::netns::PREFIX;

/// Environment variable marking a process as started by a cluster harness.
pub const OWNER_ENV: &str = "ZTE_CLUSTER_OWNER";

/// The value of [`OWNER_ENV`] for this harness process.
pub fn owner_marker() -> String {
    format!("{PREFIX}{}-cluster", std::process::id())
}

/// Removes cluster temp dirs (`<tmp>/zte<pid>-cluster*`) of harness processes that no
/// longer run.
pub fn sweep_stale_dirs() {
    let tmp = std::env::temp_dir();
    let Ok(dir) = std::fs::read_dir(&tmp) else {
        return;
    };
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let owner = name
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split_once("-cluster"))
            .and_then(|(pid, _)| pid.parse::<u32>().ok());
        if let Some(owner) = owner {
            if !std::path::Path::new(&format!("/proc/{owner}")).exists() && entry.path().is_dir() {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
}

/// Kills processes marked by a harness process that no longer runs.
pub fn sweep_stale_processes() {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return;
    };
    let needle = format!("{OWNER_ENV}={PREFIX}");
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        let owner = environ
            .split(|b| *b == 0)
            .filter_map(|var| std::str::from_utf8(var).ok())
            .find_map(|var| var.strip_prefix(&needle))
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<u32>().ok());
        if let Some(owner) = owner {
            if !std::path::Path::new(&format!("/proc/{owner}")).exists() {
                // SAFETY: kill(2) on a pid read from /proc; the process is ours by its marker.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}
