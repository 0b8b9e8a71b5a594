//! A minimal OpenAPI v3: just enough for kubectl to learn that PATCH takes the
//! `fieldValidation` parameter, so `kubectl create -f` / `apply -f` validate on the
//! server (which accepts every field) instead of failing to download schemas.
//! There are no schemas: `kubectl explain` does not work. OpenAPI v2 is an empty
//! document: kubectl falls back to it for a kind v3 does not list (a custom kind
//! without its CRD) and then skips validation, so the apply fails on the missing kind
//! ("no matches for kind"), as against kube-apiserver.

use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use hyper::{header, Response};

use super::catalog::Catalog;
use super::resources::Resource;
use super::routes::{self, Body};

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// Every served group/version.
fn group_versions(catalog: &Catalog) -> Vec<(String, String)> {
    let mut out = vec![(String::new(), "v1".to_string())];
    for (group, versions) in catalog.groups() {
        for v in versions {
            out.push((group.clone(), v));
        }
    }
    out
}

/// `/openapi/v3`: the index of per-group-version documents.
pub fn root(catalog: &Catalog) -> Value {
    let mut paths = Map::new();
    for (group, version) in group_versions(catalog) {
        let path = gv_path(&group, &version);
        let hash = document(catalog, &group, &version)
            .map(|d| hash(&d))
            .unwrap_or_default();
        paths.insert(
            path.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{path}?hash={hash}")}),
        );
    }
    json!({"paths": paths})
}

/// `/openapi/v2`: no paths and no definitions, as protobuf (an empty gnostic
/// `Document` is zero bytes) when asked for it, else as JSON.
pub fn v2(accept: &str) -> Response<Body> {
    let (content_type, body) = if accept.contains("protobuf") {
        (V2_PROTOBUF, Vec::new())
    } else {
        let doc = json!({
            "swagger": "2.0",
            "info": {"title": "Kubernetes", "version": crate::discovery::GIT_VERSION},
            "paths": {},
            "definitions": {},
        });
        (
            "application/json",
            serde_json::to_vec(&doc).unwrap_or_default(),
        )
    };
    Response::builder()
        .header(header::CONTENT_TYPE, content_type)
        .body(routes::full(body))
        .unwrap_or_else(|_| Response::new(routes::full(Vec::new())))
}

const V2_PROTOBUF: &str = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";

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
pub fn document(catalog: &Catalog, group: &str, version: &str) -> Option<Value> {
    let mut paths = Map::new();
    for (rs, _) in catalog
        .resources_in(group, version)
        .into_iter()
        .filter(|(r, _)| !r.create_only)
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
pub fn lookup(catalog: &Catalog, segments: &[&str]) -> Option<Value> {
    match segments {
        [] => Some(root(catalog)),
        ["api", version] => document(catalog, "", version),
        ["apis", group, version] => document(catalog, group, version),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents() {
        let catalog = Catalog::default();
        let root = root(&catalog);
        let url = root["paths"]["api/v1"]["serverRelativeURL"]
            .as_str()
            .unwrap();
        assert!(url.starts_with("/openapi/v3/api/v1?hash="));
        let doc = lookup(&catalog, &["api", "v1"]).unwrap();
        let pod = &doc["paths"]["/api/v1/namespaces/{namespace}/pods/{name}"]["patch"];
        assert_eq!(pod["x-kubernetes-group-version-kind"]["kind"], "Pod");
        assert!(doc["paths"]["/api/v1/namespaces/{name}"].is_object());
        assert!(lookup(&catalog, &["apis", "apps", "v9"]).is_none());
        assert!(lookup(&catalog, &["apis", "security.istio.io", "v1beta1"]).is_none());
    }
}
