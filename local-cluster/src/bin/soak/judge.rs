//! The soak's verdicts, from its samples: growth of each mesh process after warm-up,
//! failures outside the injected faults, state that outlived its pod, enrollment.

use std::collections::BTreeMap;

use local_cluster::load::Failure;
use serde::Serialize;

use crate::faults::Fault;
use crate::sample::Sample;

/// Growth allowed from the warm-up sample to the end.
pub const MAX_GROWTH: f64 = 0.10;
/// How long state may outlive its pod.
pub const STALE_LIMIT_S: f64 = 30.0;

#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    pub check: String,
    pub passed: bool,
    pub detail: String,
}

fn verdict(check: &str, problems: Vec<String>, ok: String) -> Verdict {
    Verdict {
        check: check.into(),
        passed: problems.is_empty(),
        detail: if problems.is_empty() {
            ok
        } else {
            problems.join("; ")
        },
    }
}

/// Growth below these is noise however large in percent (a process of 20 descriptors
/// opening 3 more): growth fails only above both the percentage and these.
const RSS_FLOOR_KIB: u64 = 2048;
const FDS_FLOOR: usize = 5;

/// RSS and descriptors of every mesh process (not the API server: it stands in for
/// Kubernetes), from its first sample after warm-up to its last. A process started
/// during the soak (a fault replaced it) warms up too: it is judged from `warm_up_s`
/// after it was first seen, if it then lives a third of the judged time.
pub fn growth(samples: &[Sample], warm_up_s: f64) -> (Verdict, Vec<Growth>) {
    let last_t = samples.last().map(|s| s.t_s).unwrap_or_default();
    let mut born: BTreeMap<u32, f64> = BTreeMap::new();
    let mut first: BTreeMap<u32, (f64, u64, usize)> = BTreeMap::new();
    let mut last: BTreeMap<u32, (f64, u64, usize, String)> = BTreeMap::new();
    for s in samples {
        for p in s
            .processes
            .iter()
            .filter(|p| p.component != "kube-apiserver")
        {
            let seen = *born.entry(p.pid).or_insert(s.t_s);
            // The soak's own start counts as time zero for what was there from it.
            let from = if seen <= samples[0].t_s {
                warm_up_s
            } else {
                seen + warm_up_s
            };
            if s.t_s < from {
                continue;
            }
            first.entry(p.pid).or_insert((s.t_s, p.rss_kib, p.fds));
            last.insert(
                p.pid,
                (
                    s.t_s,
                    p.rss_kib,
                    p.fds,
                    format!("{} {}", p.component, p.pod),
                ),
            );
        }
    }
    let span_needed = ((last_t - warm_up_s) / 3.0).max(1.0);
    let mut growths = Vec::new();
    let mut problems = Vec::new();
    for (pid, (t0, rss0, fds0)) in first {
        let Some((t1, rss1, fds1, name)) = last.get(&pid).cloned() else {
            continue;
        };
        if t1 - t0 < span_needed {
            continue;
        }
        let rss_growth = rss1 as f64 / rss0.max(1) as f64 - 1.0;
        let fd_growth = fds1 as f64 / fds0.max(1) as f64 - 1.0;
        if rss_growth > MAX_GROWTH && rss1.saturating_sub(rss0) > RSS_FLOOR_KIB {
            problems.push(format!(
                "{name} (pid {pid}) RSS {rss0} -> {rss1} KiB (+{:.0} %) from {t0:.0}s to {t1:.0}s",
                rss_growth * 100.0
            ));
        }
        if fd_growth > MAX_GROWTH && fds1.saturating_sub(fds0) > FDS_FLOOR {
            problems.push(format!(
                "{name} (pid {pid}) descriptors {fds0} -> {fds1} (+{:.0} %) from {t0:.0}s to {t1:.0}s",
                fd_growth * 100.0
            ));
        }
        growths.push(Growth {
            process: name,
            pid,
            from_s: t0,
            to_s: t1,
            rss_kib: (rss0, rss1),
            fds: (fds0, fds1),
        });
    }
    let judged = growths.len();
    let v = verdict(
        "no mesh process grows more than 10 % after warm-up (RSS, descriptors)",
        problems,
        format!("{judged} processes judged"),
    );
    (v, growths)
}

#[derive(Debug, Clone, Serialize)]
pub struct Growth {
    pub process: String,
    pub pid: u32,
    pub from_s: f64,
    pub to_s: f64,
    pub rss_kib: (u64, u64),
    pub fds: (usize, usize),
}

/// Every failed connection falls in an injected fault's window; long-lived connections
/// are lost only in a ztunnel rollout.
pub fn failures(
    failures: &[(f64, Failure)],
    faults: &[Fault],
    listed: u64,
    counted: u64,
) -> Verdict {
    let mut problems = Vec::new();
    for (t_s, f) in failures {
        let covering: Vec<&Fault> = faults.iter().filter(|x| x.covers(*t_s)).collect();
        let allowed = match f.kind.as_str() {
            "long" => covering
                .iter()
                .any(|x| x.kind == crate::faults::Kind::ZtunnelRollout),
            _ => !covering.is_empty(),
        };
        if !allowed {
            problems.push(format!(
                "{} connection to {} at {t_s:.1}s: {}",
                f.kind, f.target, f.reason
            ));
        }
    }
    if counted > listed {
        problems.push(format!(
            "{} failures not listed (more than the load's per-report cap)",
            counted - listed
        ));
    }
    problems.truncate(20);
    verdict(
        "no connection fails outside an injected fault (long-lived: only at ztunnel's rollout)",
        problems,
        format!("{counted} failures, all inside a fault's window"),
    )
}

/// Stale state (xDS workloads, certificates, pods served) no older than the limit.
pub fn stale_state(samples: &[Sample]) -> Verdict {
    // (node, kind, item) -> first time seen stale, last time seen stale
    let mut seen: BTreeMap<(String, &str, String), (f64, f64)> = BTreeMap::new();
    for s in samples {
        for z in &s.ztunnels {
            for (kind, items) in [
                ("xDS workload", &z.xds_stale),
                ("certificate", &z.certificates_stale),
                ("pod served", &z.pods_served_stale),
            ] {
                for item in items {
                    let e = seen
                        .entry((z.node.clone(), kind, item.clone()))
                        .or_insert((s.t_s, s.t_s));
                    e.1 = s.t_s;
                }
            }
        }
    }
    let problems: Vec<String> = seen
        .iter()
        .filter(|(_, (a, b))| b - a > STALE_LIMIT_S)
        .map(|((node, kind, item), (a, b))| {
            format!("{kind} {item} on {node} outlived its pod from {a:.0}s to {b:.0}s")
        })
        .take(20)
        .collect();
    verdict(
        "no xDS workload, certificate or served pod outlives its pod by more than 30 s",
        problems,
        format!("{} stale items seen, none for more than 30 s", seen.len()),
    )
}

/// Each ztunnel holds one network namespace per pod it serves (plus at most its own
/// and the node's), sampled outside faults.
pub fn netns_held(samples: &[Sample]) -> Verdict {
    let mut problems = Vec::new();
    for s in samples.iter().filter(|s| s.faults.is_empty()) {
        for z in &s.ztunnels {
            if z.netns_fds > z.pods_served + 2 {
                problems.push(format!(
                    "{} at {:.0}s: {} namespaces held for {} pods served",
                    z.node, s.t_s, z.netns_fds, z.pods_served
                ));
            }
        }
    }
    problems.truncate(10);
    verdict(
        "ztunnel holds no pod network namespace after the pod is gone",
        problems,
        "namespaces held = pods served (+ its own) at every sample".into(),
    )
}

/// The agents keep up: once the churn settles after warm-up, the pods enrolled never
/// trail the pods that should be by more than the churn in flight.
pub fn enrollment(samples: &[Sample], warm_up_s: f64, in_flight: usize) -> Verdict {
    let mut problems = Vec::new();
    for s in samples
        .iter()
        .filter(|s| s.t_s >= warm_up_s && s.faults.is_empty())
    {
        let gap = s.meshed_expected as f64 - s.meshed_enrolled;
        if gap.abs() > in_flight as f64 {
            problems.push(format!(
                "at {:.0}s: {} pods should be enrolled, agents report {}",
                s.t_s, s.meshed_expected, s.meshed_enrolled
            ));
        }
    }
    problems.truncate(10);
    verdict(
        "pods enrolled follow the pods that should be (outside faults)",
        problems,
        format!("within {in_flight} at every sample"),
    )
}
