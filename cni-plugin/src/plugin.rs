//! One invocation end to end, in libcni `skel` order: environment (code 4), stdin,
//! netconf (6/7/1), attachment names (4), then the command.

use crate::args;
use crate::env::{Command, Invocation};
use crate::error::{CniError, Code};
use crate::gate;
use crate::log::Logger;
use crate::netconf::{self, NetConf};
use crate::result::CniResult;
use crate::version::{self, SpecVersion};
use shared_types::constants::DEFAULT_CNI_RUN_DIR;
use std::io::Read;
use std::path::PathBuf;

/// Netconf plus prevResult are a few KiB; anything near this is not a netconf.
const MAX_STDIN: u64 = 4 * 1024 * 1024;

/// What the invocation produced.
pub struct Outcome {
    /// Success: what to print on stdout (nothing for CHECK, DEL, STATUS, GC).
    /// Failure: the error and the `cniVersion` to print it with.
    pub result: Result<Option<String>, (CniError, String)>,
    /// The agent's run dir (for the log tee), the default until the netconf is read.
    pub run_dir: PathBuf,
}

pub fn run(
    env: impl Fn(&str) -> Option<String>,
    stdin: &mut dyn Read,
    log: &mut Logger,
) -> Outcome {
    let mut run_dir = PathBuf::from(DEFAULT_CNI_RUN_DIR);
    let mut cni_version = SpecVersion::LATEST.as_str().to_string();
    let result = dispatch(env, stdin, log, &mut run_dir, &mut cni_version)
        .map_err(|e| (e, cni_version.clone()));
    Outcome { result, run_dir }
}

fn dispatch(
    env: impl Fn(&str) -> Option<String>,
    stdin: &mut dyn Read,
    log: &mut Logger,
    run_dir: &mut PathBuf,
    cni_version: &mut String,
) -> Result<Option<String>, CniError> {
    let inv = Invocation::from_env(env)?;
    if inv.command == Command::Version {
        return Ok(Some(version::version_info()));
    }
    log.with_field("command", inv.command.name());
    if inv.command.has_attachment() {
        log.with_field("containerID", inv.container_id.clone());
    }

    let mut input = Vec::new();
    stdin
        .take(MAX_STDIN + 1)
        .read_to_end(&mut input)
        .map_err(|e| CniError::new(Code::IoFailure, format!("error reading from stdin: {e}")))?;
    if input.len() as u64 > MAX_STDIN {
        return Err(CniError::new(
            Code::DecodingFailure,
            format!("network config on stdin is larger than {MAX_STDIN} bytes"),
        ));
    }
    *cni_version = netconf::error_version(&input);
    let conf = NetConf::parse(&input)?;
    *run_dir = conf.run_dir.clone();
    log.set_level(conf.log_level);
    if let Some(warning) = &conf.log_level_warning {
        log.warn(warning.clone());
    }
    inv.validate_attachment()?;

    match &inv.command {
        Command::Add => add(&conf, &inv, log).map(Some),
        Command::Check => {
            require(&conf, SpecVersion::V0_4_0, "CHECK")?;
            // Nothing of ours to check (teardown and repair are the agent's); the
            // prevResult must still make sense.
            if let Some(raw) = &conf.prev_result {
                CniResult::parse(raw, conf.cni_version)?;
            }
            Ok(None)
        }
        // Teardown is driven by the agent's pod watch; DEL must never block it.
        Command::Del => Ok(None),
        Command::Status => {
            require(&conf, SpecVersion::V1_1_0, "STATUS")?;
            Ok(None)
        }
        // We hold no per-attachment state to collect.
        Command::Gc => {
            require(&conf, SpecVersion::V1_1_0, "GC")?;
            Ok(None)
        }
        Command::Version => Ok(Some(version::version_info())),
        Command::Unknown(name) => Err(CniError::new(
            Code::InvalidEnvironment,
            format!("unknown CNI_COMMAND: {name}"),
        )),
    }
}

fn require(conf: &NetConf, min: SpecVersion, command: &str) -> Result<(), CniError> {
    if conf.cni_version < min {
        return Err(CniError::new(
            Code::IncompatibleVersion,
            format!("config version does not allow {command}"),
        )
        .details(format!(
            "{command} needs cniVersion {min} or later, config is {}",
            conf.cni_version
        )));
    }
    Ok(())
}

/// ADD: decode and convert the prevResult first (a bad one fails before anyone waits),
/// then let the gate decide, then print the result unchanged.
fn add(conf: &NetConf, inv: &Invocation, log: &mut Logger) -> Result<String, CniError> {
    let result = match &conf.prev_result {
        Some(raw) => CniResult::parse(raw, conf.cni_version)?.convert(conf.cni_version),
        None => CniResult::empty(conf.cni_version),
    };
    let k8s = args::parse(&inv.args)?;
    if let Some(pod) = k8s.pod() {
        log.with_field("pod", pod);
    }
    gate::admit(conf, inv, &k8s, &result, log)?;
    Ok(result.to_json())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};
    use std::collections::HashMap;

    fn invoke(command: &str, stdin: &str, cni_args: &str) -> Outcome {
        let env: HashMap<&str, String> = [
            ("CNI_COMMAND", command),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_NETNS", "/var/run/netns/p"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/opt/cni/bin"),
            ("CNI_ARGS", cni_args),
        ]
        .into_iter()
        .map(|(k, v)| (k, v.to_string()))
        .collect();
        run(
            |k| env.get(k).cloned(),
            &mut stdin.as_bytes(),
            &mut Logger::quiet(),
        )
    }

    fn code(outcome: Outcome) -> (Code, String) {
        let (e, version) = outcome.result.unwrap_err();
        (e.code, version)
    }

    #[test]
    fn add_without_pod_passes_prev_result_through_converted() {
        let conf = json!({
            "cniVersion": "0.4.0", "name": "net", "type": "istio-cni", "ambient_enabled": true,
            "prevResult": {"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.2/24"}]}
        });
        let out = invoke("ADD", &conf.to_string(), "")
            .result
            .unwrap()
            .unwrap();
        let out: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            out,
            json!({"cniVersion": "0.4.0", "ips": [{"version": "4", "address": "10.0.0.2/24"}]})
        );
    }

    #[test]
    fn add_without_prev_result_prints_empty_result() {
        let out = invoke("ADD", r#"{"cniVersion":"1.1.0","name":"n"}"#, "")
            .result
            .unwrap()
            .unwrap();
        assert_eq!(out, r#"{"cniVersion":"1.1.0"}"#);
    }

    #[test]
    fn error_codes() {
        let ok = r#"{"cniVersion":"1.0.0","name":"n"}"#;
        assert_eq!(code(invoke("ADD", "{", "")).0, Code::DecodingFailure);
        assert_eq!(
            code(invoke("ADD", r#"{"cniVersion":"1.0.0"}"#, "")).0,
            Code::InvalidNetworkConfig
        );
        assert_eq!(
            code(invoke("ADD", r#"{"cniVersion":"0.1.0","name":"n"}"#, "")),
            (Code::IncompatibleVersion, "1.1.0".to_string())
        );
        assert_eq!(
            code(invoke("ADD", ok, "K8S_POD_NAME=a;BOGUS=1")),
            (Code::InvalidEnvironment, "1.0.0".to_string())
        );
        assert_eq!(code(invoke("BOGUS", ok, "")).0, Code::InvalidEnvironment);
        let v03 = r#"{"cniVersion":"0.3.1","name":"n"}"#;
        assert_eq!(
            code(invoke("CHECK", v03, "")),
            (Code::IncompatibleVersion, "0.3.1".into())
        );
        assert_eq!(code(invoke("STATUS", ok, "")).0, Code::IncompatibleVersion);
        assert_eq!(code(invoke("GC", ok, "")).0, Code::IncompatibleVersion);
    }

    #[test]
    fn check_del_status_gc_print_nothing() {
        let v11 = r#"{"cniVersion":"1.1.0","name":"n","prevResult":{"cniVersion":"1.1.0"}}"#;
        for command in ["CHECK", "DEL", "STATUS", "GC"] {
            assert_eq!(invoke(command, v11, "").result.unwrap(), None, "{command}");
        }
        // DEL ignores CNI_ARGS and an odd prevResult.
        let odd = r#"{"cniVersion":"1.0.0","name":"n","prevResult":{"ips":"x"}}"#;
        assert_eq!(invoke("DEL", odd, "garbage").result.unwrap(), None);
        assert_eq!(code(invoke("CHECK", odd, "")).0, Code::DecodingFailure);
    }

    #[test]
    fn run_dir_comes_from_the_netconf() {
        let o = invoke(
            "DEL",
            r#"{"cniVersion":"1.0.0","name":"n","cni_agent_run_dir":"/x"}"#,
            "",
        );
        assert_eq!(o.run_dir, PathBuf::from("/x"));
        let o = invoke("DEL", "{", "");
        assert_eq!(o.run_dir, PathBuf::from(DEFAULT_CNI_RUN_DIR));
    }
}
