//! Live connections: inbound ones are re-checked against policy whenever the state
//! changes, so a new DENY closes connections it now forbids (as Istio's ztunnel
//! does); every one is listed under its workload in `/config_dump`'s `workloadState`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::Serialize;
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
    /// Set for connections policy applies to (inbound).
    attrs: Option<ConnectionAttrs>,
    shown: Option<Shown>,
    revoked: CancellationToken,
}

/// Which way a connection goes, seen from the workload it belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Towards the workload.
    Inbound,
    /// From the workload.
    Outbound,
}

/// A connection as `/config_dump` lists it (Istio's connection dump).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConnectionDump {
    /// The client's `ip:port`.
    pub src: String,
    /// Where the client sent it: `ip:port` outbound; inbound, the Service hostname
    /// when known, else null.
    pub original_dst: Option<String>,
    /// Where it went: the workload's `ip:port`.
    pub actual_dst: String,
    /// `TCP` or `HBONE`.
    pub protocol: &'static str,
}

/// A connection of a local workload, as `/config_dump` shows it.
#[derive(Clone, Debug)]
pub struct Shown {
    /// The workload's namespace and name.
    pub workload: (String, String),
    pub direction: Direction,
    pub dump: ConnectionDump,
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

    /// Tracks a connection policy applies to, without showing it in the dump.
    pub fn register(self: &Arc<Self>, attrs: ConnectionAttrs) -> Registration {
        self.track(Some(attrs), None)
    }

    /// Tracks a connection: re-checked against policy when `attrs` is set, shown
    /// under its workload when `shown` is.
    pub fn track(
        self: &Arc<Self>,
        attrs: Option<ConnectionAttrs>,
        shown: Option<Shown>,
    ) -> Registration {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let revoked = CancellationToken::new();
        self.live_connections().insert(
            id,
            Tracked {
                attrs,
                shown,
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

    /// The live connections of workload `namespace/name`: (inbound, outbound), each
    /// in the order they were opened.
    pub fn of_workload(
        &self,
        namespace: &str,
        name: &str,
    ) -> (Vec<ConnectionDump>, Vec<ConnectionDump>) {
        let live = self.live_connections();
        let mut mine: Vec<(u64, &Shown)> = live
            .iter()
            .filter_map(|(id, t)| Some((*id, t.shown.as_ref()?)))
            .filter(|(_, s)| s.workload.0 == namespace && s.workload.1 == name)
            .collect();
        mine.sort_by_key(|(id, _)| *id);
        let pick = |direction| {
            mine.iter()
                .filter(|(_, s)| s.direction == direction)
                .map(|(_, s)| s.dump.clone())
                .collect()
        };
        (pick(Direction::Inbound), pick(Direction::Outbound))
    }

    /// Closes every live connection the current policy denies.
    pub fn recheck(&self, state: &StateStore, metrics: &Metrics) {
        for tracked in self.live_connections().values() {
            if tracked.revoked.is_cancelled() {
                continue;
            }
            let Some(attrs) = &tracked.attrs else {
                continue;
            };
            let Some(dst) = state.workload_by_ip(attrs.dst.ip()) else {
                continue;
            };
            if let Err(denied) = state.authorize(attrs, &dst) {
                info!(src = %attrs.src_ip, dst = %attrs.dst, reason = %denied,
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
