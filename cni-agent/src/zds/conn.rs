//! One ztunnel connection: greeting, snapshot replay, then requests one at a time.
//! Anything unexpected (bad hello, garbage, silence, EOF) ends only this connection.

use super::{Conn, EnrolledPod, Inner, Job, ZdsError};
use prost::Message;
use shared_types::zds::{Version, WorkloadRequest, WorkloadResponse, ZdsHello, MAX_MESSAGE_SIZE};
use shared_types::zds_transport::SeqpacketStream;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Pending requests per connection before callers wait.
const JOB_QUEUE: usize = 64;
/// Backoff of the retries of replayed pods ztunnel refused.
const REPLAY_RETRY_MIN: Duration = Duration::from_millis(500);
const REPLAY_RETRY_MAX: Duration = Duration::from_secs(30);

pub(super) async fn serve(
    inner: Arc<Inner>,
    id: u64,
    stream: SeqpacketStream,
    cancel: CancellationToken,
) {
    let refused = match greet(&inner, &stream).await {
        Ok(refused) => refused,
        Err(e) => {
            tracing::warn!(
                connection = id,
                "dropping ZDS connection during greeting: {e}"
            );
            return;
        }
    };
    let (tx, mut rx) = mpsc::channel::<Job>(JOB_QUEUE);
    {
        let mut state = inner.lock();
        state.conns.push(Conn {
            id,
            jobs: tx.clone(),
        });
        inner.publish_count(&state);
    }
    if !refused.is_empty() {
        tokio::spawn(retry_refused(inner.clone(), refused, tx, cancel.clone()));
    }
    tracing::info!(
        connection = id,
        "ztunnel connected over ZDS (snapshot sent)"
    );
    let reason = loop {
        let mut buf = [0u8; MAX_MESSAGE_SIZE];
        tokio::select! {
            _ = cancel.cancelled() => break "shutting down".to_string(),
            job = rx.recv() => {
                let Some(job) = job else { break "no more requests".to_string() };
                let result = exchange(&inner, &stream, &job.bytes, job.fd).await;
                let fatal = match &result {
                    Err(ZdsError::Nack(_)) | Ok(()) => None,
                    Err(e) => Some(e.to_string()),
                };
                let _ = job.reply.send(result);
                if let Some(reason) = fatal {
                    break reason;
                }
            }
            unsolicited = stream.recv(&mut buf) => {
                break match unsolicited {
                    Ok(d) if d.len == 0 => "ztunnel closed the connection".to_string(),
                    Ok(d) => format!("unexpected {}-byte message between requests", d.len),
                    Err(e) => format!("receive failed: {e}"),
                };
            }
        }
    };
    {
        let mut state = inner.lock();
        state.conns.retain(|c| c.id != id);
        inner.publish_count(&state);
    }
    // Requests still queued fail with "connection closed" when `rx` drops.
    tracing::warn!(connection = id, "ZDS connection removed: {reason}");
}

/// Hello (V1 only), then every registered pod (`add` with its netns, or `keep` when
/// none is held), then `snapshot_sent`. Returns the pods ztunnel refused.
async fn greet(inner: &Inner, stream: &SeqpacketStream) -> Result<Vec<String>, ZdsError> {
    let mut buf = [0u8; MAX_MESSAGE_SIZE];
    let hello = tokio::time::timeout(inner.timeout, stream.recv(&mut buf))
        .await
        .map_err(|_| ZdsError::Timeout(inner.timeout))?
        .map_err(|e| ZdsError::Io(e.to_string()))?;
    if hello.len == 0 || hello.truncated {
        return Err(ZdsError::Io("no valid hello".into()));
    }
    decode_hello(&buf[..hello.len])?;
    let pods = inner.lock().registry.clone();
    let mut refused = Vec::new();
    for (uid, pod) in pods {
        let (bytes, fd) = replay_request(&uid, &pod);
        match exchange(inner, stream, &bytes, fd).await {
            Ok(()) => {}
            Err(ZdsError::Nack(reason)) => {
                tracing::warn!(uid, "ztunnel refused a replayed pod, will retry: {reason}");
                refused.push(uid);
            }
            Err(e) => return Err(e),
        }
    }
    exchange(
        inner,
        stream,
        &WorkloadRequest::snapshot_sent().encode_to_vec(),
        None,
    )
    .await?;
    Ok(refused)
}

/// A registered pod as replayed: `add` with a duplicate of the netns fd held since
/// enrollment (never a reopened path), or `keep` when none is held.
fn replay_request(uid: &str, pod: &EnrolledPod) -> (Vec<u8>, Option<OwnedFd>) {
    let fd = match pod.netns.as_deref().map(|ns| ns.file().try_clone()) {
        Some(Ok(file)) => Some(OwnedFd::from(file)),
        Some(Err(e)) => {
            tracing::warn!(
                uid,
                "duplicating the netns fd failed, replaying as keep: {e}"
            );
            None
        }
        None => {
            tracing::info!(uid, "no netns held for the pod, replaying as keep");
            None
        }
    };
    let bytes = match fd {
        Some(_) => WorkloadRequest::add(uid, pod.info.clone()).encode_to_vec(),
        None => WorkloadRequest::keep(uid).encode_to_vec(),
    };
    (bytes, fd)
}

/// Sends the replayed pods ztunnel refused again on this connection, with backoff,
/// until ztunnel takes them, they leave the registry or the connection ends. Else a
/// pod refused during a replay (its certificate could not be fetched while istiod
/// was down, say) would stay unserved until ztunnel reconnects.
async fn retry_refused(
    inner: Arc<Inner>,
    mut refused: Vec<String>,
    jobs: mpsc::Sender<Job>,
    cancel: CancellationToken,
) {
    let mut delay = REPLAY_RETRY_MIN;
    while !refused.is_empty() {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(REPLAY_RETRY_MAX);
        let mut still_refused = Vec::new();
        for uid in refused {
            // Gone from the registry: un-enrolled meanwhile.
            let Some(pod) = inner.lock().registry.get(&uid).cloned() else {
                continue;
            };
            let (bytes, fd) = replay_request(&uid, &pod);
            match super::request(&inner, &jobs, bytes, fd).await {
                Ok(()) => tracing::info!(uid, "ztunnel took a pod it refused in the replay"),
                Err(ZdsError::Nack(reason)) => {
                    tracing::debug!(uid, ?delay, "ztunnel still refuses the pod: {reason}");
                    still_refused.push(uid);
                }
                // The connection ended: the next one replays everything anyway.
                Err(_) => return,
            }
        }
        refused = still_refused;
    }
}

/// Sends one request and waits for its answer.
async fn exchange(
    inner: &Inner,
    stream: &SeqpacketStream,
    bytes: &[u8],
    fd: Option<OwnedFd>,
) -> Result<(), ZdsError> {
    stream
        .send(bytes, fd.as_ref().map(|f| f.as_fd()))
        .await
        .map_err(|e| ZdsError::Io(format!("send failed: {e}")))?;
    drop(fd);
    let mut buf = [0u8; MAX_MESSAGE_SIZE];
    let answer = tokio::time::timeout(inner.timeout, stream.recv(&mut buf))
        .await
        .map_err(|_| ZdsError::Timeout(inner.timeout))?
        .map_err(|e| ZdsError::Io(format!("receive failed: {e}")))?;
    if answer.len == 0 {
        return Err(ZdsError::Io("ztunnel closed the connection".into()));
    }
    if answer.truncated {
        return Err(ZdsError::Io("oversized answer".into()));
    }
    decode_answer(&buf[..answer.len])
}

/// ztunnel's hello: V1 only. `pub` (re-exported) for the fuzz target.
pub fn decode_hello(bytes: &[u8]) -> Result<ZdsHello, ZdsError> {
    let hello =
        ZdsHello::decode(bytes).map_err(|e| ZdsError::Io(format!("malformed hello: {e}")))?;
    if hello.version != Version::V1 as i32 {
        return Err(ZdsError::Io(format!(
            "unsupported ZDS version {}",
            hello.version
        )));
    }
    Ok(hello)
}

/// ztunnel's answer to a request: `Ok` for an ack, `Nack` with its reason for a
/// refusal. `pub` (re-exported) for the fuzz target.
pub fn decode_answer(bytes: &[u8]) -> Result<(), ZdsError> {
    let response = WorkloadResponse::decode(bytes)
        .map_err(|e| ZdsError::Io(format!("malformed answer: {e}")))?;
    if response.payload.is_none() {
        return Err(ZdsError::Io("answer without an ack".into()));
    }
    response.result().map_err(ZdsError::Nack)
}
