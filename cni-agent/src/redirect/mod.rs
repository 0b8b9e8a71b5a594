//! Redirection: everything that programs a pod's network namespace and the node.
//!
//! - [`rules`]: Istio's in-pod rule set as a value, rendered to `iptables-restore` input;
//! - [`save`], [`plan`]: `iptables-save` parsed and compared rule by rule; the one
//!   restore transaction that converges (apply = repair) or removes;
//! - [`iptables`]: the backend (nft or legacy, detected once) and running it;
//! - [`netlink`]: the fwmark rule and local route (rtnetlink);
//! - [`netns`]: running a job inside a netns on its own OS thread;
//! - [`discover`]: finding an already-running pod's netns through `/proc`;
//! - [`probe`]: the node's kubelet probe SNAT (ipset + `ISTIO_POSTRT`).
//!
//! Everything except [`netns`] and [`discover`] acts on the CURRENT thread's netns:
//! enter the pod netns first with [`NetnsHandle::run`], or use [`Redirector`].

pub mod conntrack;
pub mod discover;
pub mod iptables;
pub mod netlink;
pub mod netns;
pub mod plan;
pub mod probe;
pub mod rules;
pub mod save;

pub use discover::{find_pod_netns, FoundNetns, MatchedBy, ProcScan};
pub use iptables::{Backend, IptablesError};
pub use netlink::{NetlinkError, PolicyRouting};
pub use netns::{NetnsError, NetnsHandle};
pub use plan::CheckResult;
pub use probe::{ProbeError, ProbeSnat};
pub use rules::{InpodRules, IpFamily, RuleSet};

#[derive(Debug, thiserror::Error)]
pub enum RedirectError {
    #[error(transparent)]
    Iptables(#[from] IptablesError),
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    #[error(transparent)]
    Netns(#[from] NetnsError),
}

/// What [`check_inpod`] found in a pod netns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InpodStatus {
    /// All families' iptables rules, combined.
    pub iptables: CheckResult,
    /// The fwmark rule and local route exist for every family.
    pub routing: bool,
}

impl InpodStatus {
    pub fn is_ok(&self) -> bool {
        self.iptables.is_ok() && self.routing
    }
}

/// Programs redirection in the current thread's netns: the policy route first (as
/// Istio does), then each family's rules in one restore. Idempotent; also repairs
/// drift. Returns whether any iptables rule changed.
pub fn enable_inpod(backend: Backend, rules: &InpodRules) -> Result<bool, RedirectError> {
    PolicyRouting::default().add(&rules.families())?;
    let mut changed = false;
    for set in rules.rule_sets() {
        changed |= iptables::apply(backend, &set)?;
    }
    if changed && rules.dns_capture {
        // DNS capture may have just been turned on for a pod whose apps' DNS flows are
        // tracked already: without this they would go on around the redirect. Not
        // fatal: capture still holds for every new flow.
        match conntrack::forget_app_dns_flows() {
            Ok(0) => {}
            Ok(n) => tracing::info!(flows = n, "forgot DNS flows that predate DNS capture"),
            Err(e) => {
                tracing::warn!(error = %e, "could not forget DNS flows that predate DNS capture")
            }
        }
    }
    Ok(changed)
}

/// Removes our chains, jumps, rule and route from the current thread's netns (for the
/// families `rules` covers), and nothing else.
pub fn disable_inpod(backend: Backend, rules: &InpodRules) -> Result<(), RedirectError> {
    for set in rules.rule_sets() {
        iptables::remove(backend, &set)?;
    }
    PolicyRouting::default().remove(&rules.families())?;
    Ok(())
}

/// Compares the current thread's netns with `rules`.
pub fn check_inpod(backend: Backend, rules: &InpodRules) -> Result<InpodStatus, RedirectError> {
    let mut results = Vec::new();
    for set in rules.rule_sets() {
        results.push(iptables::check(backend, &set)?);
    }
    let routing = PolicyRouting::default();
    let mut routed = true;
    for family in rules.families() {
        let state = routing.state(family)?;
        routed &= state.rule && state.route;
    }
    Ok(InpodStatus {
        iptables: CheckResult::combine(results),
        routing: routed,
    })
}

/// The in-pod operations for async callers: each runs inside the given netns on its
/// own OS thread, with the node's backend chosen once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Redirector {
    pub backend: Backend,
}

impl Redirector {
    pub fn new(backend: Backend) -> Self {
        Redirector { backend }
    }

    pub async fn enable(
        &self,
        netns: &NetnsHandle,
        rules: &InpodRules,
    ) -> Result<bool, RedirectError> {
        let (backend, rules) = (self.backend, rules.clone());
        netns
            .run_async(move || enable_inpod(backend, &rules))
            .await?
    }

    pub async fn disable(
        &self,
        netns: &NetnsHandle,
        rules: &InpodRules,
    ) -> Result<(), RedirectError> {
        let (backend, rules) = (self.backend, rules.clone());
        netns
            .run_async(move || disable_inpod(backend, &rules))
            .await?
    }

    pub async fn check(
        &self,
        netns: &NetnsHandle,
        rules: &InpodRules,
    ) -> Result<InpodStatus, RedirectError> {
        let (backend, rules) = (self.backend, rules.clone());
        netns
            .run_async(move || check_inpod(backend, &rules))
            .await?
    }
}
