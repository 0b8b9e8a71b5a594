//! kube-proxy's iptables mode, minimally, with the endpoints controller folded in:
//! every ClusterIP port of every Service is DNATed, at random and evenly, to its
//! ready endpoints, in each node's namespace and the control plane's (PREROUTING for
//! pods' traffic, OUTPUT for the namespace's own). Endpoints are the ready pods the
//! Service selects (a named `targetPort` looked up in their containers), or, for a
//! Service without a selector, its Endpoints object, as for `kubernetes` or `kube-dns`.
//!
//! Service traffic is masqueraded (kube-proxy's `--masquerade-all`): pods share the
//! node's bridge, so a reply from a pod on the same node would otherwise bypass the
//! node's conntrack and reach the client from the wrong address. A ClusterIP without
//! ready endpoints has no rule, so a connection to it fails instead of hanging on
//! a stale endpoint.
//!
//! A poller lists Services, Pods and Endpoints every [`POLL`] and rewrites the chains
//! in one `iptables-restore --noflush` per namespace and family when they change.

use std::collections::HashMap;

use std::net::IpAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::Result;
use serde_json::Value;
use shared_types::net::IpFamily;

use crate::api::Api;

const POLL: Duration = Duration::from_millis(200);
/// kube-proxy's names and mark.
const SERVICES: &str = "KUBE-SERVICES";
const POSTROUTING: &str = "KUBE-POSTROUTING";
const MARK_MASQ: &str = "KUBE-MARK-MASQ";
const MASQ_MARK: &str = "0x4000";

pub struct KubeProxy {
    stop: Arc<AtomicBool>,
    poller: Option<JoinHandle<()>>,
}

impl KubeProxy {
    /// Programs the Services of `api` into each of `netns_names` (named namespaces).
    pub fn start(api: Api, netns_names: Vec<String>) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let poller = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("kube-proxy".into())
                .spawn(move || poll(&api, &netns_names, &stop))?
        };
        Ok(KubeProxy {
            stop,
            poller: Some(poller),
        })
    }
}

impl Drop for KubeProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(poller) = self.poller.take() {
            let _ = poller.join();
        }
        // The rules go with the namespaces.
    }
}

fn poll(api: &Api, netns_names: &[String], stop: &AtomicBool) {
    // Per namespace and family, the text last applied (None: never, so hook too).
    let mut applied: HashMap<(String, IpFamily), String> = HashMap::new();
    while !stop.load(Ordering::Relaxed) {
        match service_ports(api) {
            Ok(ports) => {
                for family in [IpFamily::V4, IpFamily::V6] {
                    let text = rules(&ports, family);
                    for ns in netns_names {
                        let key = (ns.clone(), family);
                        let hooked = applied.contains_key(&key);
                        if applied.get(&key) == Some(&text) {
                            continue;
                        }
                        match restore(Some(ns), family, &with_hooks(&text, hooked)) {
                            Ok(()) => {
                                applied.insert(key, text.clone());
                            }
                            Err(e) => eprintln!("kube-proxy in {ns}: {e:#}"),
                        }
                    }
                }
            }
            Err(e) => eprintln!("kube-proxy: reading Services: {e:#}"),
        }
        std::thread::sleep(POLL);
    }
}

/// One ClusterIP port and where it goes.
#[derive(Debug, Clone, PartialEq)]
struct ServicePort {
    /// `namespace/name:port-name`, for the rule's comment.
    name: String,
    cluster_ip: IpAddr,
    protocol: String,
    port: u16,
    endpoints: Vec<(IpAddr, u16)>,
}

fn service_ports(api: &Api) -> Result<Vec<ServicePort>> {
    let services = api.list("/api/v1/services")?;
    let pods = api.list("/api/v1/pods")?;
    let endpoints = api.list("/api/v1/endpoints")?;
    let mut out = Vec::new();
    for svc in &services {
        let meta = &svc["metadata"];
        let (ns, name) = (
            meta["namespace"].as_str().unwrap_or_default(),
            meta["name"].as_str().unwrap_or_default(),
        );
        let cluster_ips: Vec<IpAddr> = svc["spec"]["clusterIPs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|ip| ip.as_str()?.parse().ok())
            .collect();
        let manual = endpoints
            .iter()
            .find(|e| e["metadata"]["namespace"] == ns && e["metadata"]["name"] == name);
        for port in svc["spec"]["ports"].as_array().into_iter().flatten() {
            let Some(number) = port["port"].as_u64().and_then(|p| u16::try_from(p).ok()) else {
                continue;
            };
            let backends = if svc["spec"]["selector"].is_object() {
                selected_backends(svc, port, number, &pods)
            } else {
                manual.map(|e| manual_backends(e, port)).unwrap_or_default()
            };
            for cluster_ip in &cluster_ips {
                out.push(ServicePort {
                    name: format!("{ns}/{name}:{}", port["name"].as_str().unwrap_or_default()),
                    cluster_ip: *cluster_ip,
                    protocol: port["protocol"]
                        .as_str()
                        .unwrap_or("TCP")
                        .to_ascii_lowercase(),
                    port: number,
                    endpoints: backends.clone(),
                });
            }
        }
    }
    Ok(out)
}

/// The addresses of the ready pods `svc` selects (every family).
pub fn ready_endpoints(svc: &Value, pods: &[Value]) -> Vec<String> {
    selected_ready_pods(svc, pods).flat_map(pod_ips).collect()
}

fn selected_ready_pods<'a>(svc: &'a Value, pods: &'a [Value]) -> impl Iterator<Item = &'a Value> {
    let ns = svc["metadata"]["namespace"].clone();
    let selector = svc["spec"]["selector"].as_object();
    pods.iter().filter(move |pod| {
        let Some(selector) = selector else {
            return false;
        };
        let labels = &pod["metadata"]["labels"];
        pod["metadata"]["namespace"] == ns
            && !selector.is_empty()
            && selector.iter().all(|(k, v)| &labels[k] == v)
            && pod["metadata"]["deletionTimestamp"].is_null()
            && pod["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

fn pod_ips(pod: &Value) -> Vec<String> {
    let listed: Vec<String> = pod["status"]["podIPs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|ip| ip["ip"].as_str().map(str::to_owned))
        .collect();
    if listed.is_empty() {
        pod["status"]["podIP"]
            .as_str()
            .map(str::to_owned)
            .into_iter()
            .collect()
    } else {
        listed
    }
}

fn selected_backends(svc: &Value, port: &Value, number: u16, pods: &[Value]) -> Vec<(IpAddr, u16)> {
    selected_ready_pods(svc, pods)
        .filter_map(|pod| Some((pod, target_port(pod, port, number)?)))
        .flat_map(|(pod, target)| {
            pod_ips(pod)
                .into_iter()
                .filter_map(move |ip| Some((ip.parse().ok()?, target)))
        })
        .collect()
}

/// `targetPort` for `pod`: a number, a container port's name, or the port itself.
fn target_port(pod: &Value, port: &Value, number: u16) -> Option<u16> {
    match &port["targetPort"] {
        Value::Number(n) => n.as_u64().and_then(|p| u16::try_from(p).ok()),
        Value::String(name) => pod["spec"]["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|c| c["ports"].as_array().into_iter().flatten())
            .find(|p| p["name"] == name.as_str())
            .and_then(|p| p["containerPort"].as_u64())
            .and_then(|p| u16::try_from(p).ok()),
        _ => Some(number),
    }
}

/// A selector-less Service's backends: its Endpoints' addresses, on the port of the
/// same name.
fn manual_backends(endpoints: &Value, port: &Value) -> Vec<(IpAddr, u16)> {
    let mut out = Vec::new();
    for subset in endpoints["subsets"].as_array().into_iter().flatten() {
        let Some(target) = subset["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["name"] == port["name"] || p["name"].is_null())
            .and_then(|p| p["port"].as_u64())
            .and_then(|p| u16::try_from(p).ok())
        else {
            continue;
        };
        for address in subset["addresses"].as_array().into_iter().flatten() {
            if let Some(ip) = address["ip"].as_str().and_then(|ip| ip.parse().ok()) {
                out.push((ip, target));
            }
        }
    }
    out
}

/// The `iptables-restore` text of `family`'s chains (declaring a chain flushes it).
fn rules(ports: &[ServicePort], family: IpFamily) -> String {
    let mut text = format!(
        "*nat\n:{SERVICES} - [0:0]\n:{POSTROUTING} - [0:0]\n:{MARK_MASQ} - [0:0]\n\
         -A {MARK_MASQ} -j MARK --set-xmark {MASQ_MARK}/{MASQ_MARK}\n\
         -A {POSTROUTING} -m mark ! --mark {MASQ_MARK}/{MASQ_MARK} -j RETURN\n\
         -A {POSTROUTING} -j MARK --set-xmark {MASQ_MARK}/0x0\n\
         -A {POSTROUTING} -j MASQUERADE\n"
    );
    let host_bits = match family {
        IpFamily::V4 => 32,
        IpFamily::V6 => 128,
    };
    for p in ports
        .iter()
        .filter(|p| IpFamily::of(&p.cluster_ip) == family)
    {
        let endpoints: Vec<String> = p
            .endpoints
            .iter()
            .filter(|(ip, _)| IpFamily::of(ip) == family)
            .map(|(ip, port)| match ip {
                IpAddr::V4(v4) => format!("{v4}:{port}"),
                IpAddr::V6(v6) => format!("[{v6}]:{port}"),
            })
            .collect();
        if endpoints.is_empty() {
            continue;
        }
        let matches = format!(
            "-d {}/{host_bits} -p {proto} -m {proto} --dport {} -m comment --comment \"{} cluster IP\"",
            p.cluster_ip, p.port, p.name, proto = p.protocol
        );
        text.push_str(&format!("-A {SERVICES} {matches} -j {MARK_MASQ}\n"));
        text.push_str(&spread(SERVICES, &matches, &endpoints));
    }
    text
}

/// Rules appended to `chain` that DNAT what `matches` selects evenly to `endpoints`
/// (`ip:port`): rule i takes 1/(n-i) of what reaches it, so each of the n endpoints
/// gets 1/n of new connections (kube-proxy's rendering).
pub(super) fn spread(chain: &str, matches: &str, endpoints: &[String]) -> String {
    let mut text = String::new();
    for (i, endpoint) in endpoints.iter().enumerate() {
        let left = endpoints.len() - i;
        let pick = if left > 1 {
            format!(
                "-m statistic --mode random --probability {:.5} ",
                1.0 / left as f64
            )
        } else {
            String::new()
        };
        text.push_str(&format!(
            "-A {chain} {matches} {pick}-j DNAT --to-destination {endpoint}\n"
        ));
    }
    text
}

/// `text` committed, with the base chains' jumps when they are not there yet.
fn with_hooks(text: &str, hooked: bool) -> String {
    let mut text = text.to_owned();
    if !hooked {
        for hook in ["PREROUTING", "OUTPUT"] {
            text.push_str(&format!(
                "-A {hook} -m comment --comment \"kubernetes service portals\" -j {SERVICES}\n"
            ));
        }
        text.push_str(&format!(
            "-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j {POSTROUTING}\n"
        ));
    }
    text.push_str("COMMIT\n");
    text
}

/// `iptables-restore --noflush` (or ip6tables') of `text`, with the host's backend,
/// in the namespace named `netns`, or in this thread's own namespace when `None`.
pub(super) fn restore(netns: Option<&str>, family: IpFamily, text: &str) -> Result<()> {
    let backend = crate::inpod::host_backend();
    let restore = || redirection::iptables::restore(backend, family, text);
    match netns {
        Some(name) => {
            test_support::netns::run_in(&Path::new("/var/run/netns").join(name), restore)??
        }
        None => restore()?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ready_pod(name: &str, ip: &str, labels: Value) -> Value {
        json!({
            "metadata": {"name": name, "namespace": "istio-system", "labels": labels},
            "spec": {"containers": [{"ports": [{"name": "grpc", "containerPort": 15012}]}]},
            "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]},
        })
    }

    #[test]
    fn ready_selected_pods_are_the_endpoints_and_named_ports_resolve() {
        let svc = json!({
            "metadata": {"name": "istiod", "namespace": "istio-system"},
            "spec": {"selector": {"app": "istiod"}},
        });
        let mut unready = ready_pod("c", "10.244.1.4", json!({"app": "istiod"}));
        unready["status"]["conditions"][0]["status"] = json!("False");
        let pods = [
            ready_pod("a", "10.244.1.2", json!({"app": "istiod"})),
            ready_pod("b", "10.244.2.3", json!({"app": "other"})),
            unready,
        ];
        assert_eq!(ready_endpoints(&svc, &pods), ["10.244.1.2"]);
        let named = json!({"port": 15012, "targetPort": "grpc"});
        assert_eq!(
            selected_backends(&svc, &named, 15012, &pods),
            [("10.244.1.2".parse().unwrap(), 15012)]
        );
    }

    #[test]
    fn each_of_n_endpoints_gets_one_nth_and_no_endpoint_means_no_rule() {
        let port = |endpoints: Vec<(IpAddr, u16)>| ServicePort {
            name: "istio-system/istiod:grpc".into(),
            cluster_ip: "10.96.0.20".parse().unwrap(),
            protocol: "tcp".into(),
            port: 15012,
            endpoints,
        };
        let two = rules(
            &[port(vec![
                ("10.244.1.2".parse().unwrap(), 15012),
                ("10.244.2.2".parse().unwrap(), 15012),
            ])],
            IpFamily::V4,
        );
        assert!(two.contains("--probability 0.50000 -j DNAT --to-destination 10.244.1.2:15012\n"));
        assert!(two.contains("cluster IP\" -j DNAT --to-destination 10.244.2.2:15012\n"));
        assert!(!rules(&[port(vec![])], IpFamily::V4).contains("DNAT"));
        assert!(!rules(&[port(vec![])], IpFamily::V6).contains("10.96.0.20"));
    }
}
