//! Processes a killed run left behind. Every process the harness starts carries
//! [`OWNER_ENV`] naming the harness process (and, for a cluster's processes, the
//! cluster); those whose owner is gone are killed. A run also checks, when it ends,
//! that nothing carrying its own marker is still alive ([`check_no_leftovers`]).

use std::time::{Duration, Instant};

use crate::netns::PREFIX;

/// Environment variable marking a process as started by a cluster harness.
pub const OWNER_ENV: &str = "ZTE_CLUSTER_OWNER";

/// The value of [`OWNER_ENV`] for this harness process (`zte<pid>-cluster`): unique
/// per run, since it holds the harness's pid.
pub fn owner_marker() -> String {
    format!("{PREFIX}{}-cluster", std::process::id())
}

/// The marker of one cluster of this process (`zte<pid>-cluster-<tag>`; tags are
/// unique among a process's clusters, as its namespace names derive from them), so
/// one cluster's check does not see another's processes running concurrently.
pub fn cluster_marker(tag: &str) -> String {
    format!("{}-{tag}", owner_marker())
}

/// Live processes whose [`OWNER_ENV`] is `marker` or a marker under it
/// (`<marker>-…`), as (pid, command line). Zombies (no environment) are not counted.
pub fn marked_processes(marker: &str) -> Vec<(i32, String)> {
    let exact = format!("{OWNER_ENV}={marker}");
    let under = format!("{exact}-");
    let me = std::process::id() as i32;
    let mut found: Vec<(i32, String)> = processes_with_environ()
        .filter(|(pid, environ)| {
            *pid != me
                && environ
                    .split(|b| *b == 0)
                    .any(|var| var == exact.as_bytes() || var.starts_with(under.as_bytes()))
        })
        .map(|(pid, _)| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            (pid, cmdline.trim().to_owned())
        })
        .collect();
    found.sort();
    found
}

/// Every process whose environment can be read, as (pid, raw `environ`).
fn processes_with_environ() -> impl Iterator<Item = (i32, Vec<u8>)> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<i32>().ok()?;
            let environ = std::fs::read(entry.path().join("environ")).ok()?;
            Some((pid, environ))
        })
}

/// Fails when processes marked `marker` are still alive after `grace` (killed
/// processes may take a moment to be reaped); those are then killed (by pid), so
/// nothing lingers, and named in the error with their command lines.
pub fn check_no_leftovers(marker: &str, grace: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + grace;
    let left = loop {
        let left = marked_processes(marker);
        if left.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            break left;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    for (pid, _) in &left {
        // SAFETY: kill(2) on a pid whose environment carries this run's marker.
        unsafe { libc::kill(*pid, libc::SIGKILL) };
    }
    let list: Vec<String> = left
        .iter()
        .map(|(pid, cmd)| format!("pid {pid}: {cmd}"))
        .collect();
    anyhow::bail!(
        "{} process(es) marked {OWNER_ENV}={marker} outlived their owner (now killed):\n  {}",
        left.len(),
        list.join("\n  ")
    )
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
    let needle = format!("{OWNER_ENV}={PREFIX}");
    for (pid, environ) in processes_with_environ() {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marked_process_that_outlives_its_run_fails_the_check_and_is_killed() {
        let marker = cluster_marker("sweep-unit");
        assert!(check_no_leftovers(&marker, Duration::ZERO).is_ok());
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .env(OWNER_ENV, format!("{marker}-child"))
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let other = std::process::Command::new("sleep")
            .arg("30")
            .env(OWNER_ENV, format!("{PREFIX}1-cluster-sweep-unit"))
            .spawn();
        wait_until(|| marked_processes(&marker).iter().any(|(p, _)| *p == pid));
        let err = check_no_leftovers(&marker, Duration::from_millis(100)).unwrap_err();
        let text = format!("{err:#}");
        assert!(text.contains(&format!("pid {pid}: sleep 30")), "{text}");
        // Killed by the check; another run's marker is not ours.
        assert!(child.wait().unwrap().code().is_none(), "killed by a signal");
        let mut other = other.unwrap();
        assert!(
            other.try_wait().unwrap().is_none(),
            "another run's process is left alone"
        );
        let _ = other.kill();
        let _ = other.wait();
    }

    fn wait_until(mut f: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !f() {
            assert!(Instant::now() < deadline, "timed out");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
