//! The smallest HTTP client a test needs: one GET over plain TCP, for readiness and
//! metrics endpoints a test polls.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

/// `GET path` from this thread's namespace to `addr` (a loopback port, or a replica
/// in the control plane): the response, head and body, if it is a 200.
pub fn get_ok(addr: SocketAddr, path: &str) -> Option<String> {
    const TIMEOUT: Duration = Duration::from_secs(1);
    let mut s = std::net::TcpStream::connect_timeout(&addr, TIMEOUT).ok()?;
    s.set_read_timeout(Some(TIMEOUT)).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    text.starts_with("HTTP/1.1 200").then_some(text)
}

/// One HTTP/1.1 request from this thread's namespace (so a namespace's capture rules
/// apply): `(status, body)`. `headers` are `name: value` lines.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[&str],
) -> std::io::Result<(u16, String)> {
    const TIMEOUT: Duration = Duration::from_secs(5);
    let mut s = std::net::TcpStream::connect_timeout(&addr, TIMEOUT)?;
    s.set_read_timeout(Some(TIMEOUT))?;
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for h in headers {
        head.push_str(h);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes())?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let bad = || {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("not an HTTP response: {text:?}"),
        )
    };
    let status = text
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .ok_or_else(bad)?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

/// One HTTP/1.1 response, as a test reads it.
#[derive(Debug, Clone)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// Header names lowercase, in the order received.
    pub headers: Vec<(String, String)>,
    /// The body, as text.
    pub body: String,
}

impl Response {
    /// The first value of header `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// An HTTP/1.1 client on one kept-alive connection: many requests without a new
/// connection each (bodies by `Content-Length` or chunked).
pub struct KeepAlive {
    addr: SocketAddr,
    reader: std::io::BufReader<std::net::TcpStream>,
}

impl KeepAlive {
    /// Connects to `addr` from this thread's namespace.
    pub fn connect(addr: SocketAddr) -> std::io::Result<Self> {
        let s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        s.set_nodelay(true)?;
        Ok(KeepAlive {
            addr,
            reader: std::io::BufReader::new(s),
        })
    }

    /// Sends one request without a body and reads its response.
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[&str],
    ) -> std::io::Result<Response> {
        use std::io::BufRead;
        let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {}\r\n", self.addr);
        for h in headers {
            head.push_str(h);
            head.push_str("\r\n");
        }
        head.push_str("\r\n");
        self.reader.get_mut().write_all(head.as_bytes())?;
        let bad = |what: String| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
        let mut line = String::new();
        self.reader.read_line(&mut line)?;
        let status = line
            .strip_prefix("HTTP/1.1 ")
            .and_then(|rest| rest.get(..3))
            .and_then(|code| code.parse().ok())
            .ok_or_else(|| bad(format!("not an HTTP response: {line:?}")))?;
        let mut headers = Vec::new();
        loop {
            line.clear();
            if self.reader.read_line(&mut line)? == 0 {
                return Err(bad("the connection closed in the head".into()));
            }
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            let (name, value) = l.split_once(':').ok_or_else(|| bad(l.to_owned()))?;
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
        }
        let mut response = Response {
            status,
            headers,
            body: String::new(),
        };
        let mut body = Vec::new();
        if response.header("transfer-encoding") == Some("chunked") {
            loop {
                line.clear();
                self.reader.read_line(&mut line)?;
                let size = usize::from_str_radix(line.trim(), 16)
                    .map_err(|_| bad(format!("bad chunk size {line:?}")))?;
                let mut chunk = vec![0; size + 2];
                self.reader.read_exact(&mut chunk)?;
                if size == 0 {
                    break;
                }
                body.extend_from_slice(&chunk[..size]);
            }
        } else {
            let length: usize = response
                .header("content-length")
                .and_then(|l| l.parse().ok())
                .unwrap_or(0);
            body.resize(length, 0);
            self.reader.read_exact(&mut body)?;
        }
        response.body = String::from_utf8_lossy(&body).into_owned();
        Ok(response)
    }
}
