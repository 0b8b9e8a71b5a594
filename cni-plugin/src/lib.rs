//! The `istio-cni` plugin's modules, as a library so the fuzz targets (the workspace's `fuzz/`) reach
//! the parsers of what the runtime and the agent hand us; `main.rs` is the binary.

pub mod args;
pub mod env;
pub mod error;
pub mod gate;
pub mod http;
pub mod log;
pub mod netconf;
pub mod plugin;
pub mod result;
pub mod version;
