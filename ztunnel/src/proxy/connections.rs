//! Live inbound connections, re-checked against policy whenever the state changes,
//! so a new DENY closes connections it now forbids (as Istio's ztunnel does).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::metrics::Metrics;
use crate::state::policy::ConnectionAttrs;
use crate::state::StateStore;

#[derive(Default)]
pub struct ConnectionManager {
    next_id: AtomicU64,
    live: Mutex<HashMap<u64, Tracked>>,
}

struct Tracked {
    attrs: ConnectionAttrs,
    revoked: CancellationToken,
}

/// Keeps a connection registered; dropping it unregisters.
pub struct Registration {
    manager: Arc<ConnectionManager>,
    id: u64,
    /// Fires when policy no longer allows the connection.
    pub revoked: CancellationToken,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.manager.live_connections().remove(&self.id);
    }
}

impl ConnectionManager {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub fn register(self: &Arc<Self>, attrs: ConnectionAttrs) -> Registration {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let revoked = CancellationToken::new();
        self.live_connections().insert(
            id,
            Tracked {
                attrs,
                revoked: revoked.clone(),
            },
        );
        Registration {
            manager: self.clone(),
            id,
            revoked,
        }
    }

    pub fn len(&self) -> usize {
        self.live_connections().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Closes every live connection the current policy denies.
    pub fn recheck(&self, state: &StateStore, metrics: &Metrics) {
        for tracked in self.live_connections().values() {
            if tracked.revoked.is_cancelled() {
                continue;
            }
            let Some(dst) = state.workload_by_ip(tracked.attrs.dst.ip()) else {
                continue;
            };
            if let Err(denied) = state.authorize(&tracked.attrs, &dst) {
                info!(src = %tracked.attrs.src_ip, dst = %tracked.attrs.dst, reason = %denied,
                    "closing connection: policy changed");
                metrics.policy_revoked.inc();
                tracked.revoked.cancel();
            }
        }
    }

    /// Re-checks live connections after every state change, until `stop` fires.
    pub async fn watch(
        self: Arc<Self>,
        state: StateStore,
        metrics: Arc<Metrics>,
        stop: CancellationToken,
    ) {
        let mut changes = state.subscribe();
        loop {
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { return },
                () = stop.cancelled() => return,
            }
            self.recheck(&state, &metrics);
        }
    }

    fn live_connections(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Tracked>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
#[path = "connections_tests.rs"]
mod tests;
