//! `POST /log` on `log.sock`: the plugin runs for milliseconds inside the container
//! runtime, where nobody reads its stderr, so it sends its log lines here and we re-emit
//! them under the `cni-plugin` target. They show up in `kubectl logs ds/istio-cni-node`
//! with the plugin's own timestamp.
//!
//! Body: a JSON array of strings, each a JSON-encoded [`PluginLogEntry`] (Istio's UDS log
//! format). A line that does not decode is re-emitted as text rather than dropped.

use http::{Method, StatusCode};
use mesh_runtime::http_server::{self, Limits, Request, Response};
use serde_json::Value;
use shared_types::cni::{PluginLogEntry, PLUGIN_LOG_PATH};

/// One plugin run logs a handful of lines; this bounds a misbehaving client.
pub const MAX_LOG_BODY: usize = 1024 * 1024;
/// The `tracing` target of re-emitted lines (Istio's log scope name).
pub const PLUGIN_TARGET: &str = "cni-plugin";

/// A decoded line, ready to emit.
#[derive(Clone, Debug, PartialEq)]
pub struct PluginLine {
    pub level: tracing::Level,
    /// The plugin's timestamp (RFC 3339), kept as sent.
    pub time: Option<String>,
    pub msg: String,
    /// The entry's other fields as one JSON object, if any (`pod`, `containerID`, ...).
    pub extra: Option<String>,
}

/// Istio's level names; anything unknown is logged at info rather than lost.
pub fn map_level(level: &str) -> tracing::Level {
    match level.to_ascii_lowercase().as_str() {
        "debug" => tracing::Level::DEBUG,
        "warn" | "warning" => tracing::Level::WARN,
        "error" | "fatal" => tracing::Level::ERROR,
        _ => tracing::Level::INFO,
    }
}

/// Decodes a batch; `Err` only when the body is not a JSON array of strings.
pub fn parse_batch(body: &[u8]) -> Result<Vec<PluginLine>, String> {
    let lines: Vec<String> = serde_json::from_slice(body)
        .map_err(|e| format!("expected a JSON array of strings: {e}"))?;
    Ok(lines.iter().map(|line| parse_line(line)).collect())
}

fn parse_line(line: &str) -> PluginLine {
    match serde_json::from_str::<PluginLogEntry>(line) {
        Ok(entry) => PluginLine {
            level: map_level(&entry.level),
            time: Some(entry.time),
            msg: entry.msg,
            extra: (!entry.fields.is_empty()).then(|| Value::Object(entry.fields).to_string()),
        },
        Err(_) => PluginLine {
            level: tracing::Level::INFO,
            time: None,
            msg: line.trim_end().to_string(),
            extra: None,
        },
    }
}

/// Re-emits one line through `tracing` under [`PLUGIN_TARGET`].
pub fn emit(line: &PluginLine) {
    let time = line.time.as_deref();
    let extra = line.extra.as_deref();
    macro_rules! emit_at {
        ($level:expr) => {
            tracing::event!(target: PLUGIN_TARGET, $level, time, extra, "{}", line.msg)
        };
    }
    match line.level {
        tracing::Level::ERROR => emit_at!(tracing::Level::ERROR),
        tracing::Level::WARN => emit_at!(tracing::Level::WARN),
        tracing::Level::DEBUG => emit_at!(tracing::Level::DEBUG),
        tracing::Level::TRACE => emit_at!(tracing::Level::TRACE),
        _ => emit_at!(tracing::Level::INFO),
    }
}

/// The log socket's limits.
pub fn limits() -> Limits {
    Limits {
        max_body: MAX_LOG_BODY,
        ..Limits::default()
    }
}

/// Answers one request on the log socket.
pub async fn route(request: Request) -> Response {
    if request.path != PLUGIN_LOG_PATH {
        return http_server::not_found(&request.path);
    }
    if request.method != Method::POST {
        return http_server::method_not_allowed("POST");
    }
    match parse_batch(&request.body) {
        Ok(lines) => {
            lines.iter().for_each(emit);
            http_server::text(StatusCode::OK, "")
        }
        Err(reason) => {
            tracing::debug!("rejected a plugin log batch: {reason}");
            http_server::text(StatusCode::BAD_REQUEST, reason)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tracing::field::{Field, Visit};
    use tracing_subscriber::layer::{Context, SubscriberExt};
    use tracing_subscriber::Layer;

    /// (target, level, fields) of one event.
    type Recorded = (String, tracing::Level, Vec<(String, String)>);

    /// Collects every event.
    #[derive(Clone, Default)]
    struct Capture(Arc<Mutex<Vec<Recorded>>>);

    struct Fields(Vec<(String, String)>);
    impl Visit for Fields {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            self.0
                .push((field.name().to_string(), format!("{value:?}")));
        }
        fn record_str(&mut self, field: &Field, value: &str) {
            self.0.push((field.name().to_string(), value.to_string()));
        }
    }

    impl<S: tracing::Subscriber> Layer<S> for Capture {
        fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
            let mut fields = Fields(Vec::new());
            event.record(&mut fields);
            let meta = event.metadata();
            self.0
                .lock()
                .unwrap()
                .push((meta.target().to_string(), *meta.level(), fields.0));
        }
    }

    #[test]
    fn batch_is_reemitted_with_level_time_and_fields() {
        let body = serde_json::to_vec(&[
            r#"{"level":"warn","time":"2026-05-01T12:00:00.000001Z","msg":"agent slow","pod":"shop/web-0"}"#,
            r#"{"level":"debug","time":"2026-05-01T12:00:00.000002Z","msg":"asking"}"#,
            "not json at all",
        ])
        .unwrap();
        let lines = parse_batch(&body).unwrap();
        assert_eq!(lines[0].level, tracing::Level::WARN);
        assert_eq!(lines[0].extra.as_deref(), Some(r#"{"pod":"shop/web-0"}"#));
        assert_eq!(lines[2].msg, "not json at all");

        let capture = Capture::default();
        let subscriber = tracing_subscriber::registry().with(capture.clone());
        tracing::subscriber::with_default(subscriber, || lines.iter().for_each(emit));
        let events = capture.0.lock().unwrap();
        assert_eq!(events.len(), 3);
        let (target, level, fields) = &events[0];
        assert_eq!(
            (target.as_str(), *level),
            ("cni-plugin", tracing::Level::WARN)
        );
        let get = |k: &str| fields.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("message"), Some("agent slow"));
        assert_eq!(get("time"), Some("2026-05-01T12:00:00.000001Z"));
        assert_eq!(get("extra"), Some(r#"{"pod":"shop/web-0"}"#));
        assert_eq!(events[1].1, tracing::Level::DEBUG);
        assert_eq!(events[2].1, tracing::Level::INFO);
    }

    #[test]
    fn default_filter_lets_plugin_debug_lines_through() {
        let capture = Capture::default();
        let filter =
            tracing_subscriber::EnvFilter::try_new(crate::app::DEFAULT_LOG_FILTER).unwrap();
        let subscriber = tracing_subscriber::registry()
            .with(capture.clone())
            .with(filter);
        let line = parse_line(r#"{"level":"debug","time":"t","msg":"m"}"#);
        tracing::subscriber::with_default(subscriber, || {
            emit(&line);
            tracing::debug!("agent debug is filtered");
        });
        let events = capture.0.lock().unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].0, "cni-plugin");
    }

    #[test]
    fn levels_and_bad_batches() {
        assert_eq!(map_level("WARNING"), tracing::Level::WARN);
        assert_eq!(map_level("fatal"), tracing::Level::ERROR);
        assert_eq!(map_level("loud"), tracing::Level::INFO);
        assert!(parse_batch(b"{}").is_err());
        assert!(parse_batch(b"[1,2]").is_err());
        assert_eq!(parse_batch(b"[]").unwrap(), vec![]);
    }
}
