//! Operations endpoints: Prometheus metrics on 15014 and readiness on 8080, as istiod.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// What readiness waits for.
pub trait Ready: Send + Sync + 'static {
    /// `None` when ready, else what is still missing.
    fn missing(&self) -> Option<String>;
}

pub async fn serve_metrics(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    serve(addr, shutdown, move |path| {
        let metrics = metrics.clone();
        async move {
            match path.as_str() {
                "/metrics" | "/stats/prometheus" => Response::builder()
                    .header(
                        header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )
                    .body(Full::from(metrics.encode())),
                _ => text(StatusCode::NOT_FOUND, "not found\n".into()),
            }
        }
    })
    .await
}

pub async fn serve_readiness(
    addr: SocketAddr,
    ready: Arc<dyn Ready>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    serve(addr, shutdown, move |path| {
        let ready = ready.clone();
        async move {
            match (path.as_str(), ready.missing()) {
                ("/ready", None) => text(StatusCode::OK, "ready\n".into()),
                ("/ready", Some(missing)) => text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("not ready: {missing}\n"),
                ),
                _ => text(StatusCode::NOT_FOUND, "not found\n".into()),
            }
        }
    })
    .await
}

fn text(status: StatusCode, body: String) -> http::Result<Response<Full<Bytes>>> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Full::from(body))
}

/// A small HTTP/1 server: GET by path, nothing else.
async fn serve<F, Fut>(
    addr: SocketAddr,
    shutdown: CancellationToken,
    handle: F,
) -> anyhow::Result<()>
where
    F: Fn(String) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = http::Result<Response<Full<Bytes>>>> + Send,
{
    let listener = crate::listen::bind(addr)?;
    tokio::spawn(async move {
        loop {
            let tcp = tokio::select! {
                () = shutdown.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok((tcp, _)) => tcp,
                    Err(_) => {
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let handle = handle.clone();
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let handle = handle.clone();
                async move {
                    let response = handle(req.uri().path().to_owned())
                        .await
                        .unwrap_or_else(|_| {
                            let mut r = Response::new(Full::from("internal error\n"));
                            *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                            r
                        });
                    Ok::<_, Infallible>(response)
                }
            });
            tokio::spawn(async move {
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(std::time::Duration::from_secs(10))
                    .serve_connection(TokioIo::new(tcp), service);
                let _ = conn.await;
            });
        }
    });
    Ok(())
}
