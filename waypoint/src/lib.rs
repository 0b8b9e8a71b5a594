//! waypoint: the mesh's L7 proxy, as Istio's waypoints but in Rust.
//!
//! Ztunnels send it the traffic of the Services and workloads bound to it
//! (`istio.io/use-waypoint`), over HBONE. It is built on ztunnel's parts: the same
//! identity and certificates, discovery (Istio's workload xDS or a local file), HBONE
//! server and client pool and metrics; what it adds is here: `proxy` takes each
//! CONNECT to an endpoint, `http` authorizes and forwards each HTTP request,
//! `policy` evaluates Istio's AuthorizationPolicy, `metrics` counts requests, and
//! `app` wires them into ztunnel's dedicated-mode runtime.

pub mod app;
pub mod http;
pub mod metrics;
pub mod policy;
pub mod proxy;
