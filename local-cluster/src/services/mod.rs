//! What CoreDNS and kube-proxy give a cluster, minimally: Service names
//! ([`cluster_dns`]) and ClusterIPs ([`kube_proxy`] on every node, [`service_proxy`]
//! for istiod's Service in the control plane).

pub mod cluster_dns;
pub mod kube_proxy;
pub mod service_proxy;
