//! One proxied connection's telemetry as Istio's ztunnel records it: the
//! `istio_tcp_*` counters, and the `access` log events (`connection opened` at
//! debug, `connection complete` at info, or at error with the error).

use std::fmt::Display;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use crate::hbone::stream::ByteTally;
use crate::metrics::{Metrics, Reporter, SecurityPolicy, TrafficLabels};
use crate::state::workload::Workload;

/// The ends of a connection, as its access log names them.
#[derive(Clone, Debug)]
pub struct Endpoints {
    /// The client's address.
    pub src: SocketAddr,
    /// Where the connection went: the peer's `:15008` for HBONE, else the target.
    pub dst: SocketAddr,
    /// The HBONE `:authority` (the workload's `ip:port`), for HBONE connections.
    pub hbone_target: Option<SocketAddr>,
    /// The source workload's (pod) name, if known.
    pub src_workload: Option<String>,
    /// The destination workload's (pod) name, if known.
    pub dst_workload: Option<String>,
}

impl Endpoints {
    /// `src` to `dst`, with the workloads' names when discovery knows them.
    pub fn new(
        src: SocketAddr,
        dst: SocketAddr,
        hbone_target: Option<SocketAddr>,
        source: Option<&Workload>,
        destination: Option<&Workload>,
    ) -> Self {
        Endpoints {
            src,
            dst,
            hbone_target,
            src_workload: source.map(|w| w.name.clone()),
            dst_workload: destination.map(|w| w.name.clone()),
        }
    }
}

/// Emits one `access` event with the connection's fields; `$level` is a constant and
/// the extra fields follow the common ones, as in Istio's events.
macro_rules! access_event {
    ($level:expr, $ends:expr, $labels:expr, $message:literal $(, $($extra:tt)*)?) => {{
        let (ends, labels): (&Endpoints, &TrafficLabels) = (&$ends, &$labels);
        let mtls = labels.connection_security_policy == SecurityPolicy::mutual_tls;
        tracing::event!(
            target: "access",
            parent: None,
            $level,
            src.addr = %ends.src,
            src.workload = ends.src_workload.as_deref().or(labels.source_canonical_service.get()),
            src.namespace = labels.source_workload_namespace.get(),
            src.identity = labels.source_principal.get().filter(|_| mtls),
            dst.addr = %ends.dst,
            dst.hbone_addr = ends.hbone_target.map(tracing::field::display),
            dst.service = labels.destination_service.get(),
            dst.workload = ends.dst_workload.as_deref().or(labels.destination_canonical_service.get()),
            dst.namespace = labels.destination_workload_namespace.get(),
            dst.identity = labels.destination_principal.get().filter(|_| mtls),
            direction = direction(labels.reporter),
            $($($extra)*)?
            $message
        )
    }};
}

fn direction(reporter: Reporter) -> &'static str {
    match reporter {
        Reporter::source => "outbound",
        Reporter::destination | Reporter::waypoint => "inbound",
    }
}

/// An open connection: counted as opened now, as closed (with its access log) when
/// recorded or dropped.
pub struct ConnectionResult {
    ends: Endpoints,
    labels: TrafficLabels,
    metrics: Arc<Metrics>,
    start: Instant,
    /// Client to server bytes (Istio's "received during request").
    pub received: ByteTally,
    /// Server to client bytes (Istio's "sent during response").
    pub sent: ByteTally,
    recorded: bool,
}

impl ConnectionResult {
    /// Counts the connection as opened and logs `connection opened` (debug).
    pub fn open(metrics: &Arc<Metrics>, ends: Endpoints, labels: TrafficLabels) -> Self {
        metrics.connections_opened.get_or_create(&labels).inc();
        access_event!(tracing::Level::DEBUG, ends, labels, "connection opened");
        ConnectionResult {
            received: ByteTally::new(metrics.received_bytes.get_or_create(&labels).clone()),
            sent: ByteTally::new(metrics.sent_bytes.get_or_create(&labels).clone()),
            metrics: metrics.clone(),
            start: Instant::now(),
            ends,
            labels,
            recorded: false,
        }
    }

    /// A connection that failed before it carried a byte (denied, or its upstream
    /// refused): counted in `istio_tcp_connections_failed_total` and logged as a
    /// `connection complete` error.
    pub fn failed(metrics: &Metrics, ends: Endpoints, labels: TrafficLabels, error: impl Display) {
        metrics.connections_failed.get_or_create(&labels).inc();
        access_event!(
            tracing::Level::ERROR,
            ends,
            labels,
            "connection complete",
            bytes_sent = 0u64,
            bytes_recv = 0u64,
            duration = "0ms",
            error = %error,
        );
    }

    /// Records the end: closed counter, and the `connection complete` event (info, or
    /// error with the error's text).
    pub fn record<E: Display>(mut self, result: Result<(), E>) {
        self.finish(result.map_err(|e| e.to_string()));
    }

    fn finish(&mut self, result: Result<(), String>) {
        if std::mem::replace(&mut self.recorded, true) {
            return;
        }
        self.metrics
            .connections_closed
            .get_or_create(&self.labels)
            .inc();
        // The log shows bytes as the reporting side sent and received them (the
        // metrics count client-to-server as received on both sides, as Istio's).
        let (sent, recv) = match self.labels.reporter {
            Reporter::source => (self.received.total(), self.sent.total()),
            Reporter::destination | Reporter::waypoint => {
                (self.sent.total(), self.received.total())
            }
        };
        let duration = format!("{}ms", self.start.elapsed().as_millis());
        match result {
            Ok(()) => access_event!(
                tracing::Level::INFO,
                self.ends,
                self.labels,
                "connection complete",
                bytes_sent = sent,
                bytes_recv = recv,
                duration = duration,
            ),
            Err(error) => access_event!(
                tracing::Level::ERROR,
                self.ends,
                self.labels,
                "connection complete",
                bytes_sent = sent,
                bytes_recv = recv,
                duration = duration,
                error = error,
            ),
        }
    }
}

impl Drop for ConnectionResult {
    fn drop(&mut self) {
        // Not recorded: the connection was cut by a drain (Istio's `ClosedFromDrain`).
        self.finish(Err("connection closed due to connection drain".into()));
    }
}

#[cfg(test)]
#[path = "result_tests.rs"]
mod tests;
