//! Builds the xDS resources from the watched objects.
//!
//! Each rebuild converts everything from the reflector stores (cheap next to an API
//! round trip, and it cannot drift from the stores the way incremental updates can),
//! then hands the complete sets to the [`ResourceStore`], which keeps the version of
//! every resource whose bytes did not change: pod status noise reaches no proxy.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, Pod, Service as KubeService};
use kube::core::DynamicObject;
use kube::runtime::reflector::Store;
use kube::ResourceExt;
use prost::Message;
use shared_types::constants::{WAYPOINT_CLASS, WAYPOINT_FOR_LABEL};
use shared_types::istio::xds::{Any, ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL};
use shared_types::waypoint::{
    WaypointPolicy, WaypointRoute, WAYPOINT_POLICY_TYPE_URL, WAYPOINT_ROUTE_TYPE_URL,
};
use tracing::{debug, info, warn};

use super::convert::{self, ServiceIndex, ServiceInfo, WaypointBindings, WaypointFor};
use super::peer_authn::{self, Effective, PeerAuthentications};
use super::policy::{self, ConvertedPolicy};
use super::routes::{self, RouteKind};
use super::Options;
use crate::xds::store::{Published, ResourceStore};
use mesh_model::xds::{encode_authorization, encode_service, encode_workload};
use mesh_model::{Authorization, Service, Workload};

/// The reflector stores a rebuild reads.
#[derive(Clone)]
pub struct Stores {
    pub pods: Store<Pod>,
    pub services: Store<KubeService>,
    pub policies: Store<DynamicObject>,
    pub peer_authentications: Store<DynamicObject>,
    /// Only for their `istio.io/use-waypoint` labels.
    pub namespaces: Store<Namespace>,
    /// Only `istio-waypoint` ones, for their `istio.io/waypoint-for` label.
    pub gateways: Store<DynamicObject>,
    /// HTTPRoutes, GRPCRoutes and TCPRoutes, each with its kind.
    pub routes: Vec<(RouteKind, Store<DynamicObject>)>,
}

/// Everything the source publishes, sorted by key so two builds compare equal.
#[derive(Debug, Default, PartialEq)]
pub struct Built {
    pub workloads: Vec<Workload>,
    pub services: Vec<Service>,
    pub policies: Vec<Authorization>,
    /// AuthorizationPolicies with `targetRefs`, for waypoints, by `namespace/name`.
    pub waypoint_policies: Vec<WaypointPolicy>,
    /// Routes bound to Services, for waypoints, by `kind/namespace/name`.
    pub waypoint_routes: Vec<WaypointRoute>,
}

impl Built {
    /// Publishes every resource under Istio's names: a workload by uid, a service by
    /// `namespace/hostname`, a policy by `namespace/name`.
    pub fn publish(&self, store: &ResourceStore) {
        let address = |name: String, value: Vec<u8>, aliases: Vec<String>| Published {
            name,
            body: Any {
                type_url: ADDRESS_TYPE_URL.into(),
                value,
            },
            aliases,
            related: Vec::new(),
        };
        // Istio's on-demand keys: `network/IP` for every address.
        let keys = |network: &str, ips: &mut dyn Iterator<Item = IpAddr>| {
            ips.map(|ip| format!("{network}/{ip}")).collect::<Vec<_>>()
        };
        // A Service's endpoints go with it to an on-demand client.
        let mut endpoints: HashMap<&str, Vec<String>> = HashMap::new();
        for w in &self.workloads {
            for service in w.services.keys() {
                endpoints.entry(service).or_default().push(w.uid.clone());
            }
        }
        let addresses: Vec<Published> = self
            .workloads
            .iter()
            .map(|w| {
                let aliases = keys(&w.network, &mut w.workload_ips.iter().copied());
                address(w.uid.clone(), encode_workload(w).encode_to_vec(), aliases)
            })
            .chain(self.services.iter().map(|s| {
                let key = s.key();
                let mut published = address(
                    key.clone(),
                    encode_service(s).encode_to_vec(),
                    s.vips.iter().map(|v| v.to_string()).collect(),
                );
                published.related = endpoints.remove(key.as_str()).unwrap_or_default();
                published.related.sort();
                published
            }))
            .collect();
        let policies: Vec<(String, Any)> = self
            .policies
            .iter()
            .map(|p| {
                let body = Any {
                    type_url: AUTHORIZATION_TYPE_URL.into(),
                    value: encode_authorization(p).encode_to_vec(),
                };
                (p.key(), body)
            })
            .collect();
        let waypoint_policies = self.waypoint_policies.iter().map(|p| {
            let body = Any {
                type_url: WAYPOINT_POLICY_TYPE_URL.into(),
                value: p.encode_to_vec(),
            };
            (format!("{}/{}", p.namespace, p.name), body)
        });
        store.replace_all(
            WAYPOINT_POLICY_TYPE_URL,
            waypoint_policies.collect::<Vec<_>>(),
        );
        let waypoint_routes = self.waypoint_routes.iter().map(|r| {
            let body = Any {
                type_url: WAYPOINT_ROUTE_TYPE_URL.into(),
                value: r.encode_to_vec(),
            };
            (r.key(), body)
        });
        store.replace_all(WAYPOINT_ROUTE_TYPE_URL, waypoint_routes.collect::<Vec<_>>());
        // Policies first: a workload never names a policy the proxies do not have.
        store.replace_all(AUTHORIZATION_TYPE_URL, policies);
        store.replace_all(ADDRESS_TYPE_URL, addresses);
    }
}

/// Converts all objects. Pure: the same objects always give the same [`Built`].
/// PeerAuthentications add, per workload, the policy keys of its effective mTLS mode
/// (and the policies those keys name). `waypoints` binds pods and services to their
/// waypoints.
pub fn build(
    pods: &[Arc<Pod>],
    services: &[Arc<KubeService>],
    waypoints: &WaypointBindings,
    policies: &[ConvertedPolicy],
    peer_authns: &PeerAuthentications,
    opts: &Options,
) -> Built {
    let waypoint = |namespace: &str, labels, workload| {
        waypoints.waypoint(namespace, labels, workload, &opts.cluster_domain)
    };
    let services: Vec<ServiceInfo> = services
        .iter()
        .filter_map(|s| {
            let mut info = convert::service(s, opts)?;
            info.service.waypoint =
                waypoint(&info.service.namespace, s.metadata.labels.as_ref(), false);
            Some(info)
        })
        .collect();
    let service_index = ServiceIndex::new(&services);
    // Policies converted from PeerAuthentications, by key.
    let mut converted: BTreeMap<String, Authorization> = BTreeMap::new();
    if !peer_authns.is_empty() {
        // istiod publishes the static policy whenever any PeerAuthentication exists.
        let strict = peer_authns.static_strict();
        converted.insert(strict.key(), strict);
    }
    let mut workloads: Vec<Workload> = pods
        .iter()
        .filter_map(|p| {
            let ns = p.metadata.namespace.as_deref().unwrap_or_default();
            let mut w = convert::pod(p, &service_index, policies, opts)?;
            w.waypoint = waypoint(ns, p.metadata.labels.as_ref(), true);
            let labels = p.metadata.labels.clone().unwrap_or_default();
            let key = match peer_authns.effective(ns, &labels) {
                Effective::Permissive => return Some(w),
                Effective::Strict => peer_authns.static_strict().key(),
                Effective::Ports(policy) => {
                    let key = policy.key();
                    converted.insert(key.clone(), policy);
                    key
                }
            };
            w.authorization_policies.push(key);
            w.authorization_policies.sort();
            w.authorization_policies.dedup();
            Some(w)
        })
        .collect();
    workloads.sort_by(|a, b| a.uid.cmp(&b.uid));
    let mut services: Vec<Service> = services.into_iter().map(|s| s.service).collect();
    services.sort_by_key(Service::key);
    let mut policies: Vec<Authorization> = policies
        .iter()
        .map(|p| p.authorization.clone())
        .chain(converted.into_values())
        .collect();
    policies.sort_by_key(Authorization::key);
    Built {
        workloads,
        services,
        policies,
        waypoint_policies: Vec::new(),
        waypoint_routes: Vec::new(),
    }
}

/// Rebuilds and publishes; remembers what it logged so each policy version warns once.
pub struct Rebuilder {
    stores: Stores,
    opts: Options,
    store: ResourceStore,
    last: Option<Built>,
    /// `namespace/name@resourceVersion` of policies whose problems were logged.
    logged: HashSet<String>,
    /// The same for PeerAuthentications.
    logged_peer_authns: HashSet<String>,
}

impl Rebuilder {
    pub fn new(stores: Stores, opts: Options, store: ResourceStore) -> Self {
        Rebuilder {
            stores,
            opts,
            store,
            last: None,
            logged: HashSet::new(),
            logged_peer_authns: HashSet::new(),
        }
    }

    /// Publishes the current objects; false when nothing changed since the last call.
    pub fn rebuild(&mut self) -> bool {
        let policies = self.convert_policies();
        let peer_authns = self.convert_peer_authentications();
        let waypoints = WaypointBindings {
            namespaces: self
                .stores
                .namespaces
                .state()
                .iter()
                .filter_map(|ns| Some((ns.metadata.name.clone()?, ns.labels().clone())))
                .collect(),
            gateways: self
                .stores
                .gateways
                .state()
                .iter()
                .filter(|g| g.data["spec"]["gatewayClassName"] == WAYPOINT_CLASS)
                .map(|g| {
                    let takes = g.labels().get(WAYPOINT_FOR_LABEL).map(String::as_str);
                    let key = (g.namespace().unwrap_or_default(), g.name_any());
                    (key, WaypointFor::parse(takes.unwrap_or_default()))
                })
                .collect(),
        };
        let mut built = build(
            &self.stores.pods.state(),
            &self.stores.services.state(),
            &waypoints,
            &policies,
            &peer_authns,
            &self.opts,
        );
        built.waypoint_policies = self.waypoint_policies();
        built.waypoint_routes = self.waypoint_routes();
        if self.last.as_ref() == Some(&built) {
            return false;
        }
        let (w, s, p) = (
            built.workloads.len(),
            built.services.len(),
            built.policies.len(),
        );
        built.publish(&self.store);
        if self.last.is_none() {
            info!(
                workloads = w,
                services = s,
                policies = p,
                "model synced: every kind listed"
            );
        } else {
            debug!(workloads = w, services = s, policies = p, "model updated");
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

    /// The AuthorizationPolicies that attach by `targetRefs`, for the waypoints, which
    /// read Istio's spec as it is; sorted by key.
    fn waypoint_policies(&self) -> Vec<WaypointPolicy> {
        let mut out: Vec<WaypointPolicy> = self
            .stores
            .policies
            .state()
            .iter()
            .filter(|obj| {
                let spec = &obj.data["spec"];
                !spec["targetRef"].is_null()
                    || spec["targetRefs"].as_array().is_some_and(|t| !t.is_empty())
            })
            .filter_map(|obj| {
                Some(WaypointPolicy {
                    name: obj.metadata.name.clone()?,
                    namespace: obj.metadata.namespace.clone()?,
                    spec_json: obj.data["spec"].to_string(),
                })
            })
            .collect();
        out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        out
    }

    /// The routes bound to Services, for the waypoints, which compile them themselves.
    fn waypoint_routes(&self) -> Vec<WaypointRoute> {
        let objects: Vec<(&RouteKind, Vec<Arc<DynamicObject>>)> = self
            .stores
            .routes
            .iter()
            .map(|(kind, store)| (kind, store.state()))
            .collect();
        routes::waypoint_routes(
            objects
                .iter()
                .flat_map(|(kind, routes)| routes.iter().map(move |r| (*kind, r.as_ref()))),
        )
    }

    fn convert_peer_authentications(&mut self) -> PeerAuthentications {
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for obj in self.stores.peer_authentications.state() {
            let key = format!(
                "PeerAuthentication {}/{}@{}",
                obj.namespace().unwrap_or_default(),
                obj.name_any(),
                obj.resource_version().unwrap_or_default()
            );
            match peer_authn::parse(&obj) {
                Ok(pa) => out.push(pa),
                Err(e) if !self.logged_peer_authns.contains(&key) => {
                    warn!(policy = %key, "PeerAuthentication ignored: {e}")
                }
                Err(_) => {}
            }
            seen.insert(key);
        }
        self.logged_peer_authns = seen;
        PeerAuthentications::new(out, &self.opts.root_namespace)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Istio's on-demand keys: every workload address and service VIP, as `network/IP`.
    #[test]
    fn addresses_are_published_as_aliases() {
        let built = Built {
            workloads: vec![Workload {
                uid: "Kubernetes//Pod/shop/web-0".into(),
                name: "web-0".into(),
                namespace: "shop".into(),
                workload_ips: vec!["10.0.0.5".parse().unwrap(), "fd00::5".parse().unwrap()],
                ..Default::default()
            }],
            services: vec![Service {
                name: "web".into(),
                namespace: "shop".into(),
                hostname: "web.shop.svc.cluster.local".into(),
                vips: vec!["net1/10.96.0.10".parse().unwrap()],
                ..Default::default()
            }],
            ..Default::default()
        };
        let store = ResourceStore::default();
        built.publish(&store);
        let by = |alias| {
            store
                .resolve(ADDRESS_TYPE_URL, alias)
                .map(|e| e.name.to_string())
        };
        assert_eq!(
            by("/10.0.0.5").as_deref(),
            Some("Kubernetes//Pod/shop/web-0")
        );
        assert_eq!(
            by("/fd00::5").as_deref(),
            Some("Kubernetes//Pod/shop/web-0")
        );
        assert_eq!(
            by("net1/10.96.0.10").as_deref(),
            Some("shop/web.shop.svc.cluster.local")
        );
        assert_eq!(by("/10.96.0.10"), None, "the network is part of the key");
    }

    /// Routes go out under their own type, named `kind/namespace/name`, as they were
    /// built; one removed from the build is removed from the store.
    #[test]
    fn waypoint_routes_are_published_by_key() {
        let route = WaypointRoute {
            kind: "HTTPRoute".into(),
            name: "web".into(),
            namespace: "shop".into(),
            spec_json: r#"{"rules":[]}"#.into(),
            generation: 2,
            created: "2024-05-06T07:08:09Z".into(),
        };
        let mut built = Built {
            waypoint_routes: vec![route.clone()],
            ..Default::default()
        };
        let store = ResourceStore::default();
        built.publish(&store);
        let entry = store
            .get(WAYPOINT_ROUTE_TYPE_URL, "HTTPRoute/shop/web")
            .expect("published");
        assert_eq!(entry.body.type_url, WAYPOINT_ROUTE_TYPE_URL);
        assert_eq!(
            WaypointRoute::decode(entry.body.value.as_slice()).unwrap(),
            route
        );
        assert_eq!(store.len(WAYPOINT_POLICY_TYPE_URL), 0);

        built.waypoint_routes.clear();
        built.publish(&store);
        assert_eq!(store.len(WAYPOINT_ROUTE_TYPE_URL), 0);
    }
}
