//! Network namespaces that exist only for one test.
//!
//! A [`Netns`] is deleted when dropped, which also removes every veth end, route and
//! iptables rule inside it. Names are `PREFIX<pid>-<tag>`; [`sweep_stale`] removes
//! namespaces of test processes that no longer run.

use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::Once;

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
        let path = self.path();
        std::thread::scope(|scope| {
            scope
                .spawn(move || {
                    let file = std::fs::File::open(&path)
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

    /// Runs `argv` inside the namespace and returns its stdout as text.
    pub fn stdout(&self, argv: &[&str]) -> Result<String> {
        Ok(String::from_utf8_lossy(&self.exec(argv)?.stdout).into_owned())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting the namespace destroys the veth ends and rules inside it.
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.name])
            .output();
    }
}

/// Joins `a` and `b` with a veth pair and gives each end an address (CIDR form).
pub fn link(a: &Netns, a_addr: &str, b: &Netns, b_addr: &str) -> Result<()> {
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
    a.exec(&["ip", "addr", "add", a_addr, "dev", &a_if])?;
    a.exec(&["ip", "link", "set", &a_if, "up"])?;
    b.exec(&["ip", "addr", "add", b_addr, "dev", &b_if])?;
    b.exec(&["ip", "link", "set", &b_if, "up"])?;
    Ok(())
}

/// Deletes namespaces named by this harness whose creating process is gone.
pub fn sweep_stale() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let pid: Option<u32> = rest.split('-').next().and_then(|p| p.parse().ok());
        if let Some(pid) = pid {
            if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                let _ = Command::new("ip").args(["netns", "delete", name]).output();
            }
        }
    }
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
