//! API errors rendered as Kubernetes `Status` objects, so clients (kube-rs, kubectl)
//! see the same `reason`/`code` pairs a real API server sends and take the same paths.

use serde_json::{json, Value};

/// A failed request: HTTP code, machine-readable reason and a human message.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{reason} ({code}): {message}")]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    /// `details` when the error is about one object.
    pub details: Option<Box<Details>>,
}

/// A Status's `details`: which object, and for `Invalid`, each field's problem.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Details {
    pub name: String,
    pub group: String,
    /// The resource (plural) for most errors, the kind for `Invalid`.
    pub kind: String,
    pub causes: Vec<Cause>,
}

/// One entry of `details.causes`.
#[derive(Debug, Clone, PartialEq)]
pub struct Cause {
    /// `FieldValueNotSupported`, `FieldValueRequired`, ...
    pub reason: &'static str,
    /// The problem, without the field.
    pub message: String,
    /// The field's path, e.g. `spec.rules[0].from`.
    pub field: String,
}

/// The resource name an error quotes: the plural, qualified with the group for every
/// group but core (`authorizationpolicies.security.istio.io`).
fn qualified(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    }
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn about(mut self, group: &str, kind: &str, name: &str) -> Self {
        self.details = Some(Box::new(Details {
            name: name.to_string(),
            group: group.to_string(),
            kind: kind.to_string(),
            causes: Vec::new(),
        }));
        self
    }

    /// 404 for an object of `group`/`plural` (`group` is "" for core).
    pub fn not_found(group: &str, plural: &str, name: &str) -> Self {
        let what = qualified(group, plural);
        Self::new(404, "NotFound", format!("{what} \"{name}\" not found"))
            .about(group, plural, name)
    }

    pub fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        let what = qualified(group, plural);
        Self::new(
            409,
            "AlreadyExists",
            format!("{what} \"{name}\" already exists"),
        )
        .about(group, plural, name)
    }

    /// Optimistic concurrency failure: the caller's resourceVersion is stale.
    pub fn conflict(group: &str, plural: &str, name: &str) -> Self {
        let what = qualified(group, plural);
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {what} \"{name}\": the object has been \
                 modified; please apply your changes to the latest version and try again"
            ),
        )
        .about(group, plural, name)
    }

    /// 422 listing each field's problem, as kube-apiserver's `NewInvalid`: the message
    /// is `<Kind>.<group> "<name>" is invalid: <field>: <problem>` (several in brackets).
    pub fn invalid_fields(group: &str, kind: &str, name: &str, causes: Vec<Cause>) -> Self {
        let mut lines: Vec<String> = Vec::new();
        for c in &causes {
            let line = if c.field.is_empty() {
                c.message.clone()
            } else {
                format!("{}: {}", c.field, c.message)
            };
            if !lines.contains(&line) {
                lines.push(line);
            }
        }
        let all = match lines.as_slice() {
            [one] => one.clone(),
            many => format!("[{}]", many.join(", ")),
        };
        let mut error = Self::new(
            422,
            "Invalid",
            format!("{} \"{name}\" is invalid: {all}", qualified(group, kind)),
        )
        .about(group, kind, name);
        if let Some(details) = &mut error.details {
            details.causes = causes;
        }
        error
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 422: the object itself is malformed (bad name, failed JSON patch test, ...).
    pub fn invalid(kind: &str, name: &str, message: impl std::fmt::Display) -> Self {
        Self::new(
            422,
            "Invalid",
            format!("{kind} \"{name}\" is invalid: {message}"),
        )
        .about("", kind, name)
    }

    /// 410 for a resourceVersion older than the event log (reason `Expired`, as
    /// Kubernetes sends for "too old resource version").
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!("the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/merge-patch+json, application/strategic-merge-patch+json, application/json-patch+json, application/apply-patch+yaml (got {content_type:?})"),
        )
    }

    pub fn method_not_allowed(method: &str) -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            format!("the server does not allow this method on the requested resource ({method})"),
        )
    }

    /// 404 for a path nothing is served at (a resource no CRD defines included), in
    /// kube-apiserver's words and without details.
    pub fn path_not_found() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    }

    /// 404 carrying a message from elsewhere (the kubelet's answer to a log request).
    pub fn not_found_message(message: impl Into<String>) -> Self {
        Self::new(404, "NotFound", message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// The `Status` object sent as a response body or inside a watch ERROR event.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            let mut details = json!({ "name": d.name, "kind": d.kind });
            if !d.group.is_empty() {
                details["group"] = json!(d.group);
            }
            if !d.causes.is_empty() {
                let causes: Vec<Value> = d
                    .causes
                    .iter()
                    .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
                    .collect();
                details["causes"] = json!(causes);
            }
            status["details"] = details;
        }
        status
    }
}

pub type ApiResult<T> = Result<T, ApiError>;
