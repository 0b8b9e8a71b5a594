//! kube-apiserver-lite: a small Kubernetes API server for the demo and the e2e tests.
//!
//! It speaks the real REST API over plain HTTP, so kube-rs clients in our binaries
//! and a real `kubectl` use their normal code paths: discovery, get, list, watch (with
//! bookmarks, selectors and 410 on expired resourceVersions), create, update, delete,
//! merge / strategic-merge / JSON patch, server-side apply, and the `/status`
//! subresource. Objects are stored unstructured (JSON), see [`resources`] for the types
//! served. With a state file every change is persisted, so a restarted server keeps
//! its objects and resourceVersions and clients simply resume their watches.
//! Service account tokens (TokenRequest, TokenReview, SelfSubjectReview) are signed and
//! checked as a real server does, see `tokens.rs`. The same port also answers TLS
//! (self-signed, see `tls.rs`), because kubectl sends a `--token` only over https.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use kube_apiserver_lite::{write_kubeconfig, ApiServer};
//! let server = ApiServer::bind("127.0.0.1:0", None).await?;
//! write_kubeconfig("/tmp/kubeconfig".as_ref(), &server.url())?;
//! let control = server.spawn();
//! // ... kubectl --kubeconfig /tmp/kubeconfig get pods -A ...
//! control.shutdown();
//! control.stopped().await;
//! # Ok(()) }
//! ```
//!
//! Not a product: no authentication (tokens are only issued and reviewed), no admission, no graceful pod deletion or
//! finalizers (namespaces do pass through Terminating), no managedFields, no OpenAPI schemas, lists are never paginated.

mod catalog;
mod crds;
mod custom;
mod discovery;
mod errors;
mod event_versions;
mod handlers;
mod meta;
mod openapi;
mod patch;
mod persist;
mod pod_logs;
mod protobuf;
pub mod resources;
mod routes;
mod schema;
mod selectors;
pub mod service_ips;
mod store;
mod table;
mod tls;
mod tokens;
mod watch;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, ToSocketAddrs};
use tokio::sync::watch as signal;

pub use errors::ApiError;
pub use routes::{query_escape, Query};
pub use selectors::{FieldSelector, LabelSelector};
pub use tokens::DEFAULT_ISSUER;

/// Tunables; the defaults suit tests and the demo.
#[derive(Debug, Clone)]
pub struct Options {
    /// JSON snapshot written on every change and loaded on start.
    pub state_file: Option<PathBuf>,
    /// Events kept for watches resuming from a resourceVersion; older ones get 410.
    pub event_log_capacity: usize,
    /// How often a watch that asked for bookmarks gets one.
    pub bookmark_interval: Duration,
    /// Upper bound of a watch's life (clients re-watch after it).
    pub max_watch: Duration,
    /// How long a deleted namespace stays Terminating before it and its contents go.
    pub namespace_finalize_delay: Duration,
    /// `iss` of service account tokens, and their audience when a request names none.
    pub service_account_issuer: String,
    /// PKCS#8 PEM ECDSA P-256 key signing service account tokens, created when missing.
    /// Default: beside the state file (`<state>.sa.key`), so tokens survive a restart;
    /// without a state file, a key in memory only.
    pub service_account_key_file: Option<PathBuf>,
    /// Service ClusterIP ranges, primary family first (`--service-cluster-ip-range`).
    pub service_cluster_ip_range: service_ips::ServiceRanges,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            state_file: None,
            event_log_capacity: 10_000,
            bookmark_interval: Duration::from_secs(5),
            max_watch: Duration::from_secs(30 * 60),
            namespace_finalize_delay: Duration::from_millis(500),
            service_account_issuer: DEFAULT_ISSUER.to_string(),
            service_account_key_file: None,
            service_cluster_ip_range: Default::default(),
        }
    }
}

/// Failure to start the server.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot listen: {0}")]
    Listen(#[source] std::io::Error),
    #[error("cannot load the state file: {0}")]
    State(#[source] std::io::Error),
    #[error("cannot load or create the service account signing key: {0}")]
    Key(#[source] std::io::Error),
}

/// Counters a test can read to check what happened.
#[derive(Debug, Default)]
struct Counters {
    watches: AtomicU64,
    expired: AtomicU64,
    bookmarks: AtomicU64,
}

/// A snapshot of the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    /// Watch requests served.
    pub watches: u64,
    /// Watches answered with 410 Expired (too old or unknown resourceVersion).
    pub expired_watches: u64,
    /// Periodic BOOKMARK events sent to watches that asked for them.
    pub bookmarks: u64,
}

/// State shared by the accept loop, connections and watch tasks.
struct Shared {
    /// What is served (built-in resources, and those of established CRDs).
    catalog: Arc<catalog::Catalog>,
    store: store::Store,
    tokens: tokens::Signer,
    /// `None` when no certificate could be made: plain HTTP only.
    tls: Option<tokio_rustls::TlsAcceptor>,
    /// The serving certificate (self-signed), PEM.
    tls_certificate: Option<String>,
    options: Options,
    addr: SocketAddr,
    stats: Counters,
    shutdown: signal::Sender<bool>,
    /// Bumped to end every open watch.
    disconnect: signal::Sender<u64>,
    /// Bumped when a CRD is written: watches of a resource no longer served end.
    crds_changed: signal::Sender<u64>,
    /// While true, new watches wait before they start.
    paused: signal::Sender<bool>,
    /// False once the accept loop has ended.
    running: signal::Sender<bool>,
}

/// A bound, not yet running server.
pub struct ApiServer {
    listener: TcpListener,
    shared: Arc<Shared>,
}

impl ApiServer {
    /// Binds `addr` (use port 0 for any free port) with default options.
    pub async fn bind(
        addr: impl ToSocketAddrs,
        state_file: Option<PathBuf>,
    ) -> Result<ApiServer, StartError> {
        Self::bind_with(
            addr,
            Options {
                state_file,
                ..Options::default()
            },
        )
        .await
    }

    pub async fn bind_with(
        addr: impl ToSocketAddrs,
        options: Options,
    ) -> Result<ApiServer, StartError> {
        let listener = TcpListener::bind(addr).await.map_err(StartError::Listen)?;
        Self::from_listener(listener, options)
    }

    /// Serves on an already bound listener.
    pub fn from_listener(listener: TcpListener, options: Options) -> Result<ApiServer, StartError> {
        let addr = listener.local_addr().map_err(StartError::Listen)?;
        let catalog = Arc::new(catalog::Catalog::default());
        let store = store::Store::open(
            options.state_file.clone(),
            options.event_log_capacity,
            options.service_cluster_ip_range.clone(),
            catalog.clone(),
        )
        .map_err(StartError::State)?;
        let key_file = options
            .service_account_key_file
            .clone()
            .or_else(|| options.state_file.as_deref().map(tokens::key_file_beside));
        let tokens =
            tokens::Signer::open(options.service_account_issuer.clone(), key_file.as_deref())
                .map_err(StartError::Key)?;
        let kept = options
            .state_file
            .as_deref()
            .map(|state| tls::files_beside(state, addr));
        let (tls, tls_certificate) = match tls::acceptor(addr, kept) {
            Ok((acceptor, pem)) => (Some(acceptor), Some(pem)),
            Err(e) => {
                tracing::warn!("serving plain HTTP only: no TLS certificate: {e}");
                (None, None)
            }
        };
        let shared = Arc::new(Shared {
            catalog,
            store,
            tokens,
            tls,
            tls_certificate,
            options,
            addr,
            stats: Counters::default(),
            shutdown: signal::channel(false).0,
            disconnect: signal::channel(0).0,
            crds_changed: signal::channel(0).0,
            paused: signal::channel(false).0,
            running: signal::channel(true).0,
        });
        Ok(ApiServer { listener, shared })
    }

    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// The self-signed serving certificate in PEM, when TLS is served: the CA that
    /// in-cluster clients trust (`kube-root-ca.crt`).
    pub fn certificate_pem(&self) -> Option<&str> {
        self.shared.tls_certificate.as_deref()
    }

    /// `http://<addr>`, the `server:` of a kubeconfig.
    pub fn url(&self) -> String {
        format!("http://{}", self.shared.addr)
    }

    pub fn control(&self) -> Control {
        Control {
            shared: self.shared.clone(),
        }
    }

    /// Serves until [`Control::shutdown`].
    pub async fn run(self) {
        let shared = self.shared;
        let mut shutdown = shared.shutdown.subscribe();
        loop {
            tokio::select! {
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        tokio::spawn(serve_connection(shared.clone(), stream));
                    }
                    Err(e) => {
                        tracing::warn!("accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                _ = until_true(&mut shutdown) => break,
            }
        }
        drop(self.listener);
        shared.running.send_replace(false);
    }

    /// Runs the server on the current tokio runtime; the returned handle stops it.
    pub fn spawn(self) -> Control {
        let control = self.control();
        tokio::spawn(self.run());
        control
    }
}

async fn serve_connection(shared: Arc<Shared>, stream: tokio::net::TcpStream) {
    let _ = stream.set_nodelay(true);
    let mut shutdown = shared.shutdown.subscribe();
    let tls = match &shared.tls {
        Some(acceptor) => tokio::select! {
            tls = tls::starts_with_handshake(&stream) => tls.then(|| acceptor.clone()),
            _ = until_true(&mut shutdown) => return,
        },
        None => None,
    };
    let Some(acceptor) = tls else {
        return serve_http(shared, TokioIo::new(stream), shutdown).await;
    };
    let accepted = tokio::select! {
        accepted = acceptor.accept(stream) => accepted,
        _ = until_true(&mut shutdown) => return,
    };
    match accepted {
        Ok(stream) => serve_http(shared, TokioIo::new(stream), shutdown).await,
        Err(e) => tracing::debug!("TLS handshake failed: {e}"),
    }
}

async fn serve_http<I>(shared: Arc<Shared>, io: I, mut shutdown: signal::Receiver<bool>)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let handler = shared.clone();
    let service = service_fn(move |req| {
        let shared = handler.clone();
        async move { Ok::<_, std::convert::Infallible>(handlers::handle(shared, req).await) }
    });
    let conn = http1::Builder::new().serve_connection(io, service);
    tokio::pin!(conn);
    tokio::select! {
        result = conn.as_mut() => {
            if let Err(e) = result {
                tracing::debug!("connection ended: {e}");
            }
        }
        _ = until_true(&mut shutdown) => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

/// Resolves once the flag is (or becomes) true; a closed channel counts as true.
async fn until_true(rx: &mut signal::Receiver<bool>) {
    let _ = rx.wait_for(|v| *v).await.map(|_| ());
}

/// A handle on a running server: stop it, and test hooks for watch behaviour.
#[derive(Clone)]
pub struct Control {
    shared: Arc<Shared>,
}

impl Control {
    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.shared.addr)
    }

    /// `https://<addr>`: the same server over TLS, with a self-signed certificate (for
    /// clients that send credentials only over TLS, like kubectl's `--token`).
    pub fn https_url(&self) -> String {
        format!("https://{}", self.shared.addr)
    }

    /// Stops accepting, ends watches and closes connections.
    pub fn shutdown(&self) {
        self.shared.shutdown.send_replace(true);
    }

    /// Resolves once the listener is closed (the address can be bound again).
    pub async fn stopped(&self) {
        let mut running = self.shared.running.subscribe();
        let _ = running.wait_for(|r| !*r).await.map(|_| ());
    }

    /// Ends every open watch stream; clients re-watch from their last resourceVersion.
    pub fn disconnect_watches(&self) {
        self.shared.disconnect.send_modify(|epoch| *epoch += 1);
    }

    /// Ends open watches and holds new ones until the guard is dropped, so a test can
    /// make changes while every watcher is away (e.g. to expire their resourceVersion).
    pub fn pause_watches(&self) -> WatchPause {
        self.shared.paused.send_replace(true);
        self.disconnect_watches();
        WatchPause {
            shared: self.shared.clone(),
        }
    }

    /// Drops the event log: watches resuming from an older resourceVersion get 410.
    pub fn compact(&self) {
        self.shared.store.compact();
    }

    /// The latest resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.store.resource_version()
    }

    /// The `iss` of the service account tokens this server signs.
    pub fn service_account_issuer(&self) -> String {
        self.shared.tokens.issuer().to_string()
    }

    /// Signs arbitrary JWT claims with the server's service account key, so a test can
    /// present tokens the TokenRequest API would never issue (expired, not yet valid,
    /// odd claims) to TokenReview.
    pub fn sign_token(&self, claims: &serde_json::Value) -> Result<String, ApiError> {
        self.shared.tokens.sign(claims)
    }

    pub fn stats(&self) -> Stats {
        Stats {
            watches: self.shared.stats.watches.load(Ordering::Relaxed),
            expired_watches: self.shared.stats.expired.load(Ordering::Relaxed),
            bookmarks: self.shared.stats.bookmarks.load(Ordering::Relaxed),
        }
    }
}

/// Holds new watches while alive (see [`Control::pause_watches`]).
pub struct WatchPause {
    shared: Arc<Shared>,
}

impl Drop for WatchPause {
    fn drop(&mut self) {
        self.shared.paused.send_replace(false);
    }
}

/// Binds `addr` and serves until the process ends (used by the binary).
pub async fn serve(addr: impl ToSocketAddrs, options: Options) -> Result<(), StartError> {
    ApiServer::bind_with(addr, options).await?.run().await;
    Ok(())
}

/// A kubeconfig with one cluster/context/user "lite" pointing at `server_url`
/// (no credentials: the server does not authenticate).
pub fn kubeconfig_yaml(server_url: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: lite
  cluster:
    server: {server_url}
contexts:
- name: lite
  context:
    cluster: lite
    user: lite
    namespace: default
current-context: lite
users:
- name: lite
  user: {{}}
preferences: {{}}
"
    )
}

/// Writes [`kubeconfig_yaml`] to `path`.
pub fn write_kubeconfig(path: &Path, server_url: &str) -> std::io::Result<()> {
    std::fs::write(path, kubeconfig_yaml(server_url))
}
