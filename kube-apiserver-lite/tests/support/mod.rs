//! Helpers the API-server test binaries share: an in-process server, kube-rs
//! clients for it, the real binary's readiness, and a real kubectl.
#![allow(dead_code)] // each test binary uses its own subset

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use kube::Client;
use kube_apiserver_lite::{ApiServer, Control, Options};
use test_support::process::ChildGuard;

pub const WAIT: Duration = Duration::from_secs(20);

/// An in-process server on a free port and a kube-rs client for it.
pub async fn start(options: Options) -> (Control, Client) {
    let server = ApiServer::bind_with("127.0.0.1:0", options)
        .await
        .expect("bind");
    let client = client_for(&server.url());
    (server.spawn(), client)
}

pub fn client_for(url: &str) -> Client {
    let config = kube::Config::new(url.parse().expect("server url"));
    Client::try_from(config).expect("client")
}

pub fn api_code(err: kube::Error) -> u16 {
    match err {
        kube::Error::Api(status) => status.code,
        other => panic!("expected an API error, got {other}"),
    }
}

/// kubectl from scripts/install-chart-tools.sh, else one on PATH.
pub fn kubectl() -> Option<PathBuf> {
    let candidates = [
        PathBuf::from("/usr/local/bin/kubectl"),
        PathBuf::from("kubectl"),
    ];
    let found = candidates.into_iter().find(|k| {
        Command::new(k)
            .args(["version", "--client"])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    test_support::prerequisite(
        found.is_some(),
        "kubectl not installed (run scripts/install-chart-tools.sh)",
    )
    .then_some(found)
    .flatten()
}

pub struct Kubectl {
    pub bin: PathBuf,
    pub kubeconfig: PathBuf,
    pub cache: PathBuf,
}

impl Kubectl {
    /// kubectl `bin` against the server at `url`, its kubeconfig and cache in `dir`.
    pub fn for_server(bin: PathBuf, url: &str, dir: &Path) -> Self {
        let kubeconfig = dir.join("kubeconfig");
        kube_apiserver_lite::write_kubeconfig(&kubeconfig, url).expect("write kubeconfig");
        Kubectl {
            bin,
            kubeconfig,
            cache: dir.join("cache"),
        }
    }

    /// Runs kubectl off the async runtime; returns stdout, panics with stderr on failure.
    pub async fn run(&self, args: &[&str]) -> String {
        let (ok, stdout, stderr) = self.try_run(args).await;
        assert!(ok, "kubectl {args:?} failed: {stderr}{stdout}");
        stdout
    }

    /// Runs kubectl off the async runtime: (success, stdout, stderr).
    pub async fn try_run(&self, args: &[&str]) -> (bool, String, String) {
        let mut cmd = Command::new(&self.bin);
        cmd.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(&self.cache)
            .args(args);
        let output = tokio::task::spawn_blocking(move || cmd.output())
            .await
            .unwrap()
            .expect("run kubectl");
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

pub async fn wait_ready(client: &Client, server: &ChildGuard) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while client.apiserver_version().await.is_err() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "server not ready: {}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
