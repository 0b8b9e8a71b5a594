//! What writes of custom resources and of CRDs go through, as on kube-apiserver:
//! a custom resource is pruned, defaulted and validated against its version's schema
//! (unknown fields reported as `fieldValidation` asks), keeps the status rules of CRDs,
//! and is refused while its CRD is being deleted; a CRD is checked and given the
//! status the server owns.

use serde_json::{json, Value};

use crate::crds::{self, CustomResource};
use crate::errors::{ApiError, ApiResult, Cause};
use crate::routes::Query;
use crate::schema::FieldError;

/// How unknown fields in a request are reported (`?fieldValidation=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldValidation {
    /// The request fails (400), naming them. kubectl's default.
    Strict,
    /// They are dropped, each named in a `Warning` header. The server's default.
    Warn,
    /// They are dropped silently.
    Ignore,
}

impl FieldValidation {
    /// The mode a request asks for.
    pub fn of(query: &Query) -> ApiResult<Self> {
        match query.get("fieldValidation").unwrap_or("") {
            "" | "Warn" => Ok(FieldValidation::Warn),
            "Strict" => Ok(FieldValidation::Strict),
            "Ignore" => Ok(FieldValidation::Ignore),
            other => Err(ApiError::bad_request(format!(
                "fieldValidation must be one of Ignore, Warn, Strict, got {other:?}"
            ))),
        }
    }
}

fn causes(errors: Vec<FieldError>) -> Vec<Cause> {
    errors
        .into_iter()
        .map(|e| Cause {
            reason: e.reason,
            message: e.message,
            field: e.field,
        })
        .collect()
}

/// Prunes, defaults and validates `obj` (a custom resource of `custom`, written
/// through `version`). Returns the warnings to send (unknown fields, with `Warn`).
pub fn admit(
    custom: &CustomResource,
    version: &str,
    name: &str,
    obj: &mut Value,
    validation: FieldValidation,
) -> ApiResult<Vec<String>> {
    let rs = custom.resource;
    let Some(schema) = custom.version(version).and_then(|v| v.schema.as_ref()) else {
        return Ok(Vec::new());
    };
    let unknown = schema.prune_and_default(obj);
    let warnings = match validation {
        FieldValidation::Strict if !unknown.is_empty() => {
            let fields: Vec<String> = unknown
                .iter()
                .map(|f| format!("unknown field {f:?}"))
                .collect();
            return Err(ApiError::bad_request(format!(
                "{} in version {version:?} cannot be handled as a {}: strict decoding error: {}",
                rs.kind,
                rs.kind,
                fields.join(", ")
            )));
        }
        FieldValidation::Warn => unknown
            .iter()
            .map(|f| format!("unknown field {f:?}"))
            .collect(),
        _ => Vec::new(),
    };
    let errors = schema.validate(obj);
    if !errors.is_empty() {
        return Err(ApiError::invalid_fields(
            rs.group,
            rs.kind,
            name,
            causes(errors),
        ));
    }
    Ok(warnings)
}

/// A custom resource as created: without `.status` when the CRD has the status
/// subresource (status is written through `/status` only).
pub fn on_create(custom: &CustomResource, obj: &mut Value) {
    if custom.resource.status {
        if let Some(map) = obj.as_object_mut() {
            map.remove("status");
        }
    }
}

/// A write to a custom resource's `/status`: the stored object with only `.status`
/// (and the caller's resourceVersion, for the conflict check) from the request.
pub fn status_write(old: &Value, candidate: &Value) -> Value {
    let mut out = old.clone();
    let Some(map) = out.as_object_mut() else {
        return out;
    };
    match candidate.get("status") {
        Some(status) => {
            map.insert("status".into(), status.clone());
        }
        None => {
            map.remove("status");
        }
    }
    match candidate.pointer("/metadata/resourceVersion") {
        Some(rv) => crate::meta::set_path(&mut out, "/metadata/resourceVersion", rv.clone()),
        None => {
            if let Some(m) = out.get_mut("metadata").and_then(Value::as_object_mut) {
                m.remove("resourceVersion");
            }
        }
    }
    out
}

/// Refuses new objects while the CRD is being deleted.
pub fn check_not_terminating(custom: &CustomResource) -> ApiResult<()> {
    if custom.terminating {
        return Err(ApiError {
            code: 405,
            reason: "MethodNotAllowed",
            message: "create not allowed while custom resource definition is terminating".into(),
            details: None,
        });
    }
    Ok(())
}

/// A CRD as the server stores it: checked (422 naming each problem), its status the
/// server's own (accepted names against the group's `others`, conditions, stored
/// versions).
pub fn admit_crd(crd: Value, others: &[Value], old: Option<&Value>) -> ApiResult<Value> {
    let errors = crds::validate(&crd);
    if !errors.is_empty() {
        let name = crate::meta::name_of(&crd).to_string();
        return Err(ApiError::invalid_fields(
            crds::GROUP,
            "CustomResourceDefinition",
            &name,
            causes(errors),
        ));
    }
    if let Some(old) = old {
        for (field, pointer) in [("spec.group", "/spec/group"), ("spec.scope", "/spec/scope")] {
            if old.pointer(pointer) != crd.pointer(pointer) {
                let name = crate::meta::name_of(&crd).to_string();
                let value = crd.pointer(pointer).cloned().unwrap_or(json!(""));
                return Err(ApiError::invalid_fields(
                    crds::GROUP,
                    "CustomResourceDefinition",
                    &name,
                    vec![Cause {
                        reason: "FieldValueInvalid",
                        field: field.into(),
                        message: format!("Invalid value: {value}: field is immutable"),
                    }],
                ));
            }
        }
    }
    Ok(crds::with_status(crd, others, old))
}
