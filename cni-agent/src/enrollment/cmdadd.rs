//! The real [`CmdAddHandler`]: a pod that is not ambient starts at once; an ambient
//! pod starts only once it is enrolled (fail closed), retried with backoff until the
//! CNI event timeout, which is shorter than the plugin's own.
//!
//! An event is checked against the cluster before anything is written, so a forged or
//! confused ADD can never program a netns and hand it to ztunnel under another pod's
//! identity (Istio checks only that the pod is on its node, through its node-filtered
//! informer, and trusts the netns path):
//! - the pod is bound to this node (`spec.nodeName == NODE_NAME`);
//! - its UID is the event's when the event carries one (a cached pod of the same name
//!   that differs is re-read from the API first: it may be the previous incarnation);
//! - for an ambient pod, the netns path is one the agent opens at all (a file of
//!   `CNI_NETNS_DIR` or `/proc/<pid>/ns/net`), it is not the host's netns, and it holds
//!   one of the pod's IPs on an interface. The IPs are the event's (the plugin's
//!   `prevResult`, what the runtime just assigned), else the pod status's; they must
//!   not be the IPs of another live pod of this node. They need not match the status
//!   when it lists others: a recreated sandbox gets new IPs while the status still
//!   shows the old ones until the sandbox exists.
//!
//! A refusal is a 400 whose body says why; the pod is not enrolled and no rule is
//! written. The netns opened for the checks is the one enrolled and held afterwards.

use crate::enrollment::discover::interface_addresses;
use crate::enrollment::enroll::{EnrollError, Enroller};
use crate::enrollment::queue::Backoff;
use crate::plugin_api::event::BoxFuture;
use crate::plugin_api::event::{CmdAddError, CmdAddHandler};
use k8s_openapi::api::core::v1::Pod;
use mesh_runtime::netns::netns_inode;
use mesh_runtime::netns::NetnsHandle;
use shared_types::cni::CniPluginAddEvent;
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use tokio::time::Instant;

pub struct EnrollOnAdd {
    pub enroller: Enroller,
    pub backoff: Backoff,
}

/// The pod must be bound to `node` and, when the event names a UID, be that pod.
pub fn check_binding(pod: &Pod, node: &str, event_uid: &str) -> Result<(), String> {
    let key = mesh_kube::pod::key(pod);
    let bound = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
    if bound != Some(node) {
        return Err(format!(
            "pod {key} is bound to node {}, not to this node {node}",
            bound.unwrap_or("(none)")
        ));
    }
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    if !event_uid.is_empty() && event_uid != uid {
        return Err(format!(
            "pod {key} has UID {uid}, the ADD names UID {event_uid}"
        ));
    }
    Ok(())
}

/// The addresses to look for in the netns: the event's, else the pod status's.
pub fn claimed_ips(event: &CniPluginAddEvent, pod: &Pod) -> Vec<IpAddr> {
    let ips: Vec<IpAddr> = event.ips.iter().map(|c| c.address.ip).collect();
    if ips.is_empty() {
        mesh_kube::pod::ips(pod)
    } else {
        ips
    }
}

/// Another live, pod-network pod of this node that has one of `ips`.
pub fn other_owner(pods: &[Arc<Pod>], uid: &str, ips: &[IpAddr]) -> Option<(String, IpAddr)> {
    pods.iter()
        .filter(|p| p.metadata.uid.as_deref() != Some(uid))
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            let spec = p.spec.as_ref();
            spec.and_then(|s| s.host_network) != Some(true)
        })
        .filter(|p| {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            !matches!(phase, Some("Succeeded") | Some("Failed"))
        })
        .find_map(|p| {
            let ip = mesh_kube::pod::ips(p)
                .into_iter()
                .find(|ip| ips.contains(ip))?;
            Some((mesh_kube::pod::key(p), ip))
        })
}

impl EnrollOnAdd {
    pub fn new(enroller: Enroller) -> Self {
        EnrollOnAdd {
            enroller,
            backoff: Backoff::default(),
        }
    }

    /// The event's pod, from the cache or the API (retried until the deadline).
    async fn lookup(&self, key: &str, deadline: Instant) -> Result<Arc<Pod>, CmdAddError> {
        loop {
            match self.enroller.kube.pod(key).await {
                Ok(Some(pod)) => return Ok(pod),
                Ok(None) => return Err(CmdAddError::Failed(format!("pod {key} not found"))),
                Err(err) if Instant::now() >= deadline => {
                    return Err(CmdAddError::Failed(format!("looking up pod {key}: {err}")))
                }
                Err(err) => {
                    tracing::info!(pod = %key, "looking up the pod: {err}");
                    tokio::time::sleep(self.backoff.initial * 5).await;
                }
            }
        }
    }

    /// [`check_binding`], re-reading the pod from the API when the cached one differs
    /// from the event's UID.
    async fn bound_pod(
        &self,
        key: &str,
        pod: Arc<Pod>,
        event: &CniPluginAddEvent,
    ) -> Result<Arc<Pod>, String> {
        let node = &self.enroller.kube.node;
        let cached_uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let pod = if !event.pod_uid.is_empty() && event.pod_uid != cached_uid {
            match self.enroller.kube.get_pod(key).await {
                Ok(Some(fresh)) => fresh,
                Ok(None) => return Err(format!("pod {key} no longer exists")),
                Err(e) => return Err(format!("re-reading pod {key}: {e}")),
            }
        } else {
            pod
        };
        check_binding(&pod, node, &event.pod_uid)?;
        Ok(pod)
    }

    /// The netns is not the host's and holds one of `ips`, which are no other pod's.
    async fn check_netns(
        &self,
        pod: &Pod,
        netns: &NetnsHandle,
        ips: &[IpAddr],
    ) -> Result<(), String> {
        let key = mesh_kube::pod::key(pod);
        let e = &self.enroller;
        let host = [
            Path::new("/proc/self/ns/net").to_path_buf(),
            e.config.host_proc.join("1/ns/net"),
        ];
        if host
            .iter()
            .any(|p| netns_inode(p).is_ok_and(|inode| inode == netns.inode()))
        {
            return Err(format!(
                "netns {} of pod {key} is the host's network namespace",
                netns.path().display()
            ));
        }
        if ips.is_empty() {
            return Err(format!(
                "no IP known for pod {key} (none in the ADD, none in its status): its netns \
                 cannot be verified"
            ));
        }
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        if let Some((owner, ip)) = other_owner(&e.kube.pods(), uid, ips) {
            return Err(format!(
                "IP {ip} claimed for pod {key} belongs to pod {owner}"
            ));
        }
        let held = netns
            .run_async(interface_addresses)
            .await
            .map_err(|err| format!("entering netns {}: {err}", netns.path().display()))?
            .map_err(|err| {
                format!(
                    "listing the addresses in netns {}: {err}",
                    netns.path().display()
                )
            })?;
        if !held.iter().any(|ip| ips.contains(ip)) {
            return Err(format!(
                "netns {} holds none of the IPs {ips:?} of pod {key}",
                netns.path().display()
            ));
        }
        let status = mesh_kube::pod::ips(pod);
        if !status.is_empty() && !status.iter().any(|ip| ips.contains(ip)) {
            tracing::info!(pod = %key, ?status, new = ?ips, "new sandbox IPs (status not updated yet)");
        }
        Ok(())
    }

    fn refuse(&self, key: &str, reason: String) -> CmdAddError {
        let err = EnrollError::Refused(reason);
        self.enroller.metrics.record(Err(err.reason()));
        tracing::warn!(pod = %key, "refused a CNI ADD, nothing written: {err}");
        CmdAddError::BadRequest(err.to_string())
    }

    async fn run(&self, event: CniPluginAddEvent) -> Result<(), CmdAddError> {
        let e = &self.enroller;
        let key = format!("{}/{}", event.pod_namespace, event.pod_name);
        let started = Instant::now();
        let deadline = started + e.config.cni_event_timeout;
        let pod = self.lookup(&key, deadline).await?;
        let looked_up = started.elapsed();
        let pod = self
            .bound_pod(&key, pod, &event)
            .await
            .map_err(|reason| self.refuse(&key, reason))?;
        let namespace = e
            .kube
            .namespace_or_get(&event.pod_namespace)
            .await
            .ok()
            .flatten();
        let decision = e.config.selection.decide(&pod, namespace.as_deref());
        if !decision.is_ambient() {
            tracing::info!(pod = %key, ?decision, "pod ADD: not ambient");
            return Ok(());
        }
        let ips = claimed_ips(&event, &pod);
        let netns = match e.open_event_netns(&event.netns) {
            Ok(netns) => netns,
            Err(EnrollError::Refused(reason)) => return Err(self.refuse(&key, reason)),
            Err(err) => {
                e.metrics.record(Err(err.reason()));
                return Err(CmdAddError::Failed(format!("pod {key}: {err}")));
            }
        };
        self.check_netns(&pod, &netns, &ips)
            .await
            .map_err(|reason| self.refuse(&key, reason))?;
        let verified = started.elapsed();
        let mut failures = 0;
        loop {
            let result = {
                let _guard = e.pod_lock(&key).await;
                e.enroll(&pod, Some(&netns), &ips).await
            };
            let err: EnrollError = match result {
                Ok(()) => {
                    // Where the ADD's time went before the enrollment's own steps.
                    tracing::info!(
                        pod = %key,
                        lookup_us = looked_up.as_micros() as u64,
                        verify_us = (verified - looked_up).as_micros() as u64,
                        served_us = started.elapsed().as_micros() as u64,
                        "CNI ADD served"
                    );
                    return Ok(());
                }
                Err(err) => err,
            };
            failures += 1;
            let delay = self.backoff.delay(failures);
            if Instant::now() + delay >= deadline {
                e.report_failure(&pod, &err).await;
                return Err(CmdAddError::Failed(format!(
                    "pod {key} could not be enrolled in ambient within {:?}: {err}",
                    e.config.cni_event_timeout
                )));
            }
            tokio::time::sleep(delay).await;
        }
    }
}

impl CmdAddHandler for EnrollOnAdd {
    fn handle(&self, event: CniPluginAddEvent) -> BoxFuture<Result<(), CmdAddError>> {
        let this = EnrollOnAdd {
            enroller: self.enroller.clone(),
            backoff: self.backoff,
        };
        Box::pin(async move { this.run(event).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, uid: &str, node: &str, ips: &[&str]) -> Arc<Pod> {
        let ips: Vec<_> = ips.iter().map(|ip| json!({"ip": ip})).collect();
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "shop", "uid": uid},
                "spec": {"nodeName": node, "containers": []},
                "status": {"podIPs": ips, "phase": "Running"},
            }))
            .unwrap(),
        )
    }

    #[test]
    fn binding_needs_this_node_and_the_events_uid() {
        let p = pod("web", "u1", "node-a", &[]);
        assert_eq!(check_binding(&p, "node-a", "u1"), Ok(()));
        // Istio's plugin may leave the UID out.
        assert_eq!(check_binding(&p, "node-a", ""), Ok(()));
        let other_node = check_binding(&p, "node-b", "u1").unwrap_err();
        assert!(other_node.contains("bound to node node-a, not to this node node-b"));
        let wrong_uid = check_binding(&p, "node-a", "u2").unwrap_err();
        assert!(
            wrong_uid.contains("UID u1, the ADD names UID u2"),
            "{wrong_uid}"
        );
        let unbound: Pod =
            serde_json::from_value(json!({"metadata": {"name": "x", "uid": "u"}})).unwrap();
        assert!(check_binding(&unbound, "node-a", "").is_err());
    }

    #[test]
    fn ips_of_other_live_pods_are_not_claimable() {
        let ip: IpAddr = "10.0.0.5".parse().unwrap();
        let pods = vec![
            pod("web", "u1", "n", &["10.0.0.5"]),
            pod("db", "u2", "n", &["10.0.0.6"]),
        ];
        assert_eq!(other_owner(&pods, "u1", &[ip]), None);
        assert_eq!(
            other_owner(&pods, "u3", &[ip]),
            Some(("shop/web".to_string(), ip))
        );
        // A finished pod's IP is free again.
        let mut done = (*pods[0]).clone();
        done.status.as_mut().unwrap().phase = Some("Succeeded".into());
        assert_eq!(other_owner(&[Arc::new(done)], "u3", &[ip]), None);
    }
}
