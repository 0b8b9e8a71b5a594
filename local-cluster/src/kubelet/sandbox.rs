//! A pod's sandbox: its network (its own namespace through the node's CNI chain, or
//! the node's for `hostNetwork`), its volumes and its containers; made before the
//! containers start and torn down (CNI DEL, files) after they stopped.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Result};
use serde_json::Value;

use super::NodeInfo;
use crate::api::Api;
use crate::kubelet::cni::{self, NetConfList, Runtime};
use crate::kubelet::containers::Container;
use crate::kubelet::volumes::PodVolumes;
use crate::services::cluster_dns::CLUSTER_DNS;
use test_support::netns::Netns;

/// A running pod: its network, its volumes and its containers.
pub struct Sandbox {
    // Drop order: processes, then the network.
    pub containers: Vec<Container>,
    pub(super) network: Network,
    /// The pod's addresses, IPv4 (the primary family) first.
    pub ips: Vec<String>,
    pub(super) volumes: PodVolumes,
    /// The pod's directory under [`NodeInfo::pods_dir`].
    pub(super) dir: PathBuf,
}

/// The pod's own namespace set up through the CNI chain, or the node's
/// (`hostNetwork: true`).
pub(super) enum Network {
    Pod(Box<PodNetwork>),
    Host { netns: String },
}

pub(super) struct PodNetwork {
    pub(super) netns: Netns,
    pub(super) result: Value,
    /// Each plugin's ADD time (ms), in chain order.
    pub(super) add_timings: Vec<(String, f64)>,
    pub(super) conf: NetConfList,
    pub(super) rt: Runtime,
}

impl Sandbox {
    pub(super) fn netns_name(&self) -> &str {
        match &self.network {
            Network::Pod(pod) => pod.netns.name(),
            Network::Host { netns } => netns,
        }
    }
}

pub(super) fn create_sandbox(api: &Api, node: &NodeInfo, pod: &Value, seq: u64) -> Result<Sandbox> {
    let meta = &pod["metadata"];
    let (namespace, name, uid) = (
        meta["namespace"].as_str().unwrap_or_default(),
        meta["name"].as_str().unwrap_or_default(),
        meta["uid"].as_str().unwrap_or_default(),
    );
    let dir = node.pods_dir.join(uid);
    let volumes = PodVolumes::prepare(api, &node.root, pod, &dir.join("volumes"))?;
    let (network, ips) = if pod["spec"]["hostNetwork"] == true {
        let network = Network::Host {
            netns: node.host_netns.clone(),
        };
        (network, vec![node.host_ip.clone()])
    } else {
        pod_network(node, pod, seq)?
    };
    let containers = pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, spec)| {
            let log_name = format!("{}-{namespace}-{name}-{i}", node.tag);
            // kubelet's /var/log/pods/<namespace>_<name>_<uid>/<container>/.
            let log_dir = dir
                .join("logs")
                .join(spec["name"].as_str().unwrap_or_default());
            Container::new(spec, log_name, log_dir)
        })
        .collect();
    Ok(Sandbox {
        containers,
        network,
        ips,
        volumes,
        dir,
    })
}

/// The pod's own network namespace, through the node's CNI chain.
pub(super) fn pod_network(
    node: &NodeInfo,
    pod: &Value,
    seq: u64,
) -> Result<(Network, Vec<String>)> {
    let meta = &pod["metadata"];
    let (namespace, name, uid) = (
        meta["namespace"].as_str().unwrap_or_default(),
        meta["name"].as_str().unwrap_or_default(),
        meta["uid"].as_str().unwrap_or_default(),
    );
    let conf = cni::find_config(&node.conf_dir)?;
    let netns = Netns::new(&format!("{}p{seq}", node.tag))?;
    netns.set_resolv_conf(&crate::dns::pod_resolv_conf(
        CLUSTER_DNS,
        namespace,
        "cluster.local",
    ))?;
    let container_id = format!("{:x}{seq:08x}", std::process::id());
    let rt = Runtime {
        node: node.plugins.clone(),
        container_id: container_id.clone(),
        netns_path: netns.path(),
        ifname: "eth0".into(),
        cni_path: node.cni_path.clone(),
        args: Runtime::k8s_args(namespace, name, uid, &container_id),
    };
    let (result, add_timings) = match cni::add(&conf, &rt) {
        Ok(r) => r,
        Err(e) => {
            let _ = cni::del(&conf, &rt, None);
            return Err(e.context(format!(
                "failed to setup network for sandbox {container_id:?}"
            )));
        }
    };
    let ips = cni::result_ips(&result);
    if ips.is_empty() {
        let _ = cni::del(&conf, &rt, Some(&result));
        bail!("the CNI result has no address: {result}");
    }
    let network = Network::Pod(Box::new(PodNetwork {
        netns,
        result,
        add_timings,
        conf,
        rt,
    }));
    Ok((network, ips))
}

/// Runs CNI DEL with the cached result and deletes the namespace (any container
/// still running is killed first).
pub(super) fn teardown_sandbox(mut sandbox: Sandbox) {
    for c in &mut sandbox.containers {
        c.finish_stop(Instant::now());
    }
    if let Network::Pod(pod) = &sandbox.network {
        let _ = cni::del(&pod.conf, &pod.rt, Some(&pod.result));
    }
    let dir = sandbox.dir.clone();
    drop(sandbox);
    let _ = std::fs::remove_dir_all(dir);
}
