//! Logging: `tracing` with a filter that `/logging` can change at run time.

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter, Registry};

/// Changes the log filter of the running process.
#[derive(Clone)]
pub struct LogHandle {
    handle: reload::Handle<EnvFilter, Registry>,
}

impl LogHandle {
    /// Wraps a reload handle (the process's, or a test's own subscriber).
    pub fn from_handle(handle: reload::Handle<EnvFilter, Registry>) -> Self {
        LogHandle { handle }
    }

    /// Replaces the filter with `directives` (e.g. `debug` or `info,ztunnel::proxy=debug`).
    pub fn set(&self, directives: &str) -> Result<(), String> {
        let filter = EnvFilter::try_new(directives)
            .map_err(|e| format!("invalid log level {directives:?}: {e}"))?;
        self.handle.reload(filter).map_err(|e| e.to_string())
    }

    pub fn current(&self) -> String {
        self.handle
            .with_current(|f| f.to_string())
            .unwrap_or_else(|e| e.to_string())
    }
}

/// Installs the global subscriber; `RUST_LOG` sets the initial filter (default info).
pub fn init() -> LogHandle {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let (filter, handle) = reload::Layer::new(filter);
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
        .try_init();
    LogHandle { handle }
}
