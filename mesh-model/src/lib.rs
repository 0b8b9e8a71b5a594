//! The mesh's source-neutral model: the workloads, services and L4 policies ztunnel
//! enforces, in Istio's local-config shape (so a `LOCAL_XDS_PATH` file written for
//! Istio's ztunnel loads unchanged), and their xDS form ([`xds`]: Istio's
//! `istio.workload.Address` and `istio.security.Authorization`, both ways).
//!
//! istiod-lite builds these from Kubernetes objects and sends them as xDS; ztunnel
//! reads them from xDS or from its local file and enforces them.

/// Istio's AuthorizationPolicy spec, as Kubernetes stores it.
#[allow(missing_docs)] // The fields are the CRD's own, documented by Istio.
pub mod authorization_policy;
pub mod policy;
/// Gateway API routes bound to Services, as the waypoint applies them.
#[allow(missing_docs)] // Its items mirror the Gateway API's fields, documented there.
pub mod route;
/// Serde helpers for the local-config format (also used by its readers).
pub mod serde_util;
pub mod service;
pub mod workload;
pub mod xds;

pub use policy::{
    Action, Authorization, ConnectionAttrs, Denied, RbacMatch, Scope, ServiceAccountMatch,
    StringMatch,
};
pub use service::{AppProtocol, NamespacedHostname, NetworkAddress, Service};
pub use workload::{HealthStatus, Protocol, Workload};
