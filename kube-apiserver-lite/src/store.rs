//! The object store: unstructured objects keyed by (group, plural, namespace, name),
//! one global resourceVersion counter, a bounded event log for watches that resume
//! from a resourceVersion, a broadcast of new events, and optionally the state on disk
//! (`persist`: snapshot and journal) so a restarted server keeps its objects and
//! resourceVersions.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{json, Value};
use tokio::sync::broadcast;

use super::catalog::Catalog;
use super::errors::{ApiError, ApiResult};
use super::meta;
use super::persist;
use super::resources::{self, Resource};
use super::selectors::Filter;
use super::service_ips::ServiceRanges;

/// Namespaces every cluster starts with.
const DEFAULT_NAMESPACES: &[&str] = &["default", "kube-system", "kube-public", "kube-node-lease"];

/// Broadcast buffer: a watcher further behind than this is disconnected and resumes.
const BROADCAST_CAPACITY: usize = 16 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One committed change. `prev` is the object before a modification, so a watcher can
/// tell when an object enters or leaves its selector.
#[derive(Debug)]
pub struct Event {
    pub rv: u64,
    pub kind: EventType,
    pub resource: &'static Resource,
    pub object: Value,
    pub prev: Option<Value>,
}

/// What a mutation closure decides, given the current object (if any).
#[derive(Debug)]
pub enum Change {
    Create(Value),
    Update(Value),
    Delete,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    group: &'static str,
    plural: &'static str,
    namespace: String,
    name: String,
}

impl Key {
    fn new(rs: &'static Resource, namespace: &str, name: &str) -> Self {
        let (group, plural) = rs.storage_key();
        Key {
            group,
            plural,
            namespace: if rs.namespaced {
                namespace.to_string()
            } else {
                String::new()
            },
            name: name.to_string(),
        }
    }

    fn is(&self, rs: &Resource) -> bool {
        (self.group, self.plural) == rs.storage_key()
    }
}

/// How a watch begins: the current objects (no resourceVersion given) or the logged
/// events after the given resourceVersion.
pub enum WatchStart {
    Snapshot(Vec<Value>),
    Replay(Vec<Arc<Event>>),
}

pub struct Store {
    inner: Mutex<Inner>,
    tx: broadcast::Sender<Arc<Event>>,
}

struct Inner {
    /// What is served: the CRDs stored here decide the custom resources.
    catalog: Arc<Catalog>,
    /// Where Services get their ClusterIPs.
    service_ranges: ServiceRanges,
    objects: BTreeMap<Key, Value>,
    rv: u64,
    log: VecDeque<Arc<Event>>,
    capacity: usize,
    /// Watches from a resourceVersion below this were compacted away: 410.
    compacted: u64,
    /// Events of the mutation in progress, not yet broadcast.
    pending: Vec<Arc<Event>>,
    /// Where committed changes are written, with a state file.
    disk: Option<persist::Disk>,
}

impl Store {
    /// Loads `state_file` (and replays its journal) when it exists, else starts with
    /// the default namespaces.
    /// A fresh store starts its resourceVersions at the current time in microseconds,
    /// so clients of an earlier, forgotten incarnation get 410 and re-list.
    pub fn open(
        state_file: Option<PathBuf>,
        log_capacity: usize,
        service_ranges: ServiceRanges,
        catalog: Arc<Catalog>,
    ) -> std::io::Result<Store> {
        let (tx, _) = broadcast::channel(BROADCAST_CAPACITY);
        let mut inner = Inner {
            catalog: catalog.clone(),
            objects: BTreeMap::new(),
            rv: 0,
            log: VecDeque::new(),
            capacity: log_capacity.max(1),
            compacted: 0,
            pending: Vec::new(),
            service_ranges,
            disk: None,
        };
        let loaded = match &state_file {
            Some(path) if path.exists() => {
                let (rv, objects) = persist::load(path)?;
                inner.rv = rv;
                // CRDs first: they say which custom resources the rest may be.
                let crd_key = resources::crds().storage_key();
                for (_, _, crd) in objects
                    .iter()
                    .filter(|(g, p, _)| (g.as_str(), p.as_str()) == crd_key)
                {
                    catalog.sync(crd);
                }
                for (group, plural, obj) in objects {
                    let Some(rs) = catalog.by_storage(&group, &plural) else {
                        tracing::warn!(
                            group,
                            plural,
                            "state file: skipping an object of an unknown resource"
                        );
                        continue;
                    };
                    let key = Key::new(rs, meta::namespace_of(&obj), meta::name_of(&obj));
                    inner.objects.insert(key, obj);
                }
                for change in persist::replay(path)? {
                    if change.rv <= inner.rv {
                        continue; // already in the snapshot
                    }
                    inner.rv = change.rv;
                    let obj = change.object;
                    if (change.group.as_str(), change.plural.as_str()) == crd_key {
                        if change.deleted {
                            catalog.remove(&obj);
                        } else {
                            catalog.sync(&obj);
                        }
                    }
                    let Some(rs) = catalog.by_storage(&change.group, &change.plural) else {
                        continue;
                    };
                    let key = Key::new(rs, meta::namespace_of(&obj), meta::name_of(&obj));
                    if change.deleted {
                        inner.objects.remove(&key);
                    } else {
                        inner.objects.insert(key, obj);
                    }
                }
                true
            }
            _ => false,
        };
        if !loaded {
            inner.rv = time::OffsetDateTime::now_utc().unix_timestamp_nanos() as u64 / 1000;
            let ns = resources::namespaces();
            for name in DEFAULT_NAMESPACES {
                let obj =
                    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
                let key = Key::new(ns, "", name);
                let obj = inner
                    .prepare_create(ns, &key, obj)
                    .map_err(std::io::Error::other)?;
                inner.commit_put(key, obj);
            }
        }
        for name in inner.terminating_namespaces() {
            inner.finalize_namespace(&name);
        }
        inner.log.clear();
        inner.pending.clear();
        inner.compacted = inner.rv;
        if let Some(path) = &state_file {
            let disk = persist::Disk::create(path, inner.rv, inner.stored())?;
            inner.disk = Some(disk);
        }
        Ok(Store {
            inner: Mutex::new(inner),
            tx,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn resource_version(&self) -> u64 {
        self.lock().rv
    }

    pub fn get(&self, rs: &'static Resource, ns: &str, name: &str) -> Option<Value> {
        self.lock().objects.get(&Key::new(rs, ns, name)).cloned()
    }

    /// Objects of `rs` in `ns` (all namespaces when `None`) matching `filter`, and the
    /// resourceVersion of the list.
    pub fn list(
        &self,
        rs: &'static Resource,
        ns: Option<&str>,
        filter: &Filter,
    ) -> (Vec<Value>, u64) {
        let inner = self.lock();
        let items = inner
            .objects
            .iter()
            .filter(|(k, _)| k.is(rs) && ns.is_none_or(|ns| k.namespace == ns))
            .filter(|(_, v)| filter.matches(v))
            .map(|(_, v)| v.clone())
            .collect();
        (items, inner.rv)
    }

    /// Atomically reads the object at (rs, ns, name), lets `decide` choose a change and
    /// commits it (unless `dry_run`). Returns the resulting object; for a delete, the
    /// object as it was, carrying the deletion's resourceVersion.
    pub fn mutate(
        &self,
        rs: &'static Resource,
        ns: &str,
        name: &str,
        dry_run: bool,
        decide: impl FnOnce(Option<&Value>) -> ApiResult<Change>,
    ) -> ApiResult<Value> {
        let mut inner = self.lock();
        let key = Key::new(rs, ns, name);
        let current = inner.objects.get(&key).cloned();
        let change = decide(current.as_ref())?;
        let not_found = || ApiError::not_found(rs.group, rs.plural, name);
        let result = match change {
            Change::Create(obj) => {
                if current.is_some() {
                    return Err(ApiError::already_exists(rs.group, rs.plural, name));
                }
                let obj = inner.prepare_create(rs, &key, obj)?;
                if dry_run {
                    return Ok(obj);
                }
                inner.commit_put(key, obj)
            }
            Change::Update(candidate) => {
                let old = current.ok_or_else(not_found)?;
                let Some(new) = prepare_update(rs, name, &old, candidate)? else {
                    return Ok(old);
                };
                if dry_run {
                    return Ok(new);
                }
                inner.commit_put(key, new)
            }
            Change::Delete => {
                let old = current.ok_or_else(not_found)?;
                if dry_run {
                    return Ok(old);
                }
                if std::ptr::eq(rs, resources::namespaces()) {
                    // Like the real namespace lifecycle: Terminating first, contents
                    // and the namespace go in `finalize_namespace`.
                    if old.pointer("/metadata/deletionTimestamp").is_some() {
                        return Ok(old);
                    }
                    let mut terminating = old;
                    meta::set_path(
                        &mut terminating,
                        "/metadata/deletionTimestamp",
                        json!(meta::now_rfc3339()),
                    );
                    meta::set_path(&mut terminating, "/status/phase", json!("Terminating"));
                    inner.commit_put(key, terminating)
                } else {
                    inner.commit_delete(key).ok_or_else(not_found)?
                }
            }
        };
        self.publish(&mut inner);
        Ok(result)
    }

    /// Deletes everything in a Terminating namespace, then the namespace; `uid` makes
    /// sure a namespace re-created under the same name is left alone.
    pub fn finalize_namespace(&self, name: &str, uid: &str) {
        let mut inner = self.lock();
        let key = Key::new(resources::namespaces(), "", name);
        let ours = inner.objects.get(&key).is_some_and(|ns| {
            ns.pointer("/metadata/deletionTimestamp").is_some()
                && ns.pointer("/metadata/uid").and_then(Value::as_str) == Some(uid)
        });
        if !ours {
            return;
        }
        inner.finalize_namespace(name);
        self.publish(&mut inner);
    }

    /// Broadcasts the mutation's events and persists (under the lock, so event order
    /// matches resourceVersion order).
    fn publish(&self, inner: &mut Inner) {
        let events = inner.take_pending();
        if events.is_empty() {
            return;
        }
        inner.persist(&events);
        for event in events {
            // No receivers is fine: nobody is watching.
            let _ = self.tx.send(event);
        }
    }

    /// Starts a watch on `rs`: the subscription is taken under the store lock, so no
    /// event falls between the start and the live stream. `from` is the client's
    /// resourceVersion (`None` for "now, with the current objects as ADDED").
    pub fn watch(
        &self,
        rs: &'static Resource,
        from: Option<u64>,
    ) -> ApiResult<(WatchStart, u64, broadcast::Receiver<Arc<Event>>)> {
        let inner = self.lock();
        let rx = self.tx.subscribe();
        let start = match from {
            None => WatchStart::Snapshot(
                inner
                    .objects
                    .iter()
                    .filter(|(k, _)| k.is(rs))
                    .map(|(_, v)| v.clone())
                    .collect(),
            ),
            Some(rv) if rv < inner.compacted => {
                return Err(ApiError::expired(format!(
                    "too old resource version: {rv} ({})",
                    inner.compacted
                )))
            }
            Some(rv) if rv > inner.rv => {
                return Err(ApiError::expired(format!(
                    "resource version {rv} is newer than this server's ({}): it restarted without its state; re-list",
                    inner.rv
                )))
            }
            Some(rv) => WatchStart::Replay(
                inner
                    .log
                    .iter()
                    .filter(|e| e.rv > rv && e.resource.storage_key() == rs.storage_key())
                    .cloned()
                    .collect(),
            ),
        };
        Ok((start, inner.rv, rx))
    }

    /// Forgets the event log: every watch resuming from an earlier resourceVersion
    /// gets 410 Gone, as after an etcd compaction.
    pub fn compact(&self) {
        let mut inner = self.lock();
        inner.log.clear();
        inner.compacted = inner.rv;
    }
}

impl Inner {
    /// Every object with its storage group and plural, as the snapshot holds them.
    fn stored(&self) -> impl Iterator<Item = (&str, &str, &Value)> {
        self.objects.iter().map(|(k, v)| (k.group, k.plural, v))
    }

    /// Journals `events` (compacting now and then), with a state file.
    fn persist(&mut self, events: &[Arc<Event>]) {
        let Some(disk) = &mut self.disk else {
            return;
        };
        let changes = events.iter().map(|e| persist::Change {
            rv: e.rv,
            resource: e.resource,
            object: &e.object,
            deleted: e.kind == EventType::Deleted,
        });
        let mut written = disk.append(changes);
        if written.is_ok() && disk.needs_compaction() {
            let objects = self.objects.iter().map(|(k, v)| (k.group, k.plural, v));
            written = disk.compact(self.rv, objects);
        }
        if let Err(e) = written {
            tracing::warn!("cannot persist API server state: {e}");
        }
    }

    /// Fills server-owned metadata and type defaults of a new object.
    fn prepare_create(&self, rs: &'static Resource, key: &Key, mut obj: Value) -> ApiResult<Value> {
        if rs.namespaced {
            let ns_key = Key::new(resources::namespaces(), "", &key.namespace);
            match self.objects.get(&ns_key) {
                None => return Err(ApiError::not_found("", "namespaces", &key.namespace)),
                Some(ns) if ns.pointer("/metadata/deletionTimestamp").is_some() => {
                    return Err(ApiError::forbidden(format!(
                        "{} \"{}\" is forbidden: unable to create new content in namespace {} because it is being terminated",
                        rs.plural, key.name, key.namespace
                    )))
                }
                Some(_) => {}
            }
        }
        let Some(m) = meta::metadata_mut(&mut obj) else {
            return Err(ApiError::bad_request("the object must be a JSON object"));
        };
        m.insert("name".into(), json!(key.name));
        if rs.namespaced {
            m.insert("namespace".into(), json!(key.namespace));
        } else {
            m.remove("namespace");
        }
        m.insert("uid".into(), json!(meta::new_uid()));
        m.insert("creationTimestamp".into(), json!(meta::now_rfc3339()));
        m.insert("generation".into(), json!(1));
        for server_owned in [
            "resourceVersion",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "managedFields",
            "selfLink",
        ] {
            m.remove(server_owned);
        }
        meta::apply_create_defaults(rs, &mut obj);
        if (rs.group, rs.plural) == ("", "services") {
            let used: HashSet<String> = self
                .objects
                .iter()
                .filter(|(k, _)| k.is(rs))
                .filter_map(|(_, v)| v.pointer("/spec/clusterIPs").and_then(Value::as_array))
                .flatten()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect();
            self.service_ranges.assign(&mut obj, &used)?;
        }
        Ok(obj)
    }

    fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    fn commit_put(&mut self, key: Key, mut obj: Value) -> Value {
        let rv = self.next_rv();
        meta::set_path(&mut obj, "/metadata/resourceVersion", json!(rv.to_string()));
        let prev = self.objects.insert(key.clone(), obj.clone());
        let kind = if prev.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        self.record(rv, kind, &key, obj.clone(), prev);
        obj
    }

    fn commit_delete(&mut self, key: Key) -> Option<Value> {
        let mut obj = self.objects.remove(&key)?;
        let rv = self.next_rv();
        meta::set_path(&mut obj, "/metadata/resourceVersion", json!(rv.to_string()));
        self.record(rv, EventType::Deleted, &key, obj.clone(), None);
        Some(obj)
    }

    fn record(&mut self, rv: u64, kind: EventType, key: &Key, object: Value, prev: Option<Value>) {
        let Some(resource) = self.catalog.by_storage(key.group, key.plural) else {
            return;
        };
        let event = Arc::new(Event {
            rv,
            kind,
            resource,
            object,
            prev,
        });
        self.pending.push(event.clone());
        self.log.push_back(event);
        while self.log.len() > self.capacity {
            if let Some(old) = self.log.pop_front() {
                self.compacted = old.rv;
            }
        }
    }

    fn finalize_namespace(&mut self, name: &str) {
        let doomed: Vec<Key> = self
            .objects
            .keys()
            .filter(|k| !k.namespace.is_empty() && k.namespace == name)
            .cloned()
            .collect();
        for k in doomed {
            self.commit_delete(k);
        }
        self.commit_delete(Key::new(resources::namespaces(), "", name));
    }

    /// Namespaces being deleted (finalized at once after a restart).
    fn terminating_namespaces(&self) -> Vec<String> {
        self.objects
            .iter()
            .filter(|(k, v)| {
                k.is(resources::namespaces()) && v.pointer("/metadata/deletionTimestamp").is_some()
            })
            .map(|(k, _)| k.name.clone())
            .collect()
    }

    /// Events committed by the current mutation, to broadcast after it.
    fn take_pending(&mut self) -> Vec<Arc<Event>> {
        std::mem::take(&mut self.pending)
    }
}

/// Validates an update of `old` to `candidate` and fills server-owned fields. `None`
/// when nothing changed (no new resourceVersion, no event), as the real server does.
fn prepare_update(
    rs: &Resource,
    name: &str,
    old: &Value,
    mut candidate: Value,
) -> ApiResult<Option<Value>> {
    if !candidate.is_object() {
        return Err(ApiError::bad_request("the object must be a JSON object"));
    }
    if (rs.group, rs.plural) == ("", "secrets") {
        meta::fold_string_data(&mut candidate);
    }
    let old_rv = meta::resource_version_of(old);
    let new_rv = meta::resource_version_of(&candidate);
    if !new_rv.is_empty() && new_rv != old_rv {
        return Err(ApiError::conflict(rs.group, rs.plural, name));
    }
    let generation = old
        .pointer("/metadata/generation")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    let generation = if meta::spec_part(old) != meta::spec_part(&candidate) {
        generation + 1
    } else {
        generation
    };
    for field in [
        "name",
        "namespace",
        "uid",
        "creationTimestamp",
        "resourceVersion",
    ] {
        let pointer = format!("/metadata/{field}");
        match old.pointer(&pointer) {
            Some(v) => meta::set_path(&mut candidate, &pointer, v.clone()),
            None => {
                if let Some(m) = meta::metadata_mut(&mut candidate) {
                    m.remove(field);
                }
            }
        }
    }
    meta::set_path(&mut candidate, "/metadata/generation", json!(generation));
    if let Some(m) = meta::metadata_mut(&mut candidate) {
        m.remove("managedFields");
    }
    if &candidate == old {
        return Ok(None);
    }
    Ok(Some(candidate))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::builtin as find;

    fn pods() -> &'static Resource {
        find("", "v1", "pods").unwrap()
    }

    fn create(store: &Store, ns: &str, name: &str) -> ApiResult<Value> {
        let obj = json!({"metadata": {"name": name}, "spec": {"nodeName": "n1"}});
        store.mutate(pods(), ns, name, false, |_| Ok(Change::Create(obj)))
    }

    #[test]
    fn create_update_conflict_and_noop() {
        let store = Store::open(None, 100, Default::default(), Default::default()).unwrap();
        assert_eq!(create(&store, "nope", "a").unwrap_err().code, 404);
        let a = create(&store, "default", "a").unwrap();
        assert_eq!(create(&store, "default", "a").unwrap_err().code, 409);
        assert_eq!(a["metadata"]["generation"], 1);
        let rv = store.resource_version();
        // Same content: no new resourceVersion.
        let same = store
            .mutate(pods(), "default", "a", false, |cur| {
                Ok(Change::Update(cur.unwrap().clone()))
            })
            .unwrap();
        assert_eq!(store.resource_version(), rv);
        assert_eq!(same, a);
        let mut stale = a.clone();
        stale["metadata"]["resourceVersion"] = json!("1");
        stale["spec"]["nodeName"] = json!("n2");
        let err = store
            .mutate(pods(), "default", "a", false, |_| Ok(Change::Update(stale)))
            .unwrap_err();
        assert_eq!(err.reason, "Conflict");
        let mut changed = a.clone();
        changed["spec"]["nodeName"] = json!("n2");
        changed["metadata"]["uid"] = json!("forged");
        let b = store
            .mutate(pods(), "default", "a", false, |_| {
                Ok(Change::Update(changed))
            })
            .unwrap();
        assert_eq!(b["metadata"]["generation"], 2);
        assert_eq!(b["metadata"]["uid"], a["metadata"]["uid"]);
        assert!(store.resource_version() > rv);
    }

    #[test]
    fn event_log_expires_old_versions() {
        let store = Store::open(None, 2, Default::default(), Default::default()).unwrap();
        let start = store.resource_version();
        for name in ["a", "b", "c"] {
            create(&store, "default", name).unwrap();
        }
        assert_eq!(
            store.watch(pods(), Some(start)).err().map(|e| e.code),
            Some(410)
        );
        assert_eq!(
            store.watch(pods(), Some(start + 100)).err().map(|e| e.code),
            Some(410)
        );
        let Ok((WatchStart::Replay(events), _, _)) = store.watch(pods(), Some(start + 1)) else {
            panic!("expected a replay");
        };
        assert_eq!(events.len(), 2);
        store.compact();
        assert!(store.watch(pods(), Some(start + 2)).is_err());
        assert!(store.watch(pods(), Some(store.resource_version())).is_ok());
    }

    #[test]
    fn namespace_termination_and_persistence() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let store = Store::open(
            Some(path.clone()),
            100,
            Default::default(),
            Default::default(),
        )
        .unwrap();
        let ns = resources::namespaces();
        let demo = json!({"metadata": {"name": "demo"}});
        store
            .mutate(ns, "", "demo", false, |_| Ok(Change::Create(demo)))
            .unwrap();
        create(&store, "demo", "a").unwrap();
        let gone = store
            .mutate(ns, "", "demo", false, |_| Ok(Change::Delete))
            .unwrap();
        assert_eq!(gone["status"]["phase"], "Terminating");
        assert_eq!(create(&store, "demo", "b").unwrap_err().code, 403);
        let rv = store.resource_version();
        drop(store);
        // Reloaded: the Terminating namespace is finalized, versions continue.
        let store = Store::open(Some(path), 100, Default::default(), Default::default()).unwrap();
        assert!(store.get(ns, "", "demo").is_none());
        assert!(store.get(pods(), "demo", "a").is_none());
        assert!(store.get(ns, "", "default").is_some());
        assert!(store.resource_version() > rv);
    }
}
