//! Watch streams: newline-delimited JSON events (ADDED, MODIFIED, DELETED, BOOKMARK,
//! ERROR) over a chunked response, as kube-rs and client-go expect.
//!
//! Per watcher, an object entering the selectors is ADDED and one leaving them is
//! DELETED. A resourceVersion older than the event log yields an ERROR event with a
//! 410 `Expired` Status (HTTP 200), which makes clients re-list.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::channel::mpsc;
use futures::{SinkExt, StreamExt};
use http::{header, Response};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use serde_json::{json, Value};
use tokio::sync::broadcast::error::RecvError;

use super::crds::PrinterColumn;
use super::errors::ApiError;
use super::handlers::present;
use super::meta;
use super::resources::Resource;
use super::routes::{self, Body, Query};
use super::selectors::Filter;
use super::store::{Event, EventType, WatchStart};
use super::table;
use super::Shared;

/// What one watch request asked for.
struct Watch {
    rs: &'static Resource,
    version: String,
    namespace: Option<String>,
    filter: Filter,
    from: Option<u64>,
    bookmarks: bool,
    initial_events: bool,
    timeout: Duration,
    table: bool,
    /// The CRD's printer columns, for a table of a custom resource.
    columns: Option<Vec<PrinterColumn>>,
}

/// Starts a watch; the events flow from a task into the response body.
pub fn serve(
    shared: Arc<Shared>,
    rs: &'static Resource,
    version: &str,
    namespace: Option<String>,
    filter: Filter,
    query: &Query,
    table: bool,
) -> Response<Body> {
    let from = match query.get("resourceVersion").unwrap_or("") {
        "" | "0" => None,
        rv => match rv.parse::<u64>() {
            Ok(rv) => Some(rv),
            Err(_) => {
                return routes::error_response(&ApiError::bad_request(format!(
                    "invalid resourceVersion {rv:?}"
                )))
            }
        },
    };
    let timeout = query
        .get("timeoutSeconds")
        .and_then(|s| s.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(shared.options.max_watch)
        .min(shared.options.max_watch);
    let watch = Watch {
        rs,
        version: version.to_string(),
        namespace,
        filter,
        from,
        bookmarks: query.flag("allowWatchBookmarks"),
        initial_events: query.flag("sendInitialEvents"),
        timeout,
        table,
        columns: shared
            .catalog
            .custom(rs.group, rs.plural)
            .and_then(|c| c.version(version).map(|v| v.columns.clone())),
    };
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    shared.stats.watches.fetch_add(1, Ordering::Relaxed);
    tokio::spawn(run(shared, watch, tx));
    let body =
        StreamBody::new(rx.map(|chunk| Ok::<_, std::convert::Infallible>(Frame::data(chunk))));
    Response::builder()
        .header(header::CONTENT_TYPE, "application/json")
        .body(BodyExt::boxed(body))
        .unwrap_or_else(|_| Response::new(routes::full(Bytes::new())))
}

/// Why a watch loop stopped sending.
struct Closed;

async fn run(shared: Arc<Shared>, w: Watch, mut tx: mpsc::Sender<Bytes>) {
    let mut shutdown = shared.shutdown.subscribe();
    let mut disconnect = shared.disconnect.subscribe();
    let mut crds_changed = shared.crds_changed.subscribe();
    let mut paused = shared.paused.subscribe();
    // Held here while a test pauses watches; the client sees an open, silent stream.
    tokio::select! {
        _ = async { paused.wait_for(|p| !*p).await.map(|_| ()) } => {}
        _ = super::until_true(&mut shutdown) => return,
    }
    disconnect.mark_unchanged();
    let (start, start_rv, mut rx) = match shared.store.watch(w.rs, w.from) {
        Ok(started) => started,
        Err(err) => {
            shared.stats.expired.fetch_add(1, Ordering::Relaxed);
            let _ = send(
                &mut tx,
                &json!({"type": "ERROR", "object": err.to_status()}),
            )
            .await;
            return;
        }
    };
    if initial(&w, start, start_rv, &mut tx).await.is_err() {
        return;
    }
    let mut last_rv = start_rv;
    let deadline = tokio::time::sleep(w.timeout);
    tokio::pin!(deadline);
    let mut bookmark = tokio::time::interval(shared.options.bookmark_interval);
    bookmark.tick().await;
    loop {
        tokio::select! {
            // Events first: a CRD's deletion logs its objects' deletions before it
            // ends the watch, and the client is to see them.
            biased;
            received = rx.recv() => match received {
                Ok(event) => {
                    if event.rv <= last_rv {
                        continue;
                    }
                    last_rv = event.rv;
                    if deliver(&w, &event, &mut tx).await.is_err() {
                        return;
                    }
                }
                // Too far behind: end the stream; the client resumes from its last
                // resourceVersion (or re-lists on 410).
                Err(RecvError::Lagged(_)) | Err(RecvError::Closed) => return,
            },
            _ = bookmark.tick(), if w.bookmarks => {
                if send(&mut tx, &bookmark_event(&w, last_rv, false)).await.is_err() {
                    return;
                }
                shared.stats.bookmarks.fetch_add(1, Ordering::Relaxed);
            }
            _ = &mut deadline => return,
            _ = disconnect.changed() => return,
            // The CRD behind this resource went away: the watch ends with it.
            _ = crds_changed.changed() => {
                if shared.catalog.find(w.rs.group, &w.version, w.rs.plural).is_none() {
                    return;
                }
            }
            _ = super::until_true(&mut shutdown) => return,
        }
    }
}

/// The events that begin a watch: the current objects as ADDED, or the logged events
/// after the client's resourceVersion.
async fn initial(
    w: &Watch,
    start: WatchStart,
    start_rv: u64,
    tx: &mut mpsc::Sender<Bytes>,
) -> Result<(), Closed> {
    match start {
        WatchStart::Snapshot(objects) => {
            for obj in objects.iter().filter(|o| matches(w, o)) {
                send(tx, &event_json(w, EventType::Added, obj)).await?;
            }
            if w.initial_events {
                send(tx, &bookmark_event(w, start_rv, true)).await?;
            }
        }
        WatchStart::Replay(events) => {
            for event in events {
                deliver(w, &event, tx).await?;
            }
        }
    }
    Ok(())
}

fn matches(w: &Watch, obj: &Value) -> bool {
    w.namespace
        .as_deref()
        .is_none_or(|ns| meta::namespace_of(obj) == ns)
        && w.filter.matches(obj)
}

/// Sends what `event` means to this watcher, if anything.
async fn deliver(w: &Watch, event: &Event, tx: &mut mpsc::Sender<Bytes>) -> Result<(), Closed> {
    if event.resource.storage_key() != w.rs.storage_key() {
        return Ok(());
    }
    let now = matches(w, &event.object);
    let before = event.prev.as_ref().is_some_and(|p| matches(w, p));
    let (kind, object) = match (event.kind, before, now) {
        (EventType::Added, _, true) => (EventType::Added, event.object.clone()),
        (EventType::Modified, true, true) => (EventType::Modified, event.object.clone()),
        (EventType::Modified, false, true) => (EventType::Added, event.object.clone()),
        (EventType::Modified, true, false) => {
            // The last state this watcher was allowed to see, at the new version.
            let mut last = event.prev.clone().unwrap_or_else(|| event.object.clone());
            meta::set_path(
                &mut last,
                "/metadata/resourceVersion",
                json!(event.rv.to_string()),
            );
            (EventType::Deleted, last)
        }
        (EventType::Deleted, _, true) => (EventType::Deleted, event.object.clone()),
        _ => return Ok(()),
    };
    send(tx, &event_json(w, kind, &object)).await
}

fn event_json(w: &Watch, kind: EventType, obj: &Value) -> Value {
    let presented = present(w.rs, &w.version, obj);
    let object = if w.table {
        table::render(
            w.rs,
            w.columns.as_deref(),
            &[presented],
            meta::resource_version_of(obj),
        )
    } else {
        presented
    };
    json!({"type": kind.as_str(), "object": object})
}

/// A BOOKMARK: the resourceVersion this watcher has seen everything up to.
fn bookmark_event(w: &Watch, rv: u64, initial_end: bool) -> Value {
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    json!({
        "type": "BOOKMARK",
        "object": {"apiVersion": w.rs.api_version(&w.version), "kind": w.rs.kind, "metadata": metadata},
    })
}

async fn send(tx: &mut mpsc::Sender<Bytes>, event: &Value) -> Result<(), Closed> {
    let mut line = serde_json::to_vec(event).map_err(|_| Closed)?;
    line.push(b'\n');
    tx.send(Bytes::from(line)).await.map_err(|_| Closed)
}
