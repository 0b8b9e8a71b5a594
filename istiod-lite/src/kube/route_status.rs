//! The status of routes bound to Services (GAMMA), as istiod writes it: for every
//! HTTPRoute, GRPCRoute and TCPRoute with a Service parent, `status.parents` with
//! `Accepted` and `ResolvedRefs` ([`super::route_parents`]), recomputed when the route
//! or a Service it names changes. Only the leader among istiod's replicas does this.
//!
//! A status is written (a merge patch of `/status`, field manager `istiod-lite`,
//! conditioned on the resourceVersion read) only when it differs from the stored one:
//! unchanged conditions keep their `lastTransitionTime`, so a write read back computes
//! the same status and the loop settles.

use std::collections::{HashMap, HashSet};

use futures::{stream, StreamExt};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use mesh_kube::watch::{events, updates, IfAbsent, Update};
use mesh_model::route::Route;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::route_parents::{parents_status, ServiceKey};
use super::FIELD_MANAGER;
use crate::model::routes::{service_parent_refs, RouteKind, ROUTE_KINDS};

/// A route, by (kind, namespace, name).
type Key = (&'static str, String, String);

/// Writes route status until `shutdown`. `domain` is the cluster's DNS domain.
pub async fn run(client: Client, domain: String, shutdown: CancellationToken) {
    let routes = stream::select_all(ROUTE_KINDS.iter().map(|kind| {
        let api = Api::<DynamicObject>::all_with(client.clone(), &kind.resource());
        updates(
            kind.plural,
            events(api, Default::default()),
            IfAbsent::Empty,
        )
        .map(move |update| (kind, update))
        .boxed()
    }));
    let services = updates(
        "services",
        events(Api::<Service>::all(client.clone()), Default::default()),
        IfAbsent::Wait,
    );
    let mut routes = std::pin::pin!(routes);
    let mut services = std::pin::pin!(services);
    let mut controller = Controller {
        client,
        domain,
        routes: HashMap::new(),
        services: None,
        listing: HashSet::new(),
    };
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            Some((kind, update)) = routes.next() => controller.route(kind, update).await,
            Some(update) = services.next() => controller.service(update).await,
            else => return,
        }
    }
}

struct Controller {
    client: Client,
    domain: String,
    routes: HashMap<Key, (&'static RouteKind, DynamicObject)>,
    /// Every Service, once listed: before that a parent or backend not found may
    /// only not be listed yet, so nothing is written.
    services: Option<HashSet<ServiceKey>>,
    /// The Services of a (re-)list in progress.
    listing: HashSet<ServiceKey>,
}

fn key_of(kind: &RouteKind, route: &DynamicObject) -> Key {
    (
        kind.kind,
        route.namespace().unwrap_or_default(),
        route.name_any(),
    )
}

fn service_key(service: &Service) -> ServiceKey {
    (service.namespace().unwrap_or_default(), service.name_any())
}

impl Controller {
    async fn route(&mut self, kind: &'static RouteKind, update: Update<DynamicObject>) {
        match update {
            Update::Listed(route) | Update::Applied(route) => {
                let key = key_of(kind, &route);
                self.routes.insert(key.clone(), (kind, route));
                self.reconcile(&key).await;
            }
            Update::Deleted(route) => {
                self.routes.remove(&key_of(kind, &route));
            }
            // Routes deleted while the watch was down are not listed again.
            Update::Relisting => self.routes.retain(|(k, _, _), _| *k != kind.kind),
            Update::Synced => {}
        }
    }

    async fn service(&mut self, update: Update<Service>) {
        let (service, exists) = match update {
            Update::Relisting => {
                self.listing.clear();
                return;
            }
            Update::Listed(service) => {
                self.listing.insert(service_key(&service));
                return;
            }
            Update::Synced => {
                self.services = Some(std::mem::take(&mut self.listing));
                self.reconcile_all().await;
                return;
            }
            Update::Applied(service) => (service, true),
            Update::Deleted(service) => (service, false),
        };
        let Some(services) = &mut self.services else {
            return;
        };
        let key = service_key(&service);
        let changed = if exists {
            services.insert(key.clone())
        } else {
            services.remove(&key)
        };
        if changed {
            let naming: Vec<Key> = self
                .routes
                .iter()
                .filter(|(_, (_, route))| names_service(route, &key))
                .map(|(k, _)| k.clone())
                .collect();
            for route in naming {
                self.reconcile(&route).await;
            }
        }
    }

    async fn reconcile_all(&mut self) {
        let keys: Vec<Key> = self.routes.keys().cloned().collect();
        for key in keys {
            self.reconcile(&key).await;
        }
    }

    /// Writes the route's status if it is not what it should be.
    async fn reconcile(&mut self, key: &Key) {
        let (Some(services), Some((kind, route))) = (&self.services, self.routes.get(key)) else {
            return;
        };
        let (kind, namespace, name) = (*kind, &key.1, &key.2);
        let compiled = if service_parent_refs(route).next().is_some() {
            Route::from_spec(kind.kind, namespace, name, &route.data["spec"].to_string())
                .map(drop)
                .map_err(|e| e.to_string())
        } else {
            Ok(())
        };
        let now = Time(Timestamp::now());
        let parents = parents_status(route, services, compiled, &self.domain, &now);
        let stored = route.data["status"]["parents"].as_array();
        if stored.map_or(parents.is_empty(), |stored| *stored == parents) {
            return;
        }
        let api =
            Api::<DynamicObject>::namespaced_with(self.client.clone(), namespace, &kind.resource());
        // The resourceVersion read: a route changed meanwhile is recomputed from its
        // next event rather than overwritten.
        let patch = json!({
            "metadata": {"resourceVersion": route.resource_version()},
            "status": {"parents": parents},
        });
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        let route_name = format!("{}/{namespace}/{name}", kind.kind);
        match api.patch_status(name, &params, &Patch::Merge(&patch)).await {
            Ok(written) => {
                info!(route = %route_name, "route status written");
                // What we wrote is what the next reconcile compares with.
                self.routes.insert(key.clone(), (kind, written));
            }
            Err(kube::Error::Api(status)) if status.code == 409 || status.code == 404 => {
                debug!(route = %route_name, "route changed or deleted before its status was written");
            }
            Err(e) => warn!(route = %route_name, error = %e, "cannot write the route's status"),
        }
    }
}

/// Whether `route` names the Service `key` as a parent or a backend (or a mirror).
fn names_service(route: &DynamicObject, (namespace, name): &ServiceKey) -> bool {
    let route_namespace = route.namespace().unwrap_or_default();
    let names = |r: &serde_json::Value| {
        r["name"] == name.as_str()
            && r["namespace"].as_str().unwrap_or(&route_namespace) == namespace
    };
    let spec = &route.data["spec"];
    let parents = spec["parentRefs"].as_array().into_iter().flatten();
    let rules = spec["rules"].as_array().into_iter().flatten();
    let backends = rules
        .clone()
        .flat_map(|r| r["backendRefs"].as_array().into_iter().flatten());
    let mirrors = rules
        .flat_map(|r| r["filters"].as_array().into_iter().flatten())
        .map(|f| &f["requestMirror"]["backendRef"]);
    parents.chain(backends).chain(mirrors).any(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_names_its_parents_backends_and_mirrors_by_namespace() {
        let route: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "HTTPRoute",
            "metadata": {"name": "r", "namespace": "shop"},
            "spec": {
                "parentRefs": [{"group": "", "kind": "Service", "name": "web"}],
                "rules": [{
                    "backendRefs": [{"name": "db", "namespace": "data", "port": 5432}],
                    "filters": [{"type": "RequestMirror", "requestMirror": {"backendRef": {"name": "shadow", "port": 80}}}],
                }],
            },
        }))
        .unwrap();
        let names = |ns: &str, name: &str| names_service(&route, &(ns.into(), name.into()));
        assert!(names("shop", "web"));
        assert!(names("data", "db"));
        assert!(names("shop", "shadow"));
        assert!(!names("shop", "db"), "the backend is in another namespace");
        assert!(!names("data", "web"));
    }
}
