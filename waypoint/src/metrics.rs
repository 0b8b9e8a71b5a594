//! Istio's request metrics, reported by the waypoint (`reporter="waypoint"`):
//! `istio_requests_total`, `istio_request_duration_milliseconds`,
//! `istio_request_bytes` and `istio_response_bytes`, with Istio's standard labels.
//! TCP traffic through the waypoint is counted in ztunnel's `istio_tcp_*` families.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use ztunnel::metrics::traffic::TrafficLabels;

/// Istio's default buckets for `istio_request_duration_milliseconds`.
const DURATION_BUCKETS: [f64; 19] = [
    0.5, 1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0, 30000.0,
    60000.0, 300000.0, 600000.0, 1800000.0, 3600000.0,
];
/// Istio's buckets for the request and response sizes (bytes).
const SIZE_BUCKETS: [f64; 8] = [
    1.0, 10.0, 100.0, 1000.0, 10000.0, 100000.0, 1000000.0, 10000000.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub response_code: u16,
    /// gRPC's status, where the response carries one; `-` otherwise.
    pub grpc_response_status: String,
    /// The route rule the request took, `namespace.name.rule` (the rule's name, or its
    /// index), as Istio names the Envoy route of a Gateway API rule; `default` when no
    /// route is bound.
    pub route_name: String,
    /// Last: the derive can only flatten the last field.
    #[prometheus(flatten)]
    pub traffic: TrafficLabels,
}

type Histograms = Family<RequestLabels, Histogram, fn() -> Histogram>;

/// A backend Service (its `namespace/hostname`), for the retry counts.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BackendLabels {
    pub destination_service: String,
}

impl From<String> for BackendLabels {
    fn from(destination_service: String) -> Self {
        BackendLabels {
            destination_service,
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RetryLabels {
    pub destination_service: String,
    /// `retriable-status-code`, `connect-failure`, `reset` or `per-try-timeout`.
    pub reason: &'static str,
}

#[derive(Clone)]
pub struct RequestMetrics {
    pub requests: Family<RequestLabels, Counter>,
    pub duration: Histograms,
    pub request_bytes: Histograms,
    pub response_bytes: Histograms,
    /// Retries sent, by backend and reason.
    pub retries: Family<RetryLabels, Counter>,
    /// Retries the retry budget refused.
    pub retry_budget_exhausted: Family<BackendLabels, Counter>,
}

fn durations() -> Histogram {
    Histogram::new(DURATION_BUCKETS)
}

fn sizes() -> Histogram {
    Histogram::new(SIZE_BUCKETS)
}

impl Default for RequestMetrics {
    fn default() -> Self {
        RequestMetrics {
            requests: Family::default(),
            duration: Family::new_with_constructor(durations),
            request_bytes: Family::new_with_constructor(sizes),
            response_bytes: Family::new_with_constructor(sizes),
            retries: Family::default(),
            retry_budget_exhausted: Family::default(),
        }
    }
}

impl RequestMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "istio_requests",
            "Total number of requests",
            self.requests.clone(),
        );
        registry.register(
            "istio_request_duration_milliseconds",
            "Duration of requests",
            self.duration.clone(),
        );
        registry.register(
            "istio_request_bytes",
            "Size of requests (headers and body)",
            self.request_bytes.clone(),
        );
        registry.register(
            "istio_response_bytes",
            "Size of responses (headers and body)",
            self.response_bytes.clone(),
        );
        registry.register(
            "waypoint_upstream_retries",
            "Requests sent again to a backend, by reason",
            self.retries.clone(),
        );
        registry.register(
            "waypoint_retry_budget_exhausted",
            "Retries not sent because the backend's retry budget was spent",
            self.retry_budget_exhausted.clone(),
        );
    }

    /// One retry to `backend` for `reason`.
    pub fn retried(&self, backend: &str, reason: &'static str) {
        self.retries
            .get_or_create(&RetryLabels {
                destination_service: backend.to_owned(),
                reason,
            })
            .inc();
    }

    /// One finished request.
    pub fn record(&self, labels: &RequestLabels, took: Duration, request: u64, response: u64) {
        self.requests.get_or_create(labels).inc();
        self.duration
            .get_or_create(labels)
            .observe(took.as_secs_f64() * 1000.0);
        self.request_bytes
            .get_or_create(labels)
            .observe(request as f64);
        self.response_bytes
            .get_or_create(labels)
            .observe(response as f64);
    }
}
