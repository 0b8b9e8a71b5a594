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
