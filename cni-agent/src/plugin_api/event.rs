//! `POST /cmdadd` on `pluginevent.sock`: the plugin reports a new pod sandbox and waits
//! for our answer before the pod may start. The body is decoded and checked here; what
//! to do with the pod is the [`CmdAddHandler`]'s business (the enrollment engine).
//!
//! Answers, as the plugin reads them: 200 done, 400 unusable event, 413 body too large,
//! 500 handling failed (the message is the body). Anything but 200 becomes a CNI error,
//! so the runtime retries the sandbox: a bad request never changes any state.

use http::{Method, StatusCode};
use mesh_runtime::http_server::{self, Limits, Request, Response};
use shared_types::cni::{CniPluginAddEvent, CNI_ADD_EVENT_PATH};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

/// Far above a real event (a pod's few IPs), far below anything that hurts.
pub const MAX_EVENT_BODY: usize = 64 * 1024;

/// The server's backstop for one ADD: the handler bounds its own wait (the CNI event
/// timeout, shorter than the plugin's), so this only ends a handler that is stuck.
const EVENT_REQUEST_TIMEOUT: Duration = Duration::from_secs(300);

/// A boxed handler future.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// The event socket's limits.
pub fn limits() -> Limits {
    Limits {
        max_body: MAX_EVENT_BODY,
        request_timeout: EVENT_REQUEST_TIMEOUT,
        ..Limits::default()
    }
}

/// Why the handler refused an event.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CmdAddError {
    /// The event cannot be acted on (400).
    #[error("bad request: {0}")]
    BadRequest(String),
    /// Handling failed; the runtime will retry (500).
    #[error("{0}")]
    Failed(String),
}

/// What the agent does with a pod's ADD. Returning `Ok` lets the pod start.
pub trait CmdAddHandler: Send + Sync + 'static {
    fn handle(&self, event: CniPluginAddEvent) -> BoxFuture<Result<(), CmdAddError>>;
}

/// Any `async` closure works as a handler (tests, the placeholder in `main`).
impl<F, Fut> CmdAddHandler for F
where
    F: Fn(CniPluginAddEvent) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), CmdAddError>> + Send + 'static,
{
    fn handle(&self, event: CniPluginAddEvent) -> BoxFuture<Result<(), CmdAddError>> {
        Box::pin(self(event))
    }
}

/// The handler until enrollment exists: no namespace is ambient yet (the enablement
/// state we publish says so), so every pod may start at once, as Istio's agent answers
/// for a pod that is not ambient.
pub fn admit_all(event: CniPluginAddEvent) -> BoxFuture<Result<(), CmdAddError>> {
    Box::pin(async move {
        tracing::info!(
            pod = %format_args!("{}/{}", event.pod_namespace, event.pod_name),
            container_id = %event.container_id,
            netns = %event.netns,
            "pod ADD: not enrolled (no enrollment engine yet)"
        );
        Ok(())
    })
}

/// Checks what the handler relies on; Istio's plugin leaves out only our own fields.
pub fn validate(event: &CniPluginAddEvent) -> Result<(), String> {
    let missing = [
        ("PodName", event.pod_name.is_empty()),
        ("PodNamespace", event.pod_namespace.is_empty()),
        ("Netns", event.netns.is_empty()),
    ]
    .into_iter()
    .filter_map(|(name, empty)| empty.then_some(name))
    .collect::<Vec<_>>();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!("missing {}", missing.join(", ")))
    }
}

/// Answers one request on the event socket.
pub async fn route(request: Request, handler: Arc<dyn CmdAddHandler>) -> Response {
    if request.path != CNI_ADD_EVENT_PATH {
        return http_server::not_found(&request.path);
    }
    if request.method != Method::POST {
        return http_server::method_not_allowed("POST");
    }
    let event: CniPluginAddEvent = match serde_json::from_slice(&request.body) {
        Ok(event) => event,
        Err(e) => {
            tracing::warn!("rejected a malformed ADD event: {e}");
            return bad_request(format!("invalid ADD event: {e}"));
        }
    };
    if let Err(reason) = validate(&event) {
        tracing::warn!(container_id = %event.container_id, "rejected an ADD event: {reason}");
        return bad_request(format!("invalid ADD event: {reason}"));
    }
    // In its own task: a panicking handler answers 500 instead of dropping the
    // connection, and a plugin that gives up does not abort enrollment halfway.
    let pod = format!("{}/{}", event.pod_namespace, event.pod_name);
    match tokio::spawn(handler.handle(event)).await {
        Ok(Ok(())) => http_server::text(StatusCode::OK, ""),
        Ok(Err(CmdAddError::BadRequest(reason))) => {
            tracing::warn!(%pod, "rejected an ADD event: {reason}");
            bad_request(reason)
        }
        Ok(Err(CmdAddError::Failed(reason))) => {
            tracing::warn!(%pod, "pod ADD failed: {reason}");
            http_server::text(StatusCode::INTERNAL_SERVER_ERROR, reason)
        }
        Err(e) => {
            tracing::error!(%pod, "the ADD handler panicked: {e}");
            http_server::text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "node agent internal error while handling the pod",
            )
        }
    }
}

fn bad_request(reason: String) -> Response {
    http_server::text(StatusCode::BAD_REQUEST, reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event() -> CniPluginAddEvent {
        serde_json::from_str(
            r#"{"Netns":"/proc/1/ns/net","PodName":"a","PodNamespace":"b","IPs":null}"#,
        )
        .unwrap()
    }

    #[test]
    fn validate_names_every_missing_field() {
        assert_eq!(validate(&event()), Ok(()));
        let mut e = event();
        e.pod_name.clear();
        e.netns.clear();
        assert_eq!(validate(&e), Err("missing PodName, Netns".to_string()));
    }

    #[tokio::test]
    async fn closures_are_handlers() {
        let h: Arc<dyn CmdAddHandler> =
            Arc::new(|e: CniPluginAddEvent| async move { Err(CmdAddError::Failed(e.pod_name)) });
        assert_eq!(
            h.handle(event()).await,
            Err(CmdAddError::Failed("a".into()))
        );
        assert_eq!(admit_all(event()).await, Ok(()));
    }
}
