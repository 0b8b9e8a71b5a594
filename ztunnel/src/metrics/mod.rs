//! Prometheus metrics with Istio's names and labels, so existing Istio dashboards
//! and alerts work unchanged.

use std::sync::Arc;

pub mod traffic;

pub use traffic::{Reporter, ResponseFlags, SecurityPolicy, TrafficLabels};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::discovery::xds::XdsMetrics;
use crate::dns::DnsMetrics;
use crate::identity::manager::CertMetrics;

/// Why ztunnel refused or failed a connection (our own metric, beside Istio's).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    component: &'static str,
    tag: &'static str,
}

/// Every metric ztunnel exports.
pub struct Metrics {
    registry: Registry,
    pub connections_opened: Family<TrafficLabels, Counter>,
    pub connections_closed: Family<TrafficLabels, Counter>,
    pub connections_failed: Family<TrafficLabels, Counter>,
    pub sent_bytes: Family<TrafficLabels, Counter>,
    pub received_bytes: Family<TrafficLabels, Counter>,
    /// Refused input and failed connections by reason (bad TLS, not CONNECT, policy...).
    pub errors: Family<ErrorLabels, Counter>,
    /// Connections closed because a policy change denied them.
    pub policy_revoked: Counter,
    pub hbone_pool_connections: Gauge,
    /// Requests retried on a fresh connection because the pooled one they were given
    /// turned out to be dead.
    pub hbone_pool_retries: Counter,
    pub local_config_reloads: Counter,
    pub local_config_errors: Counter,
    pub certs: CertMetrics,
    pub dns: Arc<DnsMetrics>,
    pub xds: Arc<XdsMetrics>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        Self::for_component("ztunnel", |_| {})
    }

    /// The metrics of a proxy built on ztunnel's parts: `component` in `istio_build`,
    /// and `register` adds its own metrics to the same exposition.
    pub fn for_component(component: &'static str, register: impl FnOnce(&mut Registry)) -> Self {
        let mut registry = Registry::default();
        let metrics = Metrics {
            connections_opened: Family::default(),
            connections_closed: Family::default(),
            connections_failed: Family::default(),
            sent_bytes: Family::default(),
            received_bytes: Family::default(),
            errors: Family::default(),
            policy_revoked: Counter::default(),
            hbone_pool_connections: Gauge::default(),
            hbone_pool_retries: Counter::default(),
            local_config_reloads: Counter::default(),
            local_config_errors: Counter::default(),
            certs: CertMetrics::default(),
            dns: Arc::default(),
            xds: Arc::default(),
            registry: Registry::default(),
        };
        // prometheus-client appends `_total` to counters on exposition.
        registry.register(
            "istio_tcp_connections_opened",
            "The total number of TCP connections opened",
            metrics.connections_opened.clone(),
        );
        registry.register(
            "istio_tcp_connections_closed",
            "The total number of TCP connections closed",
            metrics.connections_closed.clone(),
        );
        registry.register(
            "istio_tcp_connections_failed",
            "The total number of TCP connections that failed or were denied",
            metrics.connections_failed.clone(),
        );
        registry.register(
            "istio_tcp_sent_bytes",
            "The size of total bytes sent during response in case of a TCP connection",
            metrics.sent_bytes.clone(),
        );
        registry.register(
            "istio_tcp_received_bytes",
            "The size of total bytes received during request in case of a TCP connection",
            metrics.received_bytes.clone(),
        );
        let build: Family<BuildLabels, Gauge> = Family::default();
        build
            .get_or_create(&BuildLabels {
                component,
                tag: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        registry.register("istio_build", "Istio component build info", build);
        registry.register(
            "ztunnel_errors",
            "Connections and requests ztunnel refused or failed, by reason",
            metrics.errors.clone(),
        );
        registry.register(
            "ztunnel_certificates_fetched",
            "Workload certificates fetched (first ones and renewals)",
            metrics.certs.fetched.clone(),
        );
        registry.register(
            "ztunnel_certificate_fetch_failures",
            "Workload certificate requests that failed, by reason",
            metrics.certs.failures.clone(),
        );
        registry.register(
            "ztunnel_policy_revoked_connections",
            "Live connections closed because a policy change denied them",
            metrics.policy_revoked.clone(),
        );
        registry.register(
            "ztunnel_hbone_pool_connections",
            "HBONE connections currently held by the outbound pool",
            metrics.hbone_pool_connections.clone(),
        );
        registry.register(
            "ztunnel_hbone_pool_retries",
            "Requests retried on a new HBONE connection because the pooled one was dead",
            metrics.hbone_pool_retries.clone(),
        );
        registry.register(
            "ztunnel_local_config_reloads",
            "Successful reloads of the local config file",
            metrics.local_config_reloads.clone(),
        );
        registry.register(
            "ztunnel_local_config_errors",
            "Local config reloads rejected as invalid (the last good config stays)",
            metrics.local_config_errors.clone(),
        );
        metrics.dns.register(&mut registry);
        metrics.xds.register(&mut registry);
        register(&mut registry);
        Metrics {
            registry,
            ..metrics
        }
    }

    pub fn error(&self, reason: &'static str) {
        self.errors.get_or_create(&ErrorLabels { reason }).inc();
    }

    /// Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod parity_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_uses_istio_names() {
        let metrics = Metrics::new();
        let labels = TrafficLabels::new(Reporter::destination)
            .with_source_identity(Some(&crate::identity::Identity::new(
                "cluster.local",
                "a",
                "client",
            )))
            .mutual_tls();
        metrics.connections_opened.get_or_create(&labels).inc();
        metrics.received_bytes.get_or_create(&labels).inc_by(42);
        metrics.connections_closed.get_or_create(&labels).inc();
        let text = metrics.encode();
        assert!(text.contains("istio_tcp_connections_opened_total{reporter=\"destination\""));
        assert!(text.contains("source_principal=\"spiffe://cluster.local/ns/a/sa/client\""));
        assert!(
            text.contains("connection_security_policy=\"mutual_tls\",source_region=\"unknown\""),
            "{text}"
        );
        assert!(text.contains("istio_tcp_connections_closed_total{"));
        assert!(text.contains("istio_build{component=\"ztunnel\""));
    }
}
