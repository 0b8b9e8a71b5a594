//! Wires the agent's parts in the order the node needs them: probes first, then the
//! plugin sockets and the enablement state (so a plugin can reach us the moment our
//! config appears), then the installer and its watch. On shutdown the chain entry stays
//! (fail closed: new pods wait for the next agent) unless uninstall was asked for.

use crate::enrollment::cmdadd::EnrollOnAdd;
use crate::enrollment::{self, EnrollmentConfig};
use crate::install::watch::{self, WatchSettings};
use crate::install::{InstallConfig, Installer};
use crate::ops::health;
use crate::ops::metrics::Metrics;
use crate::plugin_api::enablement;
use crate::plugin_api::{self, event::CmdAddHandler, UdsAccess};
use anyhow::Context;
use mesh_runtime::readiness::Readiness;
use std::path::PathBuf;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Log filter without `RUST_LOG`. Plugin lines are already filtered by the plugin's
/// `plugin_log_level`; filtering them again here would hide what the operator asked for.
pub const DEFAULT_LOG_FILTER: &str = "info,cni-plugin=trace";

/// Readiness blocker held until both plugin sockets listen.
pub const READY_PLUGIN_SOCKETS: &str = "plugin-sockets";

/// The whole node agent's settings: the installer, the plugin sockets, the probes and
/// (with ambient enabled) the enrollment engine.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub install: InstallConfig,
    /// Where the sockets and the enablement state live.
    pub run_dir: PathBuf,
    /// Admitted on the plugin sockets besides root (0: root only).
    pub plugin_peer_uid: u32,
    /// Port of `/healthz` and `/readyz`.
    pub health_port: u16,
    /// On exit, take our entry and binary out of the node. Off by default: on an
    /// upgrade or reboot the entry stays so new pods wait for the agent instead of
    /// starting outside the mesh.
    pub uninstall_on_exit: bool,
    pub watch: WatchSettings,
    /// The enrollment engine; `None` (`AMBIENT_ENABLED=false`) keeps the given handler.
    pub enrollment: Option<EnrollmentConfig>,
}

/// Runs until `shutdown` fires (or the installer's watch fails), then cleans up as
/// configured.
pub async fn run(
    config: AgentConfig,
    handler: Arc<dyn CmdAddHandler>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let readiness = Readiness::new();
    readiness.block(READY_PLUGIN_SOCKETS);
    readiness.block(watch::READY_CNI_CONFIG);
    // Separate tokens: the watch must stop before an uninstall (or it would repair it),
    // the sockets only after.
    let (serve_stop, watch_stop) = (CancellationToken::new(), CancellationToken::new());

    let health = health::bind(config.health_port)
        .await
        .with_context(|| format!("binding the health port {}", config.health_port))?;
    tracing::info!(address = %health.local_addr()?, "health probes listening");
    tokio::spawn(health::serve(health, readiness.clone(), serve_stop.clone()));

    // One registry: the plugin sockets count refused peers into it. It is served on
    // the metrics port by the engine (ambient mode).
    let metrics = Metrics::new();
    // The engine keeps serving until the very end; its in-pod rules outlive us.
    let handler: Arc<dyn CmdAddHandler> = match &config.enrollment {
        Some(enrollment_config) => {
            let enroller = enrollment::start(
                enrollment_config,
                config.run_dir.clone(),
                metrics.clone(),
                readiness.clone(),
                serve_stop.clone(),
            )
            .await?;
            Arc::new(EnrollOnAdd::new(enroller))
        }
        None => handler,
    };
    let access = UdsAccess {
        peer_uid: config.plugin_peer_uid,
        metrics,
    };
    plugin_api::start(&config.run_dir, handler, &access, serve_stop.clone())?;
    let excluded = &config.install.settings.exclude_namespaces;
    let state = enablement::initial_state(&config.run_dir, excluded);
    enablement::write_state(&config.run_dir, &state).with_context(|| {
        format!(
            "writing {}",
            enablement::state_path(&config.run_dir).display()
        )
    })?;
    readiness.unblock(READY_PLUGIN_SOCKETS);

    let installer = Installer::new(config.install.clone());
    let mut watch_task = tokio::spawn(watch::run(
        installer.clone(),
        readiness.clone(),
        config.watch,
        watch_stop.clone(),
    ));

    let mut result = Ok(());
    tokio::select! {
        _ = shutdown.cancelled() => tracing::info!("shutting down"),
        ended = &mut watch_task => {
            result = match ended {
                Ok(Ok(())) => Err(anyhow::anyhow!("the installer watch stopped")),
                Ok(Err(e)) => Err(anyhow::Error::new(e).context("the installer watch failed")),
                Err(e) => Err(anyhow::anyhow!("the installer watch panicked: {e}")),
            };
        }
    }
    watch_stop.cancel();
    let _ = watch_task.await;

    if config.uninstall_on_exit {
        let uninstalled = tokio::task::spawn_blocking(move || installer.uninstall()).await;
        match uninstalled {
            Ok(Ok(changes)) => tracing::info!(%changes, "istio-cni uninstalled"),
            Ok(Err(e)) => tracing::error!("uninstalling istio-cni failed: {e}"),
            Err(e) => tracing::error!("uninstalling istio-cni panicked: {e}"),
        }
    } else {
        tracing::info!(
            "leaving istio-cni in the CNI chain: new pods wait for the next agent (fail closed)"
        );
    }
    serve_stop.cancel();
    result
}
