//! ZDS (`istio.workload.zds`): how the node agent hands pods to ztunnel.
//!
//! Hand-written prost messages (no `protoc`); the field numbers are the wire
//! contract with Istio's own istio-cni and ztunnel and must never change.

/// Largest datagram ztunnel accepts (Istio's ztunnel reads into 1024 bytes).
pub const MAX_MESSAGE_SIZE: usize = 1024;

/// ZDS protocol version, announced by ztunnel in [`ZdsHello`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Version {
    /// Protobuf's zero value; not a real version.
    NotUsed = 0,
    /// Version 1, the current protocol.
    V1 = 1,
}

/// ztunnel → agent, first message on every connection.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ZdsHello {
    /// The protocol version ztunnel speaks ([`Version`]).
    #[prost(enumeration = "Version", tag = "1")]
    pub version: i32,
}

/// Who a pod is: sent with [`AddWorkload`] so ztunnel knows the pod's identity.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct WorkloadInfo {
    /// Pod name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Pod namespace.
    #[prost(string, tag = "2")]
    pub namespace: String,
    /// The pod's service account.
    #[prost(string, tag = "3")]
    pub service_account: String,
}

/// A pod to serve; its netns fd travels in `SCM_RIGHTS` with this message.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AddWorkload {
    /// The pod's uid.
    #[prost(string, tag = "1")]
    pub uid: String,
    /// The pod's name, namespace and service account.
    #[prost(message, optional, tag = "2")]
    pub workload_info: Option<WorkloadInfo>,
}

/// A pod (during snapshot replay) whose netns the agent could not open: keep it.
#[derive(Clone, PartialEq, prost::Message)]
pub struct KeepWorkload {
    /// The pod's uid.
    #[prost(string, tag = "1")]
    pub uid: String,
}

/// A pod to stop serving. Field 2 on the wire, as in Istio.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DelWorkload {
    /// The pod's uid.
    #[prost(string, tag = "2")]
    pub uid: String,
}

/// End of the replay that follows each connect.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SnapshotSent {}

/// Agent → ztunnel: one request per datagram, each answered by a [`WorkloadResponse`].
#[derive(Clone, PartialEq, prost::Message)]
pub struct WorkloadRequest {
    /// What is asked; `None` if the request has no payload this build knows.
    #[prost(oneof = "workload_request::Payload", tags = "1, 2, 3, 5")]
    pub payload: Option<workload_request::Payload>,
}

/// The oneof of [`WorkloadRequest`].
pub mod workload_request {
    /// What the agent asks ztunnel to do.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Payload {
        /// Start serving a pod.
        #[prost(message, tag = "1")]
        Add(super::AddWorkload),
        /// Stop serving a pod.
        #[prost(message, tag = "2")]
        Del(super::DelWorkload),
        /// The replay after a connect is complete: ztunnel drops the pods it was not sent.
        #[prost(message, tag = "3")]
        SnapshotSent(super::SnapshotSent),
        /// During replay, keep a pod ztunnel already serves although its netns was not sent.
        #[prost(message, tag = "5")]
        Keep(super::KeepWorkload),
    }
}

/// ztunnel → agent after every request. An empty `error` is an ack.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Ack {
    /// Why ztunnel refused the request; empty for success.
    #[prost(string, tag = "1")]
    pub error: String,
}

/// ztunnel → agent: the answer to one [`WorkloadRequest`].
#[derive(Clone, PartialEq, prost::Message)]
pub struct WorkloadResponse {
    /// The answer; `None` if the response has no payload this build knows.
    #[prost(oneof = "workload_response::Payload", tags = "1")]
    pub payload: Option<workload_response::Payload>,
}

/// The oneof of [`WorkloadResponse`].
pub mod workload_response {
    /// ztunnel's answer.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Payload {
        /// Success, or a refusal with its reason.
        #[prost(message, tag = "1")]
        Ack(super::Ack),
    }
}

impl WorkloadRequest {
    /// Add pod `uid`; its netns fd must be sent with this message.
    pub fn add(uid: impl Into<String>, info: WorkloadInfo) -> Self {
        Self::with(workload_request::Payload::Add(AddWorkload {
            uid: uid.into(),
            workload_info: Some(info),
        }))
    }
    /// Delete pod `uid`.
    pub fn del(uid: impl Into<String>) -> Self {
        Self::with(workload_request::Payload::Del(DelWorkload {
            uid: uid.into(),
        }))
    }
    /// Keep pod `uid` (snapshot replay only).
    pub fn keep(uid: impl Into<String>) -> Self {
        Self::with(workload_request::Payload::Keep(KeepWorkload {
            uid: uid.into(),
        }))
    }
    /// Marks the end of the snapshot replay.
    pub fn snapshot_sent() -> Self {
        Self::with(workload_request::Payload::SnapshotSent(SnapshotSent {}))
    }
    fn with(payload: workload_request::Payload) -> Self {
        WorkloadRequest {
            payload: Some(payload),
        }
    }
}

impl WorkloadResponse {
    /// A successful ack.
    pub fn ack() -> Self {
        Self::nack(String::new())
    }
    /// A refusal; `error` says why.
    pub fn nack(error: impl Into<String>) -> Self {
        WorkloadResponse {
            payload: Some(workload_response::Payload::Ack(Ack {
                error: error.into(),
            })),
        }
    }
    /// `Ok` for an ack, `Err(reason)` for a nack or an empty response.
    pub fn result(&self) -> Result<(), String> {
        match &self.payload {
            Some(workload_response::Payload::Ack(ack)) if ack.error.is_empty() => Ok(()),
            Some(workload_response::Payload::Ack(ack)) => Err(ack.error.clone()),
            None => Err("empty response".into()),
        }
    }
}

impl ZdsHello {
    /// The hello for protocol version 1.
    pub fn v1() -> Self {
        ZdsHello {
            version: Version::V1 as i32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn wire_bytes_match_istio() {
        assert_eq!(ZdsHello::v1().encode_to_vec(), [0x08, 0x01]);
        assert_eq!(WorkloadResponse::ack().encode_to_vec(), [0x0a, 0x00]);
        assert_eq!(
            WorkloadRequest::snapshot_sent().encode_to_vec(),
            [0x1a, 0x00]
        );
        // DelWorkload's uid is field 2: 0x12 (del) len, 0x12 (uid) len "u1".
        assert_eq!(
            WorkloadRequest::del("u1").encode_to_vec(),
            [0x12, 0x04, 0x12, 0x02, b'u', b'1']
        );
        // KeepWorkload is oneof tag 5.
        assert_eq!(
            WorkloadRequest::keep("u").encode_to_vec(),
            [0x2a, 0x03, 0x0a, 0x01, b'u']
        );
    }

    #[test]
    fn add_round_trips() {
        let info = WorkloadInfo {
            name: "web-0".into(),
            namespace: "shop".into(),
            service_account: "web".into(),
        };
        let bytes = WorkloadRequest::add("uid-1", info.clone()).encode_to_vec();
        let decoded = WorkloadRequest::decode(bytes.as_slice()).unwrap();
        match decoded.payload {
            Some(workload_request::Payload::Add(add)) => {
                assert_eq!(add.uid, "uid-1");
                assert_eq!(add.workload_info, Some(info));
            }
            other => panic!("decoded {other:?}"),
        }
    }

    #[test]
    fn nack_carries_the_reason() {
        let bytes = WorkloadResponse::nack("no such netns").encode_to_vec();
        let decoded = WorkloadResponse::decode(bytes.as_slice()).unwrap();
        assert_eq!(decoded.result(), Err("no such netns".into()));
        assert_eq!(WorkloadResponse::ack().result(), Ok(()));
    }
}
