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
