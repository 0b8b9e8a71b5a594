//! The xDS server's metrics, with istiod's names (`pilot_*`); OpenMetrics adds
//! `_total` to counters.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TypeLabels {
    pub r#type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

type HistogramFamily = Family<TypeLabels, Histogram, fn() -> Histogram>;

pub struct XdsMetrics {
    /// Connected proxies.
    pub connected: Gauge,
    pub pushes: Family<TypeLabels, Counter>,
    /// From a change reaching the store to its push leaving, per stream.
    pub push_time: HistogramFamily,
    /// NACKs received.
    pub rejects: Family<TypeLabels, Counter>,
    /// Resources held, per type.
    pub resources: Family<TypeLabels, Gauge>,
    /// Streams refused before any push (authentication, node checks).
    pub refused: Family<ReasonLabels, Counter>,
}

fn push_time_histogram() -> Histogram {
    Histogram::new([0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 10.0])
}

impl Default for XdsMetrics {
    fn default() -> Self {
        XdsMetrics {
            connected: Gauge::default(),
            pushes: Family::default(),
            push_time: Family::new_with_constructor(push_time_histogram),
            rejects: Family::default(),
            resources: Family::default(),
            refused: Family::default(),
        }
    }
}

impl XdsMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "pilot_xds",
            "Number of endpoints connected to this pilot using XDS",
            self.connected.clone(),
        );
        registry.register(
            "pilot_xds_pushes",
            "Pilot build and send errors for lds, rds, cds and eds",
            self.pushes.clone(),
        );
        registry.register(
            "pilot_xds_push_time",
            "Seconds from a change to its push reaching a stream, by type",
            self.push_time.clone(),
        );
        registry.register(
            "pilot_total_xds_rejects",
            "Total number of XDS responses from pilot rejected by proxy",
            self.rejects.clone(),
        );
        registry.register(
            "pilot_xds_resources",
            "Resources served, by type",
            self.resources.clone(),
        );
        registry.register(
            "pilot_xds_refused_streams",
            "xDS streams refused before any push, by reason",
            self.refused.clone(),
        );
    }

    pub fn type_label(type_url: &str) -> TypeLabels {
        TypeLabels {
            r#type: type_url.to_owned(),
        }
    }

    pub fn refused(&self, reason: &'static str) {
        self.refused.get_or_create(&ReasonLabels { reason }).inc();
    }
}
