//! Instructions through one HBONE hop, counted by callgrind: exact and repeatable
//! where time and CPU figures move with the machine's load. Both dedicated-mode
//! ztunnels run under valgrind; their counters are zeroed once the pool is warm and
//! dumped after each fixed workload (a bulk transfer, 64-byte round trips on one
//! connection, new connections), so each figure is that work's alone. Counts are user
//! space only (the kernel's copies are not in them); valgrind's CPU has no AVX-512, so
//! AES-GCM runs aws-lc's AVX2 code here; and it counts every byte a `rep movsb` copies
//! as one instruction, so the memcpy row reads as bytes copied per byte carried.
//!
//! The counts are exact for one build of one commit on one CPU and valgrind, so CI
//! gates on them (`bench --gate`): each row names the build (debug rows are CI's) and
//! carries the machine it was counted on.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use local_cluster::standalone::{Standalone, ECHO_PORT, SERVER_IP, SINK_PORT};

use crate::report::{single, Figure};
use crate::standalone::{churn_to, ping_to};
use crate::Plan;

/// What each count covers once the counters are zeroed. Fixed, not scaled by
/// `--quick`: the figures are per unit, and the gate compares runs of the same size.
const TRANSFER_MIB: u64 = 16;
const ROUND_TRIPS: u64 = 1000;
const CONNECTIONS: u64 = 200;

/// What a symbol's cost is counted as, first match wins.
const CATEGORIES: [(&str, &[&str]); 6] = [
    ("AES-GCM", &["aes", "gcm", "ghash"]),
    ("memcpy/memmove", &["memcpy", "memmove"]),
    ("rustls", &["rustls::"]),
    ("h2", &["h2::"]),
    ("tokio", &["tokio::", "mio::"]),
    ("mimalloc", &["mi_"]),
];

pub fn run(_plan: &Plan) -> Result<Vec<Figure>> {
    let bytes = TRANSFER_MIB << 20;
    eprintln!(
        "callgrind: {TRANSFER_MIB} MiB, {ROUND_TRIPS} round trips and {CONNECTIONS} new connections through two ztunnels under valgrind..."
    );
    let machine = machine()?;
    // The debug build is CI's; its counts gate CI and say nothing about speed.
    let (build, goal) = if cfg!(debug_assertions) {
        (", debug build", "")
    } else {
        ("", "<= 3.0 (issue 42)")
    };
    let dir = tempfile::tempdir()?;
    let out = dir.path().join("callgrind.out.%p");
    std::env::set_var(
        "ZTUNNEL_TEST_WRAPPER",
        format!(
            "valgrind --tool=callgrind --callgrind-out-file={}",
            out.display()
        ),
    );
    let topology = Standalone::new("cg");
    std::env::remove_var("ZTUNNEL_TEST_WRAPPER");
    let topology = topology.context("starting the ztunnels under valgrind (is it installed?)")?;
    let target = format!("{SERVER_IP}:{SINK_PORT}");
    // Warm: the TLS handshake, the pooled connection, the allocator's pages.
    topology.send(&target, 1 << 20)?;
    ping_to(&topology.a, SERVER_IP, ECHO_PORT, 20, 0)?;
    let ends = Ends {
        pids: [topology.ztunnel_a.pid(), topology.ztunnel_b.pid()],
        dir: dir.path(),
    };
    let gated = |mut row: Figure| {
        row.gated_on = Some(machine.clone());
        row
    };

    let mut figures = Vec::new();
    let counted = ends.count(&|| topology.send(&target, bytes).map(drop))?;
    for (end, (total, dump)) in END_NAMES.iter().zip(counted) {
        let by_symbol = annotate(&dump, total)?;
        eprintln!("callgrind, {end}: top functions by own instructions");
        for (symbol, ir) in by_symbol.iter().take(12) {
            eprintln!("  {:5.1} %  {symbol}", 100.0 * *ir as f64 / total as f64);
        }
        let per_byte = |ir: u64| ir as f64 / bytes as f64;
        let in_category = |name: &str| -> u64 {
            by_symbol
                .iter()
                .filter(|(symbol, _)| category(symbol) == Some(name))
                .map(|(_, ir)| ir)
                .sum()
        };
        let (aes, copies) = (in_category("AES-GCM"), in_category("memcpy/memmove"));
        let mut row = single(
            &format!("ztunnel instructions per byte, {end} (callgrind, user space){build}"),
            "instr/B",
            per_byte(total),
            goal,
        );
        row.limit = Some(format!(
            "AES-GCM {:.2} (its floor) + copies {:.2} (bytes copied per byte) + the rest {:.2}",
            per_byte(aes),
            per_byte(copies),
            per_byte(total - aes - copies),
        ));
        figures.push(gated(row));
        for (name, _) in CATEGORIES {
            figures.push(single(
                &format!("share of those in {name}, {end}{build}"),
                "%",
                100.0 * in_category(name) as f64 / total as f64,
                "",
            ));
        }
    }

    // What a request and a new connection cost, apart from the bytes they carry.
    let a = &topology.a;
    let round_trips = || ping_to(a, SERVER_IP, ECHO_PORT, ROUND_TRIPS, 0).map(drop);
    let connections = || churn_to(a, SERVER_IP, ECHO_PORT, CONNECTIONS, 64).map(drop);
    let workloads: [(&str, u64, Work); 2] = [
        ("64 B round trip", ROUND_TRIPS, &round_trips),
        ("new connection", CONNECTIONS, &connections),
    ];
    for (unit, count, work) in workloads {
        let counted = ends.count(work)?;
        for (end, (total, _)) in END_NAMES.iter().zip(counted) {
            figures.push(gated(single(
                &format!("ztunnel instructions per {unit}, {end} (callgrind){build}"),
                "instr",
                total as f64 / count as f64,
                "",
            )));
        }
    }
    drop(topology);
    Ok(figures)
}

const END_NAMES: [&str; 2] = ["client end", "server end"];

/// Traffic the ends are counted over.
type Work<'a> = &'a dyn Fn() -> Result<()>;

/// The two ztunnels under callgrind, and where their dumps go.
struct Ends<'a> {
    pids: [u32; 2],
    dir: &'a Path,
}

impl Ends<'_> {
    /// Each end's instructions while `work` runs, and the dump holding them.
    fn count(&self, work: Work) -> Result<[(u64, PathBuf); 2]> {
        for pid in self.pids {
            callgrind_control("-z", pid)?;
        }
        work()?;
        let mut counted = Vec::new();
        for pid in self.pids {
            callgrind_control("-d", pid)?;
            let dump = last_dump(self.dir, pid)?;
            let text = std::fs::read_to_string(&dump)?;
            let total =
                totals(&text).with_context(|| format!("no totals in {}", dump.display()))?;
            counted.push((total, dump));
        }
        Ok(counted.try_into().expect("two ends"))
    }
}

/// What the counts depend on besides the code: the CPU (which AES-GCM and memcpy
/// code runs) and valgrind (which CPU features it passes through).
fn machine() -> Result<String> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo")?;
    let model = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")?
                .split_once(':')
                .map(|(_, m)| m.trim())
        })
        .unwrap_or("unknown CPU");
    let flags: Vec<&str> = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("flags")?.split_once(':').map(|(_, f)| f))
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let relevant: Vec<&str> = [
        "aes",
        "vaes",
        "pclmulqdq",
        "vpclmulqdq",
        "avx2",
        "avx512f",
        "erms",
        "fsrm",
    ]
    .into_iter()
    .filter(|flag| flags.contains(flag))
    .collect();
    let valgrind = valgrind_tool("valgrind", &["--version"])?;
    Ok(format!(
        "{model} [{}], {}",
        relevant.join(" "),
        valgrind.trim()
    ))
}

fn callgrind_control(flag: &str, pid: u32) -> Result<()> {
    valgrind_tool("callgrind_control", &[flag, &pid.to_string()]).map(drop)
}

/// Runs one of valgrind's scripts; its stdout.
fn valgrind_tool(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("running {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The newest dump of `pid` (`callgrind.out.<pid>.<n>`, highest `n`).
fn last_dump(dir: &Path, pid: u32) -> Result<PathBuf> {
    let prefix = format!("callgrind.out.{pid}.");
    let mut dumps: Vec<(u32, PathBuf)> = std::fs::read_dir(dir)?
        .filter_map(|entry| {
            let path = entry.ok()?.path();
            let n = path
                .file_name()?
                .to_str()?
                .strip_prefix(&prefix)?
                .parse()
                .ok()?;
            Some((n, path))
        })
        .collect();
    dumps.sort();
    dumps
        .pop()
        .map(|(_, path)| path)
        .with_context(|| format!("callgrind wrote no dump for {pid} in {}", dir.display()))
}

/// The event total of a callgrind dump (its `totals:` line, else `summary:`).
fn totals(dump: &str) -> Option<u64> {
    let line = |key: &str| {
        dump.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
    };
    line("totals:").or_else(|| line("summary:"))
}

/// Own (exclusive) instructions per function, largest first, from
/// `callgrind_annotate`. The frames that were on the stack when the counters were
/// zeroed (main, the worker's `block_on`) come out carrying the whole total: left
/// out.
fn annotate(dump: &Path, total: u64) -> Result<Vec<(String, u64)>> {
    let dump = dump.to_str().context("dump path")?;
    let text = valgrind_tool(
        "callgrind_annotate",
        &["--inclusive=no", "--threshold=100", "--auto=no", dump],
    )?;
    let mut rows = parse_annotate(&text);
    rows.retain(|(_, ir)| (*ir as f64) < 0.99 * total as f64);
    Ok(rows)
}

/// Lines `  1,234,567 (12.3%)  file:symbol [object]` (the percentage is left out by
/// older versions).
fn parse_annotate(text: &str) -> Vec<(String, u64)> {
    let mut rows: Vec<(String, u64)> = text
        .lines()
        .filter_map(|line| {
            let line = line.trim_start();
            let (count, rest) = line.split_once(' ')?;
            let ir: u64 = count.replace(',', "").parse().ok()?;
            let rest = rest.trim_start();
            let rest = match rest.strip_prefix('(') {
                Some(r) => r.split_once(')')?.1.trim_start(),
                None => rest,
            };
            let symbol = rest.split_once(':').map_or(rest, |(_, s)| s);
            let symbol = symbol.split(" [").next()?.trim();
            (!symbol.is_empty()).then(|| (symbol.to_owned(), ir))
        })
        .collect();
    rows.sort_by_key(|(_, ir)| std::cmp::Reverse(*ir));
    rows
}

fn category(symbol: &str) -> Option<&'static str> {
    let lower = symbol.to_ascii_lowercase();
    CATEGORIES
        .iter()
        .find(|(_, patterns)| patterns.iter().any(|p| lower.contains(p)))
        .map(|(name, _)| *name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_totals_and_annotated_rows() {
        assert_eq!(
            totals("events: Ir\nsummary: 42\n\ntotals: 1234\n"),
            Some(1234)
        );
        assert_eq!(totals("summary: 7\n"), Some(7));
        assert_eq!(totals("events: Ir\n"), None);
        let text = "\
--------------------------------------------------------------------------------
Ir                   file:function
--------------------------------------------------------------------------------
1,000,000 (50.0%)  ???:aws_lc_0_47_0_aes_gcm_enc_update_vaes_avx2 [/ztunnel]
  400,000 (20.0%)  ./string/../sysdeps/x86_64/multiarch/memmove-vec-unaligned-erms.S:__memmove_avx_unaligned_erms [/usr/lib/x86_64-linux-gnu/libc.so.6]
   50,000  ???:h2::proto::streams::prioritize::Prioritize::pop_frame [/ztunnel]
";
        let rows = parse_annotate(text);
        assert_eq!(rows.len(), 3);
        assert_eq!(
            rows[0],
            (
                "aws_lc_0_47_0_aes_gcm_enc_update_vaes_avx2".into(),
                1_000_000
            )
        );
        assert_eq!(category(&rows[0].0), Some("AES-GCM"));
        assert_eq!(category(&rows[1].0), Some("memcpy/memmove"));
        assert_eq!(category(&rows[2].0), Some("h2"));
        assert_eq!(category("tokio::runtime::park"), Some("tokio"));
        assert_eq!(category("ztunnel::proxy::outbound::Outbound::proxy"), None);
    }
}
