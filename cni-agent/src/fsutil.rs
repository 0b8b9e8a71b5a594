//! Atomic file replacement. The container runtime, the primary CNI and the plugin read
//! the files we write at any moment, so they must see either the old or the new content,
//! never a half-written file: write a temp file in the same directory, fsync it, rename
//! it over the target, fsync the directory.

use std::fs::{self, File, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Temp files end in `.tmp`, so libcni (which reads `*.conf`, `*.conflist`, `*.json`)
/// never picks one up, and start with a dot so `ls` hides them.
fn temp_path(target: &Path) -> io::Result<PathBuf> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir = target.parent().ok_or_else(|| no_parent(target))?;
    let name = target
        .file_name()
        .ok_or_else(|| no_parent(target))?
        .to_string_lossy();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    Ok(dir.join(format!(".{name}.{}.{n}.tmp", std::process::id())))
}

fn no_parent(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{} is not a file path", path.display()),
    )
}

/// Replaces `target` with `contents`. The mode is the existing file's when there is
/// one (we keep what the node's owner chose), else `new_mode`.
pub fn write_atomic(target: &Path, contents: &[u8], new_mode: u32) -> io::Result<()> {
    let mode = match fs::metadata(target) {
        Ok(meta) => meta.permissions().mode() & 0o7777,
        Err(e) if e.kind() == io::ErrorKind::NotFound => new_mode,
        Err(e) => return Err(e),
    };
    let temp = temp_path(target)?;
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&temp)?;
        file.write_all(contents)?;
        // The umask may have narrowed the mode given to open.
        file.set_permissions(Permissions::from_mode(mode))?;
        file.sync_all()?;
        fs::rename(&temp, target)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&temp);
    }
    result?;
    sync_parent(target)
}

/// Copies `source` over `target` atomically with `mode`. A running `istio-cni` keeps
/// executing the old inode; writing in place would fail with ETXTBSY or corrupt it.
pub fn copy_atomic(source: &Path, target: &Path, mode: u32) -> io::Result<()> {
    let temp = temp_path(target)?;
    let result = (|| {
        let mut from = File::open(source)?;
        let mut to = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&temp)?;
        io::copy(&mut from, &mut to)?;
        to.set_permissions(Permissions::from_mode(mode))?;
        to.sync_all()?;
        fs::rename(&temp, target)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&temp);
    }
    result?;
    sync_parent(target)
}

/// Makes the rename itself durable across a power loss.
fn sync_parent(target: &Path) -> io::Result<()> {
    match target.parent() {
        Some(dir) => File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}

/// Removes a file; a file already gone is fine.
pub fn remove_if_exists(path: &Path) -> io::Result<bool> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Creates `dir` (and parents) if missing; a directory we create gets exactly `mode`,
/// an existing one is left as its owner set it.
pub fn ensure_dir(dir: &Path, mode: u32) -> io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)?;
    fs::set_permissions(dir, Permissions::from_mode(mode))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn write_keeps_existing_mode_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("10-x.conflist");
        write_atomic(&path, b"one", 0o644).unwrap();
        assert_eq!(mode(&path), 0o644);
        fs::set_permissions(&path, Permissions::from_mode(0o600)).unwrap();
        write_atomic(&path, b"two", 0o644).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        assert_eq!(mode(&path), 0o600);
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn copy_sets_mode() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        fs::write(&src, b"#!/bin/true\n").unwrap();
        let dst = dir.path().join("istio-cni");
        copy_atomic(&src, &dst, 0o755).unwrap();
        assert_eq!(mode(&dst), 0o755);
        assert_eq!(fs::read(&dst).unwrap(), b"#!/bin/true\n");
    }

    #[test]
    fn failed_copy_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let dst = dir.path().join("istio-cni");
        assert!(copy_atomic(&dir.path().join("missing"), &dst, 0o755).is_err());
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn ensure_dir_sets_mode_on_create_only() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("a/run");
        ensure_dir(&run, 0o750).unwrap();
        assert_eq!(mode(&run), 0o750);
        fs::set_permissions(&run, Permissions::from_mode(0o755)).unwrap();
        ensure_dir(&run, 0o750).unwrap();
        assert_eq!(mode(&run), 0o755);
    }
}
