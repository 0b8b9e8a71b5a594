//! The CNI installer (Istio's install-cni): puts the `istio-cni` binary into the CNI bin
//! dir and our entry into the chain of the primary CNI config, keeps both there
//! ([`watch`]), and takes them out again on uninstall.
//!
//! Every operation is idempotent: it computes the wanted state from what is on disk and
//! writes only what differs, so an install, a re-install after an upgrade and a repair
//! are the same call.

pub mod conflist;
pub mod watch;

use conflist::{ConfFile, PluginSettings};
use mesh_runtime::fs::{copy_atomic, ensure_dir, remove_if_exists, write_atomic};
use serde_json::Value;
use std::ffi::OsString;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use shared_types::constants::CNI_PLUGIN_TYPE as PLUGIN_BINARY_NAME;

/// Istio's default name for the agent-owned conflist (sorts before most primaries).
pub const DEFAULT_OWNED_CONFIG_NAME: &str = "02-istio-cni.conflist";
/// Mode of a config file we create (an existing file keeps its own).
const CONFIG_MODE: u32 = 0o644;
const BINARY_MODE: u32 = 0o755;
const DIR_MODE: u32 = 0o755;
/// How long an unparseable config counts as being written rather than broken.
pub const FLUX_WINDOW: Duration = Duration::from_secs(2);

/// Where and what to install.
#[derive(Clone, Debug)]
pub struct InstallConfig {
    /// CNI conf dir (`/etc/cni/net.d`).
    pub conf_dir: PathBuf,
    /// CNI bin dir (`/opt/cni/bin`).
    pub bin_dir: PathBuf,
    /// The `istio-cni` binary shipped with the agent.
    pub plugin_source: PathBuf,
    /// Istio-owned mode: write the chain to this file in the conf dir and leave the
    /// primary config untouched. `None`: edit the primary in place.
    pub owned_config: Option<OsString>,
    /// Our entry's netconf fields.
    pub settings: PluginSettings,
}

#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// The primary CNI has not written its config yet; we wait for it.
    #[error("no CNI config (*.conf or *.conflist that parses) in {}: waiting for the primary CNI to write one", .0.display())]
    NoPrimaryConfig(PathBuf),
    /// A config that sorts before the primary does not parse but was just modified:
    /// probably being written. Falling back to the next file now could edit (or wrap
    /// and remove) a config the runtime does not use; retry shortly instead.
    #[error("{} does not parse yet and was just modified: retrying shortly", .0.display())]
    ConfigInFlux(PathBuf),
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> InstallError + 'a {
    move |source| InstallError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// What one install or uninstall pass changed on disk.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// Files written (the binary or a config).
    pub written: Vec<PathBuf>,
    /// Files removed (a wrapped `.conf`, our conflist, the binary on uninstall).
    pub removed: Vec<PathBuf>,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.written.is_empty() && self.removed.is_empty()
    }
}

impl std::fmt::Display for Changes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let list = |paths: &[PathBuf]| {
            paths
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        match (self.written.is_empty(), self.removed.is_empty()) {
            (true, true) => write!(f, "nothing"),
            (false, true) => write!(f, "wrote {}", list(&self.written)),
            (true, false) => write!(f, "removed {}", list(&self.removed)),
            (false, false) => write!(
                f,
                "wrote {}; removed {}",
                list(&self.written),
                list(&self.removed)
            ),
        }
    }
}

/// Identity of a file's content as far as metadata tells (device, inode, size, mtime).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp(u64, u64, u64, i64, i64);

impl Stamp {
    fn of(path: &Path) -> Option<Stamp> {
        use std::os::unix::fs::MetadataExt;
        let m = fs::metadata(path).ok()?;
        Some(Stamp(m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
    }
}

#[derive(Clone, Debug)]
pub struct Installer {
    config: InstallConfig,
    /// Source and target stamps when they were last found identical: a repair pass
    /// then skips reading two multi-megabyte binaries.
    verified_binary: Arc<Mutex<Option<(Stamp, Stamp)>>>,
}

impl Installer {
    pub fn new(config: InstallConfig) -> Self {
        Installer {
            config,
            verified_binary: Default::default(),
        }
    }

    pub fn config(&self) -> &InstallConfig {
        &self.config
    }

    /// Where the plugin binary goes.
    pub fn plugin_path(&self) -> PathBuf {
        self.config.bin_dir.join(PLUGIN_BINARY_NAME)
    }

    fn owned_path(&self) -> Option<PathBuf> {
        self.config
            .owned_config
            .as_ref()
            .map(|name| self.config.conf_dir.join(name))
    }

    /// Binary first, then config: the runtime must never call a plugin that is not there.
    pub fn install(&self) -> Result<Changes, InstallError> {
        let mut changes = Changes::default();
        if self.ensure_binary()? {
            changes.written.push(self.plugin_path());
        }
        let config = self.ensure_config()?;
        changes.written.extend(config.written);
        changes.removed.extend(config.removed);
        Ok(changes)
    }

    /// Copies the plugin unless the installed one is byte-identical. Returns whether it
    /// wrote.
    pub fn ensure_binary(&self) -> Result<bool, InstallError> {
        let source = &self.config.plugin_source;
        let target = self.plugin_path();
        let mut verified = self
            .verified_binary
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let stamps = Stamp::of(source).zip(Stamp::of(&target));
        if stamps.is_some() && stamps == *verified {
            return Ok(false);
        }
        let wanted = fs::read(source).map_err(io_err("reading the plugin binary", source))?;
        let write = match fs::read(&target) {
            Ok(current) => current != wanted,
            Err(e) if e.kind() == io::ErrorKind::NotFound => true,
            Err(e) => return Err(io_err("reading", &target)(e)),
        };
        if write {
            ensure_dir(&self.config.bin_dir, DIR_MODE)
                .map_err(io_err("creating", &self.config.bin_dir))?;
            copy_atomic(source, &target, BINARY_MODE)
                .map_err(io_err("installing the plugin binary to", &target))?;
        }
        *verified = Stamp::of(source).zip(Stamp::of(&target));
        Ok(write)
    }

    /// Puts our entry into the chain of the primary config (or into our own conflist in
    /// Istio-owned mode), writing only when the file on disk differs.
    pub fn ensure_config(&self) -> Result<Changes, InstallError> {
        let dir = &self.config.conf_dir;
        let scan = conflist::scan(dir).map_err(io_err("reading", dir))?;
        for skipped in &scan.skipped {
            let (path, reason) = (skipped.path.display(), &skipped.reason);
            tracing::debug!(%path, reason, "skipping a CNI config that does not parse");
        }
        let owned = self.config.owned_config.as_deref();
        let primary = scan
            .primary(owned)
            .ok_or_else(|| InstallError::NoPrimaryConfig(dir.clone()))?;
        let in_flux = scan
            .skipped
            .iter()
            .find(|s| s.path < primary.path && s.is_fresh(FLUX_WINDOW));
        if let Some(skipped) = in_flux {
            return Err(InstallError::ConfigInFlux(skipped.path.clone()));
        }
        let wanted = primary.with_entry(&self.config.settings.entry());
        let target = self.owned_path().unwrap_or_else(|| primary.list_path());
        let mut changes = Changes::default();
        if !same_document(&target, &wanted) {
            let mode = file_mode(&primary.path).unwrap_or(CONFIG_MODE);
            write_atomic(&target, &conflist::render(&wanted), mode)
                .map_err(io_err("writing", &target))?;
            changes.written.push(target.clone());
            let first = scan.files.first().filter(|f| f.path < target);
            if let (Some(first), Some(_)) = (first, owned) {
                tracing::warn!(
                    first = %first.path.display(), ours = %target.display(),
                    "a CNI config sorts before ours: the runtime uses it and skips istio-cni; \
                     choose an owned config name that sorts first"
                );
            }
        }
        // A wrapped `.conf` goes away, or the runtime would keep using it (it sorts
        // before the `.conflist` of the same name).
        let wrapped = self.owned_path().is_none() && primary.path != target;
        if wrapped && remove_if_exists(&primary.path).map_err(io_err("removing", &primary.path))? {
            changes.removed.push(primary.path.clone());
        }
        Ok(changes)
    }

    /// Whether the chain on disk already holds our current entry (readiness and tests).
    pub fn is_installed(&self) -> bool {
        let Ok(scan) = conflist::scan(&self.config.conf_dir) else {
            return false;
        };
        let owned = self.owned_path();
        let file = match &owned {
            Some(path) => scan.files.iter().find(|f| &f.path == path),
            None => scan.files.first(),
        };
        let entry = self.config.settings.entry();
        file.is_some_and(|f| f.with_entry(&entry) == f.json) && self.plugin_path().is_file()
    }

    /// Takes out what we put in: our entry from every chain that has it (a chain we
    /// wrapped from a `.conf` stays a one-plugin conflist, which the runtime treats the
    /// same), our own conflist in Istio-owned mode, and the binary.
    pub fn uninstall(&self) -> Result<Changes, InstallError> {
        let mut changes = Changes::default();
        if let Some(owned) = self.owned_path() {
            if remove_if_exists(&owned).map_err(io_err("removing", &owned))? {
                changes.removed.push(owned);
            }
        }
        let dir = &self.config.conf_dir;
        let scan = match conflist::scan(dir) {
            Ok(scan) => scan,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Default::default(),
            Err(e) => return Err(io_err("reading", dir)(e)),
        };
        for file in &scan.files {
            self.remove_entry(file, &mut changes)?;
        }
        let binary = self.plugin_path();
        if remove_if_exists(&binary).map_err(io_err("removing", &binary))? {
            changes.removed.push(binary);
        }
        Ok(changes)
    }

    fn remove_entry(&self, file: &ConfFile, changes: &mut Changes) -> Result<(), InstallError> {
        let Some(rest) = file.without_entry() else {
            return Ok(());
        };
        let empty = rest["plugins"].as_array().is_none_or(Vec::is_empty);
        if empty {
            // A chain of only istio-cni is not a network; leaving it would break pods.
            if remove_if_exists(&file.path).map_err(io_err("removing", &file.path))? {
                changes.removed.push(file.path.clone());
            }
        } else {
            write_atomic(&file.path, &conflist::render(&rest), CONFIG_MODE)
                .map_err(io_err("writing", &file.path))?;
            changes.written.push(file.path.clone());
        }
        Ok(())
    }
}

/// True when `path` holds exactly `wanted` as JSON (formatting aside), so a re-install
/// does not rewrite the file and wake every watcher of the conf dir.
fn same_document(path: &Path, wanted: &Value) -> bool {
    fs::read(path)
        .ok()
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .is_some_and(|current| &current == wanted)
}

fn file_mode(path: &Path) -> Option<u32> {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(path)
        .ok()
        .map(|m| m.permissions().mode() & 0o7777)
}
