//! Running the mesh's own binaries inside test namespaces, and reading what they
//! report (readiness, Prometheus metrics, admin dumps).

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use test_support::netns::Netns;
use test_support::poll::wait_for;
use test_support::process::ChildGuard;
use test_support::workspace_binary;

/// Writes a fresh mesh root in Istio's plug-in CA layout.
pub fn ca_init(dir: &Path) -> Result<()> {
    // RSA-2048, as Istio's self-signed root (and `istioctl-lite ca init`).
    let ca =
        mesh_ca::CertificateAuthority::generate_root("cluster.local", mesh_ca::RootKey::Rsa2048)?;
    ca.write(dir)?;
    Ok(())
}

/// Path of a workspace binary, with a clear error when it was not built.
pub fn binary(name: &str) -> Result<std::path::PathBuf> {
    let path = workspace_binary(name);
    if !path.exists() {
        bail!(
            "{} is missing: run `cargo build --workspace --bins` first (make test does)",
            path.display()
        );
    }
    Ok(path)
}

/// A dedicated-mode ztunnel in `ns`, configured the way an Istio user would
/// (environment variables only), killed when dropped.
pub fn start_dedicated_ztunnel(
    ns: &Netns,
    workload_info: &str,
    ca_dir: &Path,
    local_config: &Path,
) -> Result<ChildGuard> {
    start_dedicated_ztunnel_with(ns, workload_info, ca_dir, local_config, &[])
}

/// [`start_dedicated_ztunnel`] with more environment variables (`extra_env`).
pub fn start_dedicated_ztunnel_with(
    ns: &Netns,
    workload_info: &str,
    ca_dir: &Path,
    local_config: &Path,
    extra_env: &[(&str, &str)],
) -> Result<ChildGuard> {
    let mut env = vec![
        ("PROXY_MODE", "dedicated"),
        ("PROXY_WORKLOAD_INFO", workload_info),
    ];
    env.extend_from_slice(extra_env);
    start_ztunnel(ns, ca_dir, local_config, &env)
}

/// A shared-mode (node proxy) ztunnel in the node namespace `ns`, driven over ZDS
/// at `inpod_uds`, killed when dropped. It is ready once the agent's first snapshot
/// is applied, so the agent must be listening first.
pub fn start_shared_ztunnel(
    ns: &Netns,
    inpod_uds: &Path,
    ca_dir: &Path,
    local_config: &Path,
    extra_env: &[(&str, &str)],
) -> Result<ChildGuard> {
    let uds = inpod_uds.to_str().context("INPOD_UDS path")?;
    let mut env = vec![("PROXY_MODE", "shared"), ("INPOD_UDS", uds)];
    env.extend_from_slice(extra_env);
    start_ztunnel(ns, ca_dir, local_config, &env)
}

/// A waypoint in `ns` serving the dedicated workload `workload_info`
/// (`namespace/name/service-account`), with no control plane: the CA and local config
/// given (as a ztunnel's), plus `env`; returns once it reports ready.
pub fn start_waypoint(
    ns: &Netns,
    workload_info: &str,
    ca_dir: &Path,
    local_config: &Path,
    extra_env: &[(&str, &str)],
) -> Result<ChildGuard> {
    let mut env = vec![("PROXY_WORKLOAD_INFO", workload_info)];
    env.extend_from_slice(extra_env);
    start_proxy("waypoint", ns, ca_dir, local_config, &env)
}

/// ztunnel in `ns` with no control plane, the CA and local config given, plus `env`;
/// returns once it reports ready. With `ZTUNNEL_TEST_WRAPPER` set (a command line,
/// split at whitespace, e.g. `valgrind --tool=callgrind`), ztunnel runs under it.
fn start_ztunnel(
    ns: &Netns,
    ca_dir: &Path,
    local_config: &Path,
    env: &[(&str, &str)],
) -> Result<ChildGuard> {
    start_proxy("ztunnel", ns, ca_dir, local_config, env)
}

/// `program` (ztunnel, or the waypoint built on it) as [`start_ztunnel`] runs it.
fn start_proxy(
    program: &str,
    ns: &Netns,
    ca_dir: &Path,
    local_config: &Path,
    env: &[(&str, &str)],
) -> Result<ChildGuard> {
    let ztunnel = binary(program)?;
    let wrapper = match program {
        "ztunnel" => std::env::var("ZTUNNEL_TEST_WRAPPER").unwrap_or_default(),
        _ => String::new(),
    };
    let mut cmd = match wrapper.split_whitespace().collect::<Vec<_>>().split_first() {
        Some((program, args)) => {
            let mut cmd = ns.command(program);
            cmd.args(args).arg(&ztunnel);
            cmd
        }
        None => ns.command(ztunnel.to_str().context("path")?),
    };
    cmd.env("XDS_ADDRESS", "")
        .env("CA_CERTS_DIR", ca_dir)
        .env("LOCAL_XDS_PATH", local_config)
        .env(
            "RUST_LOG",
            std::env::var("ZTUNNEL_TEST_LOG").unwrap_or_else(|_| "info".into()),
        );
    for (k, v) in env {
        cmd.env(k, v);
    }
    let guard = ChildGuard::spawn(&format!("{program}-{}", ns.name()), cmd)?;
    wait_ready(ns, &guard)?;
    Ok(guard)
}

/// Waits until ztunnel's readiness endpoint answers 200.
pub fn wait_ready(ns: &Netns, ztunnel: &ChildGuard) -> Result<()> {
    wait_for("ztunnel readiness", Duration::from_secs(20), || {
        http_get(ns, "http://127.0.0.1:15021/healthz/ready").ok()
    })
    .with_context(|| format!("ztunnel log:\n{}", ztunnel.log()))?;
    Ok(())
}

/// HTTP GET from inside `ns` (via `e2e-app get`); the body on a 200.
pub fn http_get(ns: &Netns, url: &str) -> Result<String> {
    ns.stdout(&[binary("e2e-app")?.to_str().context("path")?, "get", url])
}

/// Runs `e2e-app send` in `ns`: `bytes` to a sink at `target`; returns the sink's
/// JSON answer (bytes, SHA-256, the peer address it saw).
pub fn send_from(ns: &Netns, target: &str, bytes: u64) -> Result<serde_json::Value> {
    let app = binary("e2e-app")?;
    let out = ns.stdout(&[
        app.to_str().context("path")?,
        "send",
        "--connect",
        target,
        "--bytes",
        &bytes.to_string(),
    ])?;
    Ok(serde_json::from_str(out.trim())?)
}

/// Prometheus text from ztunnel's metrics port in `ns`.
pub fn ztunnel_metrics(ns: &Netns) -> Result<String> {
    http_get(ns, "http://127.0.0.1:15020/metrics")
}

/// How many times the proxy (ztunnel or waypoint) in `ns` has read its local config
/// files, whether it took them or refused them: what a test waits on after writing one.
pub fn config_loads(ns: &Netns) -> Result<f64> {
    let metrics = ztunnel_metrics(ns)?;
    Ok([
        "ztunnel_local_config_reloads_total",
        "ztunnel_local_config_errors_total",
    ]
    .iter()
    .map(|name| metric_sum(&metrics, name, &[]))
    .sum())
}

/// Sum of every sample of `name` whose labels include all of `labels`.
pub fn metric_sum(exposition: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    exposition
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, label_text) = series.split_once('{').unwrap_or((series, ""));
            if metric != name {
                return None;
            }
            let all = labels
                .iter()
                .all(|(k, v)| label_text.contains(&format!("{k}=\"{v}\"")));
            all.then(|| value.parse::<f64>().ok()).flatten()
        })
        .sum()
}
