//! Pods, indexed the two ways the CA asks about them: by name (is a token's
//! pod still there, with that UID?) and by node and service account (does a pod
//! with this identity run on the caller's node?). Kept from one watch, never
//! listed per request.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use mesh_kube::watch::{events, updates, IfAbsent, Update};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// What the CA needs to know of a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodFacts {
    pub uid: String,
    pub service_account: String,
    pub node: String,
}

/// (node, namespace, service account).
type NodeIdentity = (String, String, String);

#[derive(Default)]
struct Index {
    by_name: HashMap<(String, String), PodFacts>,
    by_node_identity: HashMap<NodeIdentity, usize>,
}

/// Thread-safe and cheap to clone.
#[derive(Clone)]
pub struct PodIndex {
    inner: Arc<RwLock<Index>>,
    synced: watch::Sender<bool>,
}

impl Default for PodIndex {
    fn default() -> Self {
        PodIndex {
            inner: Arc::default(),
            synced: watch::channel(false).0,
        }
    }
}

impl PodIndex {
    pub fn get(&self, namespace: &str, name: &str) -> Option<PodFacts> {
        let index = self.read();
        index
            .by_name
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
    }

    /// Whether a running (not finished) pod with `namespace`/`service_account` is on `node`.
    pub fn identity_on_node(&self, node: &str, namespace: &str, service_account: &str) -> bool {
        let key = (
            node.to_owned(),
            namespace.to_owned(),
            service_account.to_owned(),
        );
        self.read().by_node_identity.contains_key(&key)
    }

    pub fn len(&self) -> usize {
        self.read().by_name.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Resolves once the first full list has been indexed.
    pub async fn wait_synced(&self) {
        let mut synced = self.synced.subscribe();
        let _ = synced.wait_for(|s| *s).await;
    }

    pub fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }

    pub fn apply(&self, pod: &Pod) {
        let mut index = self.write();
        index.remove(&key(pod));
        if let Some(facts) = facts(pod) {
            index.insert(key(pod), facts);
        }
    }

    pub fn delete(&self, pod: &Pod) {
        self.write().remove(&key(pod));
    }

    /// Swaps in a complete list (after a (re-)list), so nothing stale survives.
    pub fn replace_all(&self, pods: &[Pod]) {
        let mut fresh = Index::default();
        for pod in pods {
            if let Some(facts) = facts(pod) {
                fresh.insert(key(pod), facts);
            }
        }
        *self.write() = fresh;
        self.synced.send_replace(true);
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Index> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Index> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }
}

impl Index {
    fn insert(&mut self, key: (String, String), facts: PodFacts) {
        let node_key = (
            facts.node.clone(),
            key.0.clone(),
            facts.service_account.clone(),
        );
        *self.by_node_identity.entry(node_key).or_default() += 1;
        self.by_name.insert(key, facts);
    }

    fn remove(&mut self, key: &(String, String)) {
        let Some(old) = self.by_name.remove(key) else {
            return;
        };
        let node_key = (old.node, key.0.clone(), old.service_account);
        if let Some(count) = self.by_node_identity.get_mut(&node_key) {
            *count -= 1;
            if *count == 0 {
                self.by_node_identity.remove(&node_key);
            }
        }
    }
}

fn key(pod: &Pod) -> (String, String) {
    (pod.namespace().unwrap_or_default(), pod.name_any())
}

/// Scheduled pods that have not finished; others need no certificates.
fn facts(pod: &Pod) -> Option<PodFacts> {
    let spec = pod.spec.as_ref()?;
    let node = spec.node_name.clone().filter(|n| !n.is_empty())?;
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return None;
    }
    Some(PodFacts {
        uid: pod.uid()?,
        service_account: mesh_kube::pod::service_account(pod).to_owned(),
        node,
    })
}

/// Keeps `index` in step with every pod in the cluster until `shutdown`.
pub async fn watch_pods(client: Client, index: PodIndex, shutdown: CancellationToken) {
    let api: Api<Pod> = Api::all(client);
    let events = events(api, watcher::Config::default());
    let mut updates = std::pin::pin!(updates("pods", events, IfAbsent::Wait));
    let mut listing: Vec<Pod> = Vec::new();
    loop {
        let update = tokio::select! {
            () = shutdown.cancelled() => return,
            update = updates.next() => update,
        };
        match update {
            Some(Update::Applied(pod)) => index.apply(&pod),
            Some(Update::Deleted(pod)) => index.delete(&pod),
            Some(Update::Relisting) => listing.clear(),
            Some(Update::Listed(pod)) => listing.push(pod),
            Some(Update::Synced) => {
                index.replace_all(&listing);
                tracing::info!(pods = index.len(), "pod index synced");
                listing = Vec::new();
            }
            None => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(ns: &str, name: &str, uid: &str, sa: &str, node: &str, phase: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"namespace": ns, "name": name, "uid": uid},
            "spec": {"serviceAccountName": sa, "nodeName": node, "containers": []},
            "status": {"phase": phase},
        }))
        .unwrap()
    }

    #[test]
    fn indexes_by_name_and_by_node_identity() {
        let index = PodIndex::default();
        index.replace_all(&[
            pod("a", "p1", "u1", "sa", "n1", "Running"),
            pod("a", "p2", "u2", "sa", "n1", "Running"),
            pod("a", "done", "u3", "job", "n1", "Succeeded"),
        ]);
        assert!(index.is_synced());
        assert_eq!(index.get("a", "p1").unwrap().uid, "u1");
        assert!(index.identity_on_node("n1", "a", "sa"));
        assert!(!index.identity_on_node("n2", "a", "sa"));
        assert!(
            !index.identity_on_node("n1", "a", "job"),
            "finished pods do not count"
        );

        index.delete(&pod("a", "p1", "u1", "sa", "n1", "Running"));
        assert!(index.identity_on_node("n1", "a", "sa"), "p2 is still there");
        index.delete(&pod("a", "p2", "u2", "sa", "n1", "Running"));
        assert!(!index.identity_on_node("n1", "a", "sa"));

        // Moving a pod (same name, new node) moves its identity.
        index.apply(&pod("a", "p3", "u4", "sa", "n1", "Running"));
        index.apply(&pod("a", "p3", "u5", "sa", "n2", "Running"));
        assert!(!index.identity_on_node("n1", "a", "sa"));
        assert!(index.identity_on_node("n2", "a", "sa"));
        assert_eq!(index.get("a", "p3").unwrap().uid, "u5");
    }

    #[test]
    fn unscheduled_pods_are_not_indexed() {
        let index = PodIndex::default();
        index.apply(&pod("a", "p", "u", "sa", "", "Pending"));
        assert!(index.get("a", "p").is_none());
    }
}
