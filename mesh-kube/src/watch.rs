//! The one list-and-watch loop every Kubernetes consumer of the mesh runs.
//!
//! kube-rs' watcher resumes from the last resourceVersion after a dropped connection
//! and re-lists after `410 Gone`; wrapped in a reflector it buffers a re-list and swaps
//! it in whole, so objects deleted while we were away disappear and none is
//! duplicated. Errors are retried with kube's default backoff (0.8 s doubling to 30 s).
//! [`updates`] turns its events into [`Update`]s, logs failures once per kind in the
//! same words everywhere, and treats a kind the API server does not serve (a CRD not
//! installed) as the caller asks ([`IfAbsent`]).

use std::fmt::Debug;
use std::hash::Hash;

use futures::{future, Stream, StreamExt};
use kube::runtime::reflector::{self, store::Writer, Lookup};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tracing::{debug, info, warn};

/// What a watch tells its consumer.
#[derive(Debug, Clone, PartialEq)]
pub enum Update<K> {
    /// An object was added or changed.
    Applied(K),
    /// An object was deleted.
    Deleted(K),
    /// A (re-)list began: every object follows as [`Update::Listed`], then
    /// [`Update::Synced`].
    Relisting,
    /// An object of the (re-)list.
    Listed(K),
    /// The (re-)list is complete; also sent once for a kind that is not served, when
    /// the caller treats that as empty ([`IfAbsent::Empty`]).
    Synced,
}

/// What to do when the API server does not serve the kind at all (404 on the list).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IfAbsent {
    /// Keep retrying; no [`Update::Synced`] until it is served (core kinds always are).
    Wait,
    /// Report it synced and empty until it appears (a CRD not installed has no objects).
    Empty,
}

/// The raw events of `api` under `config`, retried with kube's default backoff.
/// managedFields are dropped on arrival: nothing of ours reads them, and on a real
/// cluster they are a large share of every object held and of every re-list's peak.
pub fn events<K>(
    api: Api<K>,
    config: watcher::Config,
) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    watcher::watcher(api, config)
        .default_backoff()
        .modify(|object| object.managed_fields_mut().clear())
}

/// [`events`] feeding the reflector store `writer` on the way.
pub fn reflected<K>(
    api: Api<K>,
    config: watcher::Config,
    writer: Writer<K>,
) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send
where
    K: Resource + Lookup + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    <K as Lookup>::DynamicType: Eq + Hash + Clone + Send + Sync,
{
    reflector::reflector(writer, events(api, config))
}

/// The updates of `kind` (a name for logs) from `events`, errors logged and retried.
pub fn updates<K, S>(
    kind: &'static str,
    events: S,
    if_absent: IfAbsent,
) -> impl Stream<Item = Update<K>> + Send
where
    K: Send,
    S: Stream<Item = Result<Event<K>, watcher::Error>> + Send,
{
    let mut lists = 0u64;
    let mut absent = Absent::default();
    events.filter_map(move |event| {
        let update = match event {
            Ok(Event::Apply(object)) => Some(Update::Applied(object)),
            Ok(Event::Delete(object)) => Some(Update::Deleted(object)),
            Ok(Event::Init) => {
                debug!(kind, "listing");
                Some(Update::Relisting)
            }
            Ok(Event::InitApply(object)) => Some(Update::Listed(object)),
            Ok(Event::InitDone) => {
                lists += 1;
                if lists == 1 {
                    info!(kind, "initial list received");
                } else {
                    info!(kind, "re-listed (watch expired or restarted)");
                }
                absent = Absent::default();
                Some(Update::Synced)
            }
            Err(e) if if_absent == IfAbsent::Empty && is_not_found(&e) => {
                if !absent.logged {
                    warn!(
                        kind,
                        "not served by the API server (CRD not installed?); \
                         treating it as empty until it appears"
                    );
                    absent.logged = true;
                }
                // Synced once: the kind is empty, not late.
                (lists == 0 && !std::mem::replace(&mut absent.reported, true))
                    .then_some(Update::Synced)
            }
            Err(e) if is_expired(&e) => {
                debug!(kind, "resourceVersion expired (410); re-listing");
                None
            }
            Err(e) => {
                warn!(kind, error = %e, "watch failed; retrying with backoff");
                None
            }
        };
        future::ready(update)
    })
}

/// Whether an absent kind was logged and reported synced.
#[derive(Default)]
struct Absent {
    logged: bool,
    reported: bool,
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

    fn absent() -> Result<Event<u32>, watcher::Error> {
        Err(watcher::Error::InitialListFailed(kube::Error::Api(status(
            404,
        ))))
    }

    #[tokio::test]
    async fn events_become_updates_and_an_absent_kind_is_synced_once_when_empty_is_asked() {
        let events = futures::stream::iter(vec![
            absent(),
            absent(),
            Ok(Event::Init),
            Ok(Event::InitApply(1)),
            Ok(Event::InitDone),
            Ok(Event::Apply(2)),
            Err(watcher::Error::WatchError(status(410))),
            Ok(Event::Delete(1)),
        ]);
        let got: Vec<Update<u32>> = updates("things", events, IfAbsent::Empty).collect().await;
        assert_eq!(
            got,
            [
                Update::Synced,
                Update::Relisting,
                Update::Listed(1),
                Update::Synced,
                Update::Applied(2),
                Update::Deleted(1),
            ]
        );
        let waiting: Vec<Update<u32>> = updates(
            "things",
            futures::stream::iter(vec![absent()]),
            IfAbsent::Wait,
        )
        .collect()
        .await;
        assert!(
            waiting.is_empty(),
            "a kind we wait for is never synced while absent"
        );
    }
}
