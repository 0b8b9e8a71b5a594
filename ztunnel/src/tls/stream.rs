//! An HBONE connection's TLS: rustls' handshake (its unbuffered API), then the record
//! layer of [`super::record`] over the socket, with rustls' kernel-connection API
//! (made for kTLS) computing the keys of a key update.
//!
//! Reading, records are opened in place in the read buffer and the plaintext copied
//! once, into the reader's buffer; writing, the plaintext is copied once, into the
//! write buffer, and sealed there. rustls' buffered connection copies each received
//! byte three times and each sent byte twice.

use std::io::{self, IoSlice};
use std::ops::Range;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use rustls::client::{ClientConnectionData, UnbufferedClientConnection};
use rustls::kernel::KernelConnection;
use rustls::pki_types::ServerName;
use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::unbuffered::{
    ConnectionState, EncodeError, EncodeTlsData, InsufficientSizeError, UnbufferedStatus,
};
use rustls::{ClientConfig, CommonState, ExtractedSecrets, ServerConfig, SupportedCipherSuite};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

use super::record::{
    self, ContentType, PostHandshake, RecordError, RecordKey, MAX_PLAINTEXT, MAX_RECORD,
};
use crate::identity::Identity;

/// Bytes read from the socket at once: many records per read.
const READ_BUFFER: usize = 256 * 1024;
/// Sealed bytes a writer may queue before it must wait for the socket.
const WRITE_LIMIT: usize = 256 * 1024;

/// The client and server halves of rustls' unbuffered API, as the handshake uses them.
trait Side: Sized + Send {
    type Data: Send + Sync + 'static;
    const IS_CLIENT: bool;
    fn process<'c, 'i>(
        &'c mut self,
        incoming: &'i mut [u8],
    ) -> UnbufferedStatus<'c, 'i, Self::Data>;
    fn common(&self) -> &CommonState;
    fn into_kernel(self)
        -> Result<(ExtractedSecrets, KernelConnection<Self::Data>), rustls::Error>;
}

/// The two impls differ only in their types: rustls has no trait over them.
macro_rules! impl_side {
    ($conn:ty, $data:ty, $is_client:expr) => {
        impl Side for $conn {
            type Data = $data;
            const IS_CLIENT: bool = $is_client;
            fn process<'c, 'i>(
                &'c mut self,
                incoming: &'i mut [u8],
            ) -> UnbufferedStatus<'c, 'i, Self::Data> {
                self.process_tls_records(incoming)
            }
            fn common(&self) -> &CommonState {
                self
            }
            fn into_kernel(
                self,
            ) -> Result<(ExtractedSecrets, KernelConnection<Self::Data>), rustls::Error> {
                self.dangerous_into_kernel_connection()
            }
        }
    };
}
impl_side!(UnbufferedClientConnection, ClientConnectionData, true);
impl_side!(UnbufferedServerConnection, ServerConnectionData, false);

/// The client side of a connection: the handshake as `config` says (which must
/// enable secret extraction, as [`super::client_config`] does).
pub async fn connect<IO: AsyncRead + AsyncWrite + Unpin>(
    config: Arc<ClientConfig>,
    server_name: ServerName<'static>,
    io: IO,
) -> io::Result<TlsStream<ClientConnectionData, IO>> {
    let conn = UnbufferedClientConnection::new(config, server_name).map_err(tls_error)?;
    handshake(conn, io).await
}

/// The server side of an accepted connection, as [`connect`].
pub async fn accept<IO: AsyncRead + AsyncWrite + Unpin>(
    config: Arc<ServerConfig>,
    io: IO,
) -> io::Result<TlsStream<ServerConnectionData, IO>> {
    let conn = UnbufferedServerConnection::new(config).map_err(tls_error)?;
    handshake(conn, io).await
}

fn tls_error(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

/// Drives rustls through the handshake on `io`, then takes over its keys. What the
/// peer sent after its last handshake message (application data riding with it, and
/// records not yet opened) stays in the stream's read buffer.
async fn handshake<S: Side, IO: AsyncRead + AsyncWrite + Unpin>(
    mut conn: S,
    mut io: IO,
) -> io::Result<TlsStream<S::Data, IO>> {
    let mut rbuf = vec![0u8; READ_BUFFER].into_boxed_slice();
    let mut filled = 0;
    let mut out = Vec::new();
    let mut early = Vec::new();
    loop {
        let UnbufferedStatus { mut discard, state } = conn.process(&mut rbuf[..filled]);
        let state = match state {
            Ok(state) => state,
            Err(e) => {
                send_alert(&mut conn, &mut rbuf[..filled], &mut io).await;
                return Err(tls_error(e));
            }
        };
        let done = match state {
            ConnectionState::EncodeTlsData(mut data) => {
                encode(&mut data, &mut out)?;
                false
            }
            ConnectionState::TransmitTlsData(data) => {
                io.write_all(&out).await?;
                out.clear();
                data.done();
                false
            }
            ConnectionState::BlockedHandshake => {
                if filled == rbuf.len() {
                    return Err(tls_error("TLS handshake message over 256 KiB"));
                }
                let n = io.read(&mut rbuf[filled..]).await?;
                if n == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "peer closed the connection in the TLS handshake",
                    ));
                }
                filled += n;
                false
            }
            ConnectionState::ReadTraffic(mut traffic) => {
                while let Some(record) = traffic.next_record() {
                    let record = record.map_err(tls_error)?;
                    discard += record.discard;
                    early.extend_from_slice(record.payload);
                }
                false
            }
            ConnectionState::WriteTraffic(_) => true,
            ConnectionState::PeerClosed | ConnectionState::Closed => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "peer closed the connection in the TLS handshake",
                ))
            }
            other => return Err(tls_error(format!("TLS handshake: unexpected {other:?}"))),
        };
        if discard > 0 {
            rbuf.copy_within(discard..filled, 0);
            filled -= discard;
        }
        if done {
            break;
        }
    }
    let peer = super::peer_identity(conn.common());
    let alpn = conn.common().alpn_protocol().map(<[u8]>::to_vec);
    let (secrets, keys) = conn.into_kernel().map_err(tls_error)?;
    // The application data that came with the handshake is read first, then the
    // records after it (both came in the one buffer, the plaintext smaller).
    if early.len() + filled > rbuf.len() {
        return Err(tls_error("TLS handshake: more data than the read buffer"));
    }
    rbuf.copy_within(..filled, early.len());
    rbuf[..early.len()].copy_from_slice(&early);
    Ok(TlsStream {
        io,
        tx: RecordKey::new(&secrets.tx.1, secrets.tx.0).map_err(tls_error)?,
        rx: RecordKey::new(&secrets.rx.1, secrets.rx.0).map_err(tls_error)?,
        keys,
        is_client: S::IS_CLIENT,
        peer,
        alpn,
        key_update_after: record::KEY_UPDATE_AFTER,
        plain: 0..early.len(),
        opened: early.len(),
        filled: early.len() + filled,
        rbuf,
        handshake: Vec::new(),
        read_closed: false,
        read_error: None,
        wbuf: Vec::new(),
        written: 0,
        close_sent: false,
    })
}

/// Appends the handshake record rustls has ready to `out`.
fn encode<D>(data: &mut EncodeTlsData<'_, D>, out: &mut Vec<u8>) -> io::Result<()> {
    let start = out.len();
    out.resize(start + 4096, 0);
    let n = match data.encode(&mut out[start..]) {
        Err(EncodeError::InsufficientSize(InsufficientSizeError { required_size })) => {
            out.resize(start + required_size, 0);
            data.encode(&mut out[start..])
        }
        other => other,
    }
    .map_err(tls_error)?;
    out.truncate(start + n);
    Ok(())
}

/// Sends the alert rustls queued for a failed handshake (a bad certificate, say), so
/// the peer logs why rather than a closed connection. Best effort. `incoming` is
/// what the failed call was given (rustls keeps offsets into it).
async fn send_alert<S: Side, IO: AsyncWrite + Unpin>(
    conn: &mut S,
    incoming: &mut [u8],
    io: &mut IO,
) {
    let mut out = Vec::new();
    // Only while something is queued: rustls hands out what is queued before it
    // reads `incoming` again, and reading it again would fail it a second time.
    while conn.common().wants_write() {
        let UnbufferedStatus {
            state: Ok(ConnectionState::EncodeTlsData(mut data)),
            ..
        } = conn.process(incoming)
        else {
            break;
        };
        if encode(&mut data, &mut out).is_err() {
            break;
        }
    }
    let _ = io.write_all(&out).await;
}

/// An established TLS 1.3 connection over `IO` (a TCP socket).
pub struct TlsStream<D, IO> {
    io: IO,
    keys: KernelConnection<D>,
    rx: RecordKey,
    tx: RecordKey,
    is_client: bool,
    peer: Option<Identity>,
    alpn: Option<Vec<u8>>,
    /// Records sealed under one key before it is changed.
    key_update_after: u64,
    /// `rbuf[plain]` is opened plaintext not yet read, `rbuf[opened..filled]` what
    /// the socket gave that is not yet opened.
    rbuf: Box<[u8]>,
    plain: Range<usize>,
    opened: usize,
    filled: usize,
    /// A handshake message (a ticket, a key update) not yet whole.
    handshake: Vec<u8>,
    /// close_notify received.
    read_closed: bool,
    /// A record that could not be opened ends the read side for good.
    read_error: Option<RecordError>,
    /// `wbuf[written..]` is sealed, not yet written to the socket.
    wbuf: Vec<u8>,
    written: usize,
    close_sent: bool,
}

impl<D, IO: AsyncRead + AsyncWrite + Unpin> TlsStream<D, IO> {
    /// The peer's SPIFFE identity, from the certificate it presented.
    pub fn peer_identity(&self) -> Option<&Identity> {
        self.peer.as_ref()
    }

    /// The protocol the handshake agreed on (HBONE's is `h2`).
    pub fn alpn_protocol(&self) -> Option<&[u8]> {
        self.alpn.as_deref()
    }

    /// The cipher suite the handshake agreed on.
    pub fn negotiated_cipher_suite(&self) -> SupportedCipherSuite {
        self.keys.negotiated_cipher_suite()
    }

    /// Changes our key after `records` records instead of [`record::KEY_UPDATE_AFTER`],
    /// so a test sees key updates.
    #[cfg(test)]
    pub fn set_key_update_after(&mut self, records: u64) {
        self.key_update_after = records;
    }

    /// Changes our key and asks the peer to change its own, as rustls'
    /// `refresh_traffic_keys` does.
    #[cfg(test)]
    pub fn request_key_update(&mut self) {
        self.update_tx_key(&record::KEY_UPDATE_REQUEST).unwrap();
    }

    /// Opens the whole record of `len` bytes at `rbuf[opened..]`.
    fn open_record(&mut self, len: usize) -> Result<(), RecordError> {
        let start = self.opened;
        self.opened += len;
        let (content, n) = self.rx.open(&mut self.rbuf[start..start + len])?;
        let body = start + record::HEADER_LEN..start + record::HEADER_LEN + n;
        match content {
            ContentType::ApplicationData => self.plain = body,
            ContentType::Alert => self.read_closed |= record::alert(&self.rbuf[body])?,
            ContentType::Handshake => {
                if body.is_empty() {
                    return Err(RecordError::Malformed("empty handshake record"));
                }
                self.handshake.extend_from_slice(&self.rbuf[body]);
                self.on_handshake()?;
            }
        }
        Ok(())
    }

    /// Handles the whole handshake messages received: tickets (dropped: HBONE
    /// clients do not resume, see `tls::client_config`) and key updates.
    fn on_handshake(&mut self) -> Result<(), RecordError> {
        while let Some((message, len)) = record::post_handshake_message(&self.handshake)? {
            self.handshake.drain(..len);
            match message {
                PostHandshake::NewSessionTicket if self.is_client => {}
                PostHandshake::NewSessionTicket => {
                    return Err(RecordError::Malformed("ticket from a client"))
                }
                PostHandshake::KeyUpdate { requested } => {
                    // A key change ends its record (RFC 8446 section 5.1).
                    if !self.handshake.is_empty() {
                        return Err(RecordError::Malformed("data after a key update"));
                    }
                    let (seq, secrets) = self.keys.update_rx_secret().map_err(key_error)?;
                    self.rx = RecordKey::new(&secrets, seq)?;
                    if requested {
                        self.update_tx_key(&record::KEY_UPDATE_MESSAGE)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Sends `message` (a key update) and changes our key: at the peer's request, or
    /// before [`record::KEY_UPDATE_AFTER`] records.
    fn update_tx_key(&mut self, message: &[u8]) -> Result<(), RecordError> {
        self.tx
            .seal(ContentType::Handshake, &[message], &mut self.wbuf);
        let (seq, secrets) = self.keys.update_tx_secret().map_err(key_error)?;
        self.tx = RecordKey::new(&secrets, seq)?;
        Ok(())
    }

    /// Reads more from the socket, making room for a whole record.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.opened == self.filled {
            (self.opened, self.filled) = (0, 0);
        } else if self.rbuf.len() - self.filled < MAX_RECORD {
            self.rbuf.copy_within(self.opened..self.filled, 0);
            (self.opened, self.filled) = (0, self.filled - self.opened);
        }
        debug_assert!(self.plain.is_empty(), "read before compacting");
        let mut buf = ReadBuf::new(&mut self.rbuf[self.filled..]);
        ready!(Pin::new(&mut self.io).poll_read(cx, &mut buf))?;
        match buf.filled().len() {
            0 => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "peer closed the connection without a TLS close_notify",
            ))),
            n => {
                self.filled += n;
                Poll::Ready(Ok(()))
            }
        }
    }

    /// Writes out every sealed byte.
    fn poll_write_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.wbuf.len() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.wbuf[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.wbuf.clear();
        self.written = 0;
        Poll::Ready(Ok(()))
    }

    /// Seals one record of `pieces`, changing keys first when due.
    fn seal(&mut self, pieces: &[&[u8]]) -> io::Result<()> {
        if self.tx.seq() >= self.key_update_after {
            self.update_tx_key(&record::KEY_UPDATE_MESSAGE)
                .map_err(tls_error)?;
        }
        self.tx
            .seal(ContentType::ApplicationData, pieces, &mut self.wbuf);
        Ok(())
    }
}

fn key_error(e: rustls::Error) -> RecordError {
    RecordError::KeyUpdate(e.to_string())
}

impl<D: Unpin, IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for TlsStream<D, IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // As many whole records as are buffered and fit, so the reader (h2's frame
        // decoder) is called once per read from the socket, not once per record.
        let start = out.filled().len();
        loop {
            if !this.plain.is_empty() {
                let n = this.plain.len().min(out.remaining());
                out.put_slice(&this.rbuf[this.plain.start..this.plain.start + n]);
                this.plain.start += n;
                if out.remaining() == 0 {
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            let copied = out.filled().len() > start;
            if copied && (this.read_error.is_some() || this.read_closed) {
                return Poll::Ready(Ok(()));
            }
            if let Some(e) = &this.read_error {
                return Poll::Ready(Err(tls_error(e.clone())));
            }
            if this.read_closed {
                return Poll::Ready(Ok(()));
            }
            let opened = match record::record_len(&this.rbuf[this.opened..this.filled]) {
                Ok(Some(len)) if len <= this.filled - this.opened => this.open_record(len),
                Ok(_) if copied => return Poll::Ready(Ok(())),
                Ok(_) => {
                    ready!(this.poll_fill(cx))?;
                    continue;
                }
                Err(e) => Err(e),
            };
            if let Err(e) = opened {
                this.read_error = Some(e);
            } else if !this.wbuf.is_empty() {
                // A key update we owe the peer: sent now, or with the next write.
                let _ = this.poll_write_out(cx)?;
            }
        }
    }
}

impl<D: Unpin, IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for TlsStream<D, IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.close_sent {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        if this.wbuf.len() - this.written >= WRITE_LIMIT {
            ready!(this.poll_write_out(cx))?;
        }
        // Records of up to 2^14 bytes, each gathered from as many slices as it spans.
        let mut pieces: [&[u8]; 8] = [&[]; 8];
        let (mut count, mut room, mut taken) = (0, MAX_PLAINTEXT, 0);
        'slices: for buf in bufs {
            let mut buf = &buf[..];
            while !buf.is_empty() {
                let n = buf.len().min(room);
                pieces[count] = &buf[..n];
                buf = &buf[n..];
                (count, room, taken) = (count + 1, room - n, taken + n);
                if room == 0 || count == pieces.len() {
                    this.seal(&pieces[..count])?;
                    (count, room) = (0, MAX_PLAINTEXT);
                    if this.wbuf.len() - this.written >= WRITE_LIMIT {
                        break 'slices;
                    }
                }
            }
        }
        if count > 0 {
            this.seal(&pieces[..count])?;
        }
        Poll::Ready(Ok(taken))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_write_out(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !std::mem::replace(&mut this.close_sent, true) {
            this.tx.seal(
                ContentType::Alert,
                &[&record::CLOSE_NOTIFY_ALERT],
                &mut this.wbuf,
            );
        }
        ready!(this.poll_write_out(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
#[path = "stream_tests.rs"]
mod tests;
