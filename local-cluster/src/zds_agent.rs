//! A test double of the node agent's ZDS server, written against the shared-types
//! structs: it listens, replays its pods to every ztunnel that connects, and lets a
//! test send adds, dels and deliberately malformed datagrams.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use prost::Message;
use shared_types::zds::{WorkloadInfo, WorkloadRequest, WorkloadResponse, ZdsHello};
use shared_types::zds_transport::{SeqpacketListener, SeqpacketStream};
use tokio::runtime::Runtime;

/// One enrolled pod, replayed on every connect.
#[derive(Clone)]
struct Enrolled {
    info: WorkloadInfo,
    netns: PathBuf,
}

#[derive(Default)]
struct Inner {
    connections: Vec<Arc<tokio::sync::Mutex<SeqpacketStream>>>,
    pods: BTreeMap<String, Enrolled>,
    hellos: usize,
}

pub struct FakeAgent {
    runtime: Runtime,
    inner: Arc<Mutex<Inner>>,
    pub socket: PathBuf,
}

impl FakeAgent {
    /// Listens on `socket` and serves ztunnels in the background.
    pub fn start(socket: &Path) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let inner = Arc::new(Mutex::new(Inner::default()));
        let listener = runtime.block_on(async { SeqpacketListener::bind(socket) })?;
        let accept_inner = inner.clone();
        runtime.spawn(async move {
            while let Ok(stream) = listener.accept().await {
                let inner = accept_inner.clone();
                tokio::spawn(async move {
                    if let Err(e) = greet(stream, inner).await {
                        eprintln!("fake agent: connection failed: {e:#}");
                    }
                });
            }
        });
        Ok(FakeAgent {
            runtime,
            inner,
            socket: socket.to_path_buf(),
        })
    }

    /// Number of hellos seen (one per ztunnel connection).
    pub fn hellos(&self) -> usize {
        self.inner.lock().unwrap().hellos
    }

    /// Waits until `n` ztunnel connections have said hello and got their snapshot.
    pub fn wait_for_hellos(&self, n: usize, timeout: Duration) -> Result<()> {
        test_support::poll::wait_for("ztunnel to connect over ZDS", timeout, || {
            (self.hellos() >= n).then_some(())
        })
    }

    /// Sends an `add` with the pod's netns to the newest connection; returns the
    /// ack (Ok) or the nack's reason (Err) and the time to the answer.
    pub fn add(
        &self,
        uid: &str,
        info: WorkloadInfo,
        netns: &Path,
    ) -> Result<(Result<(), String>, Duration)> {
        let file =
            std::fs::File::open(netns).with_context(|| format!("opening {}", netns.display()))?;
        let request = WorkloadRequest::add(uid, info.clone()).encode_to_vec();
        let started = Instant::now();
        let answer = self.request_newest(&request, Some(file.into()))?;
        let took = started.elapsed();
        if answer.is_ok() {
            self.inner.lock().unwrap().pods.insert(
                uid.to_owned(),
                Enrolled {
                    info,
                    netns: netns.to_path_buf(),
                },
            );
        }
        Ok((answer, took))
    }

    /// Sends a `del` to every connection.
    pub fn del(&self, uid: &str) -> Result<()> {
        self.inner.lock().unwrap().pods.remove(uid);
        let request = WorkloadRequest::del(uid).encode_to_vec();
        for connection in self.connections() {
            let answer = self
                .runtime
                .block_on(exchange(&connection, &request, None))?;
            if let Err(reason) = answer {
                bail!("del {uid} was refused: {reason}");
            }
        }
        Ok(())
    }

    /// Sends arbitrary bytes (and fd) to the newest connection: for malformed input.
    pub fn send_raw(&self, bytes: &[u8], fd: Option<OwnedFd>) -> Result<Result<(), String>> {
        self.request_newest(bytes, fd)
    }

    fn connections(&self) -> Vec<Arc<tokio::sync::Mutex<SeqpacketStream>>> {
        self.inner.lock().unwrap().connections.clone()
    }

    fn request_newest(&self, bytes: &[u8], fd: Option<OwnedFd>) -> Result<Result<(), String>> {
        let connection = self
            .connections()
            .last()
            .cloned()
            .context("no ztunnel is connected")?;
        self.runtime.block_on(exchange(&connection, bytes, fd))
    }
}

/// Reads the hello, replays every enrolled pod, then sends snapshot_sent.
async fn greet(stream: SeqpacketStream, inner: Arc<Mutex<Inner>>) -> Result<()> {
    let mut buf = [0u8; 64];
    let hello = stream.recv(&mut buf).await?;
    let decoded = ZdsHello::decode(&buf[..hello.len])?;
    if decoded != ZdsHello::v1() {
        bail!("unexpected hello {decoded:?}");
    }
    let connection = Arc::new(tokio::sync::Mutex::new(stream));
    let pods: Vec<(String, Enrolled)> = inner.lock().unwrap().pods.clone().into_iter().collect();
    for (uid, pod) in pods {
        let request = WorkloadRequest::add(&uid, pod.info.clone()).encode_to_vec();
        let fd: Option<OwnedFd> = std::fs::File::open(&pod.netns).ok().map(Into::into);
        let request = if fd.is_some() {
            request
        } else {
            WorkloadRequest::keep(&uid).encode_to_vec()
        };
        if let Err(reason) = exchange(&connection, &request, fd).await? {
            eprintln!("fake agent: replay of {uid} refused: {reason}");
        }
    }
    if let Err(reason) = exchange(
        &connection,
        &WorkloadRequest::snapshot_sent().encode_to_vec(),
        None,
    )
    .await?
    {
        bail!("snapshot_sent refused: {reason}");
    }
    let mut inner = inner.lock().unwrap();
    inner.connections.push(connection);
    inner.hellos += 1;
    Ok(())
}

async fn exchange(
    connection: &tokio::sync::Mutex<SeqpacketStream>,
    bytes: &[u8],
    fd: Option<OwnedFd>,
) -> Result<Result<(), String>> {
    let connection = connection.lock().await;
    connection
        .send(bytes, fd.as_ref().map(|f| f.as_fd()))
        .await?;
    let mut buf = [0u8; 1024];
    let answer = tokio::time::timeout(Duration::from_secs(10), connection.recv(&mut buf))
        .await
        .context("ztunnel did not answer within 10 s")??;
    if answer.len == 0 {
        bail!("ztunnel closed the ZDS connection");
    }
    Ok(WorkloadResponse::decode(&buf[..answer.len])?.result())
}
