//! The resources istiod-lite serves, by type and name, each with a content version.
//!
//! The model publishes a type's complete set after every rebuild; the store keeps only
//! what changed: a resource whose bytes are the same keeps its version, so a stream
//! that already has it is sent nothing. Versions are a digest of the bytes, so every
//! replica (and a restarted one) gives the same resource the same version, and a
//! reconnecting ztunnel's `initial_resource_versions` match without a resend.
//!
//! Each type's set is a pair of persistent maps ([`View`]): a stream reads a consistent
//! view in O(1) and keeps what it sent as a clone of the versions, sharing their nodes.
//!
//! Each publish that changes something bumps the generation and logs the changed
//! names, so a stream catches up by reading only those names; a stream that fell
//! further behind than the log reaches compares everything instead.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::{Arc, RwLock};
use std::time::Instant;

use sha2::{Digest, Sha256};
use shared_types::istio::xds::Any;
use tokio::sync::watch;

/// The log keeps at least this many changes for streams catching up, and otherwise
/// as many as there are resources: a stream further behind than that would read more
/// of the log than comparing everything costs. Bounded by what is served, not by time,
/// so churn (every deleted pod's name in the log) cannot grow it.
const LOG_MIN: usize = 1024;

/// One resource as served. Names are shared with every stream that holds them.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub name: Arc<str>,
    /// The version, as a number: a digest of the bytes.
    pub digest: u64,
    pub body: Any,
    /// Other keys it is found by: `network/IP` for an Address (Istio's on-demand keys).
    pub aliases: Vec<String>,
    /// What an on-demand client asking for this resource needs with it: a Service's
    /// endpoint workloads, without which its VIP cannot be routed.
    pub related: Vec<Arc<str>>,
}

/// What the model publishes of one resource.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Published {
    pub name: String,
    pub body: Any,
    pub aliases: Vec<String>,
    pub related: Vec<String>,
}

impl From<(String, Any)> for Published {
    fn from((name, body): (String, Any)) -> Self {
        Published {
            name,
            body,
            ..Default::default()
        }
    }
}

impl Entry {
    /// The version on the wire.
    pub fn version(&self) -> String {
        format!("{:016x}", self.digest)
    }
}

/// A version from the wire (`initial_resource_versions`); None if not one of ours.
pub fn parse_version(text: &str) -> Option<u64> {
    (text.len() == 16).then(|| u64::from_str_radix(text, 16).ok())?
}

/// Name -> version of a set of resources. A persistent map: a clone is O(1) and
/// shares its nodes, so the store's versions and what each of 500 streams holds
/// (mostly the same) cost one copy, not 500.
pub type Versions = imbl::HashMap<Arc<str>, u64>;

/// One type's resources at one moment, consistent and cheap to clone.
#[derive(Clone, Default)]
pub struct View {
    pub entries: imbl::OrdMap<Arc<str>, Arc<Entry>>,
    pub versions: Versions,
    /// alias -> name.
    aliases: Arc<HashMap<String, Arc<str>>>,
}

impl View {
    pub fn get(&self, name: &str) -> Option<&Arc<Entry>> {
        self.entries.get(name)
    }

    /// The resource `alias` (e.g. `/10.0.0.1`) names, for an on-demand lookup.
    pub fn resolve(&self, alias: &str) -> Option<&Arc<Entry>> {
        self.entries.get(self.aliases.get(alias)?)
    }
}

/// What changed since a generation: exact names, or "compare everything".
#[derive(Debug, PartialEq, Eq)]
pub enum Changes {
    Names(BTreeMap<&'static str, BTreeSet<Arc<str>>>),
    Everything,
}

/// A stream catching up: what changed since its generation, and the views those
/// changes bring it to, read together so they agree.
pub struct CatchUp {
    pub changes: Changes,
    pub generation: u64,
    pub views: BTreeMap<&'static str, View>,
}

#[derive(Default)]
struct Inner {
    resources: BTreeMap<&'static str, View>,
    /// (generation, type, name) of every change, oldest first.
    log: VecDeque<(u64, &'static str, Arc<str>)>,
    generation: u64,
    /// When each generation was published, for push latency.
    published: VecDeque<(u64, Instant)>,
}

#[derive(Clone)]
pub struct ResourceStore {
    inner: Arc<RwLock<Inner>>,
    generation: watch::Sender<u64>,
}

impl Default for ResourceStore {
    fn default() -> Self {
        ResourceStore {
            inner: Arc::default(),
            generation: watch::Sender::new(0),
        }
    }
}

/// Content version of a resource body.
pub fn version_of(body: &Any) -> u64 {
    let digest = Sha256::new()
        .chain_update(body.type_url.as_bytes())
        .chain_update(&body.value)
        .finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

impl ResourceStore {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Replaces every resource of `type_url` with `resources`; returns how many names
    /// changed (added, changed or removed). Nothing changed: no new generation.
    pub fn replace_all<R: Into<Published>>(
        &self,
        type_url: &'static str,
        resources: impl IntoIterator<Item = R>,
    ) -> usize {
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        let generation = inner.generation + 1;
        let current = inner.resources.get(type_url).cloned().unwrap_or_default();
        // Start from the current maps: what did not change keeps its (shared) nodes.
        let mut next = current.clone();
        let mut aliases = HashMap::new();
        let mut present = HashSet::new();
        let mut changed = Vec::new();
        for published in resources {
            let Published {
                name,
                body,
                aliases: keys,
                related,
            } = published.into();
            let entry = match current.entries.get(name.as_str()) {
                Some(old)
                    if old.body == body
                        && old.aliases == keys
                        && old
                            .related
                            .iter()
                            .map(|r| &**r)
                            .eq(related.iter().map(String::as_str)) =>
                {
                    old.clone()
                }
                _ => {
                    let name: Arc<str> = name.into();
                    changed.push(name.clone());
                    let entry = Arc::new(Entry {
                        name: name.clone(),
                        digest: version_of(&body),
                        body,
                        aliases: keys,
                        related: related.into_iter().map(Arc::from).collect(),
                    });
                    next.versions.insert(name.clone(), entry.digest);
                    next.entries.insert(name, entry.clone());
                    entry
                }
            };
            for alias in &entry.aliases {
                aliases.insert(alias.clone(), entry.name.clone());
            }
            present.insert(entry.name.clone());
        }
        for name in current.entries.keys().filter(|n| !present.contains(*n)) {
            next.entries.remove(name);
            next.versions.remove(name);
            changed.push(name.clone());
        }
        next.aliases = Arc::new(aliases);
        inner.resources.insert(type_url, next);
        if changed.is_empty() {
            return 0;
        }
        let count = changed.len();
        inner.generation = generation;
        inner
            .log
            .extend(changed.into_iter().map(|name| (generation, type_url, name)));
        let limit = LOG_MIN.max(inner.resources.values().map(|v| v.entries.len()).sum());
        // Whole generations only: a stream one generation behind must see all of it.
        while inner.log.len() > limit && inner.log.front().is_some_and(|e| e.0 < generation) {
            inner.log.pop_front();
        }
        inner.published.push_back((generation, Instant::now()));
        while inner.published.len() > 1024 {
            inner.published.pop_front();
        }
        drop(inner);
        self.generation.send_replace(generation);
        count
    }

    pub fn generation(&self) -> u64 {
        self.read().generation
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// The names changed after generation `since`, and the generation they bring
    /// the caller up to.
    pub fn changes_since(&self, since: u64) -> (Changes, u64) {
        let inner = self.read();
        (Self::changes(&inner, since), inner.generation)
    }

    /// What changed after `since`, with the views of every type as of now.
    pub fn catch_up(&self, since: u64) -> CatchUp {
        let inner = self.read();
        CatchUp {
            changes: Self::changes(&inner, since),
            generation: inner.generation,
            views: inner.resources.clone(),
        }
    }

    fn changes(inner: &Inner, since: u64) -> Changes {
        let behind = match inner.log.front() {
            // The log starts after `since + 1`: some changes were dropped.
            Some((oldest, _, _)) => *oldest > since + 1,
            None => inner.generation > since,
        };
        if behind {
            return Changes::Everything;
        }
        let mut names: BTreeMap<&'static str, BTreeSet<Arc<str>>> = BTreeMap::new();
        let start = inner.log.partition_point(|(g, _, _)| *g <= since);
        for (_, type_url, name) in inner.log.range(start..) {
            names.entry(type_url).or_default().insert(name.clone());
        }
        Changes::Names(names)
    }

    /// When generation `generation` (or the first one after it) was published.
    pub fn published_at(&self, generation: u64) -> Option<Instant> {
        let inner = self.read();
        let i = inner.published.partition_point(|(g, _)| *g < generation);
        inner.published.get(i).map(|(_, at)| *at)
    }

    /// Every resource of `type_url` as of now.
    pub fn view(&self, type_url: &str) -> View {
        self.read()
            .resources
            .get(type_url)
            .cloned()
            .unwrap_or_default()
    }

    pub fn get(&self, type_url: &str, name: &str) -> Option<Arc<Entry>> {
        self.read().resources.get(type_url)?.get(name).cloned()
    }

    /// The resource `alias` names, for an on-demand lookup.
    pub fn resolve(&self, type_url: &str, alias: &str) -> Option<Arc<Entry>> {
        self.read().resources.get(type_url)?.resolve(alias).cloned()
    }

    /// Every resource of `type_url`, by name.
    pub fn all(&self, type_url: &str) -> imbl::OrdMap<Arc<str>, Arc<Entry>> {
        self.view(type_url).entries
    }

    pub fn len(&self, type_url: &str) -> usize {
        self.read()
            .resources
            .get(type_url)
            .map_or(0, |v| v.entries.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn any(value: &[u8]) -> Any {
        Any {
            type_url: "t".into(),
            value: value.to_vec(),
        }
    }

    #[test]
    fn only_changed_names_get_a_new_version_and_a_log_entry() {
        let store = ResourceStore::default();
        assert_eq!(
            store.replace_all("A", vec![("a".into(), any(b"1")), ("b".into(), any(b"1"))]),
            2
        );
        let g1 = store.generation();
        let a1 = store.get("A", "a").unwrap().version();
        // Same bytes: no generation, no change.
        assert_eq!(
            store.replace_all("A", vec![("a".into(), any(b"1")), ("b".into(), any(b"1"))]),
            0
        );
        assert_eq!(store.generation(), g1);
        // b changes, a is dropped, c appears.
        assert_eq!(
            store.replace_all("A", vec![("b".into(), any(b"2")), ("c".into(), any(b"1"))]),
            3
        );
        assert_eq!(
            store.get("A", "c").unwrap().version(),
            a1,
            "versions are content digests"
        );
        assert!(store.get("A", "a").is_none());
        let (Changes::Names(names), _) = store.changes_since(g1) else {
            panic!("the log covers g1")
        };
        let names: Vec<&str> = names["A"].iter().map(|n| &**n).collect();
        assert_eq!(names, vec!["a", "b", "c"]);
        let now = store.generation();
        assert_eq!(
            store.changes_since(now),
            (Changes::Names(BTreeMap::new()), now)
        );
        let all = BTreeMap::from([("A", ["a", "b", "c"].map(Arc::from).into())]);
        assert_eq!(store.changes_since(0), (Changes::Names(all), now));
    }

    #[test]
    fn a_stream_behind_the_log_compares_everything() {
        let store = ResourceStore::default();
        for i in 0..3 {
            let set: Vec<(String, Any)> = (0..LOG_MIN)
                .map(|n| (format!("r{n}"), any(format!("{i}").as_bytes())))
                .collect();
            store.replace_all("A", set);
        }
        assert_eq!(store.changes_since(0).0, Changes::Everything);
        assert!(matches!(
            store.changes_since(store.generation() - 1).0,
            Changes::Names(_)
        ));
    }

    #[test]
    fn churn_does_not_grow_the_log_beyond_what_is_served() {
        let store = ResourceStore::default();
        // Pods come and go, 50 at a time: 100,000 changes, 50 resources served.
        for i in 0..1000 {
            let set: Vec<(String, Any)> = (0..50)
                .map(|n| (format!("pod-{i}-{n}"), any(b"w")))
                .collect();
            store.replace_all("A", set);
        }
        let log = store.read().log.len();
        assert!(log <= LOG_MIN, "{log} changes kept for 50 resources");
        // A stream one generation behind still reads only what changed.
        let Changes::Names(names) = store.changes_since(store.generation() - 1).0 else {
            panic!("one generation behind is in the log");
        };
        assert_eq!(names["A"].len(), 100, "50 gone, 50 new");
        // One generation with more changes than the limit is kept whole.
        let set: Vec<(String, Any)> = (0..2000).map(|n| (format!("svc-{n}"), any(b"s"))).collect();
        store.replace_all("A", set);
        let Changes::Names(names) = store.changes_since(store.generation() - 1).0 else {
            panic!("the latest generation is in the log");
        };
        assert_eq!(names["A"].len(), 2050, "50 gone, 2000 new");
    }
}
