//! The discovery documents kubectl and kube-rs read before anything else: `/version`,
//! `/api`, `/api/v1`, `/apis` and `/apis/<group>/<version>`, in the legacy (unaggregated)
//! format. kubectl asks for aggregated discovery first and falls back to these when
//! the response's Content-Type is plain `application/json`.

use serde_json::{json, Value};

use super::catalog::Catalog;

/// The Kubernetes version this server answers as.
pub const GIT_VERSION: &str = "v1.33.0-lite";

pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "gitVersion": GIT_VERSION,
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-01-01T00:00:00Z",
        "goVersion": "go1.24.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// `/api`: the core group's versions.
pub fn core_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    })
}

fn group_doc(group: &str, versions: &[String]) -> Value {
    let gv = |v: &str| json!({"groupVersion": format!("{group}/{v}"), "version": v});
    json!({
        "name": group,
        "versions": versions.iter().map(|v| gv(v)).collect::<Vec<_>>(),
        "preferredVersion": gv(versions.first().map(String::as_str).unwrap_or("v1")),
    })
}

/// `/apis`: every non-core group (a CRD's only while it is established).
pub fn group_list(catalog: &Catalog) -> Value {
    let groups: Vec<Value> = catalog
        .groups()
        .iter()
        .map(|(g, versions)| group_doc(g, versions))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/<group>`, `None` for an unknown group.
pub fn group(catalog: &Catalog, name: &str) -> Option<Value> {
    let (g, versions) = catalog.groups().into_iter().find(|(g, _)| *g == name)?;
    let mut doc = group_doc(&g, &versions);
    doc["kind"] = json!("APIGroup");
    doc["apiVersion"] = json!("v1");
    Some(doc)
}

const VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// `/api/v1` or `/apis/<group>/<version>`, `None` when nothing is served there.
pub fn resource_list(catalog: &Catalog, group: &str, version: &str) -> Option<Value> {
    let mut list = Vec::new();
    for (r, custom) in catalog.resources_in(group, version) {
        let mut doc = json!({
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": if r.create_only { &["create"][..] } else { VERBS },
        });
        if !r.short_names.is_empty() {
            doc["shortNames"] = json!(r.short_names);
        }
        // `kubectl get all` expands the "all" category.
        if matches!(r.plural, "pods" | "services" | "daemonsets" | "deployments") {
            doc["categories"] = json!(["all"]);
        }
        if let Some(custom) = &custom {
            if !custom.categories.is_empty() {
                doc["categories"] = json!(custom.categories);
            }
            if custom.terminating {
                doc["verbs"] = json!(["delete", "deletecollection", "get", "list", "watch"]);
            }
        }
        list.push(doc);
        if r.plural == "serviceaccounts" {
            // TokenRequest, served by tokens.rs.
            list.push(json!({
                "name": "serviceaccounts/token",
                "singularName": "",
                "namespaced": true,
                "group": "authentication.k8s.io",
                "version": "v1",
                "kind": "TokenRequest",
                "verbs": ["create"],
            }));
        }
        if r.status {
            list.push(json!({
                "name": format!("{}/status", r.plural),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
    }
    if list.is_empty() {
        return None;
    }
    let group_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": list,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents() {
        let catalog = Catalog::default();
        let core = resource_list(&catalog, "", "v1").unwrap();
        let pods = core["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "pods")
            .unwrap();
        assert_eq!(pods["shortNames"], json!(["po"]));
        assert!(core["resources"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["name"] == "pods/status"));
        assert!(resource_list(&catalog, "apps", "v2").is_none());
        let auth = resource_list(&catalog, "authentication.k8s.io", "v1").unwrap();
        assert_eq!(auth["resources"][0]["verbs"], json!(["create"]));
        // No CRD, no custom group.
        let groups = group_list(&catalog);
        assert!(!groups["groups"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["name"] == "security.istio.io"));
        assert!(group(&catalog, "nope").is_none());
    }
}
