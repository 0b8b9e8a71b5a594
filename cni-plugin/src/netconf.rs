//! The network configuration on stdin: the standard fields, the ones Istio's plugin reads
//! (`plugin_log_level`, `cni_agent_run_dir`, `ambient_enabled`, `exclude_namespaces`,
//! `pod_namespace`) and ours (`agent_timeout_seconds`). Unknown fields (Istio's
//! `enablement_selectors`, `kubernetes`, ...) are accepted and ignored, so an Istio
//! conflist works unchanged. `null` counts as absent.

use crate::env::is_valid_id;
use crate::error::{CniError, Code};
use crate::log::Level;
use crate::version::SpecVersion;
use serde::Deserialize;
use shared_types::cni::DEFAULT_EXCLUDED_NAMESPACES;
use shared_types::constants::{DEFAULT_CNI_RUN_DIR, SYSTEM_NAMESPACE};
use std::path::PathBuf;
use std::time::Duration;

/// How long ADD waits for the agent by default: the agent answers once ztunnel acked
/// the pod, well under the runtime's own sandbox timeout (2 minutes in kubelet).
pub const DEFAULT_AGENT_TIMEOUT_SECONDS: u64 = 30;
/// Upper bound, to catch a value written in milliseconds.
pub const MAX_AGENT_TIMEOUT_SECONDS: u64 = 300;

/// The decoded, defaulted and validated configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct NetConf {
    pub cni_version: SpecVersion,
    pub name: String,
    pub plugin_type: String,
    /// Parsed later by [`crate::result`], only by the commands that use it.
    pub prev_result: Option<serde_json::Value>,
    /// `plugin_log_level`: debug|info|warn|error|none (default info).
    pub log_level: Level,
    /// `cni_agent_run_dir`: where the agent's sockets and state live.
    pub run_dir: PathBuf,
    /// `ambient_enabled`: without it the plugin only passes results through (default false).
    pub ambient_enabled: bool,
    /// `exclude_namespaces`: pods here never wait (default `["kube-system"]`).
    pub exclude_namespaces: Vec<String>,
    /// `pod_namespace`: the mesh's system namespace, home of its DaemonSets.
    pub system_namespace: String,
    /// `agent_timeout_seconds`: how long ADD waits for the agent's answer.
    pub agent_timeout: Duration,
    /// Set when `plugin_log_level` was not understood (we log it and use info).
    pub log_level_warning: Option<String>,
}

#[derive(Deserialize)]
struct Raw {
    #[serde(rename = "cniVersion")]
    cni_version: Option<String>,
    name: Option<String>,
    #[serde(rename = "type")]
    plugin_type: Option<String>,
    #[serde(rename = "prevResult")]
    prev_result: Option<serde_json::Value>,
    plugin_log_level: Option<String>,
    cni_agent_run_dir: Option<String>,
    ambient_enabled: Option<bool>,
    exclude_namespaces: Option<Vec<String>>,
    pod_namespace: Option<String>,
    agent_timeout_seconds: Option<u64>,
}

/// The `cniVersion` to echo in an error, read leniently from whatever stdin holds.
pub fn error_version(stdin: &[u8]) -> String {
    #[derive(Deserialize)]
    struct V {
        #[serde(rename = "cniVersion")]
        cni_version: Option<serde_json::Value>,
    }
    serde_json::from_slice::<V>(stdin)
        .ok()
        .and_then(|v| v.cni_version)
        .and_then(|v| v.as_str().and_then(SpecVersion::parse))
        .unwrap_or(SpecVersion::LATEST)
        .as_str()
        .to_string()
}

impl NetConf {
    /// Decodes stdin. Order and codes follow libcni's skel: undecodable JSON is 6, a
    /// missing or invalid network name is 7, an unsupported `cniVersion` is 1; our own
    /// fields with impossible values are 7.
    pub fn parse(stdin: &[u8]) -> Result<Self, CniError> {
        let raw: Raw = serde_json::from_slice(stdin).map_err(|e| {
            CniError::new(
                Code::DecodingFailure,
                format!("failed to decode network config: {e}"),
            )
        })?;
        let name = raw.name.unwrap_or_default();
        if name.is_empty() {
            return Err(CniError::new(
                Code::InvalidNetworkConfig,
                "missing network name",
            ));
        }
        if !is_valid_id(&name) {
            return Err(CniError::new(
                Code::InvalidNetworkConfig,
                "invalid characters found in network name",
            )
            .details(name));
        }
        let cni_version = SpecVersion::from_config(raw.cni_version.as_deref().unwrap_or(""))?;
        let timeout = raw
            .agent_timeout_seconds
            .unwrap_or(DEFAULT_AGENT_TIMEOUT_SECONDS);
        if !(1..=MAX_AGENT_TIMEOUT_SECONDS).contains(&timeout) {
            return Err(CniError::new(
                Code::InvalidNetworkConfig,
                format!(
                    "agent_timeout_seconds must be between 1 and {MAX_AGENT_TIMEOUT_SECONDS}, got {timeout}"
                ),
            ));
        }
        let run_dir = raw
            .cni_agent_run_dir
            .filter(|d| !d.is_empty())
            .unwrap_or_else(|| DEFAULT_CNI_RUN_DIR.to_string());
        let (log_level, log_level_warning) = match raw.plugin_log_level.as_deref() {
            None | Some("") => (Level::Info, None),
            Some(text) => match Level::parse(text) {
                Some(level) => (level, None),
                None => (
                    Level::Info,
                    Some(format!("unknown plugin_log_level {text:?}, using info")),
                ),
            },
        };
        Ok(NetConf {
            cni_version,
            name,
            plugin_type: raw.plugin_type.unwrap_or_default(),
            prev_result: raw.prev_result,
            log_level,
            run_dir: PathBuf::from(run_dir),
            ambient_enabled: raw.ambient_enabled.unwrap_or(false),
            exclude_namespaces: raw
                .exclude_namespaces
                .unwrap_or_else(|| DEFAULT_EXCLUDED_NAMESPACES.map(String::from).to_vec()),
            system_namespace: raw
                .pod_namespace
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| SYSTEM_NAMESPACE.to_string()),
            agent_timeout: Duration::from_secs(timeout),
            log_level_warning,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<NetConf, CniError> {
        NetConf::parse(json.as_bytes())
    }

    #[test]
    fn defaults() {
        let c =
            parse(r#"{"cniVersion":"1.0.0","name":"k8s-pod-network","type":"istio-cni"}"#).unwrap();
        assert_eq!(c.cni_version, SpecVersion::V1_0_0);
        assert_eq!(c.run_dir, PathBuf::from("/var/run/istio-cni"));
        assert!(!c.ambient_enabled);
        assert_eq!(c.exclude_namespaces, vec!["kube-system".to_string()]);
        assert_eq!(c.system_namespace, "istio-system");
        assert_eq!(c.agent_timeout, Duration::from_secs(30));
        assert_eq!(c.log_level, Level::Info);
        assert_eq!(c.prev_result, None);
    }

    #[test]
    fn istio_fields_and_ours() {
        let c = parse(
            r#"{"cniVersion":"0.3.1","name":"n","type":"istio-cni","plugin_log_level":"debug",
                "cni_agent_run_dir":"/run/x","ambient_enabled":true,"exclude_namespaces":[],
                "pod_namespace":"mesh","agent_timeout_seconds":5,
                "enablement_selectors":[{"podSelector":{}}],"kubernetes":{"kubeconfig":"/k"},
                "prevResult":{"cniVersion":"0.3.1"}}"#,
        )
        .unwrap();
        assert_eq!(c.log_level, Level::Debug);
        assert_eq!(c.run_dir, PathBuf::from("/run/x"));
        assert!(c.ambient_enabled);
        assert!(c.exclude_namespaces.is_empty());
        assert_eq!(c.system_namespace, "mesh");
        assert_eq!(c.agent_timeout, Duration::from_secs(5));
        assert!(c.prev_result.is_some());
    }

    #[test]
    fn nulls_count_as_absent() {
        let c = parse(
            r#"{"cniVersion":"1.1.0","name":"n","exclude_namespaces":null,"prevResult":null,
                "cni_agent_run_dir":null}"#,
        )
        .unwrap();
        assert_eq!(c.exclude_namespaces, vec!["kube-system".to_string()]);
        assert_eq!(c.prev_result, None);
        assert_eq!(c.run_dir, PathBuf::from("/var/run/istio-cni"));
    }

    #[test]
    fn undecodable_is_6() {
        for bad in [
            "",
            "not json",
            "[1]",
            r#"{"cniVersion":"1.0.0","name":"n","ambient_enabled":"yes"}"#,
            r#"{"cniVersion":1,"name":"n"}"#,
        ] {
            assert_eq!(parse(bad).unwrap_err().code, Code::DecodingFailure, "{bad}");
        }
    }

    #[test]
    fn invalid_is_7() {
        for bad in [
            r#"{"cniVersion":"1.0.0"}"#,
            r#"{"cniVersion":"1.0.0","name":""}"#,
            r#"{"cniVersion":"1.0.0","name":"bad name"}"#,
            r#"{"cniVersion":"1.0.0","name":"n","agent_timeout_seconds":0}"#,
            r#"{"cniVersion":"1.0.0","name":"n","agent_timeout_seconds":30000}"#,
        ] {
            assert_eq!(
                parse(bad).unwrap_err().code,
                Code::InvalidNetworkConfig,
                "{bad}"
            );
        }
    }

    #[test]
    fn unknown_version_is_1() {
        for bad in [
            r#"{"name":"n"}"#,
            r#"{"cniVersion":"0.2.0","name":"n"}"#,
            r#"{"cniVersion":"9.9.9","name":"n"}"#,
        ] {
            assert_eq!(
                parse(bad).unwrap_err().code,
                Code::IncompatibleVersion,
                "{bad}"
            );
        }
    }

    #[test]
    fn unknown_log_level_falls_back_to_info() {
        let c = parse(r#"{"cniVersion":"1.0.0","name":"n","plugin_log_level":"loud"}"#).unwrap();
        assert_eq!(c.log_level, Level::Info);
        assert!(c.log_level_warning.is_some());
    }

    #[test]
    fn error_version_echoes_supported_config_versions() {
        assert_eq!(error_version(br#"{"cniVersion":"0.4.0"}"#), "0.4.0");
        assert_eq!(error_version(br#"{"cniVersion":"7"}"#), "1.1.0");
        assert_eq!(error_version(b"garbage"), "1.1.0");
    }
}
