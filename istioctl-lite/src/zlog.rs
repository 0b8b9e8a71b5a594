//! `ztunnel-config log`: Istio's checks of `--level`, then `POST /logging?level=..`
//! on each ztunnel's admin port, printing each answer under the pod's name.

use anyhow::{bail, Result};

use crate::cli::{Global, Output, ZtunnelLogArgs};
use crate::zfetch;

const LEVELS: [&str; 8] = [
    "trace", "debug", "info", "warning", "warn", "error", "critical", "off",
];

/// istioctl's local check of `--level`: each clause a level, or `<target>:<level>`
/// / `<target>=<level>`. (ztunnel is stricter: it refuses `:` and `warning`.)
pub fn check_level(level: &str) -> Result<()> {
    for clause in level.split(',') {
        let level = if !clause.contains([':', '=']) {
            clause
        } else {
            let last = clause.rsplit("::").next().unwrap_or(clause);
            match last.split_once([':', '=']) {
                Some((_, level)) => level,
                None => clause,
            }
        };
        if !LEVELS.contains(&level) {
            bail!("unrecognized logging level: {level}");
        }
    }
    Ok(())
}

/// The query istioctl sends: the raw `--level`, `warning`/`critical` mapped when
/// they are the whole value; `-r` sends `info` with `&reset`.
pub fn query(args: &ZtunnelLogArgs) -> Result<String> {
    if args.reset && !args.level.is_empty() {
        bail!("--level cannot be combined with --reset");
    }
    if args.reset {
        eprintln!("log level reset; using default value \"info\" for Ztunnel");
        return Ok("level=info&reset".into());
    }
    if !args.level.is_empty() {
        check_level(&args.level)?;
    }
    let level = match args.level.as_str() {
        "warning" => "warn",
        "critical" => "error",
        other => other,
    };
    Ok(format!("level={level}"))
}

/// Sets (or shows) the levels of every ztunnel `args` names.
pub async fn run(global: &Global, args: &ZtunnelLogArgs) -> Result<()> {
    if global.output != Output::Table {
        bail!("--output is not applicable for this command");
    }
    let query = query(args)?;
    zfetch::check_one_source(&args.source)?;
    let targets = zfetch::targets(global, &args.source).await?;
    if targets.is_empty() {
        bail!("no ztunnel pods found");
    }
    let mut errors = Vec::new();
    for target in targets {
        let answer = zfetch::request(&target.addr, "POST", &format!("/logging?{query}")).await;
        match answer {
            Ok((200, body)) => println!("{}:\n{body}", target.name),
            Ok((status, _)) => errors.push(format!(
                "{}: failed to execute command on Ztunnel: unexpected status code: {status}",
                target.name
            )),
            Err(e) => errors.push(format!(
                "{}: failed to execute command on Ztunnel: {e:#}",
                target.name
            )),
        }
    }
    if !errors.is_empty() {
        bail!("{}", errors.join("\n"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_are_checked_as_istioctl_does() {
        for ok in [
            "info",
            "warning",
            "access:debug",
            "access=debug,info",
            "a::b::c=off",
        ] {
            assert!(check_level(ok).is_ok(), "{ok}");
        }
        let err = check_level("info,loud").unwrap_err().to_string();
        assert_eq!(err, "unrecognized logging level: loud");
        assert!(check_level("access=verbose").is_err());
    }
}
