//! In-memory HTTP/2 for the HBONE unit tests.

use bytes::Bytes;
use h2::client::ResponseFuture;
use h2::SendStream;
use http::{Method, Request};
use tokio::io::DuplexStream;

/// Opens an HTTP/2 connection over `io` (its driver spawned) and sends one CONNECT.
pub async fn send_connect(io: DuplexStream) -> (ResponseFuture, SendStream<Bytes>) {
    let (client, connection) = h2::client::handshake(io).await.unwrap();
    tokio::spawn(connection);
    let request = Request::builder()
        .method(Method::CONNECT)
        .uri("10.0.0.1:80")
        .body(())
        .unwrap();
    client
        .ready()
        .await
        .unwrap()
        .send_request(request, false)
        .unwrap()
}
