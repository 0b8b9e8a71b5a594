//! The one source of truth the proxies read: workloads, services and L4 policies.
//!
//! Each discovery source ("local", later "kubernetes") hands over a complete
//! [`ProxyState`] snapshot; the [`StateStore`] merges the sources into one indexed
//! snapshot and swaps it in atomically. Readers (every connection) clone an `Arc` under a
//! short read lock and never wait for a rebuild.

pub mod demand;
mod snapshot;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use tokio::sync::watch;

// The types live in `mesh-model` (istiod-lite builds them too); the state is ztunnel's.
pub use mesh_model::{policy, service, workload};
pub use mesh_model::{
    Action, Authorization, ConnectionAttrs, Denied, HealthStatus, NamespacedHostname,
    NetworkAddress, Protocol, RbacMatch, Scope, Service, ServiceAccountMatch, StringMatch,
    Workload,
};
pub use snapshot::ProxyState;

use demand::Demand;

/// Cheap-to-clone handle on the current merged state.
#[derive(Clone)]
pub struct StateStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// What readers see: all sources merged.
    current: RwLock<Arc<ProxyState>>,
    /// Per-source snapshots; the lock also serializes writers. Sources are merged in name
    /// order, so on a key collision the later name wins ("local" overrides "kubernetes").
    sources: Mutex<BTreeMap<String, Arc<ProxyState>>>,
    generation: watch::Sender<u64>,
    /// Set when the source answers lookups on demand (`XDS_ON_DEMAND`).
    demand: OnceLock<Demand>,
}

impl Default for StateStore {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for StateStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (w, s, p) = self.snapshot().counts();
        f.debug_struct("StateStore")
            .field("generation", &self.generation())
            .field("workloads", &w)
            .field("services", &s)
            .field("policies", &p)
            .finish()
    }
}

impl StateStore {
    pub fn new() -> Self {
        StateStore {
            inner: Arc::new(Inner {
                current: RwLock::new(Arc::new(ProxyState::default())),
                sources: Mutex::new(BTreeMap::new()),
                generation: watch::Sender::new(0),
                demand: OnceLock::new(),
            }),
        }
    }

    /// Replaces everything `source` contributed, atomically for readers; bumps the
    /// generation so subscribers re-check live connections.
    pub fn replace_source(&self, source: &str, snapshot: ProxyState) {
        let mut sources = lock(&self.inner.sources);
        sources.insert(source.to_string(), Arc::new(snapshot));
        self.publish(&sources);
    }

    /// Drops everything `source` contributed (e.g. its watch was stopped).
    pub fn remove_source(&self, source: &str) {
        let mut sources = lock(&self.inner.sources);
        if sources.remove(source).is_some() {
            self.publish(&sources);
        }
    }

    fn publish(&self, sources: &BTreeMap<String, Arc<ProxyState>>) {
        let merged = match sources.len() {
            0 => Arc::new(ProxyState::default()),
            // The common case (one source) shares the source's snapshot as is.
            1 => sources.values().next().cloned().unwrap_or_default(),
            _ => {
                let mut merged = ProxyState::default();
                for s in sources.values() {
                    merged.merge_from(s);
                }
                Arc::new(merged)
            }
        };
        *self
            .inner
            .current
            .write()
            .unwrap_or_else(|e| e.into_inner()) = merged;
        self.inner.generation.send_modify(|g| *g += 1);
    }

    /// From now on, an address the state misses is asked for through `demand`.
    pub fn enable_on_demand(&self, demand: Demand) {
        let _ = self.inner.demand.set(demand);
    }

    /// With on-demand discovery, makes sure the state has what it knows of `ip`: if
    /// neither a workload nor a Service VIP has it, asks for it and waits for the
    /// answer. Call before the lookups of a new connection; without on-demand it
    /// returns at once.
    pub async fn fetch_address(&self, ip: IpAddr) {
        let Some(demand) = self.inner.demand.get() else {
            return;
        };
        let state = self.snapshot();
        if state.workload_by_ip(ip).is_some() || state.service_by_vip(ip).is_some() {
            return;
        }
        demand.fetch(demand.key(ip)).await;
    }

    /// Whether misses are asked for (`XDS_ON_DEMAND`).
    pub fn is_on_demand(&self) -> bool {
        self.inner.demand.get().is_some()
    }

    /// With on-demand discovery, asks for the Service `hostname` of `namespace`
    /// (Istio's `namespace/hostname` key) unless the state has it, and waits.
    pub async fn fetch_service(&self, namespace: &str, hostname: &str) {
        let Some(demand) = self.inner.demand.get() else {
            return;
        };
        if self
            .snapshot()
            .service_by_hostname(hostname, namespace)
            .is_some()
        {
            return;
        }
        demand.fetch(format!("{namespace}/{hostname}")).await;
    }

    /// The current merged snapshot; use it when several lookups must agree.
    pub fn snapshot(&self) -> Arc<ProxyState> {
        self.inner
            .current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Number of published changes so far.
    pub fn generation(&self) -> u64 {
        *self.inner.generation.borrow()
    }

    pub fn workload_by_ip(&self, ip: IpAddr) -> Option<Arc<Workload>> {
        self.snapshot().workload_by_ip(ip)
    }

    pub fn workload_by_uid(&self, uid: &str) -> Option<Arc<Workload>> {
        self.snapshot().workload_by_uid(uid)
    }

    pub fn workload_by_name(&self, namespace: &str, name: &str) -> Option<Arc<Workload>> {
        self.snapshot().workload_by_name(namespace, name)
    }

    pub fn service_by_vip(&self, ip: IpAddr) -> Option<Arc<Service>> {
        self.snapshot().service_by_vip(ip)
    }

    /// Healthy endpoints of `svc` for service port `port`: (workload, target port).
    /// Target port = the workload's own services map entry, else `svc.ports`, else `port`.
    pub fn service_endpoints(&self, svc: &Service, port: u16) -> Vec<(Arc<Workload>, u16)> {
        self.snapshot().service_endpoints(svc, port)
    }

    /// A random pick among [`Self::service_endpoints`].
    pub fn pick_endpoint(&self, svc: &Service, port: u16) -> Option<(Arc<Workload>, u16)> {
        self.snapshot().pick_endpoint(svc, port)
    }

    /// See [`ProxyState::gateway_workloads`].
    pub fn gateway_workloads(&self, gateway: &workload::GatewayAddress) -> Vec<Arc<Workload>> {
        self.snapshot().gateway_workloads(gateway)
    }

    /// Istio's L4 authorization for a connection to destination workload `dst`; see
    /// [`ProxyState::authorize`].
    pub fn authorize(&self, conn: &ConnectionAttrs, dst: &Workload) -> Result<(), Denied> {
        self.snapshot().authorize(conn, dst)
    }

    /// Change notifications (value = generation), used to re-check live connections
    /// when policy changes.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.generation.subscribe()
    }

    /// For `/config_dump`: `{"workloads": [..], "services": [..], "policies": [..]}`.
    pub fn dump(&self) -> serde_json::Value {
        self.snapshot().dump()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wl(uid: &str, ip: &str) -> Workload {
        Workload {
            uid: uid.into(),
            name: uid.into(),
            namespace: "ns".into(),
            workload_ips: vec![ip.parse().unwrap()],
            ..Default::default()
        }
    }

    #[test]
    fn replace_source_swaps_atomically_and_bumps_generation() {
        let store = StateStore::new();
        let mut rx = store.subscribe();
        assert_eq!(store.generation(), 0);

        let mut s = ProxyState::new();
        s.insert_workload(wl("a", "10.0.0.1"));
        store.replace_source("local", s);
        assert!(rx.has_changed().unwrap());
        assert_eq!(*rx.borrow_and_update(), 1);
        assert!(store.workload_by_ip("10.0.0.1".parse().unwrap()).is_some());

        // A reader's snapshot is unaffected by a later replace.
        let before = store.snapshot();
        let mut s = ProxyState::new();
        s.insert_workload(wl("b", "10.0.0.2"));
        store.replace_source("local", s);
        assert!(before.workload_by_uid("a").is_some());
        assert!(store.workload_by_uid("a").is_none());
        assert!(store.workload_by_name("ns", "b").is_some());
        assert_eq!(store.generation(), 2);
    }

    #[test]
    fn sources_merge_and_later_name_wins() {
        let store = StateStore::new();
        let mut k8s = ProxyState::new();
        k8s.insert_workload(wl("a", "10.0.0.1"));
        k8s.insert_workload(wl("shared", "10.0.0.5"));
        store.replace_source("kubernetes", k8s);
        let mut local = ProxyState::new();
        local.insert_workload(wl("shared", "10.0.0.6"));
        store.replace_source("local", local);

        assert!(store.workload_by_uid("a").is_some());
        assert!(store.workload_by_ip("10.0.0.5".parse().unwrap()).is_none());
        assert_eq!(
            store
                .workload_by_ip("10.0.0.6".parse().unwrap())
                .unwrap()
                .uid,
            "shared"
        );

        store.remove_source("local");
        assert!(store.workload_by_ip("10.0.0.5".parse().unwrap()).is_some());
        assert_eq!(store.generation(), 3);
    }
}
