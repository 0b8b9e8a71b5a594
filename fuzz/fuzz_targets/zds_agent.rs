//! The agent's side of ZDS: what ztunnel sends back on the seqpacket socket, its hello
//! and its answer to each request. Either is accepted or refused as a protocol error,
//! never a panic; what decodes re-encodes to a message that decodes the same.

#![no_main]

use cni_agent::zds::{decode_answer, decode_hello, ZdsError};
use libfuzzer_sys::fuzz_target;
use prost::Message;
use shared_types::zds::{Version, WorkloadResponse, ZdsHello, MAX_MESSAGE_SIZE};

fuzz_target!(|data: &[u8]| {
    // The agent reads one datagram into MAX_MESSAGE_SIZE bytes; longer is refused first.
    if data.len() > MAX_MESSAGE_SIZE {
        return;
    }

    if let Ok(hello) = decode_hello(data) {
        assert_eq!(hello.version, Version::V1 as i32);
        let bytes = hello.encode_to_vec();
        assert_eq!(ZdsHello::decode(data).as_ref(), Ok(&hello));
        assert_eq!(decode_hello(&bytes).as_ref(), Ok(&hello));
    }

    match decode_answer(data) {
        Ok(()) => {
            let response = WorkloadResponse::decode(data).expect("an ack decodes");
            assert_eq!(response, WorkloadResponse::ack());
            assert_eq!(decode_answer(&response.encode_to_vec()), Ok(()));
        }
        Err(ZdsError::Nack(reason)) => {
            assert!(!reason.is_empty());
            let response = WorkloadResponse::decode(data).expect("a nack decodes");
            assert_eq!(response, WorkloadResponse::nack(reason.clone()));
            let bytes = response.encode_to_vec();
            assert_eq!(decode_answer(&bytes), Err(ZdsError::Nack(reason)));
            assert_eq!(
                WorkloadResponse::decode(bytes.as_slice()).as_ref(),
                Ok(&response)
            );
        }
        Err(ZdsError::Io(_)) => {}
        Err(e) => panic!("decoding cannot time out or find no connection: {e:?}"),
    }
});
