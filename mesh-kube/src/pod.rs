//! Facts about a Pod, read the same way by every part of the mesh.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Pod;
use shared_types::constants::{
    DEFAULT_SERVICE_ACCOUNT, REDIRECTION_ANNOTATION, REDIRECTION_ENABLED,
};

/// `namespace/name`, the key every cache and queue uses for a pod.
pub fn key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The pod's addresses: `status.podIPs` (both families on a dual-stack pod), else the
/// older `status.podIP`; unparseable entries are skipped, duplicates dropped.
pub fn ips(pod: &Pod) -> Vec<IpAddr> {
    let Some(status) = pod.status.as_ref() else {
        return Vec::new();
    };
    let mut ips: Vec<IpAddr> = status
        .pod_ips
        .iter()
        .flatten()
        .filter_map(|p| p.ip.parse().ok())
        .collect();
    if ips.is_empty() {
        ips.extend(
            status
                .pod_ip
                .as_deref()
                .and_then(|ip| ip.parse::<IpAddr>().ok()),
        );
    }
    ips.dedup();
    ips
}

/// The pod's service account: `serviceAccountName`, else the deprecated
/// `serviceAccount`, else `default` (what the admission controller would set).
pub fn service_account(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| {
            s.service_account_name
                .as_deref()
                .or(s.service_account.as_deref())
        })
        .filter(|s| !s.is_empty())
        .unwrap_or(DEFAULT_SERVICE_ACCOUNT)
}

/// One of the pod's annotations.
pub fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// Whether the node agent has marked the pod's redirection live
/// (`ambient.istio.io/redirection: enabled`).
pub fn is_redirected(pod: &Pod) -> bool {
    annotation(pod, REDIRECTION_ANNOTATION) == Some(REDIRECTION_ENABLED)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn addresses_prefer_the_list_and_fall_back_to_the_single_field() {
        let dual = pod(json!({"status": {
            "podIP": "10.0.0.5",
            "podIPs": [{"ip": "10.0.0.5"}, {"ip": "fd00::5"}, {"ip": "fd00::5"}, {"ip": "bad"}],
        }}));
        assert_eq!(
            ips(&dual),
            [
                "10.0.0.5".parse::<IpAddr>().unwrap(),
                "fd00::5".parse().unwrap()
            ]
        );
        let old = pod(json!({"status": {"podIP": "10.0.0.6"}}));
        assert_eq!(ips(&old), ["10.0.0.6".parse::<IpAddr>().unwrap()]);
        assert!(ips(&pod(json!({}))).is_empty());
    }

    #[test]
    fn service_account_key_and_redirection() {
        let p = pod(json!({
            "metadata": {"name": "a", "namespace": "n",
                         "annotations": {"ambient.istio.io/redirection": "enabled"}},
            "spec": {"containers": [], "serviceAccount": "legacy"},
        }));
        assert_eq!((key(&p), service_account(&p)), ("n/a".to_owned(), "legacy"));
        assert!(is_redirected(&p));
        let q = pod(
            json!({"metadata": {"annotations": {"ambient.istio.io/redirection": "pending"}},
                           "spec": {"containers": [], "serviceAccountName": ""}}),
        );
        assert_eq!(service_account(&q), "default");
        assert!(!is_redirected(&q));
    }
}
