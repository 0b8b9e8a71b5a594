//! Child processes that never outlive the test that started them.

use anyhow::{Context, Result};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::owner::{owner_marker, OWNER_ENV};

/// A child process killed (by its own pid, never by name) when dropped.
#[derive(Debug)]
pub struct ChildGuard {
    name: String,
    /// This process's own log: two guards of one name never share one.
    log_path: std::path::PathBuf,
    child: Option<Child>,
    /// The child leads its own process group, killed as a whole.
    group: bool,
}

impl ChildGuard {
    /// Starts `cmd` with stdout and stderr captured into a log file under the system
    /// temp dir, so failures can be diagnosed with [`ChildGuard::log`]. Unless `cmd`
    /// sets [`OWNER_ENV`] itself, the child is marked with this run's
    /// [`owner_marker`], so leftovers can be found (and swept after a crash).
    pub fn spawn(name: &str, cmd: Command) -> Result<Self> {
        Self::start(name, cmd, false)
    }

    /// Like [`ChildGuard::spawn`], in a new process group that is killed as a whole:
    /// for a command that starts children of its own (`sh -c …` forks `sleep`), which
    /// would otherwise outlive it, keeping e.g. a deleted pod's network namespace.
    pub fn spawn_group(name: &str, cmd: Command) -> Result<Self> {
        Self::start(name, cmd, true)
    }

    /// Like [`ChildGuard::spawn_group`], with stdout and stderr handed to the caller
    /// as pipes (who keeps the log: a container runtime's job).
    pub fn spawn_group_piped(
        name: &str,
        mut cmd: Command,
    ) -> Result<(Self, std::process::ChildStdout, std::process::ChildStderr)> {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut guard = Self::start_with(name, cmd, true, false)?;
        let child = guard.child.as_mut().context("no child")?;
        let (Some(out), Some(err)) = (child.stdout.take(), child.stderr.take()) else {
            anyhow::bail!("{name}: no pipes");
        };
        Ok((guard, out, err))
    }

    fn start(name: &str, cmd: Command, group: bool) -> Result<Self> {
        Self::start_with(name, cmd, group, true)
    }

    fn start_with(name: &str, mut cmd: Command, group: bool, log_to_file: bool) -> Result<Self> {
        if !cmd.get_envs().any(|(k, _)| k == OWNER_ENV) {
            cmd.env(OWNER_ENV, owner_marker());
        }
        if group {
            std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        }
        let log_path = Self::new_log_path(name);
        cmd.stdin(Stdio::null());
        if log_to_file {
            let log = std::fs::File::create(&log_path)
                .with_context(|| format!("creating {}", log_path.display()))?;
            cmd.stdout(log.try_clone()?).stderr(log);
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {name}: {cmd:?}"))?;
        Ok(ChildGuard {
            name: name.to_owned(),
            log_path,
            child: Some(child),
            group,
        })
    }

    fn new_log_path(name: &str) -> std::path::PathBuf {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        std::env::temp_dir().join(format!(
            "{}{}-{name}-{n}.log",
            crate::netns::PREFIX,
            std::process::id()
        ))
    }

    /// The child's process id; 0 after [`kill`](Self::kill).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// What the process has printed so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Sends `signal` to the process (e.g. `libc::SIGTERM`), and to its whole group
    /// for [`ChildGuard::spawn_group`].
    pub fn signal(&self, signal: i32) {
        if let Some(child) = &self.child {
            let pid = child.id() as i32;
            let target = if self.group { -pid } else { pid };
            // SAFETY: kill(2) on the pid (or group) of a child we own and have not reaped.
            unsafe { libc::kill(target, signal) };
        }
    }

    /// The exit status, if the process has exited (reaping it).
    pub fn try_wait(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut()?.try_wait().ok().flatten()
    }

    /// Waits up to `timeout` for the process to exit; returns its exit code if it did.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Kills the process (with its process group, for [`ChildGuard::spawn_group`]) and
    /// reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            if self.group {
                // SAFETY: kill(2) on the process group our unreaped child leads.
                unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("--- log of {} ---\n{}", self.name, self.log());
        } else {
            let _ = std::fs::remove_file(&self.log_path);
        }
    }
}
