//! The report: rows of figures, the table and the JSON.

use serde::Serialize;

/// One row of the report.
#[derive(Serialize)]
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
        "{:<48} {:>12} {:>12} {:>14}  {:<8} goal",
        "figure", "direct", "mesh", "ratio", "unit"
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
        println!(
            "{:<48} {:>12} {:>12.3} {:>14}  {:<8} {}{}",
            f.name, direct, f.mesh, ratio, f.unit, f.goal, spread
        );
    }
}
