//! Gateway API routes bound to Services (GAMMA), for the waypoints: the kinds watched,
//! which routes bind to a Service, and each such route as the waypoint's
//! [`WaypointRoute`]. The waypoint compiles the spec itself, as it evaluates
//! AuthorizationPolicies whole.

use kube::core::{ApiResource, DynamicObject};
use kube::ResourceExt;
use serde_json::Value;
use shared_types::waypoint::WaypointRoute;

/// One route kind, as the API server serves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteKind {
    /// `HTTPRoute`, `GRPCRoute` or `TCPRoute`: also [`WaypointRoute::kind`].
    pub kind: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
}

/// Istio's GAMMA route kinds, at the version each CRD stores (TCPRoute is only in the
/// Gateway API's experimental channel, so it may well not be served).
pub const ROUTE_KINDS: [RouteKind; 3] = [
    RouteKind {
        kind: "HTTPRoute",
        version: "v1",
        plural: "httproutes",
    },
    RouteKind {
        kind: "GRPCRoute",
        version: "v1",
        plural: "grpcroutes",
    },
    RouteKind {
        kind: "TCPRoute",
        version: "v1alpha2",
        plural: "tcproutes",
    },
];

const GROUP: &str = "gateway.networking.k8s.io";

impl RouteKind {
    /// The kind, read as a dynamic object.
    pub fn resource(&self) -> ApiResource {
        ApiResource {
            group: GROUP.into(),
            version: self.version.into(),
            api_version: format!("{GROUP}/{}", self.version),
            kind: self.kind.into(),
            plural: self.plural.into(),
        }
    }
}

/// Whether a `parentRefs` entry names a Service (GAMMA). The group must be written
/// out as `""`: left out, it defaults to the Gateway API's own (a Gateway).
pub fn is_service_parent(parent_ref: &Value) -> bool {
    parent_ref["group"] == "" && parent_ref["kind"] == "Service"
}

/// The route's `parentRefs` entries that name a Service, as written.
pub fn service_parent_refs(route: &DynamicObject) -> impl Iterator<Item = &Value> {
    route.data["spec"]["parentRefs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| is_service_parent(p))
}

/// `route` (of `kind`) for the waypoints, when a parent of it is a Service.
pub fn waypoint_route(kind: &RouteKind, route: &DynamicObject) -> Option<WaypointRoute> {
    service_parent_refs(route).next()?;
    Some(WaypointRoute {
        kind: kind.kind.into(),
        name: route.metadata.name.clone()?,
        namespace: route.metadata.namespace.clone()?,
        spec_json: route.data["spec"].to_string(),
        generation: route.metadata.generation.unwrap_or_default(),
        created: route
            .creation_timestamp()
            .map(|t| t.0.to_string())
            .unwrap_or_default(),
    })
}

/// Every route bound to a Service, of every kind, sorted by key.
pub fn waypoint_routes<'a>(
    routes: impl IntoIterator<Item = (&'a RouteKind, &'a DynamicObject)>,
) -> Vec<WaypointRoute> {
    let mut out: Vec<WaypointRoute> = routes
        .into_iter()
        .filter_map(|(kind, route)| waypoint_route(kind, route))
        .collect();
    out.sort_by_key(WaypointRoute::key);
    out
}

#[cfg(test)]
#[path = "routes_tests.rs"]
mod tests;
