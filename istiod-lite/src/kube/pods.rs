//! Pods, indexed the two ways the CA asks about them: by name (is a token's
//! pod still there, with that UID?) and by node and service account (does a pod
//! with this identity run on the caller's node?). Kept from the model's pod watch
//! ([`PodIndexFeed`]), never listed per request.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use mesh_kube::watch::Update;
use tokio::sync::watch;

use shared_types::constants::{GATEWAY_MANAGED_LABEL, WAYPOINT_CONTROLLER};

/// What the CA and xDS need to know of a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodFacts {
    pub uid: String,
    pub service_account: String,
    pub node: String,
    /// A waypoint's pod (`gateway.istio.io/managed: istio.io-mesh-controller`, set by
    /// the waypoint controller): it may stream xDS.
    pub waypoint: bool,
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
        index.add(pod);
    }

    pub fn delete(&self, pod: &Pod) {
        self.write().remove(&key(pod));
    }

    /// Swaps in a complete list, as [`PodIndexFeed`] does after a (re-)list: for tests
    /// that set up an index without a watch.
    #[cfg(test)]
    pub fn replace_all(&self, pods: &[Pod]) {
        let mut fresh = Index::default();
        for pod in pods {
            fresh.add(pod);
        }
        self.swap_in(fresh);
    }

    fn swap_in(&self, fresh: Index) {
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
    fn add(&mut self, pod: &Pod) {
        if let Some(facts) = facts(pod) {
            self.insert(key(pod), facts);
        }
    }

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
    let waypoint = pod
        .labels()
        .get(GATEWAY_MANAGED_LABEL)
        .is_some_and(|v| v == WAYPOINT_CONTROLLER);
    Some(PodFacts {
        uid: pod.uid()?,
        service_account: mesh_kube::pod::service_account(pod).to_owned(),
        node,
        waypoint,
    })
}

/// Keeps a [`PodIndex`] in step with a pod watch's updates. istiod-lite has one pod
/// watch, the model's: it feeds the index too, so a re-list of every pod in the
/// cluster is fetched and held once, not twice.
pub struct PodIndexFeed {
    index: PodIndex,
    /// A (re-)list being received: only each pod's facts, not the pods.
    listing: Index,
}

impl PodIndexFeed {
    pub fn new(index: PodIndex) -> Self {
        PodIndexFeed {
            index,
            listing: Index::default(),
        }
    }

    pub fn update(&mut self, update: &Update<Pod>) {
        match update {
            Update::Applied(pod) => self.index.apply(pod),
            Update::Deleted(pod) => self.index.delete(pod),
            Update::Relisting => self.listing = Index::default(),
            Update::Listed(pod) => self.listing.add(pod),
            Update::Synced => {
                self.index.swap_in(std::mem::take(&mut self.listing));
                tracing::info!(pods = self.index.len(), "pod index synced");
            }
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
    fn the_feed_swaps_in_a_relist_only_once_it_is_complete() {
        let index = PodIndex::default();
        let mut feed = PodIndexFeed::new(index.clone());
        feed.update(&Update::Relisting);
        feed.update(&Update::Listed(pod("a", "p1", "u1", "sa", "n1", "Running")));
        assert!(!index.is_synced() && index.get("a", "p1").is_none());
        feed.update(&Update::Synced);
        assert!(index.is_synced() && index.identity_on_node("n1", "a", "sa"));
        // The watch restarts; p1 was deleted meanwhile and p2 created.
        feed.update(&Update::Relisting);
        feed.update(&Update::Listed(pod("a", "p2", "u2", "sb", "n2", "Running")));
        assert!(
            index.identity_on_node("n1", "a", "sa"),
            "the old index serves until the list is complete"
        );
        feed.update(&Update::Synced);
        assert!(!index.identity_on_node("n1", "a", "sa"));
        assert_eq!(index.get("a", "p2").unwrap().uid, "u2");
        feed.update(&Update::Deleted(pod(
            "a", "p2", "u2", "sb", "n2", "Running",
        )));
        assert!(index.get("a", "p2").is_none());
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
