//! One list-and-watch loop per kind, feeding a kube-rs reflector store.
//!
//! kube-rs' watcher resumes from the last resourceVersion after a dropped connection
//! and re-lists after `410 Gone`; the reflector buffers a re-list (`Init`, `InitApply`)
//! and swaps it in whole on `InitDone`, so objects deleted while we were away disappear
//! and none is duplicated. Errors are retried with kube's default backoff (0.8 s doubling
//! to 30 s); meanwhile the store keeps its last contents.

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures::StreamExt;
use kube::runtime::reflector::{self, store::Writer, Lookup};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

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

    fn mark_synced(&self) {
        self.synced.store(true, Ordering::SeqCst);
        self.changed();
    }
}

/// How a kind's watch behaves when the API server does not serve the kind at all.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum IfAbsent {
    /// Keep retrying; the initial sync waits (core kinds are always served).
    Wait,
    /// Treat as empty until it appears (a CRD not installed has no objects).
    Empty,
}

/// Runs the watch of `kind` until `cancel` fires.
pub(super) fn spawn<K>(
    kind: &'static str,
    api: Api<K>,
    writer: Writer<K>,
    if_absent: IfAbsent,
    progress: Progress,
    cancel: CancellationToken,
) where
    K: Resource + Lookup + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    <K as Lookup>::DynamicType: Eq + Hash + Clone + Send + Sync,
{
    let events = watcher::watcher(api, watcher::Config::default()).default_backoff();
    let mut events = Box::pin(reflector::reflector(writer, events));
    tokio::spawn(async move {
        let mut absent_logged = false;
        let mut lists = 0u64;
        loop {
            let event = tokio::select! {
                _ = cancel.cancelled() => break,
                event = events.next() => event,
            };
            match event {
                None => break,
                Some(Ok(Event::Apply(_) | Event::Delete(_))) => progress.changed(),
                Some(Ok(Event::Init)) => debug!(kind, "listing"),
                Some(Ok(Event::InitApply(_))) => {}
                Some(Ok(Event::InitDone)) => {
                    lists += 1;
                    if lists == 1 {
                        info!(kind, "initial list received");
                    } else {
                        info!(kind, "re-listed (watch expired or restarted)");
                    }
                    absent_logged = false;
                    progress.mark_synced();
                }
                Some(Err(e)) if if_absent == IfAbsent::Empty && is_not_found(&e) => {
                    if !absent_logged {
                        warn!(
                            kind,
                            "not served by the API server (CRD not installed?); \
                                     treating it as empty until it appears"
                        );
                        absent_logged = true;
                    }
                    if !progress.synced.load(Ordering::SeqCst) {
                        progress.mark_synced();
                    }
                }
                Some(Err(e)) if is_expired(&e) => {
                    debug!(kind, "resourceVersion expired (410); re-listing")
                }
                Some(Err(e)) => warn!(kind, error = %e, "watch failed; retrying with backoff"),
            }
        }
        debug!(kind, "watch stopped");
    });
}

/// `410 Gone` during a watch: normal after compaction; the watcher re-lists.
fn is_expired(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::WatchError(status) => status.code == 410,
        watcher::Error::WatchFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status)) => status.code == 410,
        _ => false,
    }
}

/// A 404 on the list: the resource type is not served.
fn is_not_found(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status)) => status.code == 404,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    fn status(code: u16) -> Box<Status> {
        Box::new(Status {
            code,
            ..Default::default()
        })
    }

    #[test]
    fn classifies_absent_kinds_and_expired_versions() {
        let list_404 = watcher::Error::InitialListFailed(kube::Error::Api(status(404)));
        assert!(is_not_found(&list_404));
        assert!(!is_expired(&list_404));
        let list_500 = watcher::Error::InitialListFailed(kube::Error::Api(status(500)));
        assert!(!is_not_found(&list_500));
        let gone = watcher::Error::WatchError(status(410));
        assert!(is_expired(&gone));
        assert!(!is_not_found(&gone));
    }
}
