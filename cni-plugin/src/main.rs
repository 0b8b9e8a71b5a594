//! `istio-cni`: the chained CNI plugin of the ambient mesh. The runtime runs it after the
//! primary plugin; it prints the primary result unchanged and, for pods that may be
//! ambient, holds the ADD until the node agent has redirected the pod's traffic.
//! See `README.md` in this crate for the netconf fields and the failure behaviour.

use cni_plugin::{log, plugin, version};
use shared_types::constants::PLUGIN_LOG_SOCKET;
use std::io::Write;
use std::process::ExitCode;

fn main() -> ExitCode {
    let get = |name: &str| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned());
    if get("CNI_COMMAND").unwrap_or_default().is_empty() {
        // As libcni's skel: a human ran us by hand.
        eprintln!(
            "istio-cni plugin v{}\nCNI protocol versions supported: {}",
            env!("CARGO_PKG_VERSION"),
            version::SpecVersion::SUPPORTED
                .map(|v| v.as_str())
                .join(", ")
        );
        return ExitCode::SUCCESS;
    }
    let mut log = log::Logger::new(log::Level::Info);
    let outcome = plugin::run(get, &mut std::io::stdin().lock(), &mut log);
    let (stdout, status) = match outcome.result {
        Ok(output) => (output, ExitCode::SUCCESS),
        Err((e, cni_version)) => {
            log.error(format!("{} (code {})", e.msg, e.code as u32));
            (Some(e.to_json(&cni_version)), ExitCode::FAILURE)
        }
    };
    let status = match stdout {
        Some(text) => {
            let mut out = std::io::stdout().lock();
            match writeln!(out, "{text}").and_then(|_| out.flush()) {
                Ok(()) => status,
                Err(e) => {
                    log.error(format!("writing the result to stdout: {e}"));
                    ExitCode::FAILURE
                }
            }
        }
        None => status,
    };
    log.flush_to(&outcome.run_dir.join(PLUGIN_LOG_SOCKET));
    status
}
