//! Traffic redirection rules as data: what the node agent programs in every enrolled
//! pod's network namespace and on the node, and what a dedicated (VM) ztunnel programs
//! on its host. Each rule set is a value, rendered and applied in one transaction,
//! then compared with what the kernel holds; golden files in `testdata/` keep the
//! rendered text honest. As Istio keeps `cni/pkg/iptables` and `cni/pkg/nftables`
//! apart from its node agent.
//!
//! - [`rules`]: Istio's in-pod rule set as a value, rendered to `iptables-restore` input;
//!   [`host_capture`]: a VM's outbound (and optional inbound) capture;
//! - [`save`], [`plan`]: `iptables-save` parsed and compared rule by rule; the one
//!   restore transaction that converges (apply = repair) or removes;
//! - [`iptables`]: the backend (nft or legacy, detected once) and running it;
//! - [`nft`]: Istio's native nftables mode, over netlink;
//! - [`netlink`]: the fwmark rule and local route (rtnetlink);
//! - [`conntrack`]: forgetting flows that predate DNS capture;
//! - [`probe`]: the node's kubelet probe SNAT (ipset + `ISTIO_POSTRT`, or nftables);
//!   [`ipset`]: its members over netlink.
//!
//! Everything acts on the CURRENT thread's netns: enter the pod's first
//! ([`NetnsHandle::run`]), or use [`Redirector`].

pub mod conntrack;
pub mod host_capture;
pub mod ipset;
pub mod iptables;
pub mod netlink;
pub mod nft;
pub mod plan;
pub mod probe;
pub mod rules;
pub mod save;

use mesh_runtime::netns::{NetnsError, NetnsHandle};

pub use iptables::{Backend, IptablesError};
pub use netlink::{NetlinkError, PolicyRouting};
pub use nft::NftError;
pub use plan::CheckResult;
pub use probe::{ProbeError, ProbeSnat};
pub use rules::{InpodRules, IpFamily, RuleSet};

/// Why an in-pod redirection operation failed.
#[derive(Debug, thiserror::Error)]
pub enum RedirectError {
    /// Running, parsing or converging iptables failed.
    #[error(transparent)]
    Iptables(#[from] IptablesError),
    /// Adding, removing or reading the fwmark rule or local route failed.
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    /// The job could not run in the pod's netns (opening or entering it, or its thread).
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// An nf_tables netlink request failed, or the tables did not converge.
    #[error(transparent)]
    Nftables(#[from] nft::NftError),
}

/// How in-pod redirection is programmed on this node, chosen once at startup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `iptables-restore` with the host's xtables backend (Istio's default).
    Iptables(Backend),
    /// Istio's native nftables tables, over netlink (`NATIVE_NFTABLES`). The xtables
    /// backend is kept to clean up rules a previous iptables-mode agent wrote.
    Nftables {
        /// The xtables backend, for that cleanup.
        xtables: Backend,
    },
}

impl Mode {
    /// `"iptables"` or `"nftables"`, for logs.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Iptables(_) => "iptables",
            Mode::Nftables { .. } => "nftables",
        }
    }
}

/// What [`check_inpod`] found in a pod netns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InpodStatus {
    /// All families' rules (iptables chains or nftables tables), combined.
    pub rules: CheckResult,
    /// The fwmark rule and local route exist for every family.
    pub routing: bool,
}

impl InpodStatus {
    /// Whether both the rules and the routing are as wanted.
    pub fn is_ok(&self) -> bool {
        self.rules.is_ok() && self.routing
    }
}

/// Programs redirection in the current thread's netns: the policy route first (as
/// Istio does), then the rules (one restore per family, or one nftables batch).
/// Idempotent; also repairs drift. Returns whether any rule changed.
pub fn enable_inpod(mode: Mode, rules: &InpodRules) -> Result<bool, RedirectError> {
    enable(mode, rules, false)
}

/// [`enable_inpod`] for a netns a CNI ADD just created: our rules are written without
/// first reading the netns, then verified once (a netns that held rules after all is
/// converged as usual). Fewer iptables processes on the pod's start-up path.
pub fn enable_fresh_inpod(mode: Mode, rules: &InpodRules) -> Result<bool, RedirectError> {
    enable(mode, rules, true)
}

fn enable(mode: Mode, rules: &InpodRules, fresh: bool) -> Result<bool, RedirectError> {
    PolicyRouting::default().add(&rules.families())?;
    let changed = match (mode, fresh) {
        (Mode::Iptables(backend), _) => {
            let apply = if fresh {
                iptables::apply_fresh
            } else {
                iptables::apply
            };
            let mut changed = false;
            for set in rules.rule_sets() {
                changed |= apply(backend, &set)?;
            }
            changed
        }
        (Mode::Nftables { .. }, false) => nft::apply_inpod(rules)?,
        (Mode::Nftables { .. }, true) => nft::apply_inpod_fresh(rules)?,
    };
    if changed && rules.dns_capture && !fresh {
        // DNS capture may have just been turned on for a pod whose apps' DNS flows are
        // tracked already: without this they would go on around the redirect. Not
        // fatal: capture still holds for every new flow. (A fresh netns has no flows:
        // its pod's containers start only after the CNI ADD; the dump costs ~7 ms.)
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

/// Takes back an enrolled pod at startup. A pod programmed in the OTHER mode (the
/// node moved between iptables and nftables; told apart by our nftables tables, over
/// netlink) is converted in place: the new rules are written before the old ones go,
/// so capture never lapses. Otherwise its rules are converged when `repair`, and left
/// as found if not. Returns whether any rule changed.
pub fn restore_inpod(mode: Mode, rules: &InpodRules, repair: bool) -> Result<bool, RedirectError> {
    let has_nft_tables = match nft::has_inpod_tables() {
        Ok(found) => found,
        // A kernel without nf_tables has none of our tables to convert.
        Err(e) if matches!(mode, Mode::Iptables(_)) => {
            tracing::debug!(error = %e, "no nf_tables here: nothing to convert");
            false
        }
        Err(e) => return Err(e.into()),
    };
    let converting = match mode {
        Mode::Iptables(_) => has_nft_tables,
        Mode::Nftables { .. } => !has_nft_tables,
    };
    if !converting {
        return if repair {
            enable_inpod(mode, rules)
        } else {
            Ok(false)
        };
    }
    tracing::info!(
        mode = mode.name(),
        "converting a pod's redirection to this node's mode"
    );
    enable_inpod(mode, rules)?;
    match mode {
        Mode::Iptables(_) => nft::remove_inpod()?,
        Mode::Nftables { xtables } => {
            for set in rules.rule_sets() {
                iptables::remove(xtables, &set)?;
            }
        }
    }
    Ok(true)
}

/// Removes our chains (or tables), jumps, rule and route from the current thread's
/// netns (for the families `rules` covers), and nothing else.
pub fn disable_inpod(mode: Mode, rules: &InpodRules) -> Result<(), RedirectError> {
    match mode {
        Mode::Iptables(backend) => {
            for set in rules.rule_sets() {
                iptables::remove(backend, &set)?;
            }
        }
        Mode::Nftables { .. } => nft::remove_inpod()?,
    }
    PolicyRouting::default().remove(&rules.families())?;
    Ok(())
}

/// Compares the current thread's netns with `rules`.
pub fn check_inpod(mode: Mode, rules: &InpodRules) -> Result<InpodStatus, RedirectError> {
    let rules_state = match mode {
        Mode::Iptables(backend) => {
            let mut results = Vec::new();
            for set in rules.rule_sets() {
                results.push(iptables::check(backend, &set)?);
            }
            CheckResult::combine(results)
        }
        Mode::Nftables { .. } => nft::check_inpod(rules)?,
    };
    let routing = PolicyRouting::default();
    let mut routed = true;
    for family in rules.families() {
        let state = routing.state(family)?;
        routed &= state.rule && state.route;
    }
    Ok(InpodStatus {
        rules: rules_state,
        routing: routed,
    })
}

/// The in-pod operations for async callers: each runs inside the given netns on its
/// own OS thread, in the node's mode chosen once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Redirector {
    /// The node's redirection mode, used for every operation.
    pub mode: Mode,
}

impl Redirector {
    /// A redirector programming pods in `mode`.
    pub fn new(mode: Mode) -> Self {
        Redirector { mode }
    }

    async fn run<R: Send + 'static>(
        &self,
        netns: &NetnsHandle,
        rules: &InpodRules,
        job: fn(Mode, &InpodRules) -> Result<R, RedirectError>,
    ) -> Result<R, RedirectError> {
        let (mode, rules) = (self.mode, rules.clone());
        netns.run_async(move || job(mode, &rules)).await?
    }

    /// See [`enable_inpod`].
    pub async fn enable(
        &self,
        netns: &NetnsHandle,
        rules: &InpodRules,
    ) -> Result<bool, RedirectError> {
        self.run(netns, rules, enable_inpod).await
    }

    /// See [`enable_fresh_inpod`].
    pub async fn enable_fresh(
        &self,
        netns: &NetnsHandle,
        rules: &InpodRules,
    ) -> Result<bool, RedirectError> {
        self.run(netns, rules, enable_fresh_inpod).await
    }

    /// See [`restore_inpod`].
    pub async fn restore(
        &self,
        netns: &NetnsHandle,
        rules: &InpodRules,
        repair: bool,
    ) -> Result<bool, RedirectError> {
        let (mode, rules) = (self.mode, rules.clone());
        netns
            .run_async(move || restore_inpod(mode, &rules, repair))
            .await?
    }

    /// See [`disable_inpod`].
    pub async fn disable(
        &self,
        netns: &NetnsHandle,
        rules: &InpodRules,
    ) -> Result<(), RedirectError> {
        self.run(netns, rules, disable_inpod).await
    }

    /// See [`check_inpod`].
    pub async fn check(
        &self,
        netns: &NetnsHandle,
        rules: &InpodRules,
    ) -> Result<InpodStatus, RedirectError> {
        self.run(netns, rules, check_inpod).await
    }
}
