//! Only root (or the configured uid) may talk to the agent's Unix sockets (root only:
//! the non-root peer is a test thread that dropped to uid/gid 65534).
//!
//! The non-root peer is a thread that changed only its own credentials with the raw
//! `setresuid` syscall (glibc's wrapper would change every thread of the process). The
//! kernel records the connecting thread's credentials in `SO_PEERCRED`, so to the
//! agent it is exactly a process of user 65534; no external tool is needed, so the test
//! cannot skip for a missing one.
//!
//! Each socket is shown closed twice: the file modes stop the peer at `connect`
//! (EACCES), and, with the modes opened up as Istio leaves them (0666 sockets, a 0755
//! dir), the peer check closes the connection before anything is read or sent.

mod common;

use cni_agent::ops::metrics::Metrics;
use cni_agent::plugin_api::peer::{PeerGate, SOCKET_PLUGIN_EVENT, SOCKET_PLUGIN_LOG, SOCKET_ZDS};
use cni_agent::plugin_api::{self, event::CmdAddHandler, UdsAccess};
use cni_agent::zds::{EnrolledPod, ZdsServer};
use common::{exchange, mode};
use mesh_runtime::netns::NetnsHandle;
use nix::sys::socket::{
    connect, recvmsg, send, socket, AddressFamily, ControlMessageOwned, MsgFlags, SockFlag,
    SockType, UnixAddr,
};
use prost::Message;
use shared_types::cni::CniPluginAddEvent;
use shared_types::zds::{WorkloadInfo, WorkloadRequest, WorkloadResponse, ZdsHello};
use shared_types::zds_transport::SeqpacketStream;
use std::io::{IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::UnixStream;
use tokio_util::sync::CancellationToken;

const NOBODY: u32 = 65534;

const EVENT: &str = r#"{"Netns":"/var/run/netns/cni-1","PodName":"web-0","PodNamespace":"shop",
  "IPs":[],"PodUID":"uid-1","ContainerID":"abc","IfName":"eth0"}"#;

/// Runs `f` on a fresh OS thread whose own credentials are uid/gid 65534 with no
/// supplementary groups; the rest of the process stays root. The thread ends with `f`.
async fn as_nobody<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        // SAFETY: raw syscalls on the calling thread only; no memory is involved
        // besides the null group list.
        unsafe {
            let none: *const libc::gid_t = std::ptr::null();
            assert_eq!(libc::syscall(libc::SYS_setgroups, 0, none), 0);
            assert_eq!(
                libc::syscall(libc::SYS_setresgid, NOBODY, NOBODY, NOBODY),
                0
            );
            assert_eq!(
                libc::syscall(libc::SYS_setresuid, NOBODY, NOBODY, NOBODY),
                0
            );
            assert_eq!(libc::geteuid(), NOBODY);
        }
        let _ = tx.send(f());
    });
    rx.await.expect("the unprivileged thread panicked")
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// What a plain client gets: the connect error, or every byte the server sent back
/// to a `POST` before closing.
fn http_post(path: &Path, uri: &str, body: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut stream = std::os::unix::net::UnixStream::connect(path)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let head = format!(
        "POST {uri} HTTP/1.1\r\nHost: agent\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    // The server may close before reading: a failed write is fine, the read tells.
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(body);
    let mut answer = Vec::new();
    match stream.read_to_end(&mut answer) {
        Ok(_) => Ok(answer),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Ok(answer),
        Err(e) => Err(e),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_root_peer_is_refused_on_both_plugin_sockets() {
    if !test_support::can_run_root_tests() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("istio-cni");
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let handler: Arc<dyn CmdAddHandler> = Arc::new(move |_: CniPluginAddEvent| {
        counted.fetch_add(1, Ordering::SeqCst);
        async { Ok(()) }
    });
    let metrics = Metrics::new();
    let cancel = CancellationToken::new();
    plugin_api::start(
        &run_dir,
        handler,
        &UdsAccess::root_only(metrics.clone()),
        cancel.clone(),
    )
    .unwrap();
    let event_sock = run_dir.join("pluginevent.sock");
    let log_sock = run_dir.join("log.sock");
    // The tempdir's parent is 0700 root: let nobody reach the run dir's parent.
    chmod(dir.path(), 0o755);

    // 1. The modes: a 0700 dir and 0600 sockets stop the peer at connect.
    assert_eq!(mode(&run_dir), 0o700);
    for sock in [&event_sock, &log_sock] {
        assert_eq!(mode(sock), 0o600);
        let path = sock.clone();
        let err = as_nobody(move || http_post(&path, "/cmdadd", EVENT.as_bytes()))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied, "{err}");
    }

    // 2. The peer check: with the modes opened up (Istio's 0666 sockets in a 0755 dir),
    //    the connection is closed unread and unanswered, and counted.
    chmod(&run_dir, 0o755);
    for sock in [&event_sock, &log_sock] {
        chmod(sock, 0o666);
    }
    let path = event_sock.clone();
    let answer = as_nobody(move || http_post(&path, "/cmdadd", EVENT.as_bytes()))
        .await
        .expect("connect succeeds once the modes are open");
    assert!(
        answer.is_empty(),
        "refused peer got {:?}",
        String::from_utf8_lossy(&answer)
    );
    let path = log_sock.clone();
    let answer = as_nobody(move || http_post(&path, "/log", b"[]"))
        .await
        .unwrap();
    assert!(
        answer.is_empty(),
        "refused peer got {:?}",
        String::from_utf8_lossy(&answer)
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0, "the handler never ran");
    assert_eq!(metrics.peer_refusals(SOCKET_PLUGIN_EVENT), 1);
    assert_eq!(metrics.peer_refusals(SOCKET_PLUGIN_LOG), 1);
    let text = metrics.encode();
    assert!(
        text.contains("istio_cni_uds_peer_refused_total{socket=\"pluginevent\"} 1"),
        "{text}"
    );

    // Root is still served on both.
    let stream = UnixStream::connect(&event_sock).await.unwrap();
    let answer = exchange(stream, "POST", "/cmdadd", EVENT.as_bytes()).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let stream = UnixStream::connect(&log_sock).await.unwrap();
    assert_eq!(exchange(stream, "POST", "/log", b"[]").await.status, 200);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(metrics.peer_refusals(SOCKET_PLUGIN_EVENT), 1);

    // A restarted agent takes the open dir back and rebinds private sockets.
    cancel.cancel();
    let cancel = CancellationToken::new();
    let noop: Arc<dyn CmdAddHandler> = Arc::new(|_: CniPluginAddEvent| async { Ok(()) });
    plugin_api::start(
        &run_dir,
        noop,
        &UdsAccess::root_only(Metrics::new()),
        cancel.clone(),
    )
    .unwrap();
    assert_eq!(mode(&run_dir), 0o700);
    assert_eq!((mode(&event_sock), mode(&log_sock)), (0o600, 0o600));
    cancel.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_uid_is_admitted_and_owns_the_sockets() {
    if !test_support::can_run_root_tests() {
        return;
    }
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    chmod(dir.path(), 0o755);
    let run_dir = dir.path().join("istio-cni");
    let metrics = Metrics::new();
    let cancel = CancellationToken::new();
    let handler: Arc<dyn CmdAddHandler> = Arc::new(|_: CniPluginAddEvent| async { Ok(()) });
    let access = UdsAccess {
        peer_uid: NOBODY,
        metrics: metrics.clone(),
    };
    plugin_api::start(&run_dir, handler, &access, cancel.clone()).unwrap();
    assert_eq!(mode(&run_dir), 0o711);
    let event_sock = run_dir.join("pluginevent.sock");
    let meta = std::fs::metadata(&event_sock).unwrap();
    assert_eq!((meta.uid(), mode(&event_sock)), (NOBODY, 0o600));
    let answer = as_nobody(move || http_post(&event_sock, "/cmdadd", EVENT.as_bytes()))
        .await
        .unwrap();
    let answer = common::parse_answer(&answer);
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(metrics.peer_refusals(SOCKET_PLUGIN_EVENT), 0);
    cancel.cancel();
}

/// A minimal ZDS client on a blocking seqpacket socket: connects, says hello, and
/// returns what it then received: (bytes, fds), or the connect error.
fn zds_hello(path: &Path) -> nix::Result<(usize, usize)> {
    let fd = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    connect(fd.as_raw_fd(), &UnixAddr::new(path)?)?;
    let timeout = nix::sys::time::TimeVal::new(5, 0);
    nix::sys::socket::setsockopt(&fd, nix::sys::socket::sockopt::ReceiveTimeout, &timeout)?;
    // A refused peer may already be closed: then the send fails, the receive tells.
    let _ = send(
        fd.as_raw_fd(),
        &ZdsHello::v1().encode_to_vec(),
        MsgFlags::MSG_NOSIGNAL,
    );
    let mut buf = [0u8; 1024];
    let mut iov = [IoSliceMut::new(&mut buf)];
    let mut cmsg = nix::cmsg_space!([RawFd; 4]);
    match recvmsg::<()>(fd.as_raw_fd(), &mut iov, Some(&mut cmsg), MsgFlags::empty()) {
        Ok(msg) => {
            let mut fds = 0;
            for c in msg.cmsgs()? {
                if let ControlMessageOwned::ScmRights(received) = c {
                    fds += received.len();
                    for raw in received {
                        // SAFETY: installed in our table by this recvmsg; closed once.
                        unsafe { libc::close(raw) };
                    }
                }
            }
            Ok((msg.bytes, fds))
        }
        Err(nix::errno::Errno::ECONNRESET) => Ok((0, 0)),
        Err(e) => Err(e),
    }
}

fn zds_gate(metrics: &Metrics) -> PeerGate {
    PeerGate::new(SOCKET_ZDS, 0, metrics)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_root_peer_gets_no_netns_on_zds() {
    if !test_support::can_run_root_tests() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    chmod(dir.path(), 0o755);
    let sock: PathBuf = dir.path().join("ztunnel/ztunnel.sock");
    let metrics = Metrics::new();
    let zds = ZdsServer::bind(&sock, zds_gate(&metrics)).unwrap();
    let cancel = CancellationToken::new();
    tokio::spawn({
        let (zds, cancel) = (zds.clone(), cancel.clone());
        async move { zds.run(cancel).await }
    });
    // An enrolled pod: a greeted peer would get its netns right away.
    zds.register(
        "uid-1",
        EnrolledPod {
            info: WorkloadInfo {
                name: "web-0".into(),
                namespace: "shop".into(),
                service_account: "web".into(),
            },
            netns: Some(Arc::new(NetnsHandle::open("/proc/self/ns/net").unwrap())),
        },
    );
    assert_eq!(mode(&sock), 0o600);

    // The mode stops the peer at connect.
    let path = sock.clone();
    let err = as_nobody(move || zds_hello(&path)).await.unwrap_err();
    assert_eq!(err, nix::errno::Errno::EACCES);

    // With the mode opened up, the peer check closes it before the greeting: nothing,
    // and no fd, ever reaches it.
    chmod(&sock, 0o666);
    chmod(sock.parent().unwrap(), 0o755);
    let path = sock.clone();
    let got = as_nobody(move || zds_hello(&path)).await.unwrap();
    assert_eq!(got, (0, 0), "a refused peer received (bytes, fds)");
    assert_eq!(metrics.peer_refusals(SOCKET_ZDS), 1);
    assert_eq!(zds.connections(), 0);

    // Root (ztunnel) is greeted with the pod and its netns.
    let root = SeqpacketStream::connect(&sock).unwrap();
    root.send(&ZdsHello::v1().encode_to_vec(), None)
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    let add = root.recv(&mut buf).await.unwrap();
    let request = WorkloadRequest::decode(&buf[..add.len]).unwrap();
    assert!(format!("{request:?}").contains("uid-1"), "{request:?}");
    assert_eq!(add.fds.len(), 1);
    root.send(&WorkloadResponse::ack().encode_to_vec(), None)
        .await
        .unwrap();
    assert_eq!(metrics.peer_refusals(SOCKET_ZDS), 1);
    cancel.cancel();
}
