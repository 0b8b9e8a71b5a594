//! Pod network namespaces, and the one thread that enters them.
//!
//! `setns` changes only the calling thread, so sockets for pods are created on a
//! dedicated OS thread (never a tokio worker): it enters the pod's namespace,
//! creates the socket, and returns to ztunnel's own namespace. A socket stays in the
//! namespace it was created in, so the rest of ztunnel uses it from any thread.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::mpsc;
use std::sync::Arc;

use nix::sched::{setns, CloneFlags};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tracing::error;

use crate::socket::{self, ListenerFuture, SocketFactory, SocketFuture, UdpSocketFuture};

/// `NSFS_MAGIC` from linux/magic.h: the filesystem of `/proc/<pid>/ns/*` and
/// `/var/run/netns/*` bind mounts.
const NSFS_MAGIC: i64 = 0x6e73_6673;

/// A pod's network namespace, held open by its fd.
#[derive(Debug)]
pub struct PodNetns {
    fd: OwnedFd,
    /// Inode of the namespace: equal inodes mean the same namespace.
    pub inode: u64,
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
        let stat = nix::sys::stat::fstat(&fd).map_err(|e| format!("fstat on the netns fd: {e}"))?;
        Ok(PodNetns {
            fd,
            inode: stat.st_ino,
        })
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// The thread that creates sockets inside pod namespaces.
#[derive(Clone)]
pub struct NetnsExecutor {
    jobs: mpsc::Sender<(Arc<PodNetns>, Job)>,
}

impl NetnsExecutor {
    /// Starts the thread. It remembers the namespace it started in and returns to
    /// it after every job.
    pub fn start() -> io::Result<Self> {
        let home = std::fs::File::open("/proc/thread-self/ns/net")?;
        let home_id = namespace_id(home.as_fd())?;
        let (jobs, queue) = mpsc::channel::<(Arc<PodNetns>, Job)>();
        std::thread::Builder::new()
            .name("ztunnel-netns".into())
            .spawn(move || {
                for (netns, job) in queue {
                    // setns needs CAP_SYS_ADMIN even into the namespace the thread is
                    // already in: a job for ztunnel's own namespace runs without it (so
                    // the in-pod state machine is testable without root).
                    let at_home = namespace_id(netns.fd.as_fd()).is_ok_and(|id| id == home_id);
                    if at_home {
                        job();
                        continue;
                    }
                    if let Err(e) = setns(netns.fd.as_fd(), CloneFlags::CLONE_NEWNET) {
                        error!(error = %e, "entering a pod network namespace failed");
                        drop(job); // the caller sees the dropped reply as an error
                        continue;
                    }
                    job();
                    if let Err(e) = setns(home.as_fd(), CloneFlags::CLONE_NEWNET) {
                        // Never run another job from the wrong namespace.
                        error!(error = %e, "returning to ztunnel's namespace failed; stopping the netns thread");
                        return;
                    }
                }
            })?;
        Ok(NetnsExecutor { jobs })
    }

    /// Runs `f` inside `netns` and returns its result.
    pub async fn run<R, F>(&self, netns: &Arc<PodNetns>, f: F) -> io::Result<R>
    where
        R: Send + 'static,
        F: FnOnce() -> io::Result<R> + Send + 'static,
    {
        let (reply, result) = oneshot::channel();
        let job: Job = Box::new(move || {
            let _ = reply.send(f());
        });
        self.jobs
            .send((netns.clone(), job))
            .map_err(|_| io::Error::other("the netns thread is gone"))?;
        result
            .await
            .map_err(|_| io::Error::other("could not enter the pod's network namespace"))?
    }
}

/// Which namespace an nsfs fd is: (device, inode), read from the fd itself.
fn namespace_id(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<(u64, u64)> {
    let stat = nix::sys::stat::fstat(fd).map_err(io::Error::from)?;
    Ok((stat.st_dev, stat.st_ino))
}

/// Creates sockets inside one pod's namespace.
pub struct PodSocketFactory {
    pub netns: Arc<PodNetns>,
    pub executor: NetnsExecutor,
    pub mark: u32,
}

impl SocketFactory for PodSocketFactory {
    fn tcp_socket(&self, family_of: SocketAddr) -> SocketFuture<'_> {
        let mark = self.mark;
        Box::pin(async move {
            let socket = self
                .executor
                .run(&self.netns, move || socket::marked_socket(family_of, mark))
                .await?;
            socket::into_tokio_socket(socket)
        })
    }

    fn udp_socket(&self, addr: SocketAddr) -> UdpSocketFuture<'_> {
        let mark = self.mark;
        Box::pin(async move {
            let socket = self
                .executor
                .run(&self.netns, move || socket::udp_socket(addr, mark))
                .await?;
            socket::into_tokio_udp(socket)
        })
    }

    fn tcp_listener(&self, addr: SocketAddr, transparent: bool) -> ListenerFuture<'_> {
        Box::pin(self.listen(addr, transparent))
    }
}

impl PodSocketFactory {
    /// Binds a marked listener inside the pod's namespace.
    pub async fn listen(&self, addr: SocketAddr, transparent: bool) -> io::Result<TcpListener> {
        let mark = self.mark;
        let socket = self
            .executor
            .run(&self.netns, move || {
                socket::listen_socket(addr, mark, transparent)
            })
            .await?;
        socket.set_nonblocking(true)?;
        TcpListener::from_std(socket.into())
    }
}
