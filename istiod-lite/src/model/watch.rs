//! One watch per kind, feeding a reflector store and telling the rebuild loop about
//! every change (the loop itself is `mesh_kube::watch`'s, shared with the node agent).

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures::StreamExt;
use kube::runtime::reflector::{store::Writer, Lookup};
use kube::runtime::watcher;
use kube::{Api, Resource};
use mesh_kube::watch::{reflected, updates, IfAbsent, Update};
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::debug;

/// What a watch loop reports to the rebuild loop.
#[derive(Clone)]
pub(super) struct Progress {
    /// Bumped on every change to a store.
    pub changes: watch::Sender<u64>,
    /// Set once this kind's first list is in its store.
    pub synced: Arc<AtomicBool>,
}

impl Progress {
    fn changed(&self) {
        self.changes.send_modify(|g| *g = g.wrapping_add(1));
    }
}

/// Runs the watch of `kind` until `cancel` fires; `observe` sees every update after
/// the store has it.
pub(super) fn spawn<K>(
    kind: &'static str,
    api: Api<K>,
    writer: Writer<K>,
    if_absent: IfAbsent,
    progress: Progress,
    mut observe: impl FnMut(&Update<K>) + Send + 'static,
    cancel: CancellationToken,
) where
    K: Resource + Lookup + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    <K as Lookup>::DynamicType: Eq + Hash + Clone + Send + Sync,
{
    let events = reflected(api, watcher::Config::default(), writer);
    let mut updates = Box::pin(updates(kind, events, if_absent));
    tokio::spawn(async move {
        loop {
            let update = tokio::select! {
                _ = cancel.cancelled() => break,
                update = updates.next() => update,
            };
            let Some(update) = update else { break };
            observe(&update);
            match update {
                Update::Applied(_) | Update::Deleted(_) => progress.changed(),
                Update::Relisting | Update::Listed(_) => {}
                Update::Synced => {
                    progress.synced.store(true, Ordering::SeqCst);
                    progress.changed();
                }
            }
        }
        debug!(kind, "watch stopped");
    });
}
