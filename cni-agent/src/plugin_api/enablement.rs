//! Publishes which namespaces are ambient to `<run-dir>/ambient-enablement.json`. The
//! plugin reads it only when it cannot reach us (agent restarting, node rebooting), to
//! fail closed for pods of ambient namespaces and let the others start. Enrollment
//! rewrites it on every namespace change; until then `main` publishes an empty list.

use mesh_runtime::fs::write_atomic;
use shared_types::cni::{AmbientEnablementState, ENABLEMENT_STATE_FILE};
use std::io;
use std::path::{Path, PathBuf};

/// World-readable: it names namespaces, nothing secret, and the run dir guards access.
const STATE_MODE: u32 = 0o644;

pub fn state_path(run_dir: &Path) -> PathBuf {
    run_dir.join(ENABLEMENT_STATE_FILE)
}

/// Replaces the file atomically: the plugin may read it at any moment.
pub fn write_state(run_dir: &Path, state: &AmbientEnablementState) -> io::Result<()> {
    let mut bytes = serde_json::to_vec(state).map_err(io::Error::other)?;
    bytes.push(b'\n');
    write_atomic(&state_path(run_dir), &bytes, STATE_MODE)
}

/// The state to publish at startup: the namespaces a previous agent found ambient are
/// kept (replacing them with an empty list would let pods of ambient namespaces start
/// unredirected if we went down again before enrollment caught up); the excluded
/// namespaces come from our flags.
pub fn initial_state(run_dir: &Path, excluded: &[String]) -> AmbientEnablementState {
    let previous = std::fs::read(state_path(run_dir))
        .ok()
        .and_then(|bytes| AmbientEnablementState::parse(&bytes).ok());
    let ambient = previous.map(|s| s.ambient_namespaces).unwrap_or_default();
    AmbientEnablementState::new(ambient, excluded.to_vec(), std::time::SystemTime::now())
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared_types::cni::NamespaceEnablement;
    use std::time::SystemTime;

    #[test]
    fn written_state_reads_back_as_the_plugin_reads_it() {
        let dir = tempfile::tempdir().unwrap();
        let state = AmbientEnablementState::new(
            vec!["shop".into()],
            vec!["kube-system".into()],
            SystemTime::now(),
        );
        write_state(dir.path(), &state).unwrap();
        let back =
            AmbientEnablementState::parse(&std::fs::read(state_path(dir.path())).unwrap()).unwrap();
        assert_eq!(back, state);
        assert_eq!(back.namespace("shop"), NamespaceEnablement::Ambient);
        // A restart keeps what the previous agent knew, with the new exclusions.
        let restarted = initial_state(dir.path(), &["other".to_string()]);
        assert_eq!(restarted.ambient_namespaces, ["shop"]);
        assert_eq!(restarted.excluded_namespaces, ["other"]);
        assert!(initial_state(&dir.path().join("none"), &[])
            .ambient_namespaces
            .is_empty());
        let empty = AmbientEnablementState::new(vec![], vec![], SystemTime::now());
        write_state(dir.path(), &empty).unwrap();
        let back =
            AmbientEnablementState::parse(&std::fs::read(state_path(dir.path())).unwrap()).unwrap();
        assert_eq!(back.namespace("shop"), NamespaceEnablement::NotAmbient);
    }
}
