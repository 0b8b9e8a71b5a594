//! The soak's traffic, run inside a client pod (`e2e-app soak-load`): long-lived
//! connections to echo servers, each doing a round trip every interval, and short
//! connections opened at a steady rate, each with one round trip. Every `report`
//! interval it prints one JSON line of cumulative counts ([`Report`]) and the failures
//! since the last line, grouped by kind, target and reason with the time of the first
//! and the last, so the soak can tell failures inside an injected fault's window from
//! failures outside it, however many there are.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{timeout, Instant, MissedTickBehavior};

/// How long one round trip (connect included) may take before it counts as failed.
const ROUND_TRIP_TIMEOUT: Duration = Duration::from_secs(5);
/// Short connections in flight at most: beyond it a tick is counted as skipped, so a
/// stalled mesh shows as failures rather than as an unbounded pile of tasks.
const MAX_IN_FLIGHT: usize = 4096;

/// What to run.
#[derive(Debug, Clone)]
pub struct LoadSpec {
    pub long_targets: Vec<SocketAddr>,
    pub long: usize,
    pub long_interval: Duration,
    pub short_targets: Vec<SocketAddr>,
    pub rate: u32,
    pub bytes: usize,
    pub report: Duration,
}

/// Failed round trips of one kind, to one target, for one reason, since the last
/// report line.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Failures {
    /// `short` or `long`.
    pub kind: String,
    pub target: String,
    pub reason: String,
    pub count: u64,
    /// Unix time of the first and the last, milliseconds.
    pub first_ms: u64,
    pub last_ms: u64,
}

/// One report line: counts since the start, failures since the last line.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Report {
    pub t_ms: u64,
    pub short_opened: u64,
    pub short_ok: u64,
    pub short_failed: BTreeMap<String, u64>,
    /// Ticks with no room left (more than [`MAX_IN_FLIGHT`] connections in flight).
    pub short_skipped: u64,
    pub long_open: u64,
    pub long_round_trips: u64,
    /// Long-lived connections that broke (each is then opened again).
    pub long_lost: BTreeMap<String, u64>,
    pub failures: Vec<Failures>,
}

#[derive(Default)]
struct Counters {
    report: Report,
    in_flight: usize,
}

type Shared = Arc<Mutex<Counters>>;

/// Runs until killed.
pub async fn run(spec: LoadSpec) {
    let shared: Shared = Arc::default();
    for i in 0..spec.long {
        if spec.long_targets.is_empty() {
            break;
        }
        let target = spec.long_targets[i % spec.long_targets.len()];
        // Spread the round trips over the interval.
        let offset = spec
            .long_interval
            .mul_f64(i as f64 / spec.long.max(1) as f64);
        tokio::spawn(long_lived(
            target,
            spec.long_interval,
            offset,
            shared.clone(),
        ));
    }
    if spec.rate > 0 && !spec.short_targets.is_empty() {
        tokio::spawn(short_connections(spec.clone(), shared.clone()));
    }
    let mut tick = tokio::time::interval(spec.report);
    tick.tick().await;
    loop {
        tick.tick().await;
        let line = {
            let Ok(mut c) = shared.lock() else { return };
            c.report.t_ms = now_ms();
            let line = serde_json::to_string(&c.report).unwrap_or_default();
            c.report.failures.clear();
            line
        };
        println!("{line}");
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

fn record_failure(shared: &Shared, kind: &str, target: SocketAddr, reason: String) {
    let Ok(mut c) = shared.lock() else { return };
    let r = &mut c.report;
    let counts = if kind == "short" {
        &mut r.short_failed
    } else {
        &mut r.long_lost
    };
    *counts.entry(reason.clone()).or_default() += 1;
    let (now, target) = (now_ms(), target.to_string());
    match r
        .failures
        .iter_mut()
        .find(|f| f.kind == kind && f.target == target && f.reason == reason)
    {
        Some(group) => {
            group.count += 1;
            group.last_ms = now;
        }
        None => r.failures.push(Failures {
            kind: kind.to_owned(),
            target,
            reason,
            count: 1,
            first_ms: now,
            last_ms: now,
        }),
    }
}

/// Why a round trip failed, in a few stable words.
fn reason(e: &std::io::Error) -> String {
    use std::io::ErrorKind::*;
    match e.kind() {
        ConnectionRefused => "connection refused",
        ConnectionReset => "connection reset",
        ConnectionAborted => "connection aborted",
        UnexpectedEof => "closed by the peer",
        TimedOut => "timed out",
        InvalidData => "wrong bytes echoed",
        _ => return e.to_string(),
    }
    .to_owned()
}

/// One round trip of `message` over `stream`, checked.
async fn round_trip(
    stream: &mut TcpStream,
    message: &[u8],
    reply: &mut [u8],
) -> std::io::Result<()> {
    stream.write_all(message).await?;
    stream.read_exact(reply).await?;
    if reply != message {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "echo mismatch",
        ));
    }
    Ok(())
}

async fn timed<T>(f: impl std::future::Future<Output = std::io::Result<T>>) -> std::io::Result<T> {
    timeout(ROUND_TRIP_TIMEOUT, f)
        .await
        .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()))
}

async fn long_lived(target: SocketAddr, interval: Duration, offset: Duration, shared: Shared) {
    let message = [0x4cu8; 64];
    let mut reply = [0u8; 64];
    tokio::time::sleep(offset).await;
    loop {
        let mut stream = match timed(TcpStream::connect(target)).await {
            Ok(s) => s,
            Err(e) => {
                record_failure(
                    &shared,
                    "long",
                    target,
                    format!("reconnect: {}", reason(&e)),
                );
                tokio::time::sleep(interval).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        if let Ok(mut c) = shared.lock() {
            c.report.long_open += 1;
        }
        let mut tick = tokio::time::interval_at(Instant::now(), interval);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let error = loop {
            tick.tick().await;
            match timed(round_trip(&mut stream, &message, &mut reply)).await {
                Ok(()) => {
                    if let Ok(mut c) = shared.lock() {
                        c.report.long_round_trips += 1;
                    }
                }
                Err(e) => break e,
            }
        };
        if let Ok(mut c) = shared.lock() {
            c.report.long_open -= 1;
        }
        record_failure(&shared, "long", target, reason(&error));
    }
}

async fn short_connections(spec: LoadSpec, shared: Shared) {
    let message: Arc<[u8]> = vec![0x53u8; spec.bytes].into();
    let mut tick = tokio::time::interval(Duration::from_secs(1) / spec.rate);
    tick.set_missed_tick_behavior(MissedTickBehavior::Burst);
    let mut n = 0usize;
    loop {
        tick.tick().await;
        let target = spec.short_targets[n % spec.short_targets.len()];
        n += 1;
        {
            let Ok(mut c) = shared.lock() else { return };
            if c.in_flight >= MAX_IN_FLIGHT {
                c.report.short_skipped += 1;
                continue;
            }
            c.in_flight += 1;
            c.report.short_opened += 1;
        }
        let (shared, message) = (shared.clone(), message.clone());
        tokio::spawn(async move {
            let result = timed(async {
                let mut stream = TcpStream::connect(target).await?;
                stream.set_nodelay(true)?;
                let mut reply = vec![0u8; message.len()];
                round_trip(&mut stream, &message, &mut reply).await
            })
            .await;
            match result {
                Ok(()) => {
                    if let Ok(mut c) = shared.lock() {
                        c.report.short_ok += 1;
                    }
                }
                Err(e) => record_failure(&shared, "short", target, reason(&e)),
            }
            if let Ok(mut c) = shared.lock() {
                c.in_flight -= 1;
            }
        });
    }
}
