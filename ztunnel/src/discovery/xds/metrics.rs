//! The xDS client's metrics: Istio's ztunnel names, plus our NACK and per-type size counts.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TypeLabels {
    pub url: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TerminationLabels {
    /// Istio's: `ConnectionError` (never got a stream), `Error` (the stream broke),
    /// `Complete` (istiod ended it).
    pub reason: &'static str,
}

#[derive(Default)]
pub struct XdsMetrics {
    pub messages: Family<TypeLabels, Counter>,
    pub message_bytes: Family<TypeLabels, Counter>,
    /// Bytes of every resource received, all types (Istio's `total_messages_size`).
    pub total_size: Counter,
    pub nacks: Family<TypeLabels, Counter>,
    pub terminations: Family<TerminationLabels, Counter>,
}

impl XdsMetrics {
    /// prometheus-client appends `_total` to counters on exposition.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "istio_message_types",
            "Total number of messages received (unstable)",
            self.messages.clone(),
        );
        registry.register(
            "istio_total_messages_size",
            "Total number of bytes received (unstable)",
            self.total_size.clone(),
        );
        registry.register(
            "ztunnel_xds_message_bytes",
            "Total size of the xDS resources received, by type",
            self.message_bytes.clone(),
        );
        registry.register(
            "istio_xds_connection_terminations",
            "xDS streams that ended, by reason",
            self.terminations.clone(),
        );
        registry.register(
            "ztunnel_xds_nacks",
            "xDS responses NACKed because a resource in them was invalid, by type",
            self.nacks.clone(),
        );
    }

    pub fn url(type_url: &str) -> TypeLabels {
        TypeLabels {
            url: type_url.to_owned(),
        }
    }
}
