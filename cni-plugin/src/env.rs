//! The invocation: `CNI_*` environment variables, checked the way libcni's `skel` does so
//! runtimes see the same error codes they get from the reference plugins.

use crate::error::{CniError, Code};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    Add,
    Check,
    Del,
    Version,
    Status,
    Gc,
    /// Reported after the netconf is validated, as `skel` does.
    Unknown(String),
}

impl Command {
    fn parse(text: &str) -> Self {
        match text {
            "ADD" => Command::Add,
            "CHECK" => Command::Check,
            "DEL" => Command::Del,
            "VERSION" => Command::Version,
            "STATUS" => Command::Status,
            "GC" => Command::Gc,
            other => Command::Unknown(other.to_string()),
        }
    }

    /// ADD, CHECK and DEL act on one attachment (container id + interface).
    pub fn has_attachment(&self) -> bool {
        matches!(self, Command::Add | Command::Check | Command::Del)
    }

    pub fn name(&self) -> &str {
        match self {
            Command::Add => "ADD",
            Command::Check => "CHECK",
            Command::Del => "DEL",
            Command::Version => "VERSION",
            Command::Status => "STATUS",
            Command::Gc => "GC",
            Command::Unknown(name) => name,
        }
    }
}

/// Everything the runtime passed in the environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invocation {
    pub command: Command,
    pub container_id: String,
    pub netns: String,
    pub ifname: String,
    /// Raw `CNI_ARGS`; parsed by [`crate::args`] when a command needs it.
    pub args: String,
    pub path: String,
}

impl Invocation {
    /// Reads the variables through `get` (the process environment in `main`). Missing
    /// required variables give code 4, listing all of them.
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<Self, CniError> {
        let var = |name: &str| get(name).unwrap_or_default();
        let command = Command::parse(&var("CNI_COMMAND"));
        let inv = Invocation {
            container_id: var("CNI_CONTAINERID"),
            netns: var("CNI_NETNS"),
            ifname: var("CNI_IFNAME"),
            args: var("CNI_ARGS"),
            path: var("CNI_PATH"),
            command,
        };
        let required: &[(&str, &str)] = match inv.command {
            Command::Add | Command::Check => &[
                ("CNI_CONTAINERID", &inv.container_id),
                ("CNI_NETNS", &inv.netns),
                ("CNI_IFNAME", &inv.ifname),
                ("CNI_PATH", &inv.path),
            ],
            Command::Del => &[
                ("CNI_CONTAINERID", &inv.container_id),
                ("CNI_IFNAME", &inv.ifname),
                ("CNI_PATH", &inv.path),
            ],
            Command::Status | Command::Gc => &[("CNI_PATH", &inv.path)],
            Command::Version => &[],
            Command::Unknown(ref c) if c.is_empty() => &[("CNI_COMMAND", "")],
            Command::Unknown(_) => &[],
        };
        let missing: Vec<&str> = required
            .iter()
            .filter(|(_, value)| value.is_empty())
            .map(|(name, _)| *name)
            .collect();
        if !missing.is_empty() {
            return Err(CniError::new(
                Code::InvalidEnvironment,
                format!("required env variables [{}] missing", missing.join(",")),
            ));
        }
        Ok(inv)
    }

    /// The container id and interface name rules of the spec (ADD/CHECK/DEL only).
    pub fn validate_attachment(&self) -> Result<(), CniError> {
        if !self.command.has_attachment() {
            return Ok(());
        }
        if !is_valid_id(&self.container_id) {
            return Err(CniError::new(
                Code::InvalidEnvironment,
                "invalid characters in containerID",
            )
            .details(self.container_id.clone()));
        }
        let name = &self.ifname;
        let problem = if name.len() > 15 {
            Some("interface name is too long")
        } else if name == "." || name == ".." {
            Some("interface name is . or ..")
        } else if name
            .chars()
            .any(|c| c == '/' || c == ':' || c.is_whitespace())
        {
            Some("interface name contains / or : or whitespace characters")
        } else {
            None
        };
        match problem {
            Some(msg) => Err(CniError::new(Code::InvalidEnvironment, msg).details(name.clone())),
            None => Ok(()),
        }
    }
}

/// `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`: the spec's rule for container ids and network names.
pub fn is_valid_id(id: &str) -> bool {
    let mut chars = id.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn inv(vars: &[(&str, &str)]) -> Result<Invocation, CniError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Invocation::from_env(|k| map.get(k).cloned())
    }

    const FULL: [(&str, &str); 5] = [
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "c1"),
        ("CNI_NETNS", "/var/run/netns/x"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin"),
    ];

    #[test]
    fn full_add_environment_parses() {
        let i = inv(&FULL).unwrap();
        assert_eq!(i.command, Command::Add);
        assert_eq!(i.netns, "/var/run/netns/x");
        i.validate_attachment().unwrap();
    }

    #[test]
    fn missing_variables_are_code_4_and_listed() {
        let e = inv(&[("CNI_COMMAND", "ADD"), ("CNI_IFNAME", "eth0")]).unwrap_err();
        assert_eq!(e.code, Code::InvalidEnvironment);
        assert_eq!(
            e.msg,
            "required env variables [CNI_CONTAINERID,CNI_NETNS,CNI_PATH] missing"
        );
        let e = inv(&[]).unwrap_err();
        assert_eq!(e.code, Code::InvalidEnvironment);
        assert!(e.msg.contains("CNI_COMMAND"));
    }

    #[test]
    fn del_does_not_need_netns_and_version_needs_nothing() {
        let mut vars = FULL.to_vec();
        vars[0].1 = "DEL";
        vars.retain(|(k, _)| *k != "CNI_NETNS");
        assert_eq!(inv(&vars).unwrap().command, Command::Del);
        assert_eq!(
            inv(&[("CNI_COMMAND", "VERSION")]).unwrap().command,
            Command::Version
        );
        let e = inv(&[("CNI_COMMAND", "GC")]).unwrap_err();
        assert_eq!(e.msg, "required env variables [CNI_PATH] missing");
    }

    #[test]
    fn bad_container_id_and_ifname_are_code_4() {
        for (key, value) in [
            ("CNI_CONTAINERID", "-abc"),
            ("CNI_CONTAINERID", "a b"),
            ("CNI_IFNAME", "a-very-long-ifname"),
            ("CNI_IFNAME", ".."),
            ("CNI_IFNAME", "eth:0"),
        ] {
            let mut vars = FULL.to_vec();
            vars.iter_mut().find(|(k, _)| *k == key).unwrap().1 = value;
            let e = inv(&vars).unwrap().validate_attachment().unwrap_err();
            assert_eq!(e.code, Code::InvalidEnvironment, "{key}={value}");
        }
    }
}
