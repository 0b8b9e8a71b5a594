//! What istiod-lite reads from the Kubernetes API.

pub mod gateway_class;
pub mod leader;
pub mod pods;
pub mod root_publisher;
pub mod route_parents;
pub mod route_status;
pub mod waypoints;

/// The field manager of istiod-lite's writes (server-side apply, status patches).
pub const FIELD_MANAGER: &str = "istiod-lite";
