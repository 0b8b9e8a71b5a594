//! Which pods are ambient: Istio's default selection, as a pure function of the pod and
//! its namespace so it can be tested as a table.

use k8s_openapi::api::core::v1::{Namespace, Pod};
use shared_types::constants::{
    DATAPLANE_MODE_AMBIENT, DATAPLANE_MODE_LABEL, DATAPLANE_MODE_NONE, SIDECAR_STATUS_ANNOTATION,
    SYSTEM_NAMESPACE,
};

/// The selection knobs (Istio's defaults in [`Default`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    /// Label on pods and namespaces that selects the data-plane mode.
    pub label: String,
    /// Its value that enrolls.
    pub ambient: String,
    /// Its value (on a pod) that opts out even in an ambient namespace.
    pub none: String,
    /// Namespaces never enrolled.
    pub excluded_namespaces: Vec<String>,
    /// Where ztunnel runs (its own pods are never captured).
    pub system_namespace: String,
}

impl Default for Selection {
    fn default() -> Self {
        Selection {
            label: DATAPLANE_MODE_LABEL.into(),
            ambient: DATAPLANE_MODE_AMBIENT.into(),
            none: DATAPLANE_MODE_NONE.into(),
            excluded_namespaces: vec!["kube-system".into()],
            system_namespace: SYSTEM_NAMESPACE.into(),
        }
    }
}

/// The decision for one pod; the reason is for logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Ambient,
    NotAmbient(&'static str),
}

impl Decision {
    pub fn is_ambient(self) -> bool {
        self == Decision::Ambient
    }
}

impl Selection {
    pub fn decide(&self, pod: &Pod, namespace: Option<&Namespace>) -> Decision {
        let meta = &pod.metadata;
        let ns = meta.namespace.as_deref().unwrap_or_default();
        if self.excluded_namespaces.iter().any(|n| n == ns) {
            return Decision::NotAmbient("excluded namespace");
        }
        let spec = pod.spec.as_ref();
        if spec.and_then(|s| s.host_network).unwrap_or(false) {
            return Decision::NotAmbient("host network");
        }
        let annotations = meta.annotations.as_ref();
        if annotations.is_some_and(|a| a.contains_key(SIDECAR_STATUS_ANNOTATION)) {
            return Decision::NotAmbient("sidecar injected");
        }
        let label = |key: &str| meta.labels.as_ref().and_then(|l| l.get(key)).cloned();
        if ns == self.system_namespace && label("app").as_deref() == Some("ztunnel") {
            return Decision::NotAmbient("ztunnel itself");
        }
        match label(&self.label) {
            Some(v) if v == self.none => return Decision::NotAmbient("pod opted out"),
            Some(v) if v == self.ambient => return Decision::Ambient,
            _ => {}
        }
        if namespace.is_some_and(|n| self.namespace_is_ambient(n)) {
            Decision::Ambient
        } else {
            Decision::NotAmbient("not selected")
        }
    }

    /// The namespace label alone (for the enablement state file).
    pub fn namespace_is_ambient(&self, namespace: &Namespace) -> bool {
        let name = namespace.metadata.name.as_deref().unwrap_or_default();
        !self.excluded_namespaces.iter().any(|n| n == name)
            && namespace
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(&self.label))
                .is_some_and(|v| *v == self.ambient)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(ns: &str, labels: serde_json::Value, annotations: serde_json::Value, host: bool) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": ns, "labels": labels, "annotations": annotations},
            "spec": {"hostNetwork": host, "containers": []},
        }))
        .unwrap()
    }

    fn namespace(name: &str, mode: Option<&str>) -> Namespace {
        let labels = mode
            .map(|m| json!({DATAPLANE_MODE_LABEL: m}))
            .unwrap_or(json!({}));
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap()
    }

    #[test]
    fn decision_table() {
        let s = Selection::default();
        let amb = json!({DATAPLANE_MODE_LABEL: "ambient"});
        let none = json!({DATAPLANE_MODE_LABEL: "none"});
        let no = json!({});
        let ambient_ns = namespace("shop", Some("ambient"));
        let plain_ns = namespace("shop", None);
        let sidecar = json!({SIDECAR_STATUS_ANNOTATION: "{}"});
        use Decision::*;
        let cases: Vec<(Pod, Option<&Namespace>, Decision)> = vec![
            (
                pod("shop", no.clone(), no.clone(), false),
                Some(&ambient_ns),
                Ambient,
            ),
            (
                pod("shop", amb.clone(), no.clone(), false),
                Some(&plain_ns),
                Ambient,
            ),
            (pod("shop", amb.clone(), no.clone(), false), None, Ambient),
            (
                pod("shop", no.clone(), no.clone(), false),
                Some(&plain_ns),
                NotAmbient("not selected"),
            ),
            (
                pod("shop", no.clone(), no.clone(), false),
                None,
                NotAmbient("not selected"),
            ),
            (
                pod("shop", none, no.clone(), false),
                Some(&ambient_ns),
                NotAmbient("pod opted out"),
            ),
            (
                pod("shop", amb.clone(), no.clone(), true),
                Some(&ambient_ns),
                NotAmbient("host network"),
            ),
            (
                pod("shop", amb.clone(), sidecar, false),
                Some(&ambient_ns),
                NotAmbient("sidecar injected"),
            ),
            (
                pod("kube-system", amb.clone(), no.clone(), false),
                None,
                NotAmbient("excluded namespace"),
            ),
            (
                pod(
                    "istio-system",
                    json!({"app": "ztunnel", DATAPLANE_MODE_LABEL: "ambient"}),
                    no.clone(),
                    false,
                ),
                None,
                NotAmbient("ztunnel itself"),
            ),
            (
                pod("other", json!({"app": "ztunnel"}), no, false),
                Some(&ambient_ns),
                Ambient,
            ),
        ];
        for (i, (p, ns, want)) in cases.into_iter().enumerate() {
            assert_eq!(s.decide(&p, ns), want, "case {i}");
        }
        assert!(s.namespace_is_ambient(&ambient_ns));
        assert!(!s.namespace_is_ambient(&plain_ns));
        assert!(!s.namespace_is_ambient(&namespace("kube-system", Some("ambient"))));
    }
}
