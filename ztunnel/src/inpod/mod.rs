//! In-pod (shared) mode: the node agent hands each enrolled pod's network namespace
//! to ztunnel over ZDS, and ztunnel serves the pod from inside that namespace.

pub mod netns;
pub mod protocol;
pub mod statemanager;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use mesh_runtime::readiness::BlockReady;
use protocol::{Next, Request, ZdsConnection};
use statemanager::PodProxies;

/// Reconnect backoff, as Istio's ztunnel: 5 ms doubling up to 15 s.
const BACKOFF_START: Duration = Duration::from_millis(5);
const BACKOFF_MAX: Duration = Duration::from_secs(15);

/// Talks to the node agent until `stop` fires, reconnecting whenever the
/// connection breaks. `first_snapshot` is released once the first full snapshot
/// has been applied (readiness).
pub async fn run_zds_client(
    socket: PathBuf,
    mut pods: PodProxies,
    first_snapshot: BlockReady,
    stop: CancellationToken,
) {
    let mut first_snapshot = Some(first_snapshot);
    let mut backoff = BACKOFF_START;
    loop {
        let connected = tokio::select! {
            connected = ZdsConnection::connect(&socket) => connected,
            () = stop.cancelled() => return,
        };
        let mut connection = match connected {
            Ok(connection) => connection,
            Err(e) => {
                if backoff == BACKOFF_MAX {
                    // Past the first ~20 s of retries: a missing agent, or a socket
                    // directory not shared with it, is worth saying at every retry.
                    warn!(socket = %socket.display(), error = %e, retry_in = ?backoff,
                        "node agent still not reachable over ZDS: is it running on this node, and is the socket's directory the same host path in both pods?");
                } else {
                    debug!(socket = %socket.display(), error = %e, retry_in = ?backoff, "node agent not reachable");
                }
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    () = stop.cancelled() => return,
                }
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
        };
        info!(socket = %socket.display(), "connected to the node agent");
        backoff = BACKOFF_START;
        pods.connection_started();
        let ended = tokio::select! {
            ended = serve(&mut connection, &mut pods, &mut first_snapshot) => ended,
            () = stop.cancelled() => return,
        };
        match ended {
            Ok(()) => info!("node agent closed the ZDS connection; reconnecting"),
            Err(e) => warn!(error = %e, "ZDS connection failed; reconnecting"),
        }
    }
}

async fn serve(
    connection: &mut ZdsConnection,
    pods: &mut PodProxies,
    first_snapshot: &mut Option<BlockReady>,
) -> std::io::Result<()> {
    loop {
        let started = Instant::now();
        let result = match connection.next().await? {
            Next::Closed => return Ok(()),
            Next::Invalid(e) => {
                warn!(error = %e, "refusing a malformed ZDS request");
                Err(e.to_string())
            }
            Next::Request(Request::Add { uid, info, netns }) => pods.add(uid, info, netns).await,
            Next::Request(Request::Keep { uid }) => pods.keep(&uid),
            Next::Request(Request::Del { uid }) => pods.del(&uid).await,
            Next::Request(Request::SnapshotSent) => {
                let result = pods.snapshot_sent().await;
                if result.is_ok() && first_snapshot.take().is_some() {
                    info!(
                        pods = pods.len(),
                        "first snapshot from the node agent applied"
                    );
                }
                result
            }
        };
        if let Err(reason) = &result {
            warn!(%reason, "nack");
        }
        connection.answer(result).await?;
        debug!(took = ?started.elapsed(), "ZDS request answered");
    }
}
