//! Helpers the integration tests share: installer fixtures, directory snapshots,
//! polling, raw HTTP/1.1 over a socket, and a tracing layer that records events.

#![allow(dead_code)]

use cni_agent::install::conflist::PluginSettings;
use cni_agent::install::{InstallConfig, Installer};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Plugin socket access admitting whoever runs the tests (root in CI, where this is
/// the agent's default: root only).
pub fn access() -> cni_agent::plugin_api::UdsAccess {
    cni_agent::plugin_api::UdsAccess {
        peer_uid: euid(),
        metrics: cni_agent::ops::metrics::Metrics::new(),
    }
}

pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

pub fn settings(run_dir: &str) -> PluginSettings {
    PluginSettings {
        log_level: "info".into(),
        run_dir: run_dir.into(),
        exclude_namespaces: vec!["kube-system".into()],
        system_namespace: "istio-system".into(),
    }
}

/// A conf dir, a bin dir and a fake plugin binary under one temp dir.
pub struct Node {
    pub root: tempfile::TempDir,
    pub conf_dir: PathBuf,
    pub bin_dir: PathBuf,
    pub plugin_source: PathBuf,
}

impl Node {
    pub fn new() -> Self {
        let root = tempfile::tempdir().unwrap();
        let conf_dir = root.path().join("net.d");
        let bin_dir = root.path().join("bin");
        std::fs::create_dir_all(&conf_dir).unwrap();
        let plugin_source = root.path().join("istio-cni-build");
        std::fs::write(&plugin_source, b"#!/bin/sh\necho fake istio-cni\n").unwrap();
        Node {
            root,
            conf_dir,
            bin_dir,
            plugin_source,
        }
    }

    pub fn installer(&self, owned: Option<&str>) -> Installer {
        Installer::new(InstallConfig {
            conf_dir: self.conf_dir.clone(),
            bin_dir: self.bin_dir.clone(),
            plugin_source: self.plugin_source.clone(),
            owned_config: owned.map(Into::into),
            settings: settings("/var/run/istio-cni"),
        })
    }

    /// Copies every file of `dir` into the conf dir, dated an hour ago (a fresh file
    /// that does not parse counts as being written, not as broken).
    pub fn load(&self, dir: &Path) {
        let old = std::time::SystemTime::now() - Duration::from_secs(3600);
        for (name, bytes) in snapshot(dir) {
            let path = self.conf_dir.join(name);
            std::fs::write(&path, bytes).unwrap();
            let file = std::fs::File::options().write(true).open(&path).unwrap();
            file.set_modified(old).unwrap();
        }
    }
}

/// File name -> content of every entry of `dir` (temp files included, so leftovers
/// show up in comparisons).
pub fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect()
}

pub fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

/// A parsed HTTP response: status and body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: String,
}

/// Sends one hand-written HTTP/1.1 request (`Connection: close`) and reads the answer.
/// The write runs beside the read, so a server that answers early (413) is seen.
pub async fn exchange<S>(stream: S, method: &str, path: &str, body: &[u8]) -> Answer
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: agent\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    let (mut read, mut write) = tokio::io::split(stream);
    let writer = tokio::spawn(async move {
        let _ = write.write_all(&request).await;
        write
    });
    let mut raw = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), read.read_to_end(&mut raw)).await;
    drop(writer.await);
    parse_answer(&raw)
}

pub fn parse_answer(raw: &[u8]) -> Answer {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP status in {text:?}"));
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_string()
    };
    Answer { status, body }
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// One recorded `tracing` event.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub target: String,
    pub level: tracing::Level,
    pub fields: Vec<(String, String)>,
}

impl Recorded {
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A layer that records every event; install with `tracing::subscriber::set_default`
/// on a current-thread runtime so the server tasks log into it too.
#[derive(Clone, Default)]
pub struct Capture(pub Arc<Mutex<Vec<Recorded>>>);

impl Capture {
    pub fn events(&self) -> Vec<Recorded> {
        self.0.lock().unwrap().clone()
    }
}

struct Visitor(Vec<(String, String)>);

impl tracing::field::Visit for Visitor {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0
            .push((field.name().to_string(), format!("{value:?}")));
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.push((field.name().to_string(), value.to_string()));
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Capture {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let mut visitor = Visitor(Vec::new());
        event.record(&mut visitor);
        self.0.lock().unwrap().push(Recorded {
            target: event.metadata().target().to_string(),
            level: *event.metadata().level(),
            fields: visitor.0,
        });
    }
}

pub fn capture_subscriber() -> (Capture, impl tracing::Subscriber + Send + Sync) {
    use tracing_subscriber::layer::SubscriberExt;
    let capture = Capture::default();
    (
        capture.clone(),
        tracing_subscriber::registry().with(capture),
    )
}

pub fn arc<T>(t: T) -> Arc<T> {
    Arc::new(t)
}

/// Compares `actual` with `testdata/<dir>/<name>` (`UPDATE_GOLDEN=1` rewrites it).
pub fn assert_golden(dir: &str, name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(dir)
        .join(name);
    test_support::golden::assert_golden(&path, actual);
}
