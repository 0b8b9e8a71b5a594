//! The report: rows of figures, the table and the JSON, each row judged against its
//! goal, and the regression gate on the rows that are exact (instruction counts).

use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;
use serde_json::Value;

/// How far an exact figure may rise over its recorded baseline before the gate fails.
pub const GATE_TOLERANCE: f64 = 0.05;

/// One row of the report.
#[derive(Serialize, Default)]
pub struct Figure {
    pub name: String,
    pub unit: &'static str,
    pub direct: Option<f64>,
    pub mesh: f64,
    /// mesh / direct, or mesh - direct for added latency (see `ratio_kind`).
    pub ratio: Option<f64>,
    pub ratio_kind: &'static str,
    pub goal: &'static str,
    pub samples_direct: Vec<f64>,
    pub samples_mesh: Vec<f64>,
    /// What holds the figure where it is, measured in the same run (shown when the
    /// goal is unmet).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<String>,
    /// For an exact figure the gate checks: the machine it is exact on (a count
    /// from another CPU or valgrind is not comparable).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gated_on: Option<String>,
}

impl Figure {
    /// The value the goal speaks of: the ratio (or added latency) where there is one,
    /// else the figure itself.
    fn judged_value(&self) -> f64 {
        self.ratio.unwrap_or(self.mesh)
    }

    /// Whether the goal is met, for goals of the form `<= X` / `>= X` (also `≤`, `≥`,
    /// `+X µs`, `X unit`); `None` for goals in words or in another unit.
    pub fn verdict(&self) -> Option<bool> {
        let (at_most, bound, unit) = parse_goal(self.goal)?;
        if let Some(unit) = unit {
            if unit != self.unit {
                return None;
            }
        }
        let value = self.judged_value();
        Some(if at_most {
            value <= bound
        } else {
            value >= bound
        })
    }
}

/// `(at most?, bound, unit)` of a goal such as `<= +30 µs (Istio ~120)` or `>= 0.45 of
/// direct`. A unit is a word right after the number (`of` and a parenthesis are not).
fn parse_goal(goal: &str) -> Option<(bool, f64, Option<&str>)> {
    let goal = goal.trim();
    let (at_most, rest) = [("<=", true), ("≤", true), (">=", false), ("≥", false)]
        .iter()
        .find_map(|(op, at_most)| goal.strip_prefix(op).map(|rest| (*at_most, rest)))?;
    let rest = rest.trim_start().trim_start_matches('+');
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == ','))
        .unwrap_or(rest.len());
    let bound: f64 = rest[..end].replace(',', "").parse().ok()?;
    let unit = rest[end..]
        .split_whitespace()
        .next()
        .filter(|word| !word.starts_with('(') && *word != "of" && !word.starts_with('x'));
    Some((at_most, bound, unit))
}

pub fn ratio(
    name: &str,
    unit: &'static str,
    direct: Vec<f64>,
    meshed: Vec<f64>,
    goal: &'static str,
) -> Figure {
    let (d, m) = (median(&direct), median(&meshed));
    Figure {
        name: name.to_owned(),
        unit,
        direct: Some(d),
        mesh: m,
        ratio: (d > 0.0).then(|| m / d),
        ratio_kind: "mesh/direct",
        goal,
        samples_direct: direct,
        samples_mesh: meshed,
        ..Figure::default()
    }
}

pub fn added(name: &str, direct: f64, meshed: f64, goal: &'static str) -> Figure {
    Figure {
        name: name.to_owned(),
        unit: "µs",
        direct: Some(direct),
        mesh: meshed,
        ratio: Some(meshed - direct),
        ratio_kind: "mesh-direct",
        goal,
        samples_direct: vec![direct],
        samples_mesh: vec![meshed],
        ..Figure::default()
    }
}

pub fn single(name: &str, unit: &'static str, value: f64, goal: &'static str) -> Figure {
    Figure {
        name: name.to_owned(),
        unit,
        direct: None,
        mesh: value,
        ratio: None,
        ratio_kind: "",
        goal,
        samples_direct: vec![],
        samples_mesh: vec![value],
        ..Figure::default()
    }
}

/// The `p` quantile (0..=1) of `samples`, nearest rank; 0 for none.
pub fn percentile(samples: &[f64], p: f64) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted
        .get(((sorted.len().max(1) - 1) as f64 * p).round() as usize)
        .copied()
        .unwrap_or(0.0)
}

pub fn median(samples: &[f64]) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(0.0)
}

pub fn print_table(figures: &[Figure]) {
    println!(
        "{:<48} {:>12} {:>12} {:>14}  {:<8} {:<5} goal",
        "figure", "direct", "mesh", "ratio", "unit", "met"
    );
    for f in figures {
        let direct = f.direct.map_or("-".to_owned(), |d| format!("{d:.3}"));
        let ratio = match (f.ratio, f.ratio_kind) {
            (Some(r), "mesh-direct") => format!("{r:+.1} µs"),
            (Some(r), _) => format!("{r:.3}x"),
            (None, _) => "-".to_owned(),
        };
        let spread = if f.samples_mesh.len() > 1 {
            let lo = f.samples_mesh.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = f.samples_mesh.iter().copied().fold(0.0, f64::max);
            format!(" (mesh {lo:.2}..{hi:.2})")
        } else {
            String::new()
        };
        let verdict = match f.verdict() {
            Some(true) => "yes",
            Some(false) => "NO",
            None => "",
        };
        println!(
            "{:<48} {:>12} {:>12.3} {:>14}  {:<8} {:<5} {}{}",
            f.name, direct, f.mesh, ratio, f.unit, verdict, f.goal, spread
        );
        if let (Some(false), Some(limit)) = (f.verdict(), &f.limit) {
            println!("{:<48}   limited by: {limit}", "");
        }
    }
}

/// Writes `figures` into the JSON array at `path`, replacing rows of the same name
/// and keeping the others: a run of some sections updates only their rows.
pub fn merge_into(path: &Path, figures: &[Figure]) -> Result<()> {
    let mut rows: Vec<Value> = match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text)
            .with_context(|| format!("{} is not a JSON array of rows", path.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    for figure in figures {
        let row = serde_json::to_value(figure)?;
        match rows.iter_mut().find(|r| r["name"] == row["name"]) {
            Some(existing) => *existing = row,
            None => rows.push(row),
        }
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(path, serde_json::to_string_pretty(&rows)? + "\n")?;
    Ok(())
}

/// The gate: every exact figure of this run against the row of the same name in
/// `baseline` (a `results.json`). A figure more than [`GATE_TOLERANCE`] above its
/// baseline is a regression; one without a baseline is too (a renamed or new row must
/// be recorded). Rows measured on another machine are reported, not compared.
pub fn gate(figures: &[Figure], baseline: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(baseline)
        .with_context(|| format!("reading the baseline {}", baseline.display()))?;
    let rows: Vec<Value> = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a JSON array of rows", baseline.display()))?;
    let mut failures = Vec::new();
    for figure in figures {
        let Some(machine) = &figure.gated_on else {
            continue;
        };
        let recorded = rows.iter().find(|r| r["name"] == figure.name.as_str());
        let Some(base) = recorded.and_then(|r| r["mesh"].as_f64()) else {
            failures.push(format!(
                "{}: no baseline in {} (run this section and commit the file)",
                figure.name,
                baseline.display()
            ));
            continue;
        };
        let base_machine = recorded.and_then(|r| r["gated_on"].as_str()).unwrap_or("");
        if base_machine != machine {
            eprintln!(
                "gate: {}: baseline from another machine ({base_machine:?}, here {machine:?}): not compared",
                figure.name
            );
            continue;
        }
        let change = figure.mesh / base - 1.0;
        eprintln!(
            "gate: {}: {:.4} against {base:.4} ({:+.2} %)",
            figure.name,
            figure.mesh,
            100.0 * change
        );
        if change > GATE_TOLERANCE {
            failures.push(format!(
                "{}: {:.4} is {:.1} % above its baseline {base:.4} (tolerance {:.0} %)",
                figure.name,
                figure.mesh,
                100.0 * change,
                100.0 * GATE_TOLERANCE
            ));
        } else if change < -GATE_TOLERANCE {
            eprintln!(
                "gate: {} improved by {:.1} %: commit the new figures to keep the gain",
                figure.name,
                -100.0 * change
            );
        }
    }
    Ok(failures)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(unit: &'static str, ratio: Option<f64>, mesh: f64, goal: &'static str) -> Figure {
        Figure {
            name: "row".into(),
            unit,
            mesh,
            ratio,
            goal,
            ..Figure::default()
        }
    }

    #[test]
    fn goals_are_judged_on_the_ratio_where_there_is_one() {
        assert_eq!(
            row("Gbit/s", Some(0.5), 6.0, ">= 0.45 of direct").verdict(),
            Some(true)
        );
        assert_eq!(
            row("Gbit/s", Some(0.4), 6.0, ">= 0.45 of direct").verdict(),
            Some(false)
        );
        assert_eq!(
            row("µs", Some(81.0), 125.0, "<= +30 µs").verdict(),
            Some(false)
        );
        assert_eq!(
            row("µs", Some(20.0), 60.0, "≤ +30 µs (Istio)").verdict(),
            Some(true)
        );
        assert_eq!(
            row("vCPU", None, 0.11, "<= 0.10 vCPU (Istio ~0.06)").verdict(),
            Some(false)
        );
        assert_eq!(row("instr/B", None, 2.9, "<= 3.0").verdict(), Some(true));
        assert_eq!(
            row("/s", None, 60_000.0, ">= 50,000 on one worker").verdict(),
            None
        );
        assert_eq!(row("conn/s", None, 1.0, ">= 1000/s").verdict(), None);
        assert_eq!(
            row("CPU s/GiB", Some(3.4), 2.4, "<= 2.5x direct").verdict(),
            Some(false)
        );
    }

    #[test]
    fn goals_in_words_or_another_unit_are_not_judged() {
        assert_eq!(row("ms", None, 1.0, "<= 5 s").verdict(), None);
        assert_eq!(row("conns", None, 2.0, "ceil(N/100)").verdict(), None);
        assert_eq!(
            row("µs", None, 95.0, "<= the 1-worker figure").verdict(),
            None
        );
        assert_eq!(row("µs", None, 95.0, "").verdict(), None);
    }

    fn gated(name: &str, mesh: f64, machine: &str) -> Figure {
        Figure {
            name: name.into(),
            mesh,
            gated_on: Some(machine.into()),
            ..Figure::default()
        }
    }

    #[test]
    fn the_gate_fails_a_rise_past_tolerance_or_a_missing_baseline() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("results.json");
        merge_into(&path, &[gated("a", 4.0, "cpu"), gated("b", 5.0, "cpu")]).unwrap();
        // Merging replaces by name and keeps the rest.
        merge_into(&path, &[gated("b", 6.0, "cpu"), row("µs", None, 1.0, "")]).unwrap();
        let rows: Vec<Value> =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[1]["mesh"], 6.0);

        let run = [gated("a", 4.1, "cpu"), gated("b", 6.5, "cpu")];
        let failures = gate(&run, &path).unwrap();
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert!(
            failures[0].starts_with("b: 6.5000 is 8.3 % above"),
            "{failures:?}"
        );
        // Another machine's baseline is not compared; a row without one fails.
        assert!(gate(&[gated("a", 9.0, "other")], &path).unwrap().is_empty());
        assert_eq!(gate(&[gated("c", 1.0, "cpu")], &path).unwrap().len(), 1);
        // Improvements and rows that are not exact pass.
        assert!(
            gate(&[gated("a", 3.0, "cpu"), row("µs", None, 9.0, "")], &path)
                .unwrap()
                .is_empty()
        );
    }
}
