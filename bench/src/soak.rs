//! The growth figures of the last `make soak` (target/soak/summary.json): the soak runs
//! for an hour, so the benchmark reports it rather than running it.

use anyhow::{Context, Result};
use serde_json::Value;

use crate::report::{single, Figure};
use crate::Plan;

/// Where `make soak` leaves its summary.
const SUMMARY: &str = "target/soak/summary.json";

pub fn run(_plan: &Plan) -> Result<Vec<Figure>> {
    let text = match std::fs::read_to_string(SUMMARY) {
        Ok(text) => text,
        Err(_) => {
            eprintln!("soak: no {SUMMARY}: run `make soak` for its figures");
            return Ok(Vec::new());
        }
    };
    let summary: Value =
        serde_json::from_str(&text).with_context(|| format!("reading {SUMMARY}"))?;
    let minutes = summary["duration_s"].as_f64().unwrap_or_default() / 60.0;
    let growth = |key: &str| -> f64 {
        summary["growth"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|g| {
                let (from, to) = (g[key][0].as_f64()?, g[key][1].as_f64()?);
                Some((to / from.max(1.0) - 1.0) * 100.0)
            })
            .fold(0.0, f64::max)
    };
    let failed = summary["verdicts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["passed"] != true)
        .count();
    let name = |what: &str| format!("soak ({minutes:.0} min, last make soak): {what}");
    Ok(vec![
        single(
            &name("largest RSS growth after warm-up"),
            "%",
            growth("rss_kib"),
            "0 (fails > 10)",
        ),
        single(
            &name("largest descriptor growth after warm-up"),
            "%",
            growth("fds"),
            "0 (fails > 10)",
        ),
        single(&name("verdicts failed"), "count", failed as f64, "0"),
    ])
}
