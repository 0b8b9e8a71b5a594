//! Prometheus metrics with istiod's CA metric names (`citadel_server_*`).
//! prometheus-client writes OpenMetrics, so counters end in `_total`.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::xds::XdsMetrics;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

pub struct Metrics {
    registry: Registry,
    pub csr_count: Counter,
    pub success_cert_issuance: Counter,
    pub authentication_failures: Family<ReasonLabels, Counter>,
    pub csr_parsing_errors: Family<ReasonLabels, Counter>,
    pub csr_sign_errors: Counter,
    pub root_cert_expiry: Gauge,
    pub xds: Arc<XdsMetrics>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut metrics = Metrics {
            registry: Registry::default(),
            csr_count: Counter::default(),
            success_cert_issuance: Counter::default(),
            authentication_failures: Family::default(),
            csr_parsing_errors: Family::default(),
            csr_sign_errors: Counter::default(),
            root_cert_expiry: Gauge::default(),
            xds: Arc::default(),
        };
        let r = &mut metrics.registry;
        r.register(
            "citadel_server_csr_count",
            "The number of CSRs received by the CA server",
            metrics.csr_count.clone(),
        );
        r.register(
            "citadel_server_success_cert_issuance_count",
            "The number of certificates issued",
            metrics.success_cert_issuance.clone(),
        );
        r.register(
            "citadel_server_authentication_failure_count",
            "Certificate requests refused as unauthenticated, by reason (token or impersonation)",
            metrics.authentication_failures.clone(),
        );
        r.register(
            "citadel_server_csr_parsing_err_count",
            "Certificate requests refused for a bad CSR or TTL",
            metrics.csr_parsing_errors.clone(),
        );
        r.register(
            "citadel_server_csr_sign_err_count",
            "Certificates the CA failed to sign",
            metrics.csr_sign_errors.clone(),
        );
        r.register(
            "citadel_server_root_cert_expiry_timestamp",
            "Unix time at which the mesh root expires",
            metrics.root_cert_expiry.clone(),
        );
        metrics.xds.register(r);
        metrics
    }
}

impl Metrics {
    pub fn authentication_failure(&self, reason: &'static str) {
        self.authentication_failures
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    pub fn csr_parsing_error(&self, reason: &'static str) {
        self.csr_parsing_errors
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
