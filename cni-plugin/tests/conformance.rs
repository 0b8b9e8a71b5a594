//! Conformance in a real chain (root only): the CNI reference plugins bridge (with
//! host-local IPAM) and loopback, then `istio-cni`, run the way libcni runs a conflist:
//! ADD in order threading `prevResult`, CHECK with the cached result, DEL in reverse.
//!
//! Every plugin runs inside a dedicated "node" namespace (`ip netns exec`), so the bridge
//! and the host ends of the veths live there, never in the root namespace; the pod is a
//! second namespace. Both are deleted when the test ends, whatever happens.

mod common;

use common::{FakeServer, Reply, PLUGIN};
use serde_json::{json, Value};
use shared_types::cni::CniPluginAddEvent;
use shared_types::constants::PLUGIN_EVENT_SOCKET;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use test_support::netns::Netns;

const IFNAME: &str = "eth0";

/// One conflist, one pod, one node, one fake agent.
struct Chain {
    /// The conflist's `cniVersion`.
    version: String,
    /// What the reference plugins are run with (they stop at 1.0.0).
    reference_version: String,
    name: String,
    plugins: Vec<Value>,
    bridge: String,
    container_id: String,
    cni_args: String,
    node: Netns,
    pod: Netns,
    dir: tempfile::TempDir,
    agent: FakeServer,
}

impl Chain {
    fn new(version: &str, tag: &str, subnet_octet: u8) -> Self {
        let node = Netns::new(&format!("n{tag}")).expect("node netns");
        let pod = Netns::new(&format!("p{tag}")).expect("pod netns");
        let dir = tempfile::tempdir().unwrap();
        let agent = FakeServer::start(
            &dir.path().join(PLUGIN_EVENT_SOCKET),
            Reply::Status(200, ""),
        );
        let bridge = format!("zb{}{tag}", std::process::id() % 100_000);
        let reference_version = if reference_supports(version) {
            version.to_string()
        } else {
            "1.0.0".to_string()
        };
        let plugins = vec![
            json!({
                "type": "bridge",
                "bridge": bridge,
                "isGateway": true,
                "ipMasq": false,
                "ipam": {
                    "type": "host-local",
                    "dataDir": dir.path().join("ipam"),
                    "ranges": [[{"subnet": format!("10.248.{subnet_octet}.0/24")}]],
                    "routes": [{"dst": "0.0.0.0/0"}]
                }
            }),
            json!({"type": "loopback"}),
            json!({
                "type": "istio-cni",
                "ambient_enabled": true,
                "cni_agent_run_dir": dir.path(),
                "agent_timeout_seconds": 5,
                "plugin_log_level": "debug"
            }),
        ];
        Chain {
            version: version.to_string(),
            reference_version,
            name: format!("zte-conformance-{tag}"),
            plugins,
            bridge,
            container_id: format!("conformance{tag}"),
            cni_args: common::pod_args("shop", &format!("web-{tag}")),
            node,
            pod,
            dir,
            agent,
        }
    }

    fn version_for(&self, plugin: &Value) -> &str {
        if plugin["type"] == "istio-cni" {
            &self.version
        } else {
            &self.reference_version
        }
    }

    /// Runs one plugin inside the node namespace; stdout on success, the error JSON if not.
    fn exec(&self, plugin: &Value, command: &str, prev: Option<&Value>) -> Result<String, Value> {
        let mut conf = plugin.clone();
        conf["name"] = json!(self.name);
        conf["cniVersion"] = json!(self.version_for(plugin));
        if let Some(prev) = prev {
            conf["prevResult"] = prev.clone();
        }
        let plugin_type = plugin["type"].as_str().unwrap();
        let binary = if plugin_type == "istio-cni" {
            PathBuf::from(PLUGIN)
        } else {
            test_support::cni_reference_plugin_dir().join(plugin_type)
        };
        let cni_path = format!(
            "{}:{}",
            test_support::cni_reference_plugin_dir().display(),
            Path::new(PLUGIN).parent().unwrap().display()
        );
        let mut child = Command::new("ip")
            .args(["netns", "exec", self.node.name()])
            .arg(&binary)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", &self.container_id)
            .env("CNI_NETNS", self.pod.path())
            .env("CNI_IFNAME", IFNAME)
            .env("CNI_ARGS", &self.cni_args)
            .env("CNI_PATH", cni_path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn plugin");
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(conf.to_string().as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() {
            Ok(stdout)
        } else {
            Err(serde_json::from_str(&stdout).unwrap_or_else(|_| {
                json!({"plugin": plugin_type, "stdout": stdout,
                       "stderr": String::from_utf8_lossy(&out.stderr)})
            }))
        }
    }

    /// ADD through the chain; returns (primary plugin's result, final result).
    fn add(&self) -> (Value, Value) {
        let mut prev: Option<Value> = None;
        let mut primary = None;
        for plugin in &self.plugins {
            let out = self
                .exec(plugin, "ADD", prev.as_ref())
                .unwrap_or_else(|e| panic!("ADD {}: {e}", plugin["type"]));
            let result: Value = serde_json::from_str(&out).expect("ADD result JSON");
            primary.get_or_insert_with(|| result.clone());
            prev = Some(result);
        }
        (primary.unwrap(), prev.unwrap())
    }

    /// The cached result in the version `plugin` runs with (libcni converts it too).
    fn cached_for<'a>(&self, plugin: &Value, cached: &'a Cached) -> &'a Value {
        if self.version_for(plugin) == self.version {
            &cached.last
        } else {
            &cached.primary
        }
    }

    fn check(&self, cached: &Cached) {
        for plugin in &self.plugins {
            let out = self
                .exec(plugin, "CHECK", Some(self.cached_for(plugin, cached)))
                .unwrap_or_else(|e| panic!("CHECK {}: {e}", plugin["type"]));
            assert_eq!(out, "", "CHECK prints nothing");
        }
    }

    fn del(&self, cached: &Cached) {
        for plugin in self.plugins.iter().rev() {
            let out = self
                .exec(plugin, "DEL", Some(self.cached_for(plugin, cached)))
                .unwrap_or_else(|e| panic!("DEL {}: {e}", plugin["type"]));
            assert_eq!(out, "", "DEL prints nothing");
        }
    }
}

/// What a runtime caches after ADD: the final result (and, since the reference plugins
/// may run at an older version here, the primary result in theirs).
struct Cached {
    primary: Value,
    last: Value,
}

fn reference_supports(version: &str) -> bool {
    let out = Command::new(test_support::cni_reference_plugin_dir().join("bridge"))
        .env_clear()
        .env("CNI_COMMAND", "VERSION")
        .stdin(Stdio::null())
        .output()
        .expect("bridge VERSION");
    let info: Value = serde_json::from_slice(&out.stdout).expect("VERSION JSON");
    info["supportedVersions"]
        .as_array()
        .unwrap()
        .iter()
        .any(|v| v == version)
}

fn root_links() -> String {
    let out = Command::new("ip")
        .args(["-o", "link", "show"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn conformance(version: &str, tag: &str, subnet_octet: u8) {
    if !test_support::can_run_root_tests() {
        return;
    }
    let chain = Chain::new(version, tag, subnet_octet);
    if chain.reference_version != version {
        eprintln!(
            "reference plugins do not speak {version}: running them at {} and istio-cni at \
             {version}, so the test also covers converting the primary result",
            chain.reference_version
        );
    }

    let (primary, last) = chain.add();
    // The plugin passes the primary result through unchanged (in the conflist version).
    let mut expected = primary.clone();
    expected["cniVersion"] = json!(version);
    assert_eq!(
        last, expected,
        "final result must equal the primary plugin's"
    );

    // The network is real, and where it should be.
    let ip = primary["ips"][0]["address"].as_str().unwrap().to_string();
    let pod_addrs = chain
        .pod
        .stdout(&["ip", "-o", "addr", "show", "dev", IFNAME])
        .unwrap();
    assert!(pod_addrs.contains(&ip), "{ip} not on {IFNAME}: {pod_addrs}");
    chain
        .node
        .exec(&["ip", "link", "show", &chain.bridge])
        .expect("bridge lives in the node namespace");
    assert!(
        !root_links().contains(&chain.bridge),
        "bridge leaked into the root namespace"
    );

    // The agent heard about the pod, with its netns and the primary plugin's IPs.
    let requests = chain.agent.requests();
    assert_eq!(requests.len(), 1);
    let event: CniPluginAddEvent = serde_json::from_slice(&requests[0].body).unwrap();
    assert_eq!(event.netns, chain.pod.path().display().to_string());
    assert_eq!(event.pod_namespace, "shop");
    assert_eq!(event.container_id, chain.container_id);
    assert_eq!(event.ips.len(), 1);
    assert_eq!(event.ips[0].address.to_string(), ip);

    let cached = Cached {
        primary: primary.clone(),
        last: last.clone(),
    };
    // CHECK exists from 0.4.0 (libcni does not call it for older configs).
    if version != "0.3.0" && version != "0.3.1" {
        chain.check(&cached);
    }

    // host-local keeps one file per reserved address, named by the address.
    let address = ip.split('/').next().unwrap_or_default().to_owned();
    let reserved = || {
        let dir = chain.dir.path().join("ipam").join(&chain.name);
        std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("host-local's store {}: {e}", dir.display()))
            .filter_map(|e| e.ok())
            .any(|e| e.file_name().to_string_lossy() == address)
    };
    assert!(reserved(), "host-local never recorded {address}");

    chain.del(&cached);
    let gone = chain.pod.exec(&["ip", "link", "show", IFNAME]);
    assert!(gone.is_err(), "{IFNAME} still in the pod after DEL");
    assert!(!reserved(), "host-local still holds {address} after DEL");
}

#[test]
fn reference_chain_0_3_0() {
    conformance("0.3.0", "c30", 30);
}

#[test]
fn reference_chain_0_3_1() {
    conformance("0.3.1", "c31", 31);
}

#[test]
fn reference_chain_0_4_0() {
    conformance("0.4.0", "c40", 40);
}

#[test]
fn reference_chain_1_0_0() {
    conformance("1.0.0", "c100", 100);
}

#[test]
fn reference_chain_1_1_0() {
    conformance("1.1.0", "c110", 110);
}

#[test]
fn version_and_errors_inside_a_node_namespace() {
    if !test_support::can_run_root_tests() {
        return;
    }
    // The same binary as the chain runs it: VERSION, then a bad netconf and bad CNI_ARGS.
    let chain = Chain::new("1.0.0", "cerr", 200);
    let version = Command::new("ip")
        .args(["netns", "exec", chain.node.name(), PLUGIN])
        .env_clear()
        .env("CNI_COMMAND", "VERSION")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let info: Value = serde_json::from_slice(&version.stdout).unwrap();
    assert_eq!(
        info["supportedVersions"],
        json!(["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"])
    );

    let istio = chain.plugins.last().unwrap();
    let mut bad = istio.clone();
    bad["agent_timeout_seconds"] = json!("soon");
    let e = chain.exec(&bad, "ADD", None).unwrap_err();
    assert_eq!(e["code"], 6, "{e}");

    let mut bad_args = Chain::new("1.0.0", "carg", 201);
    bad_args.cni_args = "K8S_POD_NAME=a;NOT_KNOWN=1".into();
    let e = bad_args
        .exec(bad_args.plugins.last().unwrap(), "ADD", None)
        .unwrap_err();
    assert_eq!(e["code"], 4, "{e}");
}
