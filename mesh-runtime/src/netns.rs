//! Network namespaces: opened once and checked ([`NetnsHandle`]), then entered for
//! short jobs without ever leaving a shared thread behind in them.
//!
//! A handle is accepted only if its fd really is a network namespace: it lives on
//! nsfs, and `NS_GET_NSTYPE` says `CLONE_NEWNET` (a mount or PID namespace fd passes
//! the filesystem check alone). Two handles name the same namespace when their
//! (device, inode) are equal. A namespace is held as its open fd, never by path: a
//! `/proc/<pid>/ns/net` path names another namespace once the pid is reused.
//!
//! `setns` changes only the calling thread. Two ways to run a job inside:
//! - [`NetnsHandle::run`] / [`NetnsHandle::run_async`]: a fresh OS thread enters, runs
//!   the job and exits, so it can never be left in the wrong namespace. For jobs that
//!   spawn processes (`iptables-restore`), where a thread costs nothing by comparison.
//! - [`NetnsSwitch::run`]: the calling thread enters, runs a job that must not block
//!   (creating a socket), and returns home, also if the job panics. For hot paths
//!   (a socket per inbound dial), where a hand-off would cost two wakeups.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::sched::{setns, CloneFlags};

/// `NSFS_MAGIC` from linux/magic.h: the filesystem of `/proc/<pid>/ns/*` and
/// `/var/run/netns/*` bind mounts.
const NSFS_MAGIC: i64 = 0x6e73_6673;
/// `NS_GET_NSTYPE` from linux/nsfs.h: which kind of namespace an nsfs fd is.
const NS_GET_NSTYPE: libc::c_ulong = 0xb703;
/// The calling thread's own network namespace.
const THREAD_NETNS: &str = "/proc/thread-self/ns/net";

/// Why a namespace could not be opened or entered.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// The file could not be opened or inspected.
    #[error("opening netns {path}: {source}")]
    Open {
        /// The path (or label) of the namespace.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: io::Error,
    },
    /// The file is not on nsfs, or is a namespace of another kind.
    #[error("{path} is not a network namespace: {why}")]
    NotNetns {
        /// The path (or label) of the file.
        path: PathBuf,
        /// What it is instead.
        why: String,
    },
    /// `setns` failed.
    #[error("entering netns {path}: {source}")]
    Enter {
        /// The path (or label) of the namespace.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: nix::Error,
    },
    /// No thread could be started for the job.
    #[error("starting a thread for netns {path}: {source}")]
    Thread {
        /// The path (or label) of the namespace.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: io::Error,
    },
    /// The job panicked (its thread is gone with it).
    #[error("the job in netns {path} panicked")]
    Panicked {
        /// The path (or label) of the namespace.
        path: PathBuf,
    },
}

/// Which namespace an nsfs fd is: (device, inode).
pub type NamespaceId = (u64, u64);

/// An open, checked network namespace: the file (which keeps the namespace alive), a
/// label for logs (the path it came from) and its identity on this host.
#[derive(Debug)]
pub struct NetnsHandle {
    file: File,
    path: PathBuf,
    id: NamespaceId,
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

    /// The network namespace of the calling thread (e.g. the host's, from `main`).
    pub fn current() -> Result<Self, NetnsError> {
        Self::open(THREAD_NETNS)
    }

    /// Checks an fd received from elsewhere (ZDS, a CNI event); `label` names it in
    /// errors and logs.
    pub fn from_fd(fd: OwnedFd, label: impl Into<PathBuf>) -> Result<Self, NetnsError> {
        Self::from_file(File::from(fd), label.into())
    }

    /// Checks an already open file; `path` is only a label.
    pub fn from_file(file: File, path: PathBuf) -> Result<Self, NetnsError> {
        let not_netns = |why: String| NetnsError::NotNetns {
            path: path.clone(),
            why,
        };
        let fs = nix::sys::statfs::fstatfs(&file).map_err(|e| NetnsError::Open {
            path: path.clone(),
            source: e.into(),
        })?;
        if fs.filesystem_type().0 as i64 != NSFS_MAGIC {
            return Err(not_netns("not a namespace file (not on nsfs)".into()));
        }
        // SAFETY: ioctl on a valid fd with a request that takes no argument.
        let kind = unsafe { libc::ioctl(file.as_raw_fd(), NS_GET_NSTYPE as _) };
        if kind != libc::CLONE_NEWNET {
            return Err(not_netns(format!(
                "a namespace of another kind (type {kind:#x})"
            )));
        }
        let meta = file.metadata().map_err(|source| NetnsError::Open {
            path: path.clone(),
            source,
        })?;
        Ok(NetnsHandle {
            id: (meta.dev(), meta.ino()),
            file,
            path,
        })
    }

    /// The path (or label) it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The nsfs inode: equal inodes on one host mean the same namespace.
    pub fn inode(&self) -> u64 {
        self.id.1
    }

    /// (device, inode): equal ids mean the same namespace.
    pub fn id(&self) -> NamespaceId {
        self.id
    }

    /// The open namespace file.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The open namespace file, handed over (e.g. to be sent over ZDS).
    pub fn into_file(self) -> File {
        self.file
    }

    /// A second handle on the same namespace (a `dup` of the fd).
    pub fn try_clone(&self) -> Result<Self, NetnsError> {
        let file = self.file.try_clone().map_err(|source| NetnsError::Open {
            path: self.path.clone(),
            source,
        })?;
        Ok(NetnsHandle {
            file,
            path: self.path.clone(),
            id: self.id,
        })
    }

    /// Runs `f` on a fresh OS thread inside this namespace and waits for it. Sockets
    /// and child processes `f` creates belong to this namespace.
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
    /// caller's tokio worker only awaits the result (never `spawn_blocking`, whose pool
    /// threads are reused).
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

    /// Enters this namespace on the calling thread, then runs `f`. Only ever called
    /// on a thread created for this one job.
    fn enter_then<R>(&self, f: impl FnOnce() -> R) -> Result<R, NetnsError> {
        setns(&self.file, CloneFlags::CLONE_NEWNET).map_err(|source| NetnsError::Enter {
            path: self.path.clone(),
            source,
        })?;
        Ok(f())
    }
}

/// Runs short, non-blocking jobs inside other namespaces on the calling thread, which
/// always comes back to the namespace the switch was made in.
#[derive(Clone, Debug)]
pub struct NetnsSwitch {
    home: Arc<NetnsHandle>,
}

impl NetnsSwitch {
    /// Remembers the calling thread's namespace as home.
    pub fn new() -> Result<Self, NetnsError> {
        Ok(NetnsSwitch {
            home: Arc::new(NetnsHandle::current()?),
        })
    }

    /// The namespace every job returns to.
    pub fn home(&self) -> &NetnsHandle {
        &self.home
    }

    /// Runs `f` inside `netns` and returns home. `f` must not block: it may run on a
    /// tokio worker.
    pub fn run<R>(&self, netns: &NetnsHandle, f: impl FnOnce() -> io::Result<R>) -> io::Result<R> {
        // setns needs CAP_SYS_ADMIN even into the namespace the thread is already in: a
        // job for home runs without it (so callers are testable without root).
        if netns.id() == self.home.id() {
            return f();
        }
        setns(netns.file.as_fd(), CloneFlags::CLONE_NEWNET)
            .map_err(|e| io::Error::other(format!("entering {}: {e}", netns.path.display())))?;
        let _home = ReturnHome(self.home.file.as_fd());
        f()
    }
}

/// Takes the thread back home when dropped, also if the job panicked.
struct ReturnHome<'a>(BorrowedFd<'a>);

impl Drop for ReturnHome<'_> {
    fn drop(&mut self) {
        if let Err(e) = setns(self.0, CloneFlags::CLONE_NEWNET) {
            // A thread left in another namespace would create every later socket
            // there: no way to go on safely.
            tracing::error!(error = %e, "returning to the home network namespace failed; aborting");
            std::process::abort();
        }
    }
}

/// The inode of the netns at `path` without keeping it open. `stat` on another
/// process's `ns/net` needs ptrace rights over it (a more privileged pid 1 refuses
/// it); its link text `net:[<inode>]` is readable regardless, so that is the fallback.
pub fn netns_inode(path: &Path) -> io::Result<u64> {
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

    fn root() -> bool {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        if !root {
            assert!(std::env::var_os("CI").is_none(), "CI: this test needs root");
            eprintln!("skipping: this test needs root");
        }
        root
    }

    /// A new network namespace, held open by its fd (made by a thread that ends).
    fn new_netns() -> NetnsHandle {
        std::thread::spawn(|| {
            nix::sched::unshare(CloneFlags::CLONE_NEWNET).expect("unshare a netns");
            NetnsHandle::current().expect("open")
        })
        .join()
        .expect("the unsharing thread")
    }

    fn thread_netns() -> NamespaceId {
        NetnsHandle::current().expect("open").id()
    }

    #[test]
    fn files_that_are_not_network_namespaces_are_refused() {
        let file = tempfile::tempfile().unwrap();
        let err = NetnsHandle::from_file(file, "/tmp/x".into()).unwrap_err();
        assert!(matches!(err, NetnsError::NotNetns { .. }), "{err}");
        assert!(matches!(
            NetnsHandle::open("/nonexistent/ns"),
            Err(NetnsError::Open { .. })
        ));
        // On nsfs, but a mount namespace: the filesystem check alone would pass it.
        let err = NetnsHandle::open("/proc/self/ns/mnt").unwrap_err();
        assert!(
            err.to_string().contains("another kind"),
            "a mount namespace must be refused: {err}"
        );
        let ok = NetnsHandle::current().unwrap();
        assert_eq!(
            ok.inode(),
            netns_inode(Path::new("/proc/self/ns/net")).unwrap()
        );
    }

    #[test]
    fn thread_jobs_run_inside_and_report_panics() {
        if !root() {
            return;
        }
        let ns = new_netns();
        assert_ne!(ns.id(), thread_netns());
        assert_eq!(ns.run(thread_netns).unwrap(), ns.id());
        let err = ns.run(|| panic!("boom")).map(|_: ()| ()).unwrap_err();
        assert!(matches!(err, NetnsError::Panicked { .. }));
    }

    #[tokio::test]
    async fn async_jobs_do_not_move_the_worker() {
        if !root() {
            return;
        }
        let ns = new_netns();
        let before = thread_netns();
        assert_eq!(ns.run_async(thread_netns).await.unwrap(), ns.id());
        assert_eq!(thread_netns(), before);
    }

    #[test]
    fn a_switched_job_runs_inside_and_its_thread_returns_even_if_it_panics() {
        if !root() {
            return;
        }
        let switch = NetnsSwitch::new().unwrap();
        let pod = new_netns();
        let inside = switch.run(&pod, || Ok(thread_netns())).unwrap();
        assert_eq!(inside, pod.id(), "the job ran in the pod's netns");
        assert_eq!(thread_netns(), switch.home().id());

        let job = std::panic::AssertUnwindSafe(|| {
            switch.run(&pod, || -> io::Result<()> { panic!("a job that fails") })
        });
        assert!(std::panic::catch_unwind(job).is_err());
        assert_eq!(
            thread_netns(),
            switch.home().id(),
            "the thread stayed in the pod's netns after the panic"
        );
    }
}
