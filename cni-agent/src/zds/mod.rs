//! The ZDS server: ztunnel connects to us on `ZTUNNEL_UDS_ADDRESS` and we hand it pods.
//!
//! Each connection is owned by one task ([`conn`]) that greets it (hello, snapshot
//! replay of every enrolled pod, `snapshot_sent`) and then serves requests from a
//! channel one at a time, waiting for the ack of each. New pods go to the NEWEST
//! connection (a restarting ztunnel's successor takes over), deletions to all of them.
//! The registry of enrolled pods lives here so every new connection gets a snapshot.
//! It holds each pod's netns as the open file the agent got at enrollment, never as a
//! path: a `/proc/<pid>/ns/net` path names another pod's netns once the pid is reused.
//!
//! Only ztunnel may connect: the socket is 0600 from the moment it exists (owned by
//! `ZTUNNEL_PEER_UID` when one is configured), and a peer whose `SO_PEERCRED` uid is
//! neither 0 nor that uid is closed before it is sent anything, least of all a netns
//! ([`PeerGate`]). Istio leaves the mode to the umask and checks no credentials.

mod conn;

pub use conn::{decode_answer, decode_hello};

use shared_types::zds::{WorkloadInfo, WorkloadRequest};
use shared_types::zds_transport::SeqpacketListener;
use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::plugin_api::peer::PeerGate;
use mesh_runtime::fs::bind_private;
use mesh_runtime::netns::NetnsHandle;

/// The ZDS socket's mode: ztunnel runs as root (or as the configured uid, which then
/// owns the socket).
pub const ZDS_SOCKET_MODE: u32 = 0o600;

/// How long ztunnel may take to say hello or answer a request before we drop it.
pub const DEFAULT_ZDS_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ZdsError {
    #[error("ztunnel is not connected to the node agent on {0}")]
    NotConnected(String),
    #[error("ztunnel refused the request: {0}")]
    Nack(String),
    #[error("ztunnel did not answer within {0:?}")]
    Timeout(Duration),
    #[error("ZDS connection failed: {0}")]
    Io(String),
}

/// A pod ztunnel serves; replayed on every (re)connect: `add` with a duplicate of the
/// held netns fd, or `keep` when there is none.
#[derive(Debug, Clone)]
pub struct EnrolledPod {
    pub info: WorkloadInfo,
    pub netns: Option<Arc<NetnsHandle>>,
}

/// One request for a connection task; the answer comes back on `reply`.
struct Job {
    bytes: Vec<u8>,
    fd: Option<OwnedFd>,
    reply: oneshot::Sender<Result<(), ZdsError>>,
}

struct Conn {
    id: u64,
    jobs: mpsc::Sender<Job>,
}

#[derive(Default)]
struct State {
    registry: BTreeMap<String, EnrolledPod>,
    /// Oldest first; the last is the newest.
    conns: Vec<Conn>,
}

struct Inner {
    path: PathBuf,
    gate: PeerGate,
    timeout: Duration,
    state: Mutex<State>,
    count: watch::Sender<usize>,
    next_id: AtomicU64,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn publish_count(&self, state: &State) {
        self.count.send_replace(state.conns.len());
    }

    fn not_connected(&self) -> ZdsError {
        ZdsError::NotConnected(self.path.display().to_string())
    }
}

/// The listening ZDS server. Cheap to clone.
#[derive(Clone)]
pub struct ZdsServer {
    inner: Arc<Inner>,
    listener: Arc<Mutex<Option<SeqpacketListener>>>,
}

impl ZdsServer {
    /// Binds `path` (creating its parent dir, replacing a stale socket); `gate` says
    /// which peers are served.
    pub fn bind(path: &Path, gate: PeerGate) -> std::io::Result<Self> {
        Self::bind_with_timeout(path, DEFAULT_ZDS_TIMEOUT, gate)
    }

    pub fn bind_with_timeout(
        path: &Path,
        timeout: Duration,
        gate: PeerGate,
    ) -> std::io::Result<Self> {
        if let Some(parent) = path.parent() {
            // Shared with ztunnel's pod (a hostPath both mount): an existing dir is left
            // as it is; the socket's own mode and the peer check are the locks.
            std::fs::create_dir_all(parent)?;
        }
        let listener = bind_private(
            path,
            ZDS_SOCKET_MODE,
            gate.socket_owner(),
            SeqpacketListener::bind,
        )?;
        let (count, _) = watch::channel(0);
        Ok(ZdsServer {
            inner: Arc::new(Inner {
                path: path.to_path_buf(),
                gate,
                timeout,
                state: Mutex::default(),
                count,
                next_id: AtomicU64::new(1),
            }),
            listener: Arc::new(Mutex::new(Some(listener))),
        })
    }

    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Accepts ztunnel connections until `cancel` fires. Call once.
    pub async fn run(&self, cancel: CancellationToken) {
        let listener = self
            .listener
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let Some(listener) = listener else {
            tracing::error!("ZDS server run twice");
            return;
        };
        tracing::info!(path = %self.inner.path.display(), "ZDS server listening");
        loop {
            let stream = tokio::select! {
                _ = cancel.cancelled() => break,
                accepted = listener.accept() => accepted,
            };
            match stream {
                // Before the greeting: a refused peer is sent nothing.
                Ok(stream) if !self.inner.gate.admit(&stream) => drop(stream),
                Ok(stream) => {
                    let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
                    tokio::spawn(conn::serve(
                        self.inner.clone(),
                        id,
                        stream,
                        cancel.child_token(),
                    ));
                }
                Err(e) => {
                    tracing::warn!("accepting a ZDS connection failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    /// Number of ztunnel connections that completed their snapshot.
    pub fn connections(&self) -> usize {
        self.inner.lock().conns.len()
    }

    /// Follows [`ZdsServer::connections`].
    pub fn watch_connections(&self) -> watch::Receiver<usize> {
        self.inner.count.subscribe()
    }

    /// Whether `uid` is in the registry.
    pub fn is_enrolled(&self, uid: &str) -> bool {
        self.inner.lock().registry.contains_key(uid)
    }

    pub fn enrolled(&self) -> BTreeMap<String, EnrolledPod> {
        self.inner.lock().registry.clone()
    }

    /// Records a pod without telling anyone (startup: the first connection's snapshot
    /// carries it).
    pub fn register(&self, uid: &str, pod: EnrolledPod) {
        self.inner.lock().registry.insert(uid.to_string(), pod);
    }

    /// Hands a pod to the newest ztunnel with its netns and waits for the ack; only an
    /// acked pod enters the registry.
    pub async fn add(
        &self,
        uid: &str,
        info: WorkloadInfo,
        netns: &Arc<NetnsHandle>,
    ) -> Result<(), ZdsError> {
        let fd: OwnedFd = netns
            .file()
            .try_clone()
            .map_err(|e| ZdsError::Io(format!("duplicating the netns fd: {e}")))?
            .into();
        let jobs = {
            let state = self.inner.lock();
            state.conns.last().map(|c| c.jobs.clone())
        };
        let jobs = jobs.ok_or_else(|| self.inner.not_connected())?;
        let bytes = prost::Message::encode_to_vec(&WorkloadRequest::add(uid, info.clone()));
        request(&self.inner, &jobs, bytes, Some(fd)).await?;
        self.register(
            uid,
            EnrolledPod {
                info,
                netns: Some(netns.clone()),
            },
        );
        Ok(())
    }

    /// Forgets a pod and tells every connection; the first failure is returned after
    /// all were tried.
    pub async fn del(&self, uid: &str) -> Result<(), ZdsError> {
        let jobs: Vec<_> = {
            let mut state = self.inner.lock();
            state.registry.remove(uid);
            state.conns.iter().map(|c| c.jobs.clone()).collect()
        };
        let bytes = prost::Message::encode_to_vec(&WorkloadRequest::del(uid));
        let mut result = Ok(());
        for jobs in jobs {
            if let Err(e) = request(&self.inner, &jobs, bytes.clone(), None).await {
                tracing::warn!(uid, "ZDS del failed on one connection: {e}");
                if result.is_ok() {
                    result = Err(e);
                }
            }
        }
        result
    }
}

/// Queues one request on a connection and waits for ztunnel's answer.
async fn request(
    inner: &Inner,
    jobs: &mpsc::Sender<Job>,
    bytes: Vec<u8>,
    fd: Option<OwnedFd>,
) -> Result<(), ZdsError> {
    let (reply, answer) = oneshot::channel();
    let job = Job { bytes, fd, reply };
    if jobs.send(job).await.is_err() {
        return Err(inner.not_connected());
    }
    // Queued behind at most a few requests, each answered within the timeout.
    match tokio::time::timeout(inner.timeout * 4, answer).await {
        Ok(Ok(result)) => result,
        Ok(Err(_)) => Err(ZdsError::Io("the ZDS connection closed".into())),
        Err(_) => Err(ZdsError::Timeout(inner.timeout * 4)),
    }
}

#[cfg(test)]
mod tests;
