//! Graceful shutdown shared by every server: stop accepting, let in-flight
//! connections finish up to a deadline, then close what is left.

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};
use tokio_util::task::TaskTracker;

/// Cloneable handle: listeners watch [`Drain::accepting_stopped`], connections are
/// spawned through [`Drain::spawn`] so they can be awaited and, at the deadline,
/// cancelled.
#[derive(Clone, Debug, Default)]
pub struct Drain {
    accepting: CancellationToken,
    force: CancellationToken,
    tasks: TaskTracker,
}

impl Drain {
    pub fn new() -> Self {
        Self::default()
    }

    /// A drain for a subset (e.g. one pod) that also ends when its parent drains.
    pub fn child(&self) -> Drain {
        Drain {
            accepting: self.accepting.child_token(),
            force: self.force.child_token(),
            tasks: TaskTracker::new(),
        }
    }

    /// Resolves once listeners must stop accepting.
    pub fn accepting_stopped(&self) -> WaitForCancellationFuture<'_> {
        self.accepting.cancelled()
    }

    /// Token that fires when listeners must stop (for servers with their own loop).
    pub fn accepting_token(&self) -> CancellationToken {
        self.accepting.clone()
    }

    /// Runs a connection until it ends or the drain deadline passes.
    pub fn spawn<F>(&self, connection: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.spawn_on(connection, &tokio::runtime::Handle::current());
    }

    /// [`Drain::spawn`] on the given runtime (a worker's).
    pub fn spawn_on<F>(&self, connection: F, runtime: &tokio::runtime::Handle)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let force = self.force.clone();
        let connection = async move {
            tokio::select! {
                () = connection => {}
                () = force.cancelled() => {}
            }
        };
        self.tasks.spawn_on(connection, runtime);
    }

    /// Tells listeners to stop accepting; connections carry on.
    pub fn stop_accepting(&self) {
        self.accepting.cancel();
    }

    /// Stops accepting, waits up to `deadline` for connections, then closes the rest.
    /// Returns the number of connections that had to be cut.
    pub async fn drain(&self, deadline: Duration) -> usize {
        self.accepting.cancel();
        self.tasks.close();
        if tokio::time::timeout(deadline, self.tasks.wait())
            .await
            .is_ok()
        {
            return 0;
        }
        let cut = self.tasks.len();
        self.force.cancel();
        self.tasks.wait().await;
        cut
    }

    /// Connections still running.
    pub fn active(&self) -> usize {
        self.tasks.len()
    }
}
