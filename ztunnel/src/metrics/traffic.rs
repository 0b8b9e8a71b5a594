//! Istio's `CommonTrafficLabels`: the labels of the `istio_tcp_*` metrics, in Istio's
//! order, with its values (`unknown` for what is not known, the app and version from
//! the canonical name and revision, locality only once a workload is known).

use std::fmt::Write as _;

use prometheus_client::encoding::{
    EncodeLabelSet, EncodeLabelValue, LabelSetEncoder, LabelValueEncoder,
};

use crate::identity::Identity;
use crate::state::service::Service;
use crate::state::workload::Workload;

/// Which side of the connection reports it, as in Istio's `reporter` label.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Reporter {
    /// The client's ztunnel (outbound).
    source,
    /// The server's ztunnel (inbound).
    destination,
    /// A waypoint, between the two.
    waypoint,
}

/// Istio's `connection_security_policy` label.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum SecurityPolicy {
    /// The connection is mutual TLS (HBONE).
    mutual_tls,
    /// Plaintext, or not known.
    unknown,
}

/// Istio's `response_flags`: `-`, `DENY` (policy), `CONNECT` (upstream failed).
#[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq)]
pub enum ResponseFlags {
    /// Nothing to report.
    #[default]
    None,
    /// Denied by an authorization policy.
    Denied,
    /// The upstream connection could not be made.
    ConnectFailure,
    /// A waypoint found no route for the request, or none it could use (Envoy's `NR`).
    NoRoute,
    /// A waypoint's request or per-try timeout fired (Envoy's `UT`).
    UpstreamTimeout,
}

impl EncodeLabelValue for ResponseFlags {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(match self {
            ResponseFlags::None => "-",
            ResponseFlags::Denied => "DENY",
            ResponseFlags::ConnectFailure => "CONNECT",
            ResponseFlags::NoRoute => "NR",
            ResponseFlags::UpstreamTimeout => "UT",
        })
    }
}

/// A label value that encodes as `unknown` when empty (Istio's `DefaultedUnknown`).
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub struct Value(pub String);

impl Value {
    fn from(s: &str) -> Self {
        Value(s.to_owned())
    }

    /// The value, `None` when unknown.
    pub fn get(&self) -> Option<&str> {
        (!self.0.is_empty()).then_some(self.0.as_str())
    }
}

impl EncodeLabelValue for Value {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.get().unwrap_or("unknown"))
    }
}

/// `source_region`, `source_zone`, `destination_region`, `destination_zone`.
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LocalityLabels {
    source_region: Value,
    source_zone: Value,
    destination_region: Value,
    destination_zone: Value,
}

/// The locality labels, present only once a source or destination is known (Istio
/// leaves them out entirely otherwise).
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
pub struct Locality(Option<LocalityLabels>);

impl EncodeLabelSet for Locality {
    fn encode(&self, encoder: LabelSetEncoder) -> Result<(), std::fmt::Error> {
        match &self.0 {
            Some(labels) => labels.encode(encoder),
            None => Ok(()),
        }
    }
}

/// The labels of one connection's `istio_tcp_*` series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TrafficLabels {
    /// Who reports.
    pub reporter: Reporter,
    /// The source's workload (Deployment, ...) name.
    pub source_workload: Value,
    /// The source's canonical service.
    pub source_canonical_service: Value,
    /// The source's canonical revision.
    pub source_canonical_revision: Value,
    /// The source's namespace.
    pub source_workload_namespace: Value,
    /// The source's SPIFFE identity (from mutual TLS, or our own for outbound).
    pub source_principal: Value,
    /// The source's app (its canonical service).
    pub source_app: Value,
    /// The source's version (its canonical revision).
    pub source_version: Value,
    /// The source's cluster.
    pub source_cluster: Value,
    /// The destination Service's hostname.
    pub destination_service: Value,
    /// The destination Service's namespace.
    pub destination_service_namespace: Value,
    /// The destination Service's name.
    pub destination_service_name: Value,
    /// The destination's workload name.
    pub destination_workload: Value,
    /// The destination's canonical service.
    pub destination_canonical_service: Value,
    /// The destination's canonical revision.
    pub destination_canonical_revision: Value,
    /// The destination's namespace.
    pub destination_workload_namespace: Value,
    /// The destination's SPIFFE identity.
    pub destination_principal: Value,
    /// The destination's app.
    pub destination_app: Value,
    /// The destination's version.
    pub destination_version: Value,
    /// The destination's cluster.
    pub destination_cluster: Value,
    /// Always `tcp` at L4.
    pub request_protocol: &'static str,
    /// Why the connection failed, if it did.
    pub response_flags: ResponseFlags,
    /// Mutual TLS or not.
    pub connection_security_policy: SecurityPolicy,
    /// Region and zone of both ends, once one is known.
    #[prometheus(flatten)]
    pub locality: Locality,
}

/// The workload's name for telemetry: its owner's name (Istio's `workloadName`);
/// hand-written local configs often leave that out, so the workload's own name then.
fn workload_name(w: &Workload) -> &str {
    if w.workload_name.is_empty() {
        &w.name
    } else {
        &w.workload_name
    }
}

impl TrafficLabels {
    /// Labels as `reporter` sees a connection it knows nothing of yet.
    pub fn new(reporter: Reporter) -> Self {
        TrafficLabels {
            reporter,
            source_workload: Value::default(),
            source_canonical_service: Value::default(),
            source_canonical_revision: Value::default(),
            source_workload_namespace: Value::default(),
            source_principal: Value::default(),
            source_app: Value::default(),
            source_version: Value::default(),
            source_cluster: Value::default(),
            destination_service: Value::default(),
            destination_service_namespace: Value::default(),
            destination_service_name: Value::default(),
            destination_workload: Value::default(),
            destination_canonical_service: Value::default(),
            destination_canonical_revision: Value::default(),
            destination_workload_namespace: Value::default(),
            destination_principal: Value::default(),
            destination_app: Value::default(),
            destination_version: Value::default(),
            destination_cluster: Value::default(),
            request_protocol: "tcp",
            response_flags: ResponseFlags::None,
            connection_security_policy: SecurityPolicy::unknown,
            locality: Locality::default(),
        }
    }

    fn locality(&mut self) -> &mut LocalityLabels {
        self.locality.0.get_or_insert_with(LocalityLabels::default)
    }

    /// The source as discovery knows it (no principal: that comes from the TLS peer
    /// or our own identity, [`Self::with_source_identity`]).
    pub fn with_source(mut self, workload: Option<&Workload>) -> Self {
        let Some(w) = workload else { return self };
        self.source_workload = Value::from(workload_name(w));
        self.source_canonical_service = Value::from(&w.canonical_name);
        self.source_canonical_revision = Value::from(&w.canonical_revision);
        self.source_workload_namespace = Value::from(&w.namespace);
        self.source_app = Value::from(&w.canonical_name);
        self.source_version = Value::from(&w.canonical_revision);
        self.source_cluster = Value::from(&w.cluster_id);
        let locality = self.locality();
        locality.source_region = Value::from(&w.locality.region);
        locality.source_zone = Value::from(&w.locality.zone);
        self
    }

    /// The source's identity; its namespace stands in when the workload is unknown.
    pub fn with_source_identity(mut self, identity: Option<&Identity>) -> Self {
        let Some(id) = identity else { return self };
        self.source_principal = Value(id.to_uri());
        if self.source_workload_namespace.get().is_none() {
            self.source_workload_namespace = Value::from(&id.namespace);
        }
        self.locality();
        self
    }

    /// The destination workload, with its identity as the principal.
    pub fn with_destination(mut self, workload: Option<&Workload>) -> Self {
        let Some(w) = workload else { return self };
        self.destination_workload = Value::from(workload_name(w));
        self.destination_canonical_service = Value::from(&w.canonical_name);
        self.destination_canonical_revision = Value::from(&w.canonical_revision);
        self.destination_workload_namespace = Value::from(&w.namespace);
        self.destination_principal = Value(w.identity().to_uri());
        self.destination_app = Value::from(&w.canonical_name);
        self.destination_version = Value::from(&w.canonical_revision);
        self.destination_cluster = Value::from(&w.cluster_id);
        let locality = self.locality();
        locality.destination_region = Value::from(&w.locality.region);
        locality.destination_zone = Value::from(&w.locality.zone);
        self
    }

    /// The destination's principal when it is not the workload's own (a dedicated
    /// ztunnel's configured identity).
    pub fn with_destination_identity(mut self, identity: &Identity) -> Self {
        self.destination_principal = Value(identity.to_uri());
        self
    }

    /// The Service the client addressed.
    pub fn with_service(mut self, service: Option<&Service>) -> Self {
        let Some(s) = service else { return self };
        self.destination_service = Value::from(&s.hostname);
        self.destination_service_name = Value::from(&s.name);
        self.destination_service_namespace = Value::from(&s.namespace);
        self
    }

    /// The connection is mutual TLS.
    pub fn mutual_tls(mut self) -> Self {
        self.connection_security_policy = SecurityPolicy::mutual_tls;
        self
    }

    /// For a request rather than a connection (a waypoint's request metrics):
    /// Istio's `http` or `grpc`.
    pub fn with_request_protocol(mut self, protocol: &'static str) -> Self {
        self.request_protocol = protocol;
        self
    }

    /// With `flags` as the response flags.
    pub fn with_flags(mut self, flags: ResponseFlags) -> Self {
        self.response_flags = flags;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::family::Family;
    use prometheus_client::registry::Registry;

    fn encode(labels: TrafficLabels) -> String {
        let family: Family<TrafficLabels, Counter> = Family::default();
        family.get_or_create(&labels).inc();
        let mut registry = Registry::default();
        registry.register("t", "t", family);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        out
    }

    #[test]
    fn labels_come_in_istios_order_with_locality_once_known() {
        let bare = encode(TrafficLabels::new(Reporter::source));
        assert!(bare.contains("t_total{reporter=\"source\",source_workload=\"unknown\","));
        assert!(
            bare.contains("connection_security_policy=\"unknown\"} 1"),
            "{bare}"
        );
        assert!(!bare.contains("source_region"), "{bare}");
        let w = Workload {
            name: "pod-1".into(),
            namespace: "ns".into(),
            canonical_name: "app".into(),
            canonical_revision: "v1".into(),
            cluster_id: "Kubernetes".into(),
            ..Default::default()
        };
        let known = encode(
            TrafficLabels::new(Reporter::destination)
                .with_destination(Some(&w))
                .with_flags(ResponseFlags::Denied),
        );
        assert!(
            known.contains("destination_workload=\"pod-1\",destination_canonical_service=\"app\""),
            "{known}"
        );
        assert!(known.contains("destination_principal=\"spiffe://cluster.local/ns/ns/sa/default\""));
        assert!(known.contains("response_flags=\"DENY\""));
        assert!(known.contains("destination_zone=\"unknown\"} 1"), "{known}");
    }
}
