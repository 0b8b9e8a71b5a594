//! ztunnel's side of ZDS: a `WorkloadRequest` datagram from the node agent, with the
//! file descriptors that came with it. Every datagram is a valid request or a protocol
//! error (answered with a nack), never a panic; an `add` is accepted only with exactly
//! one network-namespace fd, `keep`/`del`/`snapshot_sent` only with none, every pod
//! request names a uid; and an accepted request, encoded again, decodes to the same.
//!
//! Input: byte 0 picks the fds (0 none, 1 a netns, 2 a file that is no namespace, 3 a
//! namespace that is not a network one, 4 two netns), the rest is the datagram.

#![no_main]

use std::fs::File;
use std::os::fd::OwnedFd;

use libfuzzer_sys::fuzz_target;
use prost::Message;
use shared_types::zds::{workload_request::Payload, WorkloadRequest, MAX_MESSAGE_SIZE};
use ztunnel::inpod::protocol::{decode, ProtocolError, Request};

fn fd(path: &str) -> OwnedFd {
    File::open(path).expect(path).into()
}

fn fds(kind: u8) -> Vec<OwnedFd> {
    match kind % 5 {
        0 => vec![],
        1 => vec![fd("/proc/self/ns/net")],
        2 => vec![fd("/dev/null")],
        3 => vec![fd("/proc/self/ns/uts")],
        _ => vec![fd("/proc/self/ns/net"), fd("/proc/self/ns/net")],
    }
}

/// The request as the agent would encode it.
fn encode(request: &Request) -> Vec<u8> {
    match request {
        Request::Add { uid, info, .. } => WorkloadRequest::add(uid, info.clone()),
        Request::Keep { uid } => WorkloadRequest::keep(uid),
        Request::Del { uid } => WorkloadRequest::del(uid),
        Request::SnapshotSent => WorkloadRequest::snapshot_sent(),
    }
    .encode_to_vec()
}

fn same(a: &Request, b: &Request) -> bool {
    match (a, b) {
        (
            Request::Add { uid, info, netns },
            Request::Add {
                uid: u,
                info: i,
                netns: n,
            },
        ) => uid == u && info == i && netns.inode() == n.inode(),
        (Request::Keep { uid }, Request::Keep { uid: u }) => uid == u,
        (Request::Del { uid }, Request::Del { uid: u }) => uid == u,
        (Request::SnapshotSent, Request::SnapshotSent) => true,
        _ => false,
    }
}

fuzz_target!(|input: &[u8]| {
    let [kind, bytes @ ..] = input else { return };
    // Longer datagrams are truncated by the receive buffer and refused before decoding.
    if bytes.len() > MAX_MESSAGE_SIZE {
        return;
    }
    let kind = kind % 5;
    let message = WorkloadRequest::decode(bytes);
    let result = decode(bytes, fds(kind));
    let message = match (message, &result) {
        (Err(_), Err(ProtocolError::Decode(_))) => return,
        (Err(e), _) => panic!("undecodable, yet not a Decode error: {e}"),
        (Ok(m), Err(ProtocolError::Decode(e))) => panic!("decodes as {m:?}, refused: {e}"),
        (Ok(m), _) => m,
    };
    // prost's own round trip: what decodes encodes to bytes that decode the same.
    assert_eq!(
        WorkloadRequest::decode(message.encode_to_vec().as_slice()).as_ref(),
        Ok(&message)
    );

    let request = match result {
        Ok(request) => request,
        Err(_) => return,
    };
    match (&request, &message.payload) {
        (Request::Add { uid, info, .. }, Some(Payload::Add(add))) => {
            assert_eq!(kind, 1, "an add with the wrong fds was accepted");
            assert!(!uid.is_empty());
            assert_eq!((uid, Some(info)), (&add.uid, add.workload_info.as_ref()));
        }
        (Request::Keep { uid }, Some(Payload::Keep(keep))) => {
            assert!(kind == 0 && !uid.is_empty() && *uid == keep.uid)
        }
        (Request::Del { uid }, Some(Payload::Del(del))) => {
            assert!(kind == 0 && !uid.is_empty() && *uid == del.uid)
        }
        (Request::SnapshotSent, Some(Payload::SnapshotSent(_))) => assert_eq!(kind, 0),
        (request, payload) => panic!("{request:?} from {payload:?}"),
    }

    // What the agent would send for this request is accepted as the same request.
    let again = decode(&encode(&request), fds(kind)).expect("the re-encoded request");
    assert!(same(&request, &again), "{request:?} became {again:?}");
});
