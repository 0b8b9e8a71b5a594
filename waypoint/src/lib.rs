//! waypoint: the mesh's L7 proxy, as Istio's waypoints but in Rust.
//!
//! Ztunnels send it the traffic of the Services and workloads bound to it
//! (`istio.io/use-waypoint`), over HBONE. It is built on ztunnel's parts: the same
//! identity and certificates, discovery (Istio's workload xDS or a local file), HBONE
//! server and client pool and metrics; what it adds is here: `proxy` takes each
//! CONNECT to an endpoint, `http` authorizes, routes and forwards each HTTP request,
//! `routing` applies a route rule's filters, backends and retries, `policy` evaluates
//! Istio's AuthorizationPolicy, `config` keeps the policies and routes in force,
//! `objects` reads them from a file, `metrics` counts requests, and `app` wires them
//! into ztunnel's dedicated-mode runtime.

pub mod app;
pub mod config;
pub mod http;
pub mod metrics;
pub mod objects;
pub mod policy;
pub mod proxy;
pub mod routing;
