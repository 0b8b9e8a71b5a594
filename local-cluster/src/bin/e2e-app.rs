//! The workloads of the end-to-end tests and benchmarks: tiny TCP servers and
//! clients whose output proves what crossed the mesh (byte counts, SHA-256, the
//! peer address the server saw), and the test DNS upstream.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use sha2::{Digest, Sha256};

#[derive(Parser)]
#[command(about = "Test workload for the mesh end-to-end suite")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Reads each connection to EOF, then answers one JSON line:
    /// {"peer": "<ip:port as seen by the server>", "bytes": N, "sha256": "..."}.
    Sink {
        #[arg(long)]
        listen: SocketAddr,
    },
    /// Echoes every byte back.
    Echo {
        #[arg(long)]
        listen: SocketAddr,
    },
    /// Sends N deterministic bytes to a sink, half-closes, and checks the sink's
    /// answer against its own count and digest. Prints the sink's JSON line, plus
    /// `"connected"`: the address it connected to. `--connect` is `ip:port` or
    /// `name:port`, resolved with the system resolver (the namespace's resolv.conf).
    Send {
        #[arg(long)]
        connect: String,
        #[arg(long)]
        bytes: u64,
    },
    /// Round trips of `size`-byte messages to an echo server on one connection.
    /// Prints JSON with the count done and latency percentiles (µs). Exits 3 if the
    /// connection was closed before `count` round trips.
    Ping {
        #[arg(long)]
        connect: SocketAddr,
        #[arg(long, default_value_t = 100)]
        count: u64,
        #[arg(long, default_value_t = 64)]
        size: usize,
        #[arg(long, default_value_t = 0)]
        interval_ms: u64,
    },
    /// Opens and closes `count` connections one after another, each with one round
    /// trip of `bytes` to an echo server. Prints JSON with the rate and the setup
    /// latency percentiles (µs, connect to the whole answer).
    Churn {
        #[arg(long)]
        connect: SocketAddr,
        #[arg(long, default_value_t = 1000)]
        count: u64,
        #[arg(long, default_value_t = 64)]
        bytes: usize,
    },
    /// Holds `count` connections to an echo server open at once (one round trip
    /// each), prints "open" and keeps them until stdin closes or `hold_secs` pass.
    Hold {
        #[arg(long)]
        connect: SocketAddr,
        #[arg(long, default_value_t = 1000)]
        count: u64,
        #[arg(long, default_value_t = 30)]
        hold_secs: u64,
    },
    /// An HTTP/1.1 server: every request is answered with one JSON object describing
    /// what arrived: {"server", "method", "path", "query", "peer", "headers": {..}}.
    /// Request headers steer the answer, for tests of what a proxy does with it:
    /// `x-e2e-status: N` answers N (else 200), `x-e2e-delay-ms: N` answers after N ms,
    /// `x-e2e-reset: 1` closes the connection without an answer. Requests carrying
    /// `x-e2e-key: K` are counted by K, and `GET /e2e/count?key=K` answers
    /// {"count": n}. With `--body-bytes N`, every request is read whole and answered
    /// 200 with N bytes instead (a fixed-size response for load tests).
    Http {
        #[arg(long)]
        listen: SocketAddr,
        #[arg(long)]
        body_bytes: Option<usize>,
        /// The `server` of the answers (to tell several servers apart).
        #[arg(long, default_value = "")]
        name: String,
    },
    /// HTTP GET (for metrics and admin endpoints inside a namespace); prints the body.
    /// With `--count N`, N GETs, each on its own connection, one body per line.
    Get {
        url: String,
        /// A request header, `name: value` (repeatable).
        #[arg(long = "header")]
        headers: Vec<String>,
        #[arg(long, default_value_t = 1)]
        count: u32,
    },
    /// The test DNS upstream on UDP and TCP: `external.test.` A 192.0.2.1, `big.test.`
    /// with 40 A records (truncated over UDP without room), NXDOMAIN for every other
    /// name; NOTIMP for other opcodes, FORMERR without exactly one question, nothing
    /// for what does not parse.
    Dns {
        #[arg(long)]
        listen: SocketAddr,
        /// Log one line per answer (who asked what, the answer's code and size).
        #[arg(long)]
        log_queries: bool,
    },
    /// The local cluster's DNS (CoreDNS's `kubernetes` plugin for Services): the
    /// ClusterIPs of `<service>.<namespace>.svc.cluster.local`, read from the API
    /// server at `--api`; NXDOMAIN for every other name.
    ClusterDns {
        #[arg(long)]
        listen: SocketAddr,
        #[arg(long)]
        api: SocketAddr,
        #[arg(long)]
        log_queries: bool,
    },
    /// Traffic that carries a marker: every `interval_ms`, a new connection to an echo
    /// server sends `bytes` bytes made of `marker` repeated, half-closes and checks the
    /// same bytes come back. Prints one JSON line per connection (`{"n": i, "ok": true}`
    /// or with `"error"`), failures included, until `duration_secs` pass or it is killed.
    Stream {
        #[arg(long)]
        connect: SocketAddr,
        #[arg(long)]
        marker: String,
        #[arg(long, default_value_t = 1024)]
        bytes: usize,
        #[arg(long, default_value_t = 20)]
        interval_ms: u64,
        #[arg(long, default_value_t = 3600)]
        duration_secs: u64,
    },
    /// The soak's traffic to echo servers: `long` connections held open, each with a
    /// 64-byte round trip every `long_interval_secs`, and `rate` new connections per
    /// second, each with one round trip of `bytes`. Targets are `ip:port` or
    /// `name:port` (resolved once). Prints a JSON report line every `report_secs`
    /// (cumulative counts, and the failures since the last line) until killed.
    SoakLoad {
        #[arg(long, value_delimiter = ',')]
        long_targets: Vec<String>,
        #[arg(long, default_value_t = 0)]
        long: usize,
        #[arg(long, default_value_t = 10)]
        long_interval_secs: u64,
        #[arg(long, value_delimiter = ',')]
        short_targets: Vec<String>,
        #[arg(long, default_value_t = 0)]
        rate: u32,
        #[arg(long, default_value_t = 1024)]
        bytes: usize,
        #[arg(long, default_value_t = 5)]
        report_secs: u64,
    },
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Cmd::Sink { listen } => serve(listen, sink),
        Cmd::Echo { listen } => serve(listen, echo),
        Cmd::Send { connect, bytes } => send(&connect, bytes),
        Cmd::Ping {
            connect,
            count,
            size,
            interval_ms,
        } => ping(connect, count, size, interval_ms),
        Cmd::Churn {
            connect,
            count,
            bytes,
        } => churn(connect, count, bytes),
        Cmd::Hold {
            connect,
            count,
            hold_secs,
        } => hold(connect, count, hold_secs),
        Cmd::Get {
            url,
            headers,
            count,
        } => {
            for _ in 0..count {
                get(&url, &headers)?;
                if count > 1 {
                    println!();
                }
            }
            Ok(())
        }
        Cmd::Http {
            listen,
            body_bytes,
            name,
        } => http_server(listen, body_bytes, name),
        Cmd::Dns {
            listen,
            log_queries,
        } => local_cluster::dns::serve(listen, log_queries),
        Cmd::ClusterDns {
            listen,
            api,
            log_queries,
        } => local_cluster::services::cluster_dns::serve(listen, api, log_queries),
        Cmd::Stream {
            connect,
            marker,
            bytes,
            interval_ms,
            duration_secs,
        } => stream(connect, &marker, bytes, interval_ms, duration_secs),
        Cmd::SoakLoad {
            long_targets,
            long,
            long_interval_secs,
            short_targets,
            rate,
            bytes,
            report_secs,
        } => {
            let spec = local_cluster::load::LoadSpec {
                long_targets: resolve_all(&long_targets)?,
                long,
                long_interval: Duration::from_secs(long_interval_secs.max(1)),
                short_targets: resolve_all(&short_targets)?,
                rate,
                bytes,
                report: Duration::from_secs(report_secs.max(1)),
            };
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?
                .block_on(local_cluster::load::run(spec));
            Ok(())
        }
    }
}

/// `ip:port` or `name:port`, each resolved to its first address.
fn resolve_all(targets: &[String]) -> Result<Vec<SocketAddr>> {
    targets
        .iter()
        .map(|t| {
            t.to_socket_addrs()
                .with_context(|| format!("resolving {t}"))?
                .next()
                .with_context(|| format!("{t} has no address"))
        })
        .collect()
}

fn serve(listen: SocketAddr, handler: fn(TcpStream) -> Result<()>) -> Result<()> {
    let listener = TcpListener::bind(listen).with_context(|| format!("binding {listen}"))?;
    eprintln!("listening on {listen}");
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        std::thread::spawn(move || {
            if let Err(e) = handler(stream) {
                eprintln!("connection error: {e:#}");
            }
        });
    }
    Ok(())
}

fn sink(mut stream: TcpStream) -> Result<()> {
    // An IPv4 client of a `[::]` listener shows as its IPv4 address, not `::ffff:`.
    let peer = stream.peer_addr()?;
    let peer = std::net::SocketAddr::new(peer.ip().to_canonical(), peer.port());
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0u64;
    loop {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        total += n as u64;
    }
    let answer = serde_json::json!({
        "peer": peer.to_string(),
        "bytes": total,
        "sha256": hex(&hasher.finalize()),
    });
    writeln!(stream, "{answer}")?;
    Ok(())
}

fn echo(mut stream: TcpStream) -> Result<()> {
    stream.set_nodelay(true)?;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        stream.write_all(&buf[..n])?;
    }
}

/// Deterministic, incompressible-looking payload (xorshift64).
fn fill(buf: &mut [u8], state: &mut u64) {
    for chunk in buf.chunks_mut(8) {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        let bytes = state.to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
}

fn send(target: &str, bytes: u64) -> Result<()> {
    let connect = target
        .to_socket_addrs()
        .with_context(|| format!("resolving {target}"))?
        .next()
        .with_context(|| format!("{target} resolved to no address"))?;
    let mut stream =
        TcpStream::connect(connect).with_context(|| format!("connecting to {connect}"))?;
    let mut hasher = Sha256::new();
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut buf = vec![0u8; 256 * 1024];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        fill(&mut buf[..n], &mut state);
        hasher.update(&buf[..n]);
        stream.write_all(&buf[..n])?;
        left -= n as u64;
    }
    stream.shutdown(Shutdown::Write)?;
    let mut line = String::new();
    BufReader::new(&stream).read_line(&mut line)?;
    let mut answer: serde_json::Value =
        serde_json::from_str(line.trim()).with_context(|| format!("sink answered {line:?}"))?;
    answer["connected"] = connect.to_string().into();
    println!("{answer}");
    let digest = hex(&hasher.finalize());
    if answer["bytes"] != bytes || answer["sha256"] != digest.as_str() {
        bail!(
            "sink received different data: sent {bytes} bytes sha256 {digest}, sink says {answer}"
        );
    }
    Ok(())
}

fn ping(connect: SocketAddr, count: u64, size: usize, interval_ms: u64) -> Result<()> {
    let mut stream =
        TcpStream::connect(connect).with_context(|| format!("connecting to {connect}"))?;
    stream.set_nodelay(true)?;
    let message = vec![0x5au8; size];
    let mut reply = vec![0u8; size];
    let mut samples = Vec::with_capacity(count as usize);
    let mut closed = None;
    for _ in 0..count {
        let start = Instant::now();
        if let Err(e) = stream
            .write_all(&message)
            .and_then(|()| stream.read_exact(&mut reply))
        {
            closed = Some(e.to_string());
            break;
        }
        samples.push(start.elapsed().as_nanos() as u64);
        if interval_ms > 0 {
            std::thread::sleep(Duration::from_millis(interval_ms));
        }
    }
    let done = samples.len();
    let mut report = percentiles(&mut samples);
    report["done"] = done.into();
    report["closed"] = closed.clone().into();
    println!("{report}");
    if closed.is_some() {
        std::process::exit(3);
    }
    Ok(())
}

/// p50/p99/p99.9 in µs of nanosecond samples, as JSON.
fn percentiles(samples: &mut [u64]) -> serde_json::Value {
    samples.sort_unstable();
    let pct = |p: f64| -> f64 {
        if samples.is_empty() {
            return 0.0;
        }
        let i = ((samples.len() as f64 - 1.0) * p).round() as usize;
        samples[i] as f64 / 1000.0
    };
    serde_json::json!({"p50_us": pct(0.50), "p99_us": pct(0.99), "p999_us": pct(0.999)})
}

fn churn(connect: SocketAddr, count: u64, bytes: usize) -> Result<()> {
    let message = vec![0x5au8; bytes];
    let mut reply = vec![0u8; bytes];
    let mut samples = Vec::with_capacity(count as usize);
    let started = Instant::now();
    for _ in 0..count {
        let start = Instant::now();
        let mut stream =
            TcpStream::connect(connect).with_context(|| format!("connecting to {connect}"))?;
        stream.set_nodelay(true)?;
        stream.write_all(&message)?;
        stream.read_exact(&mut reply)?;
        samples.push(start.elapsed().as_nanos() as u64);
    }
    let elapsed = started.elapsed().as_secs_f64();
    let mut report = percentiles(&mut samples);
    report["connections_per_second"] = (count as f64 / elapsed).into();
    println!("{report}");
    Ok(())
}

fn hold(connect: SocketAddr, count: u64, hold_secs: u64) -> Result<()> {
    let message = [0x5au8; 64];
    let mut reply = [0u8; 64];
    let mut streams = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let mut stream =
            TcpStream::connect(connect).with_context(|| format!("connecting to {connect}"))?;
        stream.write_all(&message)?;
        stream.read_exact(&mut reply)?;
        streams.push(stream);
    }
    println!("open {}", streams.len());
    std::io::stdout().flush()?;
    let deadline = Instant::now() + Duration::from_secs(hold_secs);
    // Returns when stdin closes (the harness is done) or the deadline passes.
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut sink);
        let _ = done_tx.send(());
    });
    let _ = done_rx.recv_timeout(deadline.saturating_duration_since(Instant::now()));
    Ok(())
}

fn stream(
    connect: SocketAddr,
    marker: &str,
    bytes: usize,
    interval_ms: u64,
    duration_secs: u64,
) -> Result<()> {
    if marker.is_empty() {
        bail!("--marker must not be empty");
    }
    let payload: Vec<u8> = marker
        .bytes()
        .cycle()
        .take(bytes.max(marker.len()))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(duration_secs);
    let mut n = 0u64;
    while Instant::now() < deadline {
        let started = Instant::now();
        let line = match exchange(connect, &payload) {
            Ok(()) => serde_json::json!({"n": n, "ok": true}),
            Err(e) => serde_json::json!({"n": n, "ok": false, "error": format!("{e:#}")}),
        };
        println!("{line}");
        n += 1;
        let pause = Duration::from_millis(interval_ms).saturating_sub(started.elapsed());
        std::thread::sleep(pause);
    }
    Ok(())
}

/// One connection of `stream`: send, half-close, read the echo, compare.
fn exchange(connect: SocketAddr, payload: &[u8]) -> Result<()> {
    let timeout = Duration::from_secs(3);
    let mut stream = TcpStream::connect_timeout(&connect, timeout)
        .with_context(|| format!("connecting to {connect}"))?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.write_all(payload).context("sending")?;
    stream.shutdown(Shutdown::Write)?;
    let mut back = Vec::with_capacity(payload.len());
    stream.read_to_end(&mut back).context("reading the echo")?;
    if back != payload {
        bail!("echoed {} bytes, sent {}", back.len(), payload.len());
    }
    Ok(())
}

fn get(url: &str, headers: &[String]) -> Result<()> {
    let rest = url.strip_prefix("http://").context("only http:// URLs")?;
    let (host, path) = rest
        .split_once('/')
        .map_or((rest, "/".to_owned()), |(h, p)| (h, format!("/{p}")));
    let mut stream = TcpStream::connect(host).with_context(|| format!("connecting to {host}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut head = format!("GET {path} HTTP/1.0\r\nHost: {host}\r\nConnection: close\r\n");
    for h in headers {
        head.push_str(h);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head.split_whitespace().nth(1).unwrap_or("");
    print!("{body}");
    if status != "200" {
        bail!("GET {url} answered {}", head.lines().next().unwrap_or(""));
    }
    Ok(())
}

fn http_server(listen: SocketAddr, body_bytes: Option<usize>, name: String) -> Result<()> {
    use http_body_util::{BodyExt, Full};
    use hyper::body::Incoming;

    if let Some(n) = body_bytes {
        // `--body-bytes`: each request is read to its end, then answered 200 with
        // `n` bytes.
        let body = bytes::Bytes::from(vec![b'x'; n]);
        return serve_http1(listen, move |_| {
            let body = body.clone();
            hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
                let body = body.clone();
                async move {
                    request.into_body().collect().await?;
                    Ok::<_, hyper::Error>(hyper::Response::new(Full::new(body)))
                }
            })
        });
    }
    let counts: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let name = Arc::new(name);
    serve_http1(listen, move |peer: SocketAddr| {
        let (counts, name) = (counts.clone(), name.clone());
        hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            let header = |name: &str| {
                request
                    .headers()
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
            };
            let query = request.uri().query().unwrap_or("").to_owned();
            let mut counts = counts.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(key) = header("x-e2e-key") {
                *counts.entry(key).or_default() += 1;
            }
            let answer = if request.uri().path() == "/e2e/count" {
                let key = query.strip_prefix("key=").unwrap_or("");
                serde_json::json!({"count": counts.get(key).copied().unwrap_or(0)})
            } else {
                let headers: serde_json::Map<String, serde_json::Value> = request
                    .headers()
                    .iter()
                    .map(|(k, v)| (k.to_string(), String::from_utf8_lossy(v.as_bytes()).into()))
                    .collect();
                serde_json::json!({
                    "server": name.as_str(),
                    "method": request.method().as_str(),
                    "path": request.uri().path(),
                    "query": query,
                    "peer": peer.to_string(),
                    "headers": headers,
                })
            };
            drop(counts);
            let status = header("x-e2e-status").and_then(|s| s.parse::<u16>().ok());
            let delay = header("x-e2e-delay-ms").and_then(|s| s.parse::<u64>().ok());
            let reset = header("x-e2e-reset").is_some();
            let body = Full::new(bytes::Bytes::from(answer.to_string()));
            async move {
                if let Some(ms) = delay {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                }
                if reset {
                    // An error from the service makes hyper close the connection.
                    return Err(anyhow::anyhow!("reset as asked"));
                }
                let mut response = hyper::Response::new(body);
                if let Some(code) = status.and_then(|c| hyper::StatusCode::from_u16(c).ok()) {
                    *response.status_mut() = code;
                }
                Ok::<_, anyhow::Error>(response)
            }
        })
    })
}

/// Serves HTTP/1.1 on `listen` from one thread, each connection with the service
/// `service` makes for its peer.
fn serve_http1<S, E>(listen: SocketAddr, service: impl Fn(SocketAddr) -> S) -> Result<()>
where
    S: hyper::service::Service<
            hyper::Request<hyper::body::Incoming>,
            Response = hyper::Response<http_body_util::Full<bytes::Bytes>>,
            Error = E,
        > + Send
        + 'static,
    S::Future: Send,
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen).await?;
        loop {
            let (stream, peer) = listener.accept().await?;
            let connection = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service(peer));
            tokio::spawn(async move {
                let _ = connection.await;
            });
        }
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
