//! Applying rule sets with the node's iptables binaries, in the CURRENT thread's netns
//! (the child process inherits the calling thread's namespaces; callers enter the pod
//! netns first with [`super::netns`]).
//!
//! The backend (nft or legacy) is detected once on the host, the way Istio does, and
//! passed around as a value: every command for every pod then uses the same binary
//! family, so rules never land in a table set the kernel path does not consult.

use super::plan::{self, CheckResult};
use super::rules::{IpFamily, RuleSet};
use super::save::{SaveParseError, SavedTables};
use std::io::Write as _;
use std::process::{Command, Stdio};

/// Legacy iptables waits this long for the global xtables lock (the optional value
/// must be attached with `=`, or it is read as the input file name).
const XTABLES_LOCK_WAIT: &str = "--wait=5";

/// Chains whose presence says which backend kubelet/kube-proxy use (iptables-wrappers).
const KUBE_CANARIES: [&str; 2] = ["KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY"];

/// Why running or converging the iptables binaries failed.
#[derive(Debug, thiserror::Error)]
pub enum IptablesError {
    /// The binary could not be started or waited on (e.g. it is not installed).
    #[error("running {cmd}: {source}")]
    Spawn {
        /// The command line.
        cmd: String,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// The command exited unsuccessfully.
    #[error("{cmd} failed ({status}): {stderr}")]
    Failed {
        /// The command line.
        cmd: String,
        /// Its exit status, as printed.
        status: String,
        /// Its standard error, trimmed.
        stderr: String,
    },
    /// A `*-save` dump could not be parsed.
    #[error("parsing {cmd} output: {source}")]
    Parse {
        /// The save binary that printed it.
        cmd: String,
        /// What the parser rejected.
        #[source]
        source: SaveParseError,
    },
    /// The rules still differ from the wanted set after the restore.
    #[error("{family} rules still differ after restore: {result:?}")]
    NotConverged {
        /// The family whose rules differ.
        family: IpFamily,
        /// What the verifying check found.
        result: CheckResult,
    },
    /// A backend name other than `nft` or `legacy` was parsed.
    #[error("unknown iptables backend {0:?} (want \"nft\" or \"legacy\")")]
    UnknownBackend(String),
}

/// Which xtables binaries drive the kernel: `iptables-nft*` or `iptables-legacy*`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// `iptables-nft*`: rules go to nf_tables.
    Nft,
    /// `iptables-legacy*`: rules go to the legacy xtables tables.
    Legacy,
}

/// What one backend's `*-save` showed on the host, for [`Backend::choose`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BackendEvidence {
    /// Rules in all tables of both families.
    pub rules: usize,
    /// Kubernetes' canary chains exist in this backend.
    pub kube_canary: bool,
}

impl Backend {
    /// `"nft"` or `"legacy"`, as in the binaries' names.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Nft => "nft",
            Backend::Legacy => "legacy",
        }
    }

    /// `iptables-nft-restore`, `ip6tables-legacy-restore`, ...
    pub fn restore_binary(self, family: IpFamily) -> String {
        format!("{}-{}-restore", family_prefix(family), self.name())
    }

    /// `iptables-nft-save`, `ip6tables-legacy-save`, ...
    pub fn save_binary(self, family: IpFamily) -> String {
        format!("{}-{}-save", family_prefix(family), self.name())
    }

    /// The decision alone: kube canary chains win; else the backend with rules (the
    /// one with more); else nft, the default of every current distribution.
    pub fn choose(nft: BackendEvidence, legacy: BackendEvidence) -> Backend {
        match (nft.kube_canary, legacy.kube_canary) {
            (true, false) => return Backend::Nft,
            (false, true) => return Backend::Legacy,
            _ => {}
        }
        if legacy.rules > nft.rules {
            Backend::Legacy
        } else {
            Backend::Nft
        }
    }

    /// Detects the backend from the rules in the current thread's netns (call it in
    /// the host netns). A backend whose binaries are missing counts as empty.
    pub fn detect() -> Backend {
        let evidence = |backend: Backend| {
            let mut e = BackendEvidence::default();
            for family in [IpFamily::V4, IpFamily::V6] {
                if let Ok(saved) = save(backend, family) {
                    e.rules += saved.rule_count();
                    e.kube_canary |= KUBE_CANARIES.iter().any(|c| saved.has_chain_anywhere(c));
                }
            }
            e
        };
        let backend = Backend::choose(evidence(Backend::Nft), evidence(Backend::Legacy));
        tracing::info!(backend = backend.name(), "detected iptables backend");
        backend
    }
}

impl std::str::FromStr for Backend {
    type Err = IptablesError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "nft" => Ok(Backend::Nft),
            "legacy" => Ok(Backend::Legacy),
            other => Err(IptablesError::UnknownBackend(other.to_owned())),
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

fn family_prefix(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "iptables",
        IpFamily::V6 => "ip6tables",
    }
}

/// Runs `program args` with `stdin`, returning stdout.
fn run(program: &str, args: &[&str], stdin: Option<&str>) -> Result<String, IptablesError> {
    let cmd = format!("{program} {}", args.join(" "));
    let spawn_err = |source| IptablesError::Spawn {
        cmd: cmd.clone(),
        source,
    };
    let mut child = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn_err)?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        // A write error (EPIPE) surfaces as the command's own failure below.
        let _ = pipe.write_all(input.as_bytes());
    }
    let out = child.wait_with_output().map_err(spawn_err)?;
    if !out.status.success() {
        return Err(IptablesError::Failed {
            cmd,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Dumps and parses every table of `family` in the current netns.
pub fn save(backend: Backend, family: IpFamily) -> Result<SavedTables, IptablesError> {
    let program = backend.save_binary(family);
    let text = run(&program, &[], None)?;
    SavedTables::parse(&text).map_err(|source| IptablesError::Parse {
        cmd: program,
        source,
    })
}

/// Feeds `input` to `*-restore --noflush` in one transaction (nft: one netlink
/// batch for the whole input; legacy: one commit per table).
pub fn restore(backend: Backend, family: IpFamily, input: &str) -> Result<(), IptablesError> {
    let program = backend.restore_binary(family);
    let mut args = vec!["--noflush"];
    if backend == Backend::Legacy {
        args.push(XTABLES_LOCK_WAIT);
    }
    tracing::debug!(%program, %input, "iptables-restore");
    run(&program, &args, Some(input)).map(drop)
}

/// Compares the current netns with `set`.
pub fn check(backend: Backend, set: &RuleSet) -> Result<CheckResult, IptablesError> {
    Ok(plan::check(set, &save(backend, set.family)?))
}

/// Converges the current netns to exactly `set` (apply and repair are the same
/// operation) in one restore, then verifies. Returns whether anything changed.
pub fn apply(backend: Backend, set: &RuleSet) -> Result<bool, IptablesError> {
    // One retry covers a concurrent writer changing the netns between save and restore.
    let mut attempt = 0;
    let changed = loop {
        attempt += 1;
        let Some(input) = plan::converge_input(set, &save(backend, set.family)?) else {
            break false;
        };
        match restore(backend, set.family, &input) {
            Ok(()) => break true,
            Err(e) if attempt < 2 => tracing::warn!(error = %e, "restore failed; retrying"),
            Err(e) => return Err(e),
        }
    };
    let result = check(backend, set)?;
    if !result.is_ok() {
        return Err(IptablesError::NotConverged {
            family: set.family,
            result,
        });
    }
    Ok(changed)
}

/// [`apply`] for a netns that should have none of our chains yet (one a CNI ADD just
/// created): the fresh-netns restore without the save before it, then one save to
/// verify. Anything else found there (a retried ADD whose first attempt left rules)
/// falls back to [`apply`], which converges from whatever is there.
pub fn apply_fresh(backend: Backend, set: &RuleSet) -> Result<bool, IptablesError> {
    match restore(backend, set.family, &set.render()) {
        Ok(()) if check(backend, set)?.is_ok() => Ok(true),
        Ok(()) => apply(backend, set),
        Err(e) => {
            tracing::debug!(error = %e, "fresh-netns restore refused; converging instead");
            apply(backend, set)
        }
    }
}

/// Deletes our jumps and chains in `set.scope` (flush + delete), nothing else.
/// Returns whether anything was removed.
pub fn remove(backend: Backend, set: &RuleSet) -> Result<bool, IptablesError> {
    let Some(input) = plan::removal_input(set, &save(backend, set.family)?) else {
        return Ok(false);
    };
    restore(backend, set.family, &input)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binaries_never_mix_backends() {
        assert_eq!(
            Backend::Nft.restore_binary(IpFamily::V6),
            "ip6tables-nft-restore"
        );
        assert_eq!(
            Backend::Legacy.save_binary(IpFamily::V4),
            "iptables-legacy-save"
        );
    }

    #[test]
    fn choose_prefers_canary_then_rules_then_nft() {
        let e = |rules, kube_canary| BackendEvidence { rules, kube_canary };
        assert_eq!(Backend::choose(e(0, false), e(0, false)), Backend::Nft);
        assert_eq!(Backend::choose(e(0, false), e(3, false)), Backend::Legacy);
        assert_eq!(Backend::choose(e(5, false), e(5, false)), Backend::Nft);
        assert_eq!(Backend::choose(e(1, true), e(90, false)), Backend::Nft);
        assert_eq!(Backend::choose(e(90, false), e(1, true)), Backend::Legacy);
    }

    #[test]
    fn parses_backend_names() {
        assert_eq!("legacy".parse::<Backend>().unwrap(), Backend::Legacy);
        assert!("iptables".parse::<Backend>().is_err());
    }
}
