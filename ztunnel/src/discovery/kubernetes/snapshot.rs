//! Builds the "kubernetes" [`ProxyState`] from the watched objects.
//!
//! Each rebuild converts everything from the reflector stores (cheap next to an API
//! round trip, and it cannot drift from the stores the way incremental updates can),
//! then publishes only when the result differs from the last one, so pod status noise
//! does not make proxies re-check live connections.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, Service as KubeService};
use kube::core::DynamicObject;
use kube::runtime::reflector::Store;
use kube::ResourceExt;
use tracing::{debug, info, warn};

use super::convert::{self, ServiceInfo};
use super::policy::{self, ConvertedPolicy};
use super::{Options, SOURCE};
use crate::state::{Authorization, ProxyState, Service, StateStore, Workload};

/// The reflector stores a rebuild reads.
#[derive(Clone)]
pub struct Stores {
    pub pods: Store<Pod>,
    pub services: Store<KubeService>,
    pub policies: Store<DynamicObject>,
}

/// Everything the source publishes, sorted by key so two builds compare equal.
#[derive(Debug, Default, PartialEq)]
pub struct Built {
    pub workloads: Vec<Workload>,
    pub services: Vec<Service>,
    pub policies: Vec<Authorization>,
}

impl Built {
    pub fn to_state(&self) -> ProxyState {
        let mut state = ProxyState::new();
        for w in &self.workloads {
            state.insert_workload(w.clone());
        }
        for s in &self.services {
            state.insert_service(s.clone());
        }
        for p in &self.policies {
            state.insert_policy(p.clone());
        }
        state
    }
}

/// Converts all objects. Pure: the same objects always give the same [`Built`].
pub fn build(
    pods: &[Arc<Pod>],
    services: &[Arc<KubeService>],
    policies: &[ConvertedPolicy],
    opts: &Options,
) -> Built {
    let services: Vec<ServiceInfo> = services
        .iter()
        .filter_map(|s| convert::service(s, opts))
        .collect();
    let mut by_namespace: HashMap<&str, Vec<&ServiceInfo>> = HashMap::new();
    for s in &services {
        by_namespace
            .entry(s.service.namespace.as_str())
            .or_default()
            .push(s);
    }
    let mut workloads: Vec<Workload> = pods
        .iter()
        .filter_map(|p| {
            let ns = p.metadata.namespace.as_deref().unwrap_or_default();
            let services = by_namespace.get(ns).map(Vec::as_slice).unwrap_or_default();
            convert::pod(p, services, policies, opts)
        })
        .collect();
    workloads.sort_by(|a, b| a.uid.cmp(&b.uid));
    let mut services: Vec<Service> = services.into_iter().map(|s| s.service).collect();
    services.sort_by_key(Service::key);
    let mut policies: Vec<Authorization> =
        policies.iter().map(|p| p.authorization.clone()).collect();
    policies.sort_by_key(Authorization::key);
    Built {
        workloads,
        services,
        policies,
    }
}

/// Rebuilds and publishes; remembers what it logged so each policy version warns once.
pub struct Rebuilder {
    stores: Stores,
    opts: Options,
    state: StateStore,
    last: Option<Built>,
    /// `namespace/name@resourceVersion` of policies whose problems were logged.
    logged: HashSet<String>,
}

impl Rebuilder {
    pub fn new(stores: Stores, opts: Options, state: StateStore) -> Self {
        Rebuilder {
            stores,
            opts,
            state,
            last: None,
            logged: HashSet::new(),
        }
    }

    /// Publishes the current objects; false when nothing changed since the last call.
    pub fn rebuild(&mut self) -> bool {
        let policies = self.convert_policies();
        let built = build(
            &self.stores.pods.state(),
            &self.stores.services.state(),
            &policies,
            &self.opts,
        );
        if self.last.as_ref() == Some(&built) {
            return false;
        }
        let (w, s, p) = (
            built.workloads.len(),
            built.services.len(),
            built.policies.len(),
        );
        self.state.replace_source(SOURCE, built.to_state());
        if self.last.is_none() {
            info!(
                workloads = w,
                services = s,
                policies = p,
                "kubernetes discovery synced"
            );
        } else {
            debug!(
                workloads = w,
                services = s,
                policies = p,
                "kubernetes state updated"
            );
        }
        self.last = Some(built);
        true
    }

    fn convert_policies(&mut self) -> Vec<ConvertedPolicy> {
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for obj in self.stores.policies.state() {
            let key = format!(
                "{}/{}@{}",
                obj.namespace().unwrap_or_default(),
                obj.name_any(),
                obj.resource_version().unwrap_or_default()
            );
            let first = !self.logged.contains(&key);
            match policy::convert(&obj, &self.opts.root_namespace) {
                Ok(p) => {
                    if first {
                        for w in &p.authorization.warnings {
                            warn!(policy = %p.authorization.key(), "AuthorizationPolicy {w}");
                        }
                    }
                    out.push(p);
                }
                Err(e) if first => {
                    let policy =
                        format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any());
                    match e {
                        policy::NotConverted::TargetRefs => {
                            debug!(%policy, "AuthorizationPolicy not enforced by ztunnel: {e}")
                        }
                        _ => warn!(%policy, "AuthorizationPolicy not enforced by ztunnel: {e}"),
                    }
                }
                Err(_) => {}
            }
            seen.insert(key);
        }
        // Forget deleted and superseded versions.
        self.logged = seen;
        out
    }
}
