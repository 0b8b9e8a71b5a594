//! `GET /api/v1/namespaces/<ns>/pods/<name>/log`: the API server picks the container
//! (the `container` parameter, the `kubectl.kubernetes.io/default-container`
//! annotation, or the pod's only container) and forwards the request to the kubelet
//! of the pod's node (its InternalIP and `daemonEndpoints.kubeletEndpoint.Port`),
//! streaming the answer back, as kube-apiserver does.

use std::convert::Infallible;

use bytes::Bytes;
use futures::channel::mpsc;
use futures::{SinkExt, StreamExt};
use http::{header, Method, Request, Response};
use http_body_util::{BodyExt, Empty, StreamBody};
use hyper::body::Frame;
use serde_json::Value;

use super::errors::{ApiError, ApiResult};
use super::handlers::Ctx;
use super::resources;
use super::routes::{query_escape, Body};

/// The parameters passed on to the kubelet (PodLogOptions).
const FORWARDED: &[&str] = &[
    "follow",
    "previous",
    "tailLines",
    "sinceSeconds",
    "sinceTime",
    "timestamps",
    "limitBytes",
];

/// Serves the route when it is a pod's `log` subresource.
pub(super) async fn dispatch(ctx: &Ctx<'_>, method: &Method) -> Option<ApiResult<Response<Body>>> {
    let r = &ctx.route;
    if (r.rs.group, r.rs.plural, r.subresource.as_deref()) != ("", "pods", Some("log")) {
        return None;
    }
    if method != Method::GET {
        return Some(Err(ApiError::method_not_allowed(method.as_str())));
    }
    Some(serve(ctx).await)
}

async fn serve(ctx: &Ctx<'_>) -> ApiResult<Response<Body>> {
    let namespace = ctx.route.namespace.clone().unwrap_or_default();
    let name = ctx.route.name.clone().unwrap_or_default();
    let pods = resources::builtin("", "v1", "pods").ok_or_else(|| ApiError::internal("no pods"))?;
    let pod = ctx
        .shared
        .store
        .get(pods, &namespace, &name)
        .ok_or_else(|| ApiError::not_found("", "pods", &name))?;
    let container = container(&pod, ctx.query.get("container"))?;
    let node_name = pod["spec"]["nodeName"].as_str().unwrap_or_default();
    let nodes =
        resources::builtin("", "v1", "nodes").ok_or_else(|| ApiError::internal("no nodes"))?;
    let node = ctx.shared.store.get(nodes, "", node_name).ok_or_else(|| {
        ApiError::bad_request(format!(
            "pod {name} is not bound to a node it can reach: {node_name:?}"
        ))
    })?;
    let ip = node["status"]["addresses"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|a| a["type"] == "InternalIP")
        .and_then(|a| a["address"].as_str())
        .ok_or_else(|| ApiError::internal(format!("node {node_name} has no InternalIP")))?;
    let port = node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
        .as_u64()
        .unwrap_or(10250);
    let mut query: Vec<String> = FORWARDED
        .iter()
        .filter_map(|k| ctx.query.get(k).map(|v| format!("{k}={}", query_escape(v))))
        .collect();
    query.sort();
    let path = format!(
        "/containerLogs/{namespace}/{name}/{container}?{}",
        query.join("&")
    );
    let host = if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    };
    forward(&host, &path).await
}

/// The container a log request means.
fn container(pod: &Value, asked: Option<&str>) -> ApiResult<String> {
    let names: Vec<&str> = pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str())
        .collect();
    let name = pod["metadata"]["name"].as_str().unwrap_or_default();
    let default =
        pod["metadata"]["annotations"]["kubectl.kubernetes.io/default-container"].as_str();
    match (
        asked.filter(|a| !a.is_empty()).or(default),
        names.as_slice(),
    ) {
        (Some(c), _) if names.contains(&c) => Ok(c.to_owned()),
        (Some(c), _) => Err(ApiError::bad_request(format!(
            "container {c} is not valid for pod {name}"
        ))),
        (None, [only]) => Ok((*only).to_owned()),
        (None, _) => Err(ApiError::bad_request(format!(
            "a container name must be specified for pod {name}, choose one of: [{}]",
            names.join(" ")
        ))),
    }
}

/// GETs `path` from the kubelet at `host` and streams its answer: 200 as text, an
/// error as the API's Status with the kubelet's message.
async fn forward(host: &str, path: &str) -> ApiResult<Response<Body>> {
    let unreachable =
        |e: &dyn std::fmt::Display| ApiError::internal(format!("Get \"http://{host}{path}\": {e}"));
    let stream = tokio::net::TcpStream::connect(host)
        .await
        .map_err(|e| unreachable(&e))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| unreachable(&e))?;
    tokio::spawn(conn);
    let request = Request::get(path)
        .header(header::HOST, host)
        .body(Empty::<Bytes>::new())
        .map_err(|e| unreachable(&e))?;
    let answer = sender
        .send_request(request)
        .await
        .map_err(|e| unreachable(&e))?;
    let status = answer.status();
    let mut body = answer.into_body();
    if !status.is_success() {
        let bytes = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let message = String::from_utf8_lossy(&bytes).trim().to_owned();
        return Err(match status.as_u16() {
            404 => ApiError::not_found_message(message),
            400 => ApiError::bad_request(message),
            _ => ApiError::internal(message),
        });
    }
    let (mut tx, rx) = mpsc::channel::<Bytes>(16);
    tokio::spawn(async move {
        while let Some(Ok(frame)) = body.frame().await {
            if let Ok(data) = frame.into_data() {
                if tx.send(data).await.is_err() {
                    return;
                }
            }
        }
    });
    let body = StreamBody::new(rx.map(|chunk| Ok::<_, Infallible>(Frame::data(chunk))));
    Response::builder()
        .status(200)
        .header(header::CONTENT_TYPE, "text/plain")
        .body(BodyExt::boxed(body))
        .map_err(|e| ApiError::internal(e.to_string()))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_container_is_asked_for_annotated_or_the_only_one() {
        let one = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}]}});
        assert_eq!(container(&one, None).unwrap(), "a");
        assert!(container(&one, Some("b")).is_err());
        let two = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}, {"name": "b"}]}});
        let err = container(&two, None).unwrap_err();
        assert!(err.to_status()["message"]
            .as_str()
            .unwrap()
            .contains("choose one of: [a b]"));
        assert_eq!(container(&two, Some("b")).unwrap(), "b");
        let annotated = json!({"metadata": {"name": "p", "annotations": {"kubectl.kubernetes.io/default-container": "b"}},
            "spec": {"containers": [{"name": "a"}, {"name": "b"}]}});
        assert_eq!(container(&annotated, None).unwrap(), "b");
    }
}
