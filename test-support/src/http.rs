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
