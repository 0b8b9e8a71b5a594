//! One container of a pod the kubelet stand-in runs: its process, its restarts under
//! the pod's `restartPolicy` with kubelet's back-off, its probes, its two logs
//! (this instance and the previous one), its status, and its graceful stop.

use std::path::PathBuf;
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::{json, Value};

use crate::images::UnknownImage;
use crate::kubelet::container_log::{instance_path, LogFile};
use crate::kubelet::probes::Probe;
use crate::objects::now_rfc3339;
use test_support::process::ChildGuard;

/// kubelet's crash back-off (10 s doubling to 5 min), scaled down for tests: the
/// first restart is immediate, then 1 s doubling to 10 s.
const BACKOFF_START: Duration = Duration::from_secs(1);
const BACKOFF_CAP: Duration = Duration::from_secs(10);
/// A container that ran this long starts its back-off over (kubelet: 2 × the cap).
const BACKOFF_RESET: Duration = Duration::from_secs(20);

/// The pod's `restartPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartPolicy {
    Always,
    OnFailure,
    Never,
}

impl RestartPolicy {
    pub fn of(pod: &Value) -> Self {
        match pod["spec"]["restartPolicy"].as_str() {
            Some("Never") => RestartPolicy::Never,
            Some("OnFailure") => RestartPolicy::OnFailure,
            _ => RestartPolicy::Always,
        }
    }

    fn restarts(self, status: &ExitStatus, killed_by_liveness: bool) -> bool {
        match self {
            RestartPolicy::Always => true,
            RestartPolicy::OnFailure => killed_by_liveness || !status.success(),
            RestartPolicy::Never => false,
        }
    }
}

#[derive(Debug)]
pub struct Container {
    pub name: String,
    pub spec: Value,
    log_name: String,
    /// Where this container's instance logs are kept (`<restart>.log`).
    log_dir: PathBuf,
    process: Option<ChildGuard>,
    /// The log of the running (or last) instance, and of the one before it.
    log: Option<LogFile>,
    previous: Option<LogFile>,
    started: Option<(String, Instant)>,
    pub restart_count: u32,
    /// `lastState.terminated` after a restart.
    last_terminated: Option<Value>,
    /// `state.terminated` of a container that will not run again.
    terminated: Option<Value>,
    /// `state.waiting` (reason, message) while it does not run.
    waiting: Option<(String, String)>,
    /// When the next start is due (`None`: not to be started).
    start_at: Option<Instant>,
    backoff: Option<Duration>,
    pub readiness: Option<Probe>,
    pub liveness: Option<Probe>,
    /// The liveness probe just failed: the exit that follows is its doing.
    killed_by_liveness: bool,
    /// When a stopping instance gets SIGKILL.
    kill_at: Option<Instant>,
}

impl Container {
    pub fn new(spec: &Value, log_name: String, log_dir: PathBuf) -> Self {
        Container {
            name: spec["name"].as_str().unwrap_or_default().to_owned(),
            spec: spec.clone(),
            log_name,
            log_dir,
            process: None,
            log: None,
            previous: None,
            started: None,
            restart_count: 0,
            last_terminated: None,
            terminated: None,
            waiting: Some(("ContainerCreating".into(), String::new())),
            start_at: Some(Instant::now()),
            backoff: None,
            readiness: None,
            liveness: None,
            killed_by_liveness: false,
            kill_at: None,
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(ChildGuard::pid)
    }

    pub fn running(&self) -> bool {
        self.process.is_some()
    }

    /// What this instance has printed so far (the last one's, once it exited).
    pub fn log(&self) -> String {
        self.log.as_ref().map(LogFile::text).unwrap_or_default()
    }

    /// What the previous instance printed (`kubectl logs --previous`).
    pub fn previous_log(&self) -> Option<String> {
        self.previous.as_ref().map(LogFile::text)
    }

    /// The log file of this instance, or of the previous one.
    pub fn log_file(&self, previous: bool) -> Option<&LogFile> {
        if previous {
            self.previous.as_ref()
        } else {
            self.log.as_ref()
        }
    }

    pub fn start_due(&self, now: Instant) -> bool {
        self.process.is_none() && self.start_at.is_some_and(|at| now >= at)
    }

    /// Starts an instance of the container from `cmd`, its probes counting from now.
    pub fn start(&mut self, cmd: Result<Command>) -> Result<()> {
        let started = Instant::now();
        let attempt = (|| -> Result<_> {
            let readiness = Probe::parse(&self.spec, "readinessProbe", started)
                .context("CreateContainerConfigError")?;
            let liveness = Probe::parse(&self.spec, "livenessProbe", started)
                .context("CreateContainerConfigError")?;
            let (child, out, err) = ChildGuard::spawn_group_piped(&self.log_name, cmd?)?;
            let log = LogFile::capture(instance_path(&self.log_dir, self.restart_count), out, err)?;
            Ok((child, readiness, liveness, log))
        })();
        let (child, readiness, liveness, log) = match attempt {
            Ok(parts) => parts,
            Err(e) => {
                // kubelet retries a container it cannot create with the same back-off.
                let reason = if e.chain().any(|c| c.is::<UnknownImage>()) {
                    "ErrImagePull"
                } else if format!("{e:#}").contains("CreateContainerConfigError") {
                    "CreateContainerConfigError"
                } else {
                    "CreateContainerError"
                };
                self.waiting = Some((reason.into(), format!("{e:#}")));
                self.schedule_restart(started);
                return Err(e);
            }
        };
        self.readiness = readiness;
        self.liveness = liveness;
        self.process = Some(child);
        // kubelet keeps the logs of this instance and of the one before it.
        if let Some(old) = self.log.replace(log) {
            if let Some(gone) = self.previous.replace(old) {
                let _ = std::fs::remove_file(gone.path);
            }
        }
        self.started = Some((now_rfc3339(), started));
        self.waiting = None;
        self.terminated = None;
        self.start_at = None;
        self.killed_by_liveness = false;
        self.kill_at = None;
        Ok(())
    }

    /// Reaps an exited instance and decides, by `policy`, whether and when it runs
    /// again. Returns true when it exited.
    pub fn reap(&mut self, policy: RestartPolicy, pod: &str) -> bool {
        let Some(status) = self.process.as_mut().and_then(ChildGuard::try_wait) else {
            return false;
        };
        drop(self.process.take());
        let (started_at, started) = self
            .started
            .take()
            .unwrap_or_else(|| (now_rfc3339(), Instant::now()));
        let exit_code = status.code().unwrap_or_else(|| {
            128 + std::os::unix::process::ExitStatusExt::signal(&status).unwrap_or(0)
        });
        let terminated = json!({"terminated": {
            "exitCode": exit_code,
            "reason": if exit_code == 0 { "Completed" } else { "Error" },
            "startedAt": started_at, "finishedAt": now_rfc3339(),
            "containerID": format!("e2e://{}", self.log_name),
        }});
        self.readiness = None;
        self.liveness = None;
        if policy.restarts(&status, self.killed_by_liveness) {
            if started.elapsed() >= BACKOFF_RESET {
                self.backoff = None;
            }
            self.restart_count += 1;
            self.last_terminated = Some(terminated);
            let delay = self.schedule_restart(Instant::now());
            self.waiting = Some((
                "CrashLoopBackOff".into(),
                format!(
                    "back-off {}s restarting failed container={} pod={pod}",
                    delay.as_secs(),
                    self.name
                ),
            ));
        } else {
            self.terminated = Some(terminated["terminated"].clone());
        }
        true
    }

    /// The next start: immediately the first time, then after a doubling back-off.
    fn schedule_restart(&mut self, now: Instant) -> Duration {
        let delay = self.backoff.unwrap_or(Duration::ZERO);
        self.backoff = Some(match self.backoff {
            None => BACKOFF_START,
            Some(d) => (d * 2).min(BACKOFF_CAP),
        });
        self.start_at = Some(now + delay);
        delay
    }

    /// The liveness probe failed: stop this instance as kubelet does (SIGTERM, then
    /// SIGKILL after `grace`, see [`Self::enforce_kill`]); it restarts by the policy.
    pub fn kill_for_liveness(&mut self, grace: Duration) {
        if let Some(p) = &self.process {
            self.killed_by_liveness = true;
            p.signal(libc::SIGTERM);
            self.kill_at = Some(Instant::now() + grace);
        }
    }

    /// SIGKILL for an instance still running past its grace period.
    pub fn enforce_kill(&mut self, now: Instant) {
        if let (Some(p), Some(at)) = (&self.process, self.kill_at) {
            if now >= at {
                p.signal(libc::SIGKILL);
                self.kill_at = None;
            }
        }
    }

    /// Ready: running, and its readiness probe (if any) passing.
    pub fn ready(&self) -> bool {
        self.running()
            && self
                .readiness
                .as_ref()
                .is_none_or(|p| p.passing == Some(true))
    }

    /// `status.containerStatuses[]` as kubelet writes it.
    pub fn status(&self) -> Value {
        let state = if let Some((started_at, _)) = &self.started {
            json!({"running": {"startedAt": started_at}})
        } else if let Some(t) = &self.terminated {
            json!({"terminated": t})
        } else {
            let (reason, message) = self.waiting.clone().unwrap_or_default();
            if message.is_empty() {
                json!({"waiting": {"reason": reason}})
            } else {
                json!({"waiting": {"reason": reason, "message": message}})
            }
        };
        let mut status = json!({
            "name": self.name, "image": self.spec["image"], "imageID": "",
            "ready": self.ready(), "started": self.running(),
            "restartCount": self.restart_count, "state": state,
            "lastState": self.last_terminated.clone().unwrap_or_else(|| json!({})),
        });
        if let Some(pid) = self.pid() {
            status["containerID"] = json!(format!("e2e://{pid}"));
        }
        status
    }

    /// Stops the container: SIGTERM to its process group, SIGKILL after `grace`.
    pub fn signal_stop(&self) {
        if let Some(p) = &self.process {
            p.signal(libc::SIGTERM);
        }
    }

    /// Waits (until `deadline`) for the container to exit after [`Self::signal_stop`],
    /// then kills what is left.
    pub fn finish_stop(&mut self, deadline: Instant) {
        if let Some(p) = &mut self.process {
            let left = deadline.saturating_duration_since(Instant::now());
            if p.wait_timeout(left).is_none() {
                p.kill();
            }
        }
        drop(self.process.take());
        self.start_at = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Result<Command> {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", script]);
        Ok(cmd)
    }

    fn log_dir() -> PathBuf {
        // Kept for the test process's life: the logs are read after the exit.
        tempfile::tempdir().unwrap().keep()
    }

    fn wait_log(c: &Container) {
        while !c.log_file(false).is_some_and(LogFile::finished) {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn wait_exit(c: &mut Container, policy: RestartPolicy) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !c.reap(policy, "ns/p") {
            assert!(Instant::now() < deadline, "container never exited");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn crashes_restart_with_a_growing_back_off_and_keep_the_previous_log() {
        let mut c = Container::new(
            &json!({"name": "c", "image": "e2e-app"}),
            "unit-crash".into(),
            log_dir(),
        );
        assert!(c.start_due(Instant::now()));
        c.start(sh("echo first; exit 3")).unwrap();
        wait_exit(&mut c, RestartPolicy::Always);
        let status = c.status();
        assert_eq!(status["restartCount"], 1);
        assert_eq!(status["lastState"]["terminated"]["exitCode"], 3);
        assert_eq!(status["state"]["waiting"]["reason"], "CrashLoopBackOff");
        wait_log(&c);
        assert_eq!(c.log(), "first\n", "the last instance's, while it waits");
        assert_eq!(c.previous_log(), None);
        assert!(
            c.start_due(Instant::now()),
            "the first restart is immediate"
        );

        c.start(sh("echo second; exit 1")).unwrap();
        wait_exit(&mut c, RestartPolicy::Always);
        assert_eq!(c.restart_count, 2);
        assert!(
            !c.start_due(Instant::now()),
            "the second waits its back-off"
        );
        assert!(c.start_due(Instant::now() + BACKOFF_START));
        wait_log(&c);
        assert_eq!(c.log(), "second\n");
        assert_eq!(c.previous_log().as_deref(), Some("first\n"));
    }

    #[test]
    fn policies_decide_what_runs_again() {
        let mut c = Container::new(&json!({"name": "c"}), "unit-ok".into(), log_dir());
        c.start(sh("exit 0")).unwrap();
        wait_exit(&mut c, RestartPolicy::OnFailure);
        assert_eq!(c.restart_count, 0);
        assert_eq!(c.status()["state"]["terminated"]["reason"], "Completed");
        assert!(!c.start_due(Instant::now() + BACKOFF_CAP));

        let mut c = Container::new(&json!({"name": "c"}), "unit-never".into(), log_dir());
        c.start(sh("exit 2")).unwrap();
        wait_exit(&mut c, RestartPolicy::Never);
        assert_eq!(c.status()["state"]["terminated"]["exitCode"], 2);
    }

    #[test]
    fn a_graceful_stop_lets_the_container_handle_sigterm() {
        let mut c = Container::new(&json!({"name": "c"}), "unit-term".into(), log_dir());
        c.start(sh(
            "trap 'echo bye; exit 0' TERM; while true; do sleep 0.05; done",
        ))
        .unwrap();
        std::thread::sleep(Duration::from_millis(200));
        c.signal_stop();
        c.finish_stop(Instant::now() + Duration::from_secs(5));
        assert!(!c.running());
        wait_log(&c);
        assert!(c.log().contains("bye"), "{}", c.log());
    }
}
