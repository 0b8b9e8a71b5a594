use super::*;
use std::sync::Mutex;

/// Lines written by a test subscriber.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn lines(&self) -> Vec<String> {
        let bytes = self.0.lock().unwrap().clone();
        String::from_utf8(bytes)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

struct CapturedWriter(Arc<Mutex<Vec<u8>>>);

impl io::Write for CapturedWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'w> MakeWriter<'w> for Captured {
    type Writer = CapturedWriter;
    fn make_writer(&'w self) -> CapturedWriter {
        CapturedWriter(self.0.clone())
    }
}

fn settings(filter: &str, format: Format) -> Settings {
    Settings {
        default_filter: filter.into(),
        strip_prefix: Some("mesh_runtime::"),
        format,
    }
}

fn access_event() {
    let addr: std::net::SocketAddr = "10.0.0.1:1234".parse().unwrap();
    tracing::event!(
        target: "access",
        tracing::Level::INFO,
        src.addr = %addr,
        src.workload = "client",
        bytes_sent = 80u64,
        duration = "1ms",
        "connection complete"
    );
}

#[test]
fn plain_lines_are_istios() {
    let out = Captured::default();
    let (subscriber, _, problem) = subscriber(&settings("info", Format::Plain), out.clone());
    assert!(problem.is_none());
    tracing::subscriber::with_default(subscriber, || {
        access_event();
        let span = tracing::info_span!("conn", proxy = "outbound");
        let _entered = span.enter();
        tracing::warn!("no fields");
    });
    let lines = out.lines();
    let cells: Vec<&str> = lines[0].split('\t').collect();
    assert_eq!(cells.len(), 5, "{lines:?}");
    assert!(
        cells[0].ends_with('Z') && cells[0].contains('T'),
        "{}",
        cells[0]
    );
    assert_eq!(cells[1..4], ["info", "access", "connection complete"]);
    assert_eq!(
        cells[4],
        r#"src.addr=10.0.0.1:1234 src.workload="client" bytes_sent=80 duration="1ms""#
    );
    // The crate prefix is cut, spans follow the target, and a message alone
    // keeps its tab.
    let cells: Vec<&str> = lines[1].split('\t').collect();
    assert_eq!(
        cells[1..],
        [
            "warn",
            r#"logging::tests:conn{proxy="outbound"}"#,
            "no fields",
            ""
        ]
    );
}

#[test]
fn json_lines_carry_istios_keys() {
    let out = Captured::default();
    let (subscriber, _, _) = subscriber(&settings("info", Format::Json), out.clone());
    tracing::subscriber::with_default(subscriber, || {
        let span = tracing::info_span!("conn", proxy = "outbound");
        let _entered = span.enter();
        access_event();
    });
    let line: serde_json::Value = serde_json::from_str(&out.lines()[0]).unwrap();
    let keys: Vec<&str> = line
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        [
            "level",
            "time",
            "scope",
            "message",
            "src.addr",
            "src.workload",
            "bytes_sent",
            "duration",
            "conn"
        ]
    );
    assert_eq!(line["level"], "info");
    assert_eq!(line["scope"], "access");
    assert_eq!(line["message"], "connection complete");
    assert_eq!(line["src.addr"], "10.0.0.1:1234");
    assert_eq!(line["bytes_sent"], 80);
    assert_eq!(line["conn"]["proxy"], "outbound");
}

#[test]
fn the_filter_changes_live_and_bad_input_changes_nothing() {
    let out = Captured::default();
    let (subscriber, handle, _) = subscriber(&settings("info", Format::Plain), out.clone());
    tracing::subscriber::with_default(subscriber, || {
        tracing::debug!(target: "access", "hidden");
        assert_eq!(handle.current().unwrap(), "info");
        assert_eq!(
            handle.set("access=debug", false).unwrap(),
            "access=debug,info"
        );
        tracing::debug!(target: "access", "shown");
        tracing::debug!(target: "other", "still hidden");
        assert!(handle.set("access=[nope", false).is_err());
        assert_eq!(handle.current().unwrap(), "access=debug,info");
        // A reset goes back to the starting filter, then applies the level.
        assert_eq!(handle.set("", true).unwrap(), "info");
        tracing::debug!(target: "access", "hidden again");
        assert_eq!(handle.set("warn", true).unwrap(), "warn");
    });
    let lines = out.lines();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("\tshown\t"), "{lines:?}");
}

#[test]
fn level_requests_follow_istios_validation() {
    for ok in [
        "info",
        "off",
        "debug,access=trace",
        "access=debug",
        "a::b=warn,error",
    ] {
        assert!(valid_level_request(ok), "{ok}");
    }
    for bad in [
        "",
        "INFO",
        "warning",
        "critical",
        "access:debug",
        "access",
        "info,",
        "a=[x",
    ] {
        assert!(!valid_level_request(bad), "{bad}");
    }
}

#[test]
fn an_invalid_rust_log_falls_back_to_info() {
    let out = Captured::default();
    let (_subscriber, handle, problem) = subscriber(&settings("a=[", Format::Plain), out);
    assert!(problem.unwrap().contains("a=["));
    assert_eq!(handle.current().unwrap(), "info");
}

#[test]
fn log_format_json_selects_json() {
    assert_eq!(Format::parse(Some("json")), Format::Json);
    assert_eq!(Format::parse(Some("JSON")), Format::Plain);
    assert_eq!(Format::parse(None), Format::Plain);
}
