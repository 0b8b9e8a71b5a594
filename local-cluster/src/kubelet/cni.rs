//! Running a CNI network configuration list the way libcni (containerd, CRI-O) does:
//! the first `*.conf`/`*.conflist` in lexical order that parses, each plugin invoked
//! in order for ADD (with `prevResult` threaded through) and in reverse for DEL.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};

use crate::kubelet::runtime::NodeSpawner;

/// A parsed network configuration list.
#[derive(Debug, Clone)]
pub struct NetConfList {
    pub file: PathBuf,
    pub name: String,
    pub cni_version: String,
    pub plugins: Vec<Value>,
}

/// Everything about one invocation except the command.
#[derive(Debug, Clone)]
pub struct Runtime {
    /// Starts the plugins as processes of the node.
    pub node: NodeSpawner,
    pub container_id: String,
    /// The pod's namespace file (`CNI_NETNS`).
    pub netns_path: PathBuf,
    pub ifname: String,
    /// `CNI_PATH` directories, searched in order.
    pub cni_path: Vec<PathBuf>,
    /// `CNI_ARGS`.
    pub args: String,
}

impl Runtime {
    /// Kubernetes' CNI_ARGS for a pod sandbox.
    pub fn k8s_args(namespace: &str, name: &str, uid: &str, container_id: &str) -> String {
        format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name};\
             K8S_POD_INFRA_CONTAINER_ID={container_id};K8S_POD_UID={uid}"
        )
    }
}

/// Loads the configuration the runtime would use from `conf_dir`.
pub fn find_config(conf_dir: &Path) -> Result<NetConfList> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(conf_dir)
        .with_context(|| format!("reading {}", conf_dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("conf" | "conflist")
            )
        })
        .collect();
    files.sort();
    for file in files {
        if let Ok(list) = load(&file) {
            return Ok(list);
        }
    }
    bail!("no network config found in {}", conf_dir.display())
}

fn load(file: &Path) -> Result<NetConfList> {
    let value: Value = serde_json::from_slice(&std::fs::read(file)?)?;
    let is_list = file.extension().and_then(|e| e.to_str()) == Some("conflist");
    let plugins = if is_list {
        value["plugins"].as_array().cloned().context("no plugins")?
    } else {
        vec![value.clone()]
    };
    if plugins.is_empty() || plugins.iter().any(|p| !p["type"].is_string()) {
        bail!("{}: a plugin without a type", file.display());
    }
    Ok(NetConfList {
        file: file.to_owned(),
        name: value["name"].as_str().unwrap_or_default().to_owned(),
        cni_version: value["cniVersion"].as_str().unwrap_or("0.4.0").to_owned(),
        plugins,
    })
}

/// A plugin's error answer.
#[derive(Debug, thiserror::Error)]
#[error("plugin type=\"{plugin}\" failed ({command}): {message}")]
pub struct PluginError {
    pub plugin: String,
    pub command: String,
    pub message: String,
}

/// ADD through the whole chain: the final result, and how long each plugin took
/// (exec to exit, in milliseconds; the benchmark reads the gated `istio-cni` ADD).
pub fn add(list: &NetConfList, rt: &Runtime) -> Result<(Value, Vec<(String, f64)>)> {
    let mut prev: Option<Value> = None;
    let mut timings = Vec::with_capacity(list.plugins.len());
    for plugin in &list.plugins {
        let started = std::time::Instant::now();
        let out = invoke(list, plugin, "ADD", rt, prev.as_ref())?;
        let kind = plugin["type"].as_str().unwrap_or_default().to_owned();
        timings.push((kind, started.elapsed().as_secs_f64() * 1000.0));
        prev = Some(
            serde_json::from_slice(&out).map_err(|e| anyhow!("plugin result is not JSON: {e}"))?,
        );
    }
    Ok((prev.context("empty chain")?, timings))
}

/// DEL through the chain in reverse, with the cached ADD result; every plugin runs
/// even if one fails, and the first error is returned.
pub fn del(list: &NetConfList, rt: &Runtime, cached: Option<&Value>) -> Result<()> {
    let mut first = None;
    for plugin in list.plugins.iter().rev() {
        if let Err(e) = invoke(list, plugin, "DEL", rt, cached) {
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), Err)
}

fn invoke(
    list: &NetConfList,
    plugin: &Value,
    command: &str,
    rt: &Runtime,
    prev: Option<&Value>,
) -> Result<Vec<u8>> {
    let kind = plugin["type"].as_str().unwrap_or_default().to_owned();
    let program = rt
        .cni_path
        .iter()
        .map(|d| d.join(&kind))
        .find(|p| p.exists())
        .ok_or_else(|| PluginError {
            plugin: kind.clone(),
            command: command.into(),
            message: format!("failed to find plugin {kind:?} in path {:?}", rt.cni_path),
        })?;
    let mut conf = plugin.clone();
    conf["name"] = json!(list.name);
    conf["cniVersion"] = json!(list.cni_version);
    if let Some(prev) = prev {
        conf["prevResult"] = prev.clone();
    }
    let cni_path = std::env::join_paths(&rt.cni_path)?;
    let mut cmd = Command::new(&program);
    cmd.env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", &rt.container_id)
        .env("CNI_NETNS", &rt.netns_path)
        .env("CNI_IFNAME", &rt.ifname)
        .env("CNI_PATH", cni_path)
        .env("CNI_ARGS", &rt.args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = rt
        .node
        .spawn(cmd)
        .with_context(|| format!("starting {}", program.display()))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(&serde_json::to_vec(&conf)?)?;
    }
    let out = child.wait_with_output()?;
    if out.status.success() {
        return Ok(out.stdout);
    }
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let mut message = answer["msg"]
        .as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| {
            format!(
                "{} {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )
        });
    if let Some(details) = answer["details"].as_str().filter(|d| !d.is_empty()) {
        message = format!("{message}; {details}");
    }
    Err(PluginError {
        plugin: kind,
        command: command.into(),
        message,
    }
    .into())
}

/// The addresses (without prefix length) of a CNI result, IPv4 first (the cluster's
/// primary family), as kubelet lists them in `status.podIPs`.
pub fn result_ips(result: &Value) -> Vec<String> {
    let mut ips: Vec<std::net::IpAddr> = result["ips"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|ip| ip["address"].as_str())
        .filter_map(|a| a.split('/').next()?.parse().ok())
        .collect();
    ips.sort_by_key(|ip| ip.is_ipv6());
    ips.iter().map(ToString::to_string).collect()
}

/// A node's pod CIDR of each family: IPv4 `10.244.<i>.0/24`, and on a dual-stack
/// cluster IPv6 `fd00:10:244:<i>::/64`.
pub fn pod_cidrs(index: u8, dual_stack: bool) -> Vec<String> {
    let mut cidrs = vec![format!("10.244.{index}.0/24")];
    if dual_stack {
        cidrs.push(format!("fd00:10:244:{index}::/64"));
    }
    cidrs
}

/// The reference `bridge` + `host-local` conflist for a node's pod CIDRs: one range
/// per family, the gateway the first address of each.
pub fn bridge_conflist(index: u8, dual_stack: bool, ipam_dir: &Path) -> Value {
    let mut ranges = Vec::new();
    let mut routes = Vec::new();
    for cidr in pod_cidrs(index, dual_stack) {
        let Ok(net) = cidr.parse::<ipnet::IpNet>() else {
            continue;
        };
        // The first address after the network's own (ipnet's IPv6 hosts include it).
        let gateway = net
            .hosts()
            .find(|ip| *ip != net.network())
            .map(|ip| ip.to_string());
        ranges.push(json!([{"subnet": cidr, "gateway": gateway}]));
        routes.push(json!({"dst": if net.addr().is_ipv4() { "0.0.0.0/0" } else { "::/0" }}));
    }
    json!({
        "cniVersion": "1.0.0",
        "name": "e2e-pods",
        "plugins": [{
            "type": "bridge",
            "bridge": "cni0",
            "isGateway": true,
            "ipMasq": false,
            "hairpinMode": true,
            "ipam": {
                "type": "host-local",
                "ranges": ranges,
                "routes": routes,
                "dataDir": ipam_dir,
            }
        }]
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_first_parsable_config_in_lexical_order() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("05-broken.conflist"), "{").unwrap();
        std::fs::write(
            dir.path().join("20-b.conf"),
            r#"{"name":"b","type":"bridge"}"#,
        )
        .unwrap();
        std::fs::write(
            dir.path().join("10-a.conflist"),
            bridge_conflist(1, false, dir.path()).to_string(),
        )
        .unwrap();
        let list = find_config(dir.path()).unwrap();
        assert_eq!(list.name, "e2e-pods");
        std::fs::remove_file(dir.path().join("10-a.conflist")).unwrap();
        let list = find_config(dir.path()).unwrap();
        assert_eq!((list.name.as_str(), list.plugins.len()), ("b", 1));
    }

    #[test]
    fn reads_the_ips_of_a_result_ipv4_first() {
        let r = json!({"ips": [{"address": "fd00::1/64"}, {"address": "10.244.1.5/24"}]});
        assert_eq!(result_ips(&r), ["10.244.1.5", "fd00::1"]);
        assert!(result_ips(&json!({"ips": [{"address": "x"}]})).is_empty());
    }

    #[test]
    fn a_dual_stack_conflist_has_a_range_and_a_default_route_per_family() {
        let list = bridge_conflist(2, true, Path::new("/ipam"));
        let ipam = &list["plugins"][0]["ipam"];
        assert_eq!(ipam["ranges"][0][0]["gateway"], "10.244.2.1");
        assert_eq!(ipam["ranges"][1][0]["subnet"], "fd00:10:244:2::/64");
        assert_eq!(ipam["ranges"][1][0]["gateway"], "fd00:10:244:2::1");
        assert_eq!(ipam["routes"][1]["dst"], "::/0");
    }
}
