//! Keeps the installation in place. Primary CNIs (Calico, Cilium, flannel, ...) rewrite
//! their config on their own restarts and drop our entry; pods created then would skip
//! the mesh. We watch the conf dir and the bin dir and re-run the (idempotent) install
//! after any change, throttled so a burst of events costs one pass, and warn when another
//! component keeps undoing our change (two writers fighting over one file).

use super::{InstallError, Installer};
use mesh_runtime::readiness::Readiness;
use notify::{Event, EventKind, RecursiveMode, Watcher};
use std::collections::VecDeque;
use std::path::Path;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Readiness blocker held until our entry and binary are in place.
pub const READY_CNI_CONFIG: &str = "cni-config";

#[derive(Clone, Copy, Debug)]
pub struct WatchSettings {
    /// Quiet time after an event before a pass, so a writer's burst (delete + create,
    /// temp + rename) is seen as one change.
    pub settle: Duration,
    /// Minimum time between two passes; events in between are coalesced.
    pub min_interval: Duration,
    /// A pass even without events: inotify drops events when its queue overflows.
    pub resync: Duration,
    /// More than `fight_threshold` repairs within `fight_window` means another component
    /// keeps rewriting the config: warn (at most once per window).
    pub fight_window: Duration,
    pub fight_threshold: usize,
}

impl Default for WatchSettings {
    fn default() -> Self {
        WatchSettings {
            settle: Duration::from_millis(50),
            min_interval: Duration::from_millis(100),
            resync: Duration::from_secs(60),
            fight_window: Duration::from_secs(60),
            fight_threshold: 5,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("watching {}: {source}", path.display())]
    Watch {
        path: std::path::PathBuf,
        source: notify::Error,
    },
    #[error("creating {}: {source}", path.display())]
    CreateDir {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("the file watcher stopped")]
    Stopped,
}

/// Counts repairs in a sliding window and says when to warn.
#[derive(Debug)]
pub struct FightDetector {
    window: Duration,
    threshold: usize,
    repairs: VecDeque<Instant>,
    last_warning: Option<Instant>,
}

impl FightDetector {
    pub fn new(window: Duration, threshold: usize) -> Self {
        FightDetector {
            window,
            threshold,
            repairs: VecDeque::new(),
            last_warning: None,
        }
    }

    /// Records a repair at `now`; returns the repair count in the window when a warning
    /// is due.
    pub fn record(&mut self, now: Instant) -> Option<usize> {
        self.repairs.push_back(now);
        while let Some(first) = self.repairs.front() {
            if now.duration_since(*first) <= self.window {
                break;
            }
            self.repairs.pop_front();
        }
        let quiet = self
            .last_warning
            .is_none_or(|t| now.duration_since(t) >= self.window);
        if self.repairs.len() > self.threshold && quiet {
            self.last_warning = Some(now);
            return Some(self.repairs.len());
        }
        None
    }
}

/// Installs, then repairs until `cancel`. Readiness is blocked under
/// [`READY_CNI_CONFIG`] whenever the installation is not in place (no primary config
/// yet, or a write failed).
pub async fn run(
    installer: Installer,
    readiness: Readiness,
    settings: WatchSettings,
    cancel: CancellationToken,
) -> Result<(), WatchError> {
    readiness.block(READY_CNI_CONFIG);
    let config = installer.config().clone();
    for dir in [&config.conf_dir, &config.bin_dir] {
        mesh_runtime::fs::ensure_dir(dir, 0o755).map_err(|source| WatchError::CreateDir {
            path: dir.clone(),
            source,
        })?;
    }
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut watcher = notify::recommended_watcher(move |event| {
        let _ = tx.send(event);
    })
    .map_err(|source| WatchError::Watch {
        path: config.conf_dir.clone(),
        source,
    })?;
    for dir in [&config.conf_dir, &config.bin_dir] {
        watcher
            .watch(dir, RecursiveMode::NonRecursive)
            .map_err(|source| WatchError::Watch {
                path: dir.clone(),
                source,
            })?;
    }

    let mut state = PassState {
        installed: false,
        waiting_logged: false,
        fights: FightDetector::new(settings.fight_window, settings.fight_threshold),
    };
    let mut retry = state.pass(&installer, &readiness).await;
    let mut last_pass = Instant::now();
    let mut resync = tokio::time::interval_at(last_pass + settings.resync, settings.resync);
    loop {
        let retry_due = async {
            match retry {
                Some(delay) => tokio::time::sleep_until(last_pass + delay).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            event = rx.recv() => match event {
                None => return Err(WatchError::Stopped),
                Some(event) if !is_relevant(&installer, &event) => continue,
                Some(event) => tracing::debug!(?event, "CNI dir changed"),
            },
            _ = resync.tick() => {}
            _ = retry_due => {}
        }
        let due = (Instant::now() + settings.settle).max(last_pass + settings.min_interval);
        tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            _ = tokio::time::sleep_until(due) => {}
        }
        while rx.try_recv().is_ok() {}
        retry = state.pass(&installer, &readiness).await;
        last_pass = Instant::now();
    }
}

struct PassState {
    installed: bool,
    waiting_logged: bool,
    fights: FightDetector,
}

/// Delay before re-checking a config that is being written.
const IN_FLUX_RETRY: Duration = Duration::from_millis(250);

impl PassState {
    /// One install pass; returns when to retry without waiting for an event, if needed.
    async fn pass(&mut self, installer: &Installer, readiness: &Readiness) -> Option<Duration> {
        let worker = installer.clone();
        let result = tokio::task::spawn_blocking(move || worker.install()).await;
        match result {
            Ok(Ok(changes)) => {
                readiness.unblock(READY_CNI_CONFIG);
                self.waiting_logged = false;
                if !self.installed {
                    self.installed = true;
                    tracing::info!(%changes, "istio-cni is in the CNI chain");
                } else if !changes.is_empty() {
                    tracing::info!(%changes, "repaired the CNI installation");
                    if let Some(count) = self.fights.record(Instant::now()) {
                        tracing::warn!(
                            repairs = count,
                            conf_dir = %installer.config().conf_dir.display(),
                            "another component keeps rewriting the CNI config or removing \
                             the istio-cni binary; each time we put it back"
                        );
                    }
                }
            }
            Ok(Err(e @ InstallError::ConfigInFlux(_))) => {
                tracing::debug!("{e}");
                return Some(IN_FLUX_RETRY);
            }
            Ok(Err(e @ InstallError::NoPrimaryConfig(_))) => {
                readiness.block(READY_CNI_CONFIG);
                self.installed = false;
                if !self.waiting_logged {
                    self.waiting_logged = true;
                    tracing::info!("{e}");
                }
            }
            Ok(Err(e)) => {
                readiness.block(READY_CNI_CONFIG);
                tracing::warn!("installing istio-cni failed, will retry on the next change: {e}");
            }
            Err(e) => {
                readiness.block(READY_CNI_CONFIG);
                tracing::error!("the install pass panicked: {e}");
            }
        }
        None
    }
}

/// Events that can change what we installed: CNI configs in the conf dir and our
/// binary in the bin dir. Reads are not changes; an overflow or error forces a pass.
fn is_relevant(installer: &Installer, event: &notify::Result<Event>) -> bool {
    let Ok(event) = event else {
        return true;
    };
    if matches!(event.kind, EventKind::Access(_)) {
        return false;
    }
    if event.need_rescan() || event.paths.is_empty() {
        return true;
    }
    let config = installer.config();
    let plugin = installer.plugin_path();
    event.paths.iter().any(|path| {
        let in_conf_dir = path.parent() == Some(config.conf_dir.as_path());
        (in_conf_dir && is_cni_config(path)) || path == &plugin
    })
}

fn is_cni_config(path: &Path) -> bool {
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("conf" | "conflist")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warns_once_per_window_after_threshold() {
        let mut d = FightDetector::new(Duration::from_secs(60), 5);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        for s in 0..5 {
            assert_eq!(d.record(at(s)), None);
        }
        assert_eq!(d.record(at(5)), Some(6));
        assert_eq!(d.record(at(6)), None, "already warned in this window");
        // Old repairs fall out of the window.
        assert_eq!(d.record(at(200)), None);
        for s in 201..205 {
            assert_eq!(d.record(at(s)), None);
        }
        assert_eq!(d.record(at(205)), Some(6));
    }

    #[test]
    fn slow_repairs_never_warn() {
        let mut d = FightDetector::new(Duration::from_secs(60), 5);
        let t0 = Instant::now();
        for i in 0..50 {
            assert_eq!(d.record(t0 + Duration::from_secs(i * 15)), None);
        }
    }
}
