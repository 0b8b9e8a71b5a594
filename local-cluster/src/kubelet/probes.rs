//! Container probes as kubelet runs them: `httpGet` from the node's network
//! namespace to the pod's address, every `periodSeconds` after
//! `initialDelaySeconds`, with `timeoutSeconds`, and `successThreshold` /
//! `failureThreshold` consecutive results flipping the outcome.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

use test_support::netns::run_in;

/// One `httpGet` target.
#[derive(Debug, Clone)]
pub struct HttpGet {
    pub port: u16,
    pub path: String,
    /// `host` when the probe names one, else the pod's address.
    pub host: Option<IpAddr>,
    pub headers: Vec<(String, String)>,
}

impl HttpGet {
    /// The `httpGet` (or a lifecycle hook's) of `container`, named ports resolved.
    pub fn parse(spec: &Value, container: &Value) -> Result<Self> {
        if spec["scheme"].as_str().is_some_and(|s| s != "HTTP") {
            bail!("only scheme HTTP is supported: {spec}");
        }
        let port = match &spec["port"] {
            Value::Number(n) => n.as_u64().and_then(|p| u16::try_from(p).ok()),
            Value::String(name) => container["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|p| p["name"] == name.as_str())
                .and_then(|p| p["containerPort"].as_u64())
                .and_then(|p| u16::try_from(p).ok()),
            _ => None,
        }
        .ok_or_else(|| {
            anyhow!(
                "httpGet port {} is not a port of the container",
                spec["port"]
            )
        })?;
        let host = match spec["host"].as_str() {
            Some(h) if !h.is_empty() => Some(h.parse().context("httpGet host")?),
            _ => None,
        };
        let headers = spec["httpHeaders"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|h| {
                Some((
                    h["name"].as_str()?.to_owned(),
                    h["value"].as_str()?.to_owned(),
                ))
            })
            .collect();
        Ok(HttpGet {
            port,
            path: spec["path"].as_str().unwrap_or("/").to_owned(),
            host,
            headers,
        })
    }

    /// GETs the target from `node`: a status in [200, 400) is success, as kubelet
    /// counts it. The error says why it failed (refused, timeout, status).
    pub fn run(&self, node_netns: &Path, pod_ip: &str, timeout: Duration) -> Result<()> {
        let ip = match self.host {
            Some(ip) => ip,
            None => pod_ip.parse().context("pod address")?,
        };
        let addr = SocketAddr::new(ip, self.port);
        let request = self.request(&addr);
        let status = run_in(node_netns, move || get_status(addr, &request, timeout))??;
        if (200..400).contains(&status) {
            Ok(())
        } else {
            bail!("HTTP probe failed with statuscode: {status}")
        }
    }

    fn request(&self, addr: &SocketAddr) -> String {
        let mut req = format!(
            "GET {} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: kube-probe/1.33\r\nAccept: */*\r\nConnection: close\r\n",
            self.path
        );
        for (k, v) in &self.headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        req
    }
}

fn get_status(addr: SocketAddr, request: &str, timeout: Duration) -> Result<u16> {
    let mut stream = TcpStream::connect_timeout(&addr, timeout)
        .with_context(|| format!("Get \"http://{addr}\""))?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.write_all(request.as_bytes())?;
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream
            .read(&mut chunk)
            .context("reading the probe's answer")?;
        if n == 0 {
            bail!("the connection closed before a status line");
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut response = httparse::Response::new(&mut headers);
        match response.parse(&buf) {
            Ok(_) if response.code.is_some() => return Ok(response.code.unwrap_or_default()),
            Ok(_) if buf.len() < 64 * 1024 => continue,
            Ok(_) => bail!("no status line in 64 KiB"),
            Err(e) => bail!("malformed HTTP response: {e}"),
        }
    }
}

/// A readiness or liveness probe's schedule and counters.
#[derive(Debug)]
pub struct Probe {
    pub get: HttpGet,
    period: Duration,
    pub timeout: Duration,
    success_threshold: u32,
    failure_threshold: u32,
    successes: u32,
    failures: u32,
    next: Instant,
    /// The outcome once a threshold was crossed (`None` before the first).
    pub passing: Option<bool>,
    pub last_error: Option<String>,
}

impl Probe {
    /// `container[kind]` (`readinessProbe`, `livenessProbe`), if it has one, with
    /// its schedule starting at `started`.
    pub fn parse(container: &Value, kind: &str, started: Instant) -> Result<Option<Self>> {
        let spec = &container[kind];
        if spec.is_null() {
            return Ok(None);
        }
        if spec["httpGet"].is_null() {
            bail!("{kind}: only httpGet probes are supported: {spec}");
        }
        let secs = |k: &str, default: u64| Duration::from_secs(spec[k].as_u64().unwrap_or(default));
        let count = |k: &str, default: u64| spec[k].as_u64().unwrap_or(default).max(1) as u32;
        Ok(Some(Probe {
            get: HttpGet::parse(&spec["httpGet"], container).with_context(|| kind.to_owned())?,
            period: secs("periodSeconds", 10).max(Duration::from_secs(1)),
            timeout: secs("timeoutSeconds", 1).max(Duration::from_secs(1)),
            success_threshold: count("successThreshold", 1),
            failure_threshold: count("failureThreshold", 3),
            successes: 0,
            failures: 0,
            next: started + secs("initialDelaySeconds", 0),
            passing: None,
            last_error: None,
        }))
    }

    pub fn due(&self, now: Instant) -> bool {
        now >= self.next
    }

    /// Counts one result; returns true when the outcome changed.
    pub fn record(&mut self, result: Result<()>, now: Instant) -> bool {
        self.next = now + self.period;
        let before = self.passing;
        match result {
            Ok(()) => {
                self.failures = 0;
                self.successes += 1;
                self.last_error = None;
                if self.successes >= self.success_threshold {
                    self.passing = Some(true);
                }
            }
            Err(e) => {
                self.successes = 0;
                self.failures += 1;
                self.last_error = Some(format!("{e:#}"));
                if self.failures >= self.failure_threshold {
                    self.passing = Some(false);
                }
            }
        }
        before != self.passing
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn named_ports_and_defaults() {
        let container = json!({"ports": [{"name": "health", "containerPort": 8000}],
            "readinessProbe": {"httpGet": {"path": "/readyz", "port": "health"}}});
        let probe = Probe::parse(&container, "readinessProbe", Instant::now())
            .unwrap()
            .unwrap();
        assert_eq!(probe.get.port, 8000);
        assert_eq!(probe.get.path, "/readyz");
        assert_eq!(
            (probe.period, probe.failure_threshold),
            (Duration::from_secs(10), 3)
        );
        assert!(Probe::parse(&container, "livenessProbe", Instant::now())
            .unwrap()
            .is_none());
        let bad = json!({"readinessProbe": {"httpGet": {"port": "nope"}}});
        assert!(Probe::parse(&bad, "readinessProbe", Instant::now()).is_err());
        let exec = json!({"livenessProbe": {"exec": {"command": ["true"]}}});
        assert!(Probe::parse(&exec, "livenessProbe", Instant::now()).is_err());
    }

    #[test]
    fn thresholds_flip_the_outcome() {
        let container = json!({"livenessProbe": {"httpGet": {"port": 1},
            "failureThreshold": 2, "successThreshold": 1}});
        let now = Instant::now();
        let mut p = Probe::parse(&container, "livenessProbe", now)
            .unwrap()
            .unwrap();
        assert!(p.record(Ok(()), now));
        assert_eq!(p.passing, Some(true));
        assert!(
            !p.record(Err(anyhow!("refused")), now),
            "one failure is below the threshold"
        );
        assert!(p.record(Err(anyhow!("refused")), now));
        assert_eq!(p.passing, Some(false));
        assert!(!p.due(now), "the next run is a period later");
    }
}
