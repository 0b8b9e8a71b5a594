//! The istio-cni node agent. This part installs the chained `istio-cni` plugin (binary
//! and CNI config, kept in place against other writers) and serves the plugin's two Unix
//! sockets, the health probes and the enablement state the plugin falls back on.
//!
//! One module per concern; [`app`] wires them, `main.rs` only parses flags.

pub mod app;
pub mod cmdadd;
pub mod eligibility;
pub mod enablement;
pub mod engine;
pub mod enroll;
pub mod fsutil;
pub mod health;
pub mod http_server;
pub mod install;
pub mod kube;
pub mod metrics;
pub mod peer;
pub mod podlock;
pub mod queue;
pub mod readiness;
pub mod redirect;
pub mod uds;
pub mod zds;
