//! The small HTTP/1.1 server all agent endpoints share (plugin sockets, health): one
//! hyper connection task per accepted stream, bounded header and body reads, graceful
//! stop on cancel, plain-text answers.

use bytes::Bytes;
use http::{header, HeaderValue, Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;

pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;
pub type Response = http::Response<Full<Bytes>>;
/// Answers one request.
pub type Handler = Arc<dyn Fn(Request<Incoming>) -> BoxFuture<Response> + Send + Sync>;

/// A client that connects and sends nothing must not hold a task forever.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Bodies are small and local; a slow one is a stuck client.
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// A `text/plain` answer.
pub fn text(status: StatusCode, body: impl Into<String>) -> Response {
    let mut response = http::Response::new(Full::new(Bytes::from(body.into())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// 405 with the `Allow` header naming the one method a path takes.
pub fn method_not_allowed(allow: &'static str) -> Response {
    let mut response = text(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("method not allowed: use {allow}\n"),
    );
    response
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(allow));
    response
}

pub fn not_found(path: &str) -> Response {
    text(StatusCode::NOT_FOUND, format!("no handler for {path}\n"))
}

/// Reads the whole body, at most `limit` bytes: 413 when it is longer (refused on the
/// `Content-Length` alone when the client announced it), 400 when it breaks off.
pub async fn read_body(request: Request<Incoming>, limit: usize) -> Result<Bytes, Response> {
    let too_large = || {
        text(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body larger than {limit} bytes\n"),
        )
    };
    let announced = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if announced.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let body = Limited::new(request.into_body(), limit);
    match tokio::time::timeout(BODY_READ_TIMEOUT, body.collect()).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(too_large()),
        Ok(Err(e)) => Err(text(
            StatusCode::BAD_REQUEST,
            format!("reading the request body: {e}\n"),
        )),
        Err(_) => Err(text(
            StatusCode::REQUEST_TIMEOUT,
            "request body not received in time\n",
        )),
    }
}

/// Serves one accepted connection in its own task until the peer closes or `cancel`
/// fires (then in-flight requests finish first).
pub fn spawn_connection<S>(stream: S, handler: Handler, cancel: CancellationToken)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let service = service_fn(move |request| {
            let handler = handler.clone();
            async move { Ok::<_, Infallible>(handler(request).await) }
        });
        let mut builder = http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT);
        let connection = builder.serve_connection(TokioIo::new(stream), service);
        tokio::pin!(connection);
        let result = tokio::select! {
            result = connection.as_mut() => result,
            _ = cancel.cancelled() => {
                connection.as_mut().graceful_shutdown();
                connection.await
            }
        };
        if let Err(e) = result {
            tracing::debug!("connection ended with an error: {e}");
        }
    });
}

/// Serves `handler` on a TCP listener until `cancel`, one task per connection.
/// `what` names the port in the log when accepting fails.
pub async fn serve_tcp(
    listener: tokio::net::TcpListener,
    handler: Handler,
    cancel: CancellationToken,
    what: &'static str,
) {
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => spawn_connection(stream, handler.clone(), cancel.clone()),
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!("accept on the {what} port failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            },
        }
    }
}
