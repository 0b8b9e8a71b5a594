//! Pod network namespaces, entered for the few syscalls that create a socket.
//!
//! `setns` changes only the calling thread, and a socket stays in the namespace it
//! was created in. So the calling thread (a tokio worker) enters the pod's
//! namespace, creates the socket, and returns to ztunnel's own namespace before it
//! does anything else; the rest of ztunnel then uses the socket from any thread.
//! Done in place, as Istio's ztunnel does: a hand-off to a dedicated thread cost two
//! cross-thread wakeups on every inbound dial and queued a burst of pod adds.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use nix::sched::{setns, CloneFlags};
use tokio::net::TcpListener;

use crate::socket::{self, ListenerFuture, SocketFactory, SocketFuture, UdpSocketFuture};

/// `NSFS_MAGIC` from linux/magic.h: the filesystem of `/proc/<pid>/ns/*` and
/// `/var/run/netns/*` bind mounts.
const NSFS_MAGIC: i64 = 0x6e73_6673;

/// Which namespace an nsfs fd is: (device, inode).
type NamespaceId = (u64, u64);

/// A pod's network namespace, held open by its fd.
#[derive(Debug)]
pub struct PodNetns {
    fd: OwnedFd,
    /// Inode of the namespace: equal inodes mean the same namespace.
    pub inode: u64,
    device: u64,
}

impl PodNetns {
    /// Checks that `fd` really is a network namespace before anything enters it.
    pub fn new(fd: OwnedFd) -> Result<Self, String> {
        let fs =
            nix::sys::statfs::fstatfs(&fd).map_err(|e| format!("fstatfs on the netns fd: {e}"))?;
        if fs.filesystem_type().0 as i64 != NSFS_MAGIC {
            return Err("the fd is not a namespace (not on nsfs)".into());
        }
        // NS_GET_NSTYPE tells which kind of namespace it is.
        const NS_GET_NSTYPE: libc::c_ulong = 0xb703;
        // SAFETY: ioctl on a valid fd with a request that takes no argument.
        let kind = unsafe { libc::ioctl(fd.as_raw_fd(), NS_GET_NSTYPE as _) };
        if kind != libc::CLONE_NEWNET {
            return Err(format!(
                "the fd is a namespace, but not a network namespace (type {kind:#x})"
            ));
        }
        let (device, inode) =
            namespace_id(fd.as_fd()).map_err(|e| format!("fstat on the netns fd: {e}"))?;
        Ok(PodNetns { fd, inode, device })
    }

    fn id(&self) -> NamespaceId {
        (self.device, self.inode)
    }
}

/// Runs short, synchronous jobs inside pod namespaces on the calling thread.
#[derive(Clone)]
pub struct NetnsSwitch {
    /// ztunnel's own namespace, where every thread returns after a job.
    home: Arc<OwnedFd>,
    home_id: NamespaceId,
}

impl NetnsSwitch {
    /// Remembers the calling thread's namespace as ztunnel's own.
    pub fn new() -> io::Result<Self> {
        let home = OwnedFd::from(std::fs::File::open("/proc/thread-self/ns/net")?);
        let home_id = namespace_id(home.as_fd())?;
        Ok(NetnsSwitch {
            home: Arc::new(home),
            home_id,
        })
    }

    /// Runs `f` inside `netns` and returns to ztunnel's namespace. `f` must not
    /// block: it runs on a tokio worker.
    pub fn run<R>(&self, netns: &PodNetns, f: impl FnOnce() -> io::Result<R>) -> io::Result<R> {
        // setns needs CAP_SYS_ADMIN even into the namespace the thread is already in:
        // a job for ztunnel's own namespace runs without it (so the in-pod state
        // machine is testable without root).
        if netns.id() == self.home_id {
            return f();
        }
        setns(netns.fd.as_fd(), CloneFlags::CLONE_NEWNET)
            .map_err(|e| io::Error::other(format!("entering the pod's network namespace: {e}")))?;
        let _home = ReturnHome(self.home.as_fd());
        f()
    }
}

/// Takes the thread back to ztunnel's namespace when dropped, also if the job
/// panicked.
struct ReturnHome<'a>(BorrowedFd<'a>);

impl Drop for ReturnHome<'_> {
    fn drop(&mut self) {
        if let Err(e) = setns(self.0, CloneFlags::CLONE_NEWNET) {
            // A worker left in a pod's namespace would create every later socket
            // there: no way to go on safely.
            tracing::error!(error = %e, "returning to ztunnel's network namespace failed; aborting");
            std::process::abort();
        }
    }
}

fn namespace_id(fd: BorrowedFd<'_>) -> io::Result<NamespaceId> {
    let stat = nix::sys::stat::fstat(fd).map_err(io::Error::from)?;
    Ok((stat.st_dev, stat.st_ino))
}

/// Creates sockets inside one pod's namespace.
pub struct PodSocketFactory {
    pub netns: Arc<PodNetns>,
    pub switch: NetnsSwitch,
    pub mark: u32,
}

impl SocketFactory for PodSocketFactory {
    fn tcp_socket(&self, family_of: SocketAddr) -> SocketFuture<'_> {
        let socket = self
            .switch
            .run(&self.netns, || socket::marked_socket(family_of, self.mark));
        Box::pin(std::future::ready(
            socket.and_then(socket::into_tokio_socket),
        ))
    }

    fn udp_socket(&self, addr: SocketAddr) -> UdpSocketFuture<'_> {
        let socket = self
            .switch
            .run(&self.netns, || socket::udp_socket(addr, self.mark));
        Box::pin(std::future::ready(socket.and_then(socket::into_tokio_udp)))
    }

    fn tcp_listener(&self, addr: SocketAddr, transparent: bool) -> ListenerFuture<'_> {
        Box::pin(std::future::ready(self.listen(addr, transparent)))
    }
}

impl PodSocketFactory {
    /// Binds a marked listener inside the pod's namespace.
    pub fn listen(&self, addr: SocketAddr, transparent: bool) -> io::Result<TcpListener> {
        let socket = self.switch.run(&self.netns, || {
            socket::listen_socket(addr, self.mark, transparent)
        })?;
        socket.set_nonblocking(true)?;
        TcpListener::from_std(socket.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new network namespace, held open by its fd (made by a thread that ends).
    fn new_netns() -> OwnedFd {
        std::thread::spawn(|| {
            nix::sched::unshare(CloneFlags::CLONE_NEWNET).expect("unshare a netns");
            OwnedFd::from(std::fs::File::open("/proc/thread-self/ns/net").expect("open"))
        })
        .join()
        .expect("the unsharing thread")
    }

    fn current_netns() -> NamespaceId {
        let fd = std::fs::File::open("/proc/thread-self/ns/net").expect("open");
        namespace_id(fd.as_fd()).expect("fstat")
    }

    #[test]
    fn a_job_runs_in_the_pod_netns_and_its_thread_returns_even_if_it_panics() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            assert!(std::env::var_os("CI").is_none(), "CI: this test needs root");
            return;
        }
        let switch = NetnsSwitch::new().unwrap();
        let pod = PodNetns::new(new_netns()).unwrap();
        assert_ne!(pod.id(), switch.home_id);

        let inside = switch.run(&pod, || Ok(current_netns())).unwrap();
        assert_eq!(inside, pod.id(), "the job ran in the pod's netns");
        assert_eq!(current_netns(), switch.home_id);

        let job = std::panic::AssertUnwindSafe(|| {
            switch.run(&pod, || -> io::Result<()> { panic!("a job that fails") })
        });
        assert!(std::panic::catch_unwind(job).is_err());
        assert_eq!(
            current_netns(),
            switch.home_id,
            "the thread stayed in the pod's netns after the panic"
        );
    }
}
