//! kube-proxy's job for one Service, done minimally: istiod's ClusterIP.
//!
//! Every node reaches the control plane through the control-plane namespace, so the
//! Service lives there: new TCP connections to the VIP are DNATed at random to one of
//! the replicas that answer readiness (iptables `statistic`, as kube-proxy's iptables
//! mode), and connections already made keep their replica (conntrack). A poller plays
//! the endpoints controller: it checks each replica's `/ready` every
//! [`POLL`] and rewrites the chain when the ready set changes. With no ready replica
//! the chain is empty and a connection is refused, as kube-proxy refuses a Service
//! without endpoints.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::services::kube_proxy::{restore, spread};
use shared_types::net::IpFamily;
use test_support::netns::Netns;

/// The chain holding the Service's endpoints (nat table).
const CHAIN: &str = "ISTIOD-SVC";
const POLL: Duration = Duration::from_millis(100);

/// One replica: where it serves, and its readiness endpoint.
#[derive(Clone, Copy, Debug)]
pub struct Endpoint {
    pub serving: SocketAddr,
    pub ready: SocketAddr,
}

pub struct ServiceProxy {
    stop: Arc<AtomicBool>,
    poller: Option<JoinHandle<()>>,
}

impl ServiceProxy {
    /// Sends new connections to `vip` (in `ns`) to the ready ones of `endpoints`.
    pub fn start(ns: &Netns, vip: SocketAddr, endpoints: Vec<Endpoint>) -> Result<Self> {
        ns.exec(&["iptables", "-t", "nat", "-N", CHAIN])?;
        let (ip, port) = (vip.ip().to_string(), vip.port().to_string());
        // PREROUTING: from the nodes; OUTPUT: from the control plane itself (istioctl).
        for hook in ["PREROUTING", "OUTPUT"] {
            ns.exec(&[
                "iptables", "-t", "nat", "-A", hook, "-d", &ip, "-p", "tcp", "--dport", &port,
                "-j", CHAIN,
            ])?;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let poller = {
            let (stop, ns_path, ns_name) = (stop.clone(), ns.path(), ns.name().to_owned());
            std::thread::Builder::new()
                .name(format!("svc-proxy-{ns_name}"))
                .spawn(move || {
                    if let Err(e) = enter(&ns_path) {
                        eprintln!("service proxy: {e:#}");
                        return;
                    }
                    poll(&ns_name, &endpoints, &stop);
                })?
        };
        Ok(ServiceProxy {
            stop,
            poller: Some(poller),
        })
    }
}

impl Drop for ServiceProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(poller) = self.poller.take() {
            let _ = poller.join();
        }
        // The rules go with the namespace.
    }
}

/// Moves this thread (for good) into the namespace at `path`.
fn enter(path: &std::path::Path) -> Result<()> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: setns on an fd we own; it changes only this thread, which is ours.
    let rc = unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&file), libc::CLONE_NEWNET) };
    if rc != 0 {
        bail!(
            "setns {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

fn poll(ns_name: &str, endpoints: &[Endpoint], stop: &AtomicBool) {
    let mut current: Option<Vec<SocketAddr>> = None;
    while !stop.load(Ordering::Relaxed) {
        let ready: Vec<SocketAddr> = endpoints
            .iter()
            .filter(|e| is_ready(e.ready))
            .map(|e| e.serving)
            .collect();
        if current.as_ref() != Some(&ready) {
            // Processes started from this thread run in its namespace.
            match apply(&ready) {
                Ok(()) => current = Some(ready),
                Err(e) => eprintln!("service proxy in {ns_name}: {e:#}"),
            }
        }
        std::thread::sleep(POLL);
    }
}

/// The chain for `ready`, spread evenly as kube-proxy spreads a Service.
fn rules(ready: &[SocketAddr]) -> String {
    let endpoints: Vec<String> = ready.iter().map(SocketAddr::to_string).collect();
    format!(
        "*nat\n:{CHAIN} - [0:0]\n{}COMMIT\n",
        spread(CHAIN, "-p tcp", &endpoints)
    )
}

fn apply(ready: &[SocketAddr]) -> Result<()> {
    restore(None, IpFamily::V4, &rules(ready))
}

fn is_ready(addr: SocketAddr) -> bool {
    test_support::http::get_ok(addr, "/ready").is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_of_n_endpoints_gets_one_nth() {
        let a: SocketAddr = "10.1.0.101:15012".parse().unwrap();
        let b: SocketAddr = "10.1.0.102:15012".parse().unwrap();
        assert_eq!(
            rules(&[a, b]),
            "*nat\n:ISTIOD-SVC - [0:0]\n\
             -A ISTIOD-SVC -p tcp -m statistic --mode random --probability 0.50000 -j DNAT --to-destination 10.1.0.101:15012\n\
             -A ISTIOD-SVC -p tcp -j DNAT --to-destination 10.1.0.102:15012\n\
             COMMIT\n"
        );
        assert_eq!(rules(&[]), "*nat\n:ISTIOD-SVC - [0:0]\nCOMMIT\n");
    }
}
