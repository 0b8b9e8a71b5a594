//! The two Unix sockets the `istio-cni` plugin talks to, in the run dir:
//! `pluginevent.sock` (`POST /cmdadd`, [`event`]) and `log.sock` (`POST /log`, [`log`]).
//!
//! The run dir is created 0750 (root's, like the sockets' users); the sockets are 0666 so
//! the directory alone guards them, as Istio does. A socket file left by a previous
//! agent is removed before binding; on exit the sockets are left in place, so an agent
//! starting meanwhile (rolling update with surge) never loses its fresh socket to us.

pub mod event;
pub mod log;

use crate::fsutil;
use crate::http_server::{self, Handler};
use event::CmdAddHandler;
use shared_types::constants::{PLUGIN_EVENT_SOCKET, PLUGIN_LOG_SOCKET};
use std::fs::{self, Permissions};
use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::UnixListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub const RUN_DIR_MODE: u32 = 0o750;
pub const SOCKET_MODE: u32 = 0o666;

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
    cancel: CancellationToken,
) -> Result<UdsServers, UdsError> {
    fsutil::ensure_dir(run_dir, RUN_DIR_MODE).map_err(|source| UdsError {
        what: "creating the run dir",
        path: run_dir.to_path_buf(),
        source,
    })?;
    let event_socket = run_dir.join(PLUGIN_EVENT_SOCKET);
    let log_socket = run_dir.join(PLUGIN_LOG_SOCKET);
    let event_listener = bind(&event_socket)?;
    let log_listener = bind(&log_socket)?;
    let tasks = vec![
        tokio::spawn(serve(
            event_listener,
            event::router(handler),
            cancel.clone(),
        )),
        tokio::spawn(serve(log_listener, log::router(), cancel)),
    ];
    let (events, logs) = (event_socket.display(), log_socket.display());
    tracing::info!(%events, %logs, "plugin sockets listening");
    Ok(UdsServers {
        event_socket,
        log_socket,
        tasks,
    })
}

/// Removes a stale socket, binds, and opens the socket to every local user (the run
/// dir's mode is the gate).
pub fn bind(path: &Path) -> Result<UnixListener, UdsError> {
    let err = |what| {
        move |source| UdsError {
            what,
            path: path.to_path_buf(),
            source,
        }
    };
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            fs::remove_file(path).map_err(err("removing the stale socket"))?;
        }
        Ok(_) => {
            return Err(err("refusing to replace")(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "the path exists and is not a socket",
            )))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(err("inspecting")(e)),
    }
    let listener = UnixListener::bind(path).map_err(err("binding"))?;
    fs::set_permissions(path, Permissions::from_mode(SOCKET_MODE)).map_err(err("chmod"))?;
    Ok(listener)
}

/// Accepts until `cancel`; each connection is served in its own task.
pub async fn serve(listener: UnixListener, handler: Handler, cancel: CancellationToken) {
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    http_server::spawn_connection(stream, handler.clone(), cancel.clone())
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
