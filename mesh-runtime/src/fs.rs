//! Files written so that a reader at any moment sees the old content or the new, never
//! half of it (the container runtime, the primary CNI and the plugin read the node
//! agent's files whenever they like; a restarted process reads its own state back):
//! write a temp file in the same directory, fsync it, rename it over the target, fsync
//! the directory. Also directories and Unix sockets created with exactly their mode.

use std::fs::{self, File, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
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
    write_atomic_with_mode(target, contents, mode)
}

/// Replaces `target` with `contents`, with exactly `mode` (a key file is never
/// readable by others, not even for a moment: the mode is set before the first byte).
pub fn write_atomic_with_mode(target: &Path, contents: &[u8], mode: u32) -> io::Result<()> {
    let temp = temp_path(target)?;
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&temp)?;
        // The umask may have narrowed the mode given to open.
        file.set_permissions(Permissions::from_mode(mode))?;
        file.write_all(contents)?;
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
/// an existing one is left as its owner set it (the CNI dirs: the node's owner chose).
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

/// Makes `dir` a directory of ours with exactly `mode`, whatever was there before:
/// created if missing; if it exists (kubelet makes hostPath `DirectoryOrCreate` dirs
/// 0755), it is taken over by our uid and gid and its mode is forced. Fails when that
/// is impossible (e.g. another uid owns it and we lack `CAP_CHOWN`) rather than serve
/// from a directory someone else controls.
pub fn ensure_private_dir(dir: &Path, mode: u32) -> io::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)?;
    let meta = fs::metadata(dir)?;
    if !meta.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{} exists and is not a directory", dir.display()),
        ));
    }
    // SAFETY: geteuid and getegid have no preconditions.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    if meta.uid() != uid || meta.gid() != gid {
        std::os::unix::fs::chown(dir, Some(uid), Some(gid)).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "{} is owned by {}:{}, not by us ({uid}:{gid}), and taking it over failed: {e}",
                    dir.display(),
                    meta.uid(),
                    meta.gid()
                ),
            )
        })?;
    }
    // Also when it looks right already: chmod is cheap and clears setgid/sticky bits.
    fs::set_permissions(dir, Permissions::from_mode(mode))
}

/// Binds the Unix socket `path` so that it never exists with a wider mode than `mode`:
/// `bind` creates it inside a fresh 0700 staging directory beside `path` (nobody else
/// can reach it there, whatever the umask), where it gets `mode` and, when given, the
/// owner uid `owner`; then it is renamed into place, which also replaces a stale socket
/// atomically. The staging directory is removed in every case.
pub fn bind_private<T>(
    path: &Path,
    mode: u32,
    owner: Option<u32>,
    bind: impl FnOnce(&Path) -> io::Result<T>,
) -> io::Result<T> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().ok_or_else(|| no_parent(path))?;
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    // Short: a Unix socket path is limited to 107 bytes.
    let staging = dir.join(format!(".b{}.{n}", std::process::id()));
    fs::DirBuilder::new().mode(0o700).create(&staging)?;
    let result = (|| {
        let temp = staging.join("s");
        let bound = bind(&temp)?;
        fs::set_permissions(&temp, Permissions::from_mode(mode))?;
        if let Some(uid) = owner {
            std::os::unix::fs::chown(&temp, Some(uid), None)?;
        }
        fs::rename(&temp, path)?;
        Ok(bound)
    })();
    let _ = fs::remove_dir_all(&staging);
    result
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
    fn a_forced_mode_replaces_a_wider_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca-key.pem");
        fs::write(&path, b"old").unwrap();
        fs::set_permissions(&path, Permissions::from_mode(0o644)).unwrap();
        write_atomic_with_mode(&path, b"key", 0o600).unwrap();
        assert_eq!(mode(&path), 0o600);
        assert_eq!(fs::read(&path).unwrap(), b"key");
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

    #[test]
    fn private_dir_mode_is_forced_on_an_existing_dir() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("a/run");
        ensure_private_dir(&run, 0o700).unwrap();
        assert_eq!(mode(&run), 0o700);
        fs::set_permissions(&run, Permissions::from_mode(0o755)).unwrap();
        ensure_private_dir(&run, 0o700).unwrap();
        assert_eq!(mode(&run), 0o700);
        let file = dir.path().join("file");
        fs::write(&file, b"").unwrap();
        assert!(ensure_private_dir(&file, 0o700).is_err());
    }

    #[test]
    fn private_socket_gets_its_mode_and_replaces_a_stale_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.sock");
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        let listener = bind_private(&path, 0o600, None, |p| {
            std::os::unix::net::UnixListener::bind(p)
        })
        .unwrap();
        assert_eq!(mode(&path), 0o600);
        std::os::unix::net::UnixStream::connect(&path).unwrap();
        listener.accept().unwrap();
        // Only the socket is left behind, whatever happened.
        let failed = bind_private(&dir.path().join("y.sock"), 0o600, None, |_| {
            Err::<(), _>(io::Error::other("bind failed"))
        });
        assert!(failed.is_err());
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["x.sock"]);
    }
}
