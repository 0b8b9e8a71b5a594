//! What istiod-lite reads from the Kubernetes API.

pub mod gateway_class;
pub mod leader;
pub mod pods;
pub mod root_publisher;
pub mod waypoints;
