//! Prometheus metrics on :15014 (`/metrics`), Istio's `istio_cni_*` names.

use mesh_runtime::http_server::{self, Request};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

/// Which of the agent's Unix sockets: `pluginevent`, `log` or `zds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SocketLabel {
    pub socket: String,
}

/// Every metric the agent exports. Cheap to clone.
#[derive(Clone)]
pub struct Metrics {
    pub pods_enrolled: Gauge,
    pub enrollments: Family<ResultLabel, Counter>,
    pub failures: Family<ReasonLabel, Counter>,
    pub zds_connections: Gauge,
    pub queue_depth: Gauge,
    pub duration: Histogram,
    /// Connections refused on a Unix socket because of the peer's credentials.
    pub uds_peer_refused: Family<SocketLabel, Counter>,
    registry: Arc<Registry>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let m = (
            Gauge::default(),
            Family::<ResultLabel, Counter>::default(),
            Family::<ReasonLabel, Counter>::default(),
            Gauge::default(),
            Gauge::default(),
            Histogram::new(exponential_buckets(0.005, 2.0, 14)),
            Family::<SocketLabel, Counter>::default(),
        );
        let r = &mut registry;
        r.register(
            "istio_cni_pods_enrolled",
            "Pods currently enrolled in ambient",
            m.0.clone(),
        );
        r.register(
            "istio_cni_enrollments",
            "Enrollment attempts by result",
            m.1.clone(),
        );
        r.register(
            "istio_cni_enrollment_failures",
            "Enrollment failures by reason",
            m.2.clone(),
        );
        r.register(
            "istio_cni_zds_connections",
            "ztunnel connections on the ZDS socket",
            m.3.clone(),
        );
        r.register(
            "istio_cni_queue_depth",
            "Pods waiting in the work queue",
            m.4.clone(),
        );
        r.register(
            "istio_cni_enrollment_duration_seconds",
            "Time to enroll one pod",
            m.5.clone(),
        );
        r.register(
            "istio_cni_uds_peer_refused",
            "Connections to the agent's Unix sockets refused for the peer's uid",
            m.6.clone(),
        );
        Metrics {
            pods_enrolled: m.0,
            enrollments: m.1,
            failures: m.2,
            zds_connections: m.3,
            queue_depth: m.4,
            duration: m.5,
            uds_peer_refused: m.6,
            registry: Arc::new(registry),
        }
    }

    pub fn record(&self, result: Result<Duration, &str>) {
        match result {
            Ok(took) => {
                self.enrollments
                    .get_or_create(&ResultLabel {
                        result: "success".into(),
                    })
                    .inc();
                self.duration.observe(took.as_secs_f64());
            }
            Err(reason) => {
                self.enrollments
                    .get_or_create(&ResultLabel {
                        result: "failure".into(),
                    })
                    .inc();
                self.failures
                    .get_or_create(&ReasonLabel {
                        reason: reason.into(),
                    })
                    .inc();
            }
        }
    }

    /// How many connections to `socket` were refused so far.
    pub fn peer_refusals(&self, socket: &str) -> u64 {
        self.uds_peer_refused
            .get_or_create(&SocketLabel {
                socket: socket.into(),
            })
            .get()
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::warn!("encoding metrics failed: {e}");
        }
        out
    }

    /// Serves `/metrics` until `cancel`.
    pub async fn serve(self, listener: TcpListener, cancel: CancellationToken) {
        let handler = move |request: Request| {
            let response = match request.path.as_str() {
                "/metrics" => http_server::prometheus(self.encode()),
                path => http_server::not_found(path),
            };
            async move { response }
        };
        http_server::serve(listener, cancel, handler).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_istio() {
        let m = Metrics::new();
        m.record(Ok(Duration::from_millis(3)));
        m.record(Err("ztunnel_not_connected"));
        m.pods_enrolled.set(1);
        m.uds_peer_refused
            .get_or_create(&SocketLabel {
                socket: "zds".into(),
            })
            .inc();
        let text = m.encode();
        for name in [
            "istio_cni_pods_enrolled 1",
            "istio_cni_enrollments_total{result=\"success\"} 1",
            "istio_cni_enrollment_failures_total{reason=\"ztunnel_not_connected\"} 1",
            "istio_cni_zds_connections 0",
            "istio_cni_queue_depth 0",
            "istio_cni_enrollment_duration_seconds_count 1",
            "istio_cni_uds_peer_refused_total{socket=\"zds\"} 1",
        ] {
            assert!(text.contains(name), "{name} missing in\n{text}");
        }
    }
}
