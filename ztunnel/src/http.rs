//! A small HTTP/1.1 server for ztunnel's operational endpoints (admin, metrics,
//! readiness). The data plane does not use it.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::debug;

/// Request bodies above this are refused: these endpoints take tiny inputs.
const MAX_BODY: usize = 64 * 1024;

/// A request as handlers see it: head plus the whole (bounded) body.
pub struct SimpleRequest {
    pub method: http::Method,
    pub path: String,
    pub query: Option<String>,
    pub body: Bytes,
}

pub type SimpleResponse = Response<Full<Bytes>>;

pub fn text(status: StatusCode, body: impl Into<String>) -> SimpleResponse {
    let mut response = Response::new(Full::new(Bytes::from(body.into())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

pub fn json(value: &serde_json::Value) -> SimpleResponse {
    let body = serde_json::to_vec_pretty(value).unwrap_or_default();
    let mut response = Response::new(Full::new(Bytes::from(body)));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

/// Serves `handler` on `listener` until `stop` fires.
pub async fn serve<H, F>(listener: TcpListener, stop: CancellationToken, handler: H)
where
    H: Fn(SimpleRequest) -> F + Send + Sync + 'static,
    F: Future<Output = SimpleResponse> + Send + 'static,
{
    let handler = Arc::new(handler);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    debug!(error = %e, "accept failed");
                    continue;
                }
            },
            () = stop.cancelled() => return,
        };
        let handler = handler.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let handler = handler.clone();
                async move { Ok::<_, Infallible>(dispatch(request, handler.as_ref()).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn dispatch<H, F>(request: Request<Incoming>, handler: &H) -> SimpleResponse
where
    H: Fn(SimpleRequest) -> F,
    F: Future<Output = SimpleResponse>,
{
    let (parts, body) = request.into_parts();
    let body = match Limited::new(body, MAX_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return text(StatusCode::PAYLOAD_TOO_LARGE, "request body too large\n"),
    };
    handler(SimpleRequest {
        method: parts.method,
        path: parts.uri.path().to_owned(),
        query: parts.uri.query().map(str::to_owned),
        body,
    })
    .await
}
