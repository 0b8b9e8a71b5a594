//! A custom resource's structural schema (a CRD version's `openAPIV3Schema`), applied
//! as kube-apiserver applies it to every write: unknown fields pruned, nulls dropped
//! where they are not allowed, defaults filled in, then the value validated, with
//! apimachinery's field errors (path, reason, message) so clients print the same text.
//!
//! Also the structural check a CRD's schema itself must pass when the CRD is created.
//! `x-kubernetes-validations` (CEL rules) are not evaluated.

use std::fmt::Write as _;

use regex::Regex;
use serde_json::{Map, Value};

/// One problem with a value, as apimachinery's `field.Error`.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    /// `FieldValueRequired`, `FieldValueNotSupported`, `FieldValueInvalid`, ...
    pub reason: &'static str,
    /// The field's path, e.g. `spec.rules[0].from[0].source.principals`.
    pub field: String,
    /// The problem without the field, e.g. `Required value`.
    pub message: String,
}

impl FieldError {
    fn new(reason: &'static str, field: &str, message: String) -> Self {
        FieldError {
            reason,
            field: field.to_string(),
            message,
        }
    }

    fn required(field: &str) -> Self {
        Self::new("FieldValueRequired", field, "Required value".into())
    }

    fn invalid(field: &str, value: &Value, detail: &str) -> Self {
        Self::new(
            "FieldValueInvalid",
            field,
            format!("Invalid value: {}: {detail}", quote(value)),
        )
    }
}

/// A value as apimachinery quotes it in a message: strings in double quotes, other
/// scalars bare, objects and arrays by their type.
fn quote(value: &Value) -> String {
    match value {
        Value::String(s) => format!("{s:?}"),
        Value::Object(_) => "\"object\"".into(),
        Value::Array(_) => "\"array\"".into(),
        other => other.to_string(),
    }
}

/// The JSON type name OpenAPI uses for `value`.
fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn child(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_string()
    } else {
        format!("{path}.{name}")
    }
}

fn index(path: &str, i: usize) -> String {
    format!("{path}[{i}]")
}

fn key(path: &str, k: &str) -> String {
    format!("{path}[{k}]")
}

/// Top-level fields every object keeps whatever the schema says.
const ROOT_META: [&str; 3] = ["apiVersion", "kind", "metadata"];

/// A structural schema.
#[derive(Debug, Clone, PartialEq)]
pub struct Schema {
    root: Value,
}

impl Schema {
    /// The schema of one CRD version (`spec.versions[i].schema.openAPIV3Schema`).
    pub fn new(root: Value) -> Self {
        Schema { root }
    }

    /// Prunes fields the schema does not know (returning their paths, for
    /// `fieldValidation`), drops nulls where a field is not nullable, and fills in
    /// defaults. `apiVersion`, `kind` and `metadata` at the root are left alone.
    pub fn prune_and_default(&self, obj: &mut Value) -> Vec<String> {
        let mut pruned = Vec::new();
        if let Value::Object(map) = obj {
            let props = self.root.get("properties").and_then(Value::as_object);
            let names: Vec<String> = map.keys().cloned().collect();
            for name in names {
                if ROOT_META.contains(&name.as_str()) {
                    continue;
                }
                match props.and_then(|p| p.get(&name)) {
                    Some(sub) => {
                        if let Some(v) = map.get_mut(&name) {
                            prune(sub, v, &name, &mut pruned);
                        }
                        if map.get(&name).is_some_and(Value::is_null) && !nullable(sub) {
                            map.remove(&name);
                        }
                    }
                    None if preserves_unknown(&self.root) => {}
                    None => {
                        map.remove(&name);
                        pruned.push(name);
                    }
                }
            }
            apply_defaults(&self.root, map);
        }
        pruned
    }

    /// Every violation of the schema (after [`Schema::prune_and_default`]), root
    /// metadata excluded.
    pub fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errors = Vec::new();
        match obj {
            Value::Object(map) => {
                let stripped: Map<String, Value> = map
                    .iter()
                    .filter(|(k, _)| !ROOT_META.contains(&k.as_str()))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                validate(&self.root, &Value::Object(stripped), "", &mut errors);
            }
            other => validate(&self.root, other, "", &mut errors),
        }
        errors
    }

    /// Why the schema is not structural (kube-apiserver's `ValidateStructural`, the
    /// rules that matter in practice), with paths under `path`.
    pub fn structural_errors(&self, path: &str) -> Vec<FieldError> {
        let mut errors = Vec::new();
        match self.root.get("type").and_then(Value::as_str) {
            Some("object") => {}
            _ => errors.push(FieldError::new(
                "FieldValueInvalid",
                &child(path, "type"),
                "Invalid value: \"\": must be object at the root".into(),
            )),
        }
        if self.root.get("additionalProperties").is_some() {
            errors.push(FieldError::new(
                "FieldValueForbidden",
                &child(path, "additionalProperties"),
                "Forbidden: must not be used at the root".into(),
            ));
        }
        if let Some(meta) = self.root.pointer("/properties/metadata") {
            let allowed = ["type", "properties", "description"];
            let restricted = meta
                .as_object()
                .is_some_and(|m| m.keys().any(|k| !allowed.contains(&k.as_str())))
                || meta
                    .get("properties")
                    .and_then(Value::as_object)
                    .is_some_and(|p| p.keys().any(|k| k != "name" && k != "generateName"));
            if restricted {
                errors.push(FieldError::new(
                    "FieldValueForbidden",
                    &key(&child(path, "properties"), "metadata"),
                    "Forbidden: must not specify anything other than name and generateName, but metadata is implicitly specified".into(),
                ));
            }
        }
        structural(&self.root, path, true, &mut errors);
        errors
    }
}

fn preserves_unknown(schema: &Value) -> bool {
    schema
        .get("x-kubernetes-preserve-unknown-fields")
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

fn nullable(schema: &Value) -> bool {
    schema
        .get("nullable")
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

fn int_or_string(schema: &Value) -> bool {
    schema
        .get("x-kubernetes-int-or-string")
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

/// Prunes `value` against `schema` in place.
fn prune(schema: &Value, value: &mut Value, path: &str, pruned: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties");
            let keep_unknown = preserves_unknown(schema);
            let names: Vec<String> = map.keys().cloned().collect();
            for name in names {
                let sub = props
                    .and_then(|p| p.get(&name))
                    .or(additional.filter(|a| a.is_object()));
                match sub {
                    Some(sub) => {
                        let field = if props.is_some_and(|p| p.contains_key(&name)) {
                            child(path, &name)
                        } else {
                            key(path, &name)
                        };
                        if let Some(v) = map.get_mut(&name) {
                            prune(sub, v, &field, pruned);
                        }
                        if map.get(&name).is_some_and(Value::is_null) && !nullable(sub) {
                            map.remove(&name);
                        }
                    }
                    None if keep_unknown || additional == Some(&Value::Bool(true)) => {}
                    None => {
                        map.remove(&name);
                        pruned.push(child(path, &name));
                    }
                }
            }
            apply_defaults(schema, map);
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter_mut().enumerate() {
                    prune(item_schema, item, &index(path, i), pruned);
                }
            }
        }
        _ => {}
    }
}

/// Fills missing properties that have a `default` (and defaults inside those).
fn apply_defaults(schema: &Value, map: &mut Map<String, Value>) {
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    for (name, sub) in props {
        if map.contains_key(name) {
            continue;
        }
        if let Some(default) = sub.get("default") {
            let mut value = default.clone();
            let mut ignored = Vec::new();
            prune(sub, &mut value, "", &mut ignored);
            map.insert(name.clone(), value);
        }
    }
}

fn validate(schema: &Value, value: &Value, path: &str, errors: &mut Vec<FieldError>) {
    if value.is_null() {
        if !nullable(schema) && schema.get("type").is_some() {
            errors.push(FieldError::new(
                "FieldValueTypeInvalid",
                path,
                format!(
                    "Invalid value: \"null\": {path} in body must be of type {}: \"null\"",
                    schema.get("type").and_then(Value::as_str).unwrap_or("")
                ),
            ));
        }
        return;
    }
    if int_or_string(schema) {
        if !matches!(type_name(value), "integer" | "string") {
            errors.push(FieldError::invalid(
                path,
                value,
                &format!("{path} in body must be of type integer or string"),
            ));
        }
    } else if let Some(want) = schema.get("type").and_then(Value::as_str) {
        let got = type_name(value);
        let ok = got == want || (want == "number" && got == "integer");
        if !ok {
            errors.push(FieldError::new(
                "FieldValueTypeInvalid",
                path,
                format!(
                    "Invalid value: \"{got}\": {path} in body must be of type {want}: \"{got}\""
                ),
            ));
            return;
        }
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array) {
        if !allowed.contains(value) {
            let list: Vec<String> = allowed.iter().map(|v| v.to_string()).collect();
            errors.push(FieldError::new(
                "FieldValueNotSupported",
                path,
                format!(
                    "Unsupported value: {}: supported values: {}",
                    value,
                    list.join(", ")
                ),
            ));
        }
    }
    match value {
        Value::String(s) => validate_string(schema, s, value, path, errors),
        Value::Number(n) => validate_number(schema, n.as_f64().unwrap_or(0.0), value, path, errors),
        Value::Array(items) => validate_array(schema, items, value, path, errors),
        Value::Object(map) => validate_object(schema, map, value, path, errors),
        _ => {}
    }
    validate_junctors(schema, value, path, errors);
}

fn limit(schema: &Value, name: &str) -> Option<u64> {
    schema.get(name).and_then(Value::as_u64)
}

fn validate_string(
    schema: &Value,
    s: &str,
    value: &Value,
    path: &str,
    errors: &mut Vec<FieldError>,
) {
    let chars = s.chars().count() as u64;
    if let Some(max) = limit(schema, "maxLength") {
        if chars > max {
            errors.push(FieldError::new(
                "FieldValueTooLong",
                path,
                format!("Too long: may not be longer than {max}"),
            ));
        }
    }
    if let Some(min) = limit(schema, "minLength") {
        if chars < min {
            errors.push(FieldError::invalid(
                path,
                value,
                &format!("{path} in body should be at least {min} chars long"),
            ));
        }
    }
    if let Some(pattern) = schema.get("pattern").and_then(Value::as_str) {
        // An invalid pattern is refused when the CRD is created.
        if let Ok(re) = Regex::new(pattern) {
            if !re.is_match(s) {
                errors.push(FieldError::invalid(
                    path,
                    value,
                    &format!("{path} in body should match '{pattern}'"),
                ));
            }
        }
    }
}

fn validate_number(
    schema: &Value,
    n: f64,
    value: &Value,
    path: &str,
    errors: &mut Vec<FieldError>,
) {
    let exclusive = |name: &str| schema.get(name).and_then(Value::as_bool).unwrap_or(false);
    if let Some(min) = schema.get("minimum").and_then(Value::as_f64) {
        if n < min || (exclusive("exclusiveMinimum") && n == min) {
            let op = if exclusive("exclusiveMinimum") {
                "greater than"
            } else {
                "greater than or equal to"
            };
            errors.push(FieldError::invalid(
                path,
                value,
                &format!("{path} in body should be {op} {}", schema["minimum"]),
            ));
        }
    }
    if let Some(max) = schema.get("maximum").and_then(Value::as_f64) {
        if n > max || (exclusive("exclusiveMaximum") && n == max) {
            let op = if exclusive("exclusiveMaximum") {
                "less than"
            } else {
                "less than or equal to"
            };
            errors.push(FieldError::invalid(
                path,
                value,
                &format!("{path} in body should be {op} {}", schema["maximum"]),
            ));
        }
    }
}

fn validate_array(
    schema: &Value,
    items: &[Value],
    value: &Value,
    path: &str,
    errors: &mut Vec<FieldError>,
) {
    let len = items.len() as u64;
    if let Some(max) = limit(schema, "maxItems") {
        if len > max {
            errors.push(FieldError::new(
                "FieldValueTooMany",
                path,
                format!("Too many: {len}: must have at most {max} items"),
            ));
        }
    }
    if let Some(min) = limit(schema, "minItems") {
        if len < min {
            errors.push(FieldError::invalid(
                path,
                value,
                &format!("{path} in body should have at least {min} items"),
            ));
        }
    }
    if let Some(item_schema) = schema.get("items") {
        for (i, item) in items.iter().enumerate() {
            validate(item_schema, item, &index(path, i), errors);
        }
    }
}

fn validate_object(
    schema: &Value,
    map: &Map<String, Value>,
    value: &Value,
    path: &str,
    errors: &mut Vec<FieldError>,
) {
    for required in schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        if !map.contains_key(required) {
            errors.push(FieldError::required(&child(path, required)));
        }
    }
    let len = map.len() as u64;
    if let Some(max) = limit(schema, "maxProperties") {
        if len > max {
            errors.push(FieldError::new(
                "FieldValueTooMany",
                path,
                format!("Too many: {len}: must have at most {max} items"),
            ));
        }
    }
    if let Some(min) = limit(schema, "minProperties") {
        if len < min {
            errors.push(FieldError::invalid(
                path,
                value,
                &format!("{path} in body should have at least {min} properties"),
            ));
        }
    }
    let props = schema.get("properties").and_then(Value::as_object);
    let additional = schema.get("additionalProperties").filter(|a| a.is_object());
    for (name, v) in map {
        if let Some(sub) = props.and_then(|p| p.get(name)) {
            validate(sub, v, &child(path, name), errors);
        } else if let Some(sub) = additional {
            validate(sub, v, &key(path, name), errors);
        }
    }
}

/// `allOf`, `anyOf`, `oneOf` and `not`: value validations over the same value.
fn validate_junctors(schema: &Value, value: &Value, path: &str, errors: &mut Vec<FieldError>) {
    let passes = |sub: &Value| {
        let mut found = Vec::new();
        validate(sub, value, path, &mut found);
        found.is_empty()
    };
    let subs = |name: &str| -> Vec<&Value> {
        schema
            .get(name)
            .and_then(Value::as_array)
            .map(|a| a.iter().collect())
            .unwrap_or_default()
    };
    for sub in subs("allOf") {
        validate(sub, value, path, errors);
    }
    let any = subs("anyOf");
    if !any.is_empty() && !any.iter().any(|s| passes(s)) {
        errors.push(FieldError::invalid(
            path,
            value,
            "must validate at least one schema (anyOf)",
        ));
    }
    let one = subs("oneOf");
    if !one.is_empty() && one.iter().filter(|s| passes(s)).count() != 1 {
        errors.push(FieldError::invalid(
            path,
            value,
            "must validate one and only one schema (oneOf)",
        ));
    }
    if let Some(not) = schema.get("not") {
        if passes(not) {
            errors.push(FieldError::invalid(
                path,
                value,
                "must not validate the schema (not)",
            ));
        }
    }
}

/// The structural rules of one node (and below). `specified` is false inside
/// junctors, where only value validations may appear.
fn structural(schema: &Value, path: &str, specified: bool, errors: &mut Vec<FieldError>) {
    let Some(node) = schema.as_object() else {
        errors.push(FieldError::new(
            "FieldValueInvalid",
            path,
            "Invalid value: must be a schema object".into(),
        ));
        return;
    };
    let has = |k: &str| node.contains_key(k);
    if specified {
        if !has("type") && !int_or_string(schema) && !preserves_unknown(schema) {
            let what = if path.ends_with("openAPIV3Schema") {
                "at the root"
            } else if path.ends_with(".items") {
                "for specified array items"
            } else {
                "for specified object fields"
            };
            errors.push(FieldError::new(
                "FieldValueRequired",
                &child(path, "type"),
                format!("Required value: must not be empty {what}"),
            ));
        }
        if node.get("type").and_then(Value::as_str) == Some("array") && !has("items") {
            errors.push(FieldError::new(
                "FieldValueRequired",
                &child(path, "items"),
                "Required value: must be specified".into(),
            ));
        }
        if has("properties")
            && node
                .get("additionalProperties")
                .is_some_and(Value::is_object)
        {
            errors.push(FieldError::new(
                "FieldValueForbidden",
                &child(path, "additionalProperties"),
                "Forbidden: additionalProperties and properties are mutual exclusive".into(),
            ));
        }
    } else {
        for forbidden in [
            "type",
            "default",
            "description",
            "nullable",
            "additionalProperties",
            "x-kubernetes-preserve-unknown-fields",
            "x-kubernetes-embedded-resource",
            "x-kubernetes-int-or-string",
            "x-kubernetes-validations",
        ] {
            if has(forbidden) && !(forbidden == "type" && is_int_or_string_junctor(path)) {
                errors.push(FieldError::new(
                    "FieldValueForbidden",
                    &child(path, forbidden),
                    "Forbidden: must be empty to be structural".into(),
                ));
            }
        }
    }
    if let Some(pattern) = node.get("pattern").and_then(Value::as_str) {
        if let Err(e) = Regex::new(pattern) {
            let mut message = String::new();
            let _ = write!(
                message,
                "Invalid value: {pattern:?}: must be a valid regular expression: {e}"
            );
            errors.push(FieldError::new(
                "FieldValueInvalid",
                &child(path, "pattern"),
                message,
            ));
        }
    }
    if let Some(props) = node.get("properties").and_then(Value::as_object) {
        for (name, sub) in props {
            structural(
                sub,
                &key(&child(path, "properties"), name),
                specified,
                errors,
            );
        }
    }
    if let Some(sub) = node.get("additionalProperties").filter(|a| a.is_object()) {
        structural(sub, &child(path, "additionalProperties"), specified, errors);
    }
    if let Some(sub) = node.get("items") {
        structural(sub, &child(path, "items"), specified, errors);
    }
    for junctor in ["allOf", "anyOf", "oneOf"] {
        for (i, sub) in node
            .get(junctor)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            structural(sub, &index(&child(path, junctor), i), false, errors);
        }
    }
    if let Some(sub) = node.get("not") {
        structural(sub, &child(path, "not"), false, errors);
    }
}

/// `anyOf: [{type: integer}, {type: string}]` under `x-kubernetes-int-or-string` is
/// the one place a junctor may name a type.
fn is_int_or_string_junctor(path: &str) -> bool {
    path.contains(".anyOf[")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn policy_schema() -> Schema {
        Schema::new(json!({
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "properties": {
                        "action": {"type": "string", "enum": ["ALLOW", "DENY", "AUDIT", "CUSTOM"]},
                        "rules": {"type": "array", "maxItems": 2, "items": {
                            "type": "object",
                            "properties": {
                                "when": {"type": "array", "items": {
                                    "type": "object", "required": ["key"],
                                    "properties": {"key": {"type": "string"},
                                                   "values": {"type": "array", "items": {"type": "string"}}}}},
                            }}},
                        "selector": {"type": "object", "properties": {
                            "matchLabels": {"type": "object", "additionalProperties": {"type": "string", "maxLength": 3}}}},
                        "mode": {"type": "string", "default": "Same"},
                    }},
                "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
            }
        }))
    }

    #[test]
    fn unknown_fields_are_pruned_defaults_filled_and_status_kept_whole() {
        let mut obj = json!({
            "apiVersion": "x/v1", "kind": "P", "metadata": {"name": "p", "labels": {"a": "b"}},
            "spec": {"action": "ALLOW", "bogus": 1, "rules": [{"when": [{"key": "k", "extra": true}]}]},
            "status": {"anything": {"goes": 1}},
            "top": 2,
        });
        let pruned = policy_schema().prune_and_default(&mut obj);
        assert_eq!(pruned, ["spec.bogus", "spec.rules[0].when[0].extra", "top"]);
        assert_eq!(obj["spec"]["mode"], "Same");
        assert_eq!(obj["status"]["anything"]["goes"], 1);
        assert_eq!(obj["metadata"]["labels"]["a"], "b");
        assert!(policy_schema().validate(&obj).is_empty());
    }

    #[test]
    fn violations_read_as_kube_apiserver_writes_them() {
        let obj = json!({"spec": {
            "action": "MAYBE",
            "rules": [{"when": [{"values": "x"}]}, {}, {}],
            "selector": {"matchLabels": {"app": "long"}},
        }});
        let errors = policy_schema().validate(&obj);
        let text: Vec<(&str, &str, &str)> = errors
            .iter()
            .map(|e| (e.reason, e.field.as_str(), e.message.as_str()))
            .collect();
        assert!(text.contains(&(
            "FieldValueNotSupported",
            "spec.action",
            "Unsupported value: \"MAYBE\": supported values: \"ALLOW\", \"DENY\", \"AUDIT\", \"CUSTOM\""
        )), "{text:?}");
        assert!(text.contains(&(
            "FieldValueTooMany",
            "spec.rules",
            "Too many: 3: must have at most 2 items"
        )));
        assert!(text.contains(&(
            "FieldValueRequired",
            "spec.rules[0].when[0].key",
            "Required value"
        )));
        assert!(text.contains(&(
            "FieldValueTypeInvalid",
            "spec.rules[0].when[0].values",
            "Invalid value: \"string\": spec.rules[0].when[0].values in body must be of type array: \"string\""
        )));
        assert!(text.contains(&(
            "FieldValueTooLong",
            "spec.selector.matchLabels[app]",
            "Too long: may not be longer than 3"
        )));
    }

    #[test]
    fn junctors_patterns_and_bounds() {
        let schema = Schema::new(json!({"type": "object", "properties": {"spec": {
        "type": "object",
        "oneOf": [{"required": ["a"]}, {"required": ["b"]}],
        "properties": {
            "a": {"type": "string", "pattern": "^[a-z]+$"},
            "b": {"type": "integer", "minimum": 1, "maximum": 5},
            "c": {"x-kubernetes-int-or-string": true},
        }}}}));
        assert!(schema
            .validate(&json!({"spec": {"a": "ok", "c": 3}}))
            .is_empty());
        assert!(schema
            .validate(&json!({"spec": {"b": 2, "c": "3"}}))
            .is_empty());
        let both = schema.validate(&json!({"spec": {"a": "ok", "b": 2}}));
        assert_eq!(
            both[0].message,
            "Invalid value: \"object\": must validate one and only one schema (oneOf)"
        );
        let bad = schema.validate(&json!({"spec": {"a": "A1", "c": true}}));
        assert!(
            bad.iter()
                .any(|e| e.message.contains("should match '^[a-z]+$'")),
            "{bad:?}"
        );
        assert!(bad.iter().any(|e| e.field == "spec.c"), "{bad:?}");
        let big = schema.validate(&json!({"spec": {"b": 9}}));
        assert!(
            big[0]
                .message
                .ends_with("should be less than or equal to 5"),
            "{big:?}"
        );
    }

    #[test]
    fn the_structural_check_finds_what_kube_apiserver_refuses() {
        assert!(policy_schema().structural_errors("s").is_empty());
        let bad = Schema::new(json!({
            "type": "object",
            "properties": {
                "spec": {"properties": {"x": {"type": "array"}, "y": {"type": "string", "pattern": "("}}},
                "metadata": {"type": "object", "properties": {"labels": {"type": "object"}}},
            },
            "oneOf": [{"type": "object"}],
        }));
        let fields: Vec<String> = bad
            .structural_errors("s")
            .iter()
            .map(|e| e.field.clone())
            .collect();
        for want in [
            "s.properties[spec].type",
            "s.properties[spec].properties[x].items",
            "s.properties[spec].properties[y].pattern",
            "s.properties[metadata]",
            "s.oneOf[0].type",
        ] {
            assert!(
                fields.contains(&want.to_string()),
                "{want} missing in {fields:?}"
            );
        }
        let not_object = Schema::new(json!({"type": "string"}));
        assert_eq!(not_object.structural_errors("s")[0].field, "s.type");
    }
}
