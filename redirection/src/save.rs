//! `iptables-save` output as a value, normalised so it compares rule by rule with a
//! rendered [`RuleSet`](super::rules::RuleSet).
//!
//! Rendered rules are already in the form `iptables-save` prints; normalising both
//! sides only absorbs harmless spelling differences (extra spaces, a bare host
//! address without its `/32` or `/128`, `--to-port` for `--to-ports`).

use super::rules::{RuleSet, Table};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// One table of an `iptables-save` dump.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SavedTable {
    /// Declared chains (built-in and user), in print order.
    pub chains: Vec<String>,
    /// `(chain, rule spec)` in print order; specs are normalised.
    pub rules: Vec<(String, String)>,
}

impl SavedTable {
    /// Whether the table declares chain `name`.
    pub fn has_chain(&self, name: &str) -> bool {
        self.chains.iter().any(|c| c == name)
    }

    /// The rules of `chain`, in order.
    pub fn rules_of<'a>(&'a self, chain: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.rules
            .iter()
            .filter(move |(c, _)| c == chain)
            .map(|(_, r)| r.as_str())
    }
}

/// A parsed `iptables-save` dump, by table name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SavedTables {
    /// Each table of the dump, by name (`nat`, `mangle`, ...).
    pub tables: BTreeMap<String, SavedTable>,
}

/// Why a dump could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SaveParseError {
    /// A chain declaration or rule before any `*table` line, or after its `COMMIT`.
    #[error("line {line}: {what} outside a table")]
    OutsideTable {
        /// The line number, from 1.
        line: usize,
        /// `chain` or `rule`.
        what: &'static str,
    },
    /// A line that is no comment, `*table`, `COMMIT`, chain declaration or `-A` rule.
    #[error("line {line}: unexpected {text:?}")]
    Unexpected {
        /// The line number, from 1.
        line: usize,
        /// The line, trimmed.
        text: String,
    },
}

impl SavedTables {
    /// Parses `iptables-save` text. Comments and counters are ignored.
    pub fn parse(text: &str) -> Result<Self, SaveParseError> {
        let mut tables = BTreeMap::<String, SavedTable>::new();
        let mut current: Option<String> = None;
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            let n = i + 1;
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if let Some(name) = line.strip_prefix('*') {
                let name = name.trim().to_owned();
                tables.entry(name.clone()).or_default();
                current = Some(name);
            } else if line == "COMMIT" {
                current = None;
            } else if let Some(decl) = line.strip_prefix(':') {
                let table = current.as_ref().and_then(|t| tables.get_mut(t)).ok_or(
                    SaveParseError::OutsideTable {
                        line: n,
                        what: "chain",
                    },
                )?;
                let name = decl.split_whitespace().next().unwrap_or_default();
                table.chains.push(name.to_owned());
            } else if let Some(rest) = line.strip_prefix("-A ") {
                let table = current.as_ref().and_then(|t| tables.get_mut(t)).ok_or(
                    SaveParseError::OutsideTable {
                        line: n,
                        what: "rule",
                    },
                )?;
                let rest = rest.trim_start();
                let (chain, spec) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
                table.rules.push((chain.to_owned(), normalize_rule(spec)));
            } else {
                return Err(SaveParseError::Unexpected {
                    line: n,
                    text: line.to_owned(),
                });
            }
        }
        Ok(SavedTables { tables })
    }

    /// The dump of `table`, if it has one.
    pub fn table(&self, table: Table) -> Option<&SavedTable> {
        self.tables.get(table.name())
    }

    /// Number of rules in all tables: how Istio tells which backend is in use.
    pub fn rule_count(&self) -> usize {
        self.tables.values().map(|t| t.rules.len()).sum()
    }

    /// Whether any table declares `chain` (e.g. the `KUBE-IPTABLES-HINT` canary).
    pub fn has_chain_anywhere(&self, chain: &str) -> bool {
        self.tables.values().any(|t| t.has_chain(chain))
    }

    /// Our part of the dump, in a fixed layout: per table (mangle, nat, raw) the
    /// owned chains present, then every rule jumping to them, then their rules.
    /// For a converged netns this equals [`RuleSet::render`] with the same order.
    pub fn owned_view(&self, set: &RuleSet) -> String {
        let mut out = String::new();
        for table in Table::ALL {
            let Some(saved) = self.table(table) else {
                continue;
            };
            let owned: Vec<&str> = set
                .scope_in(table)
                .map(|c| c.name)
                .filter(|name| saved.has_chain(name))
                .collect();
            if owned.is_empty() {
                continue;
            }
            let _ = writeln!(out, "*{}", table.name());
            for name in &owned {
                let _ = writeln!(out, ":{name} - [0:0]");
            }
            for name in &owned {
                for (chain, rule) in &saved.rules {
                    if !owned.contains(&chain.as_str()) && jump_target(rule) == Some(name) {
                        let _ = writeln!(out, "-A {chain} {rule}");
                    }
                }
            }
            for name in &owned {
                for rule in saved.rules_of(name) {
                    let _ = writeln!(out, "-A {name} {rule}");
                }
            }
            out.push_str("COMMIT\n");
        }
        out
    }
}

/// The `-j`/`-g` target of a rule spec, if any.
pub fn jump_target(spec: &str) -> Option<&str> {
    let mut tokens = spec.split_whitespace();
    while let Some(t) = tokens.next() {
        if t == "-j" || t == "-g" || t == "--jump" || t == "--goto" {
            return tokens.next();
        }
    }
    None
}

/// Canonical spelling of a rule spec (the text after `-A <chain>`).
pub fn normalize_rule(spec: &str) -> String {
    let tokens: Vec<&str> = spec.split_whitespace().collect();
    let mut out: Vec<String> = Vec::with_capacity(tokens.len());
    let mut i = 0;
    while i < tokens.len() {
        let t = tokens[i];
        match t {
            "--to-port" => out.push("--to-ports".to_owned()),
            "-s" | "-d" | "--source" | "--destination" if i + 1 < tokens.len() => {
                out.push(if t.len() > 2 {
                    format!("-{}", &t[2..3])
                } else {
                    t.to_owned()
                });
                out.push(with_host_mask(tokens[i + 1]));
                i += 1;
            }
            _ => out.push(t.to_owned()),
        }
        i += 1;
    }
    out.join(" ")
}

/// `10.0.0.1` becomes `10.0.0.1/32`, `::1` becomes `::1/128`; prefixes stay.
fn with_host_mask(addr: &str) -> String {
    if addr.contains('/') {
        addr.to_owned()
    } else if addr.contains(':') {
        format!("{addr}/128")
    } else {
        format!("{addr}/32")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::{InpodRules, IpFamily};

    const DUMP: &str = "# Generated by iptables-nft-save v1.8.9 (nf_tables)
*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [12:720]
:ISTIO_OUTPUT - [0:0]
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_OUTPUT -d 169.254.7.127/32 -p tcp -m tcp -j ACCEPT
COMMIT
# Completed
";

    #[test]
    fn parses_tables_chains_and_rules() {
        let saved = SavedTables::parse(DUMP).unwrap();
        let nat = saved.table(Table::Nat).unwrap();
        assert_eq!(nat.chains, ["PREROUTING", "OUTPUT", "ISTIO_OUTPUT"]);
        assert_eq!(
            nat.rules_of("OUTPUT").collect::<Vec<_>>(),
            ["-j ISTIO_OUTPUT"]
        );
        assert_eq!(saved.rule_count(), 2);
        assert!(saved.table(Table::Raw).is_none());
    }

    #[test]
    fn rejects_garbage_without_panicking() {
        assert!(SavedTables::parse("-A X -j Y\n").is_err());
        assert!(SavedTables::parse("*nat\nbogus\n").is_err());
        assert!(SavedTables::parse("").unwrap().tables.is_empty());
    }

    #[test]
    fn normalises_spelling_differences() {
        assert_eq!(
            normalize_rule("-s  169.254.7.127 -p tcp  -j REDIRECT --to-port 15053"),
            "-s 169.254.7.127/32 -p tcp -j REDIRECT --to-ports 15053"
        );
        assert_eq!(
            normalize_rule("! --destination ::1 -j ACCEPT"),
            "! -d ::1/128 -j ACCEPT"
        );
    }

    #[test]
    fn owned_view_of_rendered_rules_is_the_rendering() {
        for rules in [
            InpodRules::default(),
            InpodRules {
                dns_capture: true,
                ..Default::default()
            },
        ] {
            let set = rules.rule_set(IpFamily::V4);
            let rendered = set.render();
            let saved = SavedTables::parse(&rendered).unwrap();
            assert_eq!(saved.owned_view(&set), rendered);
        }
    }
}
