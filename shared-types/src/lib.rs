//! What every binary of the mesh agrees on: Istio's names, ports and marks, and the
//! wire structs that cross a process boundary.

pub mod cni;
pub mod constants;
pub mod duration;
pub mod identity;
#[cfg(feature = "istio")]
pub mod istio;
pub mod net;
#[cfg(feature = "istio")]
pub mod waypoint;
pub mod zds;
#[cfg(feature = "zds-transport")]
pub mod zds_transport;
