//! Copying between a TCP socket and an HTTP/2 stream, both directions at once, with
//! half-close carried across (TCP FIN <-> HTTP/2 END_STREAM) and an abort carried
//! across as an abort (TCP RST <-> HTTP/2 RST_STREAM).

use std::future::poll_fn;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use h2::{RecvStream, SendStream};
use prometheus_client::metrics::counter::Counter;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// Read buffer sizes from the TCP side. A read takes its buffer only once the socket
/// is readable (an idle connection holds none), starting small and doubling while
/// reads keep filling it, so a bulk transfer soon moves 256 KiB per syscall.
const MIN_READ: usize = 16 * 1024;
const MAX_READ: usize = 256 * 1024;
/// Largest DATA frame we send. The peer allows 1 MiB, but a frame is one
/// allocation on the receiving side, and allocations this size stay in the
/// allocator's heap instead of costing an mmap and page faults each.
const MAX_DATA_FRAME: usize = 64 * 1024;

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

/// Bytes one way of one connection: the connection's own total (for its access log)
/// and the metric series it adds to as they flow.
#[derive(Clone, Debug, Default)]
pub struct ByteTally {
    metric: Counter,
    total: Arc<AtomicU64>,
}

impl ByteTally {
    /// A tally that also adds to `metric`.
    pub fn new(metric: Counter) -> Self {
        ByteTally {
            metric,
            total: Arc::default(),
        }
    }

    /// Counts `n` more bytes.
    pub fn add(&self, n: u64) {
        self.total.fetch_add(n, Ordering::Relaxed);
        self.metric.inc_by(n);
    }

    /// This connection's bytes so far.
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }
}

/// Bytes moved each way by [`copy_bidirectional`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Transferred {
    pub tcp_to_stream: u64,
    pub stream_to_tcp: u64,
}

/// Copies until both directions have finished. Counters are bumped as bytes flow,
/// so metrics of a long-lived connection move while it is open. With `idle_timeout`,
/// a copy that moves no byte either way for that long ends with `TimedOut`. On error
/// the stream is reset so the peer does not wait for data that will never come, and
/// `tcp` will close with an RST (see [`reset_on_close`]).
pub async fn copy_bidirectional(
    tcp: &mut TcpStream,
    stream: H2Stream,
    tcp_to_stream: &ByteTally,
    stream_to_tcp: &ByteTally,
    idle_timeout: Option<Duration>,
) -> io::Result<Transferred> {
    let H2Stream {
        mut send,
        mut recv,
        _lease,
    } = stream;
    let (reader, mut writer) = tcp.split();
    let activity = Activity::new();
    let result = {
        let up = tcp_to_h2(reader.as_ref(), &mut send, tcp_to_stream, &activity);
        let down = h2_to_tcp(&mut recv, &mut writer, stream_to_tcp, &activity);
        let copy = async { tokio::try_join!(up, down) };
        match idle_timeout {
            None => copy.await,
            Some(timeout) => tokio::select! {
                result = copy => result,
                () = activity.idle_for(timeout) => Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no data either way for {timeout:?}"),
                )),
            },
        }
    };
    match result {
        Ok((tcp_to_stream, stream_to_tcp)) => Ok(Transferred {
            tcp_to_stream,
            stream_to_tcp,
        }),
        Err(e) => {
            send.send_reset(h2::Reason::CANCEL);
            reset_on_close(tcp);
            Err(e)
        }
    }
}

/// Makes closing `tcp` send an RST instead of a FIN. For a copy that failed: the
/// other end was reset, or bytes were lost, and a FIN would tell the app that every
/// byte arrived and the peer closed cleanly.
pub fn reset_on_close(tcp: &TcpStream) {
    // Fails only on a socket that is already gone, which sends nothing anyway.
    let _ = socket2::SockRef::from(tcp).set_linger(Some(Duration::ZERO));
}

/// When a copy last moved data, for its idle timeout.
struct Activity {
    start: Instant,
    /// Milliseconds after `start`.
    last: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Activity {
            start: Instant::now(),
            last: AtomicU64::new(0),
        }
    }

    fn touch(&self) {
        let now = self.start.elapsed().as_millis() as u64;
        self.last.store(now, Ordering::Relaxed);
    }

    /// Resolves once nothing was touched for `timeout`.
    async fn idle_for(&self, timeout: Duration) {
        loop {
            let last = self.start + Duration::from_millis(self.last.load(Ordering::Relaxed));
            let deadline = last + timeout;
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }
}

/// Waits until `tcp` is readable, then reads into a fresh buffer of `size` bytes:
/// between reads the connection holds no buffer. 0 bytes is the peer's FIN.
async fn read_fresh(tcp: &TcpStream, size: usize) -> io::Result<BytesMut> {
    loop {
        tcp.readable().await?;
        let mut buf = BytesMut::with_capacity(size);
        match tcp.try_read_buf(&mut buf) {
            Ok(_) => return Ok(buf),
            // A readiness the kernel took back (another wakeup raced us): wait again.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
}

async fn tcp_to_h2(
    tcp: &TcpStream,
    send: &mut SendStream<Bytes>,
    counter: &ByteTally,
    activity: &Activity,
) -> io::Result<u64> {
    let mut size = MIN_READ;
    let mut total = 0u64;
    loop {
        let buf = read_fresh(tcp, size).await?;
        let n = buf.len();
        if n == 0 {
            // TCP FIN becomes END_STREAM: the peer half-closes its upstream.
            send.send_data(Bytes::new(), true).map_err(h2_to_io)?;
            return Ok(total);
        }
        size = next_read_size(size, n);
        total += n as u64;
        counter.add(n as u64);
        activity.touch();
        let mut data = buf.freeze();
        while !data.is_empty() {
            send.reserve_capacity(data.len());
            // Capacity left over from the previous grant is used first: poll_capacity
            // only reports changes.
            let mut granted = send.capacity();
            if granted == 0 {
                granted = match poll_fn(|cx| send.poll_capacity(cx)).await {
                    Some(Ok(granted)) => granted,
                    Some(Err(e)) => return Err(h2_to_io(e)),
                    None => {
                        return Err(io::Error::new(
                            io::ErrorKind::BrokenPipe,
                            "HBONE stream closed",
                        ))
                    }
                };
            }
            if granted == 0 {
                continue;
            }
            let chunk = data.split_to(granted.min(data.len()).min(MAX_DATA_FRAME));
            send.send_data(chunk, false).map_err(h2_to_io)?;
        }
    }
}

/// Doubles the read size after a read that filled it, up to the maximum.
fn next_read_size(size: usize, read: usize) -> usize {
    if read >= size {
        (size * 2).min(MAX_READ)
    } else {
        size
    }
}

async fn h2_to_tcp<W: AsyncWrite + Unpin>(
    recv: &mut RecvStream,
    writer: &mut W,
    counter: &ByteTally,
    activity: &Activity,
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
        counter.add(n as u64);
        activity.touch();
    }
    // END_STREAM becomes a TCP FIN towards the local side.
    writer.shutdown().await?;
    Ok(total)
}

/// Copies between two TCP sockets (passthrough), counting bytes as they flow. On
/// error both close with an RST.
pub async fn copy_tcp(
    a: &mut TcpStream,
    b: &mut TcpStream,
    a_to_b: &ByteTally,
    b_to_a: &ByteTally,
) -> io::Result<Transferred> {
    let (ar, mut aw) = a.split();
    let (br, mut bw) = b.split();
    let copied = tokio::try_join!(
        copy_counted(ar.as_ref(), &mut bw, a_to_b),
        copy_counted(br.as_ref(), &mut aw, b_to_a)
    );
    let (up, down) = copied.inspect_err(|_| {
        reset_on_close(a);
        reset_on_close(b);
    })?;
    Ok(Transferred {
        tcp_to_stream: up,
        stream_to_tcp: down,
    })
}

async fn copy_counted<W: AsyncWrite + Unpin>(
    reader: &TcpStream,
    writer: &mut W,
    counter: &ByteTally,
) -> io::Result<u64> {
    let mut size = MIN_READ;
    let mut total = 0u64;
    loop {
        let buf = read_fresh(reader, size).await?;
        let n = buf.len();
        if n == 0 {
            writer.shutdown().await?;
            return Ok(total);
        }
        size = next_read_size(size, n);
        writer.write_all(&buf).await?;
        total += n as u64;
        counter.add(n as u64);
    }
}

fn h2_to_io(e: h2::Error) -> io::Error {
    if e.is_io() {
        return e
            .into_io()
            .unwrap_or_else(|| io::Error::other("HTTP/2 I/O error"));
    }
    io::Error::other(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_size_grows_only_while_reads_fill_it() {
        assert_eq!(next_read_size(MIN_READ, 100), MIN_READ);
        assert_eq!(next_read_size(MIN_READ, MIN_READ), 2 * MIN_READ);
        assert_eq!(next_read_size(MAX_READ, MAX_READ), MAX_READ);
    }
}

#[cfg(test)]
mod idle_tests {
    use super::*;
    use crate::hbone::fixtures::send_connect;
    use http::Response;

    /// A CONNECT stream over an in-memory HTTP/2 connection: (client side, server side).
    async fn stream_pair() -> ((SendStream<Bytes>, RecvStream), H2Stream) {
        let (client_io, server_io) = tokio::io::duplex(1 << 20);
        let server = tokio::spawn(async move {
            let mut connection = h2::server::handshake(server_io).await.unwrap();
            let (request, mut respond) = connection.accept().await.unwrap().unwrap();
            let send = respond.send_response(Response::new(()), false).unwrap();
            tokio::spawn(async move { while connection.accept().await.is_some() {} });
            H2Stream::new(send, request.into_body())
        });
        let (response, send) = send_connect(client_io).await;
        let server_side = server.await.unwrap();
        let recv = response.await.unwrap().into_body();
        ((send, recv), server_side)
    }

    #[tokio::test]
    async fn an_idle_stream_is_closed_and_a_busy_one_is_not() {
        let ((mut client_send, _client_recv), stream) = stream_pair().await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let _app = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (mut tcp, _) = listener.accept().await.unwrap();
        let counter = ByteTally::default();
        let idle = Duration::from_millis(300);
        let copy = tokio::spawn(async move {
            copy_bidirectional(
                &mut tcp,
                stream,
                &ByteTally::default(),
                &counter,
                Some(idle),
            )
            .await
        });
        // Data every 100 ms keeps it open past the idle timeout...
        for _ in 0..6 {
            client_send
                .send_data(Bytes::from_static(b"x"), false)
                .unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(!copy.is_finished(), "closed while busy");
        // ...then silence closes it.
        let started = Instant::now();
        let result = tokio::time::timeout(Duration::from_secs(3), copy)
            .await
            .expect("closed when idle")
            .unwrap();
        assert_eq!(result.unwrap_err().kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= Duration::from_millis(150));
    }
}
