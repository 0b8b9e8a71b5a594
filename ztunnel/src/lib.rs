//! ztunnel: the node proxy of the ambient mesh.
//!
//! Modules follow the proxy's concerns: `identity` and `tls` give every workload a
//! SPIFFE certificate and the TLS configs built from it; `state` is the one source of
//! truth the proxies read (workloads, services, policies), fed by `discovery`; `hbone`
//! carries user connections over HTTP/2 CONNECT; `proxy` owns the listeners; `app`
//! wires everything together.

pub mod admin;
pub mod app;
pub mod config;
pub mod control_plane;
pub mod discovery;
pub mod dns;
pub mod drain;
pub mod fdtable;
pub mod hbone;
pub mod identity;
pub mod inpod;
pub mod metrics;
pub mod proxy;
pub mod socket;
pub mod state;
pub mod tls;
pub mod workers;
