//! The agent's operational endpoints: Kubernetes probes ([`health`], port 8000) and
//! Prometheus metrics ([`metrics`], port 15014), both on the shared hardened server.

pub mod health;
pub mod metrics;
