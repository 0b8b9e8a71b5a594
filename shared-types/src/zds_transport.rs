//! The ZDS socket: `AF_UNIX` `SOCK_SEQPACKET`, one message per datagram, with the
//! pod's netns travelling as one `SCM_RIGHTS` fd on an `add`.
//!
//! Built on nix + tokio's `AsyncFd` because the receive side must see `MSG_TRUNC`
//! (an oversized datagram is a protocol error, not a shorter message).

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use nix::sys::socket::{
    accept4, bind, connect, listen, recvmsg, sendmsg, socket, AddressFamily, Backlog,
    ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType, UnixAddr,
};
use tokio::io::unix::AsyncFd;

/// What one `recv` got.
#[derive(Debug)]
pub struct Datagram {
    /// Bytes received (0 means the peer closed the connection).
    pub len: usize,
    /// The datagram was longer than the buffer; its tail was lost.
    pub truncated: bool,
    /// File descriptors that came with it (closed when dropped).
    pub fds: Vec<OwnedFd>,
}

/// A connected seqpacket socket.
#[derive(Debug)]
pub struct SeqpacketStream {
    fd: AsyncFd<OwnedFd>,
}

/// A listening seqpacket socket (the node agent's side).
#[derive(Debug)]
pub struct SeqpacketListener {
    fd: AsyncFd<OwnedFd>,
}

fn register(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: an OwnedFd is open and returns the same raw fd for its whole life.
    Ok(unsafe { AsyncFd::register(fd) }?)
}

fn new_socket() -> io::Result<OwnedFd> {
    Ok(socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )?)
}

impl SeqpacketStream {
    /// Connects to the socket at `path`. Must run inside a tokio runtime.
    pub fn connect(path: &Path) -> io::Result<Self> {
        let fd = new_socket()?;
        connect(fd.as_raw_fd(), &UnixAddr::new(path)?)?;
        Ok(SeqpacketStream { fd: register(fd)? })
    }

    /// Sends one datagram, with `fd` attached as `SCM_RIGHTS` when given.
    pub async fn send(&self, data: &[u8], fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
        let raw: Vec<RawFd> = fd.iter().map(|f| f.as_raw_fd()).collect();
        loop {
            let mut guard = self.fd.writable().await?;
            let result = guard.try_io(|inner| {
                let iov = [IoSlice::new(data)];
                let cmsgs: Vec<ControlMessage> = if raw.is_empty() {
                    vec![]
                } else {
                    vec![ControlMessage::ScmRights(&raw)]
                };
                let sent = sendmsg::<()>(
                    inner.as_raw_fd(),
                    &iov,
                    &cmsgs,
                    MsgFlags::MSG_NOSIGNAL,
                    None,
                )?;
                if sent != data.len() {
                    return Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        "short seqpacket send",
                    ));
                }
                Ok(())
            });
            match result {
                Ok(result) => return result,
                Err(_would_block) => continue,
            }
        }
    }

    /// Receives one datagram into `buf`, with any fds that came with it.
    pub async fn recv(&self, buf: &mut [u8]) -> io::Result<Datagram> {
        loop {
            let mut guard = self.fd.readable().await?;
            let result = guard.try_io(|inner| recv_once(inner.as_raw_fd(), buf));
            match result {
                Ok(result) => return result,
                Err(_would_block) => continue,
            }
        }
    }

    /// A connected pair (tests).
    pub fn pair() -> io::Result<(Self, Self)> {
        let (a, b) = nix::sys::socket::socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        )?;
        Ok((
            SeqpacketStream { fd: register(a)? },
            SeqpacketStream { fd: register(b)? },
        ))
    }
}

/// The connected socket, e.g. to read the peer's credentials (`SO_PEERCRED`).
impl AsFd for SeqpacketStream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.get_ref().as_fd()
    }
}

fn recv_once(fd: RawFd, buf: &mut [u8]) -> io::Result<Datagram> {
    let mut iov = [IoSliceMut::new(buf)];
    // Room for more fds than the protocol allows, so extras are seen (and refused)
    // rather than silently truncated.
    let mut cmsg = nix::cmsg_space!([RawFd; 8]);
    let msg = recvmsg::<()>(fd, &mut iov, Some(&mut cmsg), MsgFlags::MSG_CMSG_CLOEXEC)?;
    let mut fds = Vec::new();
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(received) = c {
            // SAFETY: the kernel just installed these fds in our table; we own them.
            fds.extend(
                received
                    .into_iter()
                    .map(|raw| unsafe { OwnedFd::from_raw_fd(raw) }),
            );
        }
    }
    Ok(Datagram {
        len: msg.bytes,
        truncated: msg.flags.contains(MsgFlags::MSG_TRUNC)
            || msg.flags.contains(MsgFlags::MSG_CTRUNC),
        fds,
    })
}

impl SeqpacketListener {
    /// Binds `path`, replacing a stale socket file left by a previous process.
    pub fn bind(path: &Path) -> io::Result<Self> {
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let fd = new_socket()?;
        bind(fd.as_raw_fd(), &UnixAddr::new(path)?)?;
        listen(&fd, Backlog::new(64).map_err(io::Error::from)?)?;
        Ok(SeqpacketListener { fd: register(fd)? })
    }

    /// Waits for the next connection (from ztunnel) and returns it.
    pub async fn accept(&self) -> io::Result<SeqpacketStream> {
        loop {
            let mut guard = self.fd.readable().await?;
            let result = guard.try_io(|inner| {
                let raw = accept4(
                    inner.as_raw_fd(),
                    SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
                )?;
                // SAFETY: accept4 returned a new fd that nothing else owns.
                Ok(unsafe { OwnedFd::from_raw_fd(raw) })
            });
            match result {
                Ok(Ok(fd)) => return Ok(SeqpacketStream { fd: register(fd)? }),
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn fd_travels_and_truncation_is_reported() {
        let (a, b) = SeqpacketStream::pair().unwrap();
        let file = std::fs::File::open("/proc/self/ns/net").unwrap();
        a.send(b"hello", Some(file.as_fd())).await.unwrap();
        let mut buf = [0u8; 16];
        let got = b.recv(&mut buf).await.unwrap();
        assert_eq!(&buf[..got.len], b"hello");
        assert_eq!(got.fds.len(), 1);
        assert!(!got.truncated);

        a.send(&[7u8; 64], None).await.unwrap();
        let got = b.recv(&mut buf).await.unwrap();
        assert!(got.truncated, "a 64-byte datagram does not fit in 16 bytes");

        drop(a);
        assert_eq!(
            b.recv(&mut buf).await.unwrap().len,
            0,
            "EOF when the peer closes"
        );
    }

    #[tokio::test]
    async fn listener_accepts_and_replaces_stale_socket() {
        let dir = std::env::temp_dir().join(format!("zds-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("z.sock");
        std::fs::write(&path, b"stale").unwrap();
        let listener = SeqpacketListener::bind(&path).unwrap();
        let client = SeqpacketStream::connect(&path).unwrap();
        let server = listener.accept().await.unwrap();
        client.send(&[0x08, 0x01], None).await.unwrap();
        let mut buf = [0u8; 8];
        let got = server.recv(&mut buf).await.unwrap();
        assert_eq!(&buf[..got.len], &[0x08, 0x01]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
