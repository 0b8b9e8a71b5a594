//! Decoding of the few protobuf bodies kubectl sends: its typed `create` commands
//! (`kubectl create namespace|serviceaccount|configmap|token`, `kubectl auth whoami`)
//! encode Kubernetes protobuf and do not fall back to JSON. Only the fields those
//! commands set are read (metadata name/generateName/namespace/labels/annotations,
//! ConfigMap data, TokenRequest and TokenReview specs); other kinds are refused with
//! 415, pointing at YAML (`create -f`, `apply`).

use serde_json::{json, Map, Value};

/// Prefix of every Kubernetes protobuf message (`runtime.Unknown` follows).
const MAGIC: &[u8] = b"k8s\0";

enum Wire<'a> {
    Varint(u64),
    Fixed,
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
            0 => Wire::Varint(varint(&mut buf)?),
            1 | 5 => {
                let n = if key & 7 == 1 { 8 } else { 4 };
                buf = buf.get(n..).ok_or("truncated fixed field")?;
                Wire::Fixed
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

/// A `repeated string` field.
fn strings_of(fields: &[(u64, Wire<'_>)], number: u64) -> Result<Vec<String>, String> {
    fields
        .iter()
        .filter_map(|(n, w)| match w {
            Wire::Bytes(b) if *n == number => Some(b),
            _ => None,
        })
        .map(|b| String::from_utf8(b.to_vec()).map_err(|_| "invalid UTF-8".to_string()))
        .collect()
}

fn varint_of(fields: &[(u64, Wire<'_>)], number: u64) -> Option<u64> {
    fields.iter().rev().find_map(|(n, w)| match w {
        Wire::Varint(v) if *n == number => Some(*v),
        _ => None,
    })
}

/// Sets `key` of `obj` to the strings of field `number`, when there are any.
fn put_strings(
    obj: &mut Map<String, Value>,
    key: &str,
    fields: &[(u64, Wire<'_>)],
    number: u64,
) -> Result<(), String> {
    let values = strings_of(fields, number)?;
    if !values.is_empty() {
        obj.insert(key.into(), json!(values));
    }
    Ok(())
}

/// `TokenRequestSpec`: audiences = 1, boundObjectRef = 3, expirationSeconds = 4.
fn token_request_spec(buf: &[u8]) -> Result<Value, String> {
    let f = fields(buf)?;
    let mut spec = Map::new();
    put_strings(&mut spec, "audiences", &f, 1)?;
    if let Some(seconds) = varint_of(&f, 4) {
        // int64 on the wire: two's complement.
        spec.insert("expirationSeconds".into(), json!(seconds as i64));
    }
    if let Some(bound) = bytes_of(&f, 3) {
        let b = fields(bound)?;
        let mut r = Map::new();
        for (number, key) in [(1, "kind"), (2, "apiVersion"), (3, "name"), (4, "uid")] {
            if let Some(v) = string_of(&b, number)? {
                r.insert(key.into(), Value::String(v));
            }
        }
        spec.insert("boundObjectRef".into(), Value::Object(r));
    }
    Ok(Value::Object(spec))
}

/// `TokenReviewSpec`: token = 1, audiences = 2.
fn token_review_spec(buf: &[u8]) -> Result<Value, String> {
    let f = fields(buf)?;
    let mut spec = Map::new();
    if let Some(token) = string_of(&f, 1)? {
        spec.insert("token".into(), Value::String(token));
    }
    put_strings(&mut spec, "audiences", &f, 2)?;
    Ok(Value::Object(spec))
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
        "Namespace" | "ServiceAccount" | "SelfSubjectReview" => {}
        "TokenRequest" => obj["spec"] = token_request_spec(bytes_of(&raw, 2).unwrap_or_default())?,
        "TokenReview" => obj["spec"] = token_review_spec(bytes_of(&raw, 2).unwrap_or_default())?,
        "ConfigMap" => {
            let data = string_map(&raw, 2)?;
            if !data.is_empty() {
                obj["data"] = Value::Object(data);
            }
        }
        other => {
            return Err(format!(
                "protobuf bodies are decoded for Namespace, ServiceAccount, ConfigMap, TokenRequest, TokenReview and SelfSubjectReview only, not {other:?}: send JSON or YAML (kubectl create -f / apply -f)"
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
    fn decodes_kubectl_create_token() {
        // Captured from `kubectl create token sa1 --audience istio-ca --duration 10m
        // --bound-object-kind Pod --bound-object-name p1 --bound-object-uid u1`.
        let body = b"k8s\x00\n(\n\x18authentication.k8s.io/v1\x12\x0cTokenRequest\x12:\n\x10\n\x00\x12\x00\x1a\x00\"\x00*\x002\x008\x00B\x00\x12 \n\x08istio-ca\x1a\x11\n\x03Pod\x12\x02v1\x1a\x02p1\"\x02u1 \xd8\x04\x1a\x04\n\x00\x12\x00\x1a\x00\"\x00";
        let tr = decode(body).unwrap();
        assert_eq!(tr["kind"], "TokenRequest");
        assert_eq!(
            tr["spec"],
            json!({"audiences": ["istio-ca"], "expirationSeconds": 600,
                   "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "p1", "uid": "u1"}})
        );
        let mut spec = len_field(1, b"tok");
        spec.extend(len_field(2, b"istio-ca"));
        let review = decode(&message("TokenReview", &len_field(2, &spec))).unwrap();
        assert_eq!(
            review["spec"],
            json!({"token": "tok", "audiences": ["istio-ca"]})
        );
    }

    #[test]
    fn rejects_garbage_and_other_kinds() {
        assert!(decode(b"{}").is_err());
        assert!(decode(b"k8s\0\x0a\x7f").is_err());
        assert!(decode(&message("Pod", &[])).is_err());
        assert!(decode(b"k8s\0\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff").is_err());
    }
}
