//! The HTTP/2 side of an inbound HBONE connection: accepts CONNECT streams on an
//! established mutual-TLS connection and hands each to a handler.

use std::future::Future;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::RecvStream;
use http::Request;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::*;

/// Serves one HBONE connection until the peer closes it. When `drain` fires, the
/// server sends GOAWAY and lets open streams finish.
pub async fn serve_connection<IO, H, F>(
    io: IO,
    drain: CancellationToken,
    handler: H,
) -> Result<(), HboneError>
where
    IO: AsyncRead + AsyncWrite + Unpin,
    H: Fn(Request<RecvStream>, SendResponse<Bytes>) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let mut connection = h2::server::Builder::new()
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_frame_size(MAX_FRAME_SIZE)
        .max_send_buffer_size(MAX_SEND_BUFFER)
        .max_concurrent_streams(SERVER_MAX_CONCURRENT_STREAMS)
        .handshake(io)
        .await?;
    let mut draining = false;
    loop {
        tokio::select! {
            next = connection.accept() => match next {
                Some(Ok((request, respond))) => {
                    tokio::spawn(handler(request, respond));
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

/// Answers a stream with `status` and no body.
pub fn respond_status(respond: &mut SendResponse<Bytes>, status: http::StatusCode) {
    let mut response = http::Response::new(());
    *response.status_mut() = status;
    // The client may already be gone; nothing to do then.
    let _ = respond.send_response(response, true);
}
