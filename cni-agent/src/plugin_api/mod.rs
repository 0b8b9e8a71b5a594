//! The two Unix sockets the `istio-cni` plugin talks to, in the run dir:
//! `pluginevent.sock` (`POST /cmdadd`, [`event`]) and `log.sock` (`POST /log`, [`log`]).
//!
//! Only root (or the one uid configured with `--plugin-peer-uid`) may post an event: a
//! forged `/cmdadd` could otherwise make us program any netns and hand it to ztunnel
//! under another pod's identity. Three locks, each enough on its own:
//! - the run dir is forced to be ours with mode 0700 at every start, even when it
//!   already exists (kubelet creates a `DirectoryOrCreate` hostPath 0755; Istio makes
//!   it 0750 and leaves an existing one alone); 0711 when another uid is configured, so
//!   that uid can reach its sockets without listing the dir;
//! - the sockets are 0600 (owned by the configured uid, if any) from the moment they
//!   exist: bound in a private staging dir and renamed into place
//!   ([`mesh_runtime::fs::bind_private`]), never chmod-ed after the fact (Istio: 0666);
//! - every connection's `SO_PEERCRED` uid is checked before it is served
//!   ([`crate::plugin_api::peer`]); refusals are logged and counted.
//!
//! A socket file left by a previous agent is replaced atomically by the rename; on exit
//! the sockets are left in place, so an agent starting meanwhile (rolling update with
//! surge) never loses its fresh socket to us.

pub mod enablement;
pub mod event;
pub mod log;
pub mod peer;

use crate::ops::metrics::Metrics;
use crate::plugin_api::peer::{PeerGate, SOCKET_PLUGIN_EVENT, SOCKET_PLUGIN_LOG};
use event::CmdAddHandler;
use mesh_runtime::fs::{bind_private, ensure_private_dir};
use mesh_runtime::http_server::{Handler, Server};
use shared_types::constants::{PLUGIN_EVENT_SOCKET, PLUGIN_LOG_SOCKET};
use std::fs;
use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::UnixListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The run dir when only root talks to us.
pub const RUN_DIR_MODE: u32 = 0o700;
/// The run dir when another uid is configured: it may traverse, not list.
pub const RUN_DIR_MODE_WITH_PEER_UID: u32 = 0o711;
pub const SOCKET_MODE: u32 = 0o600;

/// Who may connect to the plugin sockets.
#[derive(Clone)]
pub struct UdsAccess {
    /// Admitted besides root (0: root only).
    pub peer_uid: u32,
    /// Where refusals are counted.
    pub metrics: Metrics,
}

impl UdsAccess {
    /// Root only, refusals counted in `metrics`.
    pub fn root_only(metrics: Metrics) -> Self {
        UdsAccess {
            peer_uid: 0,
            metrics,
        }
    }

    pub fn run_dir_mode(&self) -> u32 {
        if self.peer_uid == 0 {
            RUN_DIR_MODE
        } else {
            RUN_DIR_MODE_WITH_PEER_UID
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{what} {}: {source}", path.display())]
pub struct UdsError {
    what: &'static str,
    path: PathBuf,
    source: io::Error,
}

/// The running servers; both stop when the token given to [`start`] is cancelled.
#[derive(Debug)]
pub struct UdsServers {
    pub event_socket: PathBuf,
    pub log_socket: PathBuf,
    pub tasks: Vec<JoinHandle<()>>,
}

/// Binds both sockets (so the plugin can connect as soon as this returns) and serves
/// them in background tasks.
pub fn start(
    run_dir: &Path,
    handler: Arc<dyn CmdAddHandler>,
    access: &UdsAccess,
    cancel: CancellationToken,
) -> Result<UdsServers, UdsError> {
    ensure_private_dir(run_dir, access.run_dir_mode()).map_err(|source| UdsError {
        what: "securing the run dir",
        path: run_dir.to_path_buf(),
        source,
    })?;
    let event_gate = PeerGate::new(SOCKET_PLUGIN_EVENT, access.peer_uid, &access.metrics);
    let log_gate = PeerGate::new(SOCKET_PLUGIN_LOG, access.peer_uid, &access.metrics);
    let event_socket = run_dir.join(PLUGIN_EVENT_SOCKET);
    let log_socket = run_dir.join(PLUGIN_LOG_SOCKET);
    let event_listener = bind(&event_socket, event_gate.socket_owner())?;
    let log_listener = bind(&log_socket, log_gate.socket_owner())?;
    let event_server = Server::new(
        move |request| event::route(request, handler.clone()),
        event::limits(),
        cancel.clone(),
    );
    let log_server = Server::new(log::route, log::limits(), cancel.clone());
    let tasks = vec![
        tokio::spawn(serve(
            event_listener,
            event_server,
            event_gate,
            cancel.clone(),
        )),
        tokio::spawn(serve(log_listener, log_server, log_gate, cancel)),
    ];
    let (events, logs) = (event_socket.display(), log_socket.display());
    tracing::info!(%events, %logs, "plugin sockets listening");
    Ok(UdsServers {
        event_socket,
        log_socket,
        tasks,
    })
}

/// Binds `path` with mode 0600 (owned by `owner` when given), replacing a stale socket
/// but nothing else.
pub fn bind(path: &Path, owner: Option<u32>) -> Result<UnixListener, UdsError> {
    let err = |what| {
        move |source| UdsError {
            what,
            path: path.to_path_buf(),
            source,
        }
    };
    match fs::symlink_metadata(path) {
        // Replaced atomically by the rename in bind_private.
        Ok(meta) if meta.file_type().is_socket() => {}
        Ok(_) => {
            return Err(err("refusing to replace")(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "the path exists and is not a socket",
            )))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(err("inspecting")(e)),
    }
    // Bound with std (the closure is plain code), handed to tokio once in place.
    let listener = bind_private(path, SOCKET_MODE, owner, |temp| {
        let listener = std::os::unix::net::UnixListener::bind(temp)?;
        listener.set_nonblocking(true)?;
        Ok(listener)
    })
    .map_err(err("binding"))?;
    UnixListener::from_std(listener).map_err(err("registering"))
}

/// Accepts until `cancel`; each connection whose peer `gate` admits is served in its
/// own task, any other is closed unread.
pub async fn serve<H: Handler>(
    listener: UnixListener,
    server: Server<H>,
    gate: PeerGate,
    cancel: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    if gate.admit(&stream) {
                        server.serve_connection(stream, gate.socket());
                    }
                }
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!("accept on a plugin socket failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
}
