//! The waypoint's own xDS resource, beside Istio's `Address` and `Authorization`:
//! an Istio AuthorizationPolicy attached by `targetRefs` (to a waypoint's Gateway, its
//! GatewayClass, or a Service), carried as Kubernetes stores its spec. The waypoint
//! evaluates Istio's spec itself, so nothing is lost translating it into another
//! policy language (Envoy's RBAC, or Istio's L4-only `Authorization`). The resource
//! name is `namespace/name`.

use prost::Message;

/// Type URL of [`WaypointPolicy`].
pub const WAYPOINT_POLICY_TYPE_URL: &str =
    "type.googleapis.com/ambient_rs.waypoint.v1.AuthorizationPolicy";

/// One `security.istio.io/v1` AuthorizationPolicy with `targetRefs`.
#[derive(Clone, PartialEq, Message)]
pub struct WaypointPolicy {
    /// The policy's name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// The policy's namespace.
    #[prost(string, tag = "2")]
    pub namespace: String,
    /// Its `spec`, as JSON.
    #[prost(string, tag = "3")]
    pub spec_json: String,
}

/// Type URL of [`WaypointRoute`].
pub const WAYPOINT_ROUTE_TYPE_URL: &str = "type.googleapis.com/ambient_rs.waypoint.v1.Route";

/// One Gateway API route bound to a Service (GAMMA: a `parentRefs` entry of group `""`
/// and kind `Service`): an HTTPRoute, GRPCRoute or TCPRoute, carried as Kubernetes
/// stores its spec, as [`WaypointPolicy`] carries a policy. The waypoint compiles it
/// itself. The resource name is `kind/namespace/name`.
#[derive(Clone, PartialEq, Message)]
pub struct WaypointRoute {
    /// `HTTPRoute`, `GRPCRoute` or `TCPRoute`.
    #[prost(string, tag = "1")]
    pub kind: String,
    /// The route's name.
    #[prost(string, tag = "2")]
    pub name: String,
    /// The route's namespace.
    #[prost(string, tag = "3")]
    pub namespace: String,
    /// Its `spec`, as JSON.
    #[prost(string, tag = "4")]
    pub spec_json: String,
    /// `metadata.generation`, which the route's status reports as `observedGeneration`.
    #[prost(int64, tag = "5")]
    pub generation: i64,
    /// `metadata.creationTimestamp` (RFC 3339): the oldest route wins a tie between
    /// rules of equal precedence, as the Gateway API orders them.
    #[prost(string, tag = "6")]
    pub created: String,
}

impl WaypointRoute {
    /// The resource name: `kind/namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}/{}", self.kind, self.namespace, self.name)
    }
}
