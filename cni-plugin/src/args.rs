//! `CNI_ARGS` (`K=V;K2=V2`) with libcni's `LoadArgs` semantics: every pair must be exactly
//! `key=value`; unknown keys are an error unless `IgnoreUnknown` is true (`1`/`true`,
//! case-insensitive, anywhere in the list). Kubernetes runtimes pass the pod identity here.

use crate::error::{CniError, Code};

/// The keys containerd and CRI-O pass for a pod sandbox.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct K8sArgs {
    pub ignore_unknown: bool,
    pub pod_name: String,
    pub pod_namespace: String,
    pub pod_uid: String,
    pub pod_infra_container_id: String,
}

impl K8sArgs {
    /// `namespace/name` when the runtime told us which pod this is.
    pub fn pod(&self) -> Option<String> {
        (!self.pod_name.is_empty() && !self.pod_namespace.is_empty())
            .then(|| format!("{}/{}", self.pod_namespace, self.pod_name))
    }
}

/// Parses `CNI_ARGS`; failures are code 4 (it is an environment variable).
pub fn parse(text: &str) -> Result<K8sArgs, CniError> {
    let mut args = K8sArgs::default();
    if text.is_empty() {
        return Ok(args);
    }
    let mut unknown = Vec::new();
    for pair in text.split(';') {
        let mut parts = pair.split('=');
        let (Some(key), Some(value), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(invalid(format!("ARGS: invalid pair {pair:?}")));
        };
        match key {
            "IgnoreUnknown" => {
                args.ignore_unknown = match value.to_ascii_lowercase().as_str() {
                    "1" | "true" => true,
                    "0" | "false" => false,
                    _ => {
                        return Err(invalid(format!(
                            "ARGS: error parsing value of pair {pair:?}: not a boolean"
                        )))
                    }
                }
            }
            "K8S_POD_NAME" => args.pod_name = value.to_string(),
            "K8S_POD_NAMESPACE" => args.pod_namespace = value.to_string(),
            "K8S_POD_UID" => args.pod_uid = value.to_string(),
            "K8S_POD_INFRA_CONTAINER_ID" => args.pod_infra_container_id = value.to_string(),
            _ => unknown.push(pair),
        }
    }
    if !unknown.is_empty() && !args.ignore_unknown {
        return Err(invalid(format!("ARGS: unknown args {unknown:?}")));
    }
    Ok(args)
}

fn invalid(msg: String) -> CniError {
    CniError::new(Code::InvalidEnvironment, msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containerd_args() {
        let a = parse(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-0;\
             K8S_POD_INFRA_CONTAINER_ID=abc123;K8S_POD_UID=u-1;K8S_POD_NETWORK=x",
        )
        .unwrap();
        assert_eq!(
            a,
            K8sArgs {
                ignore_unknown: true,
                pod_name: "web-0".into(),
                pod_namespace: "shop".into(),
                pod_uid: "u-1".into(),
                pod_infra_container_id: "abc123".into(),
            }
        );
        assert_eq!(a.pod().as_deref(), Some("shop/web-0"));
    }

    #[test]
    fn empty_and_partial() {
        assert_eq!(parse("").unwrap(), K8sArgs::default());
        assert_eq!(parse("").unwrap().pod(), None);
        let a = parse("K8S_POD_NAME=a;K8S_POD_NAMESPACE=").unwrap();
        assert_eq!(a.pod(), None);
    }

    #[test]
    fn ignore_unknown_applies_wherever_it_appears() {
        assert!(parse("FOO=1;IgnoreUnknown=true").unwrap().ignore_unknown);
        assert!(parse("FOO=1;IgnoreUnknown=TRUE").is_ok());
        let e = parse("FOO=1;IgnoreUnknown=0").unwrap_err();
        assert_eq!(e.code, Code::InvalidEnvironment);
        assert!(e.msg.contains("unknown args"), "{}", e.msg);
        assert!(parse("FOO=1").is_err());
    }

    #[test]
    fn malformed_pairs_fail_even_with_ignore_unknown() {
        for bad in [
            "IgnoreUnknown=1;FOO",
            "IgnoreUnknown=1;A=b=c",
            "IgnoreUnknown=1;",
            ";",
            "IgnoreUnknown=maybe",
        ] {
            let e = parse(bad).unwrap_err();
            assert_eq!(e.code, Code::InvalidEnvironment, "{bad}");
        }
    }

    #[test]
    fn last_value_wins() {
        let a = parse("K8S_POD_NAME=a;K8S_POD_NAME=b").unwrap();
        assert_eq!(a.pod_name, "b");
    }
}
