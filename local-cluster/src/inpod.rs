//! A pod captured as the node agent captures it: the agent's own in-pod rule set,
//! programmed inside the pod's namespace by the agent's own code (the policy route
//! for ztunnel's transparent sockets, then one `iptables-restore` per family), for
//! topologies that run ztunnel without the agent.

use std::sync::OnceLock;

use anyhow::Result;
use redirection::{enable_inpod, Backend, InpodRules, Mode};
use test_support::topology::Pod;

/// Programs `rules` (e.g. `InpodRules::default()`: Istio's default IPv4 capture) in
/// `pod`'s namespace with the host's iptables backend.
pub fn capture(pod: &Pod, rules: &InpodRules) -> Result<()> {
    let mode = Mode::Iptables(host_backend());
    pod.ns.run_inside(|| enable_inpod(mode, rules))??;
    Ok(())
}

/// The iptables backend the host's own rules use, detected once per process: every
/// rule the harness writes uses it, as the node agent and kube-proxy would.
pub fn host_backend() -> Backend {
    static BACKEND: OnceLock<Backend> = OnceLock::new();
    *BACKEND.get_or_init(Backend::detect)
}
