//! Decoding of the few protobuf bodies kubectl sends: its typed `create` commands
//! (`kubectl create namespace|serviceaccount|configmap`) encode Kubernetes protobuf
//! and do not fall back to JSON. Only the fields those commands set are read
//! (metadata name/generateName/namespace/labels/annotations, ConfigMap data); other
//! kinds are refused with 415, pointing at YAML (`create -f`, `apply`).

use serde_json::{json, Map, Value};

/// Prefix of every Kubernetes protobuf message (`runtime.Unknown` follows).
const MAGIC: &[u8] = b"k8s\0";

enum Wire<'a> {
    Varint,
    Bytes(&'a [u8]),
}

fn varint(buf: &mut &[u8]) -> Result<u64, String> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&b, rest) = buf.split_first().ok_or("truncated varint")?;
        *buf = rest;
        value |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err("varint too long".into())
}

/// The (field number, value) pairs of one message.
fn fields(mut buf: &[u8]) -> Result<Vec<(u64, Wire<'_>)>, String> {
    let mut out = Vec::new();
    while !buf.is_empty() {
        let key = varint(&mut buf)?;
        let wire = match key & 7 {
            0 => {
                varint(&mut buf)?;
                Wire::Varint
            }
            1 | 5 => {
                let n = if key & 7 == 1 { 8 } else { 4 };
                buf = buf.get(n..).ok_or("truncated fixed field")?;
                Wire::Varint
            }
            2 => {
                let len = usize::try_from(varint(&mut buf)?).map_err(|_| "length overflow")?;
                let bytes = buf.get(..len).ok_or("truncated field")?;
                buf = &buf[len..];
                Wire::Bytes(bytes)
            }
            other => return Err(format!("unsupported wire type {other}")),
        };
        out.push((key >> 3, wire));
    }
    Ok(out)
}

fn bytes_of<'a>(fields: &[(u64, Wire<'a>)], number: u64) -> Option<&'a [u8]> {
    fields.iter().rev().find_map(|(n, w)| match w {
        Wire::Bytes(b) if *n == number => Some(*b),
        _ => None,
    })
}

fn string_of(fields: &[(u64, Wire<'_>)], number: u64) -> Result<Option<String>, String> {
    bytes_of(fields, number)
        .map(|b| String::from_utf8(b.to_vec()).map_err(|_| "invalid UTF-8".to_string()))
        .transpose()
}

/// A `map<string, string>` field (repeated entries of key=1, value=2).
fn string_map(fields: &[(u64, Wire<'_>)], number: u64) -> Result<Map<String, Value>, String> {
    let mut map = Map::new();
    for (n, w) in fields {
        if let (true, Wire::Bytes(entry)) = (*n == number, w) {
            let entry = self::fields(entry)?;
            let key = string_of(&entry, 1)?.unwrap_or_default();
            let value = string_of(&entry, 2)?.unwrap_or_default();
            map.insert(key, Value::String(value));
        }
    }
    Ok(map)
}

fn object_meta(buf: &[u8]) -> Result<Value, String> {
    let f = fields(buf)?;
    let mut meta = Map::new();
    for (number, key) in [(1, "name"), (2, "generateName"), (3, "namespace")] {
        if let Some(v) = string_of(&f, number)?.filter(|v| !v.is_empty()) {
            meta.insert(key.into(), Value::String(v));
        }
    }
    for (number, key) in [(11, "labels"), (12, "annotations")] {
        let map = string_map(&f, number)?;
        if !map.is_empty() {
            meta.insert(key.into(), Value::Object(map));
        }
    }
    Ok(Value::Object(meta))
}

/// The JSON object of a protobuf-encoded request body.
pub fn decode(body: &[u8]) -> Result<Value, String> {
    let unknown = body
        .strip_prefix(MAGIC)
        .ok_or("not a Kubernetes protobuf message")?;
    let unknown = fields(unknown)?;
    let type_meta = fields(bytes_of(&unknown, 1).unwrap_or_default())?;
    let api_version = string_of(&type_meta, 1)?.unwrap_or_default();
    let kind = string_of(&type_meta, 2)?.unwrap_or_default();
    let raw = fields(bytes_of(&unknown, 2).unwrap_or_default())?;
    let metadata = object_meta(bytes_of(&raw, 1).unwrap_or_default())?;
    let mut obj = json!({"apiVersion": api_version, "kind": kind, "metadata": metadata});
    match kind.as_str() {
        "Namespace" | "ServiceAccount" => {}
        "ConfigMap" => {
            let data = string_map(&raw, 2)?;
            if !data.is_empty() {
                obj["data"] = Value::Object(data);
            }
        }
        other => {
            return Err(format!(
                "protobuf bodies are decoded for Namespace, ServiceAccount and ConfigMap only, not {other:?}: send JSON or YAML (kubectl create -f / apply -f)"
            ))
        }
    }
    Ok(obj)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn len_field(number: u64, bytes: &[u8]) -> Vec<u8> {
        let mut out = vec![((number << 3) | 2) as u8, bytes.len() as u8];
        out.extend_from_slice(bytes);
        out
    }

    fn message(kind: &str, raw_rest: &[u8]) -> Vec<u8> {
        let mut type_meta = len_field(1, b"v1");
        type_meta.extend(len_field(2, kind.as_bytes()));
        let mut label = len_field(1, b"team");
        label.extend(len_field(2, b"a"));
        let mut meta = len_field(1, b"demo");
        meta.extend(len_field(11, &label));
        let mut raw = len_field(1, &meta);
        raw.extend_from_slice(raw_rest);
        let mut out = MAGIC.to_vec();
        out.extend(len_field(1, &type_meta));
        out.extend(len_field(2, &raw));
        out.extend(len_field(4, b"application/vnd.kubernetes.protobuf"));
        out
    }

    #[test]
    fn decodes_namespace_and_configmap() {
        let ns = decode(&message("Namespace", &[])).unwrap();
        assert_eq!(
            ns,
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "demo", "labels": {"team": "a"}}})
        );
        let mut entry = len_field(1, b"k");
        entry.extend(len_field(2, b"v"));
        let cm = decode(&message("ConfigMap", &len_field(2, &entry))).unwrap();
        assert_eq!(cm["data"], json!({"k": "v"}));
    }

    #[test]
    fn rejects_garbage_and_other_kinds() {
        assert!(decode(b"{}").is_err());
        assert!(decode(b"k8s\0\x0a\x7f").is_err());
        assert!(decode(&message("Pod", &[])).is_err());
        assert!(decode(b"k8s\0\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff").is_err());
    }
}
