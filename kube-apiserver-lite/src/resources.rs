//! The built-in resources this server serves, one row each (custom resources come from
//! CRDs, see `catalog.rs`). Versions of one resource share storage.

/// A served resource type.
#[derive(Debug, PartialEq, Eq)]
pub struct Resource {
    /// API group, "" for core.
    pub group: &'static str,
    /// Served versions, preferred first.
    pub versions: &'static [&'static str],
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
    /// Has a `/status` subresource: main-resource updates keep `.status`, status updates
    /// keep everything but `.status` and metadata labels/annotations.
    pub status: bool,
    /// Not stored: POST on the collection is the only verb (TokenReview and friends,
    /// served by `tokens.rs`).
    pub create_only: bool,
}

impl Resource {
    /// `apiVersion` for `version`, e.g. "v1" or "apps/v1".
    pub fn api_version(&self, version: &str) -> String {
        if self.group.is_empty() {
            version.to_string()
        } else {
            format!("{}/{}", self.group, version)
        }
    }

    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }

    pub fn serves(&self, version: &str) -> bool {
        self.versions.contains(&version)
    }

    /// Storage identity: the group and plural, independent of version (and of the
    /// group for Events, stored once and served by core/v1 and events.k8s.io/v1).
    pub fn storage_key(&self) -> (&'static str, &'static str) {
        match (self.group, self.plural) {
            ("events.k8s.io", "events") => ("", "events"),
            key => key,
        }
    }
}

#[allow(clippy::too_many_arguments)]
const fn res(
    group: &'static str,
    versions: &'static [&'static str],
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    namespaced: bool,
    short_names: &'static [&'static str],
    status: bool,
) -> Resource {
    Resource {
        group,
        versions,
        plural,
        singular,
        kind,
        namespaced,
        short_names,
        status,
        create_only: false,
    }
}

/// A cluster-scoped, create-only review resource.
const fn review(
    group: &'static str,
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
) -> Resource {
    Resource {
        create_only: true,
        ..res(group, V1, plural, singular, kind, false, &[], false)
    }
}

const V1: &[&str] = &["v1"];

/// Every built-in resource. Add a row to serve another type.
#[rustfmt::skip]
pub static BUILTIN: &[Resource] = &[
    res("", V1, "namespaces", "namespace", "Namespace", false, &["ns"], true),
    res("", V1, "nodes", "node", "Node", false, &["no"], true),
    res("", V1, "pods", "pod", "Pod", true, &["po"], true),
    res("", V1, "services", "service", "Service", true, &["svc"], true),
    res("", V1, "serviceaccounts", "serviceaccount", "ServiceAccount", true, &["sa"], false),
    res("", V1, "endpoints", "endpoints", "Endpoints", true, &["ep"], false),
    res("", V1, "events", "event", "Event", true, &["ev"], false),
    res("", V1, "configmaps", "configmap", "ConfigMap", true, &["cm"], false),
    res("", V1, "secrets", "secret", "Secret", true, &[], false),
    res("events.k8s.io", V1, "events", "event", "Event", true, &[], false),
    res("apps", V1, "daemonsets", "daemonset", "DaemonSet", true, &["ds"], true),
    res("apps", V1, "deployments", "deployment", "Deployment", true, &["deploy"], true),
    res("discovery.k8s.io", V1, "endpointslices", "endpointslice", "EndpointSlice", true, &[], false),
    res("coordination.k8s.io", V1, "leases", "lease", "Lease", true, &[], false),
    res("policy", V1, "poddisruptionbudgets", "poddisruptionbudget", "PodDisruptionBudget", true, &["pdb"], true),
    res("autoscaling", &["v2"], "horizontalpodautoscalers", "horizontalpodautoscaler", "HorizontalPodAutoscaler", true, &["hpa"], true),
    res("rbac.authorization.k8s.io", V1, "clusterroles", "clusterrole", "ClusterRole", false, &[], false),
    res("rbac.authorization.k8s.io", V1, "clusterrolebindings", "clusterrolebinding", "ClusterRoleBinding", false, &[], false),
    res("rbac.authorization.k8s.io", V1, "roles", "role", "Role", true, &[], false),
    res("rbac.authorization.k8s.io", V1, "rolebindings", "rolebinding", "RoleBinding", true, &[], false),
    res("apiextensions.k8s.io", V1, "customresourcedefinitions", "customresourcedefinition", "CustomResourceDefinition", false, &["crd"], true),
    review("authentication.k8s.io", "tokenreviews", "tokenreview", "TokenReview"),
    review("authentication.k8s.io", "selfsubjectreviews", "selfsubjectreview", "SelfSubjectReview"),
];

/// The built-in resource served at `/api[s]/<group>/<version>/<plural>`.
pub fn builtin(group: &str, version: &str, plural: &str) -> Option<&'static Resource> {
    BUILTIN
        .iter()
        .find(|r| r.group == group && r.plural == plural && r.serves(version))
}

/// The built-in resource stored under `(group, plural)` (any version).
pub fn builtin_by_storage(group: &str, plural: &str) -> Option<&'static Resource> {
    BUILTIN
        .iter()
        .find(|r| r.group == group && r.plural == plural)
}

/// Built-in API groups other than core, in first-seen order, with their versions.
pub fn builtin_groups() -> Vec<(&'static str, &'static [&'static str])> {
    let mut out: Vec<(&'static str, &'static [&'static str])> = Vec::new();
    for r in BUILTIN.iter().filter(|r| !r.group.is_empty()) {
        if !out.iter().any(|(g, _)| *g == r.group) {
            out.push((r.group, r.versions));
        }
    }
    out
}

/// The namespace resource, needed by the store for cascading deletes.
pub fn namespaces() -> &'static Resource {
    &BUILTIN[0]
}

/// The CustomResourceDefinition resource.
pub fn crds() -> &'static Resource {
    builtin_by_storage("apiextensions.k8s.io", "customresourcedefinitions")
        .expect("CRDs are built in")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups() {
        assert_eq!(builtin("", "v1", "pods").map(|r| r.kind), Some("Pod"));
        assert!(builtin("", "v2", "pods").is_none());
        assert!(builtin("security.istio.io", "v1", "authorizationpolicies").is_none());
        assert_eq!(namespaces().plural, "namespaces");
        assert_eq!(crds().kind, "CustomResourceDefinition");
        assert!(builtin_groups().iter().any(|(g, _)| *g == "apps"));
        assert!(
            builtin("authentication.k8s.io", "v1", "tokenreviews").is_some_and(|r| r.create_only)
        );
    }
}
