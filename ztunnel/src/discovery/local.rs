//! `LOCAL_XDS_PATH`: workloads, services and policies from a YAML file, watched for changes.
//!
//! The format is Istio ztunnel's local config (top-level `workloads`, `services`,
//! `policies`), so a file written for Istio loads unchanged. Unlike Istio we reload on
//! change: the parent directory is watched (editors' rename-writes and Kubernetes
//! ConfigMap symlink swaps replace the file rather than write it), and a bad edit keeps
//! the last good config instead of emptying the mesh.

use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::event::{AccessKind, AccessMode, EventKind};
use notify::{RecursiveMode, Watcher};
use prometheus_client::metrics::counter::Counter;
use serde::Deserialize;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::local_fields::unknown_fields;
use crate::state::service::NamespacedHostname;
use crate::state::{Authorization, ProxyState, Service, StateStore, Workload};
use mesh_model::serde_util::null_as_default;

/// Name of this source in the [`StateStore`].
pub const SOURCE: &str = "local";
/// Events arriving within this window are handled as one change.
const DEBOUNCE: Duration = Duration::from_millis(100);
/// Used only when the OS watcher cannot be started (e.g. inotify limits reached).
const POLL_INTERVAL: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("cannot read local config {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("local config is not UTF-8: {0}")]
    NotUtf8(#[from] std::string::FromUtf8Error),
    /// Syntax or type error; `message` already names the field path and position.
    #[error("invalid local config: {message}")]
    Yaml {
        line: Option<usize>,
        column: Option<usize>,
        message: String,
    },
    /// Parsed, but inconsistent (e.g. a `services` key that is not `namespace/hostname`).
    #[error("invalid local config: {0}")]
    Invalid(String),
}

impl From<serde_yaml::Error> for DiscoveryError {
    fn from(e: serde_yaml::Error) -> Self {
        let loc = e.location();
        DiscoveryError::Yaml {
            line: loc.as_ref().map(|l| l.line()),
            column: loc.as_ref().map(|l| l.column()),
            message: e.to_string(),
        }
    }
}

/// Istio's `LocalConfig`: every section optional.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct LocalConfig {
    #[serde(deserialize_with = "null_as_default")]
    workloads: Vec<Workload>,
    #[serde(deserialize_with = "null_as_default")]
    services: Vec<Service>,
    #[serde(deserialize_with = "null_as_default")]
    policies: Vec<Authorization>,
}

/// Parses and validates a local config. Unknown fields are ignored with a warning (newer
/// Istio versions add fields); malformed values are errors.
pub fn parse_local_config(yaml: &str) -> Result<ProxyState, DiscoveryError> {
    let cfg: Option<LocalConfig> = serde_yaml::from_str(yaml)?;
    let cfg = cfg.unwrap_or_default();
    if let Ok(doc) = serde_yaml::from_str::<serde_yaml::Value>(yaml) {
        for field in unknown_fields(&doc) {
            warn!(%field, "ignoring unknown field in local config");
        }
    }
    validate(&cfg)?;

    let mut state = ProxyState::new();
    let mut seen_ips = std::collections::HashMap::new();
    for w in cfg.workloads {
        for ip in &w.workload_ips {
            if let Some(other) = seen_ips.insert(*ip, w.to_string()) {
                warn!(%ip, first = %other, second = %w, "two workloads claim the same IP");
            }
        }
        state.insert_workload(w);
    }
    for s in cfg.services {
        state.insert_service(s);
    }
    for p in cfg.policies {
        state.insert_policy(p);
    }
    Ok(state)
}

fn validate(cfg: &LocalConfig) -> Result<(), DiscoveryError> {
    let invalid = |s: String| Err(DiscoveryError::Invalid(s));
    for (i, w) in cfg.workloads.iter().enumerate() {
        let at = format!("workloads[{i}] ({})", display_name(&w.name, &w.uid));
        if w.namespace.is_empty() {
            return invalid(format!("{at}: namespace is required"));
        }
        for key in w.services.keys() {
            if let Err(e) = key.parse::<NamespacedHostname>() {
                return invalid(format!("{at}: services: {e}"));
            }
        }
        for key in &w.authorization_policies {
            if !key.contains('/') {
                warn!(workload = %w, policy = %key,
                    "authorizationPolicies entries are \"namespace/name\"; this one never matches");
            }
        }
    }
    for (i, s) in cfg.services.iter().enumerate() {
        let at = format!("services[{i}] ({})", display_name(&s.name, &s.hostname));
        if s.namespace.is_empty() || s.hostname.is_empty() {
            return invalid(format!("{at}: namespace and hostname are required"));
        }
    }
    for (i, p) in cfg.policies.iter().enumerate() {
        if p.name.is_empty() {
            return invalid(format!("policies[{i}]: name is required"));
        }
    }
    Ok(())
}

fn display_name<'a>(name: &'a str, fallback: &'a str) -> &'a str {
    if name.is_empty() {
        fallback
    } else {
        name
    }
}

async fn read(path: &Path) -> Result<Vec<u8>, DiscoveryError> {
    tokio::fs::read(path)
        .await
        .map_err(|source| DiscoveryError::Io {
            path: path.to_path_buf(),
            source,
        })
}

fn parse_bytes(bytes: &[u8]) -> Result<ProxyState, DiscoveryError> {
    let text = String::from_utf8(bytes.to_vec())?;
    parse_local_config(&text)
}

fn describe_local_config(state: &ProxyState) -> String {
    let (w, s, p) = state.counts();
    format!("{w} workloads, {s} services, {p} policies")
}

/// A file one source of the [`StateStore`] is read from, followed as it changes.
pub struct WatchedFile {
    pub path: PathBuf,
    /// The store's source it replaces (so several files and xDS do not overwrite
    /// each other).
    pub source: &'static str,
    pub parse: fn(&[u8]) -> Result<ProxyState, DiscoveryError>,
    /// What a loaded state holds, for the log.
    pub describe: fn(&ProxyState) -> String,
}

/// Loads `path` into `store` under source "local" (error if this first load fails), then
/// watches it and reloads on change until `cancel` fires. An invalid file keeps the last
/// good config, logs a warning and increments `errors`; a good reload increments
/// `reloads`.
pub async fn watch_local_file(
    path: PathBuf,
    store: StateStore,
    reloads: Counter,
    errors: Counter,
    cancel: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, DiscoveryError> {
    let file = WatchedFile {
        path,
        source: SOURCE,
        parse: parse_bytes,
        describe: describe_local_config,
    };
    watch_file(file, store, reloads, errors, cancel).await
}

/// [`watch_local_file`] for any [`WatchedFile`].
pub async fn watch_file(
    file: WatchedFile,
    store: StateStore,
    reloads: Counter,
    errors: Counter,
    cancel: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, DiscoveryError> {
    let bytes = read(&file.path).await?;
    let state = (file.parse)(&bytes)?;
    info!(path = %file.path.display(), content = (file.describe)(&state), "local config loaded");
    store.replace_source(file.source, state);

    let (tx, rx) = mpsc::unbounded_channel();
    let watcher = match start_watcher(&file.path, tx) {
        Ok(w) => Some(w),
        Err(e) => {
            warn!(path = %file.path.display(), error = %e, "cannot watch local config; polling instead");
            None
        }
    };
    let mut reloader = Reloader {
        file,
        store,
        reloads,
        errors,
        last_attempt: Some(bytes),
        last_read_failed: false,
    };
    let mut rx = watcher.is_some().then_some(rx);
    Ok(tokio::spawn(async move {
        // Dropping the watcher stops the OS watch; keep it for the task's lifetime.
        let _watcher = watcher;
        loop {
            let changed = async {
                match rx.as_mut() {
                    Some(rx) => rx.recv().await.is_some(),
                    None => {
                        tokio::time::sleep(POLL_INTERVAL).await;
                        true
                    }
                }
            };
            tokio::select! {
                _ = cancel.cancelled() => break,
                got = changed => if !got {
                    warn!("local config watcher stopped; polling instead");
                    rx = None;
                },
            }
            // Let a burst of events (truncate, write, rename) settle, then read once.
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tokio::time::sleep(DEBOUNCE) => {}
            }
            if let Some(rx) = rx.as_mut() {
                while rx.try_recv().is_ok() {}
            }
            reloader.reload().await;
        }
        debug!("local config watch stopped");
    }))
}

/// Watches the file's directory; only write-like events are forwarded (our own reads
/// would otherwise wake us again).
fn start_watcher(
    path: &Path,
    tx: mpsc::UnboundedSender<()>,
) -> notify::Result<notify::RecommendedWatcher> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut watcher =
        notify::recommended_watcher(move |ev: notify::Result<notify::Event>| match ev {
            Ok(ev) if is_change(&ev.kind) => {
                let _ = tx.send(());
            }
            Ok(_) => {}
            Err(e) => warn!(error = %e, "local config watch error"),
        })?;
    watcher.watch(&dir, RecursiveMode::NonRecursive)?;
    Ok(watcher)
}

fn is_change(kind: &EventKind) -> bool {
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        _ => true,
    }
}

/// Re-reads the file after a change and publishes it if it is new and valid.
struct Reloader {
    file: WatchedFile,
    store: StateStore,
    reloads: Counter,
    errors: Counter,
    /// Bytes of the last parse attempt (good or bad), so unrelated events in the
    /// directory and repeated events for one edit cost a read, not a reload or an error.
    last_attempt: Option<Vec<u8>>,
    last_read_failed: bool,
}

impl Reloader {
    async fn reload(&mut self) {
        let mut bytes = match read(&self.file.path).await {
            Ok(b) => b,
            Err(e) => {
                // Missing while being replaced, or deleted: keep serving the last config.
                if !self.last_read_failed {
                    warn!(error = %e, "local config unreadable; keeping the last good config");
                    self.errors.inc();
                }
                self.last_read_failed = true;
                self.last_attempt = None;
                return;
            }
        };
        self.last_read_failed = false;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            // Likely caught between truncate and write: look once more before
            // accepting an empty mesh.
            tokio::time::sleep(DEBOUNCE).await;
            if let Ok(again) = read(&self.file.path).await {
                bytes = again;
            }
        }
        if self.last_attempt.as_deref() == Some(bytes.as_slice()) {
            return;
        }
        let result = (self.file.parse)(&bytes);
        self.last_attempt = Some(bytes);
        match result {
            Ok(state) => {
                let content = (self.file.describe)(&state);
                self.store.replace_source(self.file.source, state);
                self.reloads.inc();
                info!(path = %self.file.path.display(), content, "local config reloaded");
            }
            Err(e) => {
                self.errors.inc();
                warn!(path = %self.file.path.display(), error = %e,
                    "invalid local config; keeping the last good config");
            }
        }
    }
}

#[cfg(test)]
#[path = "local_tests.rs"]
mod tests;
