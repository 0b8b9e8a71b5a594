//! The istio-cni node agent (a DaemonSet): installs the chained `istio-cni` plugin,
//! enrolls the node's ambient pods (programs redirection in each pod's network
//! namespace, hands the namespace to ztunnel over ZDS), and serves the plugin.
//!
//! - [`install`]: the plugin binary and our entry in the node's CNI chain, kept there;
//! - [`plugin_api`]: the plugin's two Unix sockets (the CNI ADD event, its log lines),
//!   who may use them, and the enablement state the plugin falls back on;
//! - [`enrollment`]: the engine: which pods are ambient, the Kubernetes watches, the
//!   work queue, enrolling and un-enrolling one pod, a CNI ADD held until enrolled;
//! - [`zds`]: the ZDS server ztunnel connects to;
//! - [`ops`]: health probes and Prometheus metrics.
//!
//! The rules themselves are the `redirection` crate's. [`app`] wires the parts;
//! `main.rs` only parses flags.

pub mod app;
pub mod enrollment;
pub mod install;
pub mod ops;
pub mod plugin_api;
pub mod zds;
