//! The CNI config files as data: which file the runtime uses (the primary), our entry,
//! and the chain with and without it. No writes here; `install` decides what to write.
//!
//! Documents stay `serde_json::Value` (with `preserve_order`), so fields we do not know
//! (IPAM blocks, vendor keys) survive untouched and keys keep the order the primary CNI
//! wrote them in.

use serde_json::{json, Map, Value};
use shared_types::constants::CNI_PLUGIN_TYPE;
use std::ffi::OsStr;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// Name of a conflist we build around a lone `.conf` that has no name (libcni requires
/// one on a list).
const DEFAULT_LIST_NAME: &str = "k8s-pod-network";

/// The netconf fields of our entry; the plugin reads them (cni-plugin/src/netconf.rs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginSettings {
    /// `plugin_log_level`: debug, info, warn, error or none.
    pub log_level: String,
    /// `cni_agent_run_dir`: where the plugin finds our sockets, as the host sees it.
    pub run_dir: PathBuf,
    /// `exclude_namespaces`: pods there never wait for the agent.
    pub exclude_namespaces: Vec<String>,
    /// `pod_namespace`: the mesh's system namespace, home of ztunnel and this agent.
    pub system_namespace: String,
}

impl PluginSettings {
    /// Our entry in the chain, keys in the order Istio writes them.
    pub fn entry(&self) -> Value {
        json!({
            "type": CNI_PLUGIN_TYPE,
            "name": CNI_PLUGIN_TYPE,
            "plugin_log_level": self.log_level,
            "cni_agent_run_dir": self.run_dir.to_string_lossy(),
            "ambient_enabled": true,
            "exclude_namespaces": self.exclude_namespaces,
            "pod_namespace": self.system_namespace,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfKind {
    /// A single plugin (`*.conf`).
    Conf,
    /// A chain (`*.conflist`).
    List,
}

/// A config file the runtime would accept.
#[derive(Clone, Debug, PartialEq)]
pub struct ConfFile {
    pub path: PathBuf,
    pub kind: ConfKind,
    pub json: Value,
}

impl ConfFile {
    /// The chain of this file with our entry: replaced in place when present (never
    /// duplicated), else appended last, after the primary plugin and its helpers.
    /// A `.conf` is wrapped into a list first.
    pub fn with_entry(&self, entry: &Value) -> Value {
        let mut list = match self.kind {
            ConfKind::List => self.json.clone(),
            ConfKind::Conf => wrap(&self.json),
        };
        let Some(plugins) = list.get_mut("plugins").and_then(Value::as_array_mut) else {
            // Unreachable for a validated file; keep the document as it was.
            return list;
        };
        match plugins.iter().position(is_ours) {
            Some(first) => {
                plugins[first] = entry.clone();
                let mut seen = false;
                plugins.retain(|p| !is_ours(p) || !std::mem::replace(&mut seen, true));
            }
            None => plugins.push(entry.clone()),
        }
        list
    }

    /// Whether the chain holds an `istio-cni` entry.
    pub fn has_entry(&self) -> bool {
        plugins(&self.json).is_some_and(|p| p.iter().any(is_ours))
    }

    /// The chain without our entries, or `None` when it has none. The list keeps the
    /// primary plugin even when we wrapped it from a `.conf` (a one-plugin list is
    /// equivalent for the runtime), so uninstall never guesses what the file used to be.
    pub fn without_entry(&self) -> Option<Value> {
        if self.kind != ConfKind::List || !self.has_entry() {
            return None;
        }
        let mut list = self.json.clone();
        if let Some(plugins) = list.get_mut("plugins").and_then(Value::as_array_mut) {
            plugins.retain(|p| !is_ours(p));
        }
        Some(list)
    }

    /// Where the chain with our entry goes when we edit the primary in place: the file
    /// itself, or `<name>.conflist` beside a wrapped `.conf`.
    pub fn list_path(&self) -> PathBuf {
        match self.kind {
            ConfKind::List => self.path.clone(),
            ConfKind::Conf => self.path.with_extension("conflist"),
        }
    }
}

/// `{"cniVersion", "name", "plugins": [conf]}`, as Istio converts a lone `.conf`.
fn wrap(conf: &Value) -> Value {
    let mut list = Map::new();
    if let Some(version) = conf.get("cniVersion") {
        list.insert("cniVersion".into(), version.clone());
    }
    let name = conf
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .unwrap_or(DEFAULT_LIST_NAME);
    list.insert("name".into(), Value::from(name));
    list.insert("plugins".into(), Value::Array(vec![conf.clone()]));
    Value::Object(list)
}

fn plugins(list: &Value) -> Option<&Vec<Value>> {
    list.get("plugins").and_then(Value::as_array)
}

fn is_ours(plugin: &Value) -> bool {
    plugin.get("type").and_then(Value::as_str) == Some(CNI_PLUGIN_TYPE)
}

fn has_type(plugin: &Value) -> bool {
    plugin
        .get("type")
        .and_then(Value::as_str)
        .is_some_and(|t| !t.is_empty())
}

/// Parses a file the way libcni would accept it: a `.conf` needs a `type`; a
/// `.conflist` needs a `name` and a non-empty `plugins` list of typed plugins.
pub fn parse(path: &Path, bytes: &[u8]) -> Result<ConfFile, String> {
    let kind = kind_of(path).ok_or("not a .conf or .conflist file")?;
    let json: Value = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    validate(kind, &json)?;
    Ok(ConfFile {
        path: path.to_path_buf(),
        kind,
        json,
    })
}

fn validate(kind: ConfKind, json: &Value) -> Result<(), String> {
    let non_empty = |key: &str| {
        !json
            .get(key)
            .and_then(Value::as_str)
            .unwrap_or("")
            .is_empty()
    };
    let problem = match kind {
        _ if !json.is_object() => Some("not a JSON object"),
        ConfKind::Conf if !has_type(json) => Some("no plugin 'type'"),
        ConfKind::Conf => None,
        ConfKind::List if !non_empty("name") => Some("no list 'name'"),
        ConfKind::List => match plugins(json) {
            None => Some("no 'plugins' list"),
            Some(p) if p.is_empty() => Some("empty 'plugins' list"),
            Some(p) if !p.iter().all(has_type) => Some("a plugin without 'type'"),
            Some(_) => None,
        },
    };
    problem.map_or(Ok(()), |p| Err(p.to_string()))
}

fn kind_of(path: &Path) -> Option<ConfKind> {
    match path.extension().and_then(OsStr::to_str) {
        Some("conf") => Some(ConfKind::Conf),
        Some("conflist") => Some(ConfKind::List),
        _ => None,
    }
}

/// `*.conf` and `*.conflist` regular files (symlinks followed) of `dir`, in lexical
/// order, as libcni and containerd list them.
pub fn candidates(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        if kind_of(&path).is_some() && path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// A candidate file that does not parse.
#[derive(Debug)]
pub struct Skipped {
    pub path: PathBuf,
    pub reason: String,
    pub modified: Option<SystemTime>,
}

impl Skipped {
    /// Modified within `window`: probably being written right now (non-atomically),
    /// not broken.
    pub fn is_fresh(&self, window: Duration) -> bool {
        self.modified
            .and_then(|m| m.elapsed().ok())
            .is_some_and(|age| age < window)
    }
}

/// What a scan of the conf dir found.
#[derive(Debug, Default)]
pub struct Scan {
    /// Parseable files in lexical order.
    pub files: Vec<ConfFile>,
    /// Files that do not parse, in lexical order.
    pub skipped: Vec<Skipped>,
}

impl Scan {
    /// The primary config: the first parseable file not named `skip` (our own
    /// conflist in Istio-owned mode is never the primary).
    pub fn primary(&self, skip: Option<&OsStr>) -> Option<&ConfFile> {
        self.files
            .iter()
            .find(|f| skip.is_none() || f.path.file_name() != skip)
    }
}

/// Reads and parses every candidate file; a file that vanishes between listing and
/// reading is skipped like an unparseable one.
pub fn scan(dir: &Path) -> io::Result<Scan> {
    let mut scan = Scan::default();
    for path in candidates(dir)? {
        match fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|b| parse(&path, &b))
        {
            Ok(file) => scan.files.push(file),
            Err(reason) => scan.skipped.push(Skipped {
                modified: fs::metadata(&path).and_then(|m| m.modified()).ok(),
                path,
                reason,
            }),
        }
    }
    Ok(scan)
}

/// Pretty JSON with a trailing newline: what a human editing the node expects.
pub fn render(value: &Value) -> Vec<u8> {
    let mut out = serde_json::to_vec_pretty(value).unwrap_or_default();
    out.push(b'\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> PluginSettings {
        PluginSettings {
            log_level: "info".into(),
            run_dir: "/var/run/istio-cni".into(),
            exclude_namespaces: vec!["kube-system".into()],
            system_namespace: "istio-system".into(),
        }
    }

    fn file(name: &str, json: &str) -> ConfFile {
        parse(Path::new(name), json.as_bytes()).unwrap()
    }

    #[test]
    fn validation_follows_libcni() {
        let bad = [
            ("a.conf", "{"),
            ("a.conf", "[]"),
            ("a.conf", r#"{"name":"n"}"#),
            ("a.conflist", r#"{"plugins":[{"type":"x"}]}"#),
            ("a.conflist", r#"{"name":"n"}"#),
            ("a.conflist", r#"{"name":"n","plugins":[]}"#),
            ("a.conflist", r#"{"name":"n","plugins":[{"type":""}]}"#),
            ("a.json", r#"{"type":"x"}"#),
        ];
        for (name, json) in bad {
            assert!(
                parse(Path::new(name), json.as_bytes()).is_err(),
                "{name} {json}"
            );
        }
        assert_eq!(file("a.conf", r#"{"type":"x"}"#).kind, ConfKind::Conf);
    }

    #[test]
    fn entry_replaced_in_place_and_deduplicated() {
        let f = file(
            "10-x.conflist",
            r#"{"name":"n","plugins":[{"type":"istio-cni","old":1},{"type":"bridge"},{"type":"istio-cni"}]}"#,
        );
        let out = f.with_entry(&settings().entry());
        let types: Vec<_> = out["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["type"].as_str().unwrap())
            .collect();
        assert_eq!(types, ["istio-cni", "bridge"]);
        assert_eq!(out["plugins"][0], settings().entry());
    }

    #[test]
    fn wrap_uses_name_or_default() {
        let f = file("10-x.conf", r#"{"type":"bridge"}"#);
        let out = f.with_entry(&settings().entry());
        assert_eq!(out["name"], "k8s-pod-network");
        assert!(out.get("cniVersion").is_none());
        assert_eq!(f.list_path(), PathBuf::from("10-x.conflist"));
        assert!(f.without_entry().is_none());
    }

    #[test]
    fn without_entry_keeps_the_rest() {
        let f = file(
            "10-x.conflist",
            r#"{"name":"n","plugins":[{"type":"bridge"},{"type":"istio-cni"}]}"#,
        );
        assert_eq!(
            f.without_entry().unwrap(),
            json!({"name":"n","plugins":[{"type":"bridge"}]})
        );
    }

    #[test]
    fn render_keeps_key_order() {
        let f = file(
            "a.conflist",
            r#"{"z":1,"name":"n","a":2,"plugins":[{"type":"x"}]}"#,
        );
        let text = String::from_utf8(render(&f.json)).unwrap();
        let (z, a) = (text.find("\"z\"").unwrap(), text.find("\"a\"").unwrap());
        assert!(z < a, "{text}");
        assert!(text.ends_with("}\n"));
    }
}
