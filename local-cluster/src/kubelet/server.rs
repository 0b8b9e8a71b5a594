//! The kubelet's HTTP endpoint on its node (port 10250), for what the API server
//! forwards to it: `GET /containerLogs/<namespace>/<pod>/<container>` with
//! `follow`, `previous`, `tailLines`, `sinceSeconds`, `sinceTime`, `timestamps` and
//! `limitBytes`. A followed log streams until the container instance's output ends
//! or the client goes.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use futures::channel::mpsc;
use futures::{SinkExt, StreamExt};
use http::{Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use crate::kubelet::container_log::{parse, render, LogFile, LogOptions};
use kube_apiserver_lite::Query;

/// kubelet's port.
pub const KUBELET_PORT: u16 = 10250;

/// How the server finds a container's log: (namespace, pod, container, previous)
/// to its file, or the message of a 404/400.
pub type LogLookup = dyn Fn(&str, &str, &str, bool) -> Result<LogFile, (u16, String)> + Send + Sync;

type Body = BoxBody<Bytes, Infallible>;

/// The server; stops when dropped.
pub struct KubeletServer {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for KubeletServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl KubeletServer {
    /// Listens on `addr` inside the network namespace at `netns`.
    pub fn start(netns: &Path, addr: SocketAddr, lookup: Arc<LogLookup>) -> Result<Self> {
        let listener =
            test_support::netns::run_in(netns, move || std::net::TcpListener::bind(addr))?
                .with_context(|| format!("kubelet server on {addr}"))?;
        listener.set_nonblocking(true)?;
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let thread = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(serve(listener, lookup, stopped));
        });
        Ok(KubeletServer {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

async fn serve(
    listener: std::net::TcpListener,
    lookup: Arc<LogLookup>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
        return;
    };
    loop {
        let stream = tokio::select! {
            _ = &mut stopped => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => continue,
            },
        };
        let lookup = lookup.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let lookup = lookup.clone();
                async move { Ok::<_, Infallible>(handle(lookup.as_ref(), req)) }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, service)
                .await;
        });
    }
}

fn handle(lookup: &LogLookup, req: Request<Incoming>) -> Response<Body> {
    let path: Vec<&str> = req.uri().path().trim_matches('/').split('/').collect();
    let ["containerLogs", namespace, pod, container] = path.as_slice() else {
        return text(404, "404 page not found\n".into());
    };
    let query = Query::parse(req.uri().query());
    let flag = |k: &str| query.flag(k);
    let number = |k: &str| query.get(k).and_then(|v| v.parse::<i64>().ok());
    let since = match (number("sinceSeconds"), query.get("sinceTime")) {
        (Some(secs), _) => Some(OffsetDateTime::now_utc() - time::Duration::seconds(secs)),
        (None, Some(t)) => match OffsetDateTime::parse(t, &Rfc3339) {
            Ok(t) => Some(t),
            Err(_) => return text(400, format!("invalid sinceTime {t:?}\n")),
        },
        _ => None,
    };
    let options = LogOptions {
        tail_lines: number("tailLines").and_then(|n| usize::try_from(n).ok()),
        since,
        timestamps: flag("timestamps"),
        limit_bytes: number("limitBytes").and_then(|n| usize::try_from(n).ok()),
    };
    let log = match lookup(namespace, pod, container, flag("previous")) {
        Ok(log) => log,
        Err((code, message)) => return text(code, message),
    };
    if !flag("follow") {
        let raw = std::fs::read_to_string(&log.path).unwrap_or_default();
        return text(200, render(&parse(&raw), &options));
    }
    follow(log, options)
}

/// Streams what the log holds (as `options` select), then every line as it comes,
/// until the instance's output ends or the client goes (or `limitBytes` is reached).
fn follow(log: LogFile, options: LogOptions) -> Response<Body> {
    let (mut tx, rx) = mpsc::channel::<Bytes>(16);
    tokio::spawn(async move {
        let raw = tokio::fs::read_to_string(&log.path)
            .await
            .unwrap_or_default();
        let mut offset = raw.rfind('\n').map_or(0, |i| i + 1);
        let first = render(&parse(&raw[..offset]), &options);
        let mut budget = options.limit_bytes.unwrap_or(usize::MAX);
        if tx.send(within(first, &mut budget)).await.is_err() {
            return;
        }
        // New lines: no tail or since to apply any more.
        let rest = LogOptions {
            timestamps: options.timestamps,
            ..LogOptions::default()
        };
        while budget > 0 {
            let done = log.finished();
            let raw = tokio::fs::read_to_string(&log.path)
                .await
                .unwrap_or_default();
            let end = raw.rfind('\n').map_or(0, |i| i + 1);
            if end > offset {
                let chunk = render(&parse(&raw[offset..end]), &rest);
                offset = end;
                if tx.send(within(chunk, &mut budget)).await.is_err() {
                    return;
                }
            } else if done || tx.is_closed() {
                return;
            } else {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    });
    let body = StreamBody::new(rx.map(|chunk| Ok::<_, Infallible>(Frame::data(chunk))));
    Response::builder()
        .status(200)
        .header(http::header::CONTENT_TYPE, "text/plain")
        .body(BodyExt::boxed(body))
        .unwrap_or_else(|_| text(500, String::new()))
}

/// `chunk`, cut to what is left of `limitBytes` (`budget`, which it uses up).
fn within(chunk: String, budget: &mut usize) -> Bytes {
    let mut bytes = chunk.into_bytes();
    bytes.truncate(*budget);
    *budget -= bytes.len();
    Bytes::from(bytes)
}

fn text(code: u16, body: String) -> Response<Body> {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(http::header::CONTENT_TYPE, "text/plain")
        .body(Full::new(Bytes::from(body)).boxed())
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed()))
}
