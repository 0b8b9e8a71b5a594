//! Running code inside a network namespace without ever moving a shared thread.
//!
//! `setns` changes only the calling thread, so each job gets a fresh OS thread that
//! enters the netns, runs, and exits. We chose a thread per job over one long-lived
//! worker that switches back: a thread that dies can never be left in the wrong netns
//! (a failed switch-back would poison every later job), jobs for different pods run
//! in parallel, and the cost (tens of microseconds) is noise next to the
//! `iptables-restore` process each job spawns anyway. Tokio callers use
//! [`NetnsHandle::run_async`], which also uses its own thread (never `spawn_blocking`,
//! whose pool threads are reused).

use nix::sched::CloneFlags;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// `f_type` of the nsfs filesystem every namespace file lives on.
const NSFS_MAGIC: i64 = 0x6e73_6673;

#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("opening netns {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a namespace file")]
    NotNamespace { path: PathBuf },
    #[error("entering netns {path}: {source}")]
    Enter {
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
    #[error("starting a thread for netns {path}: {source}")]
    Thread {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the job in netns {path} panicked")]
    Panicked { path: PathBuf },
}

/// An open network namespace: the file (which keeps the netns alive), the path it
/// came from (for logs and ZDS) and its inode (its identity on this host).
#[derive(Debug)]
pub struct NetnsHandle {
    file: File,
    path: PathBuf,
    inode: u64,
}

impl NetnsHandle {
    /// Opens a netns file: a bind mount (`/var/run/netns/x`) or `/proc/<pid>/ns/net`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, NetnsError> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path).map_err(|source| NetnsError::Open {
            path: path.clone(),
            source,
        })?;
        Self::from_file(file, path)
    }

    /// The netns of the calling thread (e.g. the host netns, from the agent's main
    /// thread).
    pub fn current() -> Result<Self, NetnsError> {
        Self::open("/proc/thread-self/ns/net")
    }

    /// Wraps an already open file (e.g. an fd received from elsewhere); `path` is
    /// only a label.
    pub fn from_file(file: File, path: PathBuf) -> Result<Self, NetnsError> {
        let fs = nix::sys::statfs::fstatfs(&file).map_err(|e| NetnsError::Open {
            path: path.clone(),
            source: e.into(),
        })?;
        if fs.filesystem_type().0 as i64 != NSFS_MAGIC {
            return Err(NetnsError::NotNamespace { path });
        }
        let inode = file
            .metadata()
            .map_err(|source| NetnsError::Open {
                path: path.clone(),
                source,
            })?
            .ino();
        Ok(NetnsHandle { file, path, inode })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The nsfs inode: equal inodes mean the same netns.
    pub fn inode(&self) -> u64 {
        self.inode
    }

    pub fn file(&self) -> &File {
        &self.file
    }

    pub fn into_file(self) -> File {
        self.file
    }

    /// A second handle on the same netns (a `dup` of the fd).
    pub fn try_clone(&self) -> Result<Self, NetnsError> {
        let file = self.file.try_clone().map_err(|source| NetnsError::Open {
            path: self.path.clone(),
            source,
        })?;
        Ok(NetnsHandle {
            file,
            path: self.path.clone(),
            inode: self.inode,
        })
    }

    /// Runs `f` on a fresh OS thread inside this netns and waits for it. Sockets and
    /// child processes `f` creates belong to this netns.
    pub fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> Result<R, NetnsError> {
        std::thread::scope(|scope| {
            let handle = std::thread::Builder::new()
                .name("netns-job".to_owned())
                .spawn_scoped(scope, || self.enter_then(f))
                .map_err(|source| NetnsError::Thread {
                    path: self.path.clone(),
                    source,
                })?;
            handle.join().map_err(|_| NetnsError::Panicked {
                path: self.path.clone(),
            })?
        })
    }

    /// [`run`](Self::run) for async callers: the job runs on its own OS thread and the
    /// caller's tokio worker only awaits the result.
    pub async fn run_async<R, F>(&self, f: F) -> Result<R, NetnsError>
    where
        R: Send + 'static,
        F: FnOnce() -> R + Send + 'static,
    {
        let ns = self.try_clone()?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("netns-job".to_owned())
            .spawn(move || {
                let _ = tx.send(ns.enter_then(f));
            })
            .map_err(|source| NetnsError::Thread {
                path: self.path.clone(),
                source,
            })?;
        // A dropped sender means the job panicked.
        rx.await.map_err(|_| NetnsError::Panicked {
            path: self.path.clone(),
        })?
    }

    /// Enters this netns on the calling thread, then runs `f`. Only ever called on a
    /// thread created for this one job.
    fn enter_then<R>(&self, f: impl FnOnce() -> R) -> Result<R, NetnsError> {
        nix::sched::setns(&self.file, CloneFlags::CLONE_NEWNET).map_err(|source| {
            NetnsError::Enter {
                path: self.path.clone(),
                source,
            }
        })?;
        Ok(f())
    }
}

/// The inode of the netns at `path` without keeping it open. `stat` on another
/// process's `ns/net` needs ptrace rights over it (a more privileged pid 1 refuses
/// it); its link text `net:[<inode>]` is readable regardless, so that is the fallback.
pub fn netns_inode(path: &Path) -> std::io::Result<u64> {
    let err = match std::fs::metadata(path) {
        Ok(meta) => return Ok(meta.ino()),
        Err(err) => err,
    };
    let mut link = path.to_path_buf();
    // Follow a few levels of ordinary symlinks until the magic `net:[...]` link.
    for _ in 0..8 {
        let Ok(target) = std::fs::read_link(&link) else {
            break;
        };
        let text = target.to_string_lossy();
        if let Some(inode) = text.strip_prefix("net:[").and_then(|t| t.strip_suffix(']')) {
            return inode.parse().map_err(|_| err);
        }
        link = match link.parent() {
            Some(parent) if target.is_relative() => parent.join(&target),
            _ => target,
        };
    }
    Err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_files_that_are_not_namespaces() {
        let file = tempfile::tempfile().unwrap();
        let err = NetnsHandle::from_file(file, "/tmp/x".into()).unwrap_err();
        assert!(matches!(err, NetnsError::NotNamespace { .. }), "{err}");
        assert!(matches!(
            NetnsHandle::open("/nonexistent/ns"),
            Err(NetnsError::Open { .. })
        ));
    }

    #[test]
    fn current_netns_runs_jobs_and_reports_panics() {
        // setns, even into the netns we are in, needs CAP_SYS_ADMIN.
        if !test_support::can_run_root_tests() {
            return;
        }
        let ns = NetnsHandle::current().unwrap();
        assert_eq!(
            ns.inode(),
            netns_inode(Path::new("/proc/self/ns/net")).unwrap()
        );
        let inode = ns
            .run(|| netns_inode(Path::new("/proc/thread-self/ns/net")).unwrap())
            .unwrap();
        assert_eq!(inode, ns.inode());
        let err = ns.run(|| panic!("boom")).map(|_: ()| ()).unwrap_err();
        assert!(matches!(err, NetnsError::Panicked { .. }));
    }

    #[tokio::test]
    async fn async_jobs_do_not_move_the_worker() {
        if !test_support::can_run_root_tests() {
            return;
        }
        let ns = NetnsHandle::current().unwrap();
        let before = netns_inode(Path::new("/proc/thread-self/ns/net")).unwrap();
        let got = ns.run_async(|| 7).await.unwrap();
        assert_eq!(got, 7);
        assert_eq!(
            netns_inode(Path::new("/proc/thread-self/ns/net")).unwrap(),
            before
        );
    }
}
