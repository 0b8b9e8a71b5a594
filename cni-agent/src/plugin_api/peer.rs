//! Who may talk to the agent's Unix sockets. The file modes (0600 sockets in a private
//! run dir) keep other users out already; this is the second lock, independent of how
//! the host's directories were created: every accepted connection's `SO_PEERCRED` uid
//! must be 0 or the one uid configured for that socket, or the connection is closed
//! before a single byte is read or written. Refusals are logged and counted in
//! `istio_cni_uds_peer_refused_total{socket}`.
//!
//! `SO_PEERCRED` holds the credentials of the thread that called `connect`, taken by
//! the kernel at that moment: a client cannot claim someone else's.

use crate::ops::metrics::{Metrics, SocketLabel};
use prometheus_client::metrics::counter::Counter;
use std::io;
use std::os::fd::AsFd;

/// `socket` label of `pluginevent.sock`.
pub const SOCKET_PLUGIN_EVENT: &str = "pluginevent";
/// `socket` label of `log.sock`.
pub const SOCKET_PLUGIN_LOG: &str = "log";
/// `socket` label of the ZDS socket.
pub const SOCKET_ZDS: &str = "zds";

/// A connected peer's credentials, as the kernel recorded them at `connect`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCred {
    pub uid: u32,
    pub gid: u32,
    pub pid: i32,
}

/// Reads `SO_PEERCRED` of a connected Unix socket.
pub fn peer_cred(socket: &impl AsFd) -> io::Result<PeerCred> {
    let cred = nix::sys::socket::getsockopt(socket, nix::sys::socket::sockopt::PeerCredentials)?;
    Ok(PeerCred {
        uid: cred.uid(),
        gid: cred.gid(),
        pid: cred.pid(),
    })
}

/// The check for one socket: root, plus one configured uid (0 = root only).
#[derive(Clone, Debug)]
pub struct PeerGate {
    socket: &'static str,
    allowed_uid: u32,
    refused: Counter,
}

impl PeerGate {
    pub fn new(socket: &'static str, allowed_uid: u32, metrics: &Metrics) -> Self {
        let refused = metrics
            .uds_peer_refused
            .get_or_create(&SocketLabel {
                socket: socket.into(),
            })
            .clone();
        PeerGate {
            socket,
            allowed_uid,
            refused,
        }
    }

    /// The socket's name, for logs and metric labels.
    pub fn socket(&self) -> &'static str {
        self.socket
    }

    /// The uid admitted besides root.
    pub fn allowed_uid(&self) -> u32 {
        self.allowed_uid
    }

    /// The uid that should own the socket file: `None` (us, root) unless another uid
    /// was configured, which must be able to `connect` through the 0600 mode.
    pub fn socket_owner(&self) -> Option<u32> {
        (self.allowed_uid != 0).then_some(self.allowed_uid)
    }

    pub fn permits(&self, uid: u32) -> bool {
        uid == 0 || uid == self.allowed_uid
    }

    /// Whether the peer on `socket` may be served; a refusal (or credentials that
    /// cannot be read) is logged and counted, and the caller drops the connection.
    pub fn admit(&self, socket: &impl AsFd) -> bool {
        match peer_cred(socket) {
            Ok(peer) if self.permits(peer.uid) => true,
            Ok(peer) => {
                self.refused.inc();
                tracing::warn!(
                    socket = self.socket,
                    peer_uid = peer.uid,
                    peer_gid = peer.gid,
                    peer_pid = peer.pid,
                    allowed_uid = self.allowed_uid,
                    "refused a connection: the peer is neither root nor the allowed uid"
                );
                false
            }
            Err(e) => {
                self.refused.inc();
                tracing::warn!(
                    socket = self.socket,
                    "refused a connection: cannot read the peer's credentials: {e}"
                );
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_and_the_configured_uid_only() {
        let metrics = Metrics::new();
        let root_only = PeerGate::new(SOCKET_ZDS, 0, &metrics);
        assert!(root_only.permits(0));
        assert!(!root_only.permits(1000));
        assert_eq!(root_only.socket_owner(), None);
        let with_uid = PeerGate::new(SOCKET_PLUGIN_EVENT, 1000, &metrics);
        assert!(with_uid.permits(0) && with_uid.permits(1000));
        assert!(!with_uid.permits(65534));
        assert_eq!(with_uid.socket_owner(), Some(1000));
    }

    #[test]
    fn own_uid_is_read_from_a_socket_pair() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let cred = peer_cred(&a).unwrap();
        // SAFETY: geteuid has no preconditions.
        assert_eq!(cred.uid, unsafe { libc::geteuid() });
        assert_eq!(cred.pid as u32, std::process::id());
        let metrics = Metrics::new();
        let gate = PeerGate::new(SOCKET_PLUGIN_LOG, cred.uid, &metrics);
        assert!(gate.admit(&a));
        assert_eq!(metrics.peer_refusals(SOCKET_PLUGIN_LOG), 0);
    }
}
