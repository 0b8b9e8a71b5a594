//! Copying between a TCP socket and an HTTP/2 stream, both directions at once, with
//! half-close carried across (TCP FIN <-> HTTP/2 END_STREAM).

use std::future::poll_fn;
use std::io;

use bytes::{Bytes, BytesMut};
use h2::{RecvStream, SendStream};
use prometheus_client::metrics::counter::Counter;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Read size from the TCP side. Large reads mean fewer syscalls and frames; h2 cuts
/// them into DATA frames of the peer's max frame size.
const READ_CHUNK: usize = 256 * 1024;

/// One HBONE stream: the two halves of an HTTP/2 CONNECT tunnel, plus whatever must
/// live as long as the stream (e.g. the pool lease that counts it).
pub struct H2Stream {
    pub send: SendStream<Bytes>,
    pub recv: RecvStream,
    pub(crate) _lease: Option<Box<dyn Send + Sync>>,
}

impl H2Stream {
    pub fn new(send: SendStream<Bytes>, recv: RecvStream) -> Self {
        H2Stream {
            send,
            recv,
            _lease: None,
        }
    }
}

/// Bytes moved each way by [`copy_bidirectional`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Transferred {
    pub tcp_to_stream: u64,
    pub stream_to_tcp: u64,
}

/// Copies until both directions have finished. Counters are bumped as bytes flow,
/// so metrics of a long-lived connection move while it is open. On error the stream
/// is reset so the peer does not wait for data that will never come.
pub async fn copy_bidirectional<T>(
    tcp: T,
    stream: H2Stream,
    tcp_to_stream: &Counter,
    stream_to_tcp: &Counter,
) -> io::Result<Transferred>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    let H2Stream {
        mut send,
        mut recv,
        _lease,
    } = stream;
    let (mut reader, mut writer) = tokio::io::split(tcp);
    let up = tcp_to_h2(&mut reader, &mut send, tcp_to_stream);
    let down = h2_to_tcp(&mut recv, &mut writer, stream_to_tcp);
    match tokio::try_join!(up, down) {
        Ok((tcp_to_stream, stream_to_tcp)) => Ok(Transferred {
            tcp_to_stream,
            stream_to_tcp,
        }),
        Err(e) => {
            send.send_reset(h2::Reason::CANCEL);
            Err(e)
        }
    }
}

async fn tcp_to_h2<R: AsyncRead + Unpin>(
    reader: &mut R,
    send: &mut SendStream<Bytes>,
    counter: &Counter,
) -> io::Result<u64> {
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    let mut total = 0u64;
    loop {
        if buf.capacity() < READ_CHUNK / 4 {
            buf.reserve(READ_CHUNK);
        }
        let n = reader.read_buf(&mut buf).await?;
        if n == 0 {
            // TCP FIN becomes END_STREAM: the peer half-closes its upstream.
            send.send_data(Bytes::new(), true).map_err(h2_to_io)?;
            return Ok(total);
        }
        total += n as u64;
        counter.inc_by(n as u64);
        let mut data = buf.split().freeze();
        while !data.is_empty() {
            send.reserve_capacity(data.len());
            let granted = match poll_fn(|cx| send.poll_capacity(cx)).await {
                Some(Ok(granted)) => granted,
                Some(Err(e)) => return Err(h2_to_io(e)),
                None => return Err(io::Error::new(io::ErrorKind::BrokenPipe, "HBONE stream closed")),
            };
            if granted == 0 {
                continue;
            }
            let chunk = data.split_to(granted.min(data.len()));
            send.send_data(chunk, false).map_err(h2_to_io)?;
        }
    }
}

async fn h2_to_tcp<W: AsyncWrite + Unpin>(
    recv: &mut RecvStream,
    writer: &mut W,
    counter: &Counter,
) -> io::Result<u64> {
    let mut total = 0u64;
    while let Some(chunk) = recv.data().await {
        let chunk = chunk.map_err(h2_to_io)?;
        let n = chunk.len();
        writer.write_all(&chunk).await?;
        // Window is returned only once the bytes are written: backpressure reaches
        // the sender instead of buffering in ztunnel.
        recv.flow_control().release_capacity(n).map_err(h2_to_io)?;
        total += n as u64;
        counter.inc_by(n as u64);
    }
    // END_STREAM becomes a TCP FIN towards the local side.
    writer.shutdown().await?;
    Ok(total)
}

/// Copies between two TCP sockets (passthrough), counting bytes as they flow.
pub async fn copy_tcp<A, B>(a: A, b: B, a_to_b: &Counter, b_to_a: &Counter) -> io::Result<Transferred>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let (mut ar, mut aw) = tokio::io::split(a);
    let (mut br, mut bw) = tokio::io::split(b);
    let (up, down) = tokio::try_join!(
        copy_counted(&mut ar, &mut bw, a_to_b),
        copy_counted(&mut br, &mut aw, b_to_a)
    )?;
    Ok(Transferred {
        tcp_to_stream: up,
        stream_to_tcp: down,
    })
}

async fn copy_counted<R, W>(reader: &mut R, writer: &mut W, counter: &Counter) -> io::Result<u64>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; READ_CHUNK];
    let mut total = 0u64;
    loop {
        let n = reader.read(&mut buf).await?;
        if n == 0 {
            writer.shutdown().await?;
            return Ok(total);
        }
        writer.write_all(&buf[..n]).await?;
        total += n as u64;
        counter.inc_by(n as u64);
    }
}

fn h2_to_io(e: h2::Error) -> io::Error {
    if e.is_io() {
        return e.into_io().unwrap_or_else(|| io::Error::other("HTTP/2 I/O error"));
    }
    io::Error::other(e)
}
