//! A new connection's first bytes, sent while its CONNECT is in flight.
//!
//! Waiting for the server's 200 before forwarding anything costs every new
//! connection one round trip between the ztunnels. Instead, what the client sends
//! meanwhile goes out right behind the request's HEADERS; the server holds it in the
//! stream's window until it has dialed the target and answered. HTTP/2 lets a client
//! send DATA on a stream before the response, and the bytes go only to the peer
//! ztunnel, already authenticated by mutual TLS; if it refuses the stream they are
//! dropped with it, as the client's connection is closed either way.

use std::future::Future;
use std::io;

use bytes::{Bytes, BytesMut};
use h2::SendStream;
use tokio::io::{AsyncRead, AsyncReadExt};

/// At most this much is read from the client before the server answers; the rest
/// waits in the client's socket (TCP backpressure) as before.
pub const EARLY_DATA_LIMIT: usize = 64 * 1024;
const READ_SIZE: usize = 16 * 1024;

/// The client side of a connection being tunnelled, and what was read from it before
/// its stream was established. The chunks are kept (refcounted, not copied) so a
/// request retried on another connection sends them again.
pub struct EarlyData<'a, R> {
    client: &'a mut R,
    sent: Vec<Bytes>,
    len: usize,
    /// EOF or the limit: nothing more is read here. The copy that follows reads the
    /// socket again and sees the EOF itself.
    done: bool,
}

impl<'a, R: AsyncRead + Unpin> EarlyData<'a, R> {
    pub fn new(client: &'a mut R) -> Self {
        EarlyData {
            client,
            sent: Vec::new(),
            len: 0,
            done: false,
        }
    }

    /// Bytes read from the client so far (for the connection's byte counters).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Sends what earlier attempts read on `send`, a new stream for the same request.
    pub fn replay(&self, send: &mut SendStream<Bytes>) -> Result<(), h2::Error> {
        self.sent
            .iter()
            .try_for_each(|chunk| send.send_data(chunk.clone(), false))
    }

    /// Waits for `response`, forwarding what the client sends meanwhile on `send`.
    /// A client read error ends the wait: the client is gone.
    pub async fn forward_until<F: Future>(
        &mut self,
        send: &mut SendStream<Bytes>,
        response: F,
    ) -> io::Result<F::Output> {
        tokio::pin!(response);
        let mut buf = BytesMut::new();
        loop {
            let want = READ_SIZE.min(EARLY_DATA_LIMIT - self.len);
            buf.reserve(want);
            let mut client = (&mut *self.client).take(want as u64);
            tokio::select! {
                biased;
                answer = &mut response => return Ok(answer),
                read = client.read_buf(&mut buf), if !self.done => {
                    let n = read?;
                    if n == 0 {
                        self.done = true;
                        continue;
                    }
                    let chunk = buf.split().freeze();
                    self.len += n;
                    self.done = self.len >= EARLY_DATA_LIMIT;
                    // A stream that cannot take data has failed: the response says how.
                    if send.send_data(chunk.clone(), false).is_err() {
                        self.done = true;
                    }
                    self.sent.push(chunk);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hbone::fixtures::send_connect;
    use h2::client::ResponseFuture;
    use http::Response;
    use tokio::io::AsyncWriteExt;
    use tokio::task::JoinHandle;

    /// A CONNECT sent on a new in-memory HTTP/2 connection whose server reads
    /// `expect` bytes of the stream, and only then answers 200 (and returns them).
    async fn connect_to_a_server_awaiting(
        expect: usize,
    ) -> (ResponseFuture, SendStream<Bytes>, JoinHandle<Vec<u8>>) {
        let (client_io, server_io) = tokio::io::duplex(4 << 20);
        let server = tokio::spawn(async move {
            let mut connection = h2::server::handshake(server_io).await.unwrap();
            let (request, mut respond) = connection.accept().await.unwrap().unwrap();
            tokio::spawn(async move { while connection.accept().await.is_some() {} });
            let mut body = request.into_body();
            let mut received = Vec::new();
            while received.len() < expect {
                let chunk = body.data().await.unwrap().unwrap();
                body.flow_control().release_capacity(chunk.len()).unwrap();
                received.extend_from_slice(&chunk);
            }
            respond.send_response(Response::new(()), false).unwrap();
            received
        });
        let (response, send) = send_connect(client_io).await;
        (response, send, server)
    }

    #[tokio::test]
    async fn client_bytes_reach_the_server_before_it_answers_and_replay_on_retry() {
        let (mut app, mut tunnelled) = tokio::io::duplex(1024);
        app.write_all(b"hello").await.unwrap();
        let mut early = EarlyData::new(&mut tunnelled);
        let (response, mut send, server) = connect_to_a_server_awaiting(5).await;
        // Without forwarding, the server would never answer.
        let answer = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            early.forward_until(&mut send, response),
        )
        .await
        .expect("the server answered")
        .unwrap()
        .unwrap();
        assert_eq!(answer.status(), 200);
        assert_eq!(server.await.unwrap(), b"hello");
        assert_eq!(early.len(), 5);

        // The same bytes again on another stream, as a retry sends them.
        let (response, mut send, server) = connect_to_a_server_awaiting(5).await;
        early.replay(&mut send).unwrap();
        assert_eq!(response.await.unwrap().status(), 200);
        assert_eq!(server.await.unwrap(), b"hello");
    }

    #[tokio::test]
    async fn reading_stops_at_the_limit_and_at_eof() {
        let (mut app, mut tunnelled) = tokio::io::duplex(4 * EARLY_DATA_LIMIT);
        app.write_all(&vec![7u8; 2 * EARLY_DATA_LIMIT])
            .await
            .unwrap();
        let mut early = EarlyData::new(&mut tunnelled);
        let (response, mut send, server) = connect_to_a_server_awaiting(EARLY_DATA_LIMIT).await;
        early
            .forward_until(&mut send, response)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(early.len(), EARLY_DATA_LIMIT);
        assert_eq!(server.await.unwrap().len(), EARLY_DATA_LIMIT);
        // The rest is still in the client's socket for the copy.
        let mut rest = vec![0u8; EARLY_DATA_LIMIT];
        tunnelled.read_exact(&mut rest).await.unwrap();

        // At EOF nothing is read and the wait goes on for the answer alone.
        drop(app);
        let mut early = EarlyData::new(&mut tunnelled);
        let (response, mut send, server) = connect_to_a_server_awaiting(0).await;
        early
            .forward_until(&mut send, response)
            .await
            .unwrap()
            .unwrap();
        assert!(early.is_empty());
        server.await.unwrap();
    }
}
