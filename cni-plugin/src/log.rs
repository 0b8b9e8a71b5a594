//! A tiny logger: each entry goes to stderr at once (stdout carries the CNI result) and is
//! kept for one batch to the node agent at exit (`POST /log` on `log.sock`, Istio's UDS
//! log format), so plugin logs show up in `kubectl logs ds/istio-cni-node`. The tee is
//! best effort and bounded to a few hundred milliseconds.

use crate::http;
use serde_json::{Map, Value};
use shared_types::cni::{rfc3339_utc, PluginLogEntry, PLUGIN_LOG_PATH};
use std::io::Write;
use std::path::Path;
use std::time::{Duration, SystemTime};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Debug,
    Info,
    Warn,
    Error,
    /// Logs nothing.
    None,
}

impl Level {
    /// Istio's level names (`warning` and `fatal` accepted as aliases).
    pub fn parse(text: &str) -> Option<Self> {
        match text.to_ascii_lowercase().as_str() {
            "debug" => Some(Level::Debug),
            "info" => Some(Level::Info),
            "warn" | "warning" => Some(Level::Warn),
            "error" | "fatal" => Some(Level::Error),
            "none" => Some(Level::None),
            _ => None,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Level::Debug => "debug",
            Level::Info => "info",
            Level::Warn => "warn",
            Level::Error => "error",
            Level::None => "none",
        }
    }
}

/// Bounds for the tee: the plugin must not slow pod startup when the agent is busy.
const TEE_CONNECT_TIMEOUT: Duration = Duration::from_millis(100);
const TEE_TOTAL_TIMEOUT: Duration = Duration::from_millis(300);

pub struct Logger {
    level: Level,
    fields: Map<String, Value>,
    entries: Vec<String>,
    to_stderr: bool,
}

impl Logger {
    pub fn new(level: Level) -> Self {
        Logger {
            level,
            fields: Map::new(),
            entries: Vec::new(),
            to_stderr: true,
        }
    }

    /// A logger that only buffers (unit tests).
    #[cfg(test)]
    pub fn quiet() -> Self {
        Logger {
            to_stderr: false,
            ..Logger::new(Level::Debug)
        }
    }

    pub fn set_level(&mut self, level: Level) {
        self.level = level;
    }

    /// Adds a field to every later entry (pod, containerID, ...).
    pub fn with_field(&mut self, key: &str, value: impl Into<String>) {
        self.fields
            .insert(key.to_string(), Value::String(value.into()));
    }

    pub fn debug(&mut self, msg: impl Into<String>) {
        self.log(Level::Debug, msg.into());
    }

    pub fn info(&mut self, msg: impl Into<String>) {
        self.log(Level::Info, msg.into());
    }

    pub fn warn(&mut self, msg: impl Into<String>) {
        self.log(Level::Warn, msg.into());
    }

    pub fn error(&mut self, msg: impl Into<String>) {
        self.log(Level::Error, msg.into());
    }

    fn log(&mut self, level: Level, msg: String) {
        if level < self.level || self.level == Level::None {
            return;
        }
        let entry = PluginLogEntry {
            level: level.as_str().to_string(),
            time: rfc3339_utc(SystemTime::now()),
            msg,
            fields: self.fields.clone(),
        };
        let Ok(line) = serde_json::to_string(&entry) else {
            return;
        };
        if self.to_stderr {
            let _ = writeln!(std::io::stderr().lock(), "{line}");
        }
        self.entries.push(line);
    }

    /// The entries kept so far, each a JSON object.
    #[cfg(test)]
    pub fn entries(&self) -> &[String] {
        &self.entries
    }

    /// Sends the kept entries to the agent's log socket, once. Absent socket, refused
    /// connection, slow agent: silently dropped (they are on stderr already).
    pub fn flush_to(&mut self, socket: &Path) {
        if self.entries.is_empty() || !socket.exists() {
            return;
        }
        let entries = std::mem::take(&mut self.entries);
        let Ok(body) = serde_json::to_vec(&entries) else {
            return;
        };
        let _ = http::post_json(
            socket,
            PLUGIN_LOG_PATH,
            &body,
            http::Limits {
                connect: TEE_CONNECT_TIMEOUT,
                total: TEE_TOTAL_TIMEOUT,
                max_response: 4096,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_by_level_and_carries_fields() {
        let mut log = Logger::quiet();
        log.set_level(Level::Info);
        log.debug("hidden");
        log.with_field("pod", "shop/web-0");
        log.warn("shown");
        assert_eq!(log.entries().len(), 1);
        let entry: PluginLogEntry = serde_json::from_str(&log.entries()[0]).unwrap();
        assert_eq!(entry.level, "warn");
        assert_eq!(entry.msg, "shown");
        assert_eq!(entry.fields["pod"], "shop/web-0");
        assert!(entry.time.ends_with('Z'));
        log.set_level(Level::None);
        log.error("nothing");
        assert_eq!(log.entries().len(), 1);
    }

    #[test]
    fn level_names() {
        assert_eq!(Level::parse("WARNING"), Some(Level::Warn));
        assert_eq!(Level::parse("none"), Some(Level::None));
        assert_eq!(Level::parse("trace"), None);
    }

    #[test]
    fn flush_without_socket_is_a_no_op() {
        let mut log = Logger::quiet();
        log.info("x");
        let start = std::time::Instant::now();
        log.flush_to(Path::new("/nonexistent/log.sock"));
        assert!(start.elapsed() < Duration::from_millis(50));
    }
}
