//! Shared by the integration tests: running the built `istio-cni` binary the way a
//! runtime does, and test doubles for the node agent's two sockets.
#![allow(dead_code)] // each test crate uses a different part

use serde_json::Value;
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

pub const PLUGIN: &str = env!("CARGO_BIN_EXE_istio-cni");

/// What one plugin run left behind.
#[derive(Debug)]
pub struct Run {
    pub stdout: String,
    pub stderr: String,
    pub exit: Option<i32>,
    pub elapsed: Duration,
}

impl Run {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not JSON ({e}): {:?}\nstderr: {}",
                self.stdout, self.stderr
            )
        })
    }

    /// Asserts a spec error and returns it.
    pub fn error(&self, code: u64) -> Value {
        assert_eq!(self.exit, Some(1), "expected failure: {self:#?}");
        let e = self.json();
        assert_eq!(e["code"], code, "wrong code: {e}");
        assert!(e["msg"].as_str().is_some_and(|m| !m.is_empty()), "{e}");
        assert!(e["cniVersion"].is_string(), "{e}");
        e
    }

    pub fn success(&self) -> &Self {
        assert_eq!(self.exit, Some(0), "expected success: {self:#?}");
        assert!(!self.stderr.contains("panicked"), "{}", self.stderr);
        self
    }
}

/// Runs the plugin with exactly `env` and `stdin`.
pub fn run_with_env(env: &[(&str, &str)], stdin: &[u8]) -> Run {
    let start = Instant::now();
    let mut child = Command::new(PLUGIN)
        .env_clear()
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn istio-cni");
    // The plugin may exit before reading (VERSION): ignore a broken pipe.
    let _ = child.stdin.take().unwrap().write_all(stdin);
    let out = child.wait_with_output().expect("wait istio-cni");
    Run {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        exit: out.status.code(),
        elapsed: start.elapsed(),
    }
}

/// Runs `command` with a complete pod environment, as containerd would.
pub fn run_plugin(command: &str, netconf: &Value, cni_args: &str) -> Run {
    run_with_env(
        &[
            ("CNI_COMMAND", command),
            ("CNI_CONTAINERID", "0123456789abcdef"),
            ("CNI_NETNS", "/var/run/netns/cni-test-pod"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/opt/cni/bin"),
            ("CNI_ARGS", cni_args),
        ],
        netconf.to_string().as_bytes(),
    )
}

/// containerd's CNI_ARGS for a pod.
pub fn pod_args(namespace: &str, name: &str) -> String {
    format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name};\
         K8S_POD_INFRA_CONTAINER_ID=0123456789abcdef;K8S_POD_UID=uid-{name}"
    )
}

/// How a fake agent socket answers.
#[derive(Clone, Copy, Debug)]
pub enum Reply {
    Status(u16, &'static str),
    /// Reads the request and never answers.
    Silent,
}

#[derive(Clone, Debug)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub body: Vec<u8>,
}

/// A node agent test double: an HTTP/1.1 server on a Unix socket that records requests.
pub struct FakeServer {
    requests: Arc<Mutex<Vec<Request>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FakeServer {
    pub fn start(socket: &Path, reply: Reply) -> Self {
        let listener = UnixListener::bind(socket).expect("bind fake agent socket");
        listener.set_nonblocking(true).unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (requests, stop) = (requests.clone(), stop.clone());
            thread::spawn(move || {
                let mut conns = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((conn, _)) => {
                            let (requests, stop) = (requests.clone(), stop.clone());
                            conns.push(thread::spawn(move || serve(conn, reply, &requests, &stop)));
                        }
                        Err(_) => thread::sleep(Duration::from_millis(5)),
                    }
                }
                // A panic (a failed assertion) in a connection fails the test.
                for c in conns {
                    if let Err(panic) = c.join() {
                        std::panic::resume_unwind(panic);
                    }
                }
            })
        };
        FakeServer {
            requests,
            stop,
            thread: Some(thread),
        }
    }

    pub fn requests(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            // The server's panics are the test's, unless it is failing already.
            if let Err(panic) = t.join() {
                if !thread::panicking() {
                    std::panic::resume_unwind(panic);
                }
            }
        }
    }
}

fn serve(mut conn: UnixStream, reply: Reply, requests: &Mutex<Vec<Request>>, stop: &AtomicBool) {
    conn.set_nonblocking(false).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let Some(request) = read_request(&mut conn) else {
        return;
    };
    requests.lock().unwrap().push(request);
    match reply {
        Reply::Status(code, body) => {
            let _ = write!(
                conn,
                "HTTP/1.1 {code} X\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
        }
        Reply::Silent => {
            while !stop.load(Ordering::Relaxed) {
                thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

fn read_request(conn: &mut UnixStream) -> Option<Request> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = conn.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut req = httparse::Request::new(&mut headers);
        if let Ok(httparse::Status::Complete(len)) = req.parse(&buf) {
            let length: usize = req
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                .and_then(|h| std::str::from_utf8(h.value).ok()?.parse().ok())
                .unwrap_or(0);
            let (method, path) = (req.method?.to_string(), req.path?.to_string());
            while buf.len() < len + length {
                let n = conn.read(&mut chunk).ok()?;
                if n == 0 {
                    return None;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            return Some(Request {
                method,
                path,
                body: buf[len..len + length].to_vec(),
            });
        }
    }
}

/// A run dir of our own (the agent's `cni_agent_run_dir`).
pub fn run_dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

pub fn socket(dir: &Path, name: &str) -> PathBuf {
    dir.join(name)
}
