//! The cluster's DNS, as CoreDNS's `kubernetes` plugin answers it for Services:
//! `<service>.<namespace>.svc.<domain>` has the Service's ClusterIPs (A for IPv4,
//! AAAA for IPv6), and a headless Service its ready endpoints' addresses. Every other
//! name is NXDOMAIN: the cluster has no upstream, so no query leaves it.
//!
//! It runs as `e2e-app cluster-dns` in the control-plane namespace, behind Service
//! `kube-system/kube-dns` at kubelet's `clusterDNS` address ([`CLUSTER_DNS`]), so a
//! pod reaches it through the node's service proxy as it would reach CoreDNS.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use anyhow::Result;
use hickory_proto::op::Query;
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{RData, Record, RecordType};
use serde_json::{json, Value};

use crate::api::Api;
use crate::dns::{respond_from, serve_with};
use crate::services::kube_proxy;

/// kubelet's `clusterDNS` in every pod's resolv.conf: kube-dns's usual ClusterIP
/// (the API server never allocates it on its own; Service `kube-dns` asks for it).
/// Served on a cluster installed from the charts; on the others nothing answers it
/// (an enrolled pod's queries go to ztunnel's DNS proxy either way).
pub const CLUSTER_DNS: &str = "10.96.0.10";
/// The cluster domain (kubelet's `clusterDomain`).
pub const CLUSTER_DOMAIN: &str = "cluster.local";
/// CoreDNS's default TTL for Service records.
const TTL: u32 = 5;

/// Serves the cluster's names on UDP and TCP `listen`, reading Services from the API
/// server at `api` (from this process's namespace) for each query.
pub fn serve(listen: SocketAddr, api: SocketAddr, log_queries: bool) -> Result<()> {
    let api = Api::new(PathBuf::from("/proc/self/ns/net"), api);
    serve_with(listen, log_queries, move |request, transport| {
        respond_from(request, transport, |query| records(&api, query))
    })
}

/// The records for `query`; `None` is NXDOMAIN.
fn records(api: &Api, query: &Query) -> Option<Vec<Record>> {
    let name = query.name().to_lowercase();
    let (service, namespace) = service_of(&name.to_ascii())?;
    let svc = api
        .get_opt(&format!(
            "/api/v1/namespaces/{namespace}/services/{service}"
        ))
        .ok()??;
    let ips: Vec<IpAddr> = match svc["spec"]["clusterIP"].as_str() {
        Some("None") => headless_addresses(api, &svc),
        _ => svc["spec"]["clusterIPs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|ip| ip.as_str()?.parse().ok())
            .collect(),
    };
    let record = |data: RData| Record::from_rdata(name.clone(), TTL, data);
    Some(
        ips.into_iter()
            .filter_map(|ip| match (ip, query.query_type()) {
                (IpAddr::V4(v4), RecordType::A) => Some(record(RData::A(A(v4)))),
                (IpAddr::V6(v6), RecordType::AAAA) => Some(record(RData::AAAA(AAAA(v6)))),
                _ => None,
            })
            .collect(),
    )
}

/// `(service, namespace)` of `<service>.<namespace>.svc.<domain>.`.
fn service_of(name: &str) -> Option<(String, String)> {
    let rest = name.strip_suffix(&format!(".svc.{CLUSTER_DOMAIN}."))?;
    let (service, namespace) = rest.split_once('.')?;
    (!service.is_empty() && !namespace.is_empty() && !namespace.contains('.'))
        .then(|| (service.to_owned(), namespace.to_owned()))
}

/// A headless Service's answer: the addresses of its ready endpoints.
fn headless_addresses(api: &Api, svc: &Value) -> Vec<IpAddr> {
    let pods = api.list("/api/v1/pods").unwrap_or_default();
    kube_proxy::ready_endpoints(svc, &pods)
        .into_iter()
        .filter_map(|ip| ip.parse().ok())
        .collect()
}

/// Service `kube-system/kube-dns` at [`CLUSTER_DNS`] and its Endpoints: the server
/// at `server` (selector-less, as the `kubernetes` Service points at the API server).
pub fn objects(server: IpAddr) -> (Value, Value) {
    let ports = json!([
        {"name": "dns", "port": 53, "protocol": "UDP"},
        {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
    ]);
    let service = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "kube-dns", "namespace": "kube-system",
                     "labels": {"k8s-app": "kube-dns"}},
        "spec": {"clusterIP": CLUSTER_DNS, "ports": ports},
    });
    let endpoints = json!({
        "apiVersion": "v1",
        "kind": "Endpoints",
        "metadata": {"name": "kube-dns", "namespace": "kube-system"},
        "subsets": [{"addresses": [{"ip": server.to_string()}], "ports": ports}],
    });
    (service, endpoints)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_names_are_recognized() {
        assert_eq!(
            service_of("istiod.istio-system.svc.cluster.local."),
            Some(("istiod".into(), "istio-system".into()))
        );
        // The search list's misses, and names outside the cluster.
        assert_eq!(
            service_of("istiod.istio-system.svc.istio-system.svc.cluster.local."),
            None
        );
        assert_eq!(service_of("istio-system.svc.cluster.local."), None);
        assert_eq!(service_of("example.com."), None);
    }
}
