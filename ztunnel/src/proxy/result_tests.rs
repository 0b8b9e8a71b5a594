//! Access-log events as Istio's ztunnel writes them, read back in JSON.

use std::sync::Mutex;

use super::*;
use crate::identity::Identity;
use crate::metrics::ResponseFlags;
use mesh_runtime::logging::{Format, Settings};

#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

struct LineWriter(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LineWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'w> tracing_subscriber::fmt::MakeWriter<'w> for Lines {
    type Writer = LineWriter;
    fn make_writer(&'w self) -> LineWriter {
        LineWriter(self.0.clone())
    }
}

impl Lines {
    fn json(&self) -> Vec<serde_json::Value> {
        String::from_utf8(self.0.lock().unwrap().clone())
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

/// Istio's access-log fields, in its order.
const FIELDS: [&str; 15] = [
    "src.addr",
    "src.workload",
    "src.namespace",
    "src.identity",
    "dst.addr",
    "dst.hbone_addr",
    "dst.service",
    "dst.workload",
    "dst.namespace",
    "dst.identity",
    "direction",
    "bytes_sent",
    "bytes_recv",
    "duration",
    "error",
];

fn workload(name: &str, ns: &str) -> Workload {
    Workload {
        name: name.into(),
        namespace: ns.into(),
        service_account: name.into(),
        ..Default::default()
    }
}

fn with_logs(f: impl FnOnce()) -> Vec<serde_json::Value> {
    let lines = Lines::default();
    let settings = Settings {
        default_filter: "access=debug,info".into(),
        strip_prefix: Some("ztunnel::"),
        format: Format::Json,
    };
    let (subscriber, _, _) = mesh_runtime::logging::subscriber(&settings, lines.clone());
    tracing::subscriber::with_default(subscriber, f);
    lines.json()
}

#[test]
fn an_outbound_hbone_connection_logs_opened_and_complete() {
    let metrics = Arc::new(Metrics::new());
    let (client, server) = (workload("client-0", "demo"), workload("echo-0", "demo"));
    let svc = crate::state::Service {
        hostname: "echo.demo.svc.cluster.local".into(),
        ..Default::default()
    };
    let logs = with_logs(|| {
        let labels = TrafficLabels::new(Reporter::source)
            .with_source(Some(&client))
            .with_source_identity(Some(&Identity::new("cluster.local", "demo", "client-0")))
            .with_destination(Some(&server))
            .with_service(Some(&svc))
            .mutual_tls();
        let ends = Endpoints::new(
            "10.0.0.1:40000".parse().unwrap(),
            "10.0.0.2:15008".parse().unwrap(),
            Some("10.0.0.2:8080".parse().unwrap()),
            Some(&client),
            Some(&server),
        );
        let result = ConnectionResult::open(&metrics, ends, labels);
        result.received.add(80);
        result.sent.add(175);
        result.record(Ok::<(), String>(()));
    });
    assert_eq!(logs.len(), 2, "{logs:?}");
    let (opened, complete) = (&logs[0], &logs[1]);
    assert_eq!(
        (&opened["level"], &opened["scope"], &opened["message"]),
        (
            &"debug".into(),
            &"access".into(),
            &"connection opened".into()
        )
    );
    assert_eq!(complete["level"], "info");
    assert_eq!(complete["message"], "connection complete");
    let keys: Vec<&str> = complete
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .filter(|k| !["level", "time", "scope", "message"].contains(k))
        .collect();
    assert_eq!(keys, FIELDS[..14]);
    assert_eq!(complete["src.addr"], "10.0.0.1:40000");
    assert_eq!(
        complete["src.identity"],
        "spiffe://cluster.local/ns/demo/sa/client-0"
    );
    assert_eq!(complete["dst.addr"], "10.0.0.2:15008");
    assert_eq!(complete["dst.hbone_addr"], "10.0.0.2:8080");
    assert_eq!(complete["dst.service"], "echo.demo.svc.cluster.local");
    assert_eq!(complete["dst.workload"], "echo-0");
    assert_eq!(
        complete["dst.identity"],
        "spiffe://cluster.local/ns/demo/sa/echo-0"
    );
    assert_eq!(complete["direction"], "outbound");
    assert_eq!(
        (&complete["bytes_sent"], &complete["bytes_recv"]),
        (&80.into(), &175.into())
    );
    assert!(complete["duration"].as_str().unwrap().ends_with("ms"));
    let text = metrics.encode();
    assert!(
        text.contains("istio_tcp_connections_closed_total{reporter=\"source\""),
        "{text}"
    );
}

#[test]
fn plaintext_hides_identities_and_errors_are_logged_at_error() {
    let metrics = Arc::new(Metrics::new());
    let server = workload("echo-0", "demo");
    let logs = with_logs(|| {
        let labels = TrafficLabels::new(Reporter::destination)
            .with_destination(Some(&server))
            .with_flags(ResponseFlags::Denied);
        let ends = Endpoints::new(
            "10.0.0.9:5000".parse().unwrap(),
            "10.0.0.2:8080".parse().unwrap(),
            None,
            None,
            Some(&server),
        );
        ConnectionResult::failed(&metrics, ends.clone(), labels.clone(), "denied");
        // A connection dropped without a result: cut by a drain.
        drop(ConnectionResult::open(&metrics, ends, labels));
    });
    let denied = &logs[0];
    assert_eq!(denied["level"], "error");
    assert_eq!(denied["error"], "denied");
    assert_eq!(denied["direction"], "inbound");
    assert!(denied.get("dst.identity").is_none() && denied.get("dst.hbone_addr").is_none());
    let drained = logs.last().unwrap();
    assert_eq!(
        drained["error"],
        "connection closed due to connection drain"
    );
    assert!(metrics
        .encode()
        .contains("istio_tcp_connections_failed_total{reporter=\"destination\""));
}
