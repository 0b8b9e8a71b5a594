//! A minimal, synchronous HTTP/1.1 client over a Unix stream socket: one `POST`, one
//! response, `Connection: close`. The plugin runs once per pod ADD, so no async runtime
//! and no pooling; every step is bounded by a deadline and the response by a size.

use socket2::{Domain, SockAddr, Socket, Type};
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// Bounds of one exchange.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// For the connect alone (a full listen backlog would otherwise block).
    pub connect: Duration,
    /// For the whole exchange, connect included.
    pub total: Duration,
    /// Response bytes kept (headers + body); a longer body is truncated.
    pub max_response: usize,
}

#[derive(Debug, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
    /// The body was longer than the limit and was cut.
    pub truncated: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// Nobody accepted the connection: socket file missing, nothing listening, backlog full.
    #[error("cannot connect: {0}")]
    Connect(io::Error),
    /// Connected, but the peer did not finish answering in time.
    #[error("no complete answer within {0:?}")]
    Timeout(Duration),
    #[error("{0}")]
    Io(io::Error),
    #[error("malformed response: {0}")]
    Malformed(String),
}

/// Sends `body` as `application/json` to `path` on the socket and reads the response.
pub fn post_json(
    socket: &Path,
    path: &str,
    body: &[u8],
    limits: Limits,
) -> Result<Response, HttpError> {
    let deadline = Instant::now() + limits.total;
    let mut stream = connect(socket, limits.connect.min(limits.total))?;
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: unix\r\nUser-Agent: istio-cni/{}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        env!("CARGO_PKG_VERSION"),
        body.len()
    );
    let mut request = head.into_bytes();
    request.extend_from_slice(body);
    stream
        .set_write_timeout(Some(remaining(deadline, limits.total)?))
        .map_err(HttpError::Io)?;
    stream
        .write_all(&request)
        .map_err(|e| io_error(e, limits.total))?;
    read_response(&mut stream, deadline, limits)
}

fn connect(path: &Path, timeout: Duration) -> Result<UnixStream, HttpError> {
    let socket = Socket::new(Domain::UNIX, Type::STREAM.cloexec(), None).map_err(HttpError::Io)?;
    // A blocking AF_UNIX connect waits for backlog room at most SO_SNDTIMEO.
    socket
        .set_write_timeout(Some(timeout.max(Duration::from_millis(1))))
        .map_err(HttpError::Io)?;
    let addr = SockAddr::unix(path).map_err(HttpError::Connect)?;
    socket.connect(&addr).map_err(HttpError::Connect)?;
    Ok(UnixStream::from(std::os::fd::OwnedFd::from(socket)))
}

fn remaining(deadline: Instant, total: Duration) -> Result<Duration, HttpError> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(HttpError::Timeout(total));
    }
    Ok(left)
}

fn io_error(e: io::Error, total: Duration) -> HttpError {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => HttpError::Timeout(total),
        _ => HttpError::Io(e),
    }
}

/// A stream whose every read can be bounded by a timeout (a trait so the fuzz target
/// can feed [`read_response`] bytes in pieces).
pub trait TimedRead: Read {
    fn set_read_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()>;
}

impl TimedRead for UnixStream {
    fn set_read_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        UnixStream::set_read_timeout(self, timeout)
    }
}

/// Reads until the response is complete (Content-Length, chunked, or EOF).
/// `pub` for the fuzz target (fuzz/fuzz_targets/http_response.rs).
pub fn read_response(
    stream: &mut impl TimedRead,
    deadline: Instant,
    limits: Limits,
) -> Result<Response, HttpError> {
    let mut buf = Vec::with_capacity(1024);
    let mut eof = false;
    let mut read_more = |buf: &mut Vec<u8>, eof: &mut bool| -> Result<(), HttpError> {
        stream
            .set_read_timeout(Some(remaining(deadline, limits.total)?))
            .map_err(HttpError::Io)?;
        let mut chunk = [0u8; 4096];
        let n = stream
            .read(&mut chunk)
            .map_err(|e| io_error(e, limits.total))?;
        *eof = n == 0;
        buf.extend_from_slice(&chunk[..n]);
        Ok(())
    };

    // Status line and headers.
    let (status, header_len, framing) = loop {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut response = httparse::Response::new(&mut headers);
        match response.parse(&buf) {
            Ok(httparse::Status::Complete(len)) => {
                let status = response.code.unwrap_or(0);
                break (status, len, Framing::of(response.headers)?);
            }
            Ok(httparse::Status::Partial) => {}
            Err(e) => return Err(HttpError::Malformed(e.to_string())),
        }
        if buf.len() >= limits.max_response {
            return Err(HttpError::Malformed(format!(
                "headers longer than {} bytes",
                limits.max_response
            )));
        }
        if eof {
            return Err(HttpError::Malformed(
                "connection closed before the response headers".into(),
            ));
        }
        read_more(&mut buf, &mut eof)?;
    };

    // Body: read until the framing says it is complete, the peer closes, or we hold
    // `max_response` bytes (then the body is cut and marked truncated).
    let cap = limits.max_response.saturating_sub(header_len);
    let mut raw = buf.split_off(header_len);
    loop {
        let (complete, body) = match framing {
            Framing::Length(n) => (raw.len() >= n, None),
            Framing::Chunked => {
                let (body, complete) = decode_chunked(&raw)?;
                (complete, Some(body))
            }
            Framing::UntilClose => (eof, None),
        };
        let full = raw.len() >= cap;
        if complete || full || eof {
            if !complete && !full {
                return Err(HttpError::Malformed("connection closed mid-body".into()));
            }
            let mut body = body.unwrap_or(raw);
            if let Framing::Length(n) = framing {
                body.truncate(n);
            }
            let truncated = !complete || body.len() > cap;
            body.truncate(cap);
            return Ok(Response {
                status,
                body,
                truncated,
            });
        }
        read_more(&mut raw, &mut eof)?;
    }
}

#[derive(Clone, Copy, Debug)]
enum Framing {
    Length(usize),
    Chunked,
    UntilClose,
}

impl Framing {
    fn of(headers: &[httparse::Header<'_>]) -> Result<Self, HttpError> {
        let get = |name: &str| {
            headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case(name))
                .map(|h| String::from_utf8_lossy(h.value).trim().to_ascii_lowercase())
        };
        if get("transfer-encoding").is_some_and(|v| v.ends_with("chunked")) {
            return Ok(Framing::Chunked);
        }
        match get("content-length") {
            Some(v) => v
                .parse()
                .map(Framing::Length)
                .map_err(|_| HttpError::Malformed(format!("bad Content-Length {v:?}"))),
            None => Ok(Framing::UntilClose),
        }
    }
}

/// Decodes a chunked body: the bytes so far, and whether the terminating chunk arrived.
fn decode_chunked(mut raw: &[u8]) -> Result<(Vec<u8>, bool), HttpError> {
    let mut body = Vec::new();
    loop {
        let (start, size) = match httparse::parse_chunk_size(raw) {
            Ok(httparse::Status::Complete(v)) => v,
            Ok(httparse::Status::Partial) => return Ok((body, false)),
            Err(_) => return Err(HttpError::Malformed("bad chunk size".into())),
        };
        if size == 0 {
            return Ok((body, true));
        }
        let end = usize::try_from(size)
            .ok()
            .and_then(|size| start.checked_add(size))
            .ok_or_else(|| HttpError::Malformed("chunk too large".into()))?;
        if raw.len() < end.saturating_add(2) {
            body.extend_from_slice(&raw[start..raw.len().min(end)]);
            return Ok((body, false));
        }
        body.extend_from_slice(&raw[start..end]);
        raw = &raw[end + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;
    use std::thread;

    const LIMITS: Limits = Limits {
        connect: Duration::from_millis(200),
        total: Duration::from_millis(500),
        max_response: 1024,
    };

    /// Serves one connection with a canned reply and returns the request it read.
    fn serve_once(reply: &'static [u8]) -> (tempfile::TempDir, thread::JoinHandle<Vec<u8>>) {
        let dir = tempfile::tempdir().unwrap();
        let listener = UnixListener::bind(dir.path().join("s.sock")).unwrap();
        let handle = thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            conn.set_read_timeout(Some(Duration::from_millis(300)))
                .unwrap();
            let mut request = Vec::new();
            let mut chunk = [0u8; 1024];
            while let Ok(n) = conn.read(&mut chunk) {
                request.extend_from_slice(&chunk[..n]);
                if n == 0 || request.ends_with(b"}") {
                    break;
                }
            }
            let _ = conn.write_all(reply);
            request
        });
        (dir, handle)
    }

    fn post(dir: &tempfile::TempDir) -> Result<Response, HttpError> {
        post_json(&dir.path().join("s.sock"), "/cmdadd", b"{\"a\":1}", LIMITS)
    }

    #[test]
    fn content_length_response() {
        let (dir, server) =
            serve_once(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\nboom");
        let r = post(&dir).unwrap();
        assert_eq!(
            (r.status, r.body.as_slice(), r.truncated),
            (500, &b"boom"[..], false)
        );
        let request = String::from_utf8(server.join().unwrap()).unwrap();
        assert!(
            request.starts_with("POST /cmdadd HTTP/1.1\r\n"),
            "{request}"
        );
        assert!(request.contains("Content-Length: 7\r\n"));
        assert!(request.ends_with("\r\n\r\n{\"a\":1}"));
    }

    #[test]
    fn chunked_and_close_delimited_responses() {
        let (dir, _s) = serve_once(
            b"HTTP/1.1 400 Bad Request\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nbad\r\n2\r\n!!\r\n0\r\n\r\n",
        );
        assert_eq!(post(&dir).unwrap().body, b"bad!!");
        let (dir, _s) = serve_once(b"HTTP/1.1 200 OK\r\n\r\nall of it");
        let r = post(&dir).unwrap();
        assert_eq!((r.status, r.body.as_slice()), (200, &b"all of it"[..]));
    }

    #[test]
    fn long_bodies_are_truncated() {
        static REPLY: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
        let reply = REPLY.get_or_init(|| {
            let mut r = b"HTTP/1.1 500 x\r\nContent-Length: 5000\r\n\r\n".to_vec();
            r.extend(std::iter::repeat_n(b'x', 5000));
            r
        });
        let (dir, _s) = serve_once(reply);
        let r = post(&dir).unwrap();
        assert!(r.truncated);
        assert!(r.body.len() < 1024);
    }

    #[test]
    fn garbage_and_early_close_are_malformed() {
        let (dir, _s) = serve_once(b"SSH-2.0-hello\r\n\r\n");
        assert!(matches!(post(&dir), Err(HttpError::Malformed(_))));
        let (dir, _s) = serve_once(b"HTTP/1.1 200 OK\r\nContent-Le");
        assert!(matches!(post(&dir), Err(HttpError::Malformed(_))));
    }

    #[test]
    fn missing_socket_is_a_connect_error() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(post(&dir), Err(HttpError::Connect(_))));
        // A socket file nobody listens on any more: connection refused.
        drop(UnixListener::bind(dir.path().join("s.sock")).unwrap());
        assert!(matches!(post(&dir), Err(HttpError::Connect(_))));
    }

    #[test]
    fn silent_peer_times_out() {
        let dir = tempfile::tempdir().unwrap();
        let listener = UnixListener::bind(dir.path().join("s.sock")).unwrap();
        let start = Instant::now();
        // Accepted by the kernel backlog, never answered.
        let err = post(&dir).unwrap_err();
        assert!(matches!(err, HttpError::Timeout(_)), "{err:?}");
        assert!(start.elapsed() < Duration::from_secs(2));
        drop(listener);
    }
}
