//! The pods this ztunnel serves: one set of listeners per pod, created inside the
//! pod's namespace on `add`, drained on `del`, and reconciled against the agent's
//! snapshot after every (re)connect.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use shared_types::zds::WorkloadInfo;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use super::netns::PodSocketFactory;
use crate::dns::DnsProxy;
use crate::drain::Drain;
use crate::identity::{Identity, SecretManager};
use crate::metrics::Metrics;
use crate::proxy::connections::ConnectionManager;
use crate::proxy::{
    check_local_node, ListenAddrs, Listeners, LocalWorkload, OwnPorts, ProxyInputs,
};
use crate::socket::SocketFactory;
use crate::state::StateStore;
use mesh_runtime::netns::{NetnsHandle, NetnsSwitch};

/// What every pod's proxies share.
#[derive(Clone)]
pub struct SharedInputs {
    pub state: StateStore,
    pub certs: SecretManager,
    pub metrics: Arc<Metrics>,
    pub connections: Arc<ConnectionManager>,
    pub netns_switch: NetnsSwitch,
    pub root_drain: Drain,
    pub mark: u32,
    pub trust_domain: String,
    pub cluster_id: String,
    /// How long a deleted pod's connections may take to finish.
    pub drain_deadline: Duration,
    /// Ports no connection may be addressed to (loop protection).
    pub own_ports: OwnPorts,
    /// `NODE_NAME`: pods discovery places on another node are refused.
    pub node_name: String,
    /// The DNS proxy each pod gets, unless ISTIO_META_DNS_CAPTURE turned it off.
    pub dns: Option<DnsProxy>,
    /// Where each pod's listeners bind inside its namespace ([`ListenAddrs::inpod`]).
    pub listen: ListenAddrs,
}

/// A pod as `/config_dump` shows it.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSummary {
    pub uid: String,
    pub name: String,
    pub namespace: String,
    pub service_account: String,
    pub identity: String,
    pub netns_inode: u64,
    pub state: &'static str,
}

struct RunningPod {
    summary: PodSummary,
    identity: Identity,
    drain: Drain,
    listeners: Vec<JoinHandle<()>>,
    /// Keeps the namespace alive while its proxies run.
    _netns: Arc<NetnsHandle>,
}

/// Pods currently served, shared with `/config_dump` and shutdown.
#[derive(Clone, Default)]
pub struct PodRegistry {
    pods: Arc<Mutex<BTreeMap<String, (PodSummary, Drain)>>>,
    /// Identities (URIs) of adds in progress, with how many: a stopped pod's drain must
    /// not forget a certificate an add is minting or has just minted for its pod.
    adding: Arc<Mutex<BTreeMap<String, usize>>>,
}

impl PodRegistry {
    pub fn summaries(&self) -> Vec<PodSummary> {
        lock(&self.pods).values().map(|(s, _)| s.clone()).collect()
    }

    /// Whether a pod served now, or being added, has identity `id`.
    fn serves_identity(&self, id: &Identity) -> bool {
        let uri = id.to_uri();
        lock(&self.adding).contains_key(&uri)
            || lock(&self.pods).values().any(|(s, _)| s.identity == uri)
    }

    /// Marks an add of a pod with identity `id` as in progress until the guard drops.
    fn adding(&self, id: &Identity) -> AddInProgress {
        let uri = id.to_uri();
        *lock(&self.adding).entry(uri.clone()).or_default() += 1;
        AddInProgress {
            adding: self.adding.clone(),
            uri,
        }
    }

    /// Drains every pod (shutdown): stop accepting, wait up to `deadline`.
    pub async fn drain_all(&self, deadline: Duration) {
        let drains: Vec<Drain> = lock(&self.pods).values().map(|(_, d)| d.clone()).collect();
        futures::future::join_all(drains.iter().map(|d| d.drain(deadline))).await;
    }
}

/// An add in progress (see [`PodRegistry::adding`]).
struct AddInProgress {
    adding: Arc<Mutex<BTreeMap<String, usize>>>,
    uri: String,
}

impl Drop for AddInProgress {
    fn drop(&mut self) {
        let mut adding = lock(&self.adding);
        if let Some(count) = adding.get_mut(&self.uri) {
            *count -= 1;
            if *count == 0 {
                adding.remove(&self.uri);
            }
        }
    }
}

pub struct PodProxies {
    inputs: SharedInputs,
    pods: BTreeMap<String, RunningPod>,
    registry: PodRegistry,
    /// Pods the agent replayed since the current connection began; `None` once
    /// that connection's snapshot is complete.
    replayed: Option<HashSet<String>>,
}

impl PodProxies {
    pub fn new(inputs: SharedInputs, registry: PodRegistry) -> Self {
        PodProxies {
            inputs,
            pods: BTreeMap::new(),
            registry,
            replayed: None,
        }
    }

    /// A new agent connection: its replay starts now.
    pub fn connection_started(&mut self) {
        self.replayed = Some(HashSet::new());
    }

    pub fn len(&self) -> usize {
        self.pods.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    pub async fn add(
        &mut self,
        uid: String,
        info: WorkloadInfo,
        netns: NetnsHandle,
    ) -> Result<(), String> {
        self.note_replayed(&uid);
        let identity = Identity::new(
            &self.inputs.trust_domain,
            &info.namespace,
            &info.service_account,
        );
        // Held until the pod is registered: a restart's own stop (below) or another
        // pod's drain must not forget this identity's certificate meanwhile.
        let _adding = self.registry.adding(&identity);
        if let Some(running) = self.pods.get(&uid) {
            if running.summary.netns_inode == netns.inode() {
                return Ok(()); // replayed or repeated: already serving it
            }
            info!(%uid, "pod's network namespace changed; restarting its proxies");
            self.stop(&uid).await;
        }
        if info.namespace.is_empty() || info.service_account.is_empty() {
            return Err(format!(
                "add for {uid}: workload info needs a namespace and a service account"
            ));
        }
        if let Err(reason) = check_local_node(
            &self.inputs.state,
            &info.namespace,
            &info.name,
            &self.inputs.node_name,
        ) {
            self.inputs.metrics.error("zds_pod_on_other_node");
            return Err(format!("add for {uid}: {reason}"));
        }
        let started = Instant::now();
        // Fail the add (so the agent retries and the pod does not start) rather
        // than serve a pod we cannot give an identity.
        self.inputs
            .certs
            .fetch(&identity)
            .await
            .map_err(|e| format!("minting the certificate for {identity}: {e}"))?;
        let cert_done = Instant::now();
        let netns = Arc::new(netns);
        let factory = PodSocketFactory {
            netns: netns.clone(),
            switch: self.inputs.netns_switch.clone(),
            mark: self.inputs.mark,
        };
        let listeners = Listeners::bind(&factory, self.inputs.listen)
            .await
            .map_err(|e| format!("listening in the pod: {e}"))?;
        debug!(%uid, addrs = ?listeners.local_addrs(), "bound the pod's listeners");
        let listen_done = Instant::now();
        let drain = self.inputs.root_drain.child();
        let local = LocalWorkload {
            namespace: info.namespace.clone(),
            name: info.name.clone(),
            identity: identity.clone(),
        };
        let sockets: Arc<dyn SocketFactory> = Arc::new(factory);
        // The capture rules send the pod's DNS here: without the server, DNS breaks.
        let dns = match &self.inputs.dns {
            Some(dns) => dns
                .start(sockets.clone(), local.clone(), drain.clone())
                .await
                .map_err(|e| format!("DNS proxy on {} in the pod: {e}", dns.addr))?,
            None => Vec::new(),
        };
        let mut handles = listeners.spawn(ProxyInputs {
            state: self.inputs.state.clone(),
            certs: self.inputs.certs.clone(),
            metrics: self.inputs.metrics.clone(),
            connections: self.inputs.connections.clone(),
            sockets,
            local,
            drain: drain.clone(),
            transparent_inbound: true,
            cluster_id: self.inputs.cluster_id.clone(),
            own_ports: self.inputs.own_ports.clone(),
        });
        handles.extend(dns);
        let dns_done = Instant::now();
        let summary = PodSummary {
            uid: uid.clone(),
            name: info.name,
            namespace: info.namespace,
            service_account: info.service_account,
            identity: identity.to_uri(),
            netns_inode: netns.inode(),
            state: "Up",
        };
        lock(&self.registry.pods).insert(uid.clone(), (summary.clone(), drain.clone()));
        self.pods.insert(
            uid.clone(),
            RunningPod {
                summary,
                identity: identity.clone(),
                drain,
                listeners: handles,
                _netns: netns,
            },
        );
        // Where the add's time went, as the agent logs its own steps.
        let us = |from: Instant, to: Instant| (to - from).as_micros();
        info!(%uid, %identity, took = ?started.elapsed(),
            cert_us = us(started, cert_done), listen_us = us(cert_done, listen_done),
            dns_us = us(listen_done, dns_done), "serving pod");
        Ok(())
    }

    pub fn keep(&mut self, uid: &str) -> Result<(), String> {
        self.note_replayed(uid);
        if !self.pods.contains_key(uid) {
            // Nothing to keep (e.g. ztunnel restarted): the agent sends an add
            // with the netns once it can open it again.
            warn!(%uid, "keep for a pod this ztunnel does not serve");
        }
        Ok(())
    }

    pub async fn del(&mut self, uid: &str) -> Result<(), String> {
        if let Some(replayed) = &mut self.replayed {
            replayed.remove(uid);
        }
        if self.pods.contains_key(uid) {
            self.stop(uid).await;
            info!(%uid, "stopped serving pod");
        }
        Ok(())
    }

    /// Ends the replay: pods the agent did not replay are no longer ours.
    pub async fn snapshot_sent(&mut self) -> Result<(), String> {
        let replayed = self
            .replayed
            .take()
            .ok_or_else(|| "snapshot_sent received twice on one connection".to_owned())?;
        let stale: Vec<String> = self
            .pods
            .keys()
            .filter(|uid| !replayed.contains(*uid))
            .cloned()
            .collect();
        for uid in stale {
            info!(%uid, "pod not in the agent's snapshot; stopping it");
            self.stop(&uid).await;
        }
        Ok(())
    }

    fn note_replayed(&mut self, uid: &str) {
        if let Some(replayed) = &mut self.replayed {
            replayed.insert(uid.to_owned());
        }
    }

    /// Closes the pod's listeners now (so nothing is left bound in its namespace)
    /// and lets its connections drain up to the deadline in the background.
    async fn stop(&mut self, uid: &str) {
        let Some(pod) = self.pods.remove(uid) else {
            return;
        };
        lock(&self.registry.pods).remove(uid);
        pod.drain.stop_accepting();
        for handle in pod.listeners {
            let _ = handle.await;
        }
        // The last pod with this identity left the node: drop its leaf and stop
        // renewing it (else every identity ever seen here stays cached and renewed).
        let identity = pod.identity;
        let certs = self.inputs.certs.clone();
        if !self.registry.serves_identity(&identity) {
            certs.forget(&identity);
            info!(%identity, "no pod on this node has this identity any more; certificate forgotten");
        }
        let deadline = self.inputs.drain_deadline;
        let registry = self.registry.clone();
        tokio::spawn(async move {
            pod.drain.drain(deadline).await;
            // A connection still finishing may have fetched the leaf again.
            if !registry.serves_identity(&identity) {
                certs.forget(&identity);
            }
        });
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
#[path = "statemanager_tests.rs"]
mod tests;
