//! Discovery: where workloads, services and policies come from.
//!
//! Every source builds a complete [`crate::state::ProxyState`] and hands it to the
//! [`crate::state::StateStore`] under its own name, so sources never see each other's
//! data. `local` reads Istio's `LOCAL_XDS_PATH` file; `kubernetes` watches the API server.

pub mod kubernetes;
pub mod local;
mod local_fields;
pub mod waypoints;

pub use local::{parse_local_config, watch_local_file, DiscoveryError};
