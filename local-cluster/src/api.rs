//! A minimal blocking client for the local API server: plain HTTP/1.1, JSON bodies.
//!
//! The server listens only inside the control-plane namespace, so every connection
//! is opened on a short-lived thread that entered that namespace; the socket stays
//! there and is then used from the calling thread, whatever its namespace.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context, Result};
use serde_json::Value;

/// An HTTP error answer from the API server.
#[derive(Debug, thiserror::Error)]
#[error("{method} {path}: HTTP {status}: {message}")]
pub struct ApiError {
    pub method: String,
    pub path: String,
    pub status: u16,
    pub message: String,
}

/// The API server at `addr`, reached from the namespace file `netns`.
#[derive(Debug, Clone)]
pub struct Api {
    netns: PathBuf,
    addr: SocketAddr,
}

impl Api {
    pub fn new(netns: PathBuf, addr: SocketAddr) -> Self {
        Api { netns, addr }
    }

    pub fn get(&self, path: &str) -> Result<Value> {
        self.json("GET", path, None, "application/json")
    }

    pub fn post(&self, path: &str, body: &Value) -> Result<Value> {
        self.json("POST", path, Some(body), "application/json")
    }

    pub fn put(&self, path: &str, body: &Value) -> Result<Value> {
        self.json("PUT", path, Some(body), "application/json")
    }

    /// A JSON merge patch (`application/merge-patch+json`).
    pub fn merge_patch(&self, path: &str, body: &Value) -> Result<Value> {
        self.json("PATCH", path, Some(body), "application/merge-patch+json")
    }

    /// Deletes `path`; an object that is already gone is not an error.
    pub fn delete(&self, path: &str) -> Result<()> {
        match self.json("DELETE", path, None, "application/json") {
            Ok(_) => Ok(()),
            Err(e) if status_of(&e) == Some(404) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Creates an object, leaving an existing one with the same name as it is.
    pub fn create_if_absent(&self, path: &str, body: &Value) -> Result<()> {
        match self.post(path, body) {
            Ok(_) => Ok(()),
            Err(e) if status_of(&e) == Some(409) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// GET that maps 404 to `None`.
    pub fn get_opt(&self, path: &str) -> Result<Option<Value>> {
        match self.get(path) {
            Ok(v) => Ok(Some(v)),
            Err(e) if status_of(&e) == Some(404) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// A service account token from the TokenRequest API, as the kubelet gets one for a
    /// projected volume: the JWT and when it expires. `bound_pod` is `(name, uid)`; the
    /// token then dies with that pod. The server refuses `expiration_secs` below 600.
    pub fn request_token(
        &self,
        ns: &str,
        sa: &str,
        audiences: &[&str],
        expiration_secs: i64,
        bound_pod: Option<(&str, &str)>,
    ) -> Result<(String, SystemTime)> {
        let mut spec = serde_json::json!({
            "audiences": audiences,
            "expirationSeconds": expiration_secs,
        });
        if let Some((name, uid)) = bound_pod {
            spec["boundObjectRef"] =
                serde_json::json!({"kind": "Pod", "apiVersion": "v1", "name": name, "uid": uid});
        }
        let body = serde_json::json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": spec,
        });
        let answer = self.post(
            &format!("/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token"),
            &body,
        )?;
        let token = answer["status"]["token"]
            .as_str()
            .context("TokenRequest answer without status.token")?;
        let expiration = answer["status"]["expirationTimestamp"]
            .as_str()
            .context("TokenRequest answer without status.expirationTimestamp")?;
        let expiration =
            time::OffsetDateTime::parse(expiration, &time::format_description::well_known::Rfc3339)
                .with_context(|| format!("expirationTimestamp {expiration:?}"))?;
        Ok((token.to_string(), expiration.into()))
    }

    /// The `items` of a list.
    pub fn list(&self, path: &str) -> Result<Vec<Value>> {
        let list = self.get(path)?;
        Ok(list["items"].as_array().cloned().unwrap_or_default())
    }

    fn json(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        content_type: &str,
    ) -> Result<Value> {
        let body = body.map(serde_json::to_vec).transpose()?;
        let (status, bytes) = self.request(method, path, content_type, body.as_deref())?;
        if !(200..300).contains(&status) {
            let message = serde_json::from_slice::<Value>(&bytes)
                .ok()
                .and_then(|v| v["message"].as_str().map(str::to_owned))
                .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned());
            return Err(ApiError {
                method: method.into(),
                path: path.into(),
                status,
                message,
            }
            .into());
        }
        if bytes.is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_slice(&bytes)
            .with_context(|| format!("{method} {path}: answer is not JSON"))
    }

    /// One request on a fresh connection (`Connection: close`); the status and body.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        content_type: &str,
        body: Option<&[u8]>,
    ) -> Result<(u16, Vec<u8>)> {
        let mut stream = self.connect()?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        stream.set_write_timeout(Some(Duration::from_secs(30)))?;
        let body = body.unwrap_or_default();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nAccept: application/json\r\n\
             Content-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            self.addr,
            body.len()
        );
        stream.write_all(head.as_bytes())?;
        stream.write_all(body)?;
        let mut raw = Vec::new();
        stream
            .read_to_end(&mut raw)
            .with_context(|| format!("{method} {path}: reading the answer"))?;
        parse_response(&raw).with_context(|| format!("{method} {path}"))
    }

    fn connect(&self) -> Result<TcpStream> {
        let (netns, addr) = (self.netns.clone(), self.addr);
        std::thread::spawn(move || -> Result<TcpStream> {
            let file = std::fs::File::open(&netns)
                .with_context(|| format!("opening {}", netns.display()))?;
            // SAFETY: setns on an fd we own; it affects only this short-lived thread.
            let rc =
                unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&file), libc::CLONE_NEWNET) };
            if rc != 0 {
                bail!(
                    "setns {}: {}",
                    netns.display(),
                    std::io::Error::last_os_error()
                );
            }
            TcpStream::connect_timeout(&addr, Duration::from_secs(5))
                .with_context(|| format!("connecting to the API server at {addr}"))
        })
        .join()
        .map_err(|_| anyhow::anyhow!("the connect thread panicked"))?
    }
}

/// The HTTP status of an [`ApiError`] inside `e`, if it is one.
pub fn status_of(e: &anyhow::Error) -> Option<u16> {
    e.downcast_ref::<ApiError>().map(|e| e.status)
}

fn parse_response(raw: &[u8]) -> Result<(u16, Vec<u8>)> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("no end of the response head")?;
    let head = String::from_utf8_lossy(&raw[..split]);
    let body = &raw[split + 4..];
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("no status code")?;
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_vec()
    };
    Ok((status, body))
}

fn dechunk(mut data: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = data
            .windows(2)
            .position(|w| w == b"\r\n")
            .context("bad chunk")?;
        let size_text = String::from_utf8_lossy(&data[..line_end]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .context("bad chunk size")?;
        data = &data[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        if data.len() < size + 2 {
            bail!("truncated chunk");
        }
        out.extend_from_slice(&data[..size]);
        data = &data[size + 2..];
    }
}

/// Percent-encodes a query value (selectors contain `=`, `,` and `!`).
pub fn query_escape(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_and_chunked_answers() {
        let plain = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}";
        assert_eq!(parse_response(plain).unwrap(), (200, b"{}".to_vec()));
        let chunked = b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n1\r\n \r\n0\r\n\r\n";
        assert_eq!(parse_response(chunked).unwrap(), (404, b"{} ".to_vec()));
        assert!(parse_response(b"garbage").is_err());
    }

    #[test]
    fn escapes_selectors() {
        assert_eq!(
            query_escape("spec.nodeName=node-1"),
            "spec.nodeName%3Dnode-1"
        );
    }
}
