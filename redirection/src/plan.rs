//! From "what we want" ([`RuleSet`]) and "what is there" ([`SavedTables`]) to a verdict
//! ([`check`]) or to ONE `iptables-restore --noflush` input that converges or removes.
//!
//! Converging never deletes and re-adds in two steps: a `:CHAIN - [0:0]` line flushes
//! (or creates) our chain inside the same transaction that refills it, and jumps are
//! fixed up with `-D`/`-A` in that transaction too, so traffic never sees a netns
//! without capture. The `-D` lines are computed from the dump just read; if the netns
//! changed in between, the restore fails as a whole and the caller retries.

use super::rules::{ChainRef, RuleSet, Table};
use super::save::{jump_target, SavedTable, SavedTables};
use std::fmt::Write as _;

/// How the rules in a netns compare with the wanted set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckResult {
    /// Everything wanted is there, and nothing else in our chains.
    Ok,
    /// None of our chains or jumps exist.
    Missing,
    /// Some wanted chain, jump or rule is absent or out of order (capture is broken).
    Partial(Vec<String>),
    /// Everything wanted is there, plus rules we did not write (in our chains, extra
    /// or foreign jumps to them, or leftover chains of ours that are not wanted).
    Foreign(Vec<String>),
}

impl CheckResult {
    /// Whether everything wanted is there and nothing else ([`CheckResult::Ok`]).
    pub fn is_ok(&self) -> bool {
        matches!(self, CheckResult::Ok)
    }

    /// Merges the verdicts of several families: all missing is missing, all ok is ok,
    /// a mix of missing and present is partial, otherwise the worst wins.
    pub fn combine(results: impl IntoIterator<Item = CheckResult>) -> CheckResult {
        let results: Vec<CheckResult> = results.into_iter().collect();
        if results.iter().all(|r| *r == CheckResult::Missing) {
            return CheckResult::Missing;
        }
        let (mut partial, mut foreign) = (None::<Vec<String>>, None::<Vec<String>>);
        for r in results {
            match r {
                CheckResult::Ok => {}
                CheckResult::Missing => partial
                    .get_or_insert_default()
                    .push("a family has no rules at all".to_owned()),
                CheckResult::Partial(p) => partial.get_or_insert_default().extend(p),
                CheckResult::Foreign(f) => foreign.get_or_insert_default().extend(f),
            }
        }
        match (partial, foreign) {
            (Some(p), _) => CheckResult::Partial(p),
            (None, Some(f)) => CheckResult::Foreign(f),
            (None, None) => CheckResult::Ok,
        }
    }
}

/// A rule outside our chains that jumps into one of them.
struct Jump<'a> {
    from: &'a str,
    spec: &'a str,
}

/// Every rule of a non-owned chain in `table` that jumps to `target`.
fn jumps_to<'a>(set: &RuleSet, table: Table, saved: &'a SavedTable, target: &str) -> Vec<Jump<'a>> {
    saved
        .rules
        .iter()
        .filter(|(chain, spec)| !set.owns(table, chain) && jump_target(spec) == Some(target))
        .map(|(chain, spec)| Jump { from: chain, spec })
        .collect()
}

/// Whether `jump` is the one plain hook we install for `chain`.
fn is_our_hook(jump: &Jump<'_>, chain: &ChainRef) -> bool {
    jump.from == chain.hook && jump.spec == format!("-j {}", chain.name)
}

/// Compares the dump with the wanted set, rule by rule.
pub fn check(set: &RuleSet, saved: &SavedTables) -> CheckResult {
    let empty = SavedTable::default();
    let mut present_anything = false;
    let mut partial = Vec::new();
    let mut foreign = Vec::new();
    for table in Table::ALL {
        let saved_table = saved.table(table).unwrap_or(&empty);
        for chain in set.scope_in(table) {
            let exists = saved_table.has_chain(chain.name);
            let jumps = jumps_to(set, table, saved_table, chain.name);
            present_anything |= exists || !jumps.is_empty();
            let here = format!("{} {}", table.name(), chain.name);
            let Some(wanted) = set.wanted_in(table).find(|c| c.chain == *chain) else {
                if exists || !jumps.is_empty() {
                    foreign.push(format!("{here}: present but not wanted"));
                }
                continue;
            };
            if !exists {
                partial.push(format!("{here}: chain missing"));
                continue;
            }
            let hooks = jumps.iter().filter(|j| is_our_hook(j, chain)).count();
            if hooks == 0 {
                partial.push(format!("{here}: no jump from {}", chain.hook));
            }
            if hooks > 1 {
                foreign.push(format!("{here}: {hooks} jumps from {}", chain.hook));
            }
            for j in jumps.iter().filter(|j| !is_our_hook(j, chain)) {
                foreign.push(format!("{here}: foreign jump -A {} {}", j.from, j.spec));
            }
            let actual: Vec<&str> = saved_table.rules_of(chain.name).collect();
            let expected: Vec<&str> = wanted.rules.iter().map(String::as_str).collect();
            if actual == expected {
                continue;
            }
            if is_subsequence(&expected, &actual) {
                for extra in extras(&expected, &actual) {
                    foreign.push(format!("{here}: extra rule {extra}"));
                }
            } else {
                for missing in expected.iter().filter(|r| !actual.contains(r)) {
                    partial.push(format!("{here}: missing rule {missing}"));
                }
                if expected.iter().all(|r| actual.contains(r)) {
                    partial.push(format!("{here}: rules out of order"));
                }
            }
        }
    }
    if !present_anything {
        CheckResult::Missing
    } else if !partial.is_empty() {
        CheckResult::Partial(partial)
    } else if !foreign.is_empty() {
        CheckResult::Foreign(foreign)
    } else {
        CheckResult::Ok
    }
}

fn is_subsequence(needle: &[&str], hay: &[&str]) -> bool {
    let mut it = hay.iter();
    needle.iter().all(|n| it.any(|h| h == n))
}

/// Rules of `actual` not consumed by matching `expected` in order.
fn extras<'a>(expected: &[&str], actual: &[&'a str]) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut want = expected.iter().peekable();
    for a in actual {
        if want.peek().is_some_and(|w| *w == a) {
            want.next();
        } else {
            out.push(*a);
        }
    }
    out
}

/// One `iptables-restore --noflush` input that turns `saved` into exactly `set`:
/// wanted chains flushed and refilled, exactly one hook jump each, foreign jumps to
/// our chains dropped, unwanted chains of ours deleted. `None` when already converged.
pub fn converge_input(set: &RuleSet, saved: &SavedTables) -> Option<String> {
    if check(set, saved).is_ok() {
        return None;
    }
    Some(transaction(set, saved, true))
}

/// One `iptables-restore --noflush` input deleting every chain of ours in scope and
/// every jump to them, and nothing else. `None` when nothing of ours is present.
pub fn removal_input(set: &RuleSet, saved: &SavedTables) -> Option<String> {
    let text = transaction(set, saved, false);
    (!text.is_empty()).then_some(text)
}

fn transaction(set: &RuleSet, saved: &SavedTables, keep_wanted: bool) -> String {
    let empty = SavedTable::default();
    let mut out = String::new();
    for table in Table::ALL {
        let saved_table = saved.table(table).unwrap_or(&empty);
        let mut decls = String::new();
        let mut deletes = String::new();
        let mut hooks = String::new();
        let mut adds = String::new();
        let mut drops = String::new();
        for chain in set.scope_in(table) {
            let exists = saved_table.has_chain(chain.name);
            let jumps = jumps_to(set, table, saved_table, chain.name);
            let wanted = keep_wanted
                .then(|| set.wanted_in(table).find(|c| c.chain == *chain))
                .flatten();
            match wanted {
                Some(wanted) => {
                    // Declaring flushes an existing chain and creates a missing one.
                    let _ = writeln!(decls, ":{} - [0:0]", chain.name);
                    let mut kept_hook = false;
                    for j in &jumps {
                        if !kept_hook && is_our_hook(j, chain) {
                            kept_hook = true;
                        } else {
                            let _ = writeln!(deletes, "-D {} {}", j.from, j.spec);
                        }
                    }
                    if !kept_hook {
                        let _ = writeln!(hooks, "-A {} -j {}", chain.hook, chain.name);
                    }
                    for rule in &wanted.rules {
                        let _ = writeln!(adds, "-A {} {rule}", chain.name);
                    }
                }
                None => {
                    for j in &jumps {
                        let _ = writeln!(deletes, "-D {} {}", j.from, j.spec);
                    }
                    if exists {
                        let _ = writeln!(decls, ":{} - [0:0]", chain.name);
                        let _ = writeln!(drops, "-X {}", chain.name);
                    }
                }
            }
        }
        if decls.is_empty() && deletes.is_empty() && hooks.is_empty() {
            continue;
        }
        let _ = write!(
            out,
            "*{}\n{decls}{deletes}{hooks}{adds}{drops}COMMIT\n",
            table.name()
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::{InpodRules, IpFamily};

    fn v4(dns: bool) -> RuleSet {
        InpodRules {
            dns_capture: dns,
            ..Default::default()
        }
        .rule_set(IpFamily::V4)
    }

    fn saved(text: &str) -> SavedTables {
        SavedTables::parse(text).unwrap()
    }

    #[test]
    fn empty_netns_is_missing_and_converges_to_the_rendering() {
        let set = v4(false);
        assert_eq!(check(&set, &SavedTables::default()), CheckResult::Missing);
        assert_eq!(
            converge_input(&set, &SavedTables::default()).unwrap(),
            set.render()
        );
        assert_eq!(removal_input(&set, &SavedTables::default()), None);
    }

    #[test]
    fn rendered_state_is_ok_and_needs_nothing() {
        let set = v4(true);
        let state = saved(&set.render());
        assert_eq!(check(&set, &state), CheckResult::Ok);
        assert_eq!(converge_input(&set, &state), None);
    }

    #[test]
    fn missing_rule_is_partial() {
        let set = v4(false);
        let text = set
            .render()
            .replace("-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -o lo -j ACCEPT\n", "");
        assert!(matches!(
            check(&set, &saved(&text)),
            CheckResult::Partial(_)
        ));
    }

    #[test]
    fn extra_rule_and_duplicate_jump_are_foreign_and_repair_keeps_one_jump() {
        let set = v4(false);
        let text = set.render().replace(
            "COMMIT\n*nat\n",
            "-A ISTIO_OUTPUT -p udp -j ACCEPT\n-A OUTPUT -j ISTIO_OUTPUT\nCOMMIT\n*nat\n",
        );
        let state = saved(&text);
        let CheckResult::Foreign(why) = check(&set, &state) else {
            panic!("not foreign")
        };
        assert_eq!(why.len(), 2, "{why:?}");
        let fix = converge_input(&set, &state).unwrap();
        assert_eq!(
            fix.matches("-D OUTPUT -j ISTIO_OUTPUT\n").count(),
            1,
            "{fix}"
        );
        assert!(!fix.contains("-A OUTPUT -j ISTIO_OUTPUT\n"), "{fix}");
    }

    #[test]
    fn turning_dns_off_deletes_raw_chains_in_the_same_transaction() {
        let state = saved(&v4(true).render());
        let set = v4(false);
        assert!(matches!(check(&set, &state), CheckResult::Foreign(_)));
        let fix = converge_input(&set, &state).unwrap();
        assert!(fix.contains(
            "*raw\n:ISTIO_PRERT - [0:0]\n:ISTIO_OUTPUT - [0:0]\n-D PREROUTING -j ISTIO_PRERT\n"
        ));
        assert!(fix.contains("-X ISTIO_PRERT\n-X ISTIO_OUTPUT\nCOMMIT\n"));
    }

    #[test]
    fn removal_deletes_jumps_then_chains() {
        let set = v4(false);
        let text = removal_input(&set, &saved(&set.render())).unwrap();
        assert!(text.starts_with(
            "*mangle\n:ISTIO_PRERT - [0:0]\n:ISTIO_OUTPUT - [0:0]\n-D PREROUTING -j ISTIO_PRERT\n"
        ));
        assert!(!text.contains("-A "));
        assert_eq!(text.matches("-X ").count(), 4);
    }

    #[test]
    fn combine_families() {
        use CheckResult::*;
        assert_eq!(CheckResult::combine([Missing, Missing]), Missing);
        assert_eq!(CheckResult::combine([Ok, Ok]), Ok);
        assert!(matches!(CheckResult::combine([Ok, Missing]), Partial(_)));
        assert!(matches!(
            CheckResult::combine([Foreign(vec![]), Ok]),
            Foreign(_)
        ));
    }
}
