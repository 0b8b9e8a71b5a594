//! Starts the enrollment engine: metrics, the ZDS server, the Kubernetes watches, the
//! work queue's workers, and the startup sequence (caches synced, enrolled pods taken
//! back, then ready). In-pod rules are left in place on shutdown: the pods stay
//! captured while the next agent starts.

pub mod cmdadd;
pub mod discover;
pub mod eligibility;
pub mod enroll;
pub mod kube;
pub mod podlock;
pub mod queue;

use crate::enrollment::enroll::{Enroller, PodEnrollmentConfig};
use crate::enrollment::kube::{Change, KubeCache};
use crate::enrollment::queue::{Backoff, WorkQueue};
use crate::ops::metrics::Metrics;
use crate::plugin_api::enablement;
use crate::plugin_api::peer::{PeerGate, SOCKET_ZDS};
use crate::zds::ZdsServer;
use anyhow::Context;
use mesh_runtime::readiness::Readiness;
use redirection::{nft, Backend, Mode, ProbeSnat, Redirector};
use shared_types::cni::AmbientEnablementState;
use std::path::PathBuf;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Readiness blockers of the engine.
pub const READY_KUBE_CACHES: &str = "kube-caches";
pub const READY_STARTUP_RECONCILE: &str = "startup-reconcile";

/// Workers draining the queue (the CNI path enrolls on its own task). An
/// enrollment mostly waits on iptables-restore/-save and ipset processes, so more
/// workers than cores keep a namespace label's burst of pods moving.
const WORKERS: usize = 8;

/// `IPTABLES_BACKEND`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendChoice {
    Auto,
    Nft,
    Legacy,
}

/// The enrollment engine's settings (`AMBIENT_ENABLED`): how it reaches ztunnel and
/// the cluster, how it programs the node, and what enrolling one pod depends on.
#[derive(Debug, Clone)]
pub struct EnrollmentConfig {
    pub node_name: String,
    pub zds_socket: PathBuf,
    /// Admitted on the ZDS socket besides root (0: root only).
    pub ztunnel_peer_uid: u32,
    /// Converge every enrolled pod's rules at start (else only take them back).
    pub reconcile_on_startup: bool,
    pub metrics_port: u16,
    /// `IPTABLES_BACKEND`.
    pub backend: BackendChoice,
    /// `NATIVE_NFTABLES`.
    pub native_nftables: bool,
    pub pods: PodEnrollmentConfig,
}

/// The node's redirection mode: nftables when asked for, except (as Istio) while the
/// host has the iptables mode's probe ipsets, which another agent may still be using.
async fn choose_mode(config: &EnrollmentConfig) -> anyhow::Result<Mode> {
    let xtables = match config.backend {
        BackendChoice::Nft => Backend::Nft,
        BackendChoice::Legacy => Backend::Legacy,
        BackendChoice::Auto => tokio::task::spawn_blocking(Backend::detect).await?,
    };
    let mode = if !config.native_nftables {
        Mode::Iptables(xtables)
    } else if tokio::task::spawn_blocking(ProbeSnat::ipsets_exist).await?? {
        tracing::warn!(
            "NATIVE_NFTABLES is set but the host has the iptables-mode probe ipsets \
             (istio-inpod-probes-v4/-v6): staying on iptables"
        );
        Mode::Iptables(xtables)
    } else {
        Mode::Nftables { xtables }
    };
    tracing::info!(
        mode = mode.name(),
        xtables = xtables.name(),
        "redirection mode"
    );
    Ok(mode)
}

/// Builds and starts everything; returns the engine for the CNI handler. `metrics`
/// is the agent's registry (the plugin sockets count into it too); it is served here.
pub async fn start(
    config: &EnrollmentConfig,
    run_dir: PathBuf,
    metrics: Metrics,
    readiness: Readiness,
    cancel: CancellationToken,
) -> anyhow::Result<Enroller> {
    readiness.block(READY_KUBE_CACHES);
    readiness.block(READY_STARTUP_RECONCILE);
    let listener = crate::ops::health::bind(config.metrics_port)
        .await
        .with_context(|| format!("binding the metrics port {}", config.metrics_port))?;
    tokio::spawn(metrics.clone().serve(listener, cancel.clone()));

    let mode = choose_mode(config).await?;
    let mut probe = ProbeSnat::new(mode, config.pods.ipv6);
    if let Mode::Nftables { .. } = mode {
        match nft::kubelet_uid(&config.pods.host_proc) {
            Some(uid) => probe.kubelet_uid = uid,
            None => tracing::warn!(
                "no kubelet process in {}: probe SNAT matches uid 0 (root)",
                config.pods.host_proc.display()
            ),
        }
    }
    let probe = match tokio::task::spawn_blocking(move || probe.install()).await? {
        Ok(()) => Some(probe),
        Err(e) => {
            tracing::warn!(
                "kubelet probe SNAT not installed (probes of ambient pods may fail): {e}"
            );
            None
        }
    };

    let gate = PeerGate::new(SOCKET_ZDS, config.ztunnel_peer_uid, &metrics);
    let zds = ZdsServer::bind(&config.zds_socket, gate)
        .with_context(|| format!("binding the ZDS socket {}", config.zds_socket.display()))?;
    // Served only after the startup restore (in startup_and_watch): a ztunnel that
    // connects earlier would get an empty snapshot and stop serving every pod.
    let client = ::kube::Client::try_default()
        .await
        .context("configuring the Kubernetes client")?;
    let (changes_tx, changes) = mpsc::unbounded_channel();
    let kube = KubeCache::start(client, &config.node_name, changes_tx, cancel.clone());
    let queue = WorkQueue::new(Backoff::default());
    let enroller = Enroller::new(
        config.pods.clone(),
        kube,
        zds,
        Redirector::new(mode),
        probe,
        metrics,
        queue,
    );
    spawn_gauges(&enroller, cancel.clone());
    for _ in 0..WORKERS {
        let (e, cancel) = (enroller.clone(), cancel.clone());
        tokio::spawn(async move {
            loop {
                let key = tokio::select! {
                    _ = cancel.cancelled() => return,
                    key = e.queue.next() => key,
                };
                let result = e.reconcile(&key).await;
                if let Some(retry) = e.queue.done(&key, result.is_ok()) {
                    if let Err(err) = result {
                        tracing::info!(pod = %key, ?retry, "will retry: {err}");
                    }
                }
            }
        });
    }
    tokio::spawn(startup_and_watch(
        enroller.clone(),
        config.reconcile_on_startup,
        run_dir,
        readiness,
        changes,
        cancel,
    ));
    Ok(enroller)
}

fn spawn_gauges(e: &Enroller, cancel: CancellationToken) {
    let (mut conns, mut depth) = (e.zds.watch_connections(), e.queue.watch_depth());
    let metrics = e.metrics.clone();
    tokio::spawn(async move {
        loop {
            metrics
                .zds_connections
                .set(*conns.borrow_and_update() as i64);
            metrics.queue_depth.set(*depth.borrow_and_update() as i64);
            tokio::select! {
                _ = cancel.cancelled() => return,
                r = conns.changed() => if r.is_err() { return },
                r = depth.changed() => if r.is_err() { return },
            }
        }
    });
}

/// Publishes which namespaces are ambient for the plugin's fallback.
fn write_enablement(e: &Enroller, run_dir: &std::path::Path) {
    let selection = &e.config.selection;
    let mut ambient: Vec<String> = e
        .kube
        .namespaces()
        .iter()
        .filter(|ns| selection.namespace_is_ambient(ns))
        .filter_map(|ns| ns.metadata.name.clone())
        .collect();
    ambient.sort();
    let state = AmbientEnablementState::new(
        ambient,
        selection.excluded_namespaces.clone(),
        std::time::SystemTime::now(),
    );
    if let Err(e) = enablement::write_state(run_dir, &state) {
        tracing::error!("writing the enablement state failed: {e}");
    }
}

async fn startup_and_watch(
    e: Enroller,
    repair: bool,
    run_dir: PathBuf,
    readiness: Readiness,
    mut changes: mpsc::UnboundedReceiver<Change>,
    cancel: CancellationToken,
) {
    tokio::select! {
        _ = cancel.cancelled() => return,
        synced = e.kube.wait_synced() => if !synced { return },
    }
    readiness.unblock(READY_KUBE_CACHES);
    write_enablement(&e, &run_dir);
    let restored = e.restore(repair).await;
    tracing::info!(restored, "startup reconcile done");
    // Now the first snapshot a ztunnel gets names every enrolled pod (as Istio builds
    // its snapshot before it starts its ZDS server).
    tokio::spawn({
        let (zds, cancel) = (e.zds.clone(), cancel.clone());
        async move { zds.run(cancel).await }
    });
    for pod in e.kube.pods() {
        e.queue.add(&mesh_kube::pod::key(&pod));
    }
    readiness.unblock(READY_STARTUP_RECONCILE);
    loop {
        let change = tokio::select! {
            _ = cancel.cancelled() => return,
            change = changes.recv() => match change { Some(c) => c, None => return },
        };
        match change {
            Change::Pod(key) => e.queue.add(&key),
            Change::Namespace(name) => {
                write_enablement(&e, &run_dir);
                for pod in e.kube.pods() {
                    if pod.metadata.namespace.as_deref() == Some(name.as_str()) {
                        e.queue.add(&mesh_kube::pod::key(&pod));
                    }
                }
            }
        }
    }
}
