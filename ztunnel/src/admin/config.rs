//! `config` and `version` in Istio's shape: the settings Istio's ztunnel has, under
//! its names and with its types (addresses as `{"SocketAddr": ..}`, durations as
//! `{secs, nanos}`, absent options as null); ours without an Istio twin keep their
//! own names beside them.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{json, Map, Value};

use crate::config::Config;
use crate::discovery::xds::NodeIdentity;
use crate::hbone::{
    CONNECTION_WINDOW, MAX_FRAME_SIZE, POOL_MAX_STREAMS_PER_CONNECTION, STREAM_WINDOW,
};
use crate::proxy::outbound::POOL_IDLE_TIMEOUT;
use crate::proxy::OwnPorts;

fn addr(a: SocketAddr) -> Value {
    json!({ "SocketAddr": a.to_string() })
}

fn duration(d: Duration) -> Value {
    json!({ "secs": d.as_secs(), "nanos": d.subsec_nanos() })
}

fn non_empty(s: &str) -> Value {
    if s.is_empty() {
        Value::Null
    } else {
        json!(s)
    }
}

/// A root given as a path, or inline PEM.
fn root_cert(setting: &str) -> Value {
    if setting.trim_start().starts_with("-----BEGIN") {
        json!({ "Static": setting })
    } else {
        json!({ "File": setting })
    }
}

/// The `config` section.
pub fn config(c: &Config) -> Value {
    let metadata: Map<String, Value> = NodeIdentity::istio_meta_from_env()
        .into_iter()
        .map(|(k, v)| (k, json!(v)))
        .collect();
    let mut illegal: Vec<u16> = OwnPorts::from_config(c).iter().collect();
    illegal.sort();
    json!({
        "adminAddr": addr(c.admin_addr),
        "statsAddr": addr(c.metrics_addr),
        "readinessAddr": addr(c.readiness_addr),
        "dnsProxyAddr": addr(c.dns_proxy_addr),
        "inboundAddr": c.inbound_addr.to_string(),
        "inboundPlaintextAddr": c.inbound_plaintext_addr.to_string(),
        "outboundAddr": c.outbound_addr.to_string(),
        "caAddress": non_empty(&c.ca_address),
        "xdsAddress": non_empty(&c.xds_address),
        "caRootCert": root_cert(&c.ca_root_ca),
        "xdsRootCert": root_cert(&c.xds_root_ca),
        "altCaHostname": c.alt_ca_hostname,
        "altXdsHostname": c.alt_xds_hostname,
        "clusterDomain": c.cluster_domain,
        "clusterId": c.cluster_id,
        "localNode": non_empty(&c.node_name),
        "network": c.network,
        "proxyMode": c.proxy_mode,
        "inpodUds": c.inpod_uds,
        "packetMark": c.packet_mark,
        "numWorkerThreads": c.worker_threads,
        "dnsProxy": c.dns_capture,
        "ipv6Enabled": c.ipv6_enabled,
        "xdsOnDemand": c.xds_on_demand,
        "secretTtl": duration(c.workload_cert_ttl),
        "selfTerminationDeadline": duration(c.drain_deadline),
        "poolUnusedReleaseTimeout": duration(POOL_IDLE_TIMEOUT),
        "poolMaxStreamsPerConn": POOL_MAX_STREAMS_PER_CONNECTION,
        "windowSize": STREAM_WINDOW,
        "connectionWindowSize": CONNECTION_WINDOW,
        "frameSize": MAX_FRAME_SIZE,
        "illegalPorts": illegal,
        "proxyMetadata": metadata,
        "proxyWorkloadInformation": c.proxy_workload_info.as_ref().map(|w| json!({
            "namespace": w.namespace,
            "workloadName": w.name,
            "serviceAccount": w.service_account,
        })),
        // Ours, without an Istio twin.
        "trustDomain": c.trust_domain,
        "rootNamespace": c.root_namespace,
        "discoverySource": c.discovery(),
        "localXdsPath": c.local_xds_path,
        "caCertsDir": c.ca_certs_dir,
    })
}

/// The `version` section (Istio's build info fields).
pub fn version() -> Value {
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        "gitRevision": option_env!("ZTUNNEL_GIT_REVISION").unwrap_or("unknown"),
        "rustVersion": env!("ZTUNNEL_RUSTC_VERSION"),
        "buildProfile": if cfg!(debug_assertions) { "debug" } else { "release" },
        "buildStatus": option_env!("ZTUNNEL_BUILD_STATUS").unwrap_or("unknown"),
        "cryptoProvider": "tls-aws-lc",
        "istioVersion": std::env::var("ISTIO_META_ISTIO_VERSION").unwrap_or_else(|_| "unknown".into()),
    })
}
