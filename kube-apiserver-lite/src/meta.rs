//! Object bookkeeping the server owns: names, uids, timestamps, generation, and the few
//! type defaults our clients rely on (pod phase, namespace name label, service VIPs).

use rand::Rng;
use serde_json::{json, Map, Value};

use super::errors::{ApiError, ApiResult};
use super::resources::Resource;

/// `metadata.name` of an object, "" when missing.
pub fn name_of(obj: &Value) -> &str {
    obj.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
}

pub fn namespace_of(obj: &Value) -> &str {
    obj.pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("")
}

pub fn resource_version_of(obj: &Value) -> &str {
    obj.pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// `metadata` as a mutable map, created when missing; `None` when `obj` is no object.
pub fn metadata_mut(obj: &mut Value) -> Option<&mut Map<String, Value>> {
    let meta = obj
        .as_object_mut()?
        .entry("metadata")
        .or_insert_with(|| json!({}));
    if !meta.is_object() {
        *meta = json!({});
    }
    meta.as_object_mut()
}

/// Current time as Kubernetes writes it: RFC 3339, UTC, whole seconds.
pub fn now_rfc3339() -> String {
    let now = time::OffsetDateTime::now_utc();
    let now = now.replace_nanosecond(0).unwrap_or(now);
    now.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// Seconds since an RFC 3339 timestamp (for the AGE column).
pub fn age_seconds(timestamp: &str) -> Option<i64> {
    let then =
        time::OffsetDateTime::parse(timestamp, &time::format_description::well_known::Rfc3339)
            .ok()?;
    Some(
        (time::OffsetDateTime::now_utc() - then)
            .whole_seconds()
            .max(0),
    )
}

/// A random version-4 UUID.
pub fn new_uid() -> String {
    let mut b: [u8; 16] = rand::rng().random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// `generateName` plus five random characters, the alphabet Kubernetes uses.
pub fn generate_name(prefix: &str) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    let suffix: String = (0..5)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect();
    format!("{prefix}{suffix}")
}

/// DNS-1123 subdomain check (namespaces must also be a DNS-1123 label).
pub fn validate_name(rs: &Resource, name: &str) -> ApiResult<()> {
    let max = if rs.plural == "namespaces" { 63 } else { 253 };
    let ok_chars = name.bytes().all(|c| {
        c.is_ascii_lowercase()
            || c.is_ascii_digit()
            || c == b'-'
            || (c == b'.' && rs.plural != "namespaces")
    });
    let ok_ends = name
        .bytes()
        .next()
        .zip(name.bytes().last())
        .is_some_and(|(a, z)| a.is_ascii_alphanumeric() && z.is_ascii_alphanumeric());
    if name.is_empty() {
        return Err(ApiError::invalid(
            rs.kind,
            name,
            "metadata.name: Required value: name or generateName is required",
        ));
    }
    if name.len() > max || !ok_chars || !ok_ends {
        return Err(ApiError::invalid(
            rs.kind,
            name,
            format!("metadata.name: Invalid value: {name:?}: a lowercase RFC 1123 name must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (at most {max} characters)"),
        ));
    }
    Ok(())
}

/// Type defaults applied on create (a Service's addresses: [`super::service_ips`]).
pub fn apply_create_defaults(rs: &Resource, obj: &mut Value) {
    match (rs.group, rs.plural) {
        ("", "namespaces") => {
            let name = name_of(obj).to_string();
            if let Some(meta) = metadata_mut(obj) {
                let labels = meta.entry("labels").or_insert_with(|| json!({}));
                if let Some(labels) = labels.as_object_mut() {
                    labels.insert("kubernetes.io/metadata.name".into(), Value::String(name));
                }
            }
            set_if_missing(obj, "/status/phase", "Active");
        }
        ("", "pods") => set_if_missing(obj, "/status/phase", "Pending"),
        ("", "services") => set_if_missing(obj, "/spec/type", "ClusterIP"),
        ("", "secrets") => fold_string_data(obj),
        // The apps/v1 defaults clients rely on (`kubectl rollout status` reads
        // spec.replicas and the strategy type).
        ("apps", "deployments") => {
            set_value_if_missing(obj, "/spec/replicas", json!(1));
            set_value_if_missing(obj, "/spec/revisionHistoryLimit", json!(10));
            set_value_if_missing(obj, "/spec/progressDeadlineSeconds", json!(600));
            set_if_missing(obj, "/spec/strategy/type", "RollingUpdate");
            if obj.pointer("/spec/strategy/type") == Some(&json!("RollingUpdate")) {
                set_if_missing(obj, "/spec/strategy/rollingUpdate/maxSurge", "25%");
                set_if_missing(obj, "/spec/strategy/rollingUpdate/maxUnavailable", "25%");
            }
        }
        ("apps", "daemonsets") => {
            set_value_if_missing(obj, "/spec/revisionHistoryLimit", json!(10));
            set_if_missing(obj, "/spec/updateStrategy/type", "RollingUpdate");
            if obj.pointer("/spec/updateStrategy/type") == Some(&json!("RollingUpdate")) {
                set_value_if_missing(
                    obj,
                    "/spec/updateStrategy/rollingUpdate/maxUnavailable",
                    json!(1),
                );
                set_value_if_missing(obj, "/spec/updateStrategy/rollingUpdate/maxSurge", json!(0));
            }
        }
        _ => {}
    }
}

/// A Secret's write-only `stringData` merged into `data` (base64), as the API server
/// stores it: readers only ever see `data`.
pub fn fold_string_data(obj: &mut Value) {
    use base64::Engine;
    let Some(object) = obj.as_object_mut() else {
        return;
    };
    let Some(Value::Object(strings)) = object.remove("stringData") else {
        return;
    };
    let data = object.entry("data").or_insert_with(|| json!({}));
    if let Some(data) = data.as_object_mut() {
        for (k, v) in strings {
            let text = v.as_str().unwrap_or_default();
            data.insert(
                k,
                json!(base64::engine::general_purpose::STANDARD.encode(text)),
            );
        }
    }
}

fn set_if_missing(obj: &mut Value, pointer: &str, value: &str) {
    set_value_if_missing(obj, pointer, json!(value));
}

fn set_value_if_missing(obj: &mut Value, pointer: &str, value: Value) {
    if obj.pointer(pointer).is_none() {
        set_path(obj, pointer, value);
    }
}

/// Sets the field at a JSON pointer, creating objects on the way; does nothing when a
/// step is not an object (malformed input must not panic).
pub fn set_path(obj: &mut Value, pointer: &str, value: Value) {
    let parts: Vec<&str> = pointer.trim_start_matches('/').split('/').collect();
    let Some((last, parents)) = parts.split_last() else {
        return;
    };
    let mut cur = obj;
    for part in parents {
        let Some(map) = cur.as_object_mut() else {
            return;
        };
        cur = map.entry(part.to_string()).or_insert_with(|| json!({}));
    }
    if let Some(map) = cur.as_object_mut() {
        map.insert(last.to_string(), value);
    }
}

/// The first free address in 10.96.0.0/16 (the usual service CIDR) from .11 on: .10
/// is the cluster DNS address kubelet writes into pods' resolv.conf (kube-dns claims
/// it explicitly in a real cluster).
/// Everything but metadata and status: a change here bumps `metadata.generation`.
pub fn spec_part(obj: &Value) -> Value {
    match obj {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| {
                    !matches!(k.as_str(), "metadata" | "status" | "kind" | "apiVersion")
                })
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::builtin as find;

    #[test]
    fn names_and_uids() {
        let pods = find("", "v1", "pods").unwrap();
        let ns = find("", "v1", "namespaces").unwrap();
        assert!(validate_name(pods, "web-1.x").is_ok());
        assert!(validate_name(ns, "web.x").is_err());
        assert!(validate_name(pods, "Web").is_err());
        assert!(validate_name(pods, "-a").is_err());
        assert!(validate_name(pods, "").is_err());
        assert_eq!(new_uid().len(), 36);
        assert_eq!(generate_name("web-").len(), 9);
        assert!(now_rfc3339().ends_with('Z'));
        assert!(age_seconds(&now_rfc3339()).is_some_and(|a| a < 5));
    }

    #[test]
    fn defaults() {
        let svc = find("", "v1", "services").unwrap();
        let mut obj = json!({"metadata": {"name": "s"}, "spec": {}});
        apply_create_defaults(svc, &mut obj);
        assert_eq!(obj["spec"]["type"], "ClusterIP");
        let ns = find("", "v1", "namespaces").unwrap();
        let mut obj = json!({"metadata": {"name": "demo"}});
        apply_create_defaults(ns, &mut obj);
        assert_eq!(
            obj["metadata"]["labels"]["kubernetes.io/metadata.name"],
            "demo"
        );
        assert_eq!(obj["status"]["phase"], "Active");
        let pods = find("", "v1", "pods").unwrap();
        let mut obj = json!({"metadata": {"name": "p"}, "status": {"phase": "Running"}});
        apply_create_defaults(pods, &mut obj);
        assert_eq!(obj["status"]["phase"], "Running");
    }
}
