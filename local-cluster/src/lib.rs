//! A local multi-node Kubernetes cluster built from network namespaces, for the demo,
//! the end-to-end tests and the benchmarks; and the smaller topologies those use.
//!
//! - [`cluster`]: [`LocalCluster`], the whole cluster: a control plane
//!   ([`control_plane`]: `kube-apiserver-lite`, istiod's Service), nodes ([`node`])
//!   each with a kubelet stand-in ([`kubelet`]), the workload controllers
//!   ([`controllers`]), cluster DNS and a kube-proxy stand-in ([`services`]), and the
//!   mesh installed from the charts ([`charts`]) or run by the harness;
//! - [`api`]: a blocking client for the API server; [`objects`]: the objects the
//!   harness writes; [`images`]: which workspace binary an image runs;
//! - [`mesh`]: the mesh's binaries in test namespaces and what they report;
//!   [`standalone`]: two VMs with dedicated ztunnels; [`zds_agent`]: a test double of
//!   the node agent's ZDS server; [`inpod`]: a pod captured as the agent captures it;
//!   [`dns`]: the DNS tests' upstream and client; [`load`]: the soak's traffic.
//!
//! Binaries: `demo` (`make demo`), `soak` (`make soak`) and `e2e-app`, the test app
//! the pods run.

pub mod api;
pub mod charts;
pub mod cluster;
pub mod control_plane;
pub mod controllers;
pub mod dns;
pub mod images;
pub mod inpod;
pub mod kubelet;
pub mod load;
pub mod mesh;
pub mod node;
pub mod objects;
pub mod services;
pub mod standalone;
pub mod waypoint;
pub mod zds_agent;

pub use cluster::{LocalCluster, MeshInstall, Topology};
