//! The CustomResourceDefinitions the mesh ships (`manifests/charts/base/files`), for
//! tests that run a bare local API server: it serves a custom kind only while its CRD
//! exists, as kube-apiserver does, so such a test creates them first.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Deserialize;
use serde_json::Value;

/// The base chart's CRD files, read from this source tree.
pub fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/charts/base/files")
}

/// Every CRD in the base chart's `files/crd-*.yaml`, in file order.
pub fn shipped() -> Result<Vec<Value>> {
    let dir = dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("crd-") && n.ends_with(".yaml"))
        })
        .collect();
    files.sort();
    let mut crds = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?;
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let value =
                Value::deserialize(doc).with_context(|| format!("parsing {}", file.display()))?;
            if !value.is_null() {
                crds.push(value);
            }
        }
    }
    Ok(crds)
}
