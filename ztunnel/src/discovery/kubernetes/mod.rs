//! Kubernetes-native discovery: workloads, services and policies straight from the API
//! server, so a cluster without istiod still has a mesh.
//!
//! Watches Pods, Services and `security.istio.io/v1` AuthorizationPolicies and
//! PeerAuthentications (list and watch only, cluster-wide), converts them the way
//! istiod does for ztunnel, and
//! publishes the result as the StateStore source "kubernetes". Namespaces are watched
//! only for their `istio.io/use-waypoint` labels. Nodes and EndpointSlices are not
//! watched: service endpoints come from Service selectors over pods (as istiod does
//! for pods).
//!
//! Changes are coalesced for [`DEBOUNCE`] before a rebuild. Nothing is published until
//! every kind has been listed once, so proxies never see pods without their policies.

pub mod convert;
pub mod peer_authn;
pub mod policy;
mod policy_spec;
mod snapshot;
mod watch;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod, Service as KubeService};
use kube::core::{ApiResource, DynamicObject};
use kube::runtime::reflector::store::Writer;
use kube::{Api, Client};
use shared_types::constants::{DEFAULT_TRUST_DOMAIN, SYSTEM_NAMESPACE};
use tokio::sync::watch as signal;
use tokio_util::sync::CancellationToken;
use tracing::debug;

pub use snapshot::{build, Built};

use crate::discovery::FirstSync;
use crate::readiness::BlockReady;
use crate::state::StateStore;
use snapshot::{Rebuilder, Stores};
use watch::{IfAbsent, Progress};

/// Name of this source in the [`StateStore`].
pub const SOURCE: &str = "kubernetes";
/// Events arriving within this window are handled by one rebuild.
pub const DEBOUNCE: Duration = Duration::from_millis(20);
/// Istio's default cluster DNS domain.
pub const DEFAULT_CLUSTER_DOMAIN: &str = "cluster.local";

/// Settings of the conversion (all come from ztunnel's config).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// `CLUSTER_ID`: first part of workload uids.
    pub cluster_id: String,
    /// `TRUST_DOMAIN`: set on every workload.
    pub trust_domain: String,
    /// `CLUSTER_DOMAIN`: service hostnames are `<name>.<ns>.svc.<cluster domain>`.
    pub cluster_domain: String,
    /// Istio's root namespace: its selector-less policies apply mesh-wide (Global).
    pub root_namespace: String,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            cluster_id: "Kubernetes".into(),
            trust_domain: DEFAULT_TRUST_DOMAIN.into(),
            cluster_domain: DEFAULT_CLUSTER_DOMAIN.into(),
            root_namespace: SYSTEM_NAMESPACE.into(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum KubernetesError {
    #[error("no Kubernetes API configuration found (KUBECONFIG, ~/.kube/config, or in-cluster service account): {0}")]
    Config(#[from] kube::config::InferConfigError),
    #[error("cannot build the Kubernetes client: {0}")]
    Client(#[from] kube::Error),
}

/// A client from `KUBECONFIG` / `~/.kube/config`, else the in-cluster service account
/// (kube's `Config::infer`).
pub async fn infer_client() -> Result<Client, KubernetesError> {
    let config = kube::Config::infer().await?;
    Ok(Client::try_from(config)?)
}

/// `security.istio.io/v1` AuthorizationPolicy, read as a dynamic object.
pub fn authorization_policy_resource() -> ApiResource {
    ApiResource {
        group: "security.istio.io".into(),
        version: "v1".into(),
        api_version: "security.istio.io/v1".into(),
        kind: "AuthorizationPolicy".into(),
        plural: "authorizationpolicies".into(),
    }
}

/// Starts the watches and the rebuild loop; they run until `cancel` fires. `ready` is
/// released once every kind is listed and the first snapshot is published.
pub fn start(
    client: Client,
    opts: Options,
    state: StateStore,
    ready: Option<BlockReady>,
    cancel: CancellationToken,
) -> FirstSync {
    let changes = signal::Sender::new(0u64);
    let kinds: [Arc<AtomicBool>; 5] = Default::default();
    let progress = |i: usize| Progress {
        changes: changes.clone(),
        synced: kinds[i].clone(),
    };

    let pods = Writer::<Pod>::default();
    let services = Writer::<KubeService>::default();
    let ap = authorization_policy_resource();
    let policies = Writer::<DynamicObject>::new(ap.clone());
    let pa = peer_authn::resource();
    let peer_authns = Writer::<DynamicObject>::new(pa.clone());
    let namespaces = Writer::<Namespace>::default();
    let stores = Stores {
        pods: pods.as_reader(),
        services: services.as_reader(),
        policies: policies.as_reader(),
        peer_authentications: peer_authns.as_reader(),
        namespaces: namespaces.as_reader(),
    };
    let c = &cancel;
    watch::spawn(
        "namespaces",
        Api::all(client.clone()),
        namespaces,
        IfAbsent::Wait,
        progress(4),
        c.clone(),
    );
    watch::spawn(
        "pods",
        Api::all(client.clone()),
        pods,
        IfAbsent::Wait,
        progress(0),
        c.clone(),
    );
    watch::spawn(
        "services",
        Api::all(client.clone()),
        services,
        IfAbsent::Wait,
        progress(1),
        c.clone(),
    );
    let ap_api = Api::<DynamicObject>::all_with(client.clone(), &ap);
    watch::spawn(
        "authorizationpolicies",
        ap_api,
        policies,
        IfAbsent::Empty,
        progress(2),
        c.clone(),
    );
    let pa_api = Api::<DynamicObject>::all_with(client, &pa);
    watch::spawn(
        "peerauthentications",
        pa_api,
        peer_authns,
        IfAbsent::Empty,
        progress(3),
        c.clone(),
    );

    let (synced_tx, synced) = signal::channel(false);
    let rebuilder = Rebuilder::new(stores, opts, state);
    tokio::spawn(run(
        rebuilder,
        changes.subscribe(),
        kinds,
        ready,
        synced_tx,
        cancel,
    ));
    FirstSync::new(synced)
}

/// Waits for every kind's first list, publishes, releases readiness, then rebuilds
/// after each burst of changes.
async fn run(
    mut rebuilder: Rebuilder,
    mut changes: signal::Receiver<u64>,
    kinds: [Arc<AtomicBool>; 5],
    ready: Option<BlockReady>,
    synced: signal::Sender<bool>,
    cancel: CancellationToken,
) {
    while !kinds.iter().all(|k| k.load(Ordering::SeqCst)) {
        tokio::select! {
            _ = cancel.cancelled() => return,
            r = changes.changed() => if r.is_err() { return },
        }
    }
    changes.borrow_and_update();
    rebuilder.rebuild();
    drop(ready);
    synced.send_replace(true);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            r = changes.changed() => if r.is_err() { break },
        }
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tokio::time::sleep(DEBOUNCE) => {}
        }
        changes.borrow_and_update();
        rebuilder.rebuild();
    }
    debug!("kubernetes discovery stopped");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorization_policy_resource_is_istio_v1() {
        let ap = authorization_policy_resource();
        assert_eq!(ap.api_version, "security.istio.io/v1");
        assert_eq!(ap.plural, "authorizationpolicies");
    }
}
