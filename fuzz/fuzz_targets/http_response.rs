//! The plugin's reading of the node agent's HTTP/1.1 answer (`POST /cmdadd`, `/log`):
//! whatever comes back over the socket, in whatever pieces, is a response or an error,
//! never a panic or a hang; the body kept is never over the limit, and is exactly what
//! the framing (`Content-Length`, or the connection's end) delimits.
//!
//! Input: byte 0 sets the size of each read (0: whatever fits the plugin's buffer),
//! bytes 1-2 the response limit (little endian), the rest is what the agent sent.

#![no_main]

use std::io::{self, Read};
use std::time::{Duration, Instant};

use cni_plugin::http::{read_response, HttpError, Limits, TimedRead};
use libfuzzer_sys::fuzz_target;

/// The agent's bytes, handed out `piece` at a time, then EOF.
struct Pieces<'a> {
    data: &'a [u8],
    piece: usize,
}

impl Read for Pieces<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = buf.len().min(self.piece).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

impl TimedRead for Pieces<'_> {
    fn set_read_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        assert!(timeout.is_some_and(|t| !t.is_zero()), "reads are bounded");
        Ok(())
    }
}

/// How the full answer frames its body, as the plugin reads the headers.
enum Framing {
    Length(usize),
    Chunked,
    UntilClose,
    Bad,
}

fn framing(headers: &[httparse::Header<'_>]) -> Framing {
    let get = |name: &str| {
        headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| String::from_utf8_lossy(h.value).trim().to_ascii_lowercase())
    };
    if get("transfer-encoding").is_some_and(|v| v.ends_with("chunked")) {
        return Framing::Chunked;
    }
    match get("content-length").map(|v| v.parse::<usize>()) {
        Some(Ok(n)) => Framing::Length(n),
        Some(Err(_)) => Framing::Bad,
        None => Framing::UntilClose,
    }
}

fuzz_target!(|input: &[u8]| {
    let [piece, lo, hi, data @ ..] = input else {
        return;
    };
    let max_response = usize::from(u16::from_le_bytes([*lo, *hi]));
    let piece = if *piece == 0 {
        usize::MAX
    } else {
        usize::from(*piece)
    };
    let limits = Limits {
        connect: Duration::from_secs(3600),
        total: Duration::from_secs(3600),
        max_response,
    };
    let mut stream = Pieces { data, piece };
    let result = read_response(&mut stream, Instant::now() + limits.total, limits);
    let response = match result {
        Ok(response) => response,
        Err(HttpError::Malformed(_)) => return,
        Err(e) => panic!("only a malformed answer is an error here: {e:?}"),
    };

    // The head as the plugin saw it is the head of the whole answer.
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut head = httparse::Response::new(&mut headers);
    let Ok(httparse::Status::Complete(header_len)) = head.parse(data) else {
        panic!("a response without a complete head: {response:?}");
    };
    assert_eq!(response.status, head.code.unwrap_or(0));
    let cap = max_response.saturating_sub(header_len);
    assert!(
        response.body.len() <= cap,
        "{} bytes kept, limit {cap}",
        response.body.len()
    );
    let rest = &data[header_len..];
    match framing(head.headers) {
        Framing::Length(n) => {
            let end = n.min(rest.len());
            assert!(rest.len() >= n.min(cap), "a body cut short is an error");
            assert_eq!(response.body, rest[..end.min(cap)]);
            assert_eq!(response.truncated, n > cap);
        }
        Framing::UntilClose => {
            assert_eq!(response.body, rest[..rest.len().min(cap)]);
            // Marked cut when it reached the limit before the end was seen.
            if response.truncated {
                assert!(rest.len() >= cap);
            } else {
                assert!(rest.len() <= cap);
            }
        }
        Framing::Chunked => assert!(response.body.len() <= rest.len()),
        Framing::Bad => panic!("a bad Content-Length was accepted"),
    }
});
