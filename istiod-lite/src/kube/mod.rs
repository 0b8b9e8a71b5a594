//! What istiod-lite reads from the Kubernetes API.

pub mod pods;
pub mod leader;
pub mod root_publisher;
