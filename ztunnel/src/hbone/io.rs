//! An HBONE stream as a byte stream (`AsyncRead + AsyncWrite`), for protocols that
//! run inside the tunnel: the waypoint serves and sends HTTP over it. Copying to and
//! from a TCP socket does not need it ([`super::stream::copy_bidirectional`] is
//! cheaper); this is for code that wants one bidirectional stream.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use h2::{RecvStream, SendStream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::stream::H2Stream;

/// Largest DATA frame one write sends (the peer allows more; this bounds one
/// allocation on either side).
const MAX_WRITE: usize = 64 * 1024;
/// How long a stream we finished writing waits for the peer's END_STREAM once we
/// drop it (see [`H2Io`]'s `Drop`).
const LINGER: Duration = Duration::from_secs(10);

pub struct H2Io {
    send: SendStream<Bytes>,
    /// Always `Some` until dropped.
    recv: Option<RecvStream>,
    /// What must live as long as the stream (a pool lease).
    lease: Option<Box<dyn Send + Sync>>,
    /// Received bytes not yet read.
    pending: Bytes,
    /// END_STREAM seen.
    read_closed: bool,
    /// END_STREAM sent.
    write_closed: bool,
}

impl H2Io {
    pub fn new(stream: H2Stream) -> Self {
        let H2Stream { send, recv, _lease } = stream;
        H2Io {
            send,
            recv: Some(recv),
            lease: _lease,
            pending: Bytes::new(),
            read_closed: false,
            write_closed: false,
        }
    }
}

impl Drop for H2Io {
    fn drop(&mut self) {
        // We ended our side (a server that answered and closed, as a TCP server's
        // close) but the peer has not: dropping the stream now would reset it with
        // CANCEL, which the peer's proxy reports as a failed connection. Like TCP's
        // half-close, the stream stays open until the peer ends it (or a while).
        if !self.write_closed || self.read_closed {
            return;
        }
        let (Some(mut recv), Ok(runtime)) =
            (self.recv.take(), tokio::runtime::Handle::try_current())
        else {
            return;
        };
        let lease = self.lease.take();
        runtime.spawn(async move {
            let _ = tokio::time::timeout(LINGER, async {
                while let Some(Ok(data)) = recv.data().await {
                    let _ = recv.flow_control().release_capacity(data.len());
                }
            })
            .await;
            drop(lease);
        });
    }
}

fn h2_to_io(e: h2::Error) -> io::Error {
    if e.is_io() {
        return e.into_io().unwrap_or_else(|| io::ErrorKind::Other.into());
    }
    io::Error::new(io::ErrorKind::ConnectionReset, e)
}

impl AsyncRead for H2Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        while this.pending.is_empty() && !this.read_closed {
            let recv = this.recv.as_mut().expect("present until dropped");
            match ready!(recv.poll_data(cx)) {
                Some(Ok(data)) => {
                    // Our read frees window for the peer at once: the bytes now sit in
                    // `pending`, bounded by one frame.
                    recv.flow_control()
                        .release_capacity(data.len())
                        .map_err(h2_to_io)?;
                    this.pending = data;
                }
                Some(Err(e)) => return Poll::Ready(Err(h2_to_io(e))),
                None => this.read_closed = true,
            }
        }
        let n = this.pending.len().min(buf.remaining());
        buf.put_slice(&this.pending[..n]);
        this.pending.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for H2Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let send = &mut self.get_mut().send;
        send.reserve_capacity(buf.len().min(MAX_WRITE));
        let granted = loop {
            match send.capacity() {
                0 => match ready!(send.poll_capacity(cx)) {
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => return Poll::Ready(Err(h2_to_io(e))),
                    None => return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into())),
                },
                n => break n,
            }
        };
        let n = granted.min(buf.len());
        send.send_data(Bytes::copy_from_slice(&buf[..n]), false)
            .map_err(h2_to_io)?;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // h2's connection task writes queued frames out on its own.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !std::mem::replace(&mut this.write_closed, true) {
            // END_STREAM; a stream already reset has nothing left to close.
            let _ = this.send.send_data(Bytes::new(), true);
        }
        Poll::Ready(Ok(()))
    }
}
