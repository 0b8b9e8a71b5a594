//! Instructions per byte through one HBONE hop, counted by callgrind: exact and
//! repeatable where time and CPU figures move with the machine's load. Both
//! dedicated-mode ztunnels run under valgrind; their counters are zeroed once the
//! pool is warm and dumped after a fixed transfer, so the figure is the data path's
//! alone. Counts are user space only (the kernel's copies are not in them);
//! valgrind's CPU has no AVX-512, so AES-GCM runs aws-lc's AVX2 code here; and it
//! counts every byte a `rep movsb` copies as one instruction, so the memcpy row
//! reads as bytes copied per byte carried.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use local_cluster::standalone::{Standalone, SERVER_IP, SINK_PORT};

use crate::report::{single, Figure};
use crate::Plan;

/// What a symbol's cost is counted as, first match wins.
const CATEGORIES: [(&str, &[&str]); 6] = [
    ("AES-GCM", &["aes", "gcm", "ghash"]),
    ("memcpy/memmove", &["memcpy", "memmove"]),
    ("rustls", &["rustls::"]),
    ("h2", &["h2::"]),
    ("tokio", &["tokio::", "mio::"]),
    ("mimalloc", &["mi_"]),
];

pub fn run(plan: &Plan) -> Result<Vec<Figure>> {
    let bytes = plan.callgrind_mib << 20;
    eprintln!(
        "callgrind: {} MiB through two ztunnels under valgrind...",
        plan.callgrind_mib
    );
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
    let ends = [
        ("client end", topology.ztunnel_a.pid()),
        ("server end", topology.ztunnel_b.pid()),
    ];
    for (_, pid) in ends {
        callgrind_control("-z", pid)?;
    }
    topology.send(&target, bytes)?;
    let mut figures = Vec::new();
    for (end, pid) in ends {
        callgrind_control("-d", pid)?;
        let dump = last_dump(dir.path(), pid)?;
        let text = std::fs::read_to_string(&dump)?;
        let total = totals(&text).with_context(|| format!("no totals in {}", dump.display()))?;
        figures.push(single(
            &format!("ztunnel instructions per byte, {end} (callgrind, user space)"),
            "instr/B",
            total as f64 / bytes as f64,
            "",
        ));
        let by_symbol = annotate(&dump, total)?;
        eprintln!("callgrind, {end}: top functions by own instructions");
        for (symbol, ir) in by_symbol.iter().take(12) {
            eprintln!("  {:5.1} %  {symbol}", 100.0 * *ir as f64 / total as f64);
        }
        for (name, _) in CATEGORIES {
            let ir: u64 = by_symbol
                .iter()
                .filter(|(symbol, _)| category(symbol) == Some(name))
                .map(|(_, ir)| ir)
                .sum();
            figures.push(single(
                &format!("share of those in {name}, {end}"),
                "%",
                100.0 * ir as f64 / total as f64,
                "",
            ));
        }
    }
    drop(topology);
    Ok(figures)
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
