//! PATCH bodies: JSON merge patch (RFC 7386) and JSON patch (RFC 6902) through the
//! `json-patch` crate, plus an approximation of strategic merge patch and server-side
//! apply for the fields our clients touch.
//!
//! Strategic merge here is a merge patch in which lists of named items (containers,
//! env, ports, volumes, conditions, ...) merge by their key instead of being replaced,
//! `$patch: delete|replace` and `$deleteFromPrimitiveList/` are honoured and other `$`
//! directives (`$setElementOrder`, `$retainKeys`) are dropped. Server-side apply merges
//! the applied configuration the same way; it keeps no managedFields, so a field that
//! a manager stops applying is left in place rather than removed.

use serde_json::{Map, Value};

use super::errors::{ApiError, ApiResult};

/// A parsed PATCH body, chosen by its Content-Type.
#[derive(Debug, Clone)]
pub enum Patch {
    Merge(Value),
    Strategic(Value),
    Json(json_patch::Patch),
    Apply(Value),
}

impl Patch {
    /// Parses `body` as the patch kind named by `content_type` (415 for unknown kinds,
    /// 400 for bodies that do not parse).
    pub fn parse(content_type: &str, body: &[u8]) -> ApiResult<Patch> {
        let media = content_type
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        let json = || -> ApiResult<Value> {
            serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("invalid patch body: {e}")))
        };
        match media.as_str() {
            "application/merge-patch+json" => Ok(Patch::Merge(json()?)),
            "application/strategic-merge-patch+json" => Ok(Patch::Strategic(json()?)),
            "application/json-patch+json" => serde_json::from_slice(body)
                .map(Patch::Json)
                .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}"))),
            "application/apply-patch+yaml" | "application/apply-patch+json" => {
                let value: Value = serde_yaml::from_slice(body)
                    .map_err(|e| ApiError::bad_request(format!("invalid apply body: {e}")))?;
                if !value.is_object() {
                    return Err(ApiError::bad_request("apply body must be an object"));
                }
                Ok(Patch::Apply(value))
            }
            other => Err(ApiError::unsupported_media_type(other)),
        }
    }

    /// The patched copy of `target`; the error is the reason the patch does not apply.
    pub fn apply_to(&self, target: &Value) -> Result<Value, String> {
        let mut out = target.clone();
        match self {
            Patch::Merge(p) => json_patch::merge(&mut out, p),
            Patch::Strategic(p) | Patch::Apply(p) => strategic_merge(&mut out, p),
            Patch::Json(p) => json_patch::patch(&mut out, p).map_err(|e| e.to_string())?,
        }
        Ok(out)
    }
}

/// Applies a strategic merge patch (see the module docs for what is covered).
pub fn strategic_merge(target: &mut Value, patch: &Value) {
    match (target.as_object_mut(), patch.as_object()) {
        (Some(t), Some(p)) => {
            if p.get("$patch").and_then(Value::as_str) == Some("replace") {
                *target = strip(patch);
            } else {
                merge_object(t, p);
            }
        }
        (None, Some(_)) => *target = strip(patch),
        _ => *target = patch.clone(),
    }
}

fn merge_object(target: &mut Map<String, Value>, patch: &Map<String, Value>) {
    for (key, pv) in patch {
        if let Some(field) = key.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(items)), Some(remove)) =
                (target.get_mut(field), pv.as_array())
            {
                items.retain(|item| !remove.contains(item));
            }
            continue;
        }
        if key.starts_with('$') {
            continue;
        }
        match pv {
            Value::Null => {
                target.remove(key);
            }
            Value::Object(po) => match target.get_mut(key) {
                Some(tv @ Value::Object(_)) => strategic_merge(tv, pv),
                _ => {
                    let mut fresh = Map::new();
                    merge_object(&mut fresh, po);
                    target.insert(key.clone(), Value::Object(fresh));
                }
            },
            Value::Array(items) => {
                let merged = match (target.get_mut(key), merge_key(key, items)) {
                    (Some(Value::Array(existing)), Some(mk)) => {
                        merge_list(existing, items, mk);
                        true
                    }
                    (Some(Value::Array(existing)), None) if key == "finalizers" => {
                        for item in items {
                            if !existing.contains(item) {
                                existing.push(item.clone());
                            }
                        }
                        true
                    }
                    _ => false,
                };
                if !merged {
                    let list = items
                        .iter()
                        .filter(|i| !is_directive(i))
                        .map(strip)
                        .collect();
                    target.insert(key.clone(), Value::Array(list));
                }
            }
            other => {
                target.insert(key.clone(), other.clone());
            }
        }
    }
}

/// The merge key of well-known lists of named items, as in the Kubernetes types'
/// `patchMergeKey` tags.
fn merge_key(field: &str, items: &[Value]) -> Option<&'static str> {
    match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "env"
        | "volumes"
        | "imagePullSecrets"
        | "resourceClaims" => Some("name"),
        "volumeMounts" => Some("mountPath"),
        "volumeDevices" => Some("devicePath"),
        "conditions" => Some("type"),
        "ownerReferences" => Some("uid"),
        "hostAliases" => Some("ip"),
        "topologySpreadConstraints" => Some("topologyKey"),
        "ports" if items.iter().any(|i| i.get("containerPort").is_some()) => Some("containerPort"),
        "ports" => Some("port"),
        _ => None,
    }
}

fn merge_list(existing: &mut Vec<Value>, patch: &[Value], key: &str) {
    if patch
        .iter()
        .any(|i| i.get("$patch").and_then(Value::as_str) == Some("replace"))
    {
        *existing = patch
            .iter()
            .filter(|i| !is_directive(i))
            .map(strip)
            .collect();
        return;
    }
    for item in patch {
        let Some(id) = item.get(key) else {
            existing.push(strip(item));
            continue;
        };
        let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
        let pos = existing.iter().position(|e| e.get(key) == Some(id));
        match (pos, delete) {
            (Some(_), true) => existing.retain(|e| e.get(key) != Some(id)),
            (None, true) => {}
            (Some(i), false) => strategic_merge(&mut existing[i], item),
            (None, false) => existing.push(strip(item)),
        }
    }
}

/// A list item that only carries a `$patch` directive.
fn is_directive(item: &Value) -> bool {
    item.as_object()
        .is_some_and(|o| o.len() == 1 && o.contains_key("$patch"))
}

/// The patch value with directives and nulls removed, for fields the target lacks.
fn strip(value: &Value) -> Value {
    match value {
        Value::Object(o) => Value::Object(
            o.iter()
                .filter(|(k, v)| !k.starts_with('$') && !v.is_null())
                .map(|(k, v)| (k.clone(), strip(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(strip).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(ct: &str, target: Value, body: &str) -> Value {
        Patch::parse(ct, body.as_bytes())
            .unwrap()
            .apply_to(&target)
            .unwrap()
    }

    #[test]
    fn merge_patch_sets_and_deletes() {
        let out = run(
            "application/merge-patch+json",
            json!({"metadata": {"labels": {"a": "1", "b": "2"}}}),
            r#"{"metadata":{"labels":{"a":null,"c":"3"}}}"#,
        );
        assert_eq!(out, json!({"metadata": {"labels": {"b": "2", "c": "3"}}}));
    }

    #[test]
    fn json_patch_ops_and_failures() {
        let out = run(
            "application/json-patch+json",
            json!({"metadata": {"annotations": {}}}),
            r#"[{"op":"add","path":"/metadata/annotations/x","value":"y"}]"#,
        );
        assert_eq!(out["metadata"]["annotations"]["x"], "y");
        let p = Patch::parse(
            "application/json-patch+json",
            br#"[{"op":"test","path":"/a","value":1}]"#,
        )
        .unwrap();
        assert!(p.apply_to(&json!({"a": 2})).is_err());
    }

    #[test]
    fn strategic_merges_named_lists() {
        let target = json!({"spec": {"containers": [
            {"name": "app", "image": "a:1", "env": [{"name": "X", "value": "1"}]},
            {"name": "side", "image": "s:1"}]}});
        let out = run(
            "application/strategic-merge-patch+json",
            target,
            r#"{"spec":{"$setElementOrder/containers":[{"name":"app"}],"containers":[
                {"name":"app","image":"a:2","env":[{"name":"Y","value":"2"}]},
                {"name":"side","$patch":"delete"},
                {"name":"new","image":"n:1"}]}}"#,
        );
        let containers = out["spec"]["containers"].as_array().unwrap();
        assert_eq!(containers.len(), 2);
        assert_eq!(containers[0]["image"], "a:2");
        assert_eq!(containers[0]["env"].as_array().unwrap().len(), 2);
        assert_eq!(containers[1]["name"], "new");
    }

    #[test]
    fn strategic_replace_and_primitive_lists() {
        let out = run(
            "application/strategic-merge-patch+json",
            json!({"metadata": {"finalizers": ["a", "b"]}, "spec": {"x": {"y": 1}}}),
            r#"{"metadata":{"finalizers":["c"],"$deleteFromPrimitiveList/finalizers":["a"]},
                "spec":{"x":{"$patch":"replace","z":2}}}"#,
        );
        assert_eq!(out["metadata"]["finalizers"], json!(["b", "c"]));
        assert_eq!(out["spec"]["x"], json!({"z": 2}));
    }

    #[test]
    fn apply_accepts_yaml_and_rejects_bad_types() {
        let out = run(
            "application/apply-patch+yaml",
            json!({"metadata": {"name": "a", "labels": {"x": "1"}}}),
            "metadata:\n  labels:\n    y: '2'\n",
        );
        assert_eq!(out["metadata"]["labels"], json!({"x": "1", "y": "2"}));
        let err = Patch::parse("application/x-protobuf", b"").unwrap_err();
        assert_eq!(err.code, 415);
        assert_eq!(
            Patch::parse("application/merge-patch+json", b"{")
                .unwrap_err()
                .code,
            400
        );
        assert_eq!(
            Patch::parse("application/apply-patch+yaml", b"- a")
                .unwrap_err()
                .code,
            400
        );
    }
}
