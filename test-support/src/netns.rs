//! Network namespaces that exist only for one test.
//!
//! A [`Netns`] is deleted when dropped, which also removes every veth end, route and
//! iptables rule inside it, and its `/etc/netns/<name>` files. Names are
//! `PREFIX<pid>-<tag>`; [`sweep_stale`] removes namespaces (and their `/etc/netns`
//! files) of test processes that no longer run.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Once;

/// Runs `f` on a fresh OS thread that has entered the network namespace at `path`
/// (one this process does not own, e.g. a node's seen from its kubelet).
pub fn run_in<R: Send>(path: &Path, f: impl FnOnce() -> R + Send) -> Result<R> {
    std::thread::scope(|scope| {
        scope
            .spawn(move || {
                let file = std::fs::File::open(path)
                    .with_context(|| format!("opening {}", path.display()))?;
                // SAFETY: setns on an fd we own; it affects only this thread.
                let rc = unsafe {
                    libc::setns(std::os::fd::AsRawFd::as_raw_fd(&file), libc::CLONE_NEWNET)
                };
                if rc != 0 {
                    bail!(
                        "setns {}: {}",
                        path.display(),
                        std::io::Error::last_os_error()
                    );
                }
                Ok(f())
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// Prefix of every namespace and link the harness creates.
pub const PREFIX: &str = "zte";

/// A named network namespace owned by the current test.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates `zte<pid>-<tag>` with loopback up. `tag` must be short (link names
    /// derived from it are limited to 15 bytes).
    pub fn new(tag: &str) -> Result<Self> {
        static SWEEP: Once = Once::new();
        SWEEP.call_once(sweep_stale);
        let name = format!("{PREFIX}{}-{tag}", std::process::id());
        run(Command::new("ip").args(["netns", "add", &name]))?;
        let ns = Netns { name };
        ns.exec(&["ip", "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// The namespace's name, as `ip netns` knows it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The bind-mounted namespace file, as a container runtime would pass it to CNI.
    pub fn path(&self) -> PathBuf {
        PathBuf::from("/var/run/netns").join(&self.name)
    }

    /// A command that runs inside this namespace.
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name, program]);
        cmd
    }

    /// Runs `argv` inside the namespace and fails unless it exits 0.
    pub fn exec(&self, argv: &[&str]) -> Result<Output> {
        let mut cmd = self.command(argv[0]);
        cmd.args(&argv[1..]);
        run(&mut cmd)
    }

    /// Runs `f` on a fresh OS thread that has entered this namespace, so sockets it
    /// creates live here. The caller's threads never change namespace.
    pub fn run_inside<R: Send>(&self, f: impl FnOnce() -> R + Send) -> Result<R> {
        run_in(&self.path(), f)
    }

    /// Runs `argv` inside the namespace and returns its stdout as text.
    pub fn stdout(&self, argv: &[&str]) -> Result<String> {
        Ok(String::from_utf8_lossy(&self.exec(argv)?.stdout).into_owned())
    }

    /// Gives processes started with [`Netns::command`] their own `/etc/resolv.conf`:
    /// `ip netns exec` bind-mounts `/etc/netns/<name>/*` over `/etc/` in the mount
    /// namespace it makes, so the machine's own file is never touched. Processes
    /// already running keep what they read. Removed when the namespace is dropped.
    pub fn set_resolv_conf(&self, text: &str) -> Result<()> {
        let dir = self.etc_dir();
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        // Write-then-rename: a process starting now sees the old file or the new one.
        let mut file = tempfile::NamedTempFile::new_in(&dir)?;
        std::io::Write::write_all(&mut file, text.as_bytes())?;
        // World-readable, as a runtime writes it: a temp file is 0600, which a
        // container running as non-root (a waypoint) could not read.
        use std::os::unix::fs::PermissionsExt;
        file.as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o644))?;
        file.persist(dir.join("resolv.conf"))?;
        Ok(())
    }

    /// `/etc/netns/<name>`: files `ip netns exec` puts over `/etc/` for this namespace.
    pub fn etc_dir(&self) -> PathBuf {
        Path::new(ETC_NETNS).join(&self.name)
    }
}

/// Where `ip netns exec` looks for per-namespace `/etc` files (iproute2 convention).
const ETC_NETNS: &str = "/etc/netns";

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting the namespace destroys the veth ends and rules inside it.
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.name])
            .output();
        let _ = std::fs::remove_dir_all(self.etc_dir());
    }
}

/// Joins `a` and `b` with a veth pair and gives each end an address (CIDR form).
pub fn link(a: &Netns, a_addr: &str, b: &Netns, b_addr: &str) -> Result<()> {
    link_addrs(a, &[a_addr], b, &[b_addr])
}

/// [`link`] with any number of addresses per end (e.g. one per IP family).
pub fn link_addrs(a: &Netns, a_addrs: &[&str], b: &Netns, b_addrs: &[&str]) -> Result<()> {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    // Created inside `a` and moved, so no link ever appears in the root namespace.
    let (a_if, b_if) = (format!("va{n}"), format!("vb{n}"));
    a.exec(&[
        "ip",
        "link",
        "add",
        &a_if,
        "type",
        "veth",
        "peer",
        "name",
        &b_if,
        "netns",
        b.name(),
    ])?;
    for (ns, dev, addrs) in [(a, &a_if, a_addrs), (b, &b_if, b_addrs)] {
        for addr in addrs {
            add_addr(ns, addr, dev)?;
        }
        ns.exec(&["ip", "link", "set", dev, "up"])?;
    }
    Ok(())
}

/// `ip addr add`; an IPv6 address skips duplicate address detection, so it is usable
/// at once (nothing else on these links could hold it).
pub fn add_addr(ns: &Netns, addr: &str, dev: &str) -> Result<()> {
    let mut args = vec!["ip", "addr", "add", addr, "dev", dev];
    if addr.contains(':') {
        args.push("nodad");
    }
    ns.exec(&args).map(|_| ())
}

/// Deletes namespaces named by this harness whose creating process is gone, and their
/// `/etc/netns` directories (also those whose namespace is already gone).
pub fn sweep_stale() {
    if let Ok(out) = Command::new("ip").args(["netns", "list"]).output() {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let name = line.split_whitespace().next().unwrap_or_default();
            if owner_is_gone(name) {
                let _ = Command::new("ip").args(["netns", "delete", name]).output();
            }
        }
    }
    for entry in std::fs::read_dir(ETC_NETNS).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if owner_is_gone(&name) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// True for a harness name (`zte<pid>-…`) whose process no longer runs.
fn owner_is_gone(name: &str) -> bool {
    let pid: Option<u32> = name
        .strip_prefix(PREFIX)
        .and_then(|rest| rest.split('-').next())
        .and_then(|p| p.parse().ok());
    pid.is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
}

fn run(cmd: &mut Command) -> Result<Output> {
    let out = cmd.output().with_context(|| format!("spawning {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespaces_resolv_conf_is_seen_inside_and_removed_with_it() -> Result<()> {
        if !crate::can_run_root_tests() {
            return Ok(());
        }
        let ns = Netns::new("rslv")?;
        let text = "nameserver 192.0.2.53\nsearch demo.svc.cluster.local\n";
        ns.set_resolv_conf(text)?;
        assert_eq!(ns.stdout(&["cat", "/etc/resolv.conf"])?, text);
        let dir = ns.etc_dir();
        drop(ns);
        assert!(!dir.exists(), "{} left behind", dir.display());
        Ok(())
    }

    #[test]
    fn the_sweep_removes_etc_files_of_dead_runs_only() -> Result<()> {
        if !crate::can_run_root_tests() {
            return Ok(());
        }
        // pid_max is at most 2^22, so this pid never runs.
        let dead = Path::new(ETC_NETNS).join(format!("{PREFIX}99999999-x"));
        let alive = Path::new(ETC_NETNS).join(format!("{PREFIX}{}-sweep", std::process::id()));
        for dir in [&dead, &alive] {
            std::fs::create_dir_all(dir)?;
            std::fs::write(dir.join("resolv.conf"), "nameserver 192.0.2.53\n")?;
        }
        sweep_stale();
        let (dead_left, alive_left) = (dead.exists(), alive.exists());
        let _ = std::fs::remove_dir_all(&alive);
        assert!(!dead_left, "{} was not swept", dead.display());
        assert!(alive_left, "{} of a live run was swept", alive.display());
        Ok(())
    }
}
