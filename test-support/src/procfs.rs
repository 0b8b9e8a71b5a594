//! CPU, memory, threads and descriptors of a process, from /proc.

/// CPU time process `pid` used so far (user and system), in clock ticks.
pub fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may contain spaces) start after ") ".
    let rest = stat.rsplit_once(") ").map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    field(11) + field(12) // utime, stime
}

/// CPU time the whole machine spent busy so far, in clock ticks: every column of
/// `/proc/stat`'s `cpu` line but idle and iowait (guest time is already in user).
pub fn machine_busy_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let fields: Vec<u64> = stat
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("cpu "))
        .unwrap_or("")
        .split_whitespace()
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal
    fields
        .iter()
        .take(8)
        .enumerate()
        .filter(|(i, _)| !matches!(i, 3 | 4))
        .map(|(_, v)| v)
        .sum()
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`).
pub fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }) as f64
}

/// Resident memory of process `pid` in KiB (0 once it is gone).
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Threads of process `pid` (0 once it is gone).
pub fn threads(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// What process `pid`'s descriptors point at, with how many of each: `socket`,
/// `net` (a network namespace), `anon_inode`, or the path of a file.
pub fn open_fds(pid: u32) -> std::collections::BTreeMap<String, usize> {
    let mut kinds = std::collections::BTreeMap::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let target = std::fs::read_link(entry.path()).unwrap_or_default();
        let target = target.to_string_lossy();
        let kind = target.split(":[").next().unwrap_or_default().to_owned();
        *kinds.entry(kind).or_default() += 1;
    }
    kinds
}

/// Scheduler counters summed over every thread of some processes.
#[derive(Clone, Copy, Debug, Default)]
pub struct SchedCounters {
    /// Context switches, voluntary and not.
    pub switches: u64,
    /// Moves of a thread from one CPU to another.
    pub migrations: u64,
}

impl SchedCounters {
    /// From /proc/<pid>/task/*/sched (kernels with scheduler statistics; zero otherwise).
    pub fn of(pids: &[u32]) -> Self {
        let mut total = SchedCounters::default();
        for pid in pids {
            let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
                continue;
            };
            for task in tasks.flatten() {
                let sched = std::fs::read_to_string(task.path().join("sched")).unwrap_or_default();
                for line in sched.lines() {
                    let Some((key, value)) = line.split_once(':') else {
                        continue;
                    };
                    let value: u64 = value.trim().parse().unwrap_or(0);
                    match key.trim() {
                        "nr_switches" => total.switches += value,
                        "se.nr_migrations" => total.migrations += value,
                        _ => {}
                    }
                }
            }
        }
        total
    }
}

impl std::ops::Sub for SchedCounters {
    type Output = SchedCounters;
    fn sub(self, earlier: SchedCounters) -> SchedCounters {
        SchedCounters {
            switches: self.switches.saturating_sub(earlier.switches),
            migrations: self.migrations.saturating_sub(earlier.migrations),
        }
    }
}

impl std::ops::AddAssign for SchedCounters {
    fn add_assign(&mut self, other: SchedCounters) {
        self.switches += other.switches;
        self.migrations += other.migrations;
    }
}
