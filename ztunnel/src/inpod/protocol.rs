//! ztunnel's side of a ZDS connection: hello, then typed requests in and
//! acks/nacks out. Every malformed request becomes a [`ProtocolError`] that the
//! caller answers with a nack; nothing a peer sends can crash ztunnel.

use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;

use prost::Message;
use shared_types::zds::{
    workload_request::Payload, WorkloadInfo, WorkloadRequest, WorkloadResponse, ZdsHello,
    MAX_MESSAGE_SIZE,
};
use shared_types::zds_transport::SeqpacketStream;

use mesh_runtime::netns::NetnsHandle;

/// A valid request from the node agent.
#[derive(Debug)]
pub enum Request {
    Add {
        uid: String,
        info: WorkloadInfo,
        netns: NetnsHandle,
    },
    Keep {
        uid: String,
    },
    Del {
        uid: String,
    },
    SnapshotSent,
}

/// A request that breaks the protocol; answered with a nack carrying this text.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProtocolError {
    #[error("message longer than {MAX_MESSAGE_SIZE} bytes (truncated)")]
    Truncated,
    #[error("undecodable WorkloadRequest: {0}")]
    Decode(String),
    #[error("WorkloadRequest without a payload")]
    Empty,
    #[error("{0} must not carry a file descriptor")]
    UnexpectedFd(&'static str),
    #[error("add for {0} carries no netns file descriptor")]
    MissingFd(String),
    #[error("add carries {0} file descriptors; exactly one netns is expected")]
    TooManyFds(usize),
    #[error("add for {uid}: {reason}")]
    NotNetns { uid: String, reason: String },
    #[error("{0} without a uid")]
    MissingUid(&'static str),
    #[error("add for {0} without workload info")]
    MissingWorkloadInfo(String),
}

/// What reading the next request gave.
pub enum Next {
    Request(Request),
    Invalid(ProtocolError),
    /// The agent closed the connection.
    Closed,
}

pub struct ZdsConnection {
    socket: SeqpacketStream,
}

impl ZdsConnection {
    /// Connects to the agent's socket and says hello.
    pub async fn connect(path: &Path) -> io::Result<Self> {
        let socket = SeqpacketStream::connect(path)?;
        socket.send(&ZdsHello::v1().encode_to_vec(), None).await?;
        Ok(ZdsConnection { socket })
    }

    pub async fn next(&mut self) -> io::Result<Next> {
        // Istio's limit exactly: MSG_TRUNC says when a datagram did not fit.
        let mut buf = [0u8; MAX_MESSAGE_SIZE];
        let datagram = self.socket.recv(&mut buf).await?;
        // A zero-length read on a seqpacket socket is the peer closing it.
        if datagram.len == 0 && !datagram.truncated {
            return Ok(Next::Closed);
        }
        if datagram.truncated {
            return Ok(Next::Invalid(ProtocolError::Truncated));
        }
        Ok(match decode(&buf[..datagram.len], datagram.fds) {
            Ok(request) => Next::Request(request),
            Err(e) => Next::Invalid(e),
        })
    }

    pub async fn answer(&self, result: Result<(), String>) -> io::Result<()> {
        let response = match result {
            Ok(()) => WorkloadResponse::ack(),
            Err(reason) => WorkloadResponse::nack(reason),
        };
        self.socket.send(&response.encode_to_vec(), None).await
    }
}

/// Decodes and checks one request and the fds that came with it.
/// `pub` for the fuzz target (fuzz/fuzz_targets/zds_request.rs).
pub fn decode(bytes: &[u8], mut fds: Vec<OwnedFd>) -> Result<Request, ProtocolError> {
    let request =
        WorkloadRequest::decode(bytes).map_err(|e| ProtocolError::Decode(e.to_string()))?;
    let no_fd = |what: &'static str, fds: &[OwnedFd]| {
        if fds.is_empty() {
            Ok(())
        } else {
            Err(ProtocolError::UnexpectedFd(what))
        }
    };
    match request.payload.ok_or(ProtocolError::Empty)? {
        Payload::Add(add) => {
            if add.uid.is_empty() {
                return Err(ProtocolError::MissingUid("add"));
            }
            let info = add
                .workload_info
                .ok_or_else(|| ProtocolError::MissingWorkloadInfo(add.uid.clone()))?;
            let fd = match fds.len() {
                0 => return Err(ProtocolError::MissingFd(add.uid)),
                1 => fds.remove(0),
                n => return Err(ProtocolError::TooManyFds(n)),
            };
            let netns = NetnsHandle::from_fd(fd, format!("the netns fd of pod {}", add.uid))
                .map_err(|e| ProtocolError::NotNetns {
                    uid: add.uid.clone(),
                    reason: e.to_string(),
                })?;
            Ok(Request::Add {
                uid: add.uid,
                info,
                netns,
            })
        }
        Payload::Keep(keep) => {
            no_fd("keep", &fds)?;
            if keep.uid.is_empty() {
                return Err(ProtocolError::MissingUid("keep"));
            }
            Ok(Request::Keep { uid: keep.uid })
        }
        Payload::Del(del) => {
            no_fd("del", &fds)?;
            if del.uid.is_empty() {
                return Err(ProtocolError::MissingUid("del"));
            }
            Ok(Request::Del { uid: del.uid })
        }
        Payload::SnapshotSent(_) => {
            no_fd("snapshot_sent", &fds)?;
            Ok(Request::SnapshotSent)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(bytes: &[u8], fds: Vec<OwnedFd>) -> ProtocolError {
        decode(bytes, fds).expect_err("must be refused")
    }

    fn some_fd() -> OwnedFd {
        std::fs::File::open("/dev/null").unwrap().into()
    }

    #[test]
    fn malformed_requests_are_named() {
        assert!(matches!(
            err(&[0xff, 0xff, 0xff], vec![]),
            ProtocolError::Decode(_)
        ));
        assert_eq!(err(&[], vec![]), ProtocolError::Empty);
        let del = WorkloadRequest::del("u1").encode_to_vec();
        assert_eq!(
            err(&del, vec![some_fd()]),
            ProtocolError::UnexpectedFd("del")
        );
        let snap = WorkloadRequest::snapshot_sent().encode_to_vec();
        assert_eq!(
            err(&snap, vec![some_fd()]),
            ProtocolError::UnexpectedFd("snapshot_sent")
        );
        let add = WorkloadRequest::add("u1", WorkloadInfo::default()).encode_to_vec();
        assert_eq!(err(&add, vec![]), ProtocolError::MissingFd("u1".into()));
        assert_eq!(
            err(&add, vec![some_fd(), some_fd()]),
            ProtocolError::TooManyFds(2)
        );
        assert!(matches!(
            err(&add, vec![some_fd()]),
            ProtocolError::NotNetns { .. }
        ));
        assert_eq!(
            err(&WorkloadRequest::del("").encode_to_vec(), vec![]),
            ProtocolError::MissingUid("del")
        );
    }

    #[test]
    fn a_netns_fd_is_accepted() {
        let add = WorkloadRequest::add("u1", WorkloadInfo::default()).encode_to_vec();
        let fd: OwnedFd = std::fs::File::open("/proc/self/ns/net").unwrap().into();
        assert!(matches!(decode(&add, vec![fd]), Ok(Request::Add { .. })));
        // Another namespace kind is refused.
        let uts: OwnedFd = std::fs::File::open("/proc/self/ns/uts").unwrap().into();
        assert!(matches!(
            err(&add, vec![uts]),
            ProtocolError::NotNetns { .. }
        ));
    }
}
