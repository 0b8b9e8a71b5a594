//! The state file: one JSON document with the latest resourceVersion and every object
//! (tagged with its group and plural), rewritten atomically on each change.

use std::io::{Error, ErrorKind};
use std::path::Path;

use serde_json::{json, Value};

use super::resources::{self, Resource};

/// Writes the snapshot to a temporary file, then renames it: never half a file.
pub fn save<'a>(
    path: &Path,
    resource_version: u64,
    objects: impl Iterator<Item = (&'a str, &'a str, &'a Value)>,
) -> std::io::Result<()> {
    let objects: Vec<Value> = objects
        .map(|(group, plural, object)| json!({"group": group, "plural": plural, "object": object}))
        .collect();
    let doc = json!({"resourceVersion": resource_version.to_string(), "objects": objects});
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec(&doc).map_err(Error::other)?)?;
    std::fs::rename(&tmp, path)
}

/// Reads a snapshot: the resourceVersion and the objects of known resources (others
/// are skipped with a warning).
pub fn load(path: &Path) -> std::io::Result<(u64, Vec<(&'static Resource, Value)>)> {
    let invalid = |msg: String| Error::new(ErrorKind::InvalidData, msg);
    let doc: Value = serde_json::from_slice(&std::fs::read(path)?)
        .map_err(|e| invalid(format!("{}: {e}", path.display())))?;
    let rv = doc
        .get("resourceVersion")
        .and_then(Value::as_str)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| invalid(format!("{}: no resourceVersion", path.display())))?;
    let mut objects = Vec::new();
    for entry in doc
        .get("objects")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let group = entry.get("group").and_then(Value::as_str).unwrap_or("");
        let plural = entry.get("plural").and_then(Value::as_str).unwrap_or("");
        match (resources::by_storage(group, plural), entry.get("object")) {
            (Some(rs), Some(obj)) if obj.is_object() => objects.push((rs, obj.clone())),
            _ => tracing::warn!(group, plural, "state file: skipping an unknown object"),
        }
    }
    Ok((rv, objects))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_bad_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.json");
        let pod = json!({"metadata": {"name": "p", "namespace": "d"}});
        save(
            &path,
            42,
            [("", "pods", &pod), ("x.io", "widgets", &pod)].into_iter(),
        )
        .unwrap();
        let (rv, objects) = load(&path).unwrap();
        assert_eq!(rv, 42);
        assert_eq!(objects.len(), 1);
        assert_eq!(objects[0].0.plural, "pods");
        std::fs::write(&path, "{").unwrap();
        assert!(load(&path).is_err());
        std::fs::write(&path, "{\"objects\": []}").unwrap();
        assert!(load(&path).is_err());
    }
}
