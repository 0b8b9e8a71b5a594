//! One nf_tables netlink socket in the CURRENT thread's netns: atomic batches and
//! dumps. No process is spawned; a pod's whole apply (dump, batch, dump to verify)
//! is a handful of syscalls on one socket.

use super::wire::{
    self, Attr, Msg, MsgType, NFNL_SUBSYS_NFTABLES, NLMSG_DONE, NLMSG_ERROR, NLM_F_DUMP,
    NLM_F_REQUEST,
};
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket, SocketAddr};
use nix::sys::socket::{setsockopt, sockopt};
use nix::sys::time::TimeVal;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

/// A kernel that does not answer in this long is treated as an error, not waited on.
const REPLY_TIMEOUT_SECS: i64 = 5;
/// Room for one datagram of a dump (the kernel fills up to a page or so per recv).
const RECV_BUFFER: usize = 64 * 1024;

/// Why an nf_tables (or ipset) netlink operation failed.
#[derive(Debug, thiserror::Error)]
pub enum NftError {
    /// The socket could not be opened, or a send or receive failed (the reply timeout included).
    #[error("nf_tables netlink socket: {0}")]
    Io(#[from] io::Error),
    /// The kernel answered a request with an error.
    #[error("nf_tables rejected the transaction ({op}): {source}")]
    Rejected {
        /// Which message or request was refused.
        op: String,
        /// The kernel's errno.
        #[source]
        source: io::Error,
    },
    /// A reply could not be parsed.
    #[error("malformed nf_tables reply")]
    Malformed,
    /// Read back after the transaction, the tables still differ from what was sent.
    #[error("nftables state still differs after the transaction: {0:?}")]
    NotConverged(crate::CheckResult),
}

/// A dumped object: its attributes' raw bytes (parsed on demand with [`wire::parse_attrs`]).
#[derive(Debug, Clone)]
pub struct Dumped(pub Vec<u8>);

impl Dumped {
    /// The object's attributes as (type, payload) pairs; empty if malformed.
    pub fn attrs(&self) -> Vec<(u16, &[u8])> {
        wire::parse_attrs(&self.0).unwrap_or_default()
    }

    /// A string attribute (NUL stripped).
    pub fn string(&self, ty: u16) -> Option<String> {
        self.attrs()
            .into_iter()
            .find(|(t, _)| *t == ty)
            .map(|(_, b)| {
                let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
                String::from_utf8_lossy(&b[..end]).into_owned()
            })
    }
}

/// A `NETLINK_NETFILTER` socket in the netns of the thread that opened it, with its
/// next sequence number.
pub struct Session {
    socket: Socket,
    seq: u32,
}

impl Session {
    /// Opens a socket in the calling thread's netns.
    pub fn open() -> Result<Session, NftError> {
        let mut socket = Socket::new(NETLINK_NETFILTER)?;
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        // SAFETY: the fd is owned by `socket`, which outlives this borrow.
        let fd = unsafe { BorrowedFd::borrow_raw(socket.as_raw_fd()) };
        setsockopt(
            &fd.as_fd(),
            sockopt::ReceiveTimeout,
            &TimeVal::new(REPLY_TIMEOUT_SECS, 0),
        )
        .map_err(io::Error::from)?;
        Ok(Session { socket, seq: 1 })
    }

    /// Sends `msgs` as one atomic batch and waits for every acknowledgement: either all
    /// of it is applied, or none of it and the first error is returned.
    pub fn transact(&mut self, msgs: &[Msg]) -> Result<(), NftError> {
        if msgs.is_empty() {
            return Ok(());
        }
        let first = self.seq;
        let (bytes, mut pending) = wire::encode_batch(msgs, first);
        self.seq += msgs.len() as u32 + 2;
        let batch_seqs = first..self.seq;
        self.socket.send(&bytes, 0)?;
        let mut buf = Vec::with_capacity(RECV_BUFFER);
        while !pending.is_empty() {
            buf.clear();
            self.socket.recv(&mut buf, 0)?;
            for reply in wire::parse_replies(&buf).ok_or(NftError::Malformed)? {
                // Only this batch's answers, its markers included (an earlier get's
                // ack may still be queued).
                if reply.ty != NLMSG_ERROR || !batch_seqs.contains(&reply.seq) {
                    continue;
                }
                let errno = reply.errno().ok_or(NftError::Malformed)?;
                if errno != 0 {
                    // The sequence number says which message the kernel refused.
                    let op = reply
                        .seq
                        .checked_sub(first + 1)
                        .and_then(|i| msgs.get(i as usize))
                        .map_or_else(|| "batch".to_owned(), |m| format!("{:?}", m.ty));
                    return Err(NftError::Rejected {
                        op,
                        source: io::Error::from_raw_os_error(-errno),
                    });
                }
                pending.retain(|&s| s != reply.seq);
            }
        }
        Ok(())
    }

    /// One request of any nfnetlink subsystem (`ty` = `subsystem << 8 | command`),
    /// acknowledged; `what` names it in errors.
    pub fn request(
        &mut self,
        ty: u16,
        family: u8,
        attrs: &[Attr],
        what: &str,
    ) -> Result<(), NftError> {
        let seq = self.seq;
        self.seq += 1;
        let bytes = wire::encode_message(ty, wire::NLM_F_ACK, seq, family, attrs);
        self.socket.send(&bytes, 0)?;
        let mut buf = Vec::with_capacity(RECV_BUFFER);
        loop {
            buf.clear();
            self.socket.recv(&mut buf, 0)?;
            for reply in wire::parse_replies(&buf).ok_or(NftError::Malformed)? {
                if reply.seq != seq || reply.ty != NLMSG_ERROR {
                    continue;
                }
                return match reply.errno().ok_or(NftError::Malformed)? {
                    0 => Ok(()),
                    errno => Err(NftError::Rejected {
                        op: what.to_owned(),
                        source: io::Error::from_raw_os_error(-errno),
                    }),
                };
            }
        }
    }

    /// One `NFT_MSG_GET*` request that is not a dump: its answer(s).
    pub fn get(&mut self, msg: Msg) -> Result<Vec<Dumped>, NftError> {
        let seq = self.seq;
        self.seq += 1;
        self.socket.send(&wire::encode_request(&msg, seq), 0)?;
        self.replies(seq, msg.ty, false)
    }

    /// Dumps every object of a kind (tables, chains, rules) of the `inet` family.
    pub fn dump(&mut self, ty: MsgType) -> Result<Vec<Dumped>, NftError> {
        self.dump_with(ty, Vec::new())
    }

    /// Dumps with selecting attributes (a set's elements need its table and name).
    pub fn dump_with(&mut self, ty: MsgType, attrs: Vec<Attr>) -> Result<Vec<Dumped>, NftError> {
        let seq = self.seq;
        self.seq += 1;
        let request = wire::encode_request(&Msg::new(ty, NLM_F_REQUEST | NLM_F_DUMP, attrs), seq);
        self.socket.send(&request, 0)?;
        self.replies(seq, ty, true)
    }

    /// Collects the objects answering request `seq`: a dump ends with `NLMSG_DONE`, a
    /// get with its one answer (then an ack, if asked for).
    fn replies(&mut self, seq: u32, ty: MsgType, dump: bool) -> Result<Vec<Dumped>, NftError> {
        let mut objects = Vec::new();
        let mut buf = Vec::with_capacity(RECV_BUFFER);
        loop {
            buf.clear();
            self.socket.recv(&mut buf, 0)?;
            for reply in wire::parse_replies(&buf).ok_or(NftError::Malformed)? {
                if reply.seq != seq {
                    continue;
                }
                match reply.ty {
                    NLMSG_DONE => return Ok(objects),
                    NLMSG_ERROR => {
                        let errno = reply.errno().ok_or(NftError::Malformed)?;
                        if errno == 0 {
                            return Ok(objects);
                        }
                        return Err(NftError::Rejected {
                            op: format!("{ty:?}"),
                            source: io::Error::from_raw_os_error(-errno),
                        });
                    }
                    t if t >> 8 == NFNL_SUBSYS_NFTABLES => {
                        let attrs = reply.payload.get(4..).ok_or(NftError::Malformed)?;
                        objects.push(Dumped(attrs.to_vec()));
                        if !dump {
                            return Ok(objects);
                        }
                    }
                    _ => {}
                }
            }
        }
    }
}
