//! Whether a pod's ADD waits for the node agent, and what to do when the agent cannot be
//! asked. Decided without Kubernetes credentials: from CNI_ARGS, the netconf, the agent's
//! answer, and, when the agent is unreachable, the agent's persisted enablement state.
//!
//! Fail closed for what may be an ambient pod (code 11: the runtime retries the sandbox),
//! pass for what cannot be. The one case the plugin cannot see while the agent is down:
//! a pod that opts in with its own `istio.io/dataplane-mode=ambient` label in a namespace
//! that is not ambient. It starts unredirected; the agent enrolls it once it is back.

use crate::args::K8sArgs;
use crate::env::Invocation;
use crate::error::{CniError, Code};
use crate::http::{self, HttpError};
use crate::log::Logger;
use crate::netconf::NetConf;
use crate::result::CniResult;
use shared_types::cni::{
    AmbientEnablementState, CniPluginAddEvent, NamespaceEnablement, CNI_ADD_EVENT_PATH,
    ENABLEMENT_STATE_FILE, MESH_DAEMONSET_POD_PREFIXES,
};
use shared_types::constants::PLUGIN_EVENT_SOCKET;
use std::path::Path;
use std::time::Duration;

/// Connecting is local; if it takes longer than this the agent is not serving.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Agent reply bytes kept (its error text goes into our message).
const MAX_RESPONSE: usize = 64 * 1024;
/// Agent error text quoted in a CNI error message.
const MAX_QUOTED: usize = 512;

/// Why a pod does not wait for the agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pass {
    NotAPod,
    AmbientDisabled,
    ExcludedNamespace,
    MeshDaemonSet,
}

/// The decision that needs no I/O: pass now, or ask the agent.
pub fn pre_check(conf: &NetConf, args: &K8sArgs) -> Option<Pass> {
    if args.pod().is_none() {
        return Some(Pass::NotAPod);
    }
    if !conf.ambient_enabled {
        return Some(Pass::AmbientDisabled);
    }
    if conf.exclude_namespaces.contains(&args.pod_namespace) {
        return Some(Pass::ExcludedNamespace);
    }
    if is_mesh_daemonset_pod(conf, args) {
        return Some(Pass::MeshDaemonSet);
    }
    None
}

/// ztunnel and the agent itself start before the agent can answer; they never wait.
fn is_mesh_daemonset_pod(conf: &NetConf, args: &K8sArgs) -> bool {
    args.pod_namespace == conf.system_namespace
        && MESH_DAEMONSET_POD_PREFIXES
            .iter()
            .any(|p| args.pod_name.starts_with(p))
}

/// Runs the gate for an ADD: `Ok` lets the result through, `Err` is the CNI error.
pub fn admit(
    conf: &NetConf,
    inv: &Invocation,
    args: &K8sArgs,
    result: &CniResult,
    log: &mut Logger,
) -> Result<(), CniError> {
    if let Some(pass) = pre_check(conf, args) {
        log.debug(format!("not waiting for the node agent: {pass:?}"));
        return Ok(());
    }
    let gate = Gate::new(conf, args);
    let event = CniPluginAddEvent {
        netns: inv.netns.clone(),
        pod_name: args.pod_name.clone(),
        pod_namespace: args.pod_namespace.clone(),
        ips: result.pod_ips(),
        pod_uid: args.pod_uid.clone(),
        container_id: inv.container_id.clone(),
        if_name: inv.ifname.clone(),
    };
    let body = serde_json::to_vec(&event)
        .map_err(|e| CniError::new(Code::Internal, format!("encoding the ADD event: {e}")))?;
    log.debug(format!("asking the node agent at {}", gate.socket));
    let limits = http::Limits {
        connect: CONNECT_TIMEOUT,
        total: conf.agent_timeout,
        max_response: MAX_RESPONSE,
    };
    match http::post_json(
        &conf.run_dir.join(PLUGIN_EVENT_SOCKET),
        CNI_ADD_EVENT_PATH,
        &body,
        limits,
    ) {
        Ok(r) if r.status == 200 => {
            // Debug: the agent logs the same ADD at info ("CNI ADD served", with its
            // timings), and an info line here would cost every pod start a second
            // connection to the agent, for the log batch.
            log.debug("node agent admitted the pod");
            Ok(())
        }
        Ok(r) => Err(gate.refused(r.status, &r.body, r.truncated)),
        Err(HttpError::Connect(e)) => gate.agent_unreachable(conf, &connect_cause(&e), log),
        Err(HttpError::Timeout(t)) => {
            Err(gate.no_answer(&format!("did not answer within {}s", t.as_secs_f32())))
        }
        Err(e) => Err(gate.no_answer(&format!("broke off the exchange ({e})"))),
    }
}

/// The pieces every message names. `msg` says what is missing and the first command to
/// run; `details` says what happens next and where else to look.
struct Gate {
    socket: String,
    pod: String,
    namespace: String,
    system_namespace: String,
}

impl Gate {
    fn new(conf: &NetConf, args: &K8sArgs) -> Self {
        Gate {
            socket: conf.run_dir.join(PLUGIN_EVENT_SOCKET).display().to_string(),
            pod: args.pod().unwrap_or_default(),
            namespace: args.pod_namespace.clone(),
            system_namespace: conf.system_namespace.clone(),
        }
    }

    /// The command every message ends with.
    fn check(&self) -> String {
        format!(
            "check `kubectl -n {} logs ds/istio-cni-node`",
            self.system_namespace
        )
    }

    /// What happens next, and where else to look.
    fn details(&self, cause: &str) -> String {
        format!(
            "{cause}. The pod stays in ContainerCreating and the runtime retries the sandbox; \
             it starts once the node agent has put its traffic redirection in place and \
             ztunnel acknowledged it. Is the agent running on this node: `kubectl -n {0} get \
             pods -l k8s-app=istio-cni-node -o wide`; is ztunnel: `kubectl -n {0} logs \
             ds/ztunnel`",
            self.system_namespace
        )
    }

    fn refused(&self, status: u16, body: &[u8], truncated: bool) -> CniError {
        let mut text = quote(body);
        if truncated || text.len() >= MAX_QUOTED {
            text.push_str("...");
        }
        CniError::new(
            Code::TryAgainLater,
            format!(
                "istio-cni node agent at {} refused pod {} (HTTP {status}): {text}; {}",
                self.socket,
                self.pod,
                self.check()
            ),
        )
        .details(self.details("The agent answers 200 only once the pod is handled"))
    }

    fn no_answer(&self, what: &str) -> CniError {
        CniError::new(
            Code::TryAgainLater,
            format!(
                "istio-cni node agent at {} {what} for pod {}; {}",
                self.socket,
                self.pod,
                self.check()
            ),
        )
        .details(self.details("A slow answer usually means ztunnel has not acknowledged the pod"))
    }

    /// The agent is not there: decide from its last persisted enablement state.
    fn agent_unreachable(
        &self,
        conf: &NetConf,
        cause: &str,
        log: &mut Logger,
    ) -> Result<(), CniError> {
        let path = conf.run_dir.join(ENABLEMENT_STATE_FILE);
        let unreachable = format!(
            "istio-cni node agent unreachable at {} ({cause})",
            self.socket
        );
        let state = match read_state(&path) {
            Ok(state) => state,
            Err(why) => {
                return Err(CniError::new(
                    Code::TryAgainLater,
                    format!(
                        "{unreachable} and its enablement state {} is {why}: cannot tell \
                         whether namespace {} is ambient, so pod {} is held; {}",
                        path.display(),
                        self.namespace,
                        self.pod,
                        self.check()
                    ),
                )
                .details(self.details(&format!(
                    "Without the agent the plugin decides from {}, which the agent writes \
                     once it has synced with the API server; after a fresh install or a node \
                     reboot it appears when the agent first starts",
                    path.display()
                ))))
            }
        };
        match state.namespace(&self.namespace) {
            NamespaceEnablement::Ambient => Err(CniError::new(
                Code::TryAgainLater,
                format!(
                    "{unreachable} and namespace {} is ambient: pod {} is held until the agent \
                     can redirect its traffic; {}",
                    self.namespace,
                    self.pod,
                    self.check()
                ),
            )
            .details(self.details(&format!(
                "Namespace {} is ambient per {} written at {}",
                self.namespace,
                path.display(),
                state.written_at
            )))),
            enablement => {
                log.warn(format!(
                    "{unreachable}; namespace {} is {} per {} written at {}: letting the pod \
                     start. If the pod itself is labelled istio.io/dataplane-mode=ambient, \
                     the agent enrolls it once it is back",
                    self.namespace,
                    if enablement == NamespaceEnablement::Excluded {
                        "excluded"
                    } else {
                        "not ambient"
                    },
                    path.display(),
                    state.written_at
                ));
                Ok(())
            }
        }
    }
}

/// The connect failure in operator words.
fn connect_cause(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "no socket: the agent is not running".into(),
        std::io::ErrorKind::ConnectionRefused => "connection refused: nothing listening".into(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            "connect timed out: the agent is not accepting connections".into()
        }
        _ => e.to_string(),
    }
}

/// Reads the state file; the error text completes "its enablement state <path> is ...".
fn read_state(path: &Path) -> Result<AmbientEnablementState, String> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err("missing".into()),
        Err(e) => return Err(format!("unreadable ({e})")),
    };
    AmbientEnablementState::parse(&bytes).map_err(|e| format!("unusable ({e})"))
}

/// The agent's text, one line, printable, bounded.
fn quote(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let mut out: String = text
        .trim()
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(MAX_QUOTED)
        .collect();
    if out.is_empty() {
        out.push_str("(no reason given)");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(extra: &str) -> NetConf {
        let ambient = if extra.contains("ambient_enabled") {
            ""
        } else {
            r#","ambient_enabled":true"#
        };
        NetConf::parse(format!(r#"{{"cniVersion":"1.0.0","name":"n"{ambient}{extra}}}"#).as_bytes())
            .unwrap()
    }

    fn pod(ns: &str, name: &str) -> K8sArgs {
        K8sArgs {
            pod_namespace: ns.into(),
            pod_name: name.into(),
            ..K8sArgs::default()
        }
    }

    #[test]
    fn who_never_waits() {
        let c = conf("");
        assert_eq!(pre_check(&c, &K8sArgs::default()), Some(Pass::NotAPod));
        assert_eq!(
            pre_check(&conf(",\"ambient_enabled\":false"), &pod("a", "b")),
            Some(Pass::AmbientDisabled)
        );
        assert_eq!(
            pre_check(&c, &pod("kube-system", "coredns-1")),
            Some(Pass::ExcludedNamespace)
        );
        assert_eq!(
            pre_check(&c, &pod("istio-system", "ztunnel-abcde")),
            Some(Pass::MeshDaemonSet)
        );
        assert_eq!(
            pre_check(&c, &pod("istio-system", "istio-cni-node-x1")),
            Some(Pass::MeshDaemonSet)
        );
        // Same names elsewhere, or other system pods, do wait.
        assert_eq!(pre_check(&c, &pod("default", "ztunnel-abcde")), None);
        assert_eq!(pre_check(&c, &pod("istio-system", "istiod-1")), None);
        assert_eq!(pre_check(&c, &pod("default", "web")), None);
        let custom = conf(r#","pod_namespace":"mesh","exclude_namespaces":["infra"]"#);
        assert_eq!(
            pre_check(&custom, &pod("mesh", "ztunnel-1")),
            Some(Pass::MeshDaemonSet)
        );
        assert_eq!(pre_check(&custom, &pod("kube-system", "x")), None);
        assert_eq!(
            pre_check(&custom, &pod("infra", "x")),
            Some(Pass::ExcludedNamespace)
        );
    }

    #[test]
    fn quoting_is_bounded_and_single_line() {
        assert_eq!(quote(b"  pod not found\n"), "pod not found");
        assert_eq!(quote(b"a\nb"), "a b");
        assert_eq!(quote(b""), "(no reason given)");
        assert_eq!(quote(&[b'x'; 2000]).len(), MAX_QUOTED);
    }

    #[test]
    fn messages_name_the_socket_and_the_check() {
        let c = conf(r#","pod_namespace":"mesh""#);
        let g = Gate::new(&c, &pod("shop", "web-0"));
        let e = g.refused(500, b"ztunnel did not ack", false);
        assert_eq!(e.code, Code::TryAgainLater);
        assert!(
            e.msg.contains("/var/run/istio-cni/pluginevent.sock"),
            "{}",
            e.msg
        );
        assert!(e.msg.contains("shop/web-0"));
        assert!(e.msg.contains("ztunnel did not ack"));
        assert!(e.msg.contains("kubectl -n mesh logs ds/istio-cni-node"));
        assert!(
            e.details.contains("kubectl -n mesh logs ds/ztunnel"),
            "{}",
            e.details
        );
        assert!(e.details.contains("retries"), "{}", e.details);
    }
}
