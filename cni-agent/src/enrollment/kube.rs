//! What the agent knows of the cluster: this node's pods and all namespaces, each in a
//! kube-rs reflector store fed by a watcher, plus a GET for a pod the watch has not
//! delivered yet (a CNI ADD often arrives before the watch event).

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client};
use mesh_kube::watch::{reflected, updates, IfAbsent, Update};
use std::collections::HashSet;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// A change the enrollment engine reacts to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Change {
    /// A pod (`ns/name`) was added, changed or deleted.
    Pod(String),
    /// A namespace was added, changed or deleted.
    Namespace(String),
}

#[derive(Clone)]
pub struct KubeCache {
    pub client: Client,
    pub node: String,
    pods: Store<Pod>,
    namespaces: Store<Namespace>,
}

impl KubeCache {
    /// Starts both watches; changes are sent on `changes` until `cancel`.
    pub fn start(
        client: Client,
        node: &str,
        changes: mpsc::UnboundedSender<Change>,
        cancel: CancellationToken,
    ) -> Self {
        let pods_api: Api<Pod> = Api::all(client.clone());
        let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
        let (pods, writer) = reflector::store();
        spawn_watch(
            updates("pods", reflected(pods_api, config, writer), IfAbsent::Wait),
            |pod: &Pod| Change::Pod(mesh_kube::pod::key(pod)),
            changes.clone(),
            cancel.clone(),
        );
        let ns_api: Api<Namespace> = Api::all(client.clone());
        let (namespaces, writer) = reflector::store();
        let config = watcher::Config::default();
        spawn_watch(
            updates(
                "namespaces",
                reflected(ns_api, config, writer),
                IfAbsent::Wait,
            ),
            |ns: &Namespace| Change::Namespace(ns.metadata.name.clone().unwrap_or_default()),
            changes,
            cancel,
        );
        KubeCache {
            client,
            node: node.to_string(),
            pods,
            namespaces,
        }
    }

    /// Waits until both stores hold their first list.
    pub async fn wait_synced(&self) -> bool {
        self.pods.wait_until_ready().await.is_ok()
            && self.namespaces.wait_until_ready().await.is_ok()
    }

    pub fn cached_pod(&self, key: &str) -> Option<Arc<Pod>> {
        let (ns, name) = key.split_once('/')?;
        self.pods.get(&ObjectRef::new(name).within(ns))
    }

    /// The cache, else a GET (`None` when the pod does not exist).
    pub async fn pod(&self, key: &str) -> Result<Option<Arc<Pod>>, kube::Error> {
        if let Some(pod) = self.cached_pod(key) {
            return Ok(Some(pod));
        }
        self.get_pod(key).await
    }

    /// A GET, bypassing the cache (which may still hold a previous pod of that name).
    pub async fn get_pod(&self, key: &str) -> Result<Option<Arc<Pod>>, kube::Error> {
        let Some((ns, name)) = key.split_once('/') else {
            return Ok(None);
        };
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        Ok(api.get_opt(name).await?.map(Arc::new))
    }

    pub fn namespace(&self, name: &str) -> Option<Arc<Namespace>> {
        self.namespaces.get(&ObjectRef::new(name))
    }

    /// The cache, else a GET.
    pub async fn namespace_or_get(
        &self,
        name: &str,
    ) -> Result<Option<Arc<Namespace>>, kube::Error> {
        if let Some(ns) = self.namespace(name) {
            return Ok(Some(ns));
        }
        let api: Api<Namespace> = Api::all(self.client.clone());
        Ok(api.get_opt(name).await?.map(Arc::new))
    }

    pub fn pods(&self) -> Vec<Arc<Pod>> {
        self.pods.state()
    }

    pub fn namespaces(&self) -> Vec<Arc<Namespace>> {
        self.namespaces.state()
    }
}

/// Reports every object the watch touches (changed, deleted or re-listed) until
/// `cancel`: the engine reconciles each from the store. An object deleted while the
/// watch was down (the API server restarting, a 410 after compaction) is in no event at
/// all, only missing from the re-list: it is reported once the re-list is complete, so
/// the engine unenrolls a pod that is gone even if no one said so.
fn spawn_watch<K: Send + 'static>(
    updates: impl Stream<Item = Update<K>> + Send + 'static,
    change_of: impl Fn(&K) -> Change + Send + 'static,
    changes: mpsc::UnboundedSender<Change>,
    cancel: CancellationToken,
) {
    let mut updates = Box::pin(updates);
    tokio::spawn(async move {
        let mut known: HashSet<Change> = HashSet::new();
        let mut relisted: Option<HashSet<Change>> = None;
        loop {
            let update = tokio::select! {
                _ = cancel.cancelled() => break,
                update = updates.next() => update,
            };
            let change = match update {
                None => break,
                Some(Update::Applied(o)) => {
                    let change = change_of(&o);
                    known.insert(change.clone());
                    change
                }
                Some(Update::Deleted(o)) => {
                    let change = change_of(&o);
                    known.remove(&change);
                    change
                }
                Some(Update::Listed(o)) => {
                    let change = change_of(&o);
                    relisted
                        .get_or_insert_with(HashSet::new)
                        .insert(change.clone());
                    change
                }
                Some(Update::Relisting) => {
                    relisted = Some(HashSet::new());
                    continue;
                }
                Some(Update::Synced) => {
                    let listed = relisted.take().unwrap_or_default();
                    for gone in known.difference(&listed) {
                        let _ = changes.send(gone.clone());
                    }
                    known = listed;
                    continue;
                }
            };
            let _ = changes.send(change);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pod `name`'s change.
    fn pod(name: &str) -> Change {
        Change::Pod(format!("m/{name}"))
    }

    #[tokio::test]
    async fn a_relist_reports_what_was_deleted_while_the_watch_was_down() {
        let updates = futures::stream::iter([
            Update::Relisting,
            Update::Listed("a"),
            Update::Listed("b"),
            Update::Synced,
            Update::Applied("c"),
            Update::Deleted("a"),
            // The watch broke; b and c were deleted meanwhile, d created.
            Update::Relisting,
            Update::Listed("d"),
            Update::Synced,
            // Later changes are still reported, against the new list.
            Update::Deleted("d"),
        ]);
        let (tx, mut rx) = mpsc::unbounded_channel();
        spawn_watch(
            updates,
            |name: &&str| pod(name),
            tx,
            CancellationToken::new(),
        );
        let mut seen = Vec::new();
        while let Some(change) = rx.recv().await {
            seen.push(change);
        }
        let (first, rest) = seen.split_at(5);
        assert_eq!(first, [pod("a"), pod("b"), pod("c"), pod("a"), pod("d")]);
        let mut gone = rest[..2].to_vec();
        gone.sort_by_key(|c| format!("{c:?}"));
        assert_eq!(
            gone,
            [pod("b"), pod("c")],
            "deleted while the watch was down"
        );
        assert_eq!(rest[2..], [pod("d")]);
    }
}
