//! Output helpers: Go `text/tabwriter`-style tables (so columns line up exactly like
//! istioctl's) and JSON/YAML printing.

use anyhow::Result;
use serde::Serialize;

use crate::cli::Output;

/// A table aligned like Go's `tabwriter.NewWriter(w, 0, 8, padding, ' ', 0)`: every
/// cell but the last of a row is padded to its column's width plus `padding`.
pub struct Table {
    padding: usize,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(padding: usize, header: &[&str]) -> Self {
        Table {
            padding,
            rows: vec![header.iter().map(|s| s.to_string()).collect()],
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let mut widths = vec![0usize; columns];
        for row in &self.rows {
            // The last cell of a row is not part of a column (no trailing tab).
            for (i, cell) in row.iter().enumerate().take(row.len().saturating_sub(1)) {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate() {
                out.push_str(cell);
                if i + 1 < row.len() {
                    let pad = widths[i] + self.padding - cell.chars().count();
                    out.extend(std::iter::repeat_n(' ', pad));
                }
            }
            out.push('\n');
        }
        out
    }
}

/// Prints `value` as JSON (indented) or YAML; `Table` callers print their own text.
pub fn print_structured<T: Serialize>(format: Output, value: &T) -> Result<()> {
    match format {
        Output::Yaml => print!("{}", serde_yaml::to_string(value)?),
        _ => println!("{}", serde_json::to_string_pretty(value)?),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligns_like_go_tabwriter() {
        let mut t = Table::new(1, &["A", "BB", "C"]);
        t.row(vec![
            "xxx".into(),
            "y".into(),
            "last-cell-not-padded".into(),
        ]);
        assert_eq!(t.render(), "A   BB C\nxxx y  last-cell-not-padded\n");
    }
}
