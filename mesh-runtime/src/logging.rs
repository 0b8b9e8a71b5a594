//! The one logging setup of every long-running binary: Istio's line formats (plain,
//! or JSON with `LOG_FORMAT=json`), a `RUST_LOG` filter of `target=level` directives,
//! and a handle that changes that filter while the process runs (ztunnel's `/logging`).
//!
//! The plain format is Istio's ztunnel's: `<time>\t<level>\t<target>[:<span>{..}]\t
//! <message>\t<key=value ...>`, with the binary's own crate prefix cut from the
//! target. The JSON format is Istio's too: one object per line with `level`, `time`,
//! `scope` (the whole target), `message`, then the event's fields, and one object per
//! enclosing span under the span's name.
//!
//! The filter is a [`Targets`] list, as Istio's ztunnel uses: `info`,
//! `info,ztunnel::proxy=debug`, `access=debug`. Spans and field matches (`EnvFilter`'s
//! richer syntax) are not supported, as in Istio.

use std::fmt;
use std::io;
use std::str::FromStr;
use std::sync::Arc;

use serde::ser::SerializeMap;
use serde::Serializer;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields, MakeWriter};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{reload, Registry};

/// `LOG_FORMAT`: the environment variable Istio's ztunnel reads (`json` or plain).
pub const LOG_FORMAT_ENV: &str = "LOG_FORMAT";
/// `RUST_LOG`: the initial filter.
pub const RUST_LOG_ENV: &str = "RUST_LOG";

/// Which line format a process writes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Format {
    /// Istio's tab-separated text lines (the default).
    #[default]
    Plain,
    /// One JSON object per line (`LOG_FORMAT=json`, the charts' `logAsJson`).
    Json,
}

impl Format {
    /// `json` means JSON; anything else, or nothing, plain (as Istio's ztunnel).
    pub fn parse(value: Option<&str>) -> Format {
        match value {
            Some("json") => Format::Json,
            _ => Format::Plain,
        }
    }

    /// The format `LOG_FORMAT` asks for.
    pub fn from_env() -> Format {
        Format::parse(std::env::var(LOG_FORMAT_ENV).ok().as_deref())
    }
}

/// How one binary logs.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The filter when `RUST_LOG` is unset (or invalid), e.g. `info`.
    pub default_filter: String,
    /// Cut from the start of targets in plain lines, e.g. `ztunnel::` (Istio cuts its
    /// own crate's name; JSON keeps the whole target as `scope`).
    pub strip_prefix: Option<&'static str>,
    /// The line format.
    pub format: Format,
}

impl Settings {
    /// `RUST_LOG` (else `default_filter`) and `LOG_FORMAT` from the environment.
    pub fn from_env(default_filter: &str, strip_prefix: Option<&'static str>) -> Settings {
        let default_filter = std::env::var(RUST_LOG_ENV)
            .ok()
            .filter(|v| !v.trim().is_empty())
            .unwrap_or_else(|| default_filter.to_owned());
        Settings {
            default_filter,
            strip_prefix,
            format: Format::from_env(),
        }
    }
}

/// Why a filter change was refused; nothing changed.
#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    /// The directives do not parse as a `Targets` filter.
    #[error("parse failure: {0}")]
    InvalidFilter(#[from] tracing_subscriber::filter::ParseError),
    /// The subscriber holding the filter is gone.
    #[error("reload failure: {0}")]
    Reload(#[from] reload::Error),
}

/// Changes the filter of a running subscriber. Cheap to clone.
#[derive(Clone)]
pub struct LogHandle {
    handle: reload::Handle<Targets, Registry>,
    /// The filter the process started with (`RUST_LOG`), which a reset goes back to.
    default: Arc<str>,
}

impl LogHandle {
    /// The current filter, as `Targets` prints it (e.g. `access=debug,info`).
    pub fn current(&self) -> Result<String, LoggingError> {
        Ok(self.handle.with_current(|f| f.to_string())?)
    }

    /// Istio's update: the new filter is the current one (or, with `reset`, the
    /// starting one) followed by `level`'s directives, so later ones win. On an
    /// error nothing changes. Returns the new filter.
    pub fn set(&self, level: &str, reset: bool) -> Result<String, LoggingError> {
        let base = if reset {
            self.default.to_string()
        } else {
            self.current()?
        };
        let directives = match (base.is_empty(), level.is_empty()) {
            (_, true) => base,
            (true, false) => level.to_owned(),
            (false, false) => format!("{base},{level}"),
        };
        let filter = Targets::from_str(&directives)?;
        let shown = filter.to_string();
        self.handle.reload(filter)?;
        Ok(shown)
    }
}

/// Whether `level` is what Istio's ztunnel admits on `/logging?level=`: clauses
/// separated by `,`, each a bare level (`off`, `error`, `warn`, `info`, `debug`,
/// `trace`, lowercase) or a `target=level` directive.
pub fn valid_level_request(level: &str) -> bool {
    level.split(',').all(|clause| {
        matches!(
            clause,
            "off" | "error" | "warn" | "info" | "debug" | "trace"
        ) || (clause.contains('=') && Targets::from_str(clause).is_ok())
    })
}

/// Parses `directives`, falling back to `info` when they do not parse (so a bad
/// `RUST_LOG` never stops the process); the error is returned to be logged once the
/// subscriber is up.
fn initial_filter(directives: &str) -> (Targets, Arc<str>, Option<String>) {
    match Targets::from_str(directives) {
        Ok(filter) => (filter, directives.into(), None),
        Err(e) => (
            Targets::new().with_default(tracing::Level::INFO),
            "info".into(),
            Some(format!(
                "invalid log filter {directives:?} ({e}); using info"
            )),
        ),
    }
}

/// A subscriber writing to `writer` as `settings` say, and the handle on its filter.
/// [`init`] installs one writing to stdout; tests give their own writer.
pub fn subscriber<W>(
    settings: &Settings,
    writer: W,
) -> (
    impl Subscriber + Send + Sync + 'static,
    LogHandle,
    Option<String>,
)
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let (filter, default, problem) = initial_filter(&settings.default_filter);
    let (filter, handle) = reload::Layer::new(filter);
    let writer = Arc::new(writer);
    let plain = (settings.format == Format::Plain).then(|| {
        tracing_subscriber::fmt::layer()
            .event_format(PlainFormat {
                strip_prefix: settings.strip_prefix,
            })
            .fmt_fields(PlainFormat {
                strip_prefix: settings.strip_prefix,
            })
            .with_writer(SharedWriter(writer.clone()))
    });
    let json = (settings.format == Format::Json).then(|| {
        tracing_subscriber::fmt::layer()
            .event_format(JsonFormat)
            .fmt_fields(JsonFields::new())
            .with_writer(SharedWriter(writer.clone()))
    });
    let subscriber = tracing_subscriber::registry()
        .with(filter)
        .with(plain)
        .with(json);
    (subscriber, LogHandle { handle, default }, problem)
}

/// Installs the process's subscriber (stdout, as Istio's components log) and returns
/// the handle on its filter. A second call (tests) keeps the first subscriber.
pub fn init(settings: &Settings) -> LogHandle {
    let (subscriber, handle, problem) = subscriber(settings, io::stdout);
    let _ = tracing::subscriber::set_global_default(subscriber);
    if let Some(problem) = problem {
        tracing::warn!("{problem}");
    }
    handle
}

/// One writer shared by whichever format layer is active (only one is).
struct SharedWriter<W>(Arc<W>);

impl<'w, W: MakeWriter<'w>> MakeWriter<'w> for SharedWriter<W> {
    type Writer = W::Writer;
    fn make_writer(&'w self) -> Self::Writer {
        self.0.make_writer()
    }
}

/// Istio's plain line.
struct PlainFormat {
    strip_prefix: Option<&'static str>,
}

impl<S, N> FormatEvent<S, N> for PlainFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        SystemTime.format_time(&mut writer)?;
        let level = meta.level().as_str().to_ascii_lowercase();
        let target = meta.target();
        let target = self
            .strip_prefix
            .and_then(|p| target.strip_prefix(p))
            .unwrap_or(target);
        write!(writer, "\t{level}\t{target}")?;
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                write!(writer, ":{}", span.metadata().name())?;
                let extensions = span.extensions();
                if let Some(fields) = extensions.get::<FormattedFields<N>>() {
                    if !fields.is_empty() {
                        write!(writer, "{{{fields}}}")?;
                    }
                }
            }
        }
        if event.fields().next().is_some() {
            writer.write_char('\t')?;
        }
        ctx.format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

impl<'w> FormatFields<'w> for PlainFormat {
    fn format_fields<R: tracing_subscriber::field::RecordFields>(
        &self,
        writer: Writer<'w>,
        fields: R,
    ) -> fmt::Result {
        let mut visitor = PlainFields {
            writer,
            first: true,
            result: Ok(()),
        };
        fields.record(&mut visitor);
        visitor.result
    }
}

/// `message` first and unquoted, then `key=value` separated by spaces; strings are
/// quoted (`Debug`), `%display` and numbers are not.
struct PlainFields<'w> {
    writer: Writer<'w>,
    first: bool,
    result: fmt::Result,
}

impl Visit for PlainFields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.record_debug(field, &value)
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if self.result.is_err() {
            return;
        }
        self.result = match field.name() {
            name if name.starts_with("log.") => Ok(()),
            "message" => write!(self.writer, "{value:?}\t"),
            name => {
                let sep = if std::mem::take(&mut self.first) {
                    ""
                } else {
                    " "
                };
                write!(self.writer, "{sep}{name}={value:?}")
            }
        };
    }
}

/// Istio's JSON line.
struct JsonFormat;

impl<S, N> FormatEvent<S, N> for JsonFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let mut time = String::with_capacity(32);
        SystemTime.format_time(&mut Writer::new(&mut time))?;
        let mut fields = JsonFieldsVisitor::default();
        event.record(&mut fields);
        let mut line = Vec::with_capacity(256);
        let mut out = serde_json::Serializer::new(&mut line);
        let mut map = out.serialize_map(None).map_err(|_| fmt::Error)?;
        let mut entry =
            |k: &str, v: &serde_json::Value| map.serialize_entry(k, v).map_err(|_| fmt::Error);
        entry("level", &meta.level().as_str().to_ascii_lowercase().into())?;
        entry("time", &time.into())?;
        entry("scope", &meta.target().into())?;
        if let Some(message) = &fields.message {
            entry("message", message)?;
        }
        for (k, v) in &fields.fields {
            entry(k, v)?;
        }
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let extensions = span.extensions();
                if let Some(formatted) = extensions.get::<FormattedFields<N>>() {
                    // JsonFields wrote the span's fields as one JSON object.
                    let value = serde_json::from_str::<serde_json::Value>(formatted)
                        .unwrap_or_else(|_| formatted.to_string().into());
                    entry(span.metadata().name(), &value)?;
                }
            }
        }
        map.end().map_err(|_| fmt::Error)?;
        let line = String::from_utf8(line).map_err(|_| fmt::Error)?;
        writeln!(writer, "{line}")
    }
}

/// An event's fields as JSON values: numbers and booleans as such, the rest as strings.
#[derive(Default)]
struct JsonFieldsVisitor {
    message: Option<serde_json::Value>,
    fields: Vec<(&'static str, serde_json::Value)>,
}

impl JsonFieldsVisitor {
    fn put(&mut self, field: &Field, value: serde_json::Value) {
        match field.name() {
            "message" => self.message = Some(value),
            name if name.starts_with("log.") => {}
            name => self.fields.push((name, value)),
        }
    }
}

impl Visit for JsonFieldsVisitor {
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, value.into())
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, value.into())
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, value.into())
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, value.into())
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, value.into())
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.put(field, format!("{value:?}").into())
    }
}

#[cfg(test)]
#[path = "logging_tests.rs"]
mod tests;
