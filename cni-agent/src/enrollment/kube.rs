//! What the agent knows of the cluster: this node's pods and all namespaces, each in a
//! kube-rs reflector store fed by a watcher, plus a GET for a pod the watch has not
//! delivered yet (a CNI ADD often arrives before the watch event).

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client};
use mesh_kube::watch::{reflected, updates, IfAbsent, Update};
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// A change the enrollment engine reacts to.
#[derive(Debug, Clone, PartialEq, Eq)]
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
        let tx = changes.clone();
        spawn_watch(
            updates("pods", reflected(pods_api, config, writer), IfAbsent::Wait),
            move |pod: &Pod| {
                let _ = tx.send(Change::Pod(mesh_kube::pod::key(pod)));
            },
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
            move |ns: &Namespace| {
                let name = ns.metadata.name.clone().unwrap_or_default();
                let _ = changes.send(Change::Namespace(name));
            },
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
/// `cancel`: the engine reconciles each from the store.
fn spawn_watch<K: Send + 'static>(
    updates: impl Stream<Item = Update<K>> + Send + 'static,
    on_change: impl Fn(&K) + Send + 'static,
    cancel: CancellationToken,
) {
    let mut updates = Box::pin(updates);
    tokio::spawn(async move {
        loop {
            let update = tokio::select! {
                _ = cancel.cancelled() => break,
                update = updates.next() => update,
            };
            match update {
                None => break,
                Some(Update::Applied(o) | Update::Deleted(o) | Update::Listed(o)) => on_change(&o),
                Some(Update::Relisting | Update::Synced) => {}
            }
        }
    });
}
