//! Istio's control-plane messages and gRPC services, with Istio's package, field
//! numbers and method paths, so Istio's own ztunnel and istiod can be either end. The
//! messages need only prost (feature `istio`); the services need tonic (`grpc`).

pub mod ca;
#[cfg(feature = "grpc")]
pub mod ca_service;
pub mod security;
pub mod workload;
#[cfg(feature = "xds")]
pub mod xds;

/// gRPC metadata keys Istio's clients send with every control-plane call.
pub mod metadata {
    /// `Bearer <service-account token>`.
    pub const AUTHORIZATION: &str = "authorization";
    /// The cluster the caller's token belongs to.
    pub const CLUSTER_ID: &str = "clusterid";
}
