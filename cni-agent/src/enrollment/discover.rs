//! Finding the netns of a pod that was already running when the agent started (no
//! CNI event carries its netns path): scan `<proc>/<pid>/ns/net`, skip the host netns,
//! match the pod UID in `<proc>/<pid>/cgroup`, and confirm by entering the netns and
//! seeing one of the pod's IPs on an interface.
//!
//! Fallback: when no process's cgroup names the pod (e.g. the local test cluster,
//! where "pods" are plain namespaces), a netns is matched on the pod IP alone, and
//! only if exactly one netns carries it; two would be ambiguous and we refuse.

use mesh_runtime::netns::{netns_inode, NetnsError, NetnsHandle};
use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Default proc root; the chart mounts the host's `/proc` at `/host/proc`.
pub const DEFAULT_PROC_ROOT: &str = "/proc";

#[derive(Debug, thiserror::Error)]
pub enum DiscoverError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error("pod IPs {ips:?} are on {count} network namespaces and no cgroup names the pod")]
    Ambiguous { ips: Vec<IpAddr>, count: usize },
}

/// How the netns was tied to the pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchedBy {
    /// A process's cgroup names the pod UID (and a pod IP was seen, when IPs were given).
    Cgroup,
    /// No cgroup names the pod; the only netns with one of its IPs.
    IpOnly,
}

/// A found pod netns: open (so it cannot vanish under us), with its
/// `<proc>/<pid>/ns/net` path and inode.
#[derive(Debug)]
pub struct FoundNetns {
    pub netns: NetnsHandle,
    pub pid: u32,
    pub matched_by: MatchedBy,
}

/// One process seen in the scan: its pid, netns inode and cgroup text.
#[derive(Debug, Clone)]
struct Process {
    pid: u32,
    inode: u64,
    cgroup: String,
    /// In the host netns: never a candidate, but its cgroup still names a pod (a
    /// hostNetwork pod must not fall back to matching by IP).
    host: bool,
}

/// A snapshot of every process and its netns. Scan once for a burst of work (the
/// startup restore, a namespace label enrolling its running pods), then look up each
/// pod with [`ProcScan::find`]. The addresses seen in each netns are remembered too, so
/// a burst of N IP-matched pods enters each netns once, not N times.
#[derive(Debug, Clone)]
pub struct ProcScan {
    proc_root: PathBuf,
    processes: Vec<Process>,
    /// Interface addresses by netns inode, filled as netns are entered.
    addresses: Arc<Mutex<HashMap<u64, Vec<IpAddr>>>>,
}

impl ProcScan {
    /// Reads `<proc_root>/*/ns/net` and `cgroup`. Processes that exit meanwhile or
    /// cannot be read are skipped. The host netns is pid 1's; when pid 1 refuses
    /// access (a sandbox without `CAP_SYS_PTRACE`), it is the calling thread's, so call
    /// this from a thread in the host netns (the agent runs with hostNetwork).
    pub fn new(proc_root: impl AsRef<Path>) -> Result<Self, DiscoverError> {
        let proc_root = proc_root.as_ref().to_path_buf();
        let host_path = proc_root.join("1/ns/net");
        let host_inode = match netns_inode(&host_path) {
            Ok(inode) => inode,
            Err(err) if err.kind() == std::io::ErrorKind::PermissionDenied => {
                tracing::warn!(path = %host_path.display(), "pid 1 netns unreadable; using our own as the host netns");
                let own = Path::new("/proc/thread-self/ns/net");
                netns_inode(own).map_err(|source| DiscoverError::Read {
                    path: own.to_path_buf(),
                    source,
                })?
            }
            Err(source) => {
                return Err(DiscoverError::Read {
                    path: host_path,
                    source,
                })
            }
        };
        Self::with_host(proc_root, host_inode)
    }

    /// Like [`new`](Self::new) with the host netns given by its inode.
    pub fn with_host(proc_root: impl AsRef<Path>, host_inode: u64) -> Result<Self, DiscoverError> {
        let proc_root = proc_root.as_ref().to_path_buf();
        let entries = std::fs::read_dir(&proc_root).map_err(|source| DiscoverError::Read {
            path: proc_root.clone(),
            source,
        })?;
        let mut processes = Vec::new();
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let dir = entry.path();
            let Ok(inode) = netns_inode(&dir.join("ns/net")) else {
                continue;
            };
            let cgroup = std::fs::read_to_string(dir.join("cgroup")).unwrap_or_default();
            let host = inode == host_inode;
            processes.push(Process {
                pid,
                inode,
                cgroup,
                host,
            });
        }
        processes.sort_by_key(|p| p.pid);
        Ok(ProcScan {
            proc_root,
            processes,
            addresses: Arc::default(),
        })
    }

    /// Finds the netns of pod `uid` with addresses `ips` (see the module docs).
    pub fn find(&self, uid: &str, ips: &[IpAddr]) -> Result<Option<FoundNetns>, DiscoverError> {
        let named: Vec<&Process> = self
            .processes
            .iter()
            .filter(|p| cgroup_names_pod(&p.cgroup, uid))
            .collect();
        if !named.is_empty() {
            let mut seen = BTreeSet::new();
            for p in named {
                if p.host || !seen.insert(p.inode) {
                    continue;
                }
                let Some(netns) = self.open(p) else { continue };
                if ips.is_empty() || self.has_any_ip(&netns, ips)? {
                    return Ok(Some(FoundNetns {
                        netns,
                        pid: p.pid,
                        matched_by: MatchedBy::Cgroup,
                    }));
                }
            }
            return Ok(None);
        }
        if ips.is_empty() {
            return Ok(None);
        }
        let mut seen = BTreeSet::new();
        let mut found = Vec::new();
        for p in &self.processes {
            if p.host || !seen.insert(p.inode) {
                continue;
            }
            let Some(netns) = self.open(p) else { continue };
            if self.has_any_ip(&netns, ips)? {
                found.push(FoundNetns {
                    netns,
                    pid: p.pid,
                    matched_by: MatchedBy::IpOnly,
                });
            }
        }
        match found.len() {
            0 | 1 => Ok(found.pop()),
            count => Err(DiscoverError::Ambiguous {
                ips: ips.to_vec(),
                count,
            }),
        }
    }

    /// Whether any interface of `netns` has one of `ips`: entered once per scan.
    fn has_any_ip(&self, netns: &NetnsHandle, ips: &[IpAddr]) -> Result<bool, DiscoverError> {
        let known = self
            .addresses
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&netns.inode())
            .cloned();
        let addrs = match known {
            Some(addrs) => addrs,
            None => {
                let addrs =
                    netns
                        .run(interface_addresses)?
                        .map_err(|source| DiscoverError::Read {
                            path: netns.path().to_path_buf(),
                            source,
                        })?;
                self.addresses
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(netns.inode(), addrs.clone());
                addrs
            }
        };
        Ok(addrs.iter().any(|a| ips.contains(a)))
    }

    /// Opens a process's netns, or `None` if it exited or its pid was reused.
    fn open(&self, p: &Process) -> Option<NetnsHandle> {
        let netns =
            NetnsHandle::open(self.proc_root.join(p.pid.to_string()).join("ns/net")).ok()?;
        (netns.inode() == p.inode).then_some(netns)
    }
}

/// One [`ProcScan`] shared by a burst of lookups: reused while younger than `max_age`.
/// A pod not found in it (its process may have started after the scan) is looked up
/// once more in a fresh scan before it counts as not running.
#[derive(Debug)]
pub struct ProcIndex {
    proc_root: PathBuf,
    max_age: Duration,
    latest: Mutex<Option<(Instant, Arc<ProcScan>)>>,
}

impl ProcIndex {
    pub fn new(proc_root: impl AsRef<Path>, max_age: Duration) -> Self {
        ProcIndex {
            proc_root: proc_root.as_ref().to_path_buf(),
            max_age,
            latest: Mutex::new(None),
        }
    }

    /// The current scan (scanning if there is none young enough), and whether it was
    /// reused. Callers wait for a scan in progress rather than start their own.
    fn scan(&self, fresh: bool) -> Result<(Arc<ProcScan>, bool), DiscoverError> {
        let mut latest = self.latest.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, scan)) = latest.as_ref() {
            if !fresh && at.elapsed() < self.max_age {
                return Ok((scan.clone(), true));
            }
        }
        let scan = Arc::new(ProcScan::new(&self.proc_root)?);
        *latest = Some((Instant::now(), scan.clone()));
        Ok((scan, false))
    }

    /// [`ProcScan::find`] in the shared scan, then in a fresh one if that misses.
    pub fn find(&self, uid: &str, ips: &[IpAddr]) -> Result<Option<FoundNetns>, DiscoverError> {
        let (scan, reused) = self.scan(false)?;
        match scan.find(uid, ips) {
            Ok(Some(found)) => Ok(Some(found)),
            _ if reused => self.scan(true)?.0.find(uid, ips),
            other => other,
        }
    }
}

/// Scans `proc_root` and finds one pod (see [`ProcScan`] for many pods).
pub fn find_pod_netns(
    proc_root: impl AsRef<Path>,
    uid: &str,
    ips: &[IpAddr],
) -> Result<Option<FoundNetns>, DiscoverError> {
    ProcScan::new(proc_root)?.find(uid, ips)
}

/// Whether a `/proc/<pid>/cgroup` text names pod `uid`, in the cgroupfs layout
/// (`/kubepods/burstable/pod<uid>/...`) or the systemd one
/// (`kubepods-burstable-pod<uid with _>.slice`).
pub fn cgroup_names_pod(cgroup: &str, uid: &str) -> bool {
    if uid.is_empty() || !uid.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        return false;
    }
    let cgroupfs = format!("pod{uid}");
    let systemd = format!("pod{}.slice", uid.replace('-', "_"));
    cgroup
        .lines()
        .any(|line| line.contains(&systemd) || line.split('/').any(|part| part == cgroupfs))
}

/// Addresses on the interfaces of the current thread's netns.
pub fn interface_addresses() -> std::io::Result<Vec<IpAddr>> {
    let addrs = nix::ifaddrs::getifaddrs().map_err(std::io::Error::from)?;
    Ok(addrs
        .filter_map(|ifa| {
            let addr = ifa.address?;
            if let Some(v4) = addr.as_sockaddr_in() {
                Some(IpAddr::V4(v4.ip()))
            } else {
                addr.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "6f1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d";

    #[test]
    fn matches_systemd_and_cgroupfs_layouts() {
        let systemd = "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6f1b2c3d_4e5f_4a6b_8c7d_9e0f1a2b3c4d.slice/cri-containerd-abc.scope\n";
        let cgroupfs =
            "12:memory:/kubepods/burstable/pod6f1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d/0123abcd\n";
        let besteffort = "0::/kubepods/pod6f1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d/x\n";
        assert!(cgroup_names_pod(systemd, UID));
        assert!(cgroup_names_pod(cgroupfs, UID));
        assert!(cgroup_names_pod(besteffort, UID));
    }

    #[test]
    fn rejects_other_pods_prefixes_and_bad_uids() {
        let other = "0::/kubepods/burstable/pod6f1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4dff/x\n";
        assert!(!cgroup_names_pod(other, UID));
        assert!(!cgroup_names_pod("0::/user.slice\n", UID));
        assert!(!cgroup_names_pod("0::/kubepods/pod/x\n", ""));
        assert!(!cgroup_names_pod("0::/kubepods/pod../x\n", ".."));
    }

    #[test]
    fn missing_proc_root_is_an_error() {
        assert!(matches!(
            ProcScan::new("/nonexistent-proc"),
            Err(DiscoverError::Read { .. })
        ));
    }
}
