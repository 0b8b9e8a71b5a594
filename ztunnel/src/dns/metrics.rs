//! Istio's DNS proxy metrics, with its names, labels and buckets.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Istio's upstream latency buckets, in seconds.
const UPSTREAM_BUCKETS: [f64; 6] = [0.0005, 0.001, 0.01, 0.1, 1.0, 5.0];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DnsLabels {
    pub request_query_type: String,
    pub request_protocol: &'static str,
    pub source_canonical_service: String,
    pub source_canonical_revision: String,
}

type HistogramFamily = Family<DnsLabels, Histogram, fn() -> Histogram>;

pub struct DnsMetrics {
    pub requests: Family<DnsLabels, Counter>,
    pub upstream_requests: Family<DnsLabels, Counter>,
    pub upstream_failures: Family<DnsLabels, Counter>,
    pub upstream_duration: HistogramFamily,
}

impl Default for DnsMetrics {
    fn default() -> Self {
        DnsMetrics {
            requests: Family::default(),
            upstream_requests: Family::default(),
            upstream_failures: Family::default(),
            upstream_duration: Family::new_with_constructor(|| Histogram::new(UPSTREAM_BUCKETS)),
        }
    }
}

impl DnsMetrics {
    /// prometheus-client appends `_total` to counters on exposition.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "istio_dns_requests",
            "Total number of DNS requests",
            self.requests.clone(),
        );
        registry.register(
            "istio_dns_upstream_requests",
            "Total number of DNS requests forwarded to upstream",
            self.upstream_requests.clone(),
        );
        registry.register(
            "istio_dns_upstream_failures",
            "Total number of DNS failures from upstream",
            self.upstream_failures.clone(),
        );
        registry.register(
            "istio_dns_upstream_request_duration_seconds",
            "Total time in seconds Istio takes to get DNS response from upstream",
            self.upstream_duration.clone(),
        );
    }
}
