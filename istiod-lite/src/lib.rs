//! istiod-lite: the control plane ztunnels talk to, as Istio's talk to istiod.
//!
//! Today it is the mesh CA: Istio's `IstioCertificateService` on 15012 (gRPC over
//! TLS), callers authenticated with Kubernetes service-account tokens, node
//! proxies allowed to impersonate only the pods on their own node. The CA key
//! lives here and nowhere else.

pub mod app;
pub mod ca;
pub mod config;
pub mod kube;
pub mod metrics;
pub mod model;
pub mod ops;
pub mod server;
pub mod xds;
