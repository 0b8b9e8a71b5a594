//! A small HTTP/1.1 load client for the waypoint section (neither h2load nor wrk is
//! part of the machine's setup, and wrk has no paced mode): keep-alive connections
//! opened from one namespace (so its capture rules apply), each a GET at a time
//! answered with a fixed-size body. Paced (open loop: every request has its scheduled
//! time) or closed loop (each connection sends its next request as soon as the answer
//! is in: the path's saturation).
//!
//! A paced request's latency runs from when it was sent, or from when it was due if
//! the previous answer on its connection came after that (it waited in line, and the
//! wait counts, as wrk2 counts it); tokio's millisecond timer then never adds its
//! own lateness to a latency.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use test_support::netns::Netns;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How a load run sends.
#[derive(Clone, Copy, Debug)]
pub enum Pace {
    /// `rate` requests per second across all connections, evenly spread.
    Paced { rate: f64 },
    /// As fast as the answers come.
    Closed,
}

/// What one load run did.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Latency of every successful request, µs.
    pub latencies_us: Vec<f64>,
    pub ok: u64,
    /// Requests with an error, a status other than 200, or the wrong body size.
    pub failed: u64,
    /// Paced requests that were due before the previous answer on their connection.
    pub queued: u64,
    /// From the first request due to the last answer.
    pub elapsed: Duration,
    /// The first failure's reason, if any.
    pub first_error: Option<String>,
}

impl Outcome {
    pub fn rate(&self) -> f64 {
        self.ok as f64 / self.elapsed.as_secs_f64().max(f64::MIN_POSITIVE)
    }

    fn failure(&mut self, error: anyhow::Error) {
        self.failed += 1;
        self.first_error.get_or_insert(format!("{error:#}"));
    }
}

/// No single request may stall a run for longer than this.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs `connections` keep-alive connections from `ns` to `target` for `duration`
/// (after one untimed request on each, which opens every hop's connection), each
/// request expecting a 200 with a body of `body_bytes`.
pub fn run(
    ns: &Netns,
    target: SocketAddr,
    connections: usize,
    pace: Pace,
    duration: Duration,
    body_bytes: usize,
) -> Result<Outcome> {
    ns.run_inside(move || -> Result<Outcome> {
        // One thread, made in the namespace: every socket it opens lives there.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(load(target, connections, pace, duration, body_bytes))
    })?
}

async fn load(
    target: SocketAddr,
    connections: usize,
    pace: Pace,
    duration: Duration,
    body_bytes: usize,
) -> Result<Outcome> {
    // The untimed first requests count only when they fail: a connection whose first
    // request failed reconnects for its first timed one.
    let mut warmup = Outcome::default();
    let mut warm = Vec::with_capacity(connections);
    for _ in 0..connections {
        let mut conn = Connection::new(target, body_bytes);
        if let Err(e) = conn.timed_exchange().await {
            warmup.failure(e);
        }
        warm.push(conn);
    }
    // Connection i's requests are due at start + i/rate + n*connections/rate.
    let start = Instant::now() + Duration::from_millis(5);
    let deadline = start + duration;
    let tasks: Vec<_> = warm
        .into_iter()
        .enumerate()
        .map(|(i, conn)| {
            let schedule = match pace {
                Pace::Paced { rate } => Some((
                    start + Duration::from_secs_f64(i as f64 / rate),
                    Duration::from_secs_f64(connections as f64 / rate),
                )),
                Pace::Closed => None,
            };
            tokio::spawn(drive(conn, schedule, start, deadline))
        })
        .collect();
    let mut outcome = warmup;
    for task in tasks {
        let one = task.await?;
        outcome.latencies_us.extend(one.latencies_us);
        outcome.ok += one.ok;
        outcome.failed += one.failed;
        outcome.queued += one.queued;
        outcome.first_error = outcome.first_error.or(one.first_error);
    }
    outcome.elapsed = start.elapsed();
    Ok(outcome)
}

/// One connection's requests until `deadline`: at the times of `schedule` (first,
/// interval), or back to back from `start`.
async fn drive(
    mut conn: Connection,
    schedule: Option<(Instant, Duration)>,
    start: Instant,
    deadline: Instant,
) -> Outcome {
    let mut outcome = Outcome::default();
    tokio::time::sleep_until(start.into()).await;
    let mut previous_done = Instant::now();
    for n in 0u32.. {
        let due = match schedule {
            Some((first, interval)) => first + interval * n,
            None => Instant::now(),
        };
        if due >= deadline {
            break;
        }
        if schedule.is_some() {
            tokio::time::sleep_until(due.into()).await;
        }
        let sent = Instant::now();
        let from = if schedule.is_some() && previous_done > due {
            outcome.queued += 1;
            due
        } else {
            sent
        };
        match conn.timed_exchange().await {
            Ok(()) => {
                outcome.ok += 1;
                outcome
                    .latencies_us
                    .push(from.elapsed().as_secs_f64() * 1e6);
            }
            Err(e) => {
                outcome.failure(e);
                // The next request opens a new connection, after a pause so a
                // refusing path is not hammered in a tight loop.
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        previous_done = Instant::now();
    }
    outcome
}

/// A keep-alive HTTP/1.1 connection and its read buffer.
struct Connection {
    target: SocketAddr,
    stream: Option<TcpStream>,
    request: Vec<u8>,
    buf: Vec<u8>,
    body_bytes: usize,
}

impl Connection {
    /// Connects at the first request.
    fn new(target: SocketAddr, body_bytes: usize) -> Self {
        Connection {
            target,
            stream: None,
            request: format!("GET / HTTP/1.1\r\nHost: {target}\r\nUser-Agent: bench\r\n\r\n")
                .into_bytes(),
            buf: Vec::with_capacity(body_bytes + 1024),
            body_bytes,
        }
    }

    async fn reconnect(&mut self) -> Result<()> {
        self.stream = None;
        let stream = tokio::time::timeout(REQUEST_TIMEOUT, TcpStream::connect(self.target))
            .await
            .with_context(|| format!("connecting to {}: timed out", self.target))?
            .with_context(|| format!("connecting to {}", self.target))?;
        stream.set_nodelay(true)?;
        self.stream = Some(stream);
        Ok(())
    }

    /// [`Connection::exchange`], failing after `REQUEST_TIMEOUT`.
    async fn timed_exchange(&mut self) -> Result<()> {
        match tokio::time::timeout(REQUEST_TIMEOUT, self.exchange()).await {
            Ok(result) => result,
            Err(_) => {
                self.stream = None;
                bail!("no answer within {REQUEST_TIMEOUT:?}")
            }
        }
    }

    /// One request and its whole answer, which must be a 200 with the expected body.
    async fn exchange(&mut self) -> Result<()> {
        let stream = match &mut self.stream {
            Some(stream) => stream,
            None => {
                self.reconnect().await?;
                self.stream.as_mut().context("no connection")?
            }
        };
        let result = exchange(stream, &self.request, &mut self.buf, self.body_bytes).await;
        if result.is_err() {
            self.stream = None;
        }
        result
    }
}

async fn exchange(
    stream: &mut TcpStream,
    request: &[u8],
    buf: &mut Vec<u8>,
    body_bytes: usize,
) -> Result<()> {
    stream.write_all(request).await.context("sending")?;
    buf.clear();
    let (head_len, status, length) = loop {
        let mut headers = [httparse::EMPTY_HEADER; 16];
        let mut response = httparse::Response::new(&mut headers);
        if let httparse::Status::Complete(n) = response.parse(buf).context("parsing")? {
            let length = response
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                .and_then(|h| {
                    std::str::from_utf8(h.value)
                        .ok()?
                        .trim()
                        .parse::<usize>()
                        .ok()
                })
                .context("an answer without content-length")?;
            break (n, response.code.unwrap_or(0), length);
        }
        read_more(stream, buf).await?;
    };
    while buf.len() < head_len + length {
        read_more(stream, buf).await?;
    }
    if status != 200 {
        let body = String::from_utf8_lossy(&buf[head_len..head_len + length]);
        bail!("answered {status}: {body}");
    }
    if length != body_bytes {
        bail!("a body of {length} bytes, not {body_bytes}");
    }
    if buf.len() > head_len + length {
        bail!("bytes after the answer");
    }
    Ok(())
}

async fn read_more(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Result<()> {
    buf.reserve(8192);
    if stream.read_buf(buf).await.context("reading")? == 0 {
        bail!("the connection closed mid-answer");
    }
    Ok(())
}
