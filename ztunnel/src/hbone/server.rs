//! The server side of HBONE: the mutual-TLS handshake of an accepted connection, then
//! its HTTP/2 CONNECT streams, each handed to a handler.

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::RecvStream;
use http::Request;
use rustls::server::ServerConnectionData;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::*;
use crate::identity::{Identity, SecretManager};
use crate::metrics::Metrics;
use crate::tls::{self, ServerConfigCache};

/// A CONNECT's target from its head alone, or the status and metric reason it is
/// refused with: the method must be CONNECT (405), the authority an `ip:port` (400).
pub fn connect_authority<B>(
    request: &Request<B>,
) -> Result<std::net::SocketAddr, (http::StatusCode, &'static str)> {
    if request.method() != http::Method::CONNECT {
        info!(method = %request.method(), "refusing HBONE request that is not CONNECT");
        return Err((http::StatusCode::METHOD_NOT_ALLOWED, "not_connect"));
    }
    request
        .uri()
        .authority()
        .and_then(|a| a.as_str().parse::<std::net::SocketAddr>().ok())
        .map(crate::socket::to_canonical)
        .ok_or_else(|| {
            info!(uri = %request.uri(), "refusing CONNECT with a malformed authority");
            (http::StatusCode::BAD_REQUEST, "bad_authority")
        })
}

/// An accepted HBONE connection after its handshake.
pub type HboneTls = tls::TlsStream<ServerConnectionData, TcpStream>;

/// The mutual-TLS handshake of an accepted connection, as `identity` (its leaf from
/// `certs`, its config from `configs`): the stream and the peer's SPIFFE identity, or
/// `None` (counted in `metrics` by reason) when there is no certificate, the handshake
/// fails or takes longer than [`HANDSHAKE_TIMEOUT`].
pub async fn accept_tls(
    tcp: TcpStream,
    configs: &ServerConfigCache,
    certs: &SecretManager,
    identity: &Identity,
    metrics: &Metrics,
) -> Option<(HboneTls, Identity)> {
    let config = match configs.get(certs, identity).await {
        Ok(config) => config,
        Err(e) => {
            warn!(%identity, error = %e, "no certificate to serve HBONE with");
            metrics.error("no_certificate");
            return None;
        }
    };
    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls::accept(config, tcp)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            info!(error = %e, "TLS handshake failed");
            metrics.error("tls_handshake");
            return None;
        }
        Err(_) => {
            info!("TLS handshake timed out");
            metrics.error("tls_handshake");
            return None;
        }
    };
    let Some(peer) = tls.peer_identity().cloned() else {
        // The verifier already requires one; this is only defence in depth.
        metrics.error("no_peer_identity");
        return None;
    };
    Some((tls, peer))
}

/// Serves one HBONE connection until the peer closes it. When `drain` fires, the
/// server sends GOAWAY and lets open streams finish.
///
/// At most [`SERVER_MAX_CONCURRENT_STREAMS`] handlers run at once. h2 already refuses
/// streams beyond the limit it advertises, but a client that resets its streams frees
/// h2's count while their handlers still run (dialing, copying); a stream over the
/// limit is reset with REFUSED_STREAM and `on_refused` is called. A peer that does not
/// complete the HTTP/2 handshake within [`HANDSHAKE_TIMEOUT`] is dropped.
pub async fn serve_connection<IO, H, F, R>(
    io: IO,
    drain: CancellationToken,
    handler: H,
    on_refused: R,
) -> Result<(), HboneError>
where
    IO: AsyncRead + AsyncWrite + Unpin,
    H: Fn(Request<RecvStream>, SendResponse<Bytes>) -> F,
    F: Future<Output = ()> + Send + 'static,
    R: Fn(),
{
    let handshake = h2::server::Builder::new()
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_frame_size(MAX_FRAME_SIZE)
        .max_send_buffer_size(MAX_SEND_BUFFER)
        .max_concurrent_streams(SERVER_MAX_CONCURRENT_STREAMS)
        .handshake(io);
    let mut connection = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake)
        .await
        .map_err(|_| HboneError::Timeout("waiting for the HTTP/2 handshake"))??;
    let streams = Arc::new(Semaphore::new(SERVER_MAX_CONCURRENT_STREAMS as usize));
    let mut draining = false;
    loop {
        tokio::select! {
            next = connection.accept() => match next {
                Some(Ok((request, mut respond))) => {
                    let Ok(permit) = streams.clone().try_acquire_owned() else {
                        debug!("refusing a stream: too many streams on this connection");
                        respond.send_reset(h2::Reason::REFUSED_STREAM);
                        on_refused();
                        continue;
                    };
                    // Boxed before it is wrapped and spawned, which would each move it:
                    // a stream's handler is as large as a connection's (`proxy::accept_loop`).
                    let handling = Box::pin(handler(request, respond));
                    tokio::spawn(async move {
                        handling.await;
                        drop(permit);
                    });
                }
                Some(Err(e)) => {
                    debug!(error = %e, "HBONE connection failed");
                    return Err(e.into());
                }
                None => return Ok(()),
            },
            () = drain.cancelled(), if !draining => {
                draining = true;
                connection.graceful_shutdown();
            }
        }
    }
}

/// [`serve_connection`], counting in `metrics` what it refuses: a stream over the limit
/// (`hbone_stream_limit`) and a connection that fails (`hbone_protocol`).
pub async fn serve_counted<IO, H, F>(
    io: IO,
    drain: CancellationToken,
    handler: H,
    metrics: Arc<Metrics>,
) where
    IO: AsyncRead + AsyncWrite + Unpin,
    H: Fn(Request<RecvStream>, SendResponse<Bytes>) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let refused = metrics.clone();
    let result = serve_connection(io, drain, handler, move || {
        refused.error("hbone_stream_limit")
    })
    .await;
    if let Err(e) = result {
        debug!(error = %e, "HBONE connection ended");
        metrics.error("hbone_protocol");
    }
}

/// Answers a stream with `status` and no body.
pub fn respond_status(respond: &mut SendResponse<Bytes>, status: http::StatusCode) {
    let mut response = http::Response::new(());
    *response.status_mut() = status;
    // The client may already be gone; nothing to do then.
    let _ = respond.send_response(response, true);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn connect_request() -> Request<()> {
        Request::builder()
            .method(http::Method::CONNECT)
            .uri("10.0.0.1:80")
            .body(())
            .unwrap()
    }

    #[tokio::test]
    async fn handlers_beyond_the_stream_limit_are_refused_even_after_client_resets() {
        let (client_io, server_io) = tokio::io::duplex(1 << 20);
        let refused = Arc::new(AtomicUsize::new(0));
        let (started_tx, mut started) = tokio::sync::mpsc::unbounded_channel();
        let counted = refused.clone();
        tokio::spawn(serve_connection(
            server_io,
            CancellationToken::new(),
            move |request, respond| {
                let _ = started_tx.send(());
                // A handler that outlives its stream (e.g. still dialing upstream).
                async move {
                    let _held = (request, respond);
                    std::future::pending::<()>().await;
                }
            },
            move || {
                counted.fetch_add(1, Ordering::SeqCst);
            },
        ));
        let (client, connection) = h2::client::handshake(client_io).await.unwrap();
        tokio::spawn(connection);
        for _ in 0..SERVER_MAX_CONCURRENT_STREAMS {
            let mut ready = client.clone().ready().await.unwrap();
            let (_, mut send) = ready.send_request(connect_request(), false).unwrap();
            started.recv().await.unwrap();
            // The reset frees h2's stream count; the handler keeps running.
            send.send_reset(h2::Reason::CANCEL);
        }
        let mut ready = client.clone().ready().await.unwrap();
        let (response, _send) = ready.send_request(connect_request(), false).unwrap();
        let err = response.await.expect_err("refused");
        assert_eq!(err.reason(), Some(h2::Reason::REFUSED_STREAM), "{err}");
        assert_eq!(refused.load(Ordering::SeqCst), 1);
    }
}
