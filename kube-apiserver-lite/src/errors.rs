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
    /// `details.name` / `details.kind` when the error is about one object.
    pub details: Option<(String, String)>,
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

    fn about(mut self, plural: &str, name: &str) -> Self {
        self.details = Some((name.to_string(), plural.to_string()));
        self
    }

    pub fn not_found(plural: &str, name: &str) -> Self {
        Self::new(404, "NotFound", format!("{plural} \"{name}\" not found")).about(plural, name)
    }

    pub fn already_exists(plural: &str, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{plural} \"{name}\" already exists"),
        )
        .about(plural, name)
    }

    /// Optimistic concurrency failure: the caller's resourceVersion is stale.
    pub fn conflict(plural: &str, name: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {plural} \"{name}\": the object has been \
                 modified; please apply your changes to the latest version and try again"
            ),
        )
        .about(plural, name)
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
        .about(kind, name)
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

    pub fn path_not_found(path: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        )
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
        if let Some((name, kind)) = &self.details {
            status["details"] = json!({ "name": name, "kind": kind });
        }
        status
    }
}

pub type ApiResult<T> = Result<T, ApiError>;
