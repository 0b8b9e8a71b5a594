//! Prometheus metrics with Istio's names and labels, so existing Istio dashboards
//! and alerts work unchanged.

use std::sync::Arc;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::discovery::xds::XdsMetrics;
use crate::dns::DnsMetrics;
use crate::identity::manager::CertMetrics;
use crate::identity::Identity;
use crate::state::workload::Workload;

/// Which side of the connection reports it, as in Istio's `reporter` label.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Reporter {
    source,
    destination,
}

/// Istio's `connection_security_policy` label.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum SecurityPolicy {
    mutual_tls,
    unknown,
}

/// Istio's standard TCP labels (the subset ztunnel can fill at L4).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConnectionLabels {
    pub reporter: Reporter,
    pub source_workload: String,
    pub source_workload_namespace: String,
    pub source_principal: String,
    pub destination_service: String,
    pub destination_workload: String,
    pub destination_workload_namespace: String,
    pub destination_principal: String,
    pub request_protocol: String,
    pub response_flags: String,
    pub connection_security_policy: SecurityPolicy,
}

const UNKNOWN: &str = "unknown";

impl ConnectionLabels {
    /// Labels for a connection as seen by `reporter`; unknown parts read "unknown",
    /// as Istio prints them.
    pub fn new(reporter: Reporter) -> Self {
        ConnectionLabels {
            reporter,
            source_workload: UNKNOWN.into(),
            source_workload_namespace: UNKNOWN.into(),
            source_principal: UNKNOWN.into(),
            destination_service: UNKNOWN.into(),
            destination_workload: UNKNOWN.into(),
            destination_workload_namespace: UNKNOWN.into(),
            destination_principal: UNKNOWN.into(),
            request_protocol: "tcp".into(),
            response_flags: "-".into(),
            connection_security_policy: SecurityPolicy::unknown,
        }
    }

    pub fn with_source(mut self, workload: Option<&Workload>, identity: Option<&Identity>) -> Self {
        if let Some(w) = workload {
            self.source_workload = w.name.clone();
            self.source_workload_namespace = w.namespace.clone();
        }
        if let Some(id) = identity {
            self.source_principal = id.to_uri();
            if workload.is_none() {
                self.source_workload_namespace = id.namespace.clone();
            }
        }
        self
    }

    pub fn with_destination(
        mut self,
        workload: Option<&Workload>,
        identity: Option<&Identity>,
    ) -> Self {
        if let Some(w) = workload {
            self.destination_workload = w.name.clone();
            self.destination_workload_namespace = w.namespace.clone();
        }
        if let Some(id) = identity {
            self.destination_principal = id.to_uri();
        }
        self
    }

    pub fn with_service(mut self, hostname: &str) -> Self {
        self.destination_service = hostname.to_owned();
        self
    }

    pub fn mutual_tls(mut self) -> Self {
        self.connection_security_policy = SecurityPolicy::mutual_tls;
        self
    }
}

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
    pub connections_opened: Family<ConnectionLabels, Counter>,
    pub connections_closed: Family<ConnectionLabels, Counter>,
    pub connections_failed: Family<ConnectionLabels, Counter>,
    pub sent_bytes: Family<ConnectionLabels, Counter>,
    pub received_bytes: Family<ConnectionLabels, Counter>,
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
                component: "ztunnel",
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

/// Counts one proxied connection: opened now, bytes as they flow, closed on drop.
pub struct ConnectionRecorder {
    labels: ConnectionLabels,
    closed: Family<ConnectionLabels, Counter>,
    /// Client to server bytes (Istio's "received during request").
    pub received: Counter,
    /// Server to client bytes (Istio's "sent during response").
    pub sent: Counter,
}

impl ConnectionRecorder {
    pub fn open(metrics: &Metrics, labels: ConnectionLabels) -> Self {
        metrics.connections_opened.get_or_create(&labels).inc();
        ConnectionRecorder {
            received: metrics.received_bytes.get_or_create(&labels).clone(),
            sent: metrics.sent_bytes.get_or_create(&labels).clone(),
            closed: metrics.connections_closed.clone(),
            labels,
        }
    }

    pub fn labels(&self) -> &ConnectionLabels {
        &self.labels
    }
}

impl Drop for ConnectionRecorder {
    fn drop(&mut self) {
        self.closed.get_or_create(&self.labels).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_uses_istio_names() {
        let metrics = Metrics::new();
        let labels = ConnectionLabels::new(Reporter::destination)
            .with_source(None, Some(&Identity::new("cluster.local", "a", "client")))
            .mutual_tls();
        let rec = ConnectionRecorder::open(&metrics, labels);
        rec.received.inc_by(42);
        drop(rec);
        let text = metrics.encode();
        assert!(text.contains("istio_tcp_connections_opened_total{reporter=\"destination\""));
        assert!(text.contains("source_principal=\"spiffe://cluster.local/ns/a/sa/client\""));
        assert!(text.contains("connection_security_policy=\"mutual_tls\"} 42"));
        assert!(text.contains("istio_tcp_connections_closed_total{"));
        assert!(text.contains("istio_build{component=\"ztunnel\""));
    }
}
