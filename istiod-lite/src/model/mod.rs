//! The model: Kubernetes objects into the xDS resources every ztunnel receives,
//! converted the way istiod converts them for ztunnel.
//!
//! Watches Pods, Services, Namespaces, waypoints' Gateways, `security.istio.io/v1`
//! AuthorizationPolicies and PeerAuthentications, and the Gateway API's HTTPRoutes,
//! GRPCRoutes and TCPRoutes (list and watch only, cluster-wide) and publishes
//! `istio.workload.Address` (workloads by uid, services by `namespace/hostname`) and
//! `istio.security.Authorization` (by `namespace/name`) into the [`ResourceStore`], and
//! for waypoints the policies with `targetRefs` and the routes bound to Services.
//! Namespaces are read only for their `istio.io/use-waypoint` labels. Nodes and
//! EndpointSlices are not watched: service endpoints come from Service selectors over
//! pods (as istiod does for pods).
//!
//! Changes are coalesced for [`DEBOUNCE`] before a rebuild. Nothing is published until
//! every kind has been listed once, so proxies never see pods without their policies.

pub mod convert;
pub mod peer_authn;
pub mod policy;
pub mod routes;
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

use crate::kube::pods::{PodIndex, PodIndexFeed};
use crate::xds::store::ResourceStore;
use mesh_kube::watch::IfAbsent;
use snapshot::{Rebuilder, Stores};
use watch::Progress;

/// The kinds watched: Pods, Services, AuthorizationPolicies, PeerAuthentications,
/// Namespaces, Gateways, and the three route kinds.
const KINDS: usize = 6 + routes::ROUTE_KINDS.len();
/// Events arriving within this window are handled by one rebuild.
pub const DEBOUNCE: Duration = Duration::from_millis(20);
/// Istio's default cluster DNS domain.
pub const DEFAULT_CLUSTER_DOMAIN: &str = "cluster.local";

/// Settings of the conversion (all come from istiod-lite's config).
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

/// `gateway.networking.k8s.io/v1` Gateway, read as a dynamic object (served only while
/// the Gateway API CRDs are installed).
pub fn gateway_resource() -> ApiResource {
    ApiResource {
        group: "gateway.networking.k8s.io".into(),
        version: "v1".into(),
        api_version: "gateway.networking.k8s.io/v1".into(),
        kind: "Gateway".into(),
        plural: "gateways".into(),
    }
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

/// Starts the watches and the rebuild loop; they run until `cancel` fires. The
/// returned flag turns true once every kind is listed and the first complete set of
/// resources is in `store`. The pod watch also keeps the CA's `pod_index`.
pub fn start(
    client: Client,
    opts: Options,
    store: ResourceStore,
    pod_index: PodIndex,
    cancel: CancellationToken,
) -> signal::Receiver<bool> {
    let changes = signal::Sender::new(0u64);
    let kinds: [Arc<AtomicBool>; KINDS] = Default::default();
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
    let gw = gateway_resource();
    let gateways = Writer::<DynamicObject>::new(gw.clone());
    let route_writers =
        routes::ROUTE_KINDS.map(|kind| Writer::<DynamicObject>::new(kind.resource()));
    let stores = Stores {
        routes: routes::ROUTE_KINDS
            .iter()
            .zip(&route_writers)
            .map(|(kind, writer)| (*kind, writer.as_reader()))
            .collect(),
        gateways: gateways.as_reader(),
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
        |_| {},
        c.clone(),
    );
    watch::spawn(
        "pods",
        Api::all(client.clone()),
        pods,
        IfAbsent::Wait,
        progress(0),
        {
            let mut feed = PodIndexFeed::new(pod_index);
            move |update| feed.update(update)
        },
        c.clone(),
    );
    watch::spawn(
        "services",
        Api::all(client.clone()),
        services,
        IfAbsent::Wait,
        progress(1),
        |_| {},
        c.clone(),
    );
    let ap_api = Api::<DynamicObject>::all_with(client.clone(), &ap);
    watch::spawn(
        "authorizationpolicies",
        ap_api,
        policies,
        IfAbsent::Empty,
        progress(2),
        |_| {},
        c.clone(),
    );
    watch::spawn(
        "gateways",
        Api::<DynamicObject>::all_with(client.clone(), &gw),
        gateways,
        IfAbsent::Empty,
        progress(5),
        |_| {},
        c.clone(),
    );
    for (i, (kind, writer)) in routes::ROUTE_KINDS.iter().zip(route_writers).enumerate() {
        watch::spawn(
            kind.plural,
            Api::<DynamicObject>::all_with(client.clone(), &kind.resource()),
            writer,
            IfAbsent::Empty,
            progress(6 + i),
            |_| {},
            c.clone(),
        );
    }
    let pa_api = Api::<DynamicObject>::all_with(client, &pa);
    watch::spawn(
        "peerauthentications",
        pa_api,
        peer_authns,
        IfAbsent::Empty,
        progress(3),
        |_| {},
        c.clone(),
    );

    let (synced_tx, synced) = signal::channel(false);
    let rebuilder = Rebuilder::new(stores, opts, store);
    tokio::spawn(run(
        rebuilder,
        changes.subscribe(),
        kinds,
        synced_tx,
        cancel,
    ));
    synced
}

/// Waits for every kind's first list, publishes, says it is synced, then rebuilds
/// after each burst of changes.
async fn run(
    mut rebuilder: Rebuilder,
    mut changes: signal::Receiver<u64>,
    kinds: [Arc<AtomicBool>; KINDS],
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
    debug!("model stopped");
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
