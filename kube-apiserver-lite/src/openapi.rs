//! A minimal OpenAPI v3: just enough for kubectl to learn that PATCH takes the
//! `fieldValidation` parameter, so `kubectl create -f` / `apply -f` validate on the
//! server (which accepts every field) instead of failing to download schemas.
//! There are no schemas: `kubectl explain` does not work.

use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use super::resources::{Resource, RESOURCES};

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// Every served group/version.
fn group_versions() -> Vec<(&'static str, &'static str)> {
    let mut out = Vec::new();
    for r in RESOURCES.iter().filter(|r| !r.create_only) {
        for v in r.versions {
            if !out.contains(&(r.group, *v)) {
                out.push((r.group, *v));
            }
        }
    }
    out
}

/// `/openapi/v3`: the index of per-group-version documents.
pub fn root() -> Value {
    let mut paths = Map::new();
    for (group, version) in group_versions() {
        let path = gv_path(group, version);
        let hash = document(group, version)
            .map(|d| hash(&d))
            .unwrap_or_default();
        paths.insert(
            path.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{path}?hash={hash}")}),
        );
    }
    json!({"paths": paths})
}

fn hash(doc: &Value) -> String {
    let digest = Sha256::digest(doc.to_string().as_bytes());
    digest.iter().take(16).map(|b| format!("{b:02X}")).collect()
}

fn patch_path(rs: &Resource, version: &str) -> (String, Value) {
    let base = format!("/{}", gv_path(rs.group, version));
    let path = if rs.namespaced {
        format!("{base}/namespaces/{{namespace}}/{}/{{name}}", rs.plural)
    } else {
        format!("{base}/{}/{{name}}", rs.plural)
    };
    let op = json!({
        "operationId": format!("patch{}", rs.kind),
        "x-kubernetes-action": "patch",
        "x-kubernetes-group-version-kind": {"group": rs.group, "version": version, "kind": rs.kind},
        "parameters": [
            {"name": "dryRun", "in": "query", "schema": {"type": "string"}},
            {"name": "fieldManager", "in": "query", "schema": {"type": "string"}},
            {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
            {"name": "force", "in": "query", "schema": {"type": "boolean"}},
        ],
        "responses": {"200": {"description": "OK"}},
    });
    (path, json!({"patch": op}))
}

/// `/openapi/v3/api/v1` or `/openapi/v3/apis/<group>/<version>`.
pub fn document(group: &str, version: &str) -> Option<Value> {
    let mut paths = Map::new();
    for rs in RESOURCES
        .iter()
        .filter(|r| r.group == group && r.serves(version) && !r.create_only)
    {
        let (path, item) = patch_path(rs, version);
        paths.insert(path, item);
    }
    if paths.is_empty() {
        return None;
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0-lite"},
        "paths": paths,
        "components": {"schemas": {}},
    }))
}

/// The document a `/openapi/v3/...` path names.
pub fn lookup(segments: &[&str]) -> Option<Value> {
    match segments {
        [] => Some(root()),
        ["api", version] => document("", version),
        ["apis", group, version] => document(group, version),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents() {
        let root = root();
        let url = root["paths"]["api/v1"]["serverRelativeURL"]
            .as_str()
            .unwrap();
        assert!(url.starts_with("/openapi/v3/api/v1?hash="));
        let doc = lookup(&["api", "v1"]).unwrap();
        let pod = &doc["paths"]["/api/v1/namespaces/{namespace}/pods/{name}"]["patch"];
        assert_eq!(pod["x-kubernetes-group-version-kind"]["kind"], "Pod");
        assert!(doc["paths"]["/api/v1/namespaces/{name}"].is_object());
        assert!(lookup(&["apis", "apps", "v9"]).is_none());
        assert!(lookup(&["apis", "security.istio.io", "v1beta1"]).is_some());
    }
}
